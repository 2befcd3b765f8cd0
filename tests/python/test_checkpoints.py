"""fp8kit.inspect / quantize_checkpoint / dequantize_checkpoint / convert_checkpoint / load and `python -m fp8kit`:
the checkpoint functions run the CLI's commands in-process (their reports are the CLI's --json), load() gives
read-only views of the mapped file and ScaledTensors for quantized weights whose codes and scales are bit for bit
what fp8kit.quantize computes for the same weights, and errors are one-line Python exceptions that leave every file
as it was."""
import copy
import gc
import json
import pickle
import os
import struct
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import fp8kit

_DTYPES = {np.dtype(np.float32): "F32", np.dtype(ml_dtypes.bfloat16): "BF16", np.dtype(np.float16): "F16",
           np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8", np.dtype(ml_dtypes.float8_e5m2): "F8_E5M2",
           np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3"}


def write_safetensors(path, tensors):
    """A .safetensors file from {name: array} (the format: an 8-byte header length, a JSON header, the bytes)."""
    header, blobs, offset = {}, [], 0
    for name, a in tensors.items():
        data = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": _DTYPES[a.dtype], "shape": list(a.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


@pytest.fixture()
def model(tmp_path):
    """A small bf16 model: two linear weights (one 300 x 200, not a multiple of the 128 blocks), a norm and ids."""
    rng = np.random.default_rng(7)
    tensors = {
        "model.layers.0.mlp.up_proj.weight": rng.normal(0, 0.05, (300, 200)).astype(ml_dtypes.bfloat16),
        "model.layers.0.mlp.down_proj.weight": rng.normal(0, 0.02, (64, 300)).astype(ml_dtypes.bfloat16),
        "model.norm.weight": np.ones(64, ml_dtypes.bfloat16),
        "model.position_ids": np.arange(16, dtype=np.int64),
    }
    path = tmp_path / "model.safetensors"
    write_safetensors(path, tensors)
    return path, tensors


@pytest.mark.parametrize("scheme,layout,granularity", [("fp8-block", "deepseek", "block:128x128"),
                                                       ("fp8-channel", "fbgemm", "row"),
                                                       ("fp8-tensor", "autofp8", "tensor"),
                                                       ("mxfp8", "mxfp8", "mx32")])
def test_quantize_checkpoint_then_load_matches_quantize(model, tmp_path, scheme, layout, granularity):
    src, tensors = model
    dst = tmp_path / f"{layout}.safetensors"
    report = fp8kit.quantize_checkpoint(src, dst, scheme, layout)
    assert report["command"] == "quantize" and report["quantized"] == 2 and report["copied"] == 2
    assert report["layout"] == layout and report["scheme"] == scheme and report["bytes_out"] == os.path.getsize(dst)
    loaded = fp8kit.load(dst)
    assert sorted(loaded) == sorted(tensors)  # the scales belong to their weights
    for name in ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        q = loaded[name]
        assert isinstance(q, fp8kit.ScaledTensor) and q.format == "e4m3fn"
        assert q.granularity == fp8kit.quantize(tensors[name], "e4m3fn", granularity).granularity
        want = fp8kit.quantize(tensors[name], "e4m3fn", granularity)
        assert np.array_equal(q.data.view(np.uint8), want.data.view(np.uint8))
        assert np.array_equal(q.scale_inv, want.scale_inv)
        assert q.original_dtype == "bfloat16"
    assert np.array_equal(loaded["model.position_ids"], np.arange(16))
    assert loaded["model.norm.weight"].dtype == ml_dtypes.bfloat16


def test_inspect_reports_the_layout_and_the_pairs(model, tmp_path):
    src, _ = model
    plain = fp8kit.inspect(src)
    assert plain["layout"] is None and len(plain["tensors"]) == 4 and plain["quantized"] == []
    up = next(t for t in plain["tensors"] if t["name"] == "model.layers.0.mlp.up_proj.weight")
    assert up["dtype"] == "BF16" and up["shape"] == [300, 200] and up["e4m3fn_holds_at"] == "tensor"
    assert "e4m3fn_holds_at" not in fp8kit.inspect(src, analysis=False)["tensors"][0]
    dst = tmp_path / "q.safetensors"
    fp8kit.quantize_checkpoint(src, dst, "fp8-block")
    info = fp8kit.inspect(dst)
    assert info["layout"] == "deepseek" and len(info["quantized"]) == 2
    assert {q["granularity"] for q in info["quantized"]} == {"block:128x128"}
    assert info["quantized"][0]["scale"].endswith("weight_scale_inv")


def test_dequantize_checkpoint_gives_what_scaled_tensor_dequantize_gives(model, tmp_path):
    src, tensors = model
    q_path, back = tmp_path / "q.safetensors", tmp_path / "back.safetensors"
    fp8kit.quantize_checkpoint(src, q_path, "fp8-channel")
    report = fp8kit.dequantize_checkpoint(q_path, back, to="float32")
    assert report["command"] == "dequantize" and report["dequantized"] == 2
    quantized, restored = fp8kit.load(q_path), fp8kit.load(back)
    for name in ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        assert restored[name].dtype == np.float32
        assert np.array_equal(restored[name], quantized[name].dequantize("float32"))
        err = np.abs(restored[name] - tensors[name].astype(np.float32)).max()
        assert err <= np.abs(tensors[name].astype(np.float32)).max() / 16  # e4m3's 3 mantissa bits


def test_convert_checkpoint_casts_every_float_tensor(model, tmp_path):
    src, tensors = model
    dst = tmp_path / "f32.safetensors"
    report = fp8kit.convert_checkpoint(src, dst, np.float32)
    assert report["command"] == "convert" and report["cast"] == 3
    out = fp8kit.load(dst)
    with pytest.raises(ValueError, match="FP8 targets only"):
        fp8kit.convert_checkpoint(src, tmp_path / "no.safetensors", "float16", saturate=False)
    for name, a in tensors.items():
        assert np.array_equal(out[name], a.astype(np.float32) if a.dtype != np.int64 else a)


def test_load_gives_read_only_views_that_keep_the_file_mapped(model):
    src, tensors = model
    loaded = fp8kit.load(src)
    w = loaded["model.layers.0.mlp.up_proj.weight"]
    assert not w.flags.writeable and not w.flags.owndata
    with pytest.raises(ValueError):
        w[0, 0] = 1
    del loaded
    gc.collect()
    assert np.array_equal(w, tensors["model.layers.0.mlp.up_proj.weight"])  # still mapped


def test_load_as_torch_gives_copy_on_write_tensors_of_the_file(model, tmp_path):
    torch = pytest.importorskip("torch")
    src, tensors = model
    before = src.read_bytes()
    loaded = fp8kit.load(src, framework="torch")
    assert sorted(loaded) == sorted(tensors)
    for name, want in tensors.items():
        t = loaded[name]
        assert isinstance(t, torch.Tensor) and tuple(t.shape) == want.shape
        assert t.dtype == {"bfloat16": torch.bfloat16, "int64": torch.int64}[str(want.dtype)]
        bits = t.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16 else t.numpy()
        assert np.array_equal(bits, want.view(np.uint16) if want.dtype == ml_dtypes.bfloat16 else want)
    # torch has no read-only tensors: an in-place write changes the process's copy, never the file.
    w = loaded["model.layers.0.mlp.up_proj.weight"]
    w.mul_(2)
    assert float(w[0, 0]) == 2 * float(tensors["model.layers.0.mlp.up_proj.weight"][0, 0])
    assert src.read_bytes() == before
    assert np.array_equal(fp8kit.load(src)["model.layers.0.mlp.up_proj.weight"],
                          tensors["model.layers.0.mlp.up_proj.weight"])
    del loaded
    gc.collect()
    assert float(w[0, 0]) == 2 * float(tensors["model.layers.0.mlp.up_proj.weight"][0, 0])  # still mapped

    # FP8 tensors as torch's FP8 dtypes; a tensor at an offset its element size does not divide is copied aligned;
    # an empty tensor is an empty tensor.
    odd = tmp_path / "odd.safetensors"
    codes = np.array([0x3C, 0x7C, 0xFC, 0x7F, 0x01], np.uint8)
    values = np.array([1.5, -2.25, 3.0], np.float32)
    write_safetensors(odd, {"codes": codes.view(ml_dtypes.float8_e5m2), "pad": np.array([7, 8], np.uint8),
                            "values": values, "empty": np.zeros((0, 3), np.float32)})
    got = fp8kit.load(odd, framework="pt")
    assert got["codes"].dtype == torch.float8_e5m2 and np.array_equal(got["codes"].view(torch.uint8).numpy(), codes)
    assert got["values"].dtype == torch.float32 and np.array_equal(got["values"].numpy(), values)
    assert got["values"].data_ptr() % 4 == 0
    assert tuple(got["empty"].shape) == (0, 3) and got["empty"].dtype == torch.float32

    # Quantized weights: ScaledTensors of torch codes and scales, the same bits as framework="numpy" loads.
    dst = tmp_path / "block.safetensors"
    fp8kit.quantize_checkpoint(src, dst, "fp8-block", "deepseek")
    as_torch, as_numpy = fp8kit.load(dst, framework="torch"), fp8kit.load(dst)
    q, r = as_torch["model.layers.0.mlp.up_proj.weight"], as_numpy["model.layers.0.mlp.up_proj.weight"]
    assert isinstance(q, fp8kit.ScaledTensor) and isinstance(q.data, torch.Tensor)
    assert q.data.dtype == torch.float8_e4m3fn and isinstance(q.scale_inv, torch.Tensor)
    assert np.array_equal(q.data.view(torch.uint8).numpy(), r.data.view(np.uint8))
    assert np.array_equal(q.scale_inv.numpy(), r.scale_inv)
    assert isinstance(as_torch["model.position_ids"], torch.Tensor)


def test_load_refuses_an_unknown_framework(model):
    src, _ = model
    with pytest.raises(ValueError, match=r"framework must be 'numpy' or 'torch'.*not 'jax'"):
        fp8kit.load(src, framework="jax")


def test_load_refuses_a_weight_with_scales_of_two_layouts(tmp_path):
    # a DeepSeek block scale and a compressed-tensors scalar beside one weight: which dequantizes it is not in the file
    path = str(tmp_path / "two.safetensors")
    write_safetensors(path, {"m.weight": np.ones((4, 4), ml_dtypes.float8_e4m3fn),
                             "m.weight_scale_inv": np.ones((1, 1), np.float32),
                             "m.weight_scale": np.array(0.5, np.float32)})
    with pytest.raises(ValueError, match=r"'m.weight' has 2 scales of different layouts \('m.weight_scale_inv', "
                                         r"'m.weight_scale'\)"):
        fp8kit.load(path)
    assert fp8kit.inspect(path)["layout"] is None


def test_load_reads_an_empty_weight_with_a_per_tensor_scale(tmp_path):
    # as another writer leaves an empty weight: one per-tensor scale that no element uses
    path = str(tmp_path / "empty.safetensors")
    write_safetensors(path, {"e.weight": np.zeros((0, 256), ml_dtypes.float8_e4m3fn),
                             "e.weight_scale": np.array(0.5, np.float32)})
    e = fp8kit.load(path)["e.weight"]
    assert isinstance(e, fp8kit.ScaledTensor) and e.shape == (0, 256) and e.scale_inv.size == 0
    assert e.dequantize().shape == (0, 256)
    with pytest.raises(ValueError, match=r"'e.weight' has shape \[0, 256\]; empty tensors are not quantized"):
        fp8kit.save(str(tmp_path / "again.safetensors"), {"e.weight": e})
    assert not os.path.exists(tmp_path / "again.safetensors")


def test_errors_are_one_line_exceptions_and_leave_files_alone(model, tmp_path):
    src, _ = model
    dst = tmp_path / "exists.safetensors"
    dst.write_bytes(b"keep me")
    with pytest.raises(ValueError, match=r"exists; pass force=True to replace it"):  # the Python spelling
        fp8kit.quantize_checkpoint(src, dst, "fp8-block")
    assert dst.read_bytes() == b"keep me"
    assert fp8kit.quantize_checkpoint(src, dst, "fp8-block", force=True)["quantized"] == 2
    # A path that is not there is FileNotFoundError (an OSError, as load() and open() raise), not ValueError.
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fp8kit.inspect(tmp_path / "missing.safetensors")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        fp8kit.quantize_checkpoint(tmp_path / "missing", tmp_path / "x.safetensors", "fp8-block")
    with pytest.raises(FileNotFoundError, match="'.*x.safetensors': the directory '.*nowhere' does not exist; create it first"):
        fp8kit.quantize_checkpoint(src, tmp_path / "nowhere" / "x.safetensors", "fp8-block")
    # to= is named as the caller wrote it (the CLI's message said "not 'f64'" for to="float64").
    with pytest.raises(ValueError, match="not 'float64'"):
        fp8kit.dequantize_checkpoint(src, tmp_path / "f64.safetensors", to="float64")
    # The CLI's options in a message are spelled as the Python arguments, a path holding "--force" as it is.
    with pytest.raises(FileNotFoundError, match=r"'.*model--force' does not exist"):
        fp8kit.inspect(str(tmp_path / "model--force"))
    with pytest.raises(FileNotFoundError, match="missing.safetensors' does not exist"):
        fp8kit.load(tmp_path / "missing.safetensors")
    with pytest.raises(ValueError, match="unknown scheme 'fp8-row'"):
        fp8kit.quantize_checkpoint(src, tmp_path / "x.safetensors", "fp8-row")
    with pytest.raises(ValueError, match="already quantized"):
        fp8kit.quantize_checkpoint(dst, tmp_path / "y.safetensors", "fp8-block")
    with pytest.raises(ValueError, match="has no quantized FP8 weights"):
        fp8kit.dequantize_checkpoint(src, tmp_path / "z.safetensors")
    with pytest.raises(ValueError, match="unknown dtype"):
        fp8kit.dequantize_checkpoint(dst, tmp_path / "z.safetensors", to="int4")
    with pytest.raises(TypeError, match="must be a path"):
        fp8kit.inspect(3)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(ValueError) as e:
        fp8kit.load(bad)
    assert "\n" not in str(e.value)
    for p in (tmp_path / "x.safetensors", tmp_path / "y.safetensors", tmp_path / "z.safetensors"):
        assert not p.exists()


def test_flags_paths_and_names_are_checked_before_anything_is_written(model, tmp_path):
    """force="no" replaced an existing output (read by its truthiness); a NUL byte cut a path short, so another file
    was written or read; ignore=[None] became the regex 'None'; a non-UTF-8 config.json escaped as
    UnicodeDecodeError. Each is now a one-line TypeError or ValueError, and nothing is written."""
    src, _ = model
    dst = tmp_path / "exists.safetensors"
    dst.write_bytes(b"keep me")
    for call in (lambda: fp8kit.quantize_checkpoint(src, dst, "fp8-block", force="no"),
                 lambda: fp8kit.dequantize_checkpoint(src, dst, force=1),
                 lambda: fp8kit.convert_checkpoint(src, dst, "e5m2", saturate="no", force=True),
                 lambda: fp8kit.inspect(src, analysis="no"),
                 lambda: fp8kit.quantize_checkpoint(src, tmp_path / "o.safetensors", "fp8-block", ignore=[None]),
                 lambda: fp8kit.quantize_checkpoint(src, tmp_path / "o.safetensors", "fp8-block", ignore=5),
                 lambda: fp8kit.quantize_checkpoint(src, tmp_path / "o.safetensors", "fp8-block", format=None)):
        with pytest.raises(TypeError, match=r"must be|must hold|must be given") as e:
            call()
        assert "\n" not in str(e.value)
    assert dst.read_bytes() == b"keep me"
    with pytest.raises(ValueError, match="NUL byte"):
        fp8kit.quantize_checkpoint(src, str(dst) + "\0.bak", "fp8-block", force=True)
    with pytest.raises(ValueError, match="NUL byte"):
        fp8kit.load(str(src) + "\0x")
    assert dst.read_bytes() == b"keep me" and not (tmp_path / "o.safetensors").exists()
    assert set(fp8kit.load(os.fsencode(src))) == set(fp8kit.load(src))  # a bytes path is a path
    out = tmp_path / "e5m2.safetensors"  # the format as a dtype object, as everywhere else
    assert fp8kit.quantize_checkpoint(src, out, "fp8-tensor", layout="native", format=ml_dtypes.float8_e5m2)[
        "format"] == "e5m2"
    d = tmp_path / "bad-config"
    d.mkdir()
    (d / "model.safetensors").write_bytes(src.read_bytes())
    (d / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(ValueError, match="config.json' is not UTF-8 text"):
        fp8kit.load(d)
    # A name the file system holds as bytes that are not UTF-8 (os.fsdecode gives lone surrogates): the binding
    # refused it with nanobind's multi-line "incompatible function arguments"; names and metadata too (std::bad_cast).
    odd = os.fsencode(tmp_path) + b"/\xfe.safetensors"
    with open(odd, "wb") as f:
        f.write(src.read_bytes())
    for call in (lambda: fp8kit.load(odd), lambda: fp8kit.inspect(odd),
                 lambda: fp8kit.save(odd, {"x": np.ones(2, np.float32)}, force=True)):
        with pytest.raises(ValueError, match=r"is not valid UTF-8 text .*rename it") as e:
            call()
        assert "\n" not in str(e.value)
    for tensors_given, metadata in (({"\udc80": np.ones(2, np.float32)}, None),
                                    ({"x": np.ones(2, np.float32)}, {"k": "\udc80"})):
        with pytest.raises(ValueError, match="not valid UTF-8 text.*safetensors headers are UTF-8"):
            fp8kit.save(tmp_path / "n.safetensors", tensors_given, metadata=metadata)
    assert not (tmp_path / "n.safetensors").exists()


def test_a_path_that_looks_like_an_option(model, tmp_path, monkeypatch):
    src, _ = model
    monkeypatch.chdir(tmp_path)
    assert fp8kit.quantize_checkpoint(src, "-out.safetensors", "fp8-tensor")["quantized"] == 2
    assert fp8kit.inspect("-out.safetensors")["layout"] == "compressed-tensors"


def run_module(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-m", "fp8kit", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_python_m_fp8kit_is_the_cli():
    r = run_module("formats", "--json")
    assert r.returncode == 0 and [f["name"] for f in json.loads(r.stdout)] == [f["name"] for f in fp8kit.formats()]
    r = run_module("cast", "449", "465", "--to", "e4m3fn", "--no-saturate", "--json")
    assert r.returncode == 0
    values = [row["value"] for row in json.loads(r.stdout)]
    assert values == [448, "nan"]  # 465 -> NaN without saturation
    r = run_module("quantize", "in.safetensors")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("fp8kit quantize:")
    r = run_module("--version")
    assert r.returncode == 0 and r.stdout.strip() == fp8kit.__version__
    cli = os.environ.get("FP8KIT_CLI")
    if cli:  # the binary and the module print the same bytes
        binary = subprocess.run([cli, "formats", "--json"], capture_output=True, text=True, timeout=60)
        assert binary.stdout == run_module("formats", "--json").stdout


def test_analyze_has_the_cli_json_keys_and_values(tmp_path):
    x = np.random.default_rng(5).standard_normal((96, 256)).astype(np.float32)
    x[3, 4] = 0.0
    x[7, 9] = 1e-12  # underflows per tensor
    np.save(tmp_path / "x.npy", x)
    r = run_module("analyze", str(tmp_path / "x.npy"), "--format", "e4m3fn,e5m2", "--granularity",
                   "tensor,row,block:1x128,mx32", "--json")
    assert r.returncode == 0, r.stderr
    cli_rows = json.loads(r.stdout)
    rows = fp8kit.analyze(x, ["e4m3fn", "e5m2"], ["tensor", "row", "block:1x128", "mx32"])
    assert len(rows) == len(cli_rows) == 8
    for mine, theirs in zip(rows, cli_rows):
        assert list(mine) == list(theirs)
        for key, value in theirs.items():
            if isinstance(value, float):
                assert mine[key] == pytest.approx(value, rel=1e-12), key
            else:
                assert mine[key] == value, key
    one = fp8kit.analyze(x.astype(ml_dtypes.bfloat16), "e4m3fn", "row")
    assert isinstance(one, dict) and one["granularity"] == "row" and one["holds"]
    assert fp8kit.analyze(np.float32([1e6, 1.0]), "e4m3fn", "tensor", saturate=False)["saturated_count"] == 0
    with pytest.raises(ValueError, match="unknown granularity"):
        fp8kit.analyze(x, "e4m3fn", "block:0x1")
    with pytest.raises(ValueError, match="FP8 format"):
        fp8kit.analyze(x, "float32")
    with pytest.raises(ValueError, match="analyze takes"):
        fp8kit.analyze(np.arange(4, dtype=np.float8_e4m3fn) if hasattr(np, "float8_e4m3fn")
                       else np.zeros(4, ml_dtypes.float8_e4m3fn))


def _header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


@pytest.mark.parametrize("granularity,layout", [("tensor", "autofp8"), ("row", "fbgemm"),
                                                ("block:128x128", "deepseek"), ("mx32", "mxfp8")])
def test_save_then_load_gives_the_same_bits(model, tmp_path, granularity, layout):
    _, tensors = model
    w = tensors["model.layers.0.mlp.up_proj.weight"]
    q = fp8kit.quantize(w, "e4m3fn", granularity)
    plain = {
        "norm": tensors["model.norm.weight"],                                    # bfloat16
        "ids": tensors["model.position_ids"],                                    # int64
        "mask": np.array([True, False, True]),                                   # bool
        "codes": fp8kit.cast(np.linspace(-3, 3, 7, dtype=np.float32), "e5m2"),   # an FP8 array as it is
        "t": np.arange(12, dtype=np.float32).reshape(3, 4).T,                    # not contiguous
    }
    path = tmp_path / "saved.safetensors"
    assert fp8kit.save(path, {"l.weight": q, **plain}, metadata={"format": "pt"}) is None
    assert _header(path)["__metadata__"]["format"] == "pt"
    assert fp8kit.inspect(path)["layout"] == layout
    back = fp8kit.load(path)
    assert sorted(back) == sorted(["l.weight", *plain])  # the scale belongs to its weight
    b = back["l.weight"]
    assert isinstance(b, fp8kit.ScaledTensor) and b.granularity == q.granularity and b.shape == q.shape
    assert np.array_equal(b.data.view(np.uint8), q.data.view(np.uint8))
    assert np.array_equal(b.scale_inv, q.scale_inv)
    for name, want in plain.items():
        want = np.ascontiguousarray(want)
        assert back[name].dtype == want.dtype and np.array_equal(back[name].view(np.uint8), want.view(np.uint8))


def test_save_keeps_shapes_and_the_scales_a_scaled_tensor_uses(tmp_path):
    """An N-D ScaledTensor came back from load() as its (rows, cols) matrix, a 0-d array as shape (1,), and an MX
    ScaledTensor whose scale_inv was written into (a view dequantize reads) was saved with its old E8M0 codes and
    could be pickled but never unpickled."""
    path = tmp_path / "s.safetensors"
    x = np.random.default_rng(2).normal(0, 1, (2, 3, 256)).astype(np.float32)
    for granularity in ("row", "mx32", "tensor", "block:128x128"):  # (only the native layout stores N-D weights)
        q = fp8kit.quantize(x, "e4m3fn", granularity)
        fp8kit.save(path, {"w": q, "step": np.array(7, np.int64)}, layout="native", force=True)
        back = fp8kit.load(path)
        assert back["step"].shape == () and back["step"] == 7
        b = back["w"]
        assert b.shape == (2, 3, 256) and b.data.shape == (2, 3, 256) and b.scale_inv.shape == q.scale_inv.shape
        assert np.array_equal(b.scale_inv, q.scale_inv) and np.array_equal(b.dequantize(), q.dequantize())
    q = fp8kit.quantize(x.reshape(6, 256), "e4m3fn", "mx32")
    q.scale_inv[1, 0] *= 4  # another power of two: the tensor now dequantizes with it
    want = q.dequantize()
    for copied in (copy.deepcopy(q), pickle.loads(pickle.dumps(q))):
        assert np.array_equal(copied.scale_inv, q.scale_inv) and np.array_equal(copied.dequantize(), want)
    fp8kit.save(path, {"w": q}, force=True)
    assert np.array_equal(fp8kit.load(path)["w"].dequantize(), want)
    before = path.read_bytes()
    q.scale_inv[0, 1] = 3.0  # no E8M0 code holds it
    for call in (lambda: pickle.dumps(q), lambda: copy.deepcopy(q),
                 lambda: fp8kit.save(path, {"w": q}, force=True)):
        with pytest.raises(ValueError, match=r"scale_inv holds 3.0 at block 1, which no E8M0 scale is"):
            call()
    assert path.read_bytes() == before


def test_save_in_other_layouts_and_what_it_refuses(model, tmp_path):
    _, tensors = model
    w = tensors["model.layers.0.mlp.up_proj.weight"]
    path = tmp_path / "w.safetensors"
    # compressed-tensors stores scales in the weight's dtype: exact ones (powers of two) are stored, others refused.
    pow2 = fp8kit.quantize(w, "e4m3fn", "row", scale_rounding="pow2")
    fp8kit.save(path, {"l.weight": pow2}, layout="compressed-tensors")
    assert fp8kit.inspect(path)["layout"] == "compressed-tensors"
    assert np.array_equal(fp8kit.load(path)["l.weight"].scale_inv, pow2.scale_inv)
    before = path.read_bytes()
    row, tensor = fp8kit.quantize(w, "e4m3fn", "row"), fp8kit.quantize(w, "e4m3fn", "tensor")
    refusals = [
        ({"l.weight": row}, {"layout": "compressed-tensors"}, ValueError, r"not exactly a bfloat16.*native layout"),
        ({"l.weight": row}, {"layout": "autofp8"}, ValueError, r"autofp8 layout cannot store fp8-channel.*layout='native'"),
        ({"l.weight": row}, {"layout": "gguf"}, ValueError, r"unknown layout 'gguf'"),
        ({"a.weight": row, "b.weight": tensor}, {}, ValueError,
         r"layouts differ.*layout='native', which stores every scheme \(per tensor, per row, 128x128 blocks, mx32\)"),
        ({"l.weight": fp8kit.quantize(w, "e4m3fnuz", "tensor")}, {}, ValueError,
         r"not e4m3fnuz \(no checkpoint layout stores it: quantize to e4m3fn, or e5m2 for layout='native'\)$"),
        ({"l.weight": fp8kit.quantize(w, "e5m2", "tensor")}, {}, ValueError, r"not e5m2 \(layout='native' stores e5m2\)$"),
        ({"l.weight": fp8kit.quantize(w, "e4m3fn", "block:1x128")}, {}, ValueError, r"no checkpoint layout stores"),
        ({"l.weight": row, "l.weight_scale": row.scale_inv}, {}, ValueError, r"l.weight_scale"),
        ({"x": np.ones(3, ">f4")}, {}, ValueError, r"big-endian"),
        ({"x": [1.0]}, {}, TypeError, r"NumPy array, a torch tensor or a ScaledTensor, not list"),
        ({1: np.ones(3)}, {}, TypeError, r"names must be str"),
        ({"x": np.ones(3)}, {"metadata": {"k": 1}}, TypeError, r"metadata must be a dict of str -> str"),
    ]
    for tensors_given, kwargs, error, message in refusals:
        with pytest.raises(error, match=message):
            fp8kit.save(path, tensors_given, force=True, **kwargs)
        assert path.read_bytes() == before  # a refused save leaves the file as it was
    with pytest.raises(ValueError, match=r"exists; pass force=True to replace it"):
        fp8kit.save(path, {"x": np.ones(3)})
    assert path.read_bytes() == before
    fp8kit.save(path, {"a.weight": row, "b.weight": tensor}, layout="native", force=True)  # every granularity
    back = fp8kit.load(path)
    assert fp8kit.inspect(path)["layout"] == "native"
    assert np.array_equal(back["a.weight"].scale_inv, row.scale_inv)
    assert np.array_equal(back["b.weight"].scale_inv, tensor.scale_inv)


def test_save_torch_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    x = torch.linspace(-2, 2, 12).reshape(3, 4)
    tensors = {"bf16": x.to(torch.bfloat16), "fp8": x.to(torch.float8_e4m3fn), "t": x.t(), "b": x > 0,
               "q": fp8kit.quantize(x, "e4m3fn", "row")}
    path = tmp_path / "torch.safetensors"
    fp8kit.save(path, tensors)
    back = fp8kit.load(path, framework="torch")
    for name in ("bf16", "fp8", "t", "b"):
        assert back[name].dtype == tensors[name].dtype and back[name].shape == tensors[name].shape
        assert torch.equal(back[name].view(torch.uint8), tensors[name].contiguous().view(torch.uint8))
    assert torch.equal(back["q"].data.view(torch.uint8), tensors["q"].data.view(torch.uint8))
    assert torch.equal(back["q"].scale_inv, tensors["q"].scale_inv)
    # Lazily negated and conjugated views are saved with their values (their memory holds the values before the
    # operation; torch refused to view them as bytes), and layouts without one dense block are refused in one line.
    views = {"neg": torch._neg_view(x), "conj": torch.tensor([1 + 2j, -3j], dtype=torch.complex64).conj()}
    fp8kit.save(path, views, force=True)
    back = fp8kit.load(path, framework="torch")
    assert torch.equal(back["neg"], -x) and torch.equal(back["conj"], views["conj"].resolve_conj())
    for value, layout in ((torch.eye(2).to_sparse(), "sparse_coo"),
                          (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "nested")):
        with pytest.raises(ValueError, match=f"tensor 's' is a {layout} tensor: fp8kit reads dense"):
            fp8kit.save(path, {"s": value}, force=True)
    assert torch.equal(fp8kit.load(path, framework="torch")["neg"], -x)  # the file as it was


def test_what_load_returns_saves_back_over_its_own_file(model, tmp_path):
    src, tensors = model
    dst = tmp_path / "q.safetensors"
    fp8kit.quantize_checkpoint(src, dst, "fp8-block", "deepseek")
    loaded = fp8kit.load(dst)  # read-only views of the mapped file, and ScaledTensors
    before = {name: (v.data.copy(), v.scale_inv.copy()) if isinstance(v, fp8kit.ScaledTensor) else v.copy()
              for name, v in loaded.items()}
    fp8kit.save(dst, loaded, force=True)  # written beside, renamed over: the old mapping stays valid
    again = fp8kit.load(dst)
    assert fp8kit.inspect(dst)["layout"] == "deepseek"
    for name, want in before.items():
        if isinstance(want, tuple):
            assert np.array_equal(again[name].data.view(np.uint8), want[0].view(np.uint8))
            assert np.array_equal(again[name].scale_inv, want[1])
        else:
            assert np.array_equal(again[name].view(np.uint8), want.view(np.uint8))
            assert np.array_equal(loaded[name].view(np.uint8), want.view(np.uint8))
