"""Rendering a variant's template for a target: the shared mechanics of
`dispatcher_codegen`.

A variant plugin keeps one template per target in its `templates/` folder
(`cpu.cpp`, `cuda.cu`); `${prelude}` is replaced by the target's prelude
(types, tiles, `KERNEL_NAME`) and any other `${key}` by the plugin's values.
"""

from __future__ import annotations

import string
from functools import lru_cache
from pathlib import Path

from .build import GeneratedSource
from .errors import ConfigError


@lru_cache(maxsize=None)
def _template(path: Path) -> string.Template:
    return string.Template(path.read_text())


def render(plugin_dir, config, target, flags=(), **values) -> GeneratedSource:
    folder = Path(plugin_dir) / "templates"
    matches = sorted(folder.glob(f"{target.name}.*"))
    if not matches:
        raise ConfigError(f"variant {config.variant!r} has no template for target {target.name!r}")
    path = matches[0]
    text = _template(path).substitute(prelude=target.prelude(config), **values)
    return GeneratedSource(config, ((f"{config.name}{path.suffix}", text),), tuple(flags))
