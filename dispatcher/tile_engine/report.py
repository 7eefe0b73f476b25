"""`gemm-dispatcher report`: winners per problem and a throughput plot."""

from __future__ import annotations

from collections import defaultdict

from ..errors import DispatcherError


def winners(rows) -> dict:
    best = {}
    for r in rows:
        if r["status"] != "ok":
            continue
        idx = int(r["problem_idx"])
        if idx not in best or float(r["latency_ms"]) < float(best[idx]["latency_ms"]):
            best[idx] = r
    return dict(sorted(best.items()))


def problem_label(r) -> str:
    if r.get("M"):
        return f"{r['M']}x{r['N']}x{r['K']}"
    return f"{r['group_count']} groups"


def table(rows) -> str:
    counts = defaultdict(lambda: [0, 0])
    for r in rows:
        counts[int(r["problem_idx"])][r["status"] != "ok"] += 1
    lines = [f"{'problem':>8} {'shape':>16} {'ok':>4} {'fail':>4} {'latency_ms':>11} {'TFLOP/s':>8}  winner"]
    for idx, r in winners(rows).items():
        ok, bad = counts[idx]
        lines.append(f"{idx:>8} {problem_label(r):>16} {ok:>4} {bad:>4} {float(r['latency_ms']):>11.4f} "
                     f"{float(r['tflops']):>8.3f}  {r['kernel']}")
    return "\n".join(lines)


def plot(rows, path, title="throughput per kernel and problem"):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise DispatcherError("plotting needs matplotlib: pip install 'gemm-dispatcher[plot]'") from None
    ok = [r for r in rows if r["status"] == "ok"]
    if not ok:
        raise DispatcherError("no successful rows to plot")
    kernels = sorted({r["kernel"] for r in ok})
    probs = sorted({int(r["problem_idx"]) for r in ok})
    label = {int(r["problem_idx"]): problem_label(r) for r in ok}
    grid = [[0.0] * len(probs) for _ in kernels]
    for r in ok:
        grid[kernels.index(r["kernel"])][probs.index(int(r["problem_idx"]))] = float(r["tflops"]) * 1e3
    fig, ax = plt.subplots(figsize=(2 + 1.6 * len(probs), 1.5 + 0.28 * len(kernels)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(probs)), [label[p] for p in probs], rotation=20)
    ax.set_yticks(range(len(kernels)), kernels, fontsize=6)
    for j, p in enumerate(probs):
        col = [grid[i][j] for i in range(len(kernels))]
        i = max(range(len(kernels)), key=lambda i_: col[i_])
        ax.text(j, i, "best", ha="center", va="center", color="red", fontsize=7, weight="bold")
    fig.colorbar(im, ax=ax, label="GFLOP/s")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
