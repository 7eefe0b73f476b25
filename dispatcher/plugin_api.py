"""What a variant plugin is written against: the skeleton every plugin
shares, once (docs/writing-a-plugin.md).

    RECORD = VariantRecord(...)
    dispatcher_register_variants = registers(RECORD)
    dispatcher_codegen = renders(RECORD.name, Path(__file__).parent)
    dispatcher_launch = launches_gemm(RECORD.name)

or, for a hook of its own, `@for_variant(VARIANT)` on a function named
after the hook: it is a hook implementation that answers only for
`config.variant` / `problem.variant` == VARIANT and returns None otherwise
(so the next plugin is asked).
"""

from __future__ import annotations

import functools
import inspect

from . import targets
from .codegen import render
from .epilogue import BIAS
from .epilogue import OPTIONS as EPILOGUE_OPTIONS
from .epilogue import name_suffix as epilogue_suffix
from .epilogue import problem_options as epilogue_problem_options
from .hookspecs import hookimpl
from .kinds import Operand, Param, gemm_operands
from .library import LaunchResult, gemm_args
from .records import WORKERS, Option, VariantRecord
from .workspace import WORKSPACES

__all__ = ["BIAS", "EPILOGUE_OPTIONS", "LaunchResult", "Operand", "Option", "Param", "VariantRecord",
           "WORKERS", "configs_per_target", "epilogue_problem_options", "epilogue_suffix", "for_variant", "gemm_args",
           "gemm_operands", "hookimpl", "launches_gemm", "registers", "render", "renders"]

def for_variant(variant: str, **hookimpl_options):
    """Decorator: a hook implementation that answers for `variant` only,
    read from its `config` or `problem` argument."""
    def wrap(fn):
        names = list(inspect.signature(fn).parameters)
        subject = next((n for n in ("config", "problem") if n in names), None)
        if subject is None:
            raise TypeError(f"{fn.__name__} has no config or problem argument to tell its variant by")
        position = names.index(subject)

        @functools.wraps(fn)
        def hook(*args, **kwargs):
            given = kwargs[subject] if subject in kwargs else args[position]
            if given.variant != variant:
                return None
            return fn(*args, **kwargs)
        return hookimpl(**hookimpl_options)(hook)
    return wrap


def registers(*records):
    """The `dispatcher_register_variants` implementation of `records`."""
    @hookimpl
    def dispatcher_register_variants():
        return list(records)
    return dispatcher_register_variants


def renders(variant: str, plugin_dir, values=None):
    """The `dispatcher_codegen` implementation that renders the plugin's
    templates (`dispatcher.codegen.render`); values(config, target) -> a
    dict of extra template values."""
    @for_variant(variant)
    def dispatcher_codegen(config, target):
        return render(plugin_dir, config, target, **(values(config, target) if values else {}))
    return dispatcher_codegen


def launches_gemm(variant: str, registry: bool = False):
    """The `dispatcher_launch` implementation that calls the library's
    `dispatcher_run_gemm` (or its registry entry) with the argument block
    the core built (batch, strides, extra operands, parameters), passing
    the `workers` and `stream` launch options and the workspace the
    library's `dispatcher_workspace_size` asks for, if it exports one."""
    def entry_point(library):
        return library.registry[library.name] if registry else library.require("dispatcher_run_gemm")

    @for_variant(variant)
    def dispatcher_launch(library, problem, operands, options):
        stream = options.get("stream", 0)
        args = gemm_args(operands, workers=options.get("workers", 0), stream=stream)
        nbytes = WORKSPACES.attach(library, args, stream)  # a kernel that stages operands asks for one
        library.run_gemm(args, entry_point(library))
        return LaunchResult(library.name, workspace_bytes=nbytes)
    # A plan that binds this launch may call the entry point itself with the
    # same argument block and workspace (`dispatcher.plans`): it does nothing else.
    dispatcher_launch.direct_gemm = entry_point
    return dispatcher_launch


def configs_per_target(**configs):
    """A `VariantRecord.default_configs` from tuples of config dicts per
    target name (`cpu=(...), cuda=(...)`); configs without `tile_k` are
    catalog entries their target completes for the dtype (`catalog`: cuda
    gives its tile_k, and leaves out fp8 tiles that spill)."""
    def default_configs(target, dtype, layout):
        given = configs.get(target, ())
        partial = [c for c in given if "tile_k" not in c]
        return [dict(c) for c in given if "tile_k" in c] + \
            (targets.get(target).catalog(partial, dtype) if partial else [])
    return default_configs
