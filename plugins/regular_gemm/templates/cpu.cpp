// gemm-dispatcher regular (data-parallel) GEMM, CPU target: generated file.
${prelude}
namespace {
using T = KernelTraits;
using Epi = dcpu::Epilogue<dcpu::Bias::${bias}, dcpu::Activation::${activation}>;

int run(const dispatcher_gemm_args* args) {
    return dispatcher_abi::guarded([&] {
        dcpu::Problem<T> P = dcpu::make_problem<T, Epi>(args);
        const int64_t tiles = P.tiles();
        const int threads = dcpu::thread_count(T::threads, args->workers, 2.0 * P.m * P.n * P.k);
        if (dcpu::one_vector(P)) {  // a matrix times a vector: no packing, runs of output lines
            dcpu::vector_product<T, Epi>(P, threads);
            return DISPATCHER_OK;
        }
        if (dcpu::runs_shared_panels(P, threads)) {  // rows enough for every thread: one B panel for all
            dcpu::compute_shared_panels<T, Epi>(P, threads);
            return DISPATCHER_OK;
        }
        P.reuse_b_panels = tiles >= 2 * threads;  // each thread runs two tiles or more
        dcpu::SharedPackedA<T> shared_a;
        shared_a.pack(P, threads);
        if (dcpu::runs_k_outermost(P, threads)) {  // one tile row: K blocks outermost
            dcpu::compute_row_runs<T, Epi>(P, threads);
            return DISPATCHER_OK;
        }
        // Contiguous runs of tiles per thread, column by column, so each
        // thread packs a B panel once for all the tiles of its column; threads
        // bound to their cores keep those panels in their own caches. Runs of
        // equal output area: the edge tiles of an odd N or M are narrow.
        dcpu::parallel_tiles(threads, tiles, [&](int64_t t) { dcpu::compute_tile<T, Epi>(P, t); }, 0,
                             [&](int64_t t) { return dcpu::tile_area(P, t); });
        if constexpr (dcpu::kGuardBytes > 0) shared_a.check_guards();
        return DISPATCHER_OK;
    });
}

const dispatcher_registry_entry kRegistry[] = {{KERNEL_NAME, &run}};
}  // namespace

DISPATCHER_DEFINE_GEMM_EXPORTS(KERNEL_NAME, run)

extern "C" DISPATCHER_EXPORT const dispatcher_registry_entry* dispatcher_registry(int* count) {
    *count = 1;
    return kRegistry;
}
