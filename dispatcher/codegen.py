"""Rendering a variant's templates for a target: the shared mechanics of
`dispatcher_codegen`.

A variant plugin keeps its templates in its `templates/` folder, per target:
  `cpu.cpp`, `cuda.cu`             one template per target; or
  `cpu-<name>.cpp`                 several, one picked by `template=<name>`; or
  `cpu/main.cpp` + other files     a folder: main is compiled, the others
                                   (headers it includes) are written beside it.
`${prelude}` is replaced by the target's prelude (types, tiles,
`KERNEL_NAME`), `${<option>}` by the config's variant-block values (e.g.
`${bias}`, `${activation}`) and any other `${key}` by the plugin's values.
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


def template_files(plugin_dir, config, target, template: str | None = None) -> list:
    """The template files of `config` on `target`, the one to compile first."""
    folder = Path(plugin_dir) / "templates"
    if template is None and (folder / target.name).is_dir():
        files = sorted((folder / target.name).iterdir(), key=lambda p: (p.stem != "main", p.name))
        if not files or files[0].stem != "main":
            raise ConfigError(f"variant {config.variant!r}: template folder {folder / target.name} "
                              "has no main file")
        return files
    stem = target.name if template is None else f"{target.name}-{template}"
    matches = sorted(folder.glob(f"{stem}.*"))
    if len(matches) != 1:
        raise ConfigError(f"variant {config.variant!r} has {'no' if not matches else 'several'} "
                          f"template(s) {stem}.* for target {target.name!r} in {folder}")
    return matches


def render(plugin_dir, config, target, flags=(), template: str | None = None,
           **values) -> GeneratedSource:
    files = template_files(plugin_dir, config, target, template)
    values = {**config.variant_params, **values, "prelude": target.prelude(config)}
    rendered = tuple((f"{config.name}{path.suffix}" if i == 0 else path.name,
                      _template(path).substitute(values)) for i, path in enumerate(files))
    return GeneratedSource(config, rendered, tuple(flags))
