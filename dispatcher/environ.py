"""Environment variables that switch something on or off: one rule for all.

Documented values (docs/reference.md, "Environment"): 1, true, yes, on
switch it on; 0, false, no, off, empty or unset leave it off (any case,
surrounding blanks ignored). Anything else is a ConfigError naming the
variable, never a guess: `DISPATCHER_AUTOTUNE=maybe` used to count as on.
"""

from __future__ import annotations

import os

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
