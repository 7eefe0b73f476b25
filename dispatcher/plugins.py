"""The plugin manager: entry-point loading, validation, listing.

Built-in variants register through the entry-point group
``dispatcher.plugins`` exactly as third-party ones do. A plugin that fails
to import is recorded with its error and the others keep working.

Environment:
  DISPATCHER_DISABLE_PLUGINS=a,b   skip these entry points
  DISPATCHER_TRACE_PLUGINS=1       print every hook call to stderr
"""

from __future__ import annotations

import os
import sys
import warnings
from importlib import metadata

import attrs
import pluggy

from . import defaults, environ, hookspecs
from .errors import PluginError


@attrs.frozen
class PluginInfo:
    name: str
    version: str
    source: str
    status: str          # loaded | failed | disabled
    error: str = ""
    variants: tuple = ()
    hooks: tuple = ()


class PluginManager:
    def __init__(self, entry_points=None):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.pm.register(defaults, name="dispatcher.defaults")
        self._infos: dict[str, PluginInfo] = {
            "dispatcher.defaults": PluginInfo("dispatcher.defaults", _version("gemm-dispatcher"),
                                              "core", "loaded")}
        # Bumped whenever the registered plugins change: a Dispatcher's bound
        # launches and selections are valid for one generation.
        self.generation = 0
        self.tracing = environ.flag("DISPATCHER_TRACE_PLUGINS")
        if self.tracing:
            self.pm.trace.root.setwriter(sys.stderr.write)
            self.pm.enable_tracing()
        self._load(entry_points)
        self._variants = self._collect_variants()

    @property
    def hook(self):
        return self.pm.hook

    # -------------------------------------------------------------- loading
    def _load(self, entry_points):
        disabled = {s.strip() for s in os.environ.get("DISPATCHER_DISABLE_PLUGINS", "").split(",")
                    if s.strip()}
        if entry_points is None:
            entry_points = metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP)
        entry_points = sorted(entry_points, key=lambda e: e.name)
        _warn_unknown_disabled(disabled, [ep.name for ep in entry_points])
        for ep in entry_points:
            dist = getattr(ep, "dist", None)
            version = dist.version if dist else "?"
            source = f"{dist.name if dist else '?'}: {ep.value}"
            if ep.name in disabled:
                self._infos[ep.name] = PluginInfo(ep.name, version, source, "disabled")
                continue
            try:
                plugin = ep.load()
                self.pm.register(plugin, name=ep.name)
            except Exception as e:  # a broken plugin must not take the others down
                self._infos[ep.name] = PluginInfo(ep.name, version, source, "failed",
                                                  f"{type(e).__name__}: {e}")
                continue
            self._infos[ep.name] = PluginInfo(ep.name, version, source, "loaded")

    def register(self, plugin, name: str):
        """Register an in-process plugin object (tests, notebooks)."""
        self.pm.register(plugin, name=name)
        self._infos[name] = PluginInfo(name, "-", "in-process", "loaded")
        self._variants = self._collect_variants()
        self.generation += 1
        _changed()

    def unregister(self, name: str):
        """Unregister the plugin registered as `name`."""
        self.pm.unregister(name=name)
        self._infos.pop(name, None)
        self._variants = self._collect_variants()
        self.generation += 1
        _changed()

    def launcher(self, variant: str, library, problem, operands, options):
        """(the LaunchResult, the hook implementation that gave it, or None
        when launches must keep going through the hook chain): the chain of
        `dispatcher_launch` run by hand, as pluggy runs a firstresult hook,
        so the implementation that answers for `variant` is known and can be
        called directly next time. A wrapper (which must see every launch)
        or tracing keeps the chain."""
        caller = self.pm.hook.dispatcher_launch
        impls = caller.get_hookimpls()
        if self.tracing or any(i.hookwrapper or i.wrapper for i in impls):
            return caller(library=library, problem=problem, operands=operands, options=options), None
        arguments = dict(library=library, problem=problem, operands=operands, options=options)
        for impl in reversed(impls):  # pluggy calls the last registered first
            call = _with_its_arguments(impl)
            result = call(**arguments)
            if result is not None:
                return result, call
        return None, None

    def _collect_variants(self) -> dict:
        providers: dict[str, list] = {}
        for impl in self.pm.hook.dispatcher_register_variants.get_hookimpls():
            for record in impl.function() or ():
                providers.setdefault(record.name, []).append(
                    attrs.evolve(record, provider=impl.plugin_name))
        conflicts = {n: recs for n, recs in providers.items() if len(recs) > 1}
        if conflicts:
            lines = [f"variant {n!r} is provided by " + " and ".join(r.provider for r in recs)
                     for n, recs in sorted(conflicts.items())]
            raise PluginError("conflicting variant providers: " + "; ".join(lines)
                              + " (disable one with DISPATCHER_DISABLE_PLUGINS)")
        return {n: recs[0] for n, recs in providers.items()}

    # ------------------------------------------------------------ queries
    def variant(self, name: str):
        try:
            return self._variants[name]
        except KeyError:
            failed = [i for i in self._infos.values() if i.status != "loaded"]
            hint = "".join(f"; plugin {i.name} is {i.status}{': ' + i.error if i.error else ''}"
                           for i in failed)
            raise PluginError(f"no plugin provides variant {name!r}; known: "
                              f"{', '.join(sorted(self._variants)) or '(none)'}{hint}") from None

    def variants(self) -> dict:
        return dict(self._variants)

    def plugins(self) -> list[PluginInfo]:
        out = []
        for name, info in sorted(self._infos.items()):
            plugin = self.pm.get_plugin(name)
            hooks = ()
            if plugin is not None:
                hooks = tuple(sorted(h.name for h in self.pm.get_hookcallers(plugin) or ()))
            variants = tuple(sorted(n for n, r in self._variants.items() if r.provider == name))
            out.append(attrs.evolve(info, hooks=hooks, variants=variants))
        return out


def _with_its_arguments(impl):
    """`impl` callable with every argument of the hook spec: an
    implementation may declare only some of them (pluggy passes it those)."""
    names = tuple(impl.argnames)
    call = lambda **arguments: impl.function(**{name: arguments[name] for name in names})
    # entry points a plan may call itself (plugin_api.launches_gemm, plugins/grouped_gemm)
    call.direct_gemm = getattr(impl.function, "direct_gemm", None)
    call.direct_grouped_mm = getattr(impl.function, "direct_grouped_mm", None)
    return call


def _warn_unknown_disabled(disabled: set, installed: list):
    """A misspelt DISPATCHER_DISABLE_PLUGINS name would silently disable nothing."""
    unknown = sorted(disabled - set(installed))
    if unknown:
        warnings.warn(f"DISPATCHER_DISABLE_PLUGINS names no installed plugin: {', '.join(unknown)}; "
                      f"installed: {', '.join(installed) or '(none)'}", stacklevel=4)


def _version(dist_name: str) -> str:
    try:
        return metadata.version(dist_name)
    except metadata.PackageNotFoundError:
        return "0+unknown"


_MANAGER: PluginManager | None = None


def get_manager() -> PluginManager:
    """The process-wide manager, created on first use."""
    global _MANAGER
    if _MANAGER is None:
        _MANAGER = PluginManager()
    return _MANAGER


def reset_manager(manager: PluginManager | None = None) -> None:
    """Forget the process-wide manager (tests; after installing a plugin)."""
    global _MANAGER
    _MANAGER = manager
    _changed()


_LISTENERS: list = []


def on_change(listener) -> None:
    """Call `listener()` whenever registered plugins change (a registration,
    an unregistration, a new process-wide manager): for memos of what the
    hook chain chose that are kept outside Python's reach (native calls),
    where a per-call generation check would cost what they save."""
    _LISTENERS.append(listener)


def _changed():
    for listener in _LISTENERS:
        listener()
