// gemm-dispatcher stream-K GEMM, CPU target: generated file.
//
// Work unit: one K-iteration (tile_k deep) of one output tile. The tiles of
// the stream-K region contribute tiles*iters_per_tile units, divided evenly
// over the workers (OpenMP threads); a worker whose range covers a whole
// tile stores it. The partials of a split tile are combined in the workspace
// by the chosen reduction, and then the tile's owner (the worker holding its
// first iteration) runs the epilogue once, on the sum: alpha, beta, rounding
// and saturation apply exactly as to a tile that was not split.
${prelude}
#include <atomic>
#include <vector>

namespace {
using T = KernelTraits;
using Acc = T::Acc;

enum class Reduction { atomic, linear };
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

// Linear: two partial tiles per worker (its first and its last tile may be
// split). Atomic: one per worker, for the split tile it owns (at most one:
// the tile that crosses the end of its range), which every contributor adds
// into. The plugin zeroes the workspace before every launch.
int64_t workspace_bytes(int workers) {
    const int64_t slots = kReduction == Reduction::linear ? 2 : 1;
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
            const int slot = it == plan.begin(w) ? 0 : 1;
            std::copy(acc, acc + kSlotElems, workspace + (int64_t(w) * 2 + slot) * kSlotElems);
        }
        it = seg_end;
    }
}

// Linear reduction: the partials of `tile` (owned by w) summed in worker order into acc.
const Acc* linear_sum(const Plan& plan, int w, int64_t tile, const Acc* workspace, Acc* acc) {
    const int64_t tile_first = (tile - plan.dp_tiles) * plan.iters_per_tile;
    const int64_t tile_end = tile_first + plan.iters_per_tile;
    std::fill(acc, acc + kSlotElems, Acc(0));
    for (int v = w; v < plan.workers && plan.begin(v) < tile_end; ++v) {
        if (plan.begin(v + 1) <= tile_first || plan.begin(v) == plan.begin(v + 1)) continue;
        const int slot = plan.tile_of(plan.begin(v)) == tile ? 0 : 1;
        const Acc* part = workspace + (int64_t(v) * 2 + slot) * kSlotElems;
        for (int64_t e = 0; e < kSlotElems; ++e) acc[e] += part[e];
    }
    return acc;
}

// Fix-up, once every partial is in: the owner of each split tile runs the
// epilogue on its reduced sum.
void fix_up(const dcpu::Problem<T>& P, const Plan& plan, int w, const Acc* workspace) {
    Acc* acc = dcpu::Buffers<T>::local().acc.get();
    const int64_t first_tile = plan.sk_iters ? plan.tile_of(plan.begin(w)) : 0;
    const int64_t last_tile = plan.sk_iters ? plan.tile_of(std::max(plan.begin(w), plan.begin(w + 1) - 1)) : -1;
    for (int64_t tile = first_tile; tile <= last_tile && plan.begin(w) < plan.begin(w + 1); ++tile) {
        if (plan.owner(tile) != w) continue;
        const int64_t tile_first = (tile - plan.dp_tiles) * plan.iters_per_tile;
        const int64_t tile_end = tile_first + plan.iters_per_tile;
        if (plan.begin(w) <= tile_first && plan.begin(w + 1) >= tile_end) continue;  // stored whole
        const Acc* sum = kReduction == Reduction::atomic ? workspace + int64_t(w) * kSlotElems
                                                         : linear_sum(plan, w, tile, workspace, acc);
        const dcpu::TileCoord t = dcpu::tile_coord(P, tile);
        dcpu::store_tile<T>(P, t.i0, t.mc, t.j0, t.nc, sum);
    }
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
#pragma omp parallel num_threads(requested) proc_bind(close)
        {
            // Plan with the team the runtime really gave us.
            const Plan plan = make_plan(P, omp_get_num_threads());
            const int w = omp_get_thread_num();
            errors.run([&] { run_worker(P, plan, w, workspace); });
#pragma omp barrier
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
