"""The NEON (aarch64) kernels, cross-compiled and run under qemu-aarch64.

No aarch64 machine runs CI, so the NEON path is proved by emulation: each
kernel's generated source (from the variant's own codegen hook) is built into
a shared library with the NEON toolchain's own compiler and flags, and
`tests/native/neon_driver.cpp` loads and launches it under `qemu-aarch64` on
inputs written here. Outputs are poisoned before the launch, operands sit in
poisoned padding (so a wrong leading dimension reads or writes poison), and
results are compared with the float64 reference as in test_regular.py.

Every micro-kernel of the NEON ISA's extensions (sdot, bfdot, smmla: `cpu_isa`)
runs every variant too, under `qemu-aarch64 -cpu max` (which has them), and
its library is checked to hold the instruction.

Runs wherever Debian's `g++-aarch64-linux-gnu` and `qemu-user` are installed
(`.ci/run` installs them); skipped elsewhere. All kernels are compiled in
parallel and every case runs in one qemu process, to stay fast on 2 cores.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import dispatcher
from dispatcher import plugins, targets
from dispatcher.errors import ToolchainError
from dispatcher.targets import cpu_isa
from dispatcher.targets.cpu import CROSS_COMPILERS, Toolchain
from dispatcher.targets.toolchain import NATIVE_DIR
from dispatcher.verify import max_rel, poison, random_matrix, reference, tolerance

CROSS = CROSS_COMPILERS["aarch64"]
QEMU = "qemu-aarch64"
OBJDUMP = "aarch64-linux-gnu-objdump"
DRIVER = Path(__file__).parent / "native" / "neon_driver.cpp"
COMPILE_TIMEOUT_S = 300   # one kernel takes ~2 s; a stuck compiler fails the test instead
RUN_TIMEOUT_S = 300       # every case, one qemu process; ~10 s

# Several blocks, partial edge blocks and several K blocks on the shapes
# below; a multiple of every micro-tile used here.
TILE = dict(tile_m=24, tile_n=48, tile_k=32)
# More OpenMP workers than CI's cores, so stream-K splits tiles three ways.
THREADS = 3
DTYPES = ("fp32", "fp16", "bf16", "int8", "fp8_e4m3")
LAYOUTS = ("rcr", "rrr", "crr", "ccr")
# Block options per variant. regular keeps NEON's default micro-tile (12x8);
# the others take other tiles that fit its 32 vector registers.
VARIANTS = {
    "regular": {},
    "stream_k": dict(reduction="linear", decomposition="stream_k", micro_m=8, micro_n=12),
    "grouped": dict(micro_m=4, micro_n=16),
}
# Atomic stream-K (fp32 and int32 outputs only) and the hybrid decomposition.
EXTRA_KERNELS = [
    ("stream_k", "fp32", "ccr", dict(reduction="atomic", decomposition="hybrid", micro_m=8, micro_n=12)),
    ("stream_k", "int8", "rcr", dict(reduction="atomic", decomposition="stream_k", micro_m=8, micro_n=12)),
]
# The instruction each extension micro-kernel is built around.
INSTRUCTIONS = {"dcpu::DotS8": "sdot", "dcpu::DotBf16": "bfdot", "dcpu::MmlaS8": "smmla"}
# Each micro-kernel of an extension: its spec (the base and the extensions it
# needs) and the dtypes it computes. A K block of 29 ends in a partial k group.
EXTENSION_KERNELS = [(cpu_isa.Spec(cpu_isa.ISAS["neon"], tuple(cpu_isa.ISAS["neon"].extension(e)
                                                               for e in kernel.needs)).name, dtype)
                     for kernel in cpu_isa.ISAS["neon"].micro_kernels for dtype in sorted(kernel.dtypes)
                     if dtype in DTYPES]
# (M, N, K), alpha, beta of each GEMM launch; alpha and beta are exact in int32.
GEMM_LAUNCHES = [((37, 53, 71), 1.0, 0.0), ((1, 1, 70), 1.0, 0.0), ((131, 7, 257), 1.0, 0.0),
                 ((48, 96, 64), 1.0, 0.0), ((37, 53, 71), -2.0, 3.0)]
# The groups of each grouped launch (one empty), alpha, beta.
GROUPED_LAUNCHES = [([(37, 53, 71), (0, 64, 32), (1, 1, 1), (130, 9, 200), (64, 96, 64)], 1.0, 0.0),
                    ([(37, 53, 71), (5, 40, 33)], -2.0, 3.0)]
PAD = 3  # extra elements of every leading dimension


def kernel_specs() -> list:
    """Every variant x dtype once, the layout rotating with both (dtype i of
    variant v runs layout (i + v) mod 4), so each variant runs every layout and
    each dtype three of them, for a fifth of the full product's compile time."""
    specs = [(variant, dtype, LAYOUTS[(i + v) % len(LAYOUTS)], options)
             for v, (variant, options) in enumerate(VARIANTS.items())
             for i, dtype in enumerate(DTYPES)]
    def extension(options, isa):  # the micro-kernel's own micro-tile
        return dict({k: v for k, v in options.items() if not k.startswith("micro_")}, isa=isa, tile_k=29)

    extended = [(variant, dtype, LAYOUTS[(i + v) % len(LAYOUTS)], extension(options, isa))
                for i, (isa, dtype) in enumerate(EXTENSION_KERNELS)
                for v, (variant, options) in enumerate(VARIANTS.items())]
    extended += [(variant, dtype, layout, extension(options, isa))
                 for variant, dtype, layout, options in EXTRA_KERNELS
                 for isa, ext_dtype in EXTENSION_KERNELS if ext_dtype == dtype]
    return [pytest.param(spec, id="-".join([spec[3].get("isa", "neon"), *spec[:3]]) +
                         ("-atomic" if spec[3].get("reduction") == "atomic" else ""))
            for spec in specs + EXTRA_KERNELS + extended]


def run_bounded(cmd: list, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """`cmd` in its own process group, all of which is killed if it outlives
    `timeout`: killing g++ alone would leave cc1plus running, and no wait on
    a child may hang the suite."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)
            pytest.fail(f"{Path(cmd[0]).name} ran over {timeout} s: {' '.join(map(str, cmd))}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def cross_sysroot() -> Path:
    """Where the aarch64 libc, libstdc++ and libgomp live (qemu's -L): the
    folder above the one the cross compiler links libc from."""
    proc = run_bounded([CROSS, "-print-file-name=libc.so.6"], 60)
    libc = Path(proc.stdout.strip())
    if not libc.is_absolute():
        pytest.skip(f"{CROSS} has no aarch64 libc (install libc6-dev-arm64-cross)")
    return libc.resolve().parent.parent


@dataclass
class Operand:
    """A matrix inside a larger buffer: its leading dimension is PAD elements
    longer and the padding is poison, so reading it spoils the result and
    writing it is caught."""

    buffer: np.ndarray
    view: np.ndarray
    ld: int
    path: Path

    @classmethod
    def around(cls, matrix: np.ndarray, major: str, path: Path) -> "Operand":
        rows, cols = matrix.shape
        if major == "r":
            buffer = poison(np.empty((rows, cols + PAD), matrix.dtype))
        else:
            buffer = poison(np.empty((rows + PAD, cols), matrix.dtype, order="F"))
        view = buffer[:rows, :cols]
        view[...] = matrix
        return cls(buffer, view, buffer.shape[1] if major == "r" else buffer.shape[0], path)

    def write(self) -> None:
        self.path.write_bytes(self.buffer.tobytes(order="A"))  # in the buffer's own order

    def read_back(self) -> np.ndarray:
        """The row-major buffer as the kernel left it."""
        return np.fromfile(self.path, self.buffer.dtype).reshape(self.buffer.shape)


@dataclass
class Gemm:
    """One problem of a launch: operands, the reference and the C file."""

    a: Operand
    b: Operand
    c: Operand
    ref: np.ndarray

    @classmethod
    def make(cls, config, shape, alpha, beta, stem: Path, rng) -> "Gemm":
        m, n, k = shape
        a = random_matrix(m, k, config.dtype_a, config.layout[0], rng)
        b = random_matrix(k, n, config.dtype_b, config.layout[1], rng)
        c_in = random_matrix(m, n, config.dtype_c, "r", rng)
        c = Operand.around(c_in, "r", stem.with_suffix(".c"))
        if not beta:  # C is not read: poison it all, so an element left unwritten is caught
            poison(c.view)
        gemm = cls(Operand.around(a, config.layout[0], stem.with_suffix(".a")),
                   Operand.around(b, config.layout[1], stem.with_suffix(".b")), c,
                   reference(a, b, c_in, alpha, beta))
        for operand in (gemm.a, gemm.b, gemm.c):
            operand.write()
        return gemm

    def fields(self) -> str:
        m, k = self.a.view.shape
        n = self.b.view.shape[1]
        return (f"{m} {n} {k} {self.a.ld} {self.b.ld} {self.c.ld} "
                f"{self.a.path} {self.b.path} {self.c.path}")


# The driver's line for each launch, in job order.
REPORT = re.compile(r"case (\d+) status (-?\d+) name (\S+) error ?(.*)")


@dataclass
class Launch:
    """One line of the job file: one kernel call, and the status, kernel
    name and error message it reported."""

    gemms: list
    alpha: float
    beta: float
    status: int = None
    name: str = ""
    error: str = ""

    def line(self, config, library: Path) -> str:
        if config.variant == "grouped":
            body = f"{len(self.gemms)} " + " ".join(g.fields() for g in self.gemms)
            return f"grouped {library} {self.alpha!r} {self.beta!r} {body}"
        return f"gemm {library} {self.alpha!r} {self.beta!r} {self.gemms[0].fields()}"


@dataclass
class Kernel:
    """One config: why it is invalid (None if valid), its build, its launches."""

    config: object
    problem: str | None
    source: Path
    flags: tuple
    library: Path
    build_error: str = ""
    instructions: str = ""  # the library's disassembly, for an extension kernel
    launches: list = field(default_factory=list)


def neon_config(spec):
    variant, dtype, layout, options = spec
    return dispatcher.KernelConfig.create(variant=variant, dtype=dtype, layout=layout,
                                          **{**TILE, "isa": "neon", "threads": THREADS, **options})


def make_kernel(spec, folder: Path) -> Kernel:
    """The config of `spec` and its generated source on disk. The codegen
    hook is called directly: `Dispatcher.codegen` refuses an ISA this machine
    cannot run."""
    config = neon_config(spec)
    cpu = targets.get("cpu")
    problem = cpu.build_problem(config) or plugins.get_manager().variant(config.variant).check(config)
    source = plugins.get_manager().hook.dispatcher_codegen(config=config, target=cpu)
    (name, text), = source.files
    (folder / name).write_text(text)
    return Kernel(config, problem, folder / name, source.flags, folder / f"{config.name}.so")


def compile_kernel(kernel: Kernel) -> None:
    """The product's build command: its NEON spec's toolchain and flags, a shared library."""
    toolchain = Toolchain.find(kernel.config.target_params["isa"])
    proc = run_bounded([toolchain.compiler, *toolchain.flags, *kernel.flags, str(kernel.source),
                        "-o", str(kernel.library)], COMPILE_TIMEOUT_S)
    if proc.returncode:
        kernel.build_error = proc.stderr
    elif kernel.config.target_params["isa"] != "neon":
        kernel.instructions = run_bounded([OBJDUMP, "-d", str(kernel.library)], COMPILE_TIMEOUT_S).stdout


def compile_driver(toolchain: Toolchain, exe: Path) -> None:
    proc = run_bounded([toolchain.compiler, "-O1", "-std=c++17", f"-I{NATIVE_DIR}", str(DRIVER),
                        "-o", str(exe)], COMPILE_TIMEOUT_S)
    assert proc.returncode == 0, f"the driver does not build:\n{proc.stderr[-3000:]}"


def make_launches(kernel: Kernel, folder: Path, rng) -> list:
    """The launches of `kernel`, their inputs written to `folder`."""
    stem = folder / kernel.config.name
    if kernel.config.variant == "grouped":
        return [Launch([Gemm.make(kernel.config, shape, alpha, beta, Path(f"{stem}_{i}_{g}"), rng)
                        for g, shape in enumerate(shapes)], alpha, beta)
                for i, (shapes, alpha, beta) in enumerate(GROUPED_LAUNCHES)]
    return [Launch([Gemm.make(kernel.config, shape, alpha, beta, Path(f"{stem}_{i}"), rng)], alpha, beta)
            for i, (shape, alpha, beta) in enumerate(GEMM_LAUNCHES)]


@pytest.fixture(scope="module")
def neon_kernels(tmp_path_factory) -> dict:
    """Every kernel of `kernel_specs` built and launched under qemu once, by
    config name; each test then checks its own kernel's results."""
    missing = [tool for tool in (CROSS, QEMU, OBJDUMP) if not shutil.which(tool)]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)} on PATH "
                    "(apt-get install g++-aarch64-linux-gnu qemu-user)")
    sysroot = cross_sysroot()
    folder = tmp_path_factory.mktemp("neon")
    toolchain = Toolchain.find("neon")
    kernels = [make_kernel(p.values[0], folder) for p in kernel_specs()]
    exe = folder / "neon_driver"
    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
        jobs = [pool.submit(compile_driver, toolchain, exe)]
        jobs += [pool.submit(compile_kernel, k) for k in kernels if not k.problem]
        for job in jobs:
            job.result()  # each compile is bounded by COMPILE_TIMEOUT_S
    rng = np.random.default_rng(1234)
    runnable = [k for k in kernels if not k.problem and not k.build_error]
    lines = []
    for kernel in runnable:
        kernel.launches = make_launches(kernel, folder, rng)
        lines += [launch.line(kernel.config, kernel.library) for launch in kernel.launches]
    (folder / "jobs.txt").write_text("\n".join(lines) + "\n")
    # Passive OpenMP waits: spinning threads are emulated instruction by instruction.
    env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
    proc = run_bounded([QEMU, "-cpu", "max", "-L", str(sysroot), str(exe), str(folder / "jobs.txt")],
                       RUN_TIMEOUT_S, env=env)
    reports = proc.stdout.splitlines()
    assert proc.returncode == 0 and len(reports) == len(lines), (
        f"qemu-aarch64 driver exited {proc.returncode} after {len(reports)} of {len(lines)} "
        f"launches:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    launches = [launch for kernel in runnable for launch in kernel.launches]
    for index, (launch, report) in enumerate(zip(launches, reports)):
        case, status, launch.name, launch.error = REPORT.fullmatch(report).groups()
        assert int(case) == index, report
        launch.status = int(status)
    return {k.config.name: k for k in kernels}


@pytest.mark.slow  # a minute of cross builds and emulation: CI runs it in its slow step (.ci/run)
@pytest.mark.parametrize("spec", kernel_specs())
def test_neon_kernel_matches_reference_under_qemu(spec, neon_kernels):
    config = neon_config(spec)
    kernel = neon_kernels[config.name]
    assert kernel.problem is None, f"{config.name} is not a valid NEON config: {kernel.problem}"
    assert not kernel.build_error, f"{config.name} does not cross-compile:\n{kernel.build_error[:3000]}"
    if config.target_params["isa"] != "neon":
        spec = cpu_isa.get(config.target_params["isa"])
        instruction = INSTRUCTIONS[spec.micro_kernel(config.dtype_a).cpp]
        assert f"\t{instruction}\t" in kernel.instructions, f"{config.name} has no {instruction}"
    for launch in kernel.launches:
        assert (launch.status, launch.name) == (0, config.name), launch.error
        for gemm in launch.gemms:
            after = gemm.c.read_back()
            m, n = gemm.ref.shape
            k = gemm.a.view.shape[1]
            assert after[:, n:].tobytes() == gemm.c.buffer[:, n:].tobytes(), \
                f"{(m, n, k)}: wrote outside C (into its leading-dimension padding)"
            err = max_rel(after[:, :n], gemm.ref)
            assert err <= tolerance(config, k), (
                f"{(m, n, k)} alpha={launch.alpha} beta={launch.beta}: max_rel {err} "
                f"(NaN or poison left means unwritten elements)")


def test_missing_cross_compiler_is_a_clear_toolchain_error(monkeypatch, tmp_path):
    """Building NEON kernels on a machine without the cross compiler names
    the compiler it looked for, instead of failing inside a build."""
    monkeypatch.setenv("PATH", str(tmp_path))
    Toolchain.find.cache_clear()  # a toolchain found earlier is cached; failures never are
    with pytest.raises(ToolchainError, match=f"ISA neon.*{re.escape(CROSS)}"):
        Toolchain.find("neon")
