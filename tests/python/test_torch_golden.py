"""fp8kit against PyTorch's recorded casts (tests/python/data/torch_golden.json, written by torch_golden.py
--record with torch installed): the same inputs, cast by fp8kit under the overflow convention torch's `.to()` had for
each format, must give codes (and decoded values) with the same SHA-256 as torch's. Needs no torch, so CI checks the
PyTorch agreement on every run; test_torch_parity.py, where torch is installed, compares element by element and
says where two differ."""
import json

import ml_dtypes
import numpy as np
import pytest

import fp8kit
from torch_golden import FORMATS, PATH, digest, e8m0_inputs, float32_inputs, half_inputs

with open(PATH) as f:
    GOLDEN = json.load(f)


def expected(case):
    return GOLDEN["sha256"][case]


def test_the_recording_covers_every_case():
    version = tuple(int(part) for part in GOLDEN["torch_version"].split(".")[:2])
    assert version >= (2, 12)  # (the e4m3fn convention below is 2.12's and later's)
    assert GOLDEN["saturates"] == {"e4m3fn": True, "e5m2": False, "e4m3fnuz": False, "e5m2fnuz": False}
    assert len(GOLDEN["sha256"]) == 4 + 4 + 1 + 5 * 3 * 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_float32_casts_match_torch(fmt):
    codes = fp8kit.cast(float32_inputs(), fmt, saturate=GOLDEN["saturates"][fmt]).view(np.uint8)
    assert digest(codes) == expected(f"float32->{fmt}"), f"torch {GOLDEN['torch_version']}"


@pytest.mark.parametrize("wide", ["bfloat16", "float16"])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_16_bit_casts_match_torch(wide, fmt):
    x = half_inputs(wide).view(ml_dtypes.bfloat16 if wide == "bfloat16" else np.float16)
    codes = fp8kit.cast(x, fmt, saturate=GOLDEN["saturates"][fmt]).view(np.uint8)
    assert digest(codes) == expected(f"{wide}->{fmt}")


def test_e8m0fnu_on_positive_normal_inputs_matches_torch():
    codes = fp8kit.cast(e8m0_inputs(), "e8m0fnu").view(np.uint8)
    assert digest(codes) == expected("float32->e8m0fnu (positive normal)")


@pytest.mark.parametrize("fmt", FORMATS + ("e8m0fnu",))
def test_every_code_decodes_as_torch_decodes_it(fmt):
    codes = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, "float8_" + fmt))
    for wide, bits in (("float32", np.int32), ("bfloat16", np.int16), ("float16", np.int16)):
        values = fp8kit.cast(codes, wide)
        nan = np.isnan(values.astype(np.float32))
        out = values.view(bits).copy()
        out[nan] = 0  # NaN payloads are each library's own: NaN-ness is compared apart
        assert digest(out) == expected(f"{fmt}->{wide}"), wide
        assert digest(nan) == expected(f"{fmt}->{wide} NaN codes"), wide


def test_a_wrong_code_changes_the_digest():
    """The comparison can fail: one code off in a million changes the float32 -> e4m3fn digest."""
    codes = fp8kit.cast(float32_inputs(), "e4m3fn", saturate=True).view(np.uint8).copy()
    codes[123456] ^= 1
    assert digest(codes) != expected("float32->e4m3fn")
