"""The CPU target's instruction sets: every default valid on every ISA, the
ISA chosen by the machine or $DISPATCHER_CPU_ISA, and kept apart in kernel
names, cache keys and tuning keys. Nothing here depends on which ISA this
machine happens to run."""

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


def test_every_default_config_of_every_variant_is_valid_on_every_isa():
    checked = 0
    for name, record in get_manager().variants().items():
        if "cpu" not in record.targets:
            continue
        for dtype in record.dtypes:
            for layout in record.layouts:
                for fields in record.default_configs("cpu", dtype, layout):
                    for isa in cpu_isa.ISAS:
                        config = dispatcher.KernelConfig.create(
                            variant=name, target="cpu", dtype=dtype, layout=layout, isa=isa, **fields)
                        assert config.target_params["micro_m"], config
                        assert CPU.build_problem(config) is None, (config.name, CPU.build_problem(config))
                        assert record.check(config) is None, (config.name, record.check(config))
                        checked += 1
    assert checked >= 3 * len(dtypes.INPUT_TOKENS) * len(LAYOUTS) * len(cpu_isa.ISAS)


@pytest.mark.parametrize("isa", list(cpu_isa.ISAS))
def test_register_budget_and_vector_width_follow_the_isa(isa):
    spec = cpu_isa.get(isa)
    mm, mn = spec.micro_tile
    assert spec.micro_tile_problem(mm, mn) is None
    assert spec.registers_needed(mm, mn) <= spec.registers
    # one more row of accumulators than the registers hold is refused, with the count
    rows = (spec.registers - 1) // (mn // spec.lanes())
    assert "vector registers" in spec.micro_tile_problem(rows, mn)
    # a width that is not whole vectors is refused
    assert "not a multiple" in spec.micro_tile_problem(1, spec.lanes() + 2)


def test_avx2_has_16_registers_and_avx512_32():
    # AVX-512's default 12x32 micro-tile spills on AVX2; AVX2's fits both.
    assert cpu_isa.get("avx2").micro_tile_problem(12, 32) is not None
    assert cpu_isa.get("avx512").micro_tile_problem(12, 32) is None
    assert cpu_isa.get("avx512").micro_tile_problem(6, 16) is None


def test_flags_name_a_fixed_isa_never_the_build_machine():
    for isa in cpu_isa.ISAS:
        flags = cpu_isa.get(isa).march
        assert flags and not any(f.endswith("=native") for f in flags), (isa, flags)
    tc = CPU.toolchain()
    assert not any(f.endswith("=native") for f in tc.flags)
    assert set(cpu_isa.active().march) <= set(tc.flags)
    assert f"isa:{cpu_isa.active().name}" in tc.identity


def test_env_chooses_the_isa_and_refuses_what_this_machine_cannot_run(monkeypatch):
    runnable = cpu_isa.supported()
    assert runnable, "the suite runs on an x86-64 or aarch64 machine"
    monkeypatch.delenv(cpu_isa.ENV, raising=False)
    assert cpu_isa.active() == runnable[0]
    for isa in runnable:
        monkeypatch.setenv(cpu_isa.ENV, isa.name)
        assert cpu_isa.active() == isa
        assert CPU.arch_id() == f"cpu-{isa.name}"
        assert dispatcher.KernelConfig.create().target_params["isa"] == isa.name
    monkeypatch.setenv(cpu_isa.ENV, "sse9")
    with pytest.raises(errors.ConfigError, match="'sse9' is not a CPU ISA; choose one of avx512"):
        cpu_isa.active()
    foreign = next(i for i in cpu_isa.ISAS.values() if i not in runnable)
    monkeypatch.setenv(cpu_isa.ENV, foreign.name)
    with pytest.raises(errors.ConfigError, match=f"{foreign.name}: .*; this machine runs "
                                                 f"{runnable[0].name}"):
        cpu_isa.active()


def test_a_config_of_an_isa_this_machine_cannot_run_is_refused_before_building():
    foreign = next(i for i in cpu_isa.ISAS.values() if i not in cpu_isa.supported())
    config = dispatcher.KernelConfig.create(tile_m=24, tile_n=64, isa=foreign.name)
    assert CPU.build_problem(config) is None  # valid for its ISA...
    with pytest.raises(errors.ConfigError, match=f"cannot build .*{foreign.name}"):
        Dispatcher(tuning=None).codegen(config)  # ...but not runnable here


def test_isa_is_in_the_kernel_name_and_the_cache_key():
    a, b = cpu_isa.supported()[0].name, "generic" if cpu_isa.host_machine() == "x86_64" else "neon"
    if a == b:
        pytest.skip("this machine runs one ISA only")
    ca = dispatcher.KernelConfig.create(tile_m=24, tile_n=64, isa=a)
    cb = dispatcher.KernelConfig.create(tile_m=24, tile_n=64, isa=b)
    assert f"_cpu_{a}_mt" in ca.name and f"_cpu_{b}_mt" in cb.name
    d = Dispatcher(tuning=None)
    keys = {d.cache.key(d.codegen(c), CPU.toolchain(c)) for c in (ca, cb)}
    assert len(keys) == 2


@pytest.mark.parametrize("variant", ["regular", "stream_k", "grouped"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8", "fp8_e4m3"])
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
    """A variant whose only default config builds on no ISA (a 25-row tile)."""

    @hookimpl
    def dispatcher_register_variants(self):
        from regular_gemm.plugin import RECORD
        return [attrs.evolve(RECORD, name="misfit",
                             default_configs=lambda t, d, l: [dict(tile_m=25, tile_n=64, tile_k=32)])]


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
    assert "gemm_fp32_fp32_rcr_25x64x32_cpu_" in text and "not a multiple of the micro-tile" in text
    assert "What to do" in text and "gemm-dispatcher sweep" in text


def test_selection_asks_the_tuning_database_before_giving_up(misfit):
    tuned = misfit.config_for(PROBLEM, dict(tile_m=24, tile_n=64, tile_k=32))
    assert misfit.tuning.record(PROBLEM, tuned, 1.0)
    assert misfit.select(PROBLEM) == tuned
