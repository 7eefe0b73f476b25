"""Sharing the cores with numpy's OpenBLAS.

OpenBLAS's idle workers spin for 2^OPENBLAS_THREAD_TIMEOUT cycles after
each numpy call (default 2^28, about 0.1 s), on the cores our next kernel
runs on: alternating numpy and dispatcher calls then runs ours at about
0.5-0.65x of its solo speed. 2^4 cycles makes them sleep at once; numpy's
own back-to-back calls (128^3 to 1024^3) keep their speed with it
(docs/architecture.md, Load).

OpenBLAS reads the variable once, as it loads. So `import dispatcher` sets
it (for any OpenBLAS loaded later, numpy's or scipy's), and for one numpy
loaded already it also sets the spin that OpenBLAS computed from it,
`thread_timeout`, a static variable of its thread server that its workers
read on every spin (OpenBLAS exports no setter). That variable is found by
name in the library's ELF symbol table (numpy's and scipy's OpenBLAS
wheels keep it) and written only if everything checks: one data symbol of
that name in a writable section, the file's layout matching the loaded
image (an exported function's address is the image's base plus the
file's offset for it) and the value what OpenBLAS itself puts there (2^k
cycles, k in 4..30). Anything else is left alone, as before. A value the
user set in the environment is never overridden; the variable, once set,
is inherited by child processes too (their OpenBLAS spins as briefly).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys

OPENBLAS_THREAD_TIMEOUT = "4"
_SPIN_CYCLES = 1 << int(OPENBLAS_THREAD_TIMEOUT)
_OBJECT, _FUNCTION, _WRITE = 1, 2, 0x1  # ELF: STT_OBJECT, STT_FUNC, SHF_WRITE


def share_cores_with_numpy():
    """Shorten OpenBLAS's spin (module docstring), unless the user set it."""
    if "OPENBLAS_THREAD_TIMEOUT" in os.environ:
        return
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = OPENBLAS_THREAD_TIMEOUT  # any OpenBLAS loaded from now on
    if "numpy" not in sys.modules:
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
    spin = spin_variable(path)
    if spin is None:
        return False
    value = spin.value
    if value & (value - 1) or not (1 << 4) <= value <= (1 << 30):
        return False  # not what OpenBLAS computes: another build's layout, leave it
    spin.value = _SPIN_CYCLES
    return True


def spin_variable(path: str):
    """OpenBLAS's `thread_timeout` in the image of `path` loaded in this
    process, as a ctypes uint32, or None where any check fails (module
    docstring)."""
    try:
        symbols = elf_symbols(path, ("thread_timeout", "openblas_thread_timeout"))
        variable, function = symbols.get("thread_timeout"), symbols.get("openblas_thread_timeout")
        if not variable or not function or len(variable) != 1 or len(function) != 1:
            return None  # absent, or more than one of the name: no guessing which
        (offset, size, kind, writable), (entry, _, entry_kind, _) = variable[0], function[0]
        if size != 4 or kind != _OBJECT or not writable or entry_kind != _FUNCTION:
            return None
        exported = ctypes.cast(ctypes.CDLL(path).openblas_thread_timeout, ctypes.c_void_p).value
        base = _image_base(exported)
        if base is None or exported - entry != base:
            return None  # the file on disk is not the image loaded (replaced since?)
        return ctypes.c_uint32.from_address(base + offset)
    except (OSError, AttributeError, ValueError, IndexError, struct.error):  # a truncated or odd file
        return None


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _image_base(address: int):
    """The load address of the shared object holding `address` (dladdr), or None."""
    dladdr = ctypes.CDLL(None).dladdr
    dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo))
    info = _DlInfo()
    return info.dli_fbase if dladdr(address, ctypes.byref(info)) else None


def elf_symbols(path: str, names) -> dict:
    """{name: [(value, size, type, in a writable section), ...]} of the
    symbol-table entries `names` of a little-endian ELF64 file (its .symtab:
    local symbols included; every entry of a name, in table order); {} for
    any other file. Read at import time, so the file is mapped, not read,
    and the string table is searched for the names once instead of every
    symbol's name being read (numpy's OpenBLAS has tens of thousands)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return {}
        section_offset, = struct.unpack_from("<Q", data, 0x28)
        entry_size, count = struct.unpack_from("<HH", data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size)
                    for i in range(count)]
        found: dict = {}
        for _, kind, _, _, offset, size, link, _, _, symbol_size in sections:
            if kind != 2 or symbol_size != 24:  # SHT_SYMTAB of ELF64 entries
                continue
            strings, strings_size = sections[link][4], sections[link][5]
            at_name = {}  # string-table offset -> name (a name may end a longer one: shared suffixes)
            for name in names:
                text, start = name.encode() + b"\0", strings
                while (start := data.find(text, start, strings + strings_size)) >= 0:
                    at_name[start - strings] = name
                    start += 1
            for name_at, info, _, section, value, length in struct.iter_unpack("<IBBHQQ",
                                                                              data[offset:offset + size]):
                name = at_name.get(name_at)
                if name is not None:
                    writable = 0 < section < count and bool(sections[section][2] & _WRITE)
                    found.setdefault(name, []).append((value, length, info & 0xF, writable))
        return found
