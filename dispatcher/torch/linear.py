"""`Linear`: `torch.nn.Linear` with its matmul on the dispatcher's kernels,
and `swap_linears`, which puts it into an existing model in place."""

from __future__ import annotations

import torch

from dispatcher.plugins import get_manager
from dispatcher.torch import native
from dispatcher.torch.eager import plain_eager
from dispatcher.torch.ops import config_key, gemm, linear


class Linear(torch.nn.Linear):
    """A drop-in `torch.nn.Linear`: the same parameters (`weight` of shape
    (out_features, in_features), optional `bias`), initialization and
    state_dict; y = x @ weight^T + bias runs `gemm_dispatcher::gemm` on
    `weight.t()`, a column-major view (no copy, forward or backward). Under
    `torch.autocast` it computes in the autocast dtype, as nn.Linear does.

    variant, config, autotune: as for `dispatcher.gemm`; the backward GEMMs
    run the same variant and autotune, but config applies to the forward
    product only (the backward ones, of other layouts, are selected: the
    tuning database first).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, *, variant: str = "regular", config=None, autotune: bool | None = None):
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.variant = variant
        self.config = config_key(config)
        self.autotune = autotune

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, **kwargs) -> "Linear":
        """A Linear sharing `linear`'s parameter objects (optimizers holding
        them keep working); kwargs: variant, config, autotune."""
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None,
                  device="meta", dtype=linear.weight.dtype, **kwargs)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.dim() == 2
        rows = x if flat else x.reshape(-1, self.in_features)
        fused = self.bias is not None and _fuses_bias(self.variant)
        # traced, under a mode or autocast: the operator, always
        plans = self._native_plans(fused) if plain_eager((rows, self.weight, self.bias)) else None
        y = plans.forward(rows, self.weight, self.bias) if plans is not None else None
        if y is None:
            if fused:  # the bias in the kernel's epilogue
                y = linear(rows, self.weight, self.bias, variant=self.variant, config=self.config,
                           autotune=self.autotune)
            else:
                y = gemm(rows, self.weight.t(), variant=self.variant, config=self.config, autotune=self.autotune)
                if self.bias is not None:  # in y's dtype: the autocast dtype under torch.autocast, as nn.Linear
                    y = y + self.bias.to(y.dtype)
            if plans is not None:  # (none for an unfused bias)
                plans.learn(rows, self.weight, self.bias)
        return y if flat else y.reshape(*x.shape[:-1], self.out_features)

    def _native_plans(self, fused: bool):
        """This layer's native plans (dispatcher/torch/native.py) for its
        current settings, made once the module is loaded; None while it is
        not, or where a call is more than one GEMM with its fused bias (an
        unfused bias) or names its kernel (a config)."""
        plans = self.__dict__.get("_native")
        settings = (self.variant, self.autotune, self.config, fused)
        if plans is not None and plans.settings == settings:
            return plans
        plans = self.__dict__["_native"] = None  # none yet, or made for settings since changed
        if self.config is None and (fused or self.bias is None):
            module = native.extension()
            if module is not None:
                plans = self.__dict__["_native"] = native.LinearPlans(module, self.variant, self.autotune, settings)
        return plans

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, variant={self.variant!r}, config={self.config!r}, "
                f"autotune={self.autotune!r}")


def _fuses_bias(variant: str) -> bool:
    """Whether `variant` declares a bias operand (a fused epilogue); asked
    of the plugin manager once per variant and plugin generation."""
    manager = get_manager()
    found = _FUSES.get(variant)
    if found is None or found[0] is not manager or found[1] != manager.generation:
        found = _FUSES[variant] = (manager, manager.generation,
                                   any(o.name == "bias" for o in manager.variant(variant).operands))
    return found[2]


_FUSES: dict = {}  # variant -> (manager, generation, whether it fuses a bias)


def swap_linears(model: torch.nn.Module, **kwargs) -> torch.nn.Module:
    """Replace every `torch.nn.Linear` of `model` (exactly that class:
    subclasses may have their own forward) by a `Linear` sharing its
    parameters, in place; returns `model` (a bare nn.Linear, which cannot
    be replaced in place, comes back as its replacement). kwargs: variant,
    config, autotune."""
    if type(model) is torch.nn.Linear:
        return Linear.from_linear(model, **kwargs)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, Linear.from_linear(child, **kwargs))
    return model
