"""Generated sources, built libraries and the content-addressed build cache.

Key: every generated file, the sorted flags, the compiler's identity and
version (which carries the target arch / ISA) and the package version. An
entry is built in a private temporary directory and published by one
`rename` under a per-key file lock, so concurrent builds of one config both
succeed and a killed build leaves nothing half-written. Each entry stores
the SHA-256 of its library, checked on every load, and whether the library
embeds its kernel name (the `KERNEL_NAME` string every template exports):
then a library swapped for another kernel's, even with its hash
recomputed, is a corrupt entry too. A corrupt entry is moved aside to
`tmp/` and rebuilt, by the process holding the entry's lock, which checks
it again first (so an entry another process has just rebuilt is never
moved); only the newest few moved-aside copies are kept. `prune` takes the
same lock. The hash each library was last found to have is remembered per
process (`checked_sha256`): `Library` loads exactly those bytes. `install`
publishes an entry built on another host (its metadata and library bytes,
checked against the SHA-256 its builder recorded) the same way.

The cache lives in `$DISPATCHER_CACHE_DIR`, else `$XDG_CACHE_HOME/gemm-dispatcher`
(`~/.cache/gemm-dispatcher`). Folders it creates are mode 0700 (its
libraries are code that every process using the cache runs); a folder it
did not create keeps its mode. A cache folder this process cannot write
but that holds a `kernels/` folder (a shared, prebuilt cache) is read
only: its entries are found, and a kernel it lacks is built into the
per-user cache `$XDG_CACHE_HOME/gemm-dispatcher`, which then also holds
the tuning database.
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
from filelock import FileLock, Timeout

from .errors import CacheError

_FOLDERS = ("kernels", "tmp", "locks", "toolchains")
QUARANTINE_KEEP = 3  # moved-aside corrupt entries kept in tmp/ for a post-mortem
_WHAT_TO_DO = "set DISPATCHER_CACHE_DIR to a writable directory"


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


def user_cache_dir() -> Path:
    """The per-user cache: `$XDG_CACHE_HOME/gemm-dispatcher`, else
    `~/.cache/gemm-dispatcher`. Without a home directory there is no safe
    default (a relative `~` would put the cache under the working directory)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset or relative: the XDG spec says ignore it
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            raise CacheError("there is no home directory to hold the build cache; "
                             f"{_WHAT_TO_DO} (or XDG_CACHE_HOME)")
        base = os.path.join(home, ".cache")
    return Path(base) / "gemm-dispatcher"


def default_cache_dir() -> Path:
    if os.environ.get("DISPATCHER_CACHE_DIR"):
        return Path(os.environ["DISPATCHER_CACHE_DIR"])
    return user_cache_dir()


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK | os.X_OK)


def _make_writable_cache(root: Path) -> bool:
    """Create `root` and its folders where missing, mode 0700 (an existing
    folder keeps its mode: it may be shared), and say whether builds can
    write there. Nothing is created in a root this process cannot write."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _writable(root):
        return False
    for sub in _FOLDERS:
        (root / sub).mkdir(mode=0o700, exist_ok=True)
    return all(_writable(root / sub) for sub in _FOLDERS)


def _open(root: Path) -> bool:
    """True if `root` is a writable cache; False if it is read-only but holds
    prebuilt kernels to look up; CacheError (saying what to do) otherwise."""
    if root.exists() and not root.is_dir():
        raise CacheError(f"the build cache {root} is a file, not a directory; remove it or "
                         f"{_WHAT_TO_DO}")
    try:
        if _make_writable_cache(root):
            return True
    except OSError as e:
        raise CacheError(f"cannot create the build cache {root}: {e.strerror or e}; "
                         f"{_WHAT_TO_DO}") from None
    if os.access(root / "kernels", os.R_OK | os.X_OK):
        return False
    raise CacheError(f"the build cache {root} is read-only and holds no kernels/ folder it can read; "
                     f"{_WHAT_TO_DO}")


def _scan(path: Path, needle: bytes) -> tuple:
    """(SHA-256 of the file, whether it contains `needle`), in one read."""
    h, found, tail = hashlib.sha256(), False, b""
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            found = found or needle in tail + chunk
            tail = chunk[-len(needle):]
    return h.hexdigest(), found


def _embedded(name: str) -> bytes:
    """How a library holds its kernel name: the C string `dispatcher_kernel_name` returns."""
    return name.encode() + b"\0"


def _damage(entry: Path, meta: dict, name: str | None) -> str:
    """Why the entry `meta` describes is corrupt ("" if it is sound). `name`:
    the kernel the caller wants, when it knows."""
    if name is not None and meta["name"] != name:
        return f"it holds kernel {meta['name']!r}, not {name!r}"
    lib = entry / meta["library"]
    if not lib.exists():
        return "its library is missing"
    digest, embeds_name = _scan(lib, _embedded(meta["name"]))
    if digest != meta["sha256"]:
        return "its library's hash does not match"
    if meta.get("embeds_name") and not embeds_name:
        return f"its library does not hold kernel {meta['name']!r}: another kernel's library"
    return ""


# Library path -> the SHA-256 this process last found it to have in a sound entry.
_checked: dict = {}


def checked_sha256(path) -> str | None:
    """The SHA-256 that this process last checked the cache-entry library
    `path` against (None if it never did). `Library` loads a private copy
    of the file only if its bytes still have it: the bytes loaded are the
    bytes checked, even if the file changes in between."""
    return _checked.get(str(path))


def _read_entry(entry: Path, name: str | None = None):
    """The BuiltLibrary in `entry`, None if absent; CacheError if corrupt."""
    if not entry.exists():
        return None
    try:
        meta = json.loads((entry / "meta.json").read_text())
        why = _damage(entry, meta, name)
    except (OSError, ValueError, KeyError, TypeError) as e:
        why = f"its metadata is unreadable: {e}"
    if why:
        raise CacheError(f"build-cache entry {entry} is corrupt ({why}); delete it or run "
                         "`gemm-dispatcher kernels --prune`")
    _checked[str(entry / meta["library"])] = meta["sha256"]
    return BuiltLibrary(meta["name"], entry / meta["library"], entry.name, meta)


def _write_entry(staging: Path, meta: dict, image: bytes):
    """An entry's files, as `_compile_into` leaves them, from its parts."""
    (staging / meta["library"]).write_bytes(image)
    (staging / "meta.json").write_text(json.dumps(meta, indent=1))


def _skip(entry: Path, error: CacheError):
    """on_corrupt outside the entry's lock: treat the entry as absent."""


def _package_version() -> str:
    from .plugins import _version
    return _version("gemm-dispatcher")


class BuildCache:
    """`root`: the writable cache that builds go to. `shared`: a read-only
    prebuilt cache looked up after `root` (None unless the configured
    directory is read-only; `root` is then the per-user cache)."""

    def __init__(self, root=None):
        wanted = Path(root) if root else default_cache_dir()
        self.shared = None if _open(wanted) else wanted
        self.root = wanted if self.shared is None else self._private_for(wanted)

    @staticmethod
    def _private_for(shared: Path) -> Path:
        """The per-user cache that builds go to while `shared` is read-only."""
        private = user_cache_dir()
        if private.resolve() == shared.resolve() or not _open(private):
            raise CacheError(f"the build cache {shared} is read-only and there is no writable "
                             f"per-user cache to build into; {_WHAT_TO_DO} (a read-only one is "
                             "used as a shared prebuilt cache when XDG_CACHE_HOME is writable)")
        return private

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

    def _stores(self) -> list:
        """The kernels folders entries are looked up in, in order."""
        return [self.root / "kernels"] + ([self.shared / "kernels"] if self.shared else [])

    def lookup(self, key: str, name: str | None = None):
        """The entry's BuiltLibrary, None if absent; CacheError if corrupt.
        `name`: the kernel expected there, checked when given."""
        return self._find(key, name)

    def _find(self, key, name, on_corrupt=None):
        """lookup; with `on_corrupt(entry, error)`, a corrupt entry is handed
        to it and the search goes on instead of raising (`_skip`: as if absent)."""
        for kernels in self._stores():
            try:
                found = _read_entry(kernels / key, name)
            except CacheError as e:
                if on_corrupt is None:
                    raise
                on_corrupt(kernels / key, e)
                continue
            if found:
                return found
        return None

    def build(self, source: GeneratedSource, toolchain) -> BuiltLibrary:
        """The cached library for `source`, compiling only if absent."""
        key = self.key(source, toolchain)
        found = self._find(key, source.name, on_corrupt=_skip)
        if found:
            return found
        return self._publish(key, source.name,
                             lambda staging: self._compile_into(staging, source, toolchain, self.root / "toolchains"))

    def install(self, key: str, meta: dict, image: bytes) -> BuiltLibrary:
        """Publish a library built elsewhere (another host's cache entry: its
        `meta.json` and library bytes) under `key`, unless a sound entry is
        already there. CacheError if `image` does not have the SHA-256 that
        `meta` records, so bytes damaged in transit are never published."""
        library = meta.get("library")
        if not isinstance(library, str) or Path(library).name != library or library in ("", ".", ".."):
            raise CacheError(f"the library received for key {key} names no plain file ({library!r}): "
                             "not installed")
        if hashlib.sha256(image).hexdigest() != meta.get("sha256"):
            raise CacheError(f"the library received for kernel {meta.get('name')!r} (key {key}) does "
                             "not have the SHA-256 its builder recorded: not installed")
        found = self._find(key, meta["name"], on_corrupt=_skip)
        return found or self._publish(key, meta["name"], lambda staging: _write_entry(staging, meta, image))

    def _publish(self, key: str, name: str, fill) -> BuiltLibrary:
        """The entry `key`, made by `fill(staging folder)` and renamed into
        place under the entry's lock unless a sound one appeared meanwhile."""
        with self._lock(key):
            # checked again under the lock: another process may have rebuilt it
            # (a corrupt entry is moved aside only here, so never a sound one)
            found = self._find(key, name, on_corrupt=self._set_aside)
            if found:
                return found
            staging = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=self.root / "tmp"))
            try:
                fill(staging)
                os.rename(staging, self.entry_dir(key))
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return self.lookup(key, name)

    def _lock(self, key: str, timeout: float = -1) -> FileLock:
        """The per-key lock held while an entry is built, moved aside or pruned."""
        return FileLock(str(self.root / "locks" / f"{key}.lock"), timeout=timeout)

    @staticmethod
    def _compile_into(staging: Path, source: GeneratedSource, toolchain, shared_dir: Path):
        """Write, compile and describe (meta.json) one entry in `staging`;
        `shared_dir`: the toolchains' folder of what their builds share."""
        for filename, text in source.files:
            (staging / filename).write_text(text)
        lib_name = f"lib{source.name}.so"
        started = time.perf_counter()
        toolchain.compile(staging / source.files[0][0], staging / lib_name, source.flags, shared_dir=shared_dir)
        digest, embeds_name = _scan(staging / lib_name, _embedded(source.name))
        meta = {
            "name": source.name,
            "library": lib_name,
            "sha256": digest,
            "embeds_name": embeds_name,
            "config": source.config.to_dict(),
            "compiler": toolchain.identity,
            "flags": list(toolchain.flags) + list(source.flags),
            "build_seconds": round(time.perf_counter() - started, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        (staging / "meta.json").write_text(json.dumps(meta, indent=1))

    def _set_aside(self, entry: Path, error: CacheError):
        """Move a corrupt entry of this cache to tmp/ (keeping the newest few
        such copies), so the caller rebuilds it; a corrupt shared entry,
        which this process cannot move, is only skipped. The caller holds
        the entry's lock."""
        if entry.parent != self.root / "kernels":
            warnings.warn(f"{error}; it is in the read-only shared cache: building a private copy",
                          stacklevel=4)
            return
        aside = self.root / "tmp" / f"{entry.name}.corrupt.{time.time_ns()}.{os.getpid()}"
        try:
            os.rename(entry, aside)
        except FileNotFoundError:
            pass  # another process already moved it
        warnings.warn(f"{error}; moved aside to {aside} and rebuilding", stacklevel=4)
        self._prune_quarantine()

    def _quarantined(self) -> list:
        """Moved-aside corrupt entries in tmp/, newest first."""
        copies = (self.root / "tmp").glob("*.corrupt.*")
        return sorted(copies, key=lambda p: int(p.name.split(".")[2]), reverse=True)

    def _prune_quarantine(self):
        for old in self._quarantined()[QUARANTINE_KEEP:]:
            shutil.rmtree(old, ignore_errors=True)

    def entries(self) -> list[dict]:
        """Metadata of every entry, with a `status` of ok or corrupt; entries
        of the read-only shared cache are marked `shared`."""
        out = []
        for kernels in self._stores():
            shared = kernels != self.root / "kernels"
            for entry in sorted(kernels.iterdir()):
                try:
                    lib = _read_entry(entry)
                    if lib is None:
                        continue  # moved aside or pruned since the listing
                    item = {**lib.metadata, "key": entry.name, "path": str(lib.path), "status": "ok"}
                except CacheError as e:
                    item = {"key": entry.name, "path": str(entry), "status": "corrupt", "error": str(e)}
                out.append({**item, "shared": True} if shared else item)
        return out

    def prune(self) -> int:
        """Remove this cache's corrupt entries and leftovers of builds killed
        over an hour ago (the shared cache is read-only). An entry is checked
        again under its lock (one being rebuilt now is left to its builder)
        and moved into tmp/ before it is deleted, so no reader sees it half
        deleted; other processes may prune at the same time."""
        removed = 0
        for item in self.entries():
            if item["status"] == "corrupt" and not item.get("shared"):
                removed += self._remove_corrupt(Path(item["path"]))
        for leftover in (self.root / "tmp").iterdir():
            try:
                if time.time() - leftover.stat().st_mtime < 3600:
                    continue  # may be a build in progress
            except FileNotFoundError:
                continue  # removed meanwhile (a finished build, another prune)
            shutil.rmtree(leftover, ignore_errors=True)
            removed += 1
        return removed

    def _remove_corrupt(self, entry: Path) -> int:
        """Delete `entry` if it is (still) corrupt; 1 if this call removed it."""
        try:
            with self._lock(entry.name, timeout=0):
                try:
                    _read_entry(entry)
                    return 0  # absent, or rebuilt since it was listed
                except CacheError:
                    pass
                doomed = self.root / "tmp" / f"{entry.name}.pruned.{time.time_ns()}.{os.getpid()}"
                try:
                    os.rename(entry, doomed)
                except FileNotFoundError:
                    return 0
        except Timeout:
            return 0  # being rebuilt: its builder moves it aside
        shutil.rmtree(doomed, ignore_errors=True)
        return 1
