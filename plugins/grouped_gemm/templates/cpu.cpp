// gemm-dispatcher grouped GEMM, CPU target: generated file.
//
// One parallel region over the tiles of all groups: a flat tile index is
// mapped to (group, tile) through the prefix sums of the groups' tile counts.
${prelude}
#include <vector>

namespace {
using T = KernelTraits;

int run(const dispatcher_grouped_args* args) {
    return dispatcher_abi::guarded([&] {
        if (!args || args->group_count < 0) throw std::invalid_argument("bad grouped argument struct");
        const int64_t groups = args->group_count;
        if (groups && (!args->m || !args->n || !args->k || !args->a || !args->b || !args->c ||
                       !args->lda || !args->ldb || !args->ldc))
            throw std::invalid_argument("null per-group array");
        std::vector<dcpu::Problem<T>> problems;
        std::vector<int64_t> first_tile{0};
        for (int64_t g = 0; g < groups; ++g) {
            if (args->m[g] < 0 || args->n[g] < 0 || args->k[g] < 0)
                throw std::invalid_argument("group " + std::to_string(g) + " has a negative size");
            if (args->m[g] == 0 || args->n[g] == 0) continue;  // empty group: nothing to write
            dispatcher_gemm_args one{args->a[g], args->b[g], args->c[g], args->m[g], args->n[g],
                                     std::max<int64_t>(args->k[g], 1), args->lda[g], args->ldb[g],
                                     args->ldc[g], args->alpha, args->beta, nullptr, 0, 0, nullptr};
            dcpu::Problem<T> P = dcpu::make_problem<T>(&one);
            P.k = args->k[g];
            problems.push_back(P);
            first_tile.push_back(first_tile.back() + P.tiles());
        }
        const int64_t tiles = first_tile.back();
        const int threads = dcpu::thread_count(T::threads, 0);
        // Contiguous runs of the flat tile list per thread: a thread runs the
        // tiles of one column of one group back to back and packs B once.
        dcpu::RegionErrors errors;
#pragma omp parallel for schedule(static) num_threads(threads) proc_bind(close)
        for (int64_t t = 0; t < tiles; ++t) {
            const size_t g = std::upper_bound(first_tile.begin(), first_tile.end(), t) - first_tile.begin() - 1;
            errors.run([&] { dcpu::compute_tile<T>(problems[g], t - first_tile[g]); });
        }
        errors.rethrow();
        return DISPATCHER_OK;
    });
}
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_grouped_gemm(const dispatcher_grouped_args* args) {
    return run(args);
}
