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
        const int threads = dcpu::thread_count(T::threads, args->workers, 2.0 * P.m * P.n * P.k * P.batch);
        // Many tiles: runs of kChunk handed out as threads finish; the next
        // tile of a run is prefetched while one computes.
        constexpr int kChunk = 8;
        const bool many = tiles >= 4 * kChunk * threads;
        dcpu::parallel_tiles(threads, tiles, [&](int64_t t) {
            dcpu::Problem<T> one = P.at(t / per_batch);
            one.reuse_b_panels = tiles >= 2 * threads;  // each thread runs two tiles or more
            if (t + 1 < tiles && (!many || (t + 1) % kChunk))
                dcpu::prefetch_next_tile(one, P.at((t + 1) / per_batch), (t + 1) % per_batch);
            dcpu::compute_tile<T, Epi>(one, t % per_batch);
        }, many ? kChunk : 0, [&](int64_t t) { return dcpu::tile_area(P, t % per_batch); });  // runs of equal area
        return DISPATCHER_OK;
    });
}
}  // namespace

DISPATCHER_DEFINE_GEMM_EXPORTS(KERNEL_NAME, run)
