"""The `gemm-dispatcher` command (also `python -m dispatcher`)."""

from __future__ import annotations

import argparse
import json
import sys

import attrs

from . import dtypes, targets
from .api import Dispatcher
from .errors import DispatcherError
from .plugins import get_manager
from .problem import prepare_gemm, prepare_grouped
from .timing import TimingOptions, measure, median
from .verify import max_rel, random_matrix, reference, tolerance


def _parse_groups(text: str) -> list:
    try:
        return [tuple(int(v) for v in g.lower().split("x")) for g in text.split(",") if g]
    except ValueError:
        raise SystemExit(f"--groups wants MxNxK[,MxNxK...], got {text!r}") from None


def _parse_config(items) -> dict:
    """`--config key=value ...` or one JSON object."""
    config = {}
    for item in items or ():
        if item.lstrip().startswith("{"):
            config.update(json.loads(item))
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--config wants key=value, got {item!r}")
        config[key] = int(value) if value.lstrip("-").isdigit() else value
    return config or None


def run_once(d: Dispatcher, *, variant, m=0, n=0, k=0, groups=None, dtype="fp32", layout="rcr",
             target="cpu", out_dtype=None, config=None, verify=False, strict=False,
             timing=TimingOptions(), seed=0):
    """Build (if needed), time and optionally verify one problem; a result dict."""
    import numpy as np

    rng = np.random.default_rng(seed)
    kind = get_manager().variant(variant).problem_kind
    if kind == "grouped":
        shapes = groups or [(m, n, k)]
        As = [random_matrix(gm, gk, dtype, layout[0], rng) for gm, _, gk in shapes]
        Bs = [random_matrix(gk, gn, dtype, layout[1], rng) for _, gn, gk in shapes]
        problem, operands, results = prepare_grouped(As, Bs, out_dtype=out_dtype, variant=variant,
                                                     target=target)
        pairs = list(zip(As, Bs))
    else:
        a = random_matrix(m, k, dtype, layout[0], rng)
        b = random_matrix(k, n, dtype, layout[1], rng)
        problem, operands, result = prepare_gemm(a, b, out_dtype=out_dtype, variant=variant,
                                                 target=target)
        results, pairs = [result], [(a, b)]
    problem, chosen = d.run_or_fall_back(problem, operands, config or None, strict=strict)
    library = d.library(chosen)
    times = measure(lambda i: d.launch(library, problem, operands), timing)
    seconds = median(times)
    row = {"kernel": library.name, "variant": problem.variant, "target": target, "dtype": dtype,
           "layout": problem.layout, "problem": [list(s) for s in problem.shapes],
           "latency_ms": seconds * 1e3, "gflops": problem.flops / seconds / 1e9,
           "repeat": timing.repeat}
    if verify:  # after the timing: the reference runs on OpenBLAS, whose threads spin on
        # after a call and would share the cores with the kernel being timed
        refs = [reference(a, b) for a, b in pairs]
        for r in results:
            r[...] = np.nan if r.dtype.kind == "f" or r.dtype.kind == "V" else 0
        d.launch(library, problem, operands)
        errors = [max_rel(r, ref) for r, ref in zip(results, refs)]
        row["max_rel"] = max(errors, default=0.0)
        row["tolerance"] = tolerance(chosen, max((s[2] for s in problem.shapes), default=1))
        row["verified"] = row["max_rel"] <= row["tolerance"]
    return row


def cmd_plugins(args):
    infos = get_manager().plugins()
    if args.json:
        print(json.dumps([attrs.asdict(i) for i in infos], indent=1))
        return 0
    for i in infos:
        print(f"{i.name:22} {i.status:9} {i.version:8} variants: {', '.join(i.variants) or '-'}")
        print(f"{'':22} source: {i.source}")
        print(f"{'':22} hooks: {', '.join(i.hooks) or '-'}")
        if i.error:
            print(f"{'':22} error: {i.error}")
    return 0


def cmd_run(args):
    groups = _parse_groups(args.groups) if args.groups else None
    row = run_once(Dispatcher(), variant=args.variant, m=args.m, n=args.n, k=args.k, groups=groups,
                   dtype=args.dtype, layout=args.layout, target=args.target,
                   out_dtype=args.out_dtype, config=_parse_config(args.config),
                   verify=args.verify, strict=args.strict,
                   timing=TimingOptions(warmup=args.warmup, repeat=args.repeat))
    if args.json:
        print(json.dumps(row))
    else:
        print(f"kernel   {row['kernel']}")
        print(f"time     {row['latency_ms']:.4f} ms (median of {row['repeat']})")
        print(f"GFLOP/s  {row['gflops']:.1f}")
        if args.verify:
            print(f"max_rel  {row['max_rel']:.3e} (tolerance {row['tolerance']:.1e}): "
                  f"{'ok' if row['verified'] else 'FAILED'}")
    return 0 if row.get("verified", True) else 1


def cmd_kernels(args):
    cache = Dispatcher().cache
    if args.prune:
        print(f"removed {cache.prune()} corrupt or stale item(s) from {cache.root}")
        return 0
    entries = cache.entries()
    if args.json:
        print(json.dumps(entries, indent=1))
        return 0
    print(f"{len(entries)} kernel(s) in {cache.root}")
    for e in entries:
        print(f"  {e['status']:7} {e.get('name', e['key'])}  ({e.get('build_seconds', '?')} s build)")
    return 0


def cmd_demo(args):
    """The main job on the CPU default: every variant, verified, timed."""
    d = Dispatcher()
    jobs = [
        dict(variant="regular", m=1024, n=1024, k=1024, dtype="fp32"),
        dict(variant="regular", m=1000, n=1500, k=700, dtype="bf16", layout="rrr"),
        dict(variant="regular", m=513, n=257, k=129, dtype="fp8_e4m3"),
        dict(variant="stream_k", m=64, n=64, k=65536, dtype="fp32"),
        dict(variant="grouped", groups=[(128, 512, 512), (1, 512, 512), (300, 512, 512), (0, 512, 512)],
             dtype="fp32"),
    ]
    print(f"gemm-dispatcher demo on target cpu ({targets.get('cpu').parallelism_hint()}); "
          f"build cache {d.cache.root}")
    ok = True
    for job in jobs:
        job = {"layout": "rcr", **job}
        row = run_once(d, verify=True, **job)
        ok &= row["verified"]
        shape = "+".join("x".join(map(str, s)) for s in row["problem"])
        print(f"{row['variant']:9} {job['dtype']:9} {row['layout']} {shape:36} "
              f"{row['gflops']:8.1f} GFLOP/s  max_rel {row['max_rel']:.1e} "
              f"{'ok' if row['verified'] else 'FAILED'}  {row['kernel']}")
    return 0 if ok else 1


def cmd_sweep(args):
    from .tile_engine import engine
    options = engine.SweepOptions(
        config=args.config, variant=args.variant, target=args.target, dtype=args.dtype,
        layout=args.layout, out_dtype=args.out_dtype, problems=args.problems, workers=args.workers,
        devices=args.devices, kernel_timeout=args.kernel_timeout, max_kernels=args.max_kernels,
        verify=args.verify, out=args.out, resume=args.resume,
        timing=TimingOptions(warmup=args.warmup, repeat=args.repeat, rotating=args.rotating,
                             flush_l2=not args.no_flush),
        progress=not args.quiet)
    summary = engine.run(options)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        from .tile_engine import report, results
        print(report.table(results.read(args.out)))
        print(f"{summary['built']} kernel(s) built ({summary['build_failed']} failed, "
              f"{summary['filtered']} filtered), {summary['measured']} measured "
              f"({summary['failed_rows']} failed); results in {summary['csv']}; winners in the tuning database")
    return 0


def cmd_report(args):
    from .tile_engine import report, results
    rows = results.read(args.results)
    if not rows:
        raise DispatcherError(f"no results in {args.results}")
    print(report.table(rows))
    if args.plot:
        report.plot(rows, args.plot)
        print(f"plot written to {args.plot}")
    return 0


def _migrate_name(name: str, target: str, isa) -> tuple:
    """One `migrate --names` row and whether the name mapped. Whether this
    machine can build the kernel is a column of its own, never a reason not
    to map: a name means the same kernel on every machine."""
    from .legacy import names
    try:
        kernel = names.parse(name)
        config = names.to_config(kernel, target, isa)
    except DispatcherError as e:
        return f"{name}\tUNMAPPED\t{e}", False
    problems = config.problems()
    buildable = f"no: {'; '.join(problems)}" if problems else "yes"
    return f"{name}\t{kernel.bridge_name}\t{config.name}\t{buildable}", True


def cmd_migrate(args):
    from .legacy import configs
    if args.isa and args.target != "cpu":
        raise SystemExit(f"migrate: --isa is a cpu target option; --target is {args.target}")
    if args.names:
        print("# CK name\tCK bridge name\tgemm-dispatcher name\tbuildable here")
        ok = True
        for line in open(args.names):
            name = line.split("|")[0].strip()
            if not name or name.startswith("#"):
                continue
            row, mapped = _migrate_name(name, args.target, args.isa)
            ok = ok and mapped
            print(row)
        return 0 if ok else 1
    if not args.legacy:
        raise SystemExit("migrate needs a legacy config or --names FILE")
    m = configs.migrate(args.legacy, target=args.target, variant=args.variant, dtype=args.dtype,
                        layout=args.layout, isa=args.isa)
    print(m.report(), file=sys.stderr)
    text = json.dumps(m.sweep, indent=1)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text + "\n")
        print(f"wrote {args.output}: gemm-dispatcher sweep {args.output} --variant {m.variant} "
              f"--target {args.target}", file=sys.stderr)
    else:
        print(text)
    return 0


def cmd_legacy_streamk(args):
    from .legacy import driver
    return driver.main(args.rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gemm-dispatcher", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("plugins", help="list plugins, their variants, hooks and status")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_plugins)

    s = sub.add_parser("run", help="build if needed, run and time one problem")
    s.add_argument("--variant", default="regular")
    s.add_argument("--m", type=int, default=1024)
    s.add_argument("--n", type=int, default=1024)
    s.add_argument("--k", type=int, default=1024)
    s.add_argument("--groups", help="grouped problems: MxNxK[,MxNxK...]")
    s.add_argument("--dtype", default="fp32", choices=dtypes.INPUT_TOKENS)
    s.add_argument("--out-dtype")
    s.add_argument("--layout", default="rcr", help="A, B, C layout chars (C is r)")
    s.add_argument("--target", default="cpu")
    s.add_argument("--config", nargs="*", help="config fields: key=value ... or a JSON object")
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--repeat", type=int, default=10)
    s.add_argument("--verify", action="store_true", help="compare with a float64 reference")
    s.add_argument("--strict", action="store_true", help="no fallback on status -2")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("kernels", help="what the build cache holds")
    s.add_argument("--json", action="store_true")
    s.add_argument("--prune", action="store_true", help="remove corrupt entries and stale temp files")
    s.set_defaults(fn=cmd_kernels)

    s = sub.add_parser("sweep", help="tile engine: expand a sweep config, build, benchmark, tune")
    s.add_argument("config", help="sweep config JSON ({axis: {values: [...]} | {min, max, step}})")
    s.add_argument("--variant", default="regular")
    s.add_argument("--target", default="cpu")
    s.add_argument("--dtype", default="fp32", choices=dtypes.INPUT_TOKENS)
    s.add_argument("--out-dtype")
    s.add_argument("--layout", default="rcr")
    s.add_argument("--problems", help="problem file (default: a built-in set)")
    s.add_argument("--workers", type=int, default=0, help="build processes (default: CPUs)")
    s.add_argument("--devices", help="benchmark workers, one per id: 0,1 (0,0: two on GPU 0); "
                                     "on the CPU each worker gets a share of the CPUs")
    s.add_argument("--kernel-timeout", type=float, default=60.0, help="seconds per measurement")
    s.add_argument("--max-kernels", type=int, default=0)
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--repeat", type=int, default=10)
    s.add_argument("--rotating", type=int, default=1, help="input sets cycled while timing")
    s.add_argument("--no-flush", action="store_true", help="GPU: do not flush L2 before each timed run")
    s.add_argument("--verify", action="store_true")
    s.add_argument("--out", default="sweep_results")
    s.add_argument("--resume", action="store_true", help="skip measurements already in --out")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_sweep)

    s = sub.add_parser("report", help="winners per problem and a throughput plot of sweep results")
    s.add_argument("results", help="a sweep --out folder or its results.csv")
    s.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    s.set_defaults(fn=cmd_report)

    s = sub.add_parser("migrate", help="CK legacy Tile Engine configs and kernel names -> gemm-dispatcher")
    s.add_argument("legacy", nargs="?", help="legacy TE / bridge / codegen config JSON")
    s.add_argument("-o", "--output", help="write the sweep config here (default: stdout)")
    s.add_argument("--target", default="cpu")
    s.add_argument("--variant", help="regular, stream_k or grouped (default: from the config)")
    s.add_argument("--dtype", default="fp16", help="for the old tile_configs[dtype][layout] form")
    s.add_argument("--layout", default="rcr")
    s.add_argument("--names", help="a file of CK kernel names (list files: name|tile|trait) to map")
    from .targets import cpu_isa
    s.add_argument("--isa", choices=tuple(cpu_isa.ISAS),
                   help="cpu target: the ISA the configs and names are for "
                        "(default: $DISPATCHER_CPU_ISA, else the best this machine runs)")
    s.set_defaults(fn=cmd_migrate)

    s = sub.add_parser("legacy-streamk-benchmark", add_help=False,
                       help="drop-in for CK's gemm_streamk_benchmark.py (deprecated)")
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(fn=cmd_legacy_streamk)

    s = sub.add_parser("demo", help="run every variant on the CPU, verified")
    s.set_defaults(fn=cmd_demo)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except BrokenPipeError:  # e.g. `gemm-dispatcher kernels | head`
        return 0
    except DispatcherError as e:
        print(f"gemm-dispatcher: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
