"""Sharing the cores with numpy's OpenBLAS.

OpenBLAS's idle workers spin for 2^OPENBLAS_THREAD_TIMEOUT cycles after
each numpy call (default 2^28, about 0.1 s), on the cores our next kernel
runs on: alternating numpy and dispatcher calls then runs ours at about
0.5-0.6x of its solo speed. 2^4 cycles makes them sleep at once; numpy's
own back-to-back calls (128^3 to 1024^3) keep their speed with it
(docs/architecture.md, Load).

OpenBLAS reads the variable once, as numpy loads it. So `import
dispatcher` sets it when numpy is not loaded yet; when numpy was loaded
first, it sets the spin that OpenBLAS computed from it, `thread_timeout`,
a static variable of its thread server that its workers read on every
spin (OpenBLAS exports no setter). That variable is found by name in the
library's ELF symbol table (numpy's and scipy's OpenBLAS wheels keep it)
and written only if it holds what OpenBLAS itself would have put there
(2^k cycles, k in 4..30); a library without it, another format or any
surprise is left alone, as before. A value the user set in the
environment is never overridden.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

OPENBLAS_THREAD_TIMEOUT = "4"
_SPIN_CYCLES = 1 << int(OPENBLAS_THREAD_TIMEOUT)


def share_cores_with_numpy():
    """Shorten OpenBLAS's spin (module docstring), unless the user set it."""
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return
    if "numpy" not in sys.modules:
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = OPENBLAS_THREAD_TIMEOUT
        return
    try:
        from threadpoolctl import threadpool_info
        paths = {i["filepath"] for i in threadpool_info() if i.get("internal_api") == "openblas"}
    except Exception:  # noqa: BLE001 - threadpoolctl's view of the process is a nicety here
        return
    for path in paths:
        shorten_spin(path)


def shorten_spin(path: str) -> bool:
    """Set the loaded OpenBLAS at `path` to spin 2^4 cycles; True if done."""
    try:
        symbols = elf_symbols(path, ("thread_timeout", "openblas_thread_timeout"))
        variable, function = symbols.get("thread_timeout"), symbols.get("openblas_thread_timeout")
        if variable is None or function is None or variable[1] != 4:
            return False
        exported = ctypes.cast(ctypes.CDLL(path).openblas_thread_timeout, ctypes.c_void_p).value
        spin = ctypes.c_uint32.from_address(exported - function[0] + variable[0])
    except (OSError, AttributeError, ValueError, struct.error):
        return False
    value = spin.value
    if value & (value - 1) or not (1 << 4) <= value <= (1 << 30):
        return False  # not what OpenBLAS computes: another build's layout, leave it
    spin.value = _SPIN_CYCLES
    return True


def elf_symbols(path: str, names) -> dict:
    """{name: (value, size)} of the symbol-table entries `names` of a
    little-endian ELF64 file (its .symtab: local symbols included); {} for
    any other file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return {}
    wanted = {n.encode() for n in names}
    section_offset, = struct.unpack_from("<Q", data, 0x28)
    entry_size, count = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
    found = {}
    for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
        if kind != 2 or not symbol_size:  # SHT_SYMTAB
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, symbol_size):
            name, _, _, _, value, length = struct.unpack_from("<IBBHQQ", data, at)
            start = strings + name
            symbol = data[start:data.index(b"\0", start)]
            if symbol in wanted:
                found[symbol.decode()] = (value, length)
    return found
