"""A precompiled header of what every CPU kernel includes.

Every generated CPU kernel starts with the same two includes, the ABI header
and the tile library (and `<immintrin.h>` or `<arm_neon.h>` under it).
Parsing them was 2.2 s of a kernel's 4.9 s of `g++ -O3` on a 2-core EPYC.
Compiled once per toolchain (compiler, ISA flags, headers) into the build
cache and named with `-include`, a kernel builds in 3.2 s, to the same
machine code (GCC uses a `.gch` beside the header it includes, and parses
the header itself where that one does not fit the command).

It costs about one kernel's build, so a process builds it into a cache only
once it has compiled PLAIN_FIRST kernels of the toolchain there without it:
a user's first call that builds one kernel pays nothing for it, a catalog's
prebuild or a sweep gains from the third kernel on, and every later process
finds it.

The header is published like a cache entry: built in a staging folder under
a lock and renamed into place, so a kill leaves no half-written one; where it
cannot be built (a compiler without precompiled headers) builds go on
without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from filelock import FileLock

from ..errors import BuildError

INCLUDES = ("dispatcher_abi.h", "cpu/tile_gemm.hpp")  # as every generated source starts
KEEP = 8  # precompiled headers kept per cache (one per ISA spec and headers version in use)
PLAIN_FIRST = 2  # kernels a process builds in a cache without the header before it builds one there
_plain_builds: dict = {}  # (folder, key) -> kernels this process built there without its header
_unbuildable: set = set()  # keys whose header failed to build in this process


def _key(toolchain) -> str:
    blob = json.dumps([toolchain.identity, list(toolchain.cache_flags)])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def precompiled_header(toolchain, folder: Path) -> Path | None:
    """The header for `toolchain`'s builds to `-include`, its `.gch` built
    into `folder` the first time; None where it cannot be built, and for
    this process's first PLAIN_FIRST builds there while there is none."""
    key = _key(toolchain)
    home = folder / f"pch-{key}"
    if (home / "kernel.hpp.gch").is_file():
        return home / "kernel.hpp"
    if key in _unbuildable or _plain_builds.get((folder, key), 0) < PLAIN_FIRST:
        _plain_builds[(folder, key)] = _plain_builds.get((folder, key), 0) + 1
        return None
    folder.mkdir(mode=0o700, exist_ok=True)
    with FileLock(str(folder / f"pch-{key}.lock")):
        if not (home / "kernel.hpp.gch").is_file():
            staging = Path(tempfile.mkdtemp(prefix=f"staging-{key}.", dir=folder))
            try:
                header = staging / "kernel.hpp"
                header.write_text("".join(f'#include "{name}"\n' for name in INCLUDES))
                toolchain.run_compiler([*toolchain.flags, "-x", "c++-header", str(header),
                                        "-o", str(staging / "kernel.hpp.gch")], "the precompiled header")
                os.rename(staging, home)
            except (BuildError, OSError):
                _unbuildable.add(key)
                return None
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            _prune(folder)
    return home / "kernel.hpp"


def discard(header: Path) -> None:
    """Remove a precompiled header (one a build failed with where the plain
    build succeeded, or one pruned): moved aside first, so no build finds
    half of it; the next build makes a new one."""
    aside = header.parent.with_name(f"discarded-{header.parent.name}.{time.time_ns()}")
    try:
        os.rename(header.parent, aside)
    except OSError:
        return  # gone already (another process discarded or pruned it)
    shutil.rmtree(aside, ignore_errors=True)


def _prune(folder: Path) -> None:
    """Keep the KEEP most recently built headers (each is tens of MB, and a
    new headers version or ISA spec makes a new one), and remove what a
    killed build or discard left behind an hour ago or more."""
    homes, now = [], time.time()
    for path in folder.iterdir():
        try:
            if path.name.startswith("pch-") and path.is_dir():
                homes.append((path.stat().st_mtime, path))
            elif path.name.startswith(("staging-", "discarded-")) and now - path.stat().st_mtime > 3600:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue  # removed meanwhile by another process
    for _, home in sorted(homes, reverse=True)[KEEP:]:
        discard(home / "kernel.hpp")
