"""fp8kit.cast and fp8kit.formats from Python: bit-exact against ml_dtypes (non-saturating) on every bfloat16 and
float16 input and on float32 samples, the saturating policy, scales, stochastic rounding, every dtype spelling,
the output following the input (NumPy, lists, __dlpack__ producers: one over NumPy, one hand-made with ctypes;
torch when it is installed), out=, strided
inputs, and every error path."""
import ctypes
import gc
import json
import os
import subprocess

import ml_dtypes
import numpy as np
import pytest

import fp8kit

FP8 = ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"]
SHORT = {"float8_e4m3fn": "e4m3fn", "float8_e5m2": "e5m2", "float8_e4m3fnuz": "e4m3fnuz",
         "float8_e5m2fnuz": "e5m2fnuz", "float8_e8m0fnu": "e8m0fnu"}


def ml(name):
    return np.dtype(getattr(ml_dtypes, name))


def same_values(a, b):
    """Equal bits, or both NaN (NaN codes may differ in sign: e4m3fn 0x7F and 0xFF)."""
    a32 = np.asarray(a).astype(np.float32)
    b32 = np.asarray(b).astype(np.float32)
    return bool(np.all((a32.view(np.uint32) == b32.view(np.uint32)) | (np.isnan(a32) & np.isnan(b32))))


def test_formats_are_the_cli_table():
    rows = fp8kit.formats()
    assert [r["name"] for r in rows] == ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e8m0fnu"]
    e4 = rows[0]
    assert (e4["max"], e4["max_code"], e4["min_subnormal"], e4["nan_codes"]) == (448.0, 126, 2.0 ** -9, [127, 255])
    assert rows[1]["inf_codes"] == [124, 252] and rows[1]["inf_encoding"] == "S.11111.00"
    assert rows[4]["min_subnormal"] is None and rows[4]["has_zero"] is False
    cli = os.environ.get("FP8KIT_CLI")
    if cli:
        assert rows == json.loads(subprocess.run([cli, "formats", "--json"], check=True, capture_output=True,
                                                 text=True).stdout)


@pytest.mark.parametrize("src", ["bfloat16", "float16"])
@pytest.mark.parametrize("fmt", FP8)
def test_every_16_bit_input_matches_ml_dtypes(src, fmt):
    x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(
        np.dtype(ml_dtypes.bfloat16) if src == "bfloat16" else np.float16)
    got = fp8kit.cast(x, fmt)
    assert got.dtype == ml(fmt) and got.shape == x.shape
    assert np.array_equal(got.view(np.uint8), x.astype(ml(fmt)).view(np.uint8))


@pytest.mark.parametrize("fmt", FP8)
def test_float32_samples_match_ml_dtypes(fmt):
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2 ** 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 448, 449, 464, 465, 57344, 61440, 2.0 ** -9,
                         2.0 ** -10, 3 * 2.0 ** -11, 1e-45, 3.4e38], np.float32)
    x = np.concatenate([bits.view(np.float32), specials, -specials])
    got = fp8kit.cast(x, fmt)
    want = x.astype(ml(fmt))
    assert same_values(got, want) and np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("fmt", FP8)
@pytest.mark.parametrize("to", ["float32", "bfloat16", "float16"])
def test_every_code_decodes_as_ml_dtypes(fmt, to):
    codes = np.arange(256, dtype=np.uint8).view(ml(fmt))
    got = fp8kit.cast(codes, to)
    with np.errstate(over="ignore"):  # e8m0fnu's large powers of two are Inf in float16
        want = codes.astype(np.float32).astype(np.dtype(ml_dtypes.bfloat16) if to == "bfloat16" else to)
    assert got.dtype == want.dtype and same_values(got, want)


def test_the_two_overflow_policies():
    x = np.array([448, 449, 464, 465, 1e6, -1e6, np.inf, -np.inf, np.nan], np.float32)
    assert same_values(fp8kit.cast(x, "e4m3fn"), [448, 448, 448, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan])
    assert same_values(fp8kit.cast(x, "e4m3fn", saturate=True), [448, 448, 448, 448, 448, -448, 448, -448, np.nan])
    assert same_values(fp8kit.cast(x, "e5m2")[4:8], [np.inf, -np.inf, np.inf, -np.inf])
    assert same_values(fp8kit.cast(x, "e5m2", saturate=True)[4:8], [57344, -57344, 57344, -57344])
    assert fp8kit.cast(np.float32([-0.0]), "e4m3fnuz").view(np.uint8)[0] == 0  # fnuz has no -0


def test_scales_both_ways():
    rng = np.random.default_rng(2)
    x = rng.normal(0, 3, 4096).astype(np.float32)
    s = np.float32(37.5)
    q = fp8kit.cast(x, "e4m3fn", scale=float(s), saturate=True)
    want = np.clip(x * s, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(q.view(np.uint8), want.view(np.uint8))
    back = fp8kit.cast(q, "float32", scale_inv=float(1 / s))
    assert np.array_equal(back, q.astype(np.float32) * np.float32(1 / s))
    # The quantization scale and the dequantization scale are kept apart: one value passed both ways would square it.
    # scale= on a decode was its multiplier before scale_inv= existed: the same value, with a FutureWarning.
    with pytest.warns(FutureWarning, match=r"name it scale_inv= \(the same value") as caught:
        old = fp8kit.cast(q, "float32", scale=float(1 / s))
    assert np.array_equal(old, back)
    with pytest.warns(FutureWarning) as caught_transposed:  # cast calls itself for a transpose: still the caller's line
        fp8kit.cast(np.stack([q, q]).T, "float32", scale=2.0)
    assert [w.filename for w in (*caught, *caught_transposed)] == [__file__, __file__]
    with pytest.raises(ValueError, match="once, as scale_inv="):
        fp8kit.cast(q, "float32", scale=2.0, scale_inv=2.0)
    with pytest.raises(ValueError, match=r"an encode multiplies by the quantization scale: pass scale="):
        fp8kit.cast(x, "e4m3fn", scale_inv=float(s))
    with pytest.raises(ValueError, match="scale_inv is for casts from FP8"):
        fp8kit.cast(x, "float16", scale_inv=2.0)


def test_stochastic_rounding_is_seeded_unbiased_and_thread_independent():
    x = np.full(1 << 16, 1.0 + 1.0 / 32, np.float32)  # a quarter of the way from 1 to 1.125 in e4m3fn
    a = fp8kit.cast(x, "e4m3fn", rounding="stochastic", seed=7, threads=1)
    b = fp8kit.cast(x, "e4m3fn", rounding="stochastic", seed=7, threads=2)
    c = fp8kit.cast(x, "e4m3fn", rounding="stochastic", seed=8)
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    assert not np.array_equal(a.view(np.uint8), c.view(np.uint8))
    up = np.mean(a.astype(np.float32) > 1.0)
    n = x.size
    assert abs(up - 0.25) < 5 * np.sqrt(0.25 * 0.75 / n), up  # within five standard errors of the expectation


def test_every_dtype_spelling():
    x = np.float32([1.25, -3.0])
    want = fp8kit.cast(x, "e5m2").view(np.uint8)
    for spelling in ["e5m2", "float8_e5m2", "torch.float8_e5m2", ml_dtypes.float8_e5m2, np.dtype(ml_dtypes.float8_e5m2)]:
        assert np.array_equal(fp8kit.cast(x, spelling).view(np.uint8), want), spelling
    for spelling, dtype in [("float16", np.float16), ("f16", np.float16), (np.float16, np.float16),
                            ("bf16", ml_dtypes.bfloat16), ("float64", np.float64), ("float32", np.float32)]:
        assert fp8kit.cast(x, spelling).dtype == np.dtype(dtype)


def test_wide_and_fp8_to_fp8_round_once():
    x = np.float64([1 + 2 ** -4 + 2 ** -30, 448.0000001, 1e300])  # float64 -> e4m3fn: once from the exact value
    assert same_values(fp8kit.cast(x, "e4m3fn"), [1.125, 448, np.nan])
    q = np.float32([0.3, 1000.0]).astype(ml_dtypes.float8_e5m2)
    assert same_values(fp8kit.cast(q, "e4m3fn", saturate=True), np.float32(q.astype(np.float32)).clip(-448, 448)
                       .astype(ml_dtypes.float8_e4m3fn))
    assert fp8kit.cast(np.float32([1 + 2 ** -9]), "bfloat16").dtype == np.dtype(ml_dtypes.bfloat16)


def test_output_follows_the_input_and_shapes_are_kept():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    q = fp8kit.cast(x, "e4m3fn")
    assert isinstance(q, np.ndarray) and q.shape == (2, 3, 4)
    assert fp8kit.cast([1.0, 2.0], "e5m2").dtype == ml(FP8[1])  # a list: float32, then NumPy out
    assert fp8kit.cast(np.float32(3.0), "e4m3fn").shape == ()
    assert fp8kit.cast(np.zeros((0, 5), np.float32), "e4m3fn").shape == (0, 5)

    class Producer:  # anything with __dlpack__ (here a NumPy array behind it)
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kwargs):
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    assert np.array_equal(fp8kit.cast(Producer(x), "e4m3fn").view(np.uint8), q.view(np.uint8))


def test_out_is_written_in_place_and_strided_inputs_are_copied_once():
    x = np.linspace(-500, 500, 1000, dtype=np.float32)
    out = np.empty(1000, ml_dtypes.float8_e4m3fn)
    r = fp8kit.cast(x, "e4m3fn", saturate=True, out=out)
    assert r is out and np.shares_memory(r, out)
    assert np.array_equal(out.view(np.uint8), fp8kit.cast(x, "e4m3fn", saturate=True).view(np.uint8))
    wide = np.linspace(-1, 1, 2000, dtype=np.float32)
    strided = wide[::2]
    assert not strided.flags.c_contiguous
    assert np.array_equal(fp8kit.cast(strided, "e5m2").view(np.uint8),
                          fp8kit.cast(np.ascontiguousarray(strided), "e5m2").view(np.uint8))
    frozen = np.frombuffer(x.tobytes(), np.float32)  # read-only input: read, never written
    assert not frozen.flags.writeable
    assert np.array_equal(fp8kit.cast(frozen, "e4m3fn").view(np.uint8), fp8kit.cast(x, "e4m3fn").view(np.uint8))
    frozen_codes = np.frombuffer(x.astype(ml_dtypes.float8_e5m2).tobytes(), ml_dtypes.float8_e5m2)
    assert np.array_equal(fp8kit.cast(frozen_codes, "float32"), x.astype(ml_dtypes.float8_e5m2).astype(np.float32))
    view = fp8kit.cast(x, "e4m3fn").view(np.uint8)  # a view outliving its array's name
    del r
    assert view.sum() > 0


def test_errors():
    x = np.float32([1.0, 2.0])
    with pytest.raises(ValueError, match="unknown dtype 'e4m3'"):
        fp8kit.cast(x, "e4m3")
    with pytest.raises(ValueError, match="does not cast"):
        fp8kit.cast(x, np.int32)
    with pytest.raises(ValueError, match="x holds int64 elements"):  # the input named, not the target
        fp8kit.cast(np.int64([1]), "e4m3fn")
    with pytest.raises(ValueError, match="threads must be at least 1"):
        fp8kit.cast(x, "e4m3fn", threads=0)
    with pytest.raises(TypeError, match="threads must be an int"):
        fp8kit.cast(x, "e4m3fn", threads=1.5)
    with pytest.raises(ValueError, match="rounding must be"):
        fp8kit.cast(x, "e4m3fn", rounding="up")
    with pytest.raises(ValueError, match="seed is for"):
        fp8kit.cast(x, "e4m3fn", seed=3)
    with pytest.raises(ValueError, match="stochastic"):
        fp8kit.cast(x.astype(ml_dtypes.float8_e4m3fn), "float32", rounding="stochastic")
    with pytest.raises(ValueError, match="scale is for"):
        fp8kit.cast(x, "float16", scale=2.0)
    # an input fp8kit does not read is named as the input, not as an unknown target
    for bad in (np.ones(3, np.int32), np.ones(3, np.complex64), np.ones(3, bool)):
        with pytest.raises(ValueError, match=rf"x holds {bad.dtype} elements; fp8kit reads float32.*astype"):
            fp8kit.cast(bad, "e4m3fn")
    with pytest.raises(ValueError, match="out is"):
        fp8kit.cast(x, "e4m3fn", out=np.empty(3, ml_dtypes.float8_e4m3fn))
    with pytest.raises(ValueError, match="out is"):
        fp8kit.cast(x, "e4m3fn", out=np.empty(2, ml_dtypes.float8_e5m2))
    with pytest.raises(TypeError, match="dtype must be"):
        fp8kit.cast(x, 3.5)
    with pytest.raises(TypeError, match="dtype must be given"):
        fp8kit.cast(x, None)  # not NumPy's default float64
    # Objects that are not numbers at all were a ValueError "does not cast object" (docs: TypeError).
    for thing, numpy_reads in ((object(), "object"), ({}, "object"), ("1.5", "<U3"), ([1.0, "a"], "<U32"),
                               (None, "object")):
        with pytest.raises(TypeError, match=f"takes an array, a tensor or numbers; NumPy reads this "
                                            f"{type(thing).__name__} as {numpy_reads} elements"):
            fp8kit.cast(thing, "e4m3fn")
    with pytest.raises(TypeError, match="reads this object as object elements"):
        fp8kit.quantize(object())
    with pytest.raises(TypeError, match="out must be a NumPy array like the input, not list"):
        fp8kit.cast(x, "e4m3fn", out=[0, 0])
    with pytest.raises(ValueError, match="out is uint8"):
        fp8kit.cast(x, "e4m3fn", out=np.zeros(2, np.uint8))
    with pytest.raises(ValueError, match=r"big-endian float32: convert first with \.astype\(np\.float32\)"):
        fp8kit.cast(x.astype(">f4"), "e4m3fn")
    # ml_dtypes types: the suggested conversion is one NumPy can do (astype('<V2') cannot)
    big_bf16 = x.astype(ml_dtypes.bfloat16).astype(np.dtype(ml_dtypes.bfloat16).newbyteorder(">"))
    with pytest.raises(ValueError, match=r"\.astype\(ml_dtypes\.bfloat16\)") as refused:
        fp8kit.cast(big_bf16, "e4m3fn")
    assert "astype(ml_dtypes.bfloat16)" in str(refused.value)
    assert fp8kit.cast(big_bf16.astype(ml_dtypes.bfloat16), "e4m3fn").shape == x.shape
    # Integer arguments: checked here in one line, not by the binding's signature dump.
    for kwargs, error, message in ((dict(threads=2**40), ValueError, "threads must be between 1 and 1024"),
                                   (dict(threads=True), TypeError, "threads must be an int, not bool"),
                                   (dict(rounding="stochastic", seed=-1), ValueError, "seed must be between 0 and"),
                                   (dict(rounding="stochastic", seed=2**64), ValueError, "seed must be between"),
                                   (dict(rounding="stochastic", seed=1.5), TypeError, "seed must be an int"),
                                   (dict(rounding="stochastic", seed="7"), TypeError, "seed must be an int")):
        with pytest.raises(error, match=message) as e:
            fp8kit.cast(x, "e4m3fn", **kwargs)
        assert "\n" not in str(e.value)
    # A flag and a number that were taken by truthiness and float(): "no" saturated, "2" scaled by 2.
    for kwargs, message in ((dict(saturate="no"), "saturate must be True or False, not str"),
                            (dict(saturate=1), "saturate must be True or False, not int"),
                            (dict(scale="2"), "scale must be a number, not str"),
                            (dict(scale=True), "scale must be a number, not bool")):
        with pytest.raises(TypeError, match=message):
            fp8kit.cast(x, "e4m3fn", **kwargs)
    assert fp8kit.cast(x, "e4m3fn", rounding="stochastic", seed=np.uint64(2**64 - 1)).shape == (2,)
    assert fp8kit.cast(x, "e4m3fn", saturate=np.True_, scale=np.float32(2)).view(np.uint8).tolist() == [0x40, 0x48]
    # One value of an array is a number, whatever its dimensions (NumPy 2 refuses float() of a 1-element 1-D array,
    # which refused np.array([2.0]) where torch.tensor([2.0]) was taken); a bool or complex array is not.
    for scale in (np.array([2.0], np.float32), np.array([[2.0]]), np.array(2), np.float16(2)):
        assert fp8kit.cast(x, "e4m3fn", scale=scale).view(np.uint8).tolist() == [0x40, 0x48], scale
    for scale, message in ((np.array(True), "not a bool ndarray"), (np.array([1 + 0j]), "not a complex128 ndarray"),
                           (np.array([2.0, 2.0]), "not ndarray")):
        with pytest.raises(TypeError, match=f"scale must be a number, {message}"):
            fp8kit.cast(x, "e4m3fn", scale=scale)


def test_a_scale_past_float32s_range_is_refused():
    """scale=1e300 became an infinite float32 scale (every code NaN) and 10**400 a bare OverflowError."""
    x = np.ones(4, np.float32)
    for bad in (1e300, -1e39, 10**400):
        with pytest.raises(ValueError, match="scale must be a") as e:
            fp8kit.cast(x, "e4m3fn", scale=bad)
        assert "\n" not in str(e.value) and len(str(e.value)) < 200
    assert fp8kit.cast(x, "e4m3fn", scale=np.float64(2.0)).astype(np.float32)[0] == 2.0
    # A nonzero scale below float32's smallest subnormal became 0 unseen (every code 0): refused like an overflow.
    for tiny in (1e-46, -7e-46):
        with pytest.raises(ValueError, match="below float32's smallest subnormal"):
            fp8kit.cast(x, "e4m3fn", scale=tiny)
    assert fp8kit.cast(x, "e4m3fn", scale=0.0).view(np.uint8).tolist() == [0] * 4
    # An int is rounded to float32 once: 2**62 + 2**38 + 1 rounds up to 2**62 + 2**39 (through a float64 it was a
    # tie, rounded down to even), and 2**128 - 2**103 - 1 to the largest float32 (through float64: the overflow tie).
    from fp8kit._arrays import check_float32
    assert check_float32("scale", 2**62 + 2**38 + 1) == float(2**62 + 2**39)
    assert check_float32("scale", np.int64(2**62 + 2**38 + 1)) == float(2**62 + 2**39)
    for one in (np.array([2**62 + 2**38 + 1]), np.array([[2**62 + 2**38 + 1]], np.uint64)):  # not through a float64
        assert check_float32("scale", one) == float(2**62 + 2**39)
    assert check_float32("scale", -(2**128 - 2**103 - 1)) == -float(np.finfo(np.float32).max)
    with pytest.raises(ValueError, match="finite float32"):
        check_float32("scale", 2**128 - 2**103)


def test_out_sharing_memory_with_x_is_refused():
    # The kernels read a block of x while they write another: an out over x's own memory (float32 -> bfloat16 into
    # x's first half, say) came back corrupted without a word.
    x = np.linspace(-3, 3, 4096, dtype=np.float32)
    want = fp8kit.cast(x, "bfloat16")
    wide = x.copy()
    with pytest.raises(ValueError, match="out shares memory with x"):
        fp8kit.cast(wide, "bfloat16", out=wide.view(ml_dtypes.bfloat16)[:4096])
    with pytest.raises(ValueError, match="out shares memory with x"):
        fp8kit.cast(wide, "e4m3fn", out=wide.view(ml_dtypes.float8_e4m3fn)[:4096])
    assert np.array_equal(wide, x)  # refused before anything was written
    assert np.array_equal(fp8kit.cast(x, "bfloat16", out=np.empty(4096, ml_dtypes.bfloat16)), want)


def test_python_floats_are_rounded_once():
    """Lists, scalars and buffers of doubles go to FP8 from their exact values: 464.0000001 is past e4m3fn's
    overflow threshold 464 (NaN), where rounding through float32 (464.0, a tie) would give 448."""
    over = 464.0000001
    for x in (over, [over], np.float64(over), memoryview(np.array([over]))):
        assert np.isnan(fp8kit.cast(x, "e4m3fn").astype(np.float32)).all(), x
        assert (fp8kit.cast(x, "e4m3fn", saturate=True).astype(np.float32) == 448).all(), x
    assert fp8kit.cast([1, 2, True], "float32").tolist() == [1.0, 2.0, 1.0]  # ints and bools as numbers
    # ints past int64 are objects to NumPy: still numbers, read as float64
    assert np.isinf(fp8kit.cast(2**70, "e5m2").astype(np.float32))
    assert fp8kit.cast(2**70, "e5m2", saturate=True).astype(np.float32) == 57344
    assert fp8kit.cast([2**64, 1.5], "float32").tolist() == [2.0**64, 1.5]
    for other in (True, np.float64(1.0), np.int64(1), np.float32(1.0)):  # mixed with other numbers
        assert fp8kit.cast([2**70, other], "float32").tolist() == [2.0**70, 1.0], other
    with pytest.raises(ValueError, match="past float64's range"):
        fp8kit.cast(10**400, "e5m2")
    with pytest.raises(TypeError, match="not numbers"):
        fp8kit.cast([2**70, None], "e5m2")
    # With a scale or stochastic rounding (kernels that read float32) a list is read as float32, as before.
    assert fp8kit.cast([1.0, 2.5], "e4m3fn", scale=2.0).astype(np.float32).tolist() == [2.0, 5.0]
    assert fp8kit.cast(3.0, "e4m3fn", rounding="stochastic", seed=1).astype(np.float32) == 3.0
    with pytest.raises(ValueError, match=r"x is float64: cast x.astype\(np.float32\)"):
        fp8kit.cast(np.array([1.0]), "e4m3fn", scale=2.0)


def test_torch_tensors_in_and_out():
    torch = pytest.importorskip("torch")
    x = torch.linspace(-500, 500, 1001)
    q = fp8kit.cast(x, torch.float8_e4m3fn, saturate=True)
    assert isinstance(q, torch.Tensor) and q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert torch.equal(q.view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))  # PyTorch saturates e4m3fn
    back = fp8kit.cast(q, torch.bfloat16)
    assert back.dtype == torch.bfloat16 and torch.equal(back, q.to(torch.bfloat16))
    e5 = fp8kit.cast(torch.tensor([1e6, -1e6]), "e5m2")
    assert torch.equal(e5.view(torch.uint8), torch.tensor([1e6, -1e6]).to(torch.float8_e5m2).view(torch.uint8))
    assert fp8kit.cast(x.reshape(7, 143)[:, ::2], "e4m3fn").shape == (7, 72)  # strided: copied once
    # a tensor off the CPU: one line naming its device (a meta tensor stands in where there is no GPU)
    with pytest.raises(ValueError, match=r"the tensor is on meta: .*move it with \.cpu\(\)"):
        fp8kit.cast(torch.empty(4, device="meta"), "e4m3fn")
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA backend"):
            fp8kit.cast(x.cuda(), "e4m3fn")
    # tensors go to the library as they are: out= views of one buffer that overlap x are refused, adjacent ones
    # written, also across dtypes (FP8 codes in the bytes of a float32 output)
    buf = torch.zeros(8)
    with pytest.raises(ValueError, match="out shares memory with x"):
        fp8kit.cast(buf[:4], "float32", out=buf[2:6])
    buf[:4] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert fp8kit.cast(buf[:4], "float32", out=buf[4:]) is not None and torch.equal(buf[4:], buf[:4])
    f = torch.zeros(8)
    codes_in_f = f.view(torch.uint8)[28:32].view(torch.float8_e4m3fn)  # the bytes of f[7]
    with pytest.raises(ValueError, match="out shares memory with x"):
        fp8kit.cast(codes_in_f, "float32", out=f[4:])
    assert torch.equal(fp8kit.cast(codes_in_f, "float32", out=f[:4]), torch.zeros(4))
    # the library's array arguments take a tensor only when its memory is its elements, in order: not a transpose,
    # a negated view, or a tensor off the CPU (the Python layer makes each of them so first)
    out8 = torch.empty(16, dtype=torch.uint8)
    for bad in (torch.ones(4, 4).t(), torch.ones(16)._neg_view(), torch.empty(16, device="meta")):
        with pytest.raises(TypeError):
            fp8kit._fp8kit.cast_to_fp8(bad, "float32", out8, "e4m3fn", False, 1.0, False, 0, None)
    fp8kit._fp8kit.cast_to_fp8(torch.ones(16), "float32", out8, "e4m3fn", False, 1.0, False, 0, None)
    assert torch.equal(out8, torch.full((16,), 0x38, dtype=torch.uint8))  # 1.0 in e4m3fn
    # every dtype the torch path reads, both ways (the dtype names are looked up once and kept)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q = fp8kit.cast(x.to(dtype), torch.float8_e5m2)
        assert torch.equal(q.view(torch.uint8), x.to(dtype).to(torch.float8_e5m2).view(torch.uint8)), dtype
        assert torch.equal(fp8kit.cast(q, dtype), q.to(dtype)), dtype


def test_torch_subclasses_layouts_and_autograd():
    """Found by an audit with torch 2.15: a tensor subclass came back as a NumPy array; sparse, nested and MKL-DNN
    tensors and neg views gave torch's internal errors; an out= tensor written in place kept its autograd version, so
    a backward that had saved it used the new values silently."""
    torch = pytest.importorskip("torch")

    class Sub(torch.Tensor):
        pass

    x = torch.linspace(-4, 4, 9)
    for t in (x.as_subclass(Sub), torch.nn.Parameter(x.clone(), requires_grad=False)):
        q = fp8kit.cast(t, "e4m3fn")
        assert isinstance(q, torch.Tensor) and q.dtype == torch.float8_e4m3fn, type(q)
        assert torch.equal(q.view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))
    assert isinstance(fp8kit.quantize(x.as_subclass(Sub)).data, torch.Tensor)
    # layouts whose memory is not the elements: one line, not torch's internals
    for t, layout in ((torch.eye(4).to_sparse(), "sparse_coo"), (torch.eye(4).to_sparse_csr(), "sparse_csr"),
                      (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "nested")):
        with pytest.raises(ValueError, match=f"x is a {layout} tensor: fp8kit reads dense"):
            fp8kit.cast(t, "e4m3fn")
    with pytest.raises(ValueError, match="x is a nested tensor"):  # (not its transpose's missing strides)
        fp8kit.cast(torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)]).transpose(1, 2), "e4m3fn")

    # Tensors with elements but no memory of their own (data_ptr() 0): a wrapper subclass (DTensor's and torchao's
    # pattern) and a FakeTensor were read at address 0 (a segmentation fault); they are refused in one line.
    class Wrapper(torch.Tensor):
        @staticmethod
        def __new__(cls, inner):
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

        def __init__(self, inner):
            self.inner = inner

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            return func(*[a.inner if isinstance(a, Wrapper) else a for a in args], **(kwargs or {}))

    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake = torch.randn(4, 8)
    codes = torch.zeros(2, 8, dtype=torch.float8_e4m3fn)
    for t in (Wrapper(torch.randn(4, 8)), fake):
        name = type(t).__name__
        for call, what in ((lambda: fp8kit.cast(t, "e4m3fn"), "x"), (lambda: fp8kit.quantize(t), "x"),
                           (lambda: fp8kit.amax(t), "x"),
                           (lambda: fp8kit.cast(torch.zeros(4, 8), "float32", out=t), "out"),
                           (lambda: fp8kit.scaled_mm(codes, codes.t(), 1.0, t[:1, :2] if t is fake else
                                                     Wrapper(torch.ones(1, 2))), "scale_b")):
            with pytest.raises(ValueError, match=f"{what} is a {name} without memory of its own"):
                call()
    for scale, message in ((torch.tensor(True), "not a bool Tensor"), (torch.tensor([1 + 0j]), "not a complex64 Tensor"),
                           (torch.tensor([2.0, 2.0]), "not Tensor")):
        with pytest.raises(TypeError, match=f"scale must be a number, {message}"):
            fp8kit.cast(x, "e4m3fn", scale=scale)
    assert torch.equal(fp8kit.cast(x, "e4m3fn", scale=torch.tensor([[2.0]])).view(torch.uint8),
                       (x * 2).to(torch.float8_e4m3fn).view(torch.uint8))
    with torch.inference_mode():
        inference = torch.empty(9, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="out is an inference tensor"):  # as torch refuses in-place writes to it
        fp8kit.cast(x, "e4m3fn", out=inference)
    with torch.inference_mode():
        assert fp8kit.cast(x, "e4m3fn", out=inference) is inference
    with pytest.raises(ValueError, match="out is a sparse_coo tensor"):
        fp8kit.cast(x, "float32", out=torch.zeros(9).to_sparse())
    with pytest.raises(ValueError, match="out is a nested tensor"):
        fp8kit.cast(x, "float32", out=torch.nested.nested_tensor([torch.ones(2), torch.ones(2)]))
    with pytest.raises(ValueError, match="out is a negated view"):
        fp8kit.cast(x, "float32", out=torch.zeros(9)._neg_view())
    # a neg view: the values it shows, not the memory under it
    neg = x._neg_view()
    assert torch.equal(fp8kit.cast(neg, "e4m3fn").view(torch.uint8), (-x).to(torch.float8_e4m3fn).view(torch.uint8))
    # out= requiring grad is refused while grad mode is on (as torch refuses it), written under no_grad (as torch
    # writes it: loading weights into parameters), views of such a leaf alike
    codes = torch.full((4,), 5.0).to(torch.float8_e4m3fn)
    for dtype in (torch.float32, torch.bfloat16):
        leaf = torch.zeros(2, 4, dtype=dtype, requires_grad=True)
        with pytest.raises(ValueError, match="out requires grad"):
            fp8kit.cast(codes, dtype, out=leaf[0])
        with torch.no_grad():
            fp8kit.cast(codes, dtype, out=leaf[1])
        assert torch.equal(leaf.detach()[1].float(), torch.full((4,), 5.0)) and not leaf.detach()[0].any()
    # an input requiring grad, while grad mode is on: its result would carry no gradient back, so it is refused
    # (training through the call would silently leave the tensor unchanged); detached or under no_grad it casts
    w = torch.randn(4, 4, requires_grad=True)
    with pytest.raises(ValueError, match=r"x requires grad: .*pass x.detach\(\), or call under torch.no_grad"):
        fp8kit.cast(w, "e4m3fn")
    # quantize's ScaledTensor is no tensor of a graph (quantizing a layer's weight for export): taken as it is
    assert torch.equal(fp8kit.quantize(w).data.view(torch.uint8), fp8kit.quantize(w.detach()).data.view(torch.uint8))
    with pytest.raises(ValueError, match="bias requires grad"):
        fp8kit.scaled_mm(codes.reshape(1, 4), codes.reshape(4, 1), 1.0, 1.0, torch.nn.Parameter(torch.zeros(1)),
                         out_dtype=torch.float32)
    with pytest.raises(ValueError, match="b requires grad"):
        fp8kit.scaled_mm(codes.reshape(1, 4), torch.zeros(4, 4).to(torch.float8_e4m3fn).requires_grad_(), 1.0, 1.0)
    want = w.detach().to(torch.float8_e4m3fn).view(torch.uint8)
    assert torch.equal(fp8kit.cast(w.detach(), "e4m3fn").view(torch.uint8), want)
    with torch.no_grad():
        assert torch.equal(fp8kit.cast(w, "e4m3fn").view(torch.uint8), want)
    with pytest.raises(ValueError, match=r"x holds int32 elements; fp8kit reads .*\.float\(\)"):
        fp8kit.cast(torch.ones(3, dtype=torch.int32), "e4m3fn")
    a = torch.ones(4, requires_grad=True)
    o = torch.full((4,), 2.0)
    z = (a * o).sum()  # saves o for backward
    before = o._version
    fp8kit.cast(codes, torch.float32, out=o)
    assert o._version > before and torch.equal(o, torch.full((4,), 5.0))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()
    # a call refused before writing leaves the version alone
    o = torch.full((4,), 2.0)
    z = (a * o).sum()
    with pytest.raises(ValueError, match="out shares memory with x"):
        fp8kit.cast(o, "float32", out=o)
    z.backward()
    assert torch.equal(a.grad, torch.full((4,), 2.0))
    with pytest.raises(ValueError, match=r"x is float64: cast x.float\(\)"):
        fp8kit.cast(torch.ones(3, dtype=torch.float64), "e4m3fn", scale=2.0)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class CtypesProducer:
    """A DLPack producer that is neither NumPy nor torch: float32 values in a ctypes buffer, exported as a hand-made
    DLManagedTensor in a "dltensor" capsule (DLPack's unversioned protocol). Counts the deleter's calls."""

    def __init__(self, values):
        self.buffer = (ctypes.c_float * len(values))(*values)
        self.shape = (ctypes.c_int64 * 1)(len(values))
        self.deleted = 0
        self._deleter = DELETER(self._delete)  # kept alive as long as the producer

    def _delete(self, managed):
        self.deleted += 1

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU

    def __dlpack__(self, **kwargs):
        m = DLManagedTensor()
        m.dl_tensor = DLTensor(ctypes.cast(self.buffer, ctypes.c_void_p), DLDevice(1, 0), 1, DLDataType(2, 32, 1),
                               self.shape, None, 0)
        m.deleter = self._deleter
        self._managed = m  # the struct must outlive the capsule
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype, new_capsule.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                                       ctypes.c_void_p]
        return new_capsule(ctypes.addressof(m), b"dltensor", None)


def test_a_dlpack_producer_without_numpy_or_torch_is_read_in_place():
    values = [0.5, 449.0, -465.0, 1e-9, 3.0]
    producer = CtypesProducer(values)
    q = fp8kit.cast(producer, "e4m3fn", saturate=True)
    assert isinstance(q, np.ndarray) and q.dtype == ml_dtypes.float8_e4m3fn
    want = np.clip(np.float32(values), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(q.view(np.uint8), want.view(np.uint8))
    # read in place: the array the library gets points into the producer's buffer
    from fp8kit._arrays import as_bits
    src = as_bits(producer, "numpy")
    assert src.bits.ctypes.data == ctypes.addressof(producer.buffer) and src.dtype_name == "float32"
    del src
    gc.collect()
    assert producer.deleted >= 1  # the consumer released what it took


def test_contiguous_inputs_reach_the_library_without_a_copy():
    from fp8kit._arrays import as_bits
    for a in (np.linspace(-3, 3, 64, dtype=np.float32), np.ones((4, 8), ml_dtypes.bfloat16),
              np.zeros(16, ml_dtypes.float8_e4m3fn), np.frombuffer(bytes(32), np.float16)):
        src = as_bits(a, "numpy")
        assert src.bits.ctypes.data == a.ctypes.data and src.shape == a.shape
    strided = np.linspace(-3, 3, 64, dtype=np.float32)[::2]
    assert as_bits(strided, "numpy").bits.ctypes.data != strided.ctypes.data  # copied once, contiguous


def test_torch_tensors_reach_the_library_without_a_copy():
    torch = pytest.importorskip("torch")
    from fp8kit._arrays import as_bits
    for t in (torch.randn(8, 16), torch.randn(32).to(torch.bfloat16), torch.zeros(64, dtype=torch.float8_e5m2)):
        src = as_bits(t, "torch")
        assert src.bits is t and src.array().ctypes.data == t.data_ptr()
    out = torch.empty(64, dtype=torch.float8_e4m3fn)
    pointer = out.data_ptr()
    r = fp8kit.cast(torch.linspace(-1, 1, 64), torch.float8_e4m3fn, out=out)
    assert r is out and out.data_ptr() == pointer and torch.equal(out.float(), torch.linspace(-1, 1, 64).to(
        torch.float8_e4m3fn).float())


def test_the_package_lists_its_api_not_its_imports():
    """dir(fp8kit) (tab completion) offered np, os, json, re, Any and the argument checkers beside the API."""
    listed = dir(fp8kit)
    assert listed == sorted(fp8kit.__all__), listed
    for name in fp8kit.__all__:
        assert hasattr(fp8kit, name), name
    assert "np" not in listed and "check_bool" not in listed


def test_unaligned_contiguous_arrays_are_copied_not_refused():
    """A contiguous array at an odd address (a view into a safetensors file whose header length is not a multiple
    of 8, a byte buffer) was refused by the element-wise paths ("the elements are not aligned to their size"): it is
    read through an aligned copy, with the aligned array's results; an unaligned out= is refused in one line."""
    buf = np.zeros(8 * 8 + 1, np.uint8)
    u = buf[1:].view(np.float64)
    u[:] = np.arange(8) / 3
    assert not u.flags.aligned and u.flags.c_contiguous
    a = u.copy()
    for dtype in ("e4m3fn", "bfloat16", "float16", "float32"):
        assert fp8kit.cast(u, dtype).tobytes() == fp8kit.cast(a, dtype).tobytes(), dtype
    assert fp8kit.amax(u) == fp8kit.amax(a)
    assert fp8kit.quantize(u).data.tobytes() == fp8kit.quantize(a).data.tobytes()
    f = buf[1:33].view(np.float32)
    assert fp8kit.cast(f, "bfloat16").tobytes() == fp8kit.cast(f.copy(), "bfloat16").tobytes()
    out = np.zeros(8 * 2 + 1, np.uint8)[1:].view(np.float16)
    with pytest.raises(ValueError, match="aligned"):
        fp8kit.cast(a, "float16", out=out)


def test_ml_dtypes_scalars_are_numbers():
    """ml_dtypes' scalars (kind "V" to NumPy) were refused as "not numbers" while np.float16(1.5) was taken."""
    assert float(fp8kit.cast(ml_dtypes.bfloat16(1.5), "float32")) == 1.5
    assert float(fp8kit.cast(ml_dtypes.float8_e4m3fn(1.5), "float32")) == 1.5
    got = fp8kit.cast([ml_dtypes.float8_e4m3fn(2.0), ml_dtypes.float8_e4m3fn(-0.5)], "float32")
    assert got.tolist() == [2.0, -0.5]
    with pytest.raises(TypeError, match="not numbers"):
        fp8kit.cast(np.void(b"ab"), "e4m3fn")  # other kind "V" scalars still are not


def test_saturating_cast_to_the_same_format_saturates_infinities():
    """e5m2 -> e5m2 with saturate=True was a copy, keeping +-Inf, where every other source gives +-57344."""
    inf = fp8kit.cast(np.array([np.inf, -np.inf, 1.0], np.float32), "e5m2")
    same = fp8kit.cast(inf, "e5m2", saturate=True)
    assert same.astype(np.float32).tolist() == [57344.0, -57344.0, 1.0]
    assert np.isinf(fp8kit.cast(inf, "e5m2").astype(np.float32)[:2]).all()  # non-saturating: kept


def test_finite_float64_past_float32s_range_is_refused():
    """amax and quantize of float64 [1e300, 1] gave 1.0 and [1, 1]: the value became an Inf, which both skip."""
    x = np.array([1e300, 1.0])
    with pytest.raises(ValueError, match="past float32's range"):
        fp8kit.amax(x)
    with pytest.raises(ValueError, match="past float32's range"):
        fp8kit.quantize(x)
    assert fp8kit.amax(np.array([np.inf, 2.0])) == 2.0  # an Inf of the input itself is skipped, as documented


def test_a_forked_child_runs_after_the_parent_ran_threads():
    """multiprocessing's fork workers hung on their first fp8kit call once the parent had run a multi-threaded
    kernel (GNU OpenMP's threads do not survive fork): a forked process runs fp8kit on one thread."""
    import multiprocessing
    x = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)
    want = fp8kit.cast(x, "e4m3fn", threads=2).view(np.uint8)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_cast_in_child, (x,)).get(timeout=120)
    assert got[0] == want.tobytes() and got[1] == want.tobytes()


def _cast_in_child(x):
    return (fp8kit.cast(x, "e4m3fn").view(np.uint8).tobytes(),
            fp8kit.cast(x, "e4m3fn", threads=2).view(np.uint8).tobytes())


def test_a_dense_input_keeps_its_layout():
    """A dense input in another order than C's (Fortran order, a transpose, channels_last) is cast in memory order,
    read in place, and its result has the input's layout, as NumPy's astype and torch's .to() give it; the values
    are those of the C-order cast. Stochastic rounding (whose draw follows the element's index) and out= take C
    order; a slice with a step is copied as before."""
    rng = np.random.default_rng(11)
    x = np.asfortranarray(rng.normal(0, 40, (64, 48)).astype(np.float32))
    q = fp8kit.cast(x, "e4m3fn", saturate=True)
    assert q.flags.f_contiguous and q.strides == x.astype(ml_dtypes.float8_e4m3fn).strides
    assert np.array_equal(q.view(np.uint8), fp8kit.cast(np.ascontiguousarray(x), "e4m3fn", saturate=True).view(np.uint8))
    back = fp8kit.cast(q, "float32", scale_inv=0.5)
    assert back.flags.f_contiguous and np.array_equal(back, q.astype(np.float32) * np.float32(0.5))
    y = np.transpose(rng.normal(size=(4, 5, 6)).astype(np.float32), (2, 0, 1))
    assert fp8kit.cast(y, "e5m2").strides == y.astype(ml_dtypes.float8_e5m2).strides
    assert fp8kit.cast(x, "e4m3fn", rounding="stochastic", seed=1).flags.c_contiguous
    assert fp8kit.cast(x[::2], "e4m3fn").flags.c_contiguous  # not dense: copied in C order
    torch = pytest.importorskip("torch")
    t = torch.randn(8, 6).t()
    for src in (t, torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)):
        want = src.to(torch.float8_e4m3fn)
        got = fp8kit.cast(src, torch.float8_e4m3fn, saturate=True)
        assert got.stride() == want.stride() and torch.equal(got.view(torch.uint8), want.view(torch.uint8))
