// gemm-dispatcher batched GEMM, CPU target: generated file. One parallel loop
// over the tiles of every batch, batch-major, so a thread's contiguous run of
// tiles stays in one batch and packs its B panel once.
${prelude}
namespace {
using T = KernelTraits;
using Epi = dcpu::Epilogue<dcpu::Bias::${bias}, dcpu::Activation::${activation}>;

int run(const dispatcher_gemm_args* args) {
    return dispatcher_abi::guarded([&] {
        const dcpu::Problem<T> P = dcpu::make_problem<T, Epi>(args);
        const int64_t per_batch = P.tiles(), tiles = per_batch * P.batch;
        const int threads = dcpu::thread_count(T::threads, args->workers);
        dcpu::parallel_tiles(threads, tiles, [&](int64_t t) {
            dcpu::Problem<T> one = P.at(t / per_batch);
            one.reuse_b_panels = tiles >= 2 * threads;  // each thread runs two tiles or more
            dcpu::compute_tile<T, Epi>(one, t % per_batch);
        });
        return DISPATCHER_OK;
    });
}
}  // namespace

DISPATCHER_DEFINE_GEMM_EXPORTS(KERNEL_NAME, run)
