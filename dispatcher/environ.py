"""Environment variables that switch something on or off: one rule for all.

Documented values (docs/reference.md, "Environment"): 1, true, yes, on
switch it on; 0, false, no, off, empty or unset leave it off (any case,
surrounding blanks ignored). Anything else is a ConfigError naming the
variable, never a guess: `DISPATCHER_AUTOTUNE=maybe` used to count as on.
"""

from __future__ import annotations

import os
import sys

from .errors import ConfigError

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off", "")


def flag(name: str) -> bool:
    """Whether boolean environment variable `name` is on."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean: set it to one of {', '.join(ON + OFF[:-1])}, "
                      "or leave it empty or unset (off)")


# OpenBLAS's idle workers spin for 2^OPENBLAS_THREAD_TIMEOUT cycles after
# each numpy call (default 2^28, about 0.1 s), on the cores our next kernel
# runs on: alternating numpy and dispatcher calls then runs ours at about
# 0.6x. 2^4 cycles makes them sleep at once; numpy's own back-to-back calls
# (128^3 to 1024^3) kept their speed with it (docs/architecture.md, Load).
OPENBLAS_THREAD_TIMEOUT = "4"


def share_cores_with_numpy():
    """Before numpy loads OpenBLAS (it reads the variable once, then): its
    idle workers' spin, unless the user set it. When numpy was imported
    before dispatcher it is too late, and the docs say to set it."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", OPENBLAS_THREAD_TIMEOUT)
