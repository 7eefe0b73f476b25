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
        dcpu::RegionErrors errors;
#pragma omp parallel for schedule(static) num_threads(threads) proc_bind(close)
        for (int64_t t = 0; t < tiles; ++t)
            errors.run([&] {
                dcpu::Problem<T> one = P.at(t / per_batch);
                one.reuse_b_panels = tiles >= 2 * threads;
                dcpu::compute_tile<T, Epi>(one, t % per_batch);
            });
        errors.rethrow();
        return DISPATCHER_OK;
    });
}
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_gemm(const dispatcher_gemm_args* args) {
    return run(args);
}
