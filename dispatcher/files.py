"""Files a user names (sweep configs, problem files, legacy configs, name
lists, results): read as bytes and decoded here, so a missing, unreadable
or non-UTF-8 file is one error that names it (the CLI prints it as one
line, exit status 2), never a raw UnicodeDecodeError traceback."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import ConfigError


def read_text(path, what: str, error=ConfigError) -> str:
    """The UTF-8 text of `path`; `what` names the file in an `error`."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{what} {path} is not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start}; "
                    "save it as UTF-8") from None


def read_json(path, what: str, error=ConfigError):
    """The JSON value in `path` (see `read_text`)."""
    text = read_text(path, what, error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{what} {path} is not valid JSON: {e}") from None
