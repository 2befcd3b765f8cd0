#!/usr/bin/env python3
"""Live agreement with ml_dtypes (an independent implementation), through fp8kit's bulk kernels.

Usage: check_ml_dtypes.py PATH_TO_codec_dump
Checks, for every format ml_dtypes has: decoding of all 256 codes to float32, bfloat16 and float16; encoding of
all 2^16 bfloat16 and float16 inputs; 2 million float32 inputs (random bits, random magnitudes, every code's
value and midpoint with their float neighbours); float64 inputs. ml_dtypes casts only without saturation; the
saturating results are checked against the non-saturating ones (overflow becomes +-max, all else is equal).
Two differences of older ml_dtypes (docs/formats.md) are detected on the installed one; where it has them they are
counted and checked to be fp8kit's stated choice, where it does not every input is compared:
  - e8m0fnu: older ml_dtypes round subnormal inputs strictly between 2^-127 and 1.5 * 2^-127 up to 2^-126;
    fp8kit gives the nearest value, 2^-127.
  - float64: older ml_dtypes round through float32 first (ml_dtypes#401); then only doubles that float32 holds
    exactly are compared, else also doubles off them by a few float64 ulps (near every FP8 midpoint).
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checks import check, require, summary  # noqa: E402

require("numpy", "ml_dtypes")
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

FORMATS = ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e8m0fnu"]
MAX_CODE = {"e4m3fn": 0x7E, "e5m2": 0x7B, "e4m3fnuz": 0x7F, "e5m2fnuz": 0x7F, "e8m0fnu": 0xFE}


def run(dump, args, data, out_dtype):
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "in"), os.path.join(d, "out")
        data.tofile(src)
        subprocess.run([dump] + args + [src, dst], check=True)
        return np.fromfile(dst, dtype=out_dtype)


def ml_encode(fmt, x):
    with np.errstate(all="ignore"):
        return x.astype(getattr(ml_dtypes, "float8_" + fmt)).view(np.uint8)


# What the installed ml_dtypes does where older ones differ from fp8kit.
ML_E8M0_ROUNDS_SUBNORMALS_UP = int(np.float32(1.25 * 2.0**-127).reshape(1).astype(ml_dtypes.float8_e8m0fnu).view(
    np.uint8)[0]) == 0x01
ML_FLOAT64_ROUNDS_TWICE = float(np.float64([400 * (1 + 2.0**-40)]).astype(ml_dtypes.float8_e4m3fn)[0]) == 384.0


def e8m0_divergent(x):
    if not ML_E8M0_ROUNDS_SUBNORMALS_UP:
        return np.zeros(len(x), bool)
    with np.errstate(all="ignore"):
        a = x.astype(np.float64)
    return (a > 2.0**-127) & (a < 1.5 * 2.0**-127)


def compare_encode(dump, fmt, src, x):
    bits_dtype = {"f32": np.uint32, "bf16": np.uint16, "f16": np.uint16, "f64": np.uint64}[src]
    want = ml_encode(fmt, x)
    got = run(dump, ["encode", fmt, src, "0"], x.view(bits_dtype), np.uint8)
    skip = e8m0_divergent(x) if fmt == "e8m0fnu" else np.zeros(len(x), bool)
    bad = np.nonzero((want != got) & ~skip)[0]
    check(f"{fmt} {src} non-saturating ({len(x)} inputs)", len(bad) == 0,
          f"{len(bad)} mismatches, first input bits {x.view(bits_dtype)[bad[:3]]} ml_dtypes {want[bad[:3]]} fp8kit {got[bad[:3]]}")
    if skip.any():
        check(f"{fmt} {src} documented e8m0 divergence gives 2^-127", bool(np.all(got[skip] == 0x00)))
    # Saturating: what overflowed without saturation becomes +-max; everything else is unchanged.
    sat = run(dump, ["encode", fmt, src, "1"], x.view(bits_dtype), np.uint8)
    with np.errstate(all="ignore"):
        xf = x.astype(np.float64)
    nonsat = got
    if fmt == "e8m0fnu":
        overflow = np.isposinf(xf) | ((nonsat == 0xFF) & np.isfinite(xf) & (xf > 0))
        expected = np.where(overflow, 0xFE, nonsat)
        expected = np.where(xf == 0, 0x00, expected)
    else:
        d = getattr(ml_dtypes, "float8_" + fmt)
        decoded = nonsat.view(d).astype(np.float64)
        overflow = ~np.isnan(xf) & (np.isinf(decoded) | np.isnan(decoded))
        expected = np.where(overflow, MAX_CODE[fmt] | np.where(np.signbit(xf), 0x80, 0), nonsat)
    bad = np.nonzero(sat != expected)[0]
    check(f"{fmt} {src} saturating ({len(x)} inputs)", len(bad) == 0,
          f"{len(bad)} mismatches, first {x.view(bits_dtype)[bad[:3]]}: want {expected[bad[:3]]} got {sat[bad[:3]]}")


def float32_inputs(fmt, rng):
    d = getattr(ml_dtypes, "float8_" + fmt)
    values = np.arange(256, dtype=np.uint8).view(d).astype(np.float64)
    finite = np.sort(values[np.isfinite(values)])
    mids = (finite[1:] + finite[:-1]) / 2
    base = np.concatenate([finite, mids, -finite, -mids]).astype(np.float32)
    near = np.concatenate([base, np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))])
    rand_bits = rng.integers(0, 2**32, 1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        rand_mag = (np.exp2(rng.uniform(-140, 130, 1_000_000)) * rng.choice([-1.0, 1.0], 1_000_000)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan], dtype=np.float32)
    return np.concatenate([near, rand_bits, rand_mag, special])


def main():
    if len(sys.argv) != 2:
        print("usage: check_ml_dtypes.py PATH_TO_codec_dump", file=sys.stderr)
        return 2
    print(f"ml_dtypes {ml_dtypes.__version__}: e8m0 subnormals "
          f"{'rounded up (counted apart)' if ML_E8M0_ROUNDS_SUBNORMALS_UP else 'to nearest (compared)'}, float64 "
          f"{'through float32 (float32-exact doubles only)' if ML_FLOAT64_ROUNDS_TWICE else 'rounded once (compared)'}")
    dump = sys.argv[1]
    rng = np.random.default_rng(7)
    all16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    codes = np.arange(256, dtype=np.uint8)
    for fmt in FORMATS:
        d = getattr(ml_dtypes, "float8_" + fmt)
        # decode every code
        for dst, np_t, bits_t in (("f32", np.float32, np.uint32), ("bf16", ml_dtypes.bfloat16, np.uint16),
                                  ("f16", np.float16, np.uint16)):
            with np.errstate(all="ignore"):
                want = codes.view(d).astype(np_t).view(bits_t)
            got = run(dump, ["decode", fmt, dst], codes, bits_t)
            bad = np.nonzero(want != got)[0]
            check(f"{fmt} decode to {dst}", len(bad) == 0,
                  f"codes {bad[:5]}: ml_dtypes {[hex(v) for v in want[bad[:5]]]} fp8kit {[hex(v) for v in got[bad[:5]]]}")
        compare_encode(dump, fmt, "bf16", all16.view(ml_dtypes.bfloat16))
        compare_encode(dump, fmt, "f16", all16.view(np.float16))
        compare_encode(dump, fmt, "f32", float32_inputs(fmt, rng))
        with np.errstate(all="ignore"):
            f64 = float32_inputs(fmt, rng)[:300_000].astype(np.float64)
        if not ML_FLOAT64_ROUNDS_TWICE:  # off the float32 values (midpoints included) by 1..4 float64 ulps
            steps = rng.integers(-4, 5, len(f64)).astype(np.float64)
            f64 = np.concatenate([f64, f64 + steps * np.spacing(f64)])
        compare_encode(dump, fmt, "f64", f64)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
