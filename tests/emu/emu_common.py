"""Shared by the isa-emu checks: the emulator (isa-emu's bxrun, found through $ISA_EMU), a blob built by run.sh, a
bump allocator over the emulated data region, and the codec's bfloat16 results of every code (ml_dtypes: fp8kit's
codec matches it bit for bit, tests/format)."""
import ctypes
import os
import sys

import ml_dtypes
import numpy as np

FORMATS = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"]  # Format's order

BUILD = os.environ["FP8KIT_EMU_BUILD"]
_shim = os.path.join(BUILD, "libisoc23_shim.so")  # the wheel wants glibc 2.38 symbols: loaded before it
if os.path.exists(_shim):
    ctypes.CDLL(_shim, mode=ctypes.RTLD_GLOBAL)
sys.path.insert(0, os.environ["ISA_EMU"])
import bxrun  # noqa: E402

bxrun.set_cpu_model("sapphire_rapids")  # AVX-512 F/BW/VL/DQ/VBMI/VBMI2, AVX512-BF16, AVX512-FP16
DATA = bxrun.DATA_BASE


def emulator(name: str, data_bytes: int = 1 << 21):
    """(Emu, entry points) for the blob `name` (one per process)."""
    blob, syms = bxrun.load_blob(BUILD, name)
    return bxrun.Emu(blob, data_bytes), syms


def bf16_table() -> np.ndarray:
    """5 x 256 uint16: the bfloat16 bits of every code of each format (exact: every FP8 value is a bfloat16)."""
    table = np.zeros((5, 256), np.uint16)
    for f, name in enumerate(FORMATS):
        values = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, name)).astype(np.float32)
        table[f] = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    return table


class Arena:
    """Places arrays in the emulated data region, 64-byte aligned with a 64-byte gap (a read past an end lands in
    the gap, not in the next array)."""

    def __init__(self, emu, start: int = DATA):
        self.emu, self.at = emu, start

    def put(self, array) -> int:
        a = np.ascontiguousarray(array)
        addr = self.at
        self.emu.write(addr, a.tobytes())
        self.at += (a.nbytes + 63) // 64 * 64 + 64
        return addr
