"""fp8kit.quantize / dequantize / amax / ScaledTensor from Python: scales and codes against a NumPy statement of the
one scale formula (fp8_max / amax, rounded once to float32; codes = the saturating cast of x * scale, ml_dtypes' bits),
16-bit inputs as their float32 widening, MX scales as powers of two, the codes as a view that outlives its
ScaledTensor, and the errors."""
import copy
import gc
import importlib.util
import pickle
import sys

import ml_dtypes
import numpy as np
import pytest

import fp8kit

E4M3_MAX = np.float32(448)


def blocks_amax(x, br, bc):
    rows, cols = x.shape
    out = np.zeros(((rows + br - 1) // br, (cols + bc - 1) // bc), np.float32)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = np.abs(x[i * br:(i + 1) * br, j * bc:(j + 1) * bc]).max()
    return out


@pytest.mark.parametrize("granularity,br,bc", [("tensor", 300, 200), ("row", 1, 200), ("block:1x128", 1, 128),
                                               ("block:128x128", 128, 128), ("col", 300, 1), ("block:3x5", 3, 5)])
def test_scales_and_codes_follow_the_formula(granularity, br, bc):
    x = np.random.default_rng(3).normal(0, 2, (300, 200)).astype(np.float32)
    x[5, 7] = 900.0  # an outlier in one block
    q = fp8kit.quantize(x, "e4m3fn", granularity)
    a = blocks_amax(x, br, bc)
    scale = (E4M3_MAX / a).astype(np.float32)
    assert q.scale_inv.shape == a.shape and q.data.shape == x.shape and q.data.dtype == ml_dtypes.float8_e4m3fn
    assert np.array_equal(q.scale_inv, (np.float32(1) / scale).astype(np.float32))
    per_element = np.repeat(np.repeat(scale, br, 0), bc, 1)[:300, :200]
    want = np.clip(x * per_element, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(q.data.view(np.uint8), want.view(np.uint8))
    back = fp8kit.dequantize(q)
    inv = np.repeat(np.repeat(q.scale_inv, br, 0), bc, 1)[:300, :200]
    assert back.dtype == np.float32 and np.array_equal(back, q.data.astype(np.float32) * inv)
    assert fp8kit.amax(x, granularity).shape == a.shape if granularity != "tensor" else fp8kit.amax(x) == a.max()


def test_sixteen_bit_inputs_quantize_as_their_widening_and_come_back_in_their_dtype():
    x = np.random.default_rng(4).normal(0, 1, (64, 300)).astype(np.float32)
    for dtype in (ml_dtypes.bfloat16, np.float16):
        narrow = x.astype(dtype)
        for g in ("row", "block:128x128", "mx32", "tensor"):
            a, b = fp8kit.quantize(narrow, "e5m2", g), fp8kit.quantize(narrow.astype(np.float32), "e5m2", g)
            assert np.array_equal(a.data.view(np.uint8), b.data.view(np.uint8)) and np.array_equal(a.scale_inv,
                                                                                                  b.scale_inv)
            assert a.dequantize().dtype == np.dtype(dtype)


def test_mx_scales_are_powers_of_two_and_rceil_differs_from_floor():
    x = np.random.default_rng(5).normal(0, 1, (8, 64)).astype(np.float32) * 3
    floor = fp8kit.quantize(x, "e4m3fn", "mx32")
    rceil = fp8kit.quantize(x, "e4m3fn", "mx32", scale_rounding="rceil")
    for q in (floor, rceil):
        mantissa, _ = np.frexp(q.scale_inv)
        assert q.scale_inv.shape == (8, 2) and np.all(mantissa == 0.5)
    assert rceil.granularity == "mx32-rceil" and not np.array_equal(floor.scale_inv, rceil.scale_inv)
    pow2 = fp8kit.quantize(x, "e4m3fn", "row", scale_rounding="pow2")
    assert np.all(np.frexp(pow2.scale_inv)[0] == 0.5)


def test_shapes_views_and_lifetime():
    x = np.arange(2 * 3 * 40, dtype=np.float32).reshape(2, 3, 40) - 100
    q = fp8kit.quantize(x, "e4m3fn", "row")
    assert q.data.shape == (2, 3, 40) and q.scale_inv.shape == (2, 3, 1) and q.dequantize().shape == (2, 3, 40)
    codes, scales = q.data, q.scale_inv
    assert np.shares_memory(codes, q.data)  # a view of the codes fp8kit wrote, not a copy
    want = codes.view(np.uint8).copy()
    del q
    gc.collect()
    assert np.array_equal(codes.view(np.uint8), want) and scales.shape == (2, 3, 1)  # the views keep it alive
    assert fp8kit.quantize(np.zeros((0, 4), np.float32), "e4m3fn", "row").data.shape == (0, 4)


@pytest.mark.parametrize("shape", [(2, 3, 300), (4, 1, 2, 64), (300,), (0, 5, 256), (2, 3, 0), (7, 300)])
def test_scales_of_n_d_arrays_keep_the_leading_dimensions_where_each_block_is_in_one_row(shape):
    """Per row, block:1xC and MX scales of an N-D array are shaped shape[:-1] + (column blocks,), as PyTorch's and
    torchao's are (a (B, T, H) activation's 1x128 scales: (B, T, H/128)), in the flattened matrix's order; blocks
    that span rows keep the flattened matrix's grid. amax lays its blocks out the same way."""
    cols = shape[-1]
    rows = int(np.prod(shape[:-1])) if cols else 0
    x = np.random.default_rng(8).normal(0, 2, shape).astype(np.float32)
    flat_x = x.reshape(rows, cols)
    for granularity, bc in (("row", max(cols, 1)), ("block:1x128", 128), ("block:1x7", 7), ("mx32", 32),
                            ("mx32-rceil", 32), ("tensor", None), ("col", None), ("block:128x128", None),
                            ("block:2x16", None)):
        q, flat = fp8kit.quantize(x, "e4m3fn", granularity), fp8kit.quantize(flat_x, "e4m3fn", granularity)
        assert np.array_equal(q.data.view(np.uint8).reshape(rows, cols), flat.data.view(np.uint8)), granularity
        if bc is None or len(shape) == 2:  # the matrix's grid, as a 2-D array's
            want_shape = flat.scale_inv.shape
        else:
            want_shape = shape[:-1] + (-(-cols // bc),)
        assert q.scale_inv.shape == want_shape and repr(q).endswith(f"scales={want_shape})"), granularity
        assert np.array_equal(q.scale_inv.reshape(flat.scale_inv.shape), flat.scale_inv), granularity
        if granularity != "tensor":
            a, flat_a = fp8kit.amax(x, granularity), fp8kit.amax(flat_x, granularity)
            assert a.shape == want_shape and np.array_equal(a.reshape(flat_a.shape), flat_a), granularity
        if bc is not None and cols:  # each element's scale by broadcasting along its row's blocks
            inv = np.repeat(q.scale_inv, bc, axis=-1)[..., :cols]
            assert np.array_equal(q.dequantize(), q.data.astype(np.float32) * inv), granularity
    assert fp8kit.quantize(np.zeros((3, 0), np.float32), "e4m3fn", "row").scale_inv.shape == (3, 0)  # as (2, 3, 0)
    restored = pickle.loads(pickle.dumps(fp8kit.quantize(x, "e4m3fn", "block:1x128")))
    assert restored.scale_inv.shape == (shape[:-1] + (-(-cols // 128),) if len(shape) != 2 else (rows, 3))


def test_errors():
    x = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="unknown granularity"):
        fp8kit.quantize(x, "e4m3fn", "blocks:2")
    with pytest.raises(ValueError, match="FP8 format"):
        fp8kit.quantize(x, "float16")
    with pytest.raises(ValueError, match="for mx32"):
        fp8kit.quantize(x, "e4m3fn", "row", scale_rounding="rceil")
    with pytest.raises(ValueError, match="powers of two"):
        fp8kit.quantize(x, "e4m3fn", "mx32", scale_rounding="pow2")
    with pytest.raises(ValueError, match="scale_rounding must be"):
        fp8kit.quantize(x, "e4m3fn", scale_rounding="up")
    with pytest.raises(TypeError, match="granularity must be a string"):
        fp8kit.quantize(x, "e4m3fn", 128)
    with pytest.raises(TypeError, match="ScaledTensor"):
        fp8kit.dequantize(x)
    with pytest.raises(ValueError, match="gives float32"):
        fp8kit.quantize(x).dequantize("e5m2")
    with pytest.raises(ValueError, match="unknown granularity"):
        fp8kit.amax(x, "tile")
    with pytest.raises(TypeError, match="granularity must be a string"):
        fp8kit.amax(x, None)
    with pytest.raises(TypeError, match="margin must be an int"):
        fp8kit.quantize(x, margin=1.5)
    with pytest.raises(ValueError, match="margin does not apply to mx32"):
        fp8kit.quantize(x, "e4m3fn", "mx32", margin=1)
    with pytest.raises(ValueError, match="contradicts"):
        fp8kit.quantize(x, "e4m3fn", "mx32-rceil", scale_rounding="floor")
    for call in (lambda: fp8kit.quantize(x, threads=2.0), lambda: fp8kit.quantize(x).dequantize(threads="2"),
                 lambda: fp8kit.analyze(x, threads=2.0), lambda: fp8kit.amax(x, threads=2.0)):
        with pytest.raises(TypeError, match="threads must be an int"):
            call()
    with pytest.raises(TypeError, match="saturate must be True or False, not str"):
        fp8kit.quantize(x, saturate="no")
    with pytest.raises(TypeError, match="saturate must be True or False, not str"):
        fp8kit.analyze(x, saturate="no")
    # e8m0fnu holds MX's scales, not values: -1 came back NaN and the measure called it exact.
    with pytest.raises(ValueError, match="e8m0fnu is MX's scale format"):
        fp8kit.quantize(-x, "e8m0fnu")
    with pytest.raises(ValueError, match="e8m0fnu is MX's scale format"):
        fp8kit.analyze(-x, "e8m0fnu")


def test_analyze_refuses_bytes_names():
    x = np.ones((2, 32), np.float32)
    for call in (lambda: fp8kit.analyze(x, "e4m3fn", b"tensor"), lambda: fp8kit.analyze(x, b"e4m3fn", "tensor")):
        with pytest.raises(TypeError, match="take str names, not bytes"):  # was "... not 101" (iterated bytes)
            call()


def test_analyze_takes_a_format_as_a_dtype_object():
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(2, 32)
    assert fp8kit.analyze(x, ml_dtypes.float8_e4m3fn, "row") == fp8kit.analyze(x, "e4m3fn", "row")
    rows = fp8kit.analyze(x, [ml_dtypes.float8_e5m2, "e4m3fn"], "tensor")
    assert [r["format"] for r in rows] == ["e5m2", "e4m3fn"]
    assert fp8kit.analyze(x, np.dtype(ml_dtypes.float8_e5m2), "tensor")["format"] == "e5m2"
    rows = fp8kit.analyze(x, (f for f in ("e4m3fn", "e5m2")), np.array(["tensor", "row"]))  # any iterable of names
    assert [(r["format"], r["granularity"]) for r in rows] == [("e4m3fn", "tensor"), ("e4m3fn", "row"),
                                                               ("e5m2", "tensor"), ("e5m2", "row")]


def test_a_margin_past_floats_range_keeps_the_scales_finite():
    """scale = 448 / amax / 2^margin underflows float for a large margin: the scale is then FLT_MIN, so its inverse
    (2^126) and the dequantized values stay finite (the codes are zeros)."""
    q = fp8kit.quantize(np.float32([1.0, -2.0, 3.0]), margin=200)
    assert np.isfinite(q.scale_inv).all() and q.scale_inv[0, 0] == np.float32(2.0**126)
    assert np.array_equal(q.dequantize(), np.zeros(3, np.float32))


def test_analyze_float64_counts_what_float32_loses():
    """float64 is rounded to float32 before quantizing: nonzero values it reads as 0 are underflow in every row (they
    were reported exact), values past its range non-finite; the rest as the float32 array gives it."""
    tiny = np.full((4, 32), 1e-50)
    for r in fp8kit.analyze(tiny, ("e4m3fn", "e5m2"), ("tensor", "mx32")):
        assert r["underflow_count"] == 128 and not r["exact"] and not r["holds"] and r["max_rel_error"] == 1.0, r
    x = np.random.default_rng(2).normal(0, 1, (4, 64))
    want = fp8kit.analyze(x.astype(np.float32), "e4m3fn", "row")
    assert fp8kit.analyze(x, "e4m3fn", "row") == want
    x[1, 5], x[2, 7] = 1e300, -1e-60
    got = fp8kit.analyze(x, "e4m3fn", "row")
    assert got["nonfinite_count"] == 1 and got["underflow_count"] == want["underflow_count"] + 1, got
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        import torch
        assert fp8kit.analyze(torch.from_numpy(tiny), "e4m3fn", "tensor")["underflow_count"] == 128


def test_empty_arrays_quantize_and_analyze():
    for shape in ((0,), (0, 4), (5, 0), (3, 0, 4)):
        x = np.zeros(shape, np.float32)
        rows = fp8kit.analyze(x, granularity=("tensor", "row", "mx32"))
        assert [r["holds"] for r in rows] == [True, True, True], rows
        assert fp8kit.quantize(x).dequantize().shape == shape


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    x = torch.randn(16, 256)
    q = fp8kit.quantize(x, "e4m3fn", "block:1x128")
    assert q.data.dtype == torch.float8_e4m3fn and isinstance(q.scale_inv, torch.Tensor)
    assert q.dequantize().dtype == torch.float32 and q.dequantize().shape == x.shape
    q3 = fp8kit.quantize(x.reshape(2, 8, 256), "e4m3fn", "block:1x128")
    assert isinstance(q3.scale_inv, torch.Tensor) and tuple(q3.scale_inv.shape) == (2, 8, 2)
    assert torch.equal(q3.scale_inv.reshape(16, 2), fp8kit.quantize(x, "e4m3fn", "block:1x128").scale_inv)


def test_torch_inputs_give_the_numpy_results_bit_for_bit():
    """The library reads torch tensors in place (no NumPy view per call): every entry gives the bits the same values
    give as NumPy arrays, for each wide dtype (float64 rounded to float32 first), a transposed and a negated view, and
    every output dtype of dequantize."""
    torch = pytest.importorskip("torch")
    base = torch.randn(6, 260, generator=torch.Generator().manual_seed(3)) * 5
    negated = base._neg_view()  # memory holds base, the values are -base
    assert negated.is_neg()
    for t in (base, base.to(torch.bfloat16), base.to(torch.float16), base.double(), base.t(), negated):
        c = t.resolve_neg().contiguous()
        n = c.numpy() if t.dtype != torch.bfloat16 else c.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        for granularity in ("tensor", "row", "block:1x128", "mx32"):
            qt, qn = fp8kit.quantize(t, "e4m3fn", granularity), fp8kit.quantize(n, "e4m3fn", granularity)
            assert torch.equal(qt.data.view(torch.uint8), torch.from_numpy(qn.data.view(np.uint8))), granularity
            assert qt.scale_inv.numpy().tobytes() == qn.scale_inv.tobytes()
            for dtype in ("float32", "bfloat16", "float16"):
                dt, dn = qt.dequantize(dtype), qn.dequantize(dtype)
                assert isinstance(dt, torch.Tensor) and tuple(dt.shape) == dn.shape
                assert dt.contiguous().view(torch.uint8).numpy().tobytes() == dn.tobytes(), dtype
            at, an = fp8kit.amax(t, granularity), fp8kit.amax(n, granularity)
            if granularity == "tensor":
                assert at == an
            else:
                assert isinstance(at, torch.Tensor) and at.numpy().tobytes() == an.tobytes()


@pytest.mark.parametrize("granularity", ["tensor", "row", "col", "block:2x3", "mx32", "mx32-rceil"])
def test_scaled_tensors_pickle_and_deep_copy(granularity):
    """A ScaledTensor in a pickle (multiprocessing, a DataLoader worker, torch.save) or a deepcopy was refused
    ("cannot pickle 'ScaledTensor' object"): it now carries its codes, scales and dtype, bit for bit."""
    x = np.random.default_rng(7).standard_normal((5, 70)).astype(ml_dtypes.bfloat16)
    q = fp8kit.quantize(x, "e5m2", granularity)
    copies = [pickle.loads(pickle.dumps(q, protocol=p)) for p in range(pickle.HIGHEST_PROTOCOL + 1)]
    for r in copies + [copy.deepcopy(q)]:  # (protocols 0 and 1 were a TypeError)
        assert (r.format, r.granularity, r.shape, r.original_dtype) == ("e5m2", granularity, (5, 70), "bfloat16")
        assert np.array_equal(r.data.view(np.uint8), q.data.view(np.uint8))
        assert np.array_equal(r.scale_inv.view(np.uint32), q.scale_inv.view(np.uint32))
        assert np.array_equal(r.dequantize().view(np.uint16), q.dequantize().view(np.uint16))
    deep = copy.deepcopy(q)
    deep.data.view(np.uint8)[0, 0] ^= 1  # its own codes
    assert not np.array_equal(deep.data.view(np.uint8), q.data.view(np.uint8))


def test_a_scaled_tensor_state_is_checked_before_it_is_used():
    q = fp8kit.quantize(np.ones((4, 64), np.float32), "e4m3fn", "mx32")
    state = q._q.__getstate__()
    blank = fp8kit._fp8kit.ScaledTensor.__new__(fp8kit._fp8kit.ScaledTensor)
    bad_scale = bytearray(state[8])
    bad_scale[0:4] = np.float32(3.0).tobytes()  # not the power of two its E8M0 code says
    for i, value, message in ((7, state[7][:-1], "the codes do not hold rows x cols bytes"),
                              (8, state[8][:-4], "scale_inv does not hold one float32 per block"),
                              (8, bytes(bad_scale), "an MX scale differs from its E8M0 code"),
                              (9, b"", "the E8M0 scales do not match the granularity"),
                              (0, 2, "version 2; this fp8kit reads version 1"),
                              (4, "4", "a field of the wrong type"),
                              (3, "block:0x5", "unknown granularity")):
        bad = list(state)
        bad[i] = value
        with pytest.raises(ValueError, match=message):
            blank.__setstate__(tuple(bad))
    with pytest.raises(ValueError, match="10 fields are expected, not 9"):
        blank.__setstate__(state[:9])
    # The Python object's own fields too: a pickle whose shape did not match its codes loaded, and failed later.
    outer = q.__reduce_ex__(2)[2]
    for bad, error, message in (({**outer, "shape": (2,)}, ValueError, r"shape \(2,\) is not the 4 x 64 matrix"),
                                ({**outer, "_kind": "jax"}, ValueError, "kind must be 'numpy' or 'torch'"),
                                ({**outer, "_q": None}, TypeError, "ScaledTensor wraps what fp8kit.quantize"),
                                ({"_q": q._q}, ValueError, "not a ScaledTensor state"),
                                ([], ValueError, "not a ScaledTensor state")):
        with pytest.raises(error, match=message):
            fp8kit.ScaledTensor.__new__(fp8kit.ScaledTensor).__setstate__(bad)


def test_the_scaled_tensor_constructor_checks_what_it_wraps():
    q = fp8kit.quantize(np.ones((4, 6), np.float32))
    with pytest.raises(TypeError, match="ScaledTensor wraps what fp8kit.quantize"):
        fp8kit.ScaledTensor(np.ones(3), "numpy", (3,), "float32")
    with pytest.raises(ValueError, match="kind must be 'numpy' or 'torch'"):
        fp8kit.ScaledTensor(q._q, "jax", (4, 6), "float32")
    with pytest.raises(ValueError, match=r"shape \(5, 6\) is not the 4 x 6 matrix of the codes"):
        fp8kit.ScaledTensor(q._q, "numpy", (5, 6), "float32")
    for shape in ((6, 4), (24,), (2, 12)):  # the same count in another matrix: its scales would not fit it
        with pytest.raises(ValueError, match=rf"shape \({shape[0]},.*is not the 4 x 6 matrix"):
            fp8kit.ScaledTensor(q._q, "numpy", shape, "float32")
    with pytest.raises(ValueError, match="unknown dtype"):
        fp8kit.ScaledTensor(q._q, "numpy", (4, 6), "float33")
    assert fp8kit.ScaledTensor(q._q, "numpy", (2, 2, 6), "bf16").dequantize().shape == (2, 2, 6)


def test_save_refuses_a_scaled_tensor_whose_shape_was_changed(tmp_path):
    """save() sized a layout's scale tensor by the ScaledTensor's shape and copied the scales of its own grid: a
    256 x 4 per-row quantization given the shape (4, 256) wrote 256 scales into a 4-scale tensor (heap corruption).
    The library checks the shape against the codes' matrix, so a .shape set afterwards is refused too."""
    q = fp8kit.quantize(np.ones((256, 4), np.float32), "e4m3fn", "row")
    q.shape = (4, 256)
    path = tmp_path / "w.safetensors"
    with pytest.raises(ValueError, match=r"shape \[4, 256\] is not the 256 x 4 matrix of its codes"):
        fp8kit.save(path, {"w": q}, layout="fbgemm")
    assert not path.exists()


def test_torch_scaled_tensors_pickle_as_torch():
    torch = pytest.importorskip("torch")
    q = fp8kit.quantize(torch.randn(3, 40, dtype=torch.bfloat16), "e4m3fn", "row")
    r = pickle.loads(pickle.dumps(q))
    assert r.data.dtype == torch.float8_e4m3fn and r.dequantize().dtype == torch.bfloat16
    assert torch.equal(r.dequantize(), q.dequantize())


def test_results_are_released():
    """ScaledTensors, their codes' arrays and views of them are freed with their last reference: 200 quantizations
    of a 4 MiB matrix, each result viewed and dropped, leave the process's peak memory where the first ones took
    it (a leak would add 1 MiB of codes each, 200 MiB in all). (The extension turns off nanobind's exit-time leak
    report, which a torch view alive at exit made falsely.)"""
    import resource
    x = np.random.default_rng(3).standard_normal((1024, 1024)).astype(np.float32)
    for _ in range(20):
        q = fp8kit.quantize(x, granularity="row")
        view = q.data.T
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    for _ in range(200):
        q = fp8kit.quantize(x, granularity="row")
        view = q.data.T
        assert view.shape == (1024, 1024)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 50, f"peak memory grew by {grown_mib:.0f} MiB over 200 quantizations"
