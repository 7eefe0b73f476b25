"""The `gemm-dispatcher` command (also `python -m dispatcher`)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings

import attrs

from . import dtypes, targets
from .dispatch import Dispatcher
from .build import BuildCache
from .config import LAYOUTS
from .errors import ConfigError, DispatcherError, ProblemError
from .files import read_text
from .plugins import get_manager
from .kinds import prepare_gemm
from .problem import prepare_grouped
from .timing import TimingOptions, measure, median
from .verify import max_rel, random_matrix, reference, tolerance


CLI_LAYOUTS = tuple(l for l in LAYOUTS if l[2] == "r")  # the CLI's outputs are row-major
LEGACY_STREAMK = "legacy-streamk-benchmark"


class _DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends an option's default unless its help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        return text if "default" in text else super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Every help shows the defaults; a usage error is one line and exit
    status 2, like every other error of the command."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _at_least(low, kind=int):
    """An argparse type: a `kind` number >= low, so that a count or size the
    API would reject is a usage error naming the option."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"wants a number >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return value
    return parse


def _target(name: str) -> str:
    """--target, checked by the API's own rule: the same message as `gemm(target=...)`."""
    try:
        targets.get(name)
    except DispatcherError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name


def _groups(text: str) -> list:
    """--groups MxNxK[,MxNxK...], sizes >= 0 as `grouped_gemm` accepts them."""
    try:
        groups = [tuple(int(v) for v in g.lower().split("x")) for g in text.split(",")]
    except ValueError:
        groups = []
    if not groups or any(len(g) != 3 or min(g) < 0 for g in groups):
        raise argparse.ArgumentTypeError(f"wants MxNxK[,MxNxK...] with sizes >= 0, got {text!r}")
    return groups


def _parse_config(items) -> dict:
    """`--config key=value ...` or one JSON object."""
    config = {}
    for item in items or ():
        if item.lstrip().startswith("{"):
            config.update(_json_object(item))
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--config wants key=value or a JSON object, got {item!r}")
        config[key] = int(value) if value.lstrip("-").isdigit() else value
    return config or None


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"--config {text!r} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--config {text!r} is not a JSON object")
    return value


def run_once(d: Dispatcher, *, variant, m=0, n=0, k=0, groups=None, dtype="fp32", layout="rcr",
             target="cpu", out_dtype=None, config=None, verify=False, strict=False,
             timing=TimingOptions(), seed=0):
    """Build (if needed), time and optionally verify one problem; a result dict."""
    import numpy as np

    rng = np.random.default_rng(seed)
    record = get_manager().variant(variant)
    kind = record.problem_kind
    if groups and kind != "grouped":
        raise ProblemError(f"--groups needs a grouped variant (--variant grouped); {variant!r} "
                           "runs one problem of --m, --n, --k")
    if kind == "grouped":
        shapes = groups or [(m, n, k)]
        As = [random_matrix(gm, gk, dtype, layout[0], rng) for gm, _, gk in shapes]
        Bs = [random_matrix(gk, gn, dtype, layout[1], rng) for _, gn, gk in shapes]
        problem, operands, results = prepare_grouped(As, Bs, out_dtype=out_dtype, variant=variant,
                                                     target=target)
        references = [lambda a=a, b=b: reference(a, b) for a, b in zip(As, Bs)]
    else:
        a = random_matrix(m, k, dtype, layout[0], rng)
        b = random_matrix(k, n, dtype, layout[1], rng)
        if _declared_operands(record):  # `arrays`: the argument block points into them
            problem, operands, result, arrays, ref = _declared_call(record, a, b, out_dtype, target, verify, rng)
        else:
            problem, operands, result = prepare_gemm(a, b, out_dtype=out_dtype, variant=variant,
                                                     target=target)
            ref = lambda: reference(a, b)
        results, references = [result], [ref]
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
        refs = [ref() for ref in references]
        for r in results:
            r[...] = np.nan if r.dtype.kind == "f" or r.dtype.kind == "V" else 0
        d.launch(library, problem, operands)
        errors = [max_rel(r, ref) for r, ref in zip(results, refs)]
        row["max_rel"] = max(errors, default=0.0)
        row["tolerance"] = tolerance(chosen, max((s[2] for s in problem.shapes), default=1))
        row["verified"] = row["max_rel"] <= row["tolerance"]
    return row


def _declared_operands(record) -> list:
    """The names of the extra operands and parameters a kernel of `record`
    needs besides a, b and out: a call without them is not its problem."""
    return ([o.name for o in record.operands if o.role == "extra" and not o.optional]
            + [p.name for p in record.params])


def _declared_call(record, a, b, out_dtype, target, verify, rng) -> tuple:
    """(problem, argument block, result, operand arrays, reference thunk)
    of a run of a variant with extra operands or parameters: each required
    extra operand random values of its declared dims and dtype, each
    parameter its default. The argument block holds raw pointers into the
    operand arrays: keep them while it runs. Verifying needs the record's
    `reference`; without one the run is refused before anything is built."""
    import numpy as np
    from .kinds import prepare, role_names
    if verify and record.reference is None:
        raise ProblemError(f"variant {record.name!r} takes {', '.join(_declared_operands(record))} and has no "
                           "reference (VariantRecord.reference) to verify them against; run it without --verify")
    (m, k), n = a.shape, b.shape[1]
    sizes, out = dict(m=m, n=n, k=k), dtypes.output_for(dtypes.get(a.dtype).token, out_dtype).token
    roles = role_names(record)
    arrays = {roles["a"]: a, roles["b"]: b}
    for o in record.operands:
        if o.role == "extra" and not o.optional:
            token = {"in": dtypes.get(a.dtype).token, "out": out}.get(o.dtype, o.dtype)
            arrays[o.name] = random_matrix(sizes[o.dims[0]], sizes[o.dims[1]], token, "r", rng)
    params = {p.name: p.default for p in record.params}
    problem, blocks, result = prepare(record, arrays, params, {}, out_dtype=out_dtype, target=target,
                                      allocate=np.empty)
    return (problem, blocks[0], result, arrays,
            lambda: record.reference({name: x.astype(np.float64) for name, x in arrays.items()},
                                     {"alpha": 1.0, **params}))


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
    row = run_once(Dispatcher(), variant=args.variant, m=args.m, n=args.n, k=args.k, groups=args.groups,
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
    cache = BuildCache()
    if args.prune:
        print(f"removed {cache.prune()} corrupt or stale item(s) from {cache.root}")
        return 0
    entries = cache.entries()
    if args.json:
        print(json.dumps(entries, indent=1))
        return 0
    shared = f" and the read-only shared cache {cache.shared}" if cache.shared else ""
    print(f"{len(entries)} kernel(s) in {cache.root}{shared}")
    for e in entries:
        print(f"  {e['status']:7} {e.get('name', e['key'])}  ({e.get('build_seconds', '?')} s build)"
              + ("  [shared]" if e.get("shared") else ""))
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
        layout=args.layout, out_dtype=args.out_dtype, problems=args.problems, executor=args.executor,
        workers=args.workers, devices=args.devices, address=args.address, slots=args.slots,
        slot_cpus=args.slot_cpus, slot_timeout=args.slot_timeout,
        kernel_timeout=args.kernel_timeout, max_kernels=args.max_kernels,
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


def cmd_export_tuning(args):
    """This machine's tuning times (its own rows, not the shipped ones) as
    a file of shipped times, for `dispatcher/data/tuning/`."""
    import platform
    import time
    from .tuning import TuningDatabase
    db = TuningDatabase.default()
    about = args.about or (f"times of {db.path} on {platform.node()}, "
                           f"exported {time.strftime('%Y-%m-%d')}")
    print(f"{db.export(args.out, about, args.target)} rows written to {args.out}")
    return 0


def _isa_spec(text: str) -> str:
    """--isa: a CPU ISA spec, in its canonical spelling."""
    from .targets import cpu_isa
    try:
        return cpu_isa.get(text).name
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


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
        lines = read_text(args.names, "name list").splitlines()
        print("# CK name\tCK bridge name\tgemm-dispatcher name\tbuildable here")
        ok = True
        for line in lines:
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


def _problem_record(variant, target, dtype, out_dtype, layout, m=1, n=1, k=1):
    """The GemmProblem a command describes (no arrays: nothing is allocated)."""
    from .problem import GemmProblem
    out = dtypes.output_for(dtype, out_dtype).token
    return GemmProblem(m, n, k, dtype, out, layout, variant, target)


def cmd_explain(args):
    """The ranked candidates of one problem with their estimates, and why
    the others were rejected; nothing is built or run (no GPU needed)."""
    d = Dispatcher()
    d.manager.variant(args.variant)  # PluginError naming the known variants
    problem = _problem_record(args.variant, args.target, args.dtype, args.out_dtype, args.layout,
                              args.m, args.n, args.k)
    found = d.explain(problem)
    if args.json:
        print(json.dumps(dict(
            problem=attrs.asdict(problem), chosen=found["chosen"] and found["chosen"].name,
            tuned=found["tuned"] and found["tuned"].config.name,
            tuned_from=found["tuned"] and dict(problem=found["tuned"].problem, shipped=found["tuned"].shipped,
                                               exact=found["tuned"].exact, neighbours=found["tuned"].neighbours,
                                               fitted=found["tuned"].fitted,
                                               predicted_ms=found["tuned"].predicted_ms),
            ranked=[dict(kernel=e.config.name, estimate=e.value, model=e.model) for e in found["ranked"]],
            rejected=[dict(kernel=str(n), reason=why) for n, why in found["rejected"]]), indent=1))
        return 0
    print(f"problem  {problem.variant} {problem.m}x{problem.n}x{problem.k} {problem.dtype}->"
          f"{problem.out_dtype} {problem.layout} on {problem.target}")
    print(f"tuned    {found['tuned'] or '(no tuning-database entry near enough to decide)'}")
    print(f"chosen   {found['chosen'].name if found['chosen'] else '(none: no candidate)'}")
    print("ranked candidates (best first):")
    for i, e in enumerate(found["ranked"], 1):
        print(f"  {i:2}. {e.value:12.4g}  {e.model:38}  {e.config.name}")
    if found["rejected"]:
        print("rejected:")
        for name, why in found["rejected"]:
            print(f"  {name}: {why}")
    return 0


def cmd_prebuild(args):
    """Every config of the variants' catalogs for the dtypes and layouts
    asked, built into the cache in parallel, so a machine runs without
    compiling."""
    import os
    from .tile_engine.builder import build_all
    if args.arch:
        os.environ["DISPATCHER_CUDA_ARCH"] = args.arch.removeprefix("sm_")
    d = Dispatcher(tuning=None)
    variants = args.variant or sorted(n for n, r in d.manager.variants().items() if args.target in r.targets)
    configs, skipped = {}, 0
    for variant in variants:
        d.manager.variant(variant)  # PluginError naming the known variants
        for dtype in args.dtype:
            for layout in args.layout:
                found, rejected = d.default_configs(_problem_record(variant, args.target, dtype, None, layout))
                configs.update((c.name, c) for c in found)
                skipped += len(rejected)
    print(f"prebuild: {len(configs)} kernel(s) for {', '.join(variants)} on {args.target} "
          f"({skipped} catalog entries do not apply to these dtypes and layouts)", file=sys.stderr)
    built, failures = build_all(list(configs.values()), workers=args.workers, progress=not args.quiet)
    for name, error in failures:
        print(f"  FAILED {name}: {error.splitlines()[0] if error else ''}", file=sys.stderr)
    print(f"prebuild: {len(built)} built or already cached, {len(failures)} failed")
    return 1 if failures else 0


def cmd_legacy_streamk(argv) -> int:
    from .legacy import driver
    return driver.main(argv)


def _problem_options(s):
    """The options `run` and `sweep` share: what to run and how to time it."""
    s.add_argument("--variant", default="regular",
                   help="regular, stream_k, grouped or a plugin's (see `gemm-dispatcher plugins`)")
    s.add_argument("--target", default="cpu", type=_target, metavar="{" + ",".join(targets.names()) + "}",
                   help="where kernels run")
    s.add_argument("--dtype", default="fp32", choices=dtypes.INPUT_TOKENS, help="input dtype")
    s.add_argument("--out-dtype", help="output dtype; None: CK's rule (fp8 -> fp16, int8 -> int32, "
                                       "else the input's)")
    s.add_argument("--layout", default="rcr", choices=CLI_LAYOUTS,
                   help="A, B, C storage: r row-, c column-major (C is row-major here)")
    s.add_argument("--warmup", type=_at_least(0), default=3, help="untimed runs first")
    s.add_argument("--repeat", type=_at_least(1), default=10, help="timed runs; the median is reported")
    s.add_argument("--verify", action="store_true", help="compare with a float64 reference")
    s.add_argument("--json", action="store_true", help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="gemm-dispatcher", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("plugins", help="list plugins, their variants, hooks and status")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_plugins)

    s = sub.add_parser("run", help="build if needed, run and time one problem",
                       description="Build if needed, run and time one problem. M, N and K are >= 1: "
                                   "a zero size runs no kernel to time (the API returns an empty "
                                   "result for it).")
    s.add_argument("--m", type=_at_least(1), default=1024, help="rows of A and C")
    s.add_argument("--n", type=_at_least(1), default=1024, help="columns of B and C")
    s.add_argument("--k", type=_at_least(1), default=1024, help="columns of A and rows of B")
    s.add_argument("--groups", type=_groups,
                   help="a grouped variant's problems: MxNxK[,MxNxK...], sizes >= 0 (None: one of "
                        "--m, --n, --k)")
    _problem_options(s)
    s.add_argument("--config", nargs="*", help="config fields: key=value ... or a JSON object "
                                               "(None: selected for the problem)")
    s.add_argument("--strict", action="store_true", help="no fallback on status -2")
    s.set_defaults(fn=cmd_run)

    s = sub.add_parser("kernels", help="what the build cache holds")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.add_argument("--prune", action="store_true", help="remove corrupt entries and stale temp files")
    s.set_defaults(fn=cmd_kernels)

    s = sub.add_parser("sweep", help="tile engine: expand a sweep config, build, benchmark, tune")
    s.add_argument("config", help="sweep config JSON ({axis: {values: [...]} | {min, max, step}})")
    _problem_options(s)
    s.add_argument("--problems", help="problem file (None: a built-in set)")
    s.add_argument("--workers", type=_at_least(0), default=0, help="build processes (0: one per CPU)")
    s.add_argument("--devices", help="benchmark workers, one per id: 0,1 (0,0: two on GPU 0); "
                                     "on the CPU each worker gets a share of the CPUs (None: every "
                                     "GPU, or one CPU worker)")
    s.add_argument("--executor", default="local", choices=("local", "ray"),
                   help="where builds and benchmarks run: this machine, or a Ray cluster "
                        "(the ray extra; see docs/tile-engine.md)")
    s.add_argument("--address", help="ray: the cluster's address (None: start one on this machine)")
    s.add_argument("--slots", type=_at_least(0), default=0,
                   help="ray: benchmark slots (0: one per GPU, or per --slot-cpus CPUs of each node)")
    s.add_argument("--slot-cpus", type=_at_least(0), default=0,
                   help="ray: CPUs a slot holds (0: cpu target, the smallest node's CPUs; GPU, 1)")
    s.add_argument("--slot-timeout", type=_at_least(0, float), default=0.0,
                   help="ray: seconds for a slot's actor to start before the slot retires (0: 300)")
    s.add_argument("--kernel-timeout", type=_at_least(0.1, float), default=60.0,
                   help="seconds per measurement")
    s.add_argument("--max-kernels", type=_at_least(0), default=0, help="build at most this many (0: all)")
    s.add_argument("--rotating", type=_at_least(1), default=1, help="input sets cycled while timing")
    s.add_argument("--no-flush", action="store_true", help="GPU: do not flush L2 before each timed run")
    s.add_argument("--out", default="sweep_results", help="results folder")
    s.add_argument("--resume", action="store_true", help="skip measurements already in --out")
    s.add_argument("--quiet", action="store_true", help="no progress bars")
    s.set_defaults(fn=cmd_sweep)

    s = sub.add_parser("report", help="winners per problem and a throughput plot of sweep results")
    s.add_argument("results", help="a sweep --out folder or its results.csv")
    s.add_argument("--plot", help="write a PNG plot here (needs matplotlib)")
    s.set_defaults(fn=cmd_report)

    s = sub.add_parser("export-tuning", help="this machine's tuning times as a file of shipped times "
                       "(dispatcher/data/tuning)")
    s.add_argument("out", help="the JSON file to write, e.g. sm_90a.json")
    s.add_argument("--about", help="what measured them: the GPU or CPU and the sweeps (default: the "
                   "database, host and date)")
    s.add_argument("--target", choices=("cpu", "cuda"), help="only this target's times (default: all)")
    s.set_defaults(fn=cmd_export_tuning)

    s = sub.add_parser("migrate", help="CK legacy Tile Engine configs and kernel names -> gemm-dispatcher")
    s.add_argument("legacy", nargs="?", help="legacy TE / bridge / codegen config JSON")
    s.add_argument("-o", "--output", help="write the sweep config here (default: stdout)")
    s.add_argument("--target", default="cpu")
    s.add_argument("--variant", help="regular, stream_k or grouped (default: from the config)")
    s.add_argument("--dtype", default="fp16", help="for the old tile_configs[dtype][layout] form")
    s.add_argument("--layout", default="rcr")
    s.add_argument("--names", help="a file of CK kernel names (list files: name|tile|trait) to map")
    s.add_argument("--isa", type=_isa_spec,
                   help="cpu target: the ISA the configs and names are for, with any extensions "
                        "(avx512, avx512+bf16+vnni, avx2, generic, neon+dotprod; default: "
                        "$DISPATCHER_CPU_ISA, else the best this machine runs)")
    s.set_defaults(fn=cmd_migrate)

    # listed here; main() hands every argument after it to CK's parser (--help too)
    sub.add_parser(LEGACY_STREAMK, add_help=False,
                   help="drop-in for CK's gemm_streamk_benchmark.py (deprecated); see its --help")

    s = sub.add_parser("explain", help="rank the candidate kernels of one problem, running nothing")
    s.add_argument("--variant", default="regular", help="a single-GEMM variant: regular, stream_k, ...")
    s.add_argument("--target", default="cpu", type=_target, metavar="{" + ",".join(targets.names()) + "}")
    s.add_argument("--dtype", default="fp32", choices=dtypes.INPUT_TOKENS, help="input dtype")
    s.add_argument("--out-dtype", help="output dtype; None: CK's rule")
    s.add_argument("--layout", default="rcr", choices=CLI_LAYOUTS, help="A, B, C storage")
    s.add_argument("--m", type=_at_least(1), required=True, help="rows of A and C")
    s.add_argument("--n", type=_at_least(1), required=True, help="columns of B and C")
    s.add_argument("--k", type=_at_least(1), required=True, help="columns of A and rows of B")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(fn=cmd_explain)

    s = sub.add_parser("prebuild", help="build the variants' kernel catalogs ahead of time, in parallel")
    s.add_argument("--target", default="cpu", type=_target, metavar="{" + ",".join(targets.names()) + "}")
    s.add_argument("--arch", choices=("sm_90a",), help="cuda: the architecture to build for "
                                                       "(default: the GPU's, else sm_90a)")
    s.add_argument("--variant", action="append", help="a variant (repeatable; default: every one the target has)")
    s.add_argument("--dtype", nargs="+", default=["bf16"], choices=dtypes.INPUT_TOKENS, help="input dtypes")
    s.add_argument("--layout", nargs="+", default=["rcr"], choices=CLI_LAYOUTS, help="layouts")
    s.add_argument("--workers", type=_at_least(0), default=0, help="build processes (0: one per CPU)")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.set_defaults(fn=cmd_prebuild)

    s = sub.add_parser("demo", help="run every variant on the CPU, verified")
    s.set_defaults(fn=cmd_demo)
    return p


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings as one line each, like the command's errors (no source line)."""
    print(f"gemm-dispatcher: warning: {message}", file=sys.stderr)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            if argv[:1] == [LEGACY_STREAMK]:
                return cmd_legacy_streamk(argv[1:])
            args = build_parser().parse_args(argv)
            return args.fn(args)
        except BrokenPipeError:  # e.g. `gemm-dispatcher kernels | head`
            return 0
        except KeyboardInterrupt:  # Ctrl-C, or `timeout -s INT`: what the command kept, it said
            print("gemm-dispatcher: interrupted", file=sys.stderr)
            return 130
        except (DispatcherError, OSError) as e:  # OSError: a file or folder named on the command line
            print(f"gemm-dispatcher: error: {type(e).__name__}: {e}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
