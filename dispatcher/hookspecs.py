"""The hook contract between the core and variant plugins.

pluggy project name: ``dispatcher``; entry-point group: ``dispatcher.plugins``.

One `dispatcher.gemm` call walks the hooks in this order::

    dispatcher_register_variants()                      (once, at load)
    dispatcher_select_library(problem, candidates, tuning)   -> KernelConfig
    dispatcher_codegen(config, target)                  -> GeneratedSource
    dispatcher_build(source, target, cache)             -> BuiltLibrary
    dispatcher_launch(library, problem, operands, options)   -> LaunchResult

Rules every implementation follows:

* A variant plugin answers only for its own variant (``config.variant`` /
  ``problem.variant``) and returns ``None`` otherwise, so the next
  implementation is asked (``dispatcher.plugin_api.for_variant`` does it). Every hook except `dispatcher_register_variants`
  is ``firstresult``: the first non-``None`` answer wins.
* The core ships default implementations of `dispatcher_build` and
  `dispatcher_select_library` (``trylast``); a variant overrides them only
  when it needs to.
* Wrappers (``@hookimpl(wrapper=True)``) may observe or change any step:
  tracing, verification, caching.
"""

from __future__ import annotations

import pluggy

PROJECT = "dispatcher"
ENTRY_POINT_GROUP = "dispatcher.plugins"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def dispatcher_register_variants():
    """Declare the variants this plugin provides.

    :return: a list of :class:`dispatcher.records.VariantRecord` (name,
        problem kind, targets, dtypes, layouts, variant-block schema, name
        suffix, default configs, validity check).

    Not firstresult: the core merges every plugin's list and raises one
    :class:`PluginError` naming every provider of a duplicated variant name.
    """


@hookspec(firstresult=True)
def dispatcher_codegen(config, target):
    """Generate the native source of one kernel.

    :param config: a :class:`dispatcher.config.KernelConfig`.
    :param target: the target object (``dispatcher.targets.get(config.target)``);
        its ``prelude(config)`` gives the target part of the source.
    :return: a :class:`dispatcher.build.GeneratedSource`, or ``None`` if
        ``config.variant`` is not this plugin's.
    """


@hookspec(firstresult=True)
def dispatcher_build(source, target, cache):
    """Build a generated source into a shared library.

    :param source: the :class:`GeneratedSource` from `dispatcher_codegen`.
    :param target: the target object; its ``toolchain(source.config)`` compiles
        (the CPU target's flags depend on the config's ISA).
    :param cache: the :class:`dispatcher.build.BuildCache`; a build goes
        through ``cache.build(source, toolchain)`` so a second build of the
        same source compiles nothing.
    :return: a :class:`dispatcher.build.BuiltLibrary` (path, name, metadata).

    The core's default builds any source with its target's toolchain; a
    variant implements this hook only to add binding sources or flags.
    """


@hookspec(firstresult=True)
def dispatcher_select_library(problem, candidates, tuning, record):
    """Choose the kernel to run a problem: the ".so selection".

    :param problem: a :class:`GemmProblem`, :class:`GroupedGemmProblem` or
        :class:`dispatcher.kinds.KindProblem`.
    :param candidates: the :class:`KernelConfig` s the variant proposes for
        the problem's target, dtypes and layout (its default configs that can
        be built here); libraries are built on demand after selection.
    :param tuning: a :class:`dispatcher.tuning.TuningDatabase` or ``None``.
    :param record: the problem's variant (:class:`dispatcher.records.VariantRecord`),
        e.g. for its ``k_splits``, which the performance model is told.
    :return: one of ``candidates`` (or a config from the tuning database).

    Deterministic: the same inputs give the same answer. The tuning
    database's answer wins when it has one; a heuristic decides otherwise.
    """


@hookspec(firstresult=True)
def dispatcher_launch(library, problem, operands, options):
    """Run a problem on a loaded library.

    :param library: a :class:`dispatcher.library.Library` (the loaded .so).
    :param problem: the problem record.
    :param operands: the arrays and leading dimensions
        (:class:`dispatcher.problem.GemmOperands` or ``GroupedOperands``); for
        a declared problem kind (`dispatcher.kinds`) the argument block of one
        launch: batch count and strides, extra operands, parameters, and
        whether the core transposed the problem.
    :param options: a dict of launch options (e.g. ``workers``).
    :return: a :class:`dispatcher.library.LaunchResult`, or ``None`` if the
        library's variant is not this plugin's.
    :raises UnsupportedProblem: the kernel returned status -2.
    :raises KernelError: the kernel returned status -1.

    The regular variant launches through the library's kernel registry table;
    grouped and stream-K call their kernel's entry point directly.
    """
