// gemm-dispatcher grouped GEMM, CPU target: generated file.
//
// One parallel region over the tiles of all groups: a flat tile index is
// mapped to (group, tile) through the prefix sums of the groups' tile counts.
// Two entry points fill the group list: the list form (per-group pointers)
// and the stacked form (one A, one C, per-group row offsets).
${prelude}
#include <vector>

namespace {
using T = KernelTraits;
using AStorage = typename T::A::storage;
using BStorage = typename T::B::storage;
using CStorage = typename T::C::storage;

// The non-empty groups of one launch and where each one's tiles start.
struct Groups {
    std::vector<dcpu::Problem<T>> problems;
    std::vector<int64_t> first_tile{0};

    void add(const void* a, const void* b, void* c, int64_t m, int64_t n, int64_t k, int64_t lda,
             int64_t ldb, int64_t ldc, double alpha, double beta, int64_t g) {
        if (m < 0 || n < 0 || k < 0)
            throw std::invalid_argument("group " + std::to_string(g) + " has a negative size");
        if (m == 0 || n == 0) return;  // empty group: nothing to write
        dispatcher_gemm_args one{a, b, c, m, n, std::max<int64_t>(k, 1), lda, ldb, ldc,
                                 alpha, beta, nullptr, 0, 0, nullptr};
        dcpu::Problem<T> P = dcpu::make_problem<T>(&one);
        P.k = k;  // K = 0 stores zeros
        problems.push_back(P);
        first_tile.push_back(first_tile.back() + P.tiles());
    }

    void run() const {
        const int64_t tiles = first_tile.back();
        const int threads = dcpu::thread_count(T::threads, 0);
        // Contiguous runs of the flat tile list per thread: a thread runs the
        // tiles of one column of one group back to back and packs B once.
        dcpu::parallel_tiles(threads, tiles, [&](int64_t t) {
            const size_t g = std::upper_bound(first_tile.begin(), first_tile.end(), t) - first_tile.begin() - 1;
            dcpu::compute_tile<T>(problems[g], t - first_tile[g]);
        });
    }
};

int run_list(const dispatcher_grouped_args* args) {
    return dispatcher_abi::guarded([&] {
        if (!args || args->group_count < 0) throw std::invalid_argument("bad grouped argument struct");
        const int64_t groups = args->group_count;
        if (groups && (!args->m || !args->n || !args->k || !args->a || !args->b || !args->c ||
                       !args->lda || !args->ldb || !args->ldc))
            throw std::invalid_argument("null per-group array");
        Groups G;
        for (int64_t g = 0; g < groups; ++g)
            G.add(args->a[g], args->b[g], args->c[g], args->m[g], args->n[g], args->k[g],
                  args->lda[g], args->ldb[g], args->ldc[g], args->alpha, args->beta, g);
        G.run();
        return DISPATCHER_OK;
    });
}

int run_stacked(const dispatcher_grouped_mm_args* args) {
    return dispatcher_abi::guarded([&] {
        if (!args || args->group_count < 0 || args->total_m < 0 || args->n < 0 || args->k < 0)
            throw std::invalid_argument("bad grouped_mm argument struct");
        if (args->group_count && !args->offsets) throw std::invalid_argument("null offsets");
        int32_t previous = 0;  // every offset is checked before anything is written
        for (int64_t g = 0; g < args->group_count; ++g) {
            const int32_t end = args->offsets[g];
            if (end < previous || end > args->total_m)
                throw std::invalid_argument(
                    "offsets[" + std::to_string(g) + "] = " + std::to_string(end) +
                    (end < previous ? " is smaller than the offset before it" : " exceeds total_m = " +
                                                                                     std::to_string(args->total_m)));
            previous = end;
        }
        auto* a = static_cast<const AStorage*>(args->a);
        auto* b = static_cast<const BStorage*>(args->b);
        auto* c = static_cast<CStorage*>(args->c);
        const int64_t a_row = T::a_row ? args->lda : 1;  // elements from one row of A to the next
        Groups G;
        int64_t start = 0;
        for (int64_t g = 0; g < args->group_count; ++g) {
            const int64_t end = args->offsets[g];
            G.add(a + start * a_row, b + g * args->stride_b, c + start * args->ldc, end - start, args->n,
                  args->k, args->lda, args->ldb, args->ldc, args->alpha, 0.0, g);
            start = end;
        }
        G.run();
        for (int64_t row = start; row < args->total_m; ++row)  // rows no group owns
            std::fill(c + row * args->ldc, c + row * args->ldc + args->n, T::C::store(0.0f));
        return DISPATCHER_OK;
    });
}
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_grouped_gemm(const dispatcher_grouped_args* args) {
    return run_list(args);
}

extern "C" DISPATCHER_EXPORT int dispatcher_run_grouped_mm(const dispatcher_grouped_mm_args* args) {
    return run_stacked(args);
}
