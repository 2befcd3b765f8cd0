"""fp8kit.scaled_mm with torch._scaled_mm's semantics from Python: FP8 products in FP32 against a float64 reference
within the library's FP32 bound (docs/gemm.md), per-tensor and row-wise scales, both layouts of b, bias, bfloat16
output, the GEMV (M <= 4) and GEMM paths, and the errors."""
import ml_dtypes
import numpy as np
import pytest

import fp8kit

U = 2.0 ** -24


def reference(a, b, sa, sb, bias):
    out = (a.astype(np.float64) @ b.astype(np.float64)) * sa.astype(np.float64) * sb.astype(np.float64)
    if bias is not None:
        out += bias
    k = a.shape[1]
    bound = (2 * k + 8) * U * (np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)) * np.abs(sa * sb)) + \
        2 * U * np.abs(out) + 1e-30
    return out, bound


@pytest.mark.parametrize("m", [1, 3, 17, 64])
@pytest.mark.parametrize("rowwise", [False, True])
@pytest.mark.parametrize("column_major_b", [True, False])
def test_products_within_the_fp32_bound(m, rowwise, column_major_b):
    rng = np.random.default_rng(m)
    k, n = 200, 48
    a = rng.normal(0, 4, (m, k)).astype(ml_dtypes.float8_e4m3fn)
    w = rng.normal(0, 4, (n, k)).astype(ml_dtypes.float8_e5m2)  # the weights, N x K
    b = w.T if column_major_b else np.ascontiguousarray(w.T)
    sa = rng.uniform(0.5, 2, (m, 1)).astype(np.float32) if rowwise else np.float32(1.5)
    sb = rng.uniform(0.5, 2, (1, n)).astype(np.float32) if rowwise else np.float32(0.25)
    bias = rng.normal(0, 1, n).astype(np.float32)
    out = fp8kit.scaled_mm(a, b, sa if rowwise else float(sa), sb if rowwise else float(sb), bias=bias)
    want, bound = reference(a, b, np.asarray(sa, np.float32).reshape(-1, 1) if rowwise else np.float32(sa),
                            np.asarray(sb, np.float32).reshape(1, -1) if rowwise else np.float32(sb), bias)
    assert out.shape == (m, n) and out.dtype == np.float32
    assert np.all(np.abs(out - want) <= bound), np.max(np.abs(out - want) / bound)
    bf16 = fp8kit.scaled_mm(a, b, sa if rowwise else float(sa), sb if rowwise else float(sb), bias=bias,
                            out_dtype="bfloat16")
    assert bf16.dtype == np.dtype(ml_dtypes.bfloat16)
    assert np.array_equal(bf16, out.astype(ml_dtypes.bfloat16))  # the float32 result rounded once


def test_errors():
    a = np.ones((4, 32), ml_dtypes.float8_e5m2)
    b = np.ones((32, 8), ml_dtypes.float8_e5m2)
    with pytest.raises(ValueError, match="e5m2"):
        fp8kit.scaled_mm(a, b, 1.0, 1.0)
    a = a.astype(ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"b must be \(K, N\)"):
        fp8kit.scaled_mm(a, np.ones((31, 8), ml_dtypes.float8_e4m3fn), 1.0, 1.0)
    with pytest.raises(ValueError, match="scale_a must be"):
        fp8kit.scaled_mm(a, b, np.ones((4, 2), np.float32), 1.0)
    with pytest.raises(ValueError, match="scale_b must be"):
        fp8kit.scaled_mm(a, b, 1.0, np.ones((8, 1), np.float32))
    with pytest.raises(TypeError, match="float32"):
        fp8kit.scaled_mm(a, b, np.ones(1, np.float64), 1.0)
    with pytest.raises(ValueError, match="must be FP8"):
        fp8kit.scaled_mm(np.ones((4, 32), np.float32), b, 1.0, 1.0)
    with pytest.raises(ValueError, match="out_dtype must be float32, bfloat16 or float16"):
        fp8kit.scaled_mm(a, b, 1.0, 1.0, out_dtype="e4m3fn")
    with pytest.raises(ValueError, match="out_dtype=None is torch._scaled_mm's FP8 output"):
        fp8kit.scaled_mm(a, b, 1.0, 1.0, out_dtype=None)
    with pytest.raises(TypeError, match="scale_result must be a number"):
        fp8kit.scaled_mm(a, b, 1.0, 1.0, scale_result="2")
    with pytest.raises(TypeError, match="use_fast_accum must be True or False"):
        fp8kit.scaled_mm(a, b, 1.0, 1.0, use_fast_accum="yes")
    with pytest.raises(ValueError, match="a holds int32 elements; scaled_mm multiplies FP8 operands: quantize it"):
        fp8kit.scaled_mm(np.ones((4, 32), np.int32), b, 1.0, 1.0)
    with pytest.raises(TypeError, match="bias must be a number or a float32 array, bfloat16 or float16, not int32"):
        fp8kit.scaled_mm(a, b, 1.0, 1.0, bias=np.ones(8, np.int32))
    with pytest.raises(ValueError, match="bias"):
        fp8kit.scaled_mm(a, b, 1.0, 1.0, bias=np.ones(7, np.float32))


def test_scales_and_b_that_are_not_what_they_should_be():
    """None, a string or a bool as a scale said 'does not cast object' or named float64; a list as b raised
    AttributeError; a scale past float32's range became an infinity (NaN products) or a bare OverflowError."""
    a = np.ones((2, 3), np.float32).astype(ml_dtypes.float8_e4m3fn)
    b = np.ones((3, 4), np.float32).astype(ml_dtypes.float8_e4m3fn)
    for bad in (None, "1", True):
        with pytest.raises(TypeError, match="scale_a must be a number or a float32 array"):
            fp8kit.scaled_mm(a, b, bad, 1.0)
    with pytest.raises(TypeError, match="b must be an FP8 array"):
        fp8kit.scaled_mm(a, [[1.0] * 4] * 3, 1.0, 1.0)
    for bad in (1e300, 10**400):
        with pytest.raises(ValueError, match="scale_b must be a") as e:
            fp8kit.scaled_mm(a, b, 1.0, bad)
        assert "\n" not in str(e.value) and len(str(e.value)) < 200
    assert fp8kit.scaled_mm(a, b, np.float64(2.0), np.int64(3))[0, 0] == 18.0  # NumPy scalars are numbers


def test_empty_products_take_per_tensor_scales():
    # torch._scaled_mm takes one-value scales whatever M, N and K are; an empty side has no block, but the scale is
    # still the per-tensor one (it was refused as "must hold 0 values").
    for m, k, n in ((0, 32, 8), (4, 0, 8), (4, 32, 0)):
        a = np.ones((m, k), ml_dtypes.float8_e4m3fn)
        b = np.ones((n, k), ml_dtypes.float8_e4m3fn).T
        out = fp8kit.scaled_mm(a, b, 2.0, 3.0)
        assert out.shape == (m, n) and np.array_equal(out, np.zeros((m, n), np.float32)), (m, k, n)
    # K = 0 with row-wise scales of the right shapes (refused: "must hold 0 values"): zeros, plus the bias.
    a = np.ones((4, 0), ml_dtypes.float8_e4m3fn)
    b = np.ones((8, 0), ml_dtypes.float8_e4m3fn).T
    bias = np.arange(8, dtype=np.float32)
    out = fp8kit.scaled_mm(a, b, np.ones((4, 1), np.float32), np.ones((1, 8), np.float32), bias=bias)
    assert np.array_equal(out, np.tile(bias, (4, 1)))
    with pytest.raises(ValueError, match="scale_a must be one value"):
        fp8kit.scaled_mm(a, b, np.ones((3, 1), np.float32), 1.0)  # shapes still checked


def test_torch_scaled_mm_arguments_in_its_order():
    """A call written for torch._scaled_mm runs unchanged: bias positional, then scale_result (None), out_dtype,
    use_fast_accum (ignored: FP32 accumulation always); a bfloat16 or float16 bias widened exactly; a float16 output
    is the float32 one rounded once."""
    rng = np.random.default_rng(5)
    a = rng.normal(0, 2, (6, 40)).astype(ml_dtypes.float8_e4m3fn)
    b = rng.normal(0, 2, (40, 24)).astype(ml_dtypes.float8_e4m3fn)
    bias = rng.normal(0, 1, 24).astype(ml_dtypes.bfloat16)
    want = fp8kit.scaled_mm(a, b, 2.0, 0.5, bias=bias.astype(np.float32))
    got = fp8kit.scaled_mm(a, b, 2.0, 0.5, bias, None, "float32", True)
    assert np.array_equal(got, want)
    assert np.array_equal(fp8kit.scaled_mm(a, b, 2.0, 0.5, bias, 3.0, "float32"), want)  # no effect, as in torch
    assert np.array_equal(fp8kit.scaled_mm(a, b, 2.0, 0.5, bias.astype(np.float16).astype(np.float32)),
                          fp8kit.scaled_mm(a, b, 2.0, 0.5, bias.astype(np.float16)))
    half = fp8kit.scaled_mm(a, b, 2.0, 0.5, bias, out_dtype="float16")
    assert half.dtype == np.float16 and np.array_equal(half, want.astype(np.float16))
    with pytest.raises(TypeError, match="bias must be float32, bfloat16 or float16"):
        fp8kit.scaled_mm(a, b, 2.0, 0.5, np.ones(24, np.float64))


def test_torch_matches_torch_scaled_mm_semantics():
    torch = pytest.importorskip("torch")
    a = torch.randn(16, 64).to(torch.float8_e4m3fn)
    w = torch.randn(32, 64).to(torch.float8_e4m3fn)
    out = fp8kit.scaled_mm(a, w.t(), torch.tensor(2.0), torch.tensor(0.5))
    want = (a.float() @ w.float().t()) * 1.0
    assert isinstance(out, torch.Tensor) and torch.allclose(out, want, rtol=1e-5, atol=1e-4)
    # torch's own call, word for word (out_dtype given: its default would be an FP8 output)
    bias = torch.randn(32, dtype=torch.bfloat16)
    args = (a, w.t(), torch.tensor(2.0), torch.tensor(0.5), bias, None, torch.bfloat16, True)
    mine = fp8kit.scaled_mm(*args)
    theirs = torch._scaled_mm(*args)
    assert mine.dtype == theirs.dtype == torch.bfloat16
    assert torch.allclose(mine.float(), theirs.float(), rtol=1e-2, atol=1e-2)


def blocked_reference(a, b, sa_rows, sb_blocks):
    """float64 sum over K blocks of 128 of (a_blk @ b_blk) * sa_rows[i, kb] * sb_blocks[kb, j]; and the FP32 bound
    with every product weighted by its block's scales."""
    m, k = a.shape
    n = b.shape[1]
    out, weighted = np.zeros((m, n)), np.zeros((m, n))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for kb in range(-(-k // 128)):
        ks = slice(kb * 128, (kb + 1) * 128)
        scale = sa_rows[:, kb:kb + 1].astype(np.float64) * sb_blocks[kb:kb + 1, :].astype(np.float64)
        out += (a64[:, ks] @ b64[ks, :]) * scale
        weighted += (np.abs(a64[:, ks]) @ np.abs(b64[ks, :])) * np.abs(scale)
    bound = (2 * k + 8) * U * weighted + 2 * U * np.abs(out) + 1e-30
    return out, bound


@pytest.mark.parametrize("m", [2, 130])
@pytest.mark.parametrize("column_major_b", [True, False])
@pytest.mark.parametrize("recipe", ["1x128,128x128", "1x128,128x1", "128x128,128x1"])
def test_block_scales_as_torch_scaled_mm_takes_them(m, column_major_b, recipe):
    rng = np.random.default_rng(m)
    k, n = 300, 200  # K and N not multiples of 128: partial last blocks
    kb, nb, mb = 3, 2, -(-m // 128)
    a = rng.normal(0, 4, (m, k)).astype(ml_dtypes.float8_e4m3fn)
    w = rng.normal(0, 4, (n, k)).astype(ml_dtypes.float8_e4m3fn)
    b = w.T if column_major_b else np.ascontiguousarray(w.T)
    a_recipe, b_recipe = recipe.split(",")
    sa = rng.uniform(0.5, 2, (m, kb) if a_recipe == "1x128" else (mb, kb)).astype(np.float32)
    sb = rng.uniform(0.5, 2, (kb, nb) if b_recipe == "128x128" else (kb, n)).astype(np.float32)
    out = fp8kit.scaled_mm(a, b, sa, sb)
    sa_rows = sa if a_recipe == "1x128" else np.repeat(sa, 128, axis=0)[:m]
    sb_blocks = np.repeat(sb, 128, axis=1)[:, :n] if b_recipe == "128x128" else sb
    want, bound = blocked_reference(a, b, sa_rows, sb_blocks)
    assert np.all(np.abs(out - want) <= bound), np.max(np.abs(out - want) / bound)


@pytest.mark.parametrize("recipe", ["tensor", "row", "1x128,128x128", "1x128,128x1", "128x128,128x1"])
@pytest.mark.parametrize("column_major_b", [True, False])
def test_torch_operands_and_scales_give_the_numpy_bits(recipe, column_major_b):
    """Tensors (codes, scale tensors, bias, output) reach the library as they are: the same bits as NumPy arrays
    of the same values, for every scale shape (those the wrapper rearranges included) and output dtype."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    m, k, n = 130, 300, 200
    a = rng.normal(0, 4, (m, k)).astype(ml_dtypes.float8_e4m3fn)
    w = rng.normal(0, 4, (n, k)).astype(ml_dtypes.float8_e5m2)
    b = w.T if column_major_b else np.ascontiguousarray(w.T)
    shapes = {"tensor": ((), ()), "row": ((m, 1), (1, n)), "1x128,128x128": ((m, 3), (3, 2)),
              "1x128,128x1": ((m, 3), (3, n)), "128x128,128x1": ((2, 3), (3, n))}[recipe]
    sa, sb = (rng.uniform(0.5, 2, shape).astype(np.float32) for shape in shapes)
    bias = rng.normal(0, 1, n).astype(ml_dtypes.bfloat16)

    def as_torch(x):
        return torch.from_numpy(np.ascontiguousarray(x).view(np.uint8)).view(
            getattr(torch, x.dtype.name if x.dtype.name.startswith("float8") else "bfloat16"))

    at = as_torch(a)
    bt = as_torch(w).t() if column_major_b else as_torch(b)
    bias_t = as_torch(bias)
    for out_dtype in ("float32", "bfloat16", "float16"):
        got = fp8kit.scaled_mm(at, bt, torch.from_numpy(sa), torch.from_numpy(sb), bias_t, out_dtype=out_dtype)
        want = fp8kit.scaled_mm(a, b, sa, sb, bias, out_dtype=out_dtype)
        assert isinstance(got, torch.Tensor) and tuple(got.shape) == (m, n)
        assert got.view(torch.uint8).numpy().tobytes() == want.tobytes(), out_dtype


def test_bias_is_one_dimensional():
    """torch._scaled_mm's bias is (N,): a (N, 1) or (1, N) bias holding N values was taken as if it were."""
    a = np.ones((2, 4), ml_dtypes.float8_e4m3fn)
    b = np.ones((4, 3), ml_dtypes.float8_e4m3fn)
    assert fp8kit.scaled_mm(a, b, 1.0, 1.0, np.arange(3, dtype=np.float32)).tolist() == [[4, 5, 6], [4, 5, 6]]
    for bias in (np.ones((3, 1), np.float32), np.ones((1, 3), np.float32), np.ones(2, np.float32), 2.0):
        with pytest.raises(ValueError, match=r"bias must be 1-D \(N,\) = \(3,\)"):
            fp8kit.scaled_mm(a, b, 1.0, 1.0, bias)


def test_block_scale_shape_errors():
    a = np.ones((4, 256), ml_dtypes.float8_e4m3fn)
    b = np.ones((256, 8), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"\(M, ceil\(K/128\)\) = \(4, 2\)"):
        fp8kit.scaled_mm(a, b, np.ones((4, 3), np.float32), np.ones((2, 1), np.float32))
    with pytest.raises(ValueError, match=r"\(ceil\(K/128\), N\) = \(2, 8\)"):
        fp8kit.scaled_mm(a, b, np.ones((4, 2), np.float32), np.ones((3, 8), np.float32))
