"""One sweep with the local executor and with `--executor ray`: wall times,
the Ray executor's overhead per measurement, and whether both give the same
(kernel, problem) rows, statuses and winners.

    python benchmarks/ray_sweep.py                    # cpu: a 2-node Ray cluster on this machine
    python benchmarks/ray_sweep.py --target cuda --dtype bf16 --sweep benchmarks/sweeps/cuda_devices_check.json \\
        --out benchmarks/results/ray_sweep_cuda.json  # a GPU machine: a single-node cluster

cpu: the local executor with two slots of one CPU each (`--devices 0,1`)
against a Ray cluster of a head and a second node of one CPU each (one
slot per node, each node with its own build cache, so every library a node
did not build reaches it through the object store). cuda: the local
executor on every GPU against `--executor ray` with no address, which
starts a single-node cluster for the sweep (its start-up is in the wall
time). Each executor runs once to build (the "first" run) and then
`--repeats` times into fresh folders; the figures are medians of those:
the sweep's wall time and its phases (`seconds` of the sweep's summary:
connecting the executor, the build phase, the benchmark phase). Overhead
per measurement: (Ray benchmark phase - local benchmark phase) /
measurements; the rest of the difference is fixed (connecting, starting
actors, build tasks that find their kernels built).

Winners are the fastest row per problem: kernels within noise of each
other can swap between any two runs, so for each problem the report also
gives how much slower, in the local run, the Ray run's winner was than
the local winner.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, environment, pyplot  # noqa: E402

from dispatcher.tile_engine import results  # noqa: E402

HERE = Path(__file__).resolve().parent
CPU_SWEEP = {"tile_m": {"values": [12, 24, 36, 48]}, "tile_n": {"values": [32, 64]}, "tile_k": {"values": [32]}}
CPU_PROBLEMS = [[64, 96, 80], [33, 65, 17], [128, 128, 128]]
CUDA_PROBLEMS = [[4096, 4096, 4096], [1024, 1024, 1024], [64, 8192, 4096]]


def sweep(args, work: Path, out: Path, *extra) -> tuple:
    """(wall seconds, summary) of one `gemm-dispatcher sweep` run."""
    cmd = [sys.executable, "-m", "dispatcher", "sweep", str(args.sweep_file), "--problems", str(args.problems_file),
           "--target", args.target, "--variant", args.variant, "--dtype", args.dtype, "--layout", args.layout,
           "--repeat", str(args.repeat), "--warmup", "2", "--verify", "--quiet", "--json", "--out", str(out),
           *extra]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=work)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
    return wall, json.loads(proc.stdout)


def outcome(rows) -> list:
    return sorted((r["kernel"], int(r["problem_idx"]), r["status"]) for r in rows)


def run_executor(args, work: Path, name: str, extra: list) -> dict:
    first, _ = sweep(args, work, work / f"{name}-first", *extra)
    walls, phases, summary = [], [], None
    for i in range(args.repeats):
        wall, summary = sweep(args, work, work / f"{name}-{i}", *extra)
        walls.append(wall)
        phases.append(summary["seconds"])
    rows = results.read(work / f"{name}-{args.repeats - 1}")
    median_phases = {p: statistics.median(s[p] for s in phases) for p in phases[0]}
    print(f"{name:5}: first run {first:6.1f} s, then median {statistics.median(walls):6.1f} s "
          f"of {[round(w, 1) for w in walls]}; phases {median_phases}", file=sys.stderr)
    return {"first_wall_s": first, "walls_s": walls, "median_wall_s": statistics.median(walls),
            "phases_s": phases, "median_phases_s": median_phases,
            "measured": summary["measured"], "failed_rows": summary["failed_rows"],
            "winners": {i: w["kernel"] for i, w in summary["winners"].items()},
            "latency_ms": {f"{r['kernel']}/{r['problem_idx']}": float(r["latency_ms"])
                           for r in rows if r["status"] == "ok"},
            "rows": outcome(rows), "devices": sorted({r["device"] for r in rows})}


def winner_detail(local: dict, remote: dict) -> dict:
    """Per problem: both winners, and the Ray winner's local latency over the local winner's."""
    detail = {}
    for idx, kernel in local["winners"].items():
        theirs = remote["winners"].get(idx)
        ratio = local["latency_ms"].get(f"{theirs}/{idx}", float("nan")) / local["latency_ms"][f"{kernel}/{idx}"]
        detail[idx] = {"local": kernel, "ray": theirs, "ray_winner_local_latency_ratio": round(ratio, 3)}
    return detail


def two_node_cluster(work: Path):
    from ray.cluster_utils import Cluster
    started = time.perf_counter()
    cluster = Cluster(shutdown_at_exit=True)
    cluster.add_node(num_cpus=1, include_dashboard=False, env_vars={"DISPATCHER_CACHE_DIR": str(work / "cache-head")})
    cluster.add_node(num_cpus=1, env_vars={"DISPATCHER_CACHE_DIR": str(work / "cache-node2")})
    return cluster, time.perf_counter() - started


def plot(report: dict, path: Path):
    plt = pyplot(path)
    if plt is None:
        return
    fig, (walls, over) = plt.subplots(1, 2, figsize=(9, 3.6))
    names = ["local", "ray"]
    x = range(len(names))
    walls.bar([i - 0.2 for i in x], [report[n]["first_wall_s"] for n in names], 0.4, label="first run (builds)")
    walls.bar([i + 0.2 for i in x], [report[n]["median_wall_s"] for n in names], 0.4, label="built (median)")
    walls.set_xticks(list(x), names)
    walls.set_ylabel("sweep wall time (s)")
    walls.legend(fontsize=8)
    walls.set_title(f"{report['local']['measured']} measurements, {report['target']}")
    phases = ["executor", "build", "benchmark"]
    for i, name in enumerate(names):
        bottom = 0.0
        for phase, color in zip(phases, ("tab:gray", "tab:orange", "tab:green")):
            value = report[name]["median_phases_s"][phase]
            over.bar(i, value, 0.5, bottom=bottom, color=color, label=phase if i == 0 else None)
            bottom += value
    over.set_xticks(list(x), names)
    over.set_ylabel("median phase wall time (s)")
    over.legend(fontsize=8)
    over.set_title(f"{report['overhead_per_measurement_ms']:.1f} ms/measurement + {report['fixed_overhead_s']:.1f} s "
                   f"fixed;\nsame rows: {report['same_rows']}, same winners: {report['same_winners']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--variant", default="regular")
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--layout", default="rcr")
    ap.add_argument("--sweep", help="sweep config (default: 8 small CPU kernels)")
    ap.add_argument("--problems", help="problem file (default: 3 shapes of the target)")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per measurement")
    ap.add_argument("--repeats", type=int, default=3, help="sweeps per executor after the first")
    ap.add_argument("--out", default=str(RESULTS / "ray_sweep_cpu.json"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ray_sweep."))
    args.sweep_file = Path(args.sweep).resolve() if args.sweep else work / "sweep.json"
    args.problems_file = Path(args.problems).resolve() if args.problems else work / "problems.json"
    if not args.sweep:
        args.sweep_file.write_text(json.dumps(CPU_SWEEP))
    if not args.problems:
        args.problems_file.write_text(json.dumps(CPU_PROBLEMS if args.target == "cpu" else CUDA_PROBLEMS))
    os.environ.setdefault("DISPATCHER_CACHE_DIR", str(work / "cache-driver"))
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

    import ray
    report = {"environment": environment(), "ray": ray.__version__, "target": args.target,
              "sweep": json.loads(args.sweep_file.read_text()), "problems": json.loads(args.problems_file.read_text())}
    if args.target == "cpu":
        report["local"] = run_executor(args, work, "local", ["--devices", "0,1"])
        cluster, report["cluster_start_s"] = two_node_cluster(work)
        try:
            report["ray"] = run_executor(args, work, "ray", ["--executor", "ray", "--address", cluster.address])
        finally:
            cluster.shutdown()
        report["cluster"] = "2 nodes on this machine (ray.cluster_utils.Cluster), 1 CPU each, own build caches"
    else:
        report["local"] = run_executor(args, work, "local", [])
        report["ray"] = run_executor(args, work, "ray", ["--executor", "ray"])
        report["cluster"] = "single node, started by the sweep (ray.init without an address)"
    local, remote = report["local"], report["ray"]
    report["same_rows"] = local["rows"] == remote["rows"]
    report["same_winners"] = local["winners"] == remote["winners"]
    report["winner_detail"] = winner_detail(local, remote)
    bench = {n: report[n]["median_phases_s"]["benchmark"] for n in ("local", "ray")}
    report["overhead_per_measurement_ms"] = (bench["ray"] - bench["local"]) / local["measured"] * 1e3
    report["fixed_overhead_s"] = (remote["median_wall_s"] - local["median_wall_s"]) - (bench["ray"] - bench["local"])
    report["ratio_ray_over_local"] = remote["median_wall_s"] / local["median_wall_s"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out.with_suffix(".png"))
    print(f"same rows: {report['same_rows']}, same winners: {report['same_winners']} "
          f"({report['winner_detail']}); ray/local wall {report['ratio_ray_over_local']:.2f}x: "
          f"{report['overhead_per_measurement_ms']:.1f} ms per measurement and "
          f"{report['fixed_overhead_s']:.1f} s fixed; {out}")


if __name__ == "__main__":
    main()
