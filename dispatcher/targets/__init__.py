"""Targets: where kernels run and how they are built.

A target knows its toolchain, its flags, its memory and the `target` block
of `KernelConfig`; it knows no variant. `get(name)` returns the one
instance of each.
"""

from __future__ import annotations

from ..errors import ConfigError

_TARGETS = {}


def register(target):
    _TARGETS[target.name] = target
    return target


def get(name: str):
    if name not in _TARGETS:
        _load_builtin()
    try:
        return _TARGETS[name]
    except KeyError:
        raise ConfigError(f"unknown target {name!r}; known: {', '.join(sorted(names()))}") from None


def for_arrays(*arrays) -> str:
    """`target="auto"`: the target whose memory holds these arrays (cpu for
    none, e.g. a grouped call with no groups)."""
    _load_builtin()
    if arrays:
        for name, target in _TARGETS.items():
            if name != "cpu" and all(map(target.owns, arrays)):
                return name
    return "cpu"


def names():
    _load_builtin()
    return tuple(_TARGETS)


_BUILTIN_LOADED = []  # [True] once `_load_builtin` ran: a per-call import statement costs a microsecond


def _load_builtin():
    if _BUILTIN_LOADED:
        return
    from . import cpu  # noqa: F401  (registers itself)
    try:
        from . import cuda  # noqa: F401
    except ImportError:
        pass
    _BUILTIN_LOADED.append(True)
