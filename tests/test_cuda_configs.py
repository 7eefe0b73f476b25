"""CUDA configs without a compiler: what is refused before nvcc runs, and
what the regular variant's split-K and hybrid configs are named and
generate (codegen needs neither nvcc nor a GPU, so the fast suite runs these
on every machine; tests/test_cuda_build.py compiles instances)."""

import pytest

import dispatcher
from dispatcher.api import Dispatcher


def test_invalid_cuda_configs_are_rejected_before_nvcc():
    d = Dispatcher()
    with pytest.raises(dispatcher.ConfigError, match="pingpong schedule takes tile_m"):
        d.codegen(dispatcher.KernelConfig.create(target="cuda", dtype="bf16", tile_m=256, tile_n=128,
                                                 tile_k=64, schedule="pingpong"))
    with pytest.raises(dispatcher.ConfigError, match="fp8 tensor-core MMA needs K-major"):
        d.codegen(dispatcher.KernelConfig.create(target="cuda", dtype="fp8_e4m3", layout="rrr",
                                                 tile_m=128, tile_n=128, tile_k=128))
    with pytest.raises(dispatcher.ConfigError, match="cooperative schedule only"):
        d.codegen(dispatcher.KernelConfig.create(variant="stream_k", target="cuda", dtype="bf16",
                                                 tile_m=128, tile_n=128, tile_k=64, schedule="pingpong"))
    with pytest.raises(dispatcher.ConfigError, match="split-K runs on CUTLASS's stream-K scheduler"):
        d.codegen(dispatcher.KernelConfig.create(target="cuda", dtype="bf16", tile_m=128, tile_n=128,
                                                 tile_k=64, schedule="pingpong", splits=3))


def test_regular_hybrid_is_named_cooperative_and_cuda_only():
    hybrid = dispatcher.KernelConfig.create(target="cuda", dtype="bf16", tile_m=128, tile_n=256, tile_k=64,
                                            cluster_m=2, cluster_n=1, decomposition="hybrid")
    assert hybrid.name.endswith("_c2x1_coop_sauto_hybrid")
    assert "dcuda::Decomposition<1, true>" in Dispatcher().codegen(hybrid).files[0][1]
    for bad, match in [(dict(target="cuda", schedule="pingpong", tile_m=64), "cooperative schedule only"),
                       (dict(target="cuda", splits=2), "takes decomposition=data_parallel"),
                       (dict(target="cpu", dtype="fp32", tile_m=48, tile_n=64), "cuda schedule")]:
        fields = {**dict(dtype="bf16", tile_m=128, tile_n=128, tile_k=64, decomposition="hybrid"), **bad}
        with pytest.raises(dispatcher.ConfigError, match=match):
            Dispatcher().codegen(dispatcher.KernelConfig.create(**fields))


def test_regular_split_k_is_named_and_cuda_only():
    split = dispatcher.KernelConfig.create(target="cuda", dtype="bf16", tile_m=128, tile_n=128, tile_k=64,
                                           cluster_m=1, cluster_n=2, splits=8, bias="col", activation="gelu")
    assert split.name.endswith("_biascol_gelu_splitk8")
    plain = dispatcher.KernelConfig.create(target="cuda", dtype="bf16", tile_m=128, tile_n=128, tile_k=64)
    assert "splitk" not in plain.name  # splits=1 keeps the names (and tuning entries) kernels had
    source = Dispatcher().codegen(split).files[0][1]
    assert "dcuda::Decomposition<8, false>" in source
    with pytest.raises(dispatcher.ConfigError, match="split-K is a cuda schedule"):
        Dispatcher().codegen(dispatcher.KernelConfig.create(target="cpu", dtype="fp32", tile_m=48, tile_n=64,
                                                            tile_k=64, splits=2))


def test_regular_tree_split_k_runs_any_schedule_and_needs_splits():
    tree = dispatcher.KernelConfig.create(target="cuda", dtype="bf16", tile_m=64, tile_n=64, tile_k=64,
                                          cluster_m=1, cluster_n=1, schedule="pingpong", splits=4,
                                          reduction="tree", bias="row", activation="silu")
    assert tree.name.endswith("_pp_sauto_biasrow_silu_splitk4_tree")
    source = Dispatcher().codegen(tree).files[0][1]
    assert "#define DCUDA_TREE_SPLIT_K 1" in source and "dcuda::tree::SplitK<T, 4, Epi>" in source
    linear = dispatcher.KernelConfig.create(target="cuda", dtype="bf16", tile_m=128, tile_n=128, tile_k=64,
                                            splits=4)
    assert "#define DCUDA_TREE_SPLIT_K 0" in Dispatcher().codegen(linear).files[0][1]
    for bad, match in [(dict(splits=1), "it takes splits > 1"),
                       (dict(schedule="gemv", tile_m=4, tile_n=4), "does not apply to the gemv schedule"),
                       (dict(decomposition="hybrid"), "takes decomposition=data_parallel"),
                       (dict(target="cpu", dtype="fp32", tile_m=48), "split-K is a cuda schedule")]:
        fields = {**dict(target="cuda", dtype="bf16", tile_m=64, tile_n=64, tile_k=64, schedule="pingpong",
                         splits=4, reduction="tree"), **bad}
        if fields["target"] == "cpu":
            fields.pop("schedule")
        with pytest.raises(dispatcher.ConfigError, match=match):
            Dispatcher().codegen(dispatcher.KernelConfig.create(**fields))


def test_the_gpu_sessions_catalog_sweeps_expand_for_the_layouts_they_tune():
    """Every catalog sweep file `benchmarks/gpu_session.sh tune` can name
    expands for bf16 rcr, rrr and crr on cuda (no GPU needed: expansion
    only); the fused one's kernels all carry its epilogue."""
    import pathlib

    from dispatcher.tile_engine import sweep
    sweeps = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "sweeps"
    files = sorted(sweeps.glob("catalog*.json"))
    assert any(f.name == "catalog_bias_gelu.json" for f in files)
    for f in files:
        for layout in ("rcr", "rrr", "crr"):
            plan = sweep.expand(str(f), variant="regular", target="cuda", dtype="bf16", layout=layout)
            assert plan.configs, (f.name, layout, plan.reasons())
            if f.name == "catalog_bias_gelu.json":
                assert plan.fixed == (("activation", "gelu"), ("bias", "col"))
                assert all("_biascol_gelu" in c.name for c in plan.configs)
