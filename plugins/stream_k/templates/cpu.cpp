// gemm-dispatcher stream-K GEMM, CPU target: generated file.
//
// Work unit: one K-iteration (tile_k deep) of one output tile. The tiles of
// the stream-K region contribute tiles*iters_per_tile units, divided evenly
// over the workers (OpenMP threads); a worker whose range covers a whole
// tile stores it. The partials of a split tile are combined in the workspace
// by the chosen reduction (atomic: added into one slot in arrival order;
// linear: summed by the owner in worker order; tree: pairwise in log2 rounds,
// the additions of a round spread over the workers), and then the tile's
// owner (the worker holding its first iteration) runs the epilogue once, on
// the sum: alpha, beta, rounding and saturation apply exactly as to a tile
// that was not split.
${prelude}
#include <atomic>
#include <initializer_list>
#include <vector>

namespace {
using T = KernelTraits;
using Acc = T::Acc;

enum class Reduction { atomic, linear, tree };
enum class Decomposition { hybrid, stream_k, data_parallel };
constexpr Reduction kReduction = ${reduction};
constexpr Decomposition kDecomposition = ${decomposition};

struct Plan {
    int64_t tiles, iters_per_tile, dp_tiles, sk_iters;
    int workers;
    int64_t begin(int w) const { return sk_iters * w / workers; }
    int64_t tile_of(int64_t iter) const { return dp_tiles + iter / iters_per_tile; }
    int owner(int64_t sk_tile) const {  // the worker holding the tile's first iteration
        const int64_t first = (sk_tile - dp_tiles) * iters_per_tile;
        int w = static_cast<int>(first * workers / sk_iters);
        while (w + 1 < workers && begin(w + 1) <= first) ++w;
        while (begin(w) > first) --w;
        return w;
    }
};

Plan make_plan(const dcpu::Problem<T>& P, int workers) {
    Plan plan{P.tiles(), P.k_iters(), 0, 0, workers};
    if (kDecomposition == Decomposition::data_parallel) {
        plan.dp_tiles = plan.tiles;
    } else if (kDecomposition == Decomposition::hybrid) {
        // Whole waves but the last run data-parallel; the last full wave and
        // the remainder are balanced by stream-K (no idle workers at the end).
        const int64_t waves = plan.tiles / workers;
        plan.dp_tiles = plan.tiles % workers == 0 ? plan.tiles : std::max<int64_t>(0, waves - 1) * workers;
    }
    plan.sk_iters = (plan.tiles - plan.dp_tiles) * plan.iters_per_tile;
    return plan;
}

constexpr int64_t kSlotElems = int64_t(T::MC) * T::NC;  // one partial tile

// Linear and tree: two partial tiles per worker (its first and its last tile
// may be split). Atomic: one per worker, for the split tile it owns (at most
// one: the tile that crosses the end of its range), which every contributor
// adds into. The plugin zeroes the workspace before every launch.
int64_t workspace_bytes(int workers) {
    const int64_t slots = kReduction == Reduction::atomic ? 1 : 2;
    return int64_t(workers) * slots * kSlotElems * sizeof(Acc);
}

// Atomic reduction: a partial tile added into its owner's slot, in arrival order.
void add_partial(const dcpu::TileCoord& t, const Acc* acc, Acc* slot) {
    for (int i = 0; i < t.mc; ++i)
        for (int j = 0; j < t.nc; ++j) {
            const size_t e = size_t(i) * T::NC + j;
#pragma omp atomic
            slot[e] += acc[e];
        }
}

// Linear and tree: worker w's partial tile of split tile `tile` (slot 0 for
// its first tile, 1 for its last).
Acc* partial(const Plan& plan, Acc* workspace, int w, int64_t tile) {
    const int slot = plan.tile_of(plan.begin(w)) == tile ? 0 : 1;
    return workspace + (int64_t(w) * 2 + slot) * kSlotElems;
}

// The work of worker w (team of plan.workers threads; called by each).
void run_worker(const dcpu::Problem<T>& P, const Plan& plan, int w, Acc* workspace) {
    // Data-parallel tiles in contiguous runs (column by column, as the
    // regular kernel), so consecutive tiles of a worker share packed B panels.
    for (int64_t tile = plan.dp_tiles * w / plan.workers; tile < plan.dp_tiles * (w + 1) / plan.workers; ++tile)
        dcpu::compute_tile<T>(P, tile);

    Acc* acc = dcpu::Buffers<T>::local().acc.get();
    const int64_t end = plan.begin(w + 1);
    for (int64_t it = plan.begin(w); it < end;) {
        const int64_t tile = plan.tile_of(it);
        const int64_t tile_first = (tile - plan.dp_tiles) * plan.iters_per_tile;
        const int64_t seg_end = std::min(end, tile_first + plan.iters_per_tile);
        const dcpu::TileCoord t = dcpu::tile_coord(P, tile);
        dcpu::accumulate_tile<T>(P, t.i0, t.mc, t.j0, t.nc, (it - tile_first) * T::KC,
                                 std::min<int64_t>(P.k, (seg_end - tile_first) * T::KC), acc, false);
        const bool whole = it == tile_first && seg_end == tile_first + plan.iters_per_tile;
        if (whole) {
            dcpu::store_tile<T>(P, t.i0, t.mc, t.j0, t.nc, acc);
        } else if (kReduction == Reduction::atomic) {
            add_partial(t, acc, workspace + int64_t(plan.owner(tile)) * kSlotElems);
        } else {
            std::copy(acc, acc + kSlotElems, partial(plan, workspace, w, tile));
        }
        it = seg_end;
    }
}

// f(worker) for each worker holding part of split tile `tile`, in order
// (the owner first).
template <class F>
void for_each_contributor(const Plan& plan, int64_t tile, F&& f) {
    const int64_t tile_end = (tile - plan.dp_tiles + 1) * plan.iters_per_tile;
    for (int v = plan.owner(tile); v < plan.workers && plan.begin(v) < tile_end; ++v)
        if (plan.begin(v) < plan.begin(v + 1)) f(v);  // else no iterations at all
}

// f(tile) for the split tiles worker w holds part of: its first and its last
// tile, where its range covers them only in part.
template <class F>
void for_each_split_tile(const Plan& plan, int w, F&& f) {
    if (plan.begin(w) == plan.begin(w + 1)) return;
    const int64_t first = plan.tile_of(plan.begin(w)), last = plan.tile_of(plan.begin(w + 1) - 1);
    for (int64_t tile : {first, last}) {
        const int64_t tile_first = (tile - plan.dp_tiles) * plan.iters_per_tile;
        const bool whole = plan.begin(w) <= tile_first && plan.begin(w + 1) >= tile_first + plan.iters_per_tile;
        if (!whole) f(tile);
        if (last == first) break;
    }
}

// Linear reduction: the partials of `tile` summed in worker order into acc.
const Acc* linear_sum(const Plan& plan, int64_t tile, Acc* workspace, Acc* acc) {
    std::fill(acc, acc + kSlotElems, Acc(0));
    for_each_contributor(plan, tile, [&](int v) {
        const Acc* part = partial(plan, workspace, v, tile);
        for (int64_t e = 0; e < kSlotElems; ++e) acc[e] += part[e];
    });
    return acc;
}

// Tree reduction, the round of stride s = 2^r: of the partials p_0, p_1, ...
// of a split tile (worker order), each p_i with i a multiple of 2s takes
// p_{i+s} (p_i += p_{i+s}), added by p_i's worker. After ceil(log2(workers))
// rounds p_0, the owner's, holds the sum; the pairing is fixed, so the sum
// is bit-identical across runs.
void tree_round(const Plan& plan, int w, int stride, Acc* workspace) {
    for_each_split_tile(plan, w, [&](int64_t tile) {
        int position = 0, mine = -1, partner = -1;
        for_each_contributor(plan, tile, [&](int v) {
            if (v == w) mine = position;
            if (mine >= 0 && position == mine + stride) partner = v;
            ++position;
        });
        if (mine % (2 * stride) != 0 || partner < 0) return;
        Acc* own = partial(plan, workspace, w, tile);
        const Acc* other = partial(plan, workspace, partner, tile);
        for (int64_t e = 0; e < kSlotElems; ++e) own[e] += other[e];
    });
}

int tree_rounds(int workers) {
    int rounds = 0;
    while ((1 << rounds) < workers) ++rounds;
    return rounds;
}

// Fix-up, once every partial is in (and, for the tree, reduced): the owner
// of each split tile runs the epilogue on its sum.
void fix_up(const dcpu::Problem<T>& P, const Plan& plan, int w, Acc* workspace) {
    Acc* acc = dcpu::Buffers<T>::local().acc.get();
    for_each_split_tile(plan, w, [&](int64_t tile) {
        if (plan.owner(tile) != w) return;
        const Acc* sum = kReduction == Reduction::atomic ? workspace + int64_t(w) * kSlotElems
                         : kReduction == Reduction::linear ? linear_sum(plan, tile, workspace, acc)
                                                           : partial(plan, workspace, w, tile);
        const dcpu::TileCoord t = dcpu::tile_coord(P, tile);
        dcpu::store_tile<T>(P, t.i0, t.mc, t.j0, t.nc, sum);
    });
}

int workers_for(const dispatcher_gemm_args* args) { return dcpu::thread_count(T::threads, args ? args->workers : 0); }

int run(const dispatcher_gemm_args* args) {
    return dispatcher_abi::guarded([&] {
        const dcpu::Problem<T> P = dcpu::make_problem<T>(args);
        const int requested = workers_for(args);
        if (args->workspace_bytes < workspace_bytes(requested) || (workspace_bytes(requested) && !args->workspace))
            return dispatcher_abi::fail(DISPATCHER_ERROR, "workspace smaller than dispatcher_workspace_size()");
        if (kDecomposition == Decomposition::stream_k && P.tiles() * P.k_iters() < requested)
            return dispatcher_abi::fail(DISPATCHER_UNSUPPORTED,
                                        "stream-K needs at least one K-iteration per worker (tiles x "
                                        "K-iterations = " + std::to_string(P.tiles() * P.k_iters()) +
                                        " < " + std::to_string(requested) + " workers)");
        Acc* workspace = static_cast<Acc*>(args->workspace);
        dcpu::RegionErrors errors;
        const dcpu::WorkerPlacement placement;
#pragma omp parallel num_threads(requested) proc_bind(close)
        {
            // Plan with the team the runtime really gave us.
            const Plan plan = make_plan(P, omp_get_num_threads());
            const int w = omp_get_thread_num();
            placement.settle(w, omp_get_num_threads());
            errors.run([&] { run_worker(P, plan, w, workspace); });
#pragma omp barrier
            if (kReduction == Reduction::tree) {
                for (int r = 0; r < tree_rounds(plan.workers); ++r) {
                    errors.run([&] { tree_round(plan, w, 1 << r, workspace); });
#pragma omp barrier
                }
            }
            errors.run([&] { fix_up(P, plan, w, workspace); });
        }
        errors.rethrow();
        return DISPATCHER_OK;
    });
}
}  // namespace

DISPATCHER_DEFINE_COMMON_EXPORTS(KERNEL_NAME)

extern "C" DISPATCHER_EXPORT int dispatcher_run_gemm(const dispatcher_gemm_args* args) {
    return run(args);
}

extern "C" DISPATCHER_EXPORT int64_t dispatcher_workspace_size(const dispatcher_gemm_args* args) {
    return workspace_bytes(workers_for(args));
}
