"""What every target's compiler wrapper shares: running the compiler,
reporting its first errors, and the parts of a build that key the cache."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from ..errors import BuildError

NATIVE_DIR = Path(__file__).resolve().parent.parent / "native"


def headers_hash(*subdirs: str) -> str:
    """Content hash of the native headers a target's kernels include (the ABI
    header and the target's own folder): they are part of every source."""
    h = hashlib.sha256()
    paths = [NATIVE_DIR / "dispatcher_abi.h"]
    for sub in subdirs:
        paths += sorted((NATIVE_DIR / sub).rglob("*.h*"))
    for path in paths:
        h.update(path.relative_to(NATIVE_DIR).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class CompilerMixin:
    """For attrs toolchain classes with `compiler`, `flags` and `label`."""

    @property
    def cache_flags(self) -> tuple:
        """The flags that change the binary: include folders are left out
        (their contents are in `identity`), so a cache built on one machine
        is found on another where the package lives elsewhere."""
        return tuple(f for f in self.flags if not f.startswith("-I"))

    # A compiler that hangs must not hang the build: the longest CUTLASS
    # instance builds in a few minutes.
    timeout_s = 1800

    def compile(self, source: Path, output: Path, extra_flags=(), shared_dir: Path | None = None) -> None:
        """Compile `source` into `output`. `shared_dir`: a folder of the build
        cache where a toolchain may keep what all its builds share (the cpu
        target keeps its precompiled header there); this compile keeps nothing."""
        self.run_compiler([*self.flags, *extra_flags, str(source), "-o", str(output)], source.name)

    def run_compiler(self, args: list, what: str) -> None:
        """Run the compiler with `args`; BuildError with its first errors if it fails."""
        cmd = [self.compiler, *args]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise BuildError(f"{self.label} compilation of {what} ran over {self.timeout_s} s "
                             "and was stopped; check the compiler (and the machine's load)", "") from None
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines()
            errors = [l for l in lines if "error" in l] or lines
            first = "\n".join(line[:300] for line in errors[:12])
            raise BuildError(f"{self.label} compilation of {what} failed:\n{first}", proc.stderr)
