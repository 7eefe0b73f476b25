"""Generated sources, built libraries and the content-addressed build cache.

Key: every generated file, the sorted flags, the compiler's identity and
version (which carries the target arch / ISA) and the package version. An
entry is built in a private temporary directory and published by one
`rename` under a per-key file lock, so concurrent builds of one config both
succeed and a killed build leaves nothing half-written. Each entry stores
the SHA-256 of its library, checked on every load.

The cache lives in `$DISPATCHER_CACHE_DIR`, else `$XDG_CACHE_HOME/gemm-dispatcher`
(`~/.cache/gemm-dispatcher`), created with mode 0700.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import attrs
from filelock import FileLock

from .errors import CacheError


@attrs.frozen
class GeneratedSource:
    """What `dispatcher_codegen` returns: files to compile, the main one first."""

    config: object                       # KernelConfig
    files: tuple                         # ((filename, text), ...)
    flags: tuple = ()                    # extra compiler flags of the variant

    @property
    def name(self) -> str:
        return self.config.name


@attrs.frozen
class BuiltLibrary:
    """What `dispatcher_build` returns: a library on disk and its metadata."""

    name: str
    path: Path
    key: str
    metadata: dict = attrs.field(eq=False, factory=dict)


def default_cache_dir() -> Path:
    if os.environ.get("DISPATCHER_CACHE_DIR"):
        return Path(os.environ["DISPATCHER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gemm-dispatcher"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _package_version() -> str:
    from .plugins import _version
    return _version("gemm-dispatcher")


class BuildCache:
    def __init__(self, root=None):
        self.root = Path(root) if root else default_cache_dir()
        for sub in ("", "kernels", "tmp", "locks"):
            (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    def key(self, source: GeneratedSource, toolchain) -> str:
        blob = json.dumps({
            "files": list(source.files),
            "flags": sorted(list(toolchain.cache_flags) + list(source.flags)),
            "compiler": toolchain.identity,
            "package": _package_version(),
        }, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def entry_dir(self, key: str) -> Path:
        return self.root / "kernels" / key

    def lookup(self, key: str):
        """The entry's BuiltLibrary, None if absent; CacheError if corrupt."""
        entry = self.entry_dir(key)
        meta_path = entry / "meta.json"
        if not entry.exists():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            lib = entry / meta["library"]
            ok = lib.exists() and _sha256(lib) == meta["sha256"]
        except (OSError, ValueError, KeyError):
            ok = False
        if not ok:
            raise CacheError(f"build-cache entry {entry} is corrupt (its library is missing or "
                             "its hash does not match); delete it or run "
                             "`gemm-dispatcher kernels --prune`")
        return BuiltLibrary(meta["name"], lib, key, meta)

    def build(self, source: GeneratedSource, toolchain) -> BuiltLibrary:
        """The cached library for `source`, compiling only if absent."""
        key = self.key(source, toolchain)
        found = self._lookup_or_quarantine(key)
        if found:
            return found
        with FileLock(str(self.root / "locks" / f"{key}.lock")):
            found = self._lookup_or_quarantine(key)  # another process may have won
            if found:
                return found
            staging = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=self.root / "tmp"))
            try:
                for filename, text in source.files:
                    (staging / filename).write_text(text)
                lib_name = f"lib{source.name}.so"
                started = time.perf_counter()
                toolchain.compile(staging / source.files[0][0], staging / lib_name, source.flags)
                meta = {
                    "name": source.name,
                    "library": lib_name,
                    "sha256": _sha256(staging / lib_name),
                    "config": source.config.to_dict(),
                    "compiler": toolchain.identity,
                    "flags": list(toolchain.flags) + list(source.flags),
                    "build_seconds": round(time.perf_counter() - started, 3),
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                }
                (staging / "meta.json").write_text(json.dumps(meta, indent=1))
                os.rename(staging, self.entry_dir(key))
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return self.lookup(key)

    def _lookup_or_quarantine(self, key):
        try:
            return self.lookup(key)
        except CacheError as e:
            entry = self.entry_dir(key)
            aside = self.root / "tmp" / f"{key}.corrupt.{os.getpid()}.{time.time_ns()}"
            try:
                os.rename(entry, aside)
            except FileNotFoundError:
                pass  # another process already moved it
            warnings.warn(f"{e}; moved aside to {aside} and rebuilding", stacklevel=3)
            return None

    def entries(self) -> list[dict]:
        """Metadata of every entry, with a `status` of ok or corrupt."""
        out = []
        for entry in sorted((self.root / "kernels").iterdir()):
            try:
                lib = self.lookup(entry.name)
                out.append({**lib.metadata, "key": entry.name, "path": str(lib.path), "status": "ok"})
            except CacheError as e:
                out.append({"key": entry.name, "path": str(entry), "status": "corrupt",
                            "error": str(e)})
        return out

    def prune(self) -> int:
        """Remove corrupt entries and leftovers of builds killed over an hour ago."""
        removed = 0
        for item in self.entries():
            if item["status"] == "corrupt":
                shutil.rmtree(item["path"], ignore_errors=True)
                removed += 1
        for leftover in (self.root / "tmp").iterdir():
            if time.time() - leftover.stat().st_mtime < 3600:
                continue  # may be a build in progress
            shutil.rmtree(leftover, ignore_errors=True)
            removed += 1
        return removed
