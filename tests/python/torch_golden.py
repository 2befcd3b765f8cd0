"""PyTorch's FP8 casts, recorded, so that CI (which has no torch: a 5.3 GB install) checks fp8kit against them.

`python3 tests/python/torch_golden.py --record` (with torch importable) runs torch's own `.to()` on the inputs below
and writes tests/python/data/torch_golden.json: torch's version, the overflow convention of each format's `.to()`,
and a SHA-256 of torch's codes (or decoded values) for each case. test_torch_golden.py recomputes the same digests
with fp8kit and compares, with no torch needed; test_torch_parity.py compares element by element when torch is
there. The inputs come from SplitMix64 written out here (not NumPy's generators, whose streams NumPy does not
promise to keep), so every machine and NumPy version makes the same ones.

Cases (as test_torch_parity.py leaves out what is PyTorch's own choice, docs/formats.md): float32 -> e4m3fn, e5m2,
e4m3fnuz, e5m2fnuz on 2^20 random bit patterns and the edge values, NaN inputs left out (PyTorch keeps NaN payload
bits); every finite bfloat16 and float16 bit pattern -> e4m3fn and e5m2; float32 -> e8m0fnu on the positive normal
inputs; and every code of each of the five formats decoded to float32, bfloat16 and float16."""
from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np

FORMATS = ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz")
EDGES = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 448, 449, 464, 465, 480, 240, 241, 247, 248, 57344, 61439,
                    61440, 1e6, -1e6, 3e38, 2.0**-6, 2.0**-9, 2.0**-10, 2.0**-16, 2.0**-17, 2.0**-14, 1.5 * 2.0**-16])
PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "torch_golden.json")


def splitmix64(n: int, seed: int) -> np.ndarray:
    """n values of SplitMix64 from `seed` (uint64), computed in NumPy's wrapping uint64 arithmetic."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def float32_inputs() -> np.ndarray:
    """2^20 random float32 bit patterns, then the edge values and their negations; NaNs removed."""
    x = np.concatenate([(splitmix64(1 << 20, 2026) >> np.uint64(32)).astype(np.uint32).view(np.float32), EDGES,
                        -EDGES])
    return x[~np.isnan(x)]


def half_inputs(name: str) -> np.ndarray:
    """Every finite bit pattern of bfloat16 or float16, as uint16."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    exponent_mask = 0x7F80 if name == "bfloat16" else 0x7C00
    finite = (bits & exponent_mask) != exponent_mask
    return bits[finite].astype(np.uint16)


def e8m0_inputs() -> np.ndarray:
    x = np.abs(float32_inputs())
    return x[np.isfinite(x) & (x >= np.float32(2.0**-126))]


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def record() -> dict:
    import torch
    version = torch.__version__.split("+")[0]
    out = {"torch_version": version, "saturates": {}, "sha256": {}}
    big = torch.tensor([465.0, 1e6, float("inf")])
    for fmt in FORMATS:  # the convention each format's .to() has in this version, read from torch itself
        values = big.to(getattr(torch, "float8_" + fmt)).float()
        out["saturates"][fmt] = bool(torch.isfinite(values).all())
    x = torch.from_numpy(float32_inputs())
    for fmt in FORMATS:
        out["sha256"][f"float32->{fmt}"] = digest(x.to(getattr(torch, "float8_" + fmt)).view(torch.uint8).numpy())
    for wide in ("bfloat16", "float16"):
        t = torch.from_numpy(half_inputs(wide).view(np.int16)).view(getattr(torch, wide))
        for fmt in ("e4m3fn", "e5m2"):
            codes = t.to(getattr(torch, "float8_" + fmt)).view(torch.uint8).numpy()
            out["sha256"][f"{wide}->{fmt}"] = digest(codes)
    e8 = torch.from_numpy(e8m0_inputs()).to(torch.float8_e8m0fnu).view(torch.uint8).numpy()
    out["sha256"]["float32->e8m0fnu (positive normal)"] = digest(e8)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    for fmt in FORMATS + ("e8m0fnu",):
        for wide, bits in (("float32", torch.int32), ("bfloat16", torch.int16), ("float16", torch.int16)):
            values = codes.view(getattr(torch, "float8_" + fmt)).to(getattr(torch, wide))
            nan = torch.isnan(values.float())
            bits_out = values.view(bits).numpy().copy()
            bits_out[nan.numpy()] = 0  # NaN payloads are each library's own; NaN-ness is compared apart
            out["sha256"][f"{fmt}->{wide}"] = digest(bits_out)
            out["sha256"][f"{fmt}->{wide} NaN codes"] = digest(nan.numpy())
    return out


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python3 tests/python/torch_golden.py --record   (needs torch; writes " + PATH + ")")
    result = record()
    with open(PATH, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"recorded torch {result['torch_version']}: {len(result['sha256'])} digests -> {PATH}")
