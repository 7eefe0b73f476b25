"""The CPU target's instruction sets: every default valid on every ISA, the
ISA chosen by the machine or $DISPATCHER_CPU_ISA, and kept apart in kernel
names, cache keys and tuning keys. Nothing here depends on which ISA this
machine happens to run."""

import re

import attrs
import numpy as np
import pytest

import dispatcher
from dispatcher import dtypes, errors, targets
from dispatcher.api import Dispatcher
from dispatcher.build import BuildCache
from dispatcher.hookspecs import hookimpl
from dispatcher.plugins import PluginManager, get_manager
from dispatcher.problem import GemmProblem
from dispatcher.targets import cpu_isa
from dispatcher.tuning import TuningDatabase
from dispatcher.verify import max_rel, poison, random_matrix, reference, tolerance

CPU = targets.get("cpu")
LAYOUTS = ("rcr", "rrr", "crr", "ccr")
# Every ISA with all of its extensions, whatever this machine has.
FULL = {name: cpu_isa.Spec(isa, isa.extensions).name for name, isa in cpu_isa.ISAS.items()}


# Every spec: each base with all of its extensions, and each with one
# micro-kernel's extensions alone (AMX without the vector dot products).
SPECS = sorted(set(FULL.values()) | {cpu_isa.Spec(isa, tuple(isa.extension(e) for e in kernel.needs)).name
                                     for isa in cpu_isa.ISAS.values() for kernel in isa.micro_kernels})


def test_every_default_config_of_every_variant_is_valid_on_every_isa():
    """On every ISA spec and micro-kernel: a tile the best micro-kernel
    cannot tile (AMX computes 32x32 only; 120 and 48 rows are no multiple)
    is built with the next one that can, never refused; a tile the ISA's
    default micro-tile does not divide (64x192: 12x32, 6x16, 12x8) gets one
    that does, as the dispatcher fits it (`fit_sweep`)."""
    checked = 0
    for name, record in get_manager().variants().items():
        if "cpu" not in record.targets:
            continue
        for dtype in record.dtypes:
            for layout in record.layouts:
                for spec in SPECS:
                    configs = [CPU.fit_sweep([dispatcher.KernelConfig.create(
                        variant=name, target="cpu", dtype=dtype, layout=layout, isa=spec, **fields)], tuple(fields))[0]
                               for fields in record.default_configs("cpu", dtype, layout)]
                    valid = [c for c in configs if CPU.build_problem(c) is None and record.check(c) is None]
                    assert valid == configs, [(c.name, CPU.build_problem(c), record.check(c)) for c in configs]
                    checked += len(configs)
    assert checked >= 3 * len(dtypes.INPUT_TOKENS) * len(LAYOUTS) * len(cpu_isa.ISAS)


# The tiles of the parity tests (tests/test_regular.py's SMALL and the other
# variants'): 24 rows, which AMX's 32x32 does not divide.
PARITY_TILE = dict(tile_m=24, tile_n=64, tile_k=32)


@pytest.mark.parametrize("spec, dtype, expected", [
    # AMX-BF16 and AVX512-BF16 (the Xeon's default spec): vdpbf16ps, 12x32
    (FULL["avx512"], "bf16", "avx512+bf16"), (FULL["avx512"], "fp8_e4m3", "avx512+bf16"),
    (FULL["avx512"], "int8", "avx512+vnni"), (FULL["avx512"], "fp32", "avx512"),
    # AMX alone: the base's FMAs (int8: pmaddwd)
    ("avx512+amxbf16", "bf16", "avx512"), ("avx512+amxint8", "int8", "avx512"),
    ("avx512+amxbf16+amxint8+vnni", "int8", "avx512+vnni")])
def test_a_tile_amx_cannot_tile_falls_back_to_the_next_micro_kernel(spec, dtype, expected):
    """The Xeon's parity runs refused every bf16, fp8 and int8 kernel of
    the 24x64 parity tile ("no micro-tile of ISA avx512+amxbf16 divides
    it"): the spec was reduced to AMX's before the tile was looked at. The
    choice depends on the spec and the config alone, so it is computed
    here for specs this machine cannot run; the name says which kernel
    and micro-tile it is."""
    for variant in ("regular", "stream_k", "grouped", "batched"):
        config = dispatcher.KernelConfig.create(variant=variant, dtype=dtype, isa=spec, **PARITY_TILE)
        assert config.target_params["isa"] == expected, (variant, config.name)
        assert f"_cpu_{expected}_mt12x32_" in config.name
        assert CPU.build_problem(config) is None
        # a tile AMX divides keeps AMX: 32x32 tiles of the spec's tile micro-kernel
        whole = dispatcher.KernelConfig.create(variant=variant, dtype=dtype, isa=spec, tile_m=96, tile_n=128)
        kernel = cpu_isa.get(spec).micro_kernel(dtype)
        assert whole.target_params["isa"] == cpu_isa.get(spec).for_dtype(dtype).name
        assert (whole.target_params["micro_m"], whole.target_params["micro_n"]) == (
            (32, 32) if kernel.tiles else (12, 32))
        assert CPU.build_problem(whole) is None


def test_selection_ranks_a_fallback_after_the_best_micro_kernel():
    """On the Xeon's spec the regular variant's defaults are two AMX tiles
    (96 rows) and two fallbacks (120 and 48 rows: vdpbf16ps); the occupancy
    model divides a config's cost by its micro-kernel's peak rate, so the
    AMX ones rank first, as they did when the others were refused."""
    from dispatcher.selection import rank
    from regular_gemm.plugin import RECORD

    for dtype, amx, vector in (("bf16", "avx512+amxbf16", "avx512+bf16"), ("int8", "avx512+amxint8", "avx512+vnni")):
        for m, n, k in ((1024, 1024, 1024), (2048, 2048, 2048), (16, 4096, 4096)):
            problem = GemmProblem(m, n, k, dtype, dtypes.output_for(dtype).token, "rrr", variant="regular")
            configs = [dispatcher.KernelConfig.create(dtype=dtype, layout="rrr", isa=FULL["avx512"], threads=16,
                                                      **fields)
                       for fields in RECORD.default_configs("cpu", dtype, "rrr")]
            assert {c.target_params["isa"] for c in configs} == {amx, vector}
            ranked = rank(problem, configs, RECORD)
            assert ranked[0].config.target_params["isa"] == amx, [(e.config.name, e.value) for e in ranked]


@pytest.mark.parametrize("isa", list(cpu_isa.ISAS))
def test_register_budget_and_vector_width_follow_the_isa(isa):
    spec = cpu_isa.ISAS[isa]
    mm, mn = spec.micro_tile
    assert spec.micro_tile_problem(mm, mn) is None
    assert spec.registers_needed(mm, mn) <= spec.registers
    # one more row of accumulators than the registers hold is refused, with the count
    rows = (spec.registers - 1) // (mn // spec.lanes())
    assert "vector registers" in spec.micro_tile_problem(rows, mn)
    # a width that is not whole vectors is refused
    assert "not a multiple" in spec.micro_tile_problem(1, spec.lanes() + 2)


def test_matrix_and_tile_instructions_have_their_own_micro_tile():
    """smmla's accumulators are 2x2 blocks: 8x8 holds 16 of them, 4 A and 4 B
    registers; NEON's 12x8 would need 34 of its 32; rows come in pairs."""
    config = dispatcher.KernelConfig.create(dtype="int8", isa="neon+i8mm", tile_m=24, tile_n=48)
    assert (config.target_params["micro_m"], config.target_params["micro_n"]) == (8, 8)
    assert CPU.build_problem(config) is None
    i8mm = cpu_isa.get("neon+i8mm")
    assert "needs 34 vector registers" in i8mm.micro_tile_problem(12, 8)
    assert "odd" in i8mm.micro_tile_problem(3, 8)
    # a micro-tile smmla cannot compute is the base's (the spec is what a kernel may use)
    for micro in ((12, 8), (3, 8)):
        plain = config.replace(micro_m=micro[0], micro_n=micro[1])
        assert plain.target_params["isa"] == "neon" and "_cpu_neon_mt" in plain.name
        assert CPU.build_problem(plain) is None
    assert dispatcher.KernelConfig.create(dtype="fp32", isa="neon+i8mm").target_params["micro_m"] == 12
    # AMX's tiles: a 32x32 micro-tile and nothing else
    amx = dispatcher.KernelConfig.create(dtype="bf16", isa="avx512+amxbf16", tile_m=96, tile_n=128)
    assert (amx.target_params["micro_m"], amx.target_params["micro_n"]) == (32, 32)
    assert CPU.build_problem(amx) is None
    assert "computes 32x32 (2x2 tiles of 16x16)" in cpu_isa.get("avx512+amxbf16").micro_tile_problem(16, 32)
    # ... where no micro-kernel of the spec fits, the tile one's reason
    assert "computes 32x32 (2x2 tiles of 16x16)" in CPU.build_problem(amx.replace(micro_m=16))
    assert "not a multiple of the micro-tile 32x32" in CPU.build_problem(amx.replace(tile_m=120))
    assert "no micro-tile of ISA avx512+amxbf16 divides it" in CPU.build_problem(amx.replace(tile_n=8))


def test_avx2_has_16_registers_and_avx512_32():
    # AVX-512's default 12x32 micro-tile spills on AVX2; AVX2's fits both.
    avx2, avx512 = cpu_isa.ISAS["avx2"], cpu_isa.ISAS["avx512"]
    assert avx2.micro_tile_problem(12, 32) is not None
    assert avx512.micro_tile_problem(12, 32) is None
    assert avx512.micro_tile_problem(6, 16) is None


def test_flags_name_a_fixed_isa_never_the_build_machine():
    for spec in FULL.values():
        flags = cpu_isa.get(spec).march
        assert flags and not any(f.endswith("=native") for f in flags), (spec, flags)
    assert cpu_isa.get("avx512+bf16+vnni").march == ("-march=x86-64-v4", "-mtune=generic",
                                                     "-mavx512bf16", "-mavx512vnni")
    assert cpu_isa.get("neon+dotprod+i8mm").march == ("-march=armv8.2-a+dotprod+i8mm",)
    assert cpu_isa.get("neon").march == ("-march=armv8-a",)
    tc = CPU.toolchain()
    assert not any(f.endswith("=native") for f in tc.flags)
    assert set(cpu_isa.active().march) <= set(tc.flags)
    assert f"isa:{cpu_isa.active().name}" in tc.identity


def test_spec_syntax_and_its_errors():
    # + names exactly the extensions wanted, in any order; the name is canonical
    assert cpu_isa.get("avx512+vnni+bf16").name == "avx512+bf16+vnni"
    assert cpu_isa.get("avx512").extensions == ()
    assert cpu_isa.get(" neon+i8mm ").name == "neon+i8mm"
    for text, message in [("sse9", "unknown CPU ISA 'sse9'; choose one of avx512, avx2"),
                          ("avx2+bf16", "ISA avx2 has no extension 'bf16'; its extensions: vnni"),
                          ("generic+vnni", "ISA generic has no extension 'vnni'; its extensions: none"),
                          ("avx512+bf16-vnni", "mixes \\+ and -"),
                          ("avx512++bf16", "is not BASE, BASE\\+EXT"),
                          ("avx512 bf16", "is not BASE")]:
        with pytest.raises(errors.ConfigError, match=message):
            cpu_isa.get(text)
    # - removes extensions from those this machine has: only for a base it runs
    best = cpu_isa.best(cpu_isa.supported()[0])
    for ext in best.extensions:
        without = cpu_isa.get(f"{best.isa.name}-{ext.name}")
        assert ext not in without.extensions and len(without.extensions) == len(best.extensions) - 1
    foreign = next(i for i in cpu_isa.ISAS.values() if i not in cpu_isa.supported())
    some = foreign.extensions[0].name if foreign.extensions else "x"
    with pytest.raises(errors.ConfigError, match=f"removes extensions from those this machine has, but"):
        cpu_isa.get(f"{foreign.name}-{some}")


def test_a_kernel_names_only_the_extensions_its_dtype_uses():
    spec = cpu_isa.get("avx512+bf16+vnni+fp16")
    uses = {dtype: spec.for_dtype(dtype).name for dtype in dtypes.INPUT_TOKENS}
    assert uses == {"fp32": "avx512", "fp16": "avx512", "bf16": "avx512+bf16", "int8": "avx512+vnni",
                    **{t: "avx512+bf16" for t in dtypes.INPUT_TOKENS if t.startswith("fp8")}}
    assert spec.micro_kernel("int8").cpp == "dcpu::DotU8S8"
    amx = cpu_isa.get(FULL["avx512"])  # AMX before the vector dot products
    assert [amx.for_dtype(t).name for t in ("bf16", "fp8_e5m2", "int8", "fp32")] == \
        ["avx512+amxbf16", "avx512+amxbf16", "avx512+amxint8", "avx512"]
    assert cpu_isa.get("avx512").micro_kernel("int8").cpp == "dcpu::MaddI16"
    assert cpu_isa.get(FULL["avx2"]).for_dtype("int8").name == "avx2+vnni"
    assert cpu_isa.get(FULL["neon"]).for_dtype("int8").name == "neon+i8mm"  # smmla before sdot
    assert cpu_isa.get("neon+dotprod+bf16").for_dtype("int8").name == "neon+dotprod"
    assert cpu_isa.get("neon+i8mm").for_dtype("fp32").name == "neon"
    # a config holds the reduced spec, so equal binaries have one name
    for dtype, expected in [("fp32", "avx512"), ("bf16", "avx512+bf16"), ("int8", "avx512+vnni")]:
        config = dispatcher.KernelConfig.create(dtype=dtype, tile_m=24, tile_n=64, isa="avx512+bf16+vnni")
        assert config.target_params["isa"] == expected
        assert f"_cpu_{expected}_mt12x32_" in config.name
    with pytest.raises(errors.ConfigError, match="'isa' = 'avx2\\+bf16' is invalid: ISA avx2 has no"):
        dispatcher.KernelConfig.create(isa="avx2+bf16")


@pytest.fixture
def machine(monkeypatch):
    """Pretend this machine's /proc/cpuinfo reports the flags given to the
    returned function (x86-64); the ISA caches are cleared around it."""
    def fake(flags):
        monkeypatch.setattr(cpu_isa, "cpu_flags", lambda: frozenset(flags))
        monkeypatch.setattr(cpu_isa, "host_machine", lambda: "x86_64")
        cpu_isa._active.cache_clear()
        cpu_isa.get.cache_clear()
    yield fake
    cpu_isa._active.cache_clear()
    cpu_isa.get.cache_clear()


AVX512_FLAGS = cpu_isa.ISAS["avx512"].needs | cpu_isa.ISAS["avx2"].needs


def test_env_turns_each_extension_off_and_on(machine, monkeypatch):
    machine(AVX512_FLAGS | {"avx512_bf16", "avx512_vnni"})
    monkeypatch.delenv(cpu_isa.ENV, raising=False)
    assert cpu_isa.active().name == "avx512+bf16+vnni"        # the default: everything it has
    assert CPU.arch_id() == "cpu-avx512+bf16+vnni"            # the tuning key
    for env, expected in [("avx512-bf16", "avx512+vnni"), ("avx512-vnni-bf16", "avx512"),
                          ("avx512+bf16", "avx512+bf16"), ("avx512", "avx512"), ("avx2", "avx2")]:
        monkeypatch.setenv(cpu_isa.ENV, env)
        assert cpu_isa.active().name == expected
        assert CPU.arch_id() == f"cpu-{expected}"
    monkeypatch.setenv(cpu_isa.ENV, "avx512+fp16")
    with pytest.raises(errors.ConfigError, match=r"DISPATCHER_CPU_ISA=avx512\+fp16: this CPU lacks "
                                                 r"avx512_fp16 \(AVX512-FP16\), which extension fp16 of "
                                                 r"ISA avx512 needs; this machine runs avx512\+bf16\+vnni, "
                                                 r"avx2, generic"):
        cpu_isa.active()
    monkeypatch.setenv(cpu_isa.ENV, "avx2+vnni")
    with pytest.raises(errors.ConfigError, match=r"lacks avx_vnni \(AVX-VNNI\)"):
        cpu_isa.active()
    # a config of an extension the machine lacks is refused before building, naming it
    config = dispatcher.KernelConfig.create(dtype="int8", isa="avx2+vnni", tile_m=24, tile_n=64)
    assert "avx_vnni (AVX-VNNI)" in CPU.check(config)


def test_ci_reruns_parity_with_each_extension_off(machine):
    """The settings .ci/run and benchmarks/cpu_isa_check.sh rerun the parity
    tests under: each used extension of the best base off, each other base
    with and without its extensions (fp16 changes no kernel: not rerun)."""
    machine(AVX512_FLAGS | {"avx512_bf16", "avx512_vnni", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16",
                            "amx_int8"})  # the GPU host's Sapphire Rapids
    assert cpu_isa.active().name == "avx512+bf16+vnni+fp16+amxbf16+amxint8"
    assert cpu_isa.parity_settings() == ["avx512-bf16", "avx512-vnni", "avx512-amxbf16", "avx512-amxint8",
                                         "avx2+vnni", "avx2-vnni", "generic"]
    machine(cpu_isa.ISAS["avx2"].needs)
    assert cpu_isa.parity_settings() == ["generic"]


def test_env_chooses_the_isa_and_refuses_what_this_machine_cannot_run(monkeypatch):
    runnable = cpu_isa.supported()
    assert runnable, "the suite runs on an x86-64 or aarch64 machine"
    monkeypatch.delenv(cpu_isa.ENV, raising=False)
    assert cpu_isa.active() == cpu_isa.best(runnable[0])
    for isa in runnable:
        monkeypatch.setenv(cpu_isa.ENV, isa.name)
        assert cpu_isa.active() == cpu_isa.Spec(isa)
        assert CPU.arch_id() == f"cpu-{isa.name}"
        assert dispatcher.KernelConfig.create().target_params["isa"] == isa.name
    monkeypatch.setenv(cpu_isa.ENV, "sse9")
    with pytest.raises(errors.ConfigError, match="'sse9' is not a CPU ISA: unknown CPU ISA 'sse9'; "
                                                 "choose one of avx512"):
        cpu_isa.active()
    foreign = next(i for i in cpu_isa.ISAS.values() if i not in runnable)
    monkeypatch.setenv(cpu_isa.ENV, foreign.name)
    with pytest.raises(errors.ConfigError, match=f"{foreign.name}: .*; this machine runs "
                                                 f"{re.escape(cpu_isa.runnable_specs()[0])}"):
        cpu_isa.active()
    # an extension of a base this machine runs, that it lacks
    lacking = [f"{isa.name}+{e.name}" for isa in runnable for e in isa.extensions
               if e not in cpu_isa.best(isa).extensions]
    for text in lacking:
        monkeypatch.setenv(cpu_isa.ENV, text)
        ext = cpu_isa.get(text).extensions[0]
        with pytest.raises(errors.ConfigError, match=f"lacks .*\\({ext.title}\\), which extension "
                                                     f"{ext.name} of ISA"):
            cpu_isa.active()


def test_a_config_of_an_isa_this_machine_cannot_run_is_refused_before_building():
    foreign = next(i for i in cpu_isa.ISAS.values() if i not in cpu_isa.supported())
    config = dispatcher.KernelConfig.create(tile_m=24, tile_n=64, isa=foreign.name)
    assert CPU.build_problem(config) is None  # valid for its ISA...
    with pytest.raises(errors.ConfigError, match=f"cannot build .*{foreign.name}"):
        Dispatcher(tuning=None).codegen(config)  # ...but not runnable here


def _cache_key(config):
    """The build-cache key of `config`, runnable here or not."""
    source = get_manager().hook.dispatcher_codegen(config=config, target=CPU)
    return Dispatcher(tuning=None).cache.key(source, CPU.toolchain(config))


def test_isa_and_extensions_are_in_the_kernel_name_and_the_cache_key():
    a, b = cpu_isa.supported()[0].name, "generic" if cpu_isa.host_machine() == "x86_64" else "neon"
    if a == b:
        pytest.skip("this machine runs one ISA only")
    ca = dispatcher.KernelConfig.create(tile_m=24, tile_n=64, isa=a)
    cb = dispatcher.KernelConfig.create(tile_m=24, tile_n=64, isa=b)
    assert f"_cpu_{a}_mt" in ca.name and f"_cpu_{b}_mt" in cb.name
    assert _cache_key(ca) != _cache_key(cb)
    # the same bf16 kernel with and without AVX512-BF16: two names, two keys
    plain, dot = (dispatcher.KernelConfig.create(dtype="bf16", tile_m=24, tile_n=64, isa=isa)
                  for isa in ("avx512", "avx512+bf16"))
    assert plain.name.replace("_avx512_", "_avx512+bf16_") == dot.name
    assert _cache_key(plain) != _cache_key(dot)


# Every dtype once in the fast suite, the variants in turn; the other eight
# cells are slow (CI's slow step runs them).
_GENERIC_FAST = {("regular", "fp32"), ("stream_k", "bf16"), ("grouped", "int8"), ("regular", "fp8_e4m3")}


@pytest.mark.parametrize("variant, dtype", [
    pytest.param(v, d, marks=() if (v, d) in _GENERIC_FAST else pytest.mark.slow)
    for d in ("fp32", "bf16", "int8", "fp8_e4m3") for v in ("regular", "stream_k", "grouped")])
def test_portable_generic_isa_computes_correctly(variant, dtype, rng):
    """The baseline ISA (SSE2 / NEON) on whatever machine runs the suite:
    every x86-64 or aarch64 machine can run it, so this is never skipped."""
    isa = cpu_isa.supported()[-1].name
    config = dict(tile_m=24, tile_n=64, tile_k=32, isa=isa)
    a = random_matrix(45, 70, dtype, "r", rng)
    b = random_matrix(70, 29, dtype, "c", rng)
    full = dispatcher.KernelConfig.create(variant=variant, dtype=dtype, layout="rcr", **config)
    if variant == "grouped":
        (out,) = dispatcher.grouped_gemm([a], [b], config=config)
    else:
        out = poison(np.empty((45, 29), dtypes.output_for(dtype).numpy))
        dispatcher.gemm(a, b, out=out, variant=variant, config=config, strict=True)
    assert max_rel(out, reference(a, b)) <= tolerance(full, 70)


# ---------------------------------------------------- selection fallbacks
class _Misfit:
    """A variant whose only default config builds on no ISA (a 25x50 tile:
    no micro-tile of whole vectors divides 50 columns)."""

    @hookimpl
    def dispatcher_register_variants(self):
        from regular_gemm.plugin import RECORD
        return [attrs.evolve(RECORD, name="misfit",
                             default_configs=lambda t, d, l: [dict(tile_m=25, tile_n=50, tile_k=32)])]


@pytest.fixture
def misfit(tmp_path):
    """A dispatcher whose plugins are the regular variant and `_Misfit`
    (installed as the process-wide manager: configs look their variant up there)."""
    from dispatcher import plugins
    import regular_gemm.plugin

    manager = PluginManager(entry_points=[])
    manager.register(regular_gemm.plugin, "regular_gemm")
    manager.register(_Misfit(), "misfit")
    old = plugins._MANAGER
    plugins.reset_manager(manager)
    try:
        yield Dispatcher(tuning=TuningDatabase(tmp_path / "tuning.sqlite"), manager=manager)
    finally:
        plugins.reset_manager(old)


PROBLEM = GemmProblem(64, 64, 64, "fp32", "fp32", "rcr", variant="misfit")


def test_no_kernel_error_lists_each_rejected_config_and_what_to_do(misfit):
    with pytest.raises(errors.PluginError) as info:
        misfit.select(PROBLEM)
    text = str(info.value)
    assert "gemm_fp32_fp32_rcr_25x50x32_cpu_" in text and "not a multiple of the micro-tile" in text
    assert "What to do" in text and "gemm-dispatcher sweep" in text


def test_selection_asks_the_tuning_database_before_giving_up(misfit):
    tuned = misfit.config_for(PROBLEM, dict(tile_m=24, tile_n=64, tile_k=32))
    assert misfit.tuning.record(PROBLEM, tuned, 1.0)
    assert misfit.select(PROBLEM) == tuned
