#!/usr/bin/env python3
"""Writes the fuzzers' seed corpus, fuzz/corpus/<harness>/ (committed; run again after a format change).

    python3 fuzz/make_corpus.py BUILD BUILD_FUZZ

BUILD holds the fp8kit CLI and test_io (a normal build), BUILD_FUZZ the harnesses (scripts/sanitize.sh). Seeds:
valid files of every checkpoint layout (a small bf16 model quantized by `fp8kit quantize` into each), safetensors
files of every dtype, .npy files of every dtype, order and version, JSON texts and headers, numbers in every
syntax `fp8kit cast` reads, the header of a training checkpoint, and the malformed files test_io crafts
(test_files::save_for_fuzzing). Every seed is small (a few KB at most). The inputs with which the fuzzers found
bugs are kept beside them as found-<harness finding> (regression seeds, never removed here)."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SEPARATOR = b"\n=fp8kit-fuzz=\n"  # fuzz_support.hpp's kSeparator


def safetensors_image(tensors, metadata=None):
    """tensors: (name, dtype, shape, bytes) in order; the header unpadded (the reader accepts it)."""
    header, offset, data = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


def main(build, build_fuzz):
    cli = os.path.join(build, "tools", "fp8kit", "fp8kit")
    corpus = os.path.join(HERE, "corpus")
    # The inputs the fuzzers found bugs with (found-*: kept as regression seeds) stay; the rest is made again.
    for harness in os.listdir(corpus) if os.path.isdir(corpus) else []:
        for name in os.listdir(os.path.join(corpus, harness)):
            if not name.startswith("found-"):
                os.remove(os.path.join(corpus, harness, name))
    seeds = {}

    def seed(harness, name, data):
        d = os.path.join(corpus, harness)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode())
        seeds[harness] = seeds.get(harness, 0) + 1

    rng = np.random.default_rng(7)
    # safetensors: every dtype, a scalar, an empty tensor, metadata, an empty file.
    for dtype, np_type, shape in (("F32", np.float32, [2, 3]), ("F16", np.float16, [4]), ("F64", np.float64, [2]),
                                  ("I64", np.int64, []), ("I32", np.int32, [3]), ("I16", np.int16, [2]),
                                  ("I8", np.int8, [5]), ("U8", np.uint8, [0, 4]), ("BOOL", np.uint8, [2])):
        raw = (rng.standard_normal(int(np.prod(shape))) * 3).astype(np_type).tobytes()
        if dtype == "BOOL":
            raw = bytes([0, 1])
        seed("safetensors", f"dtype-{dtype}", safetensors_image([("t", dtype, shape, raw)]))
    for dtype in ("BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "U16", "U32", "U64", "C64",
                  "F4", "F6_E2M3", "F6_E3M2"):
        bits = {"BF16": 16, "U16": 16, "U32": 32, "U64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}.get(dtype, 8)
        count = 8
        seed("safetensors", f"dtype-{dtype}", safetensors_image([("t", dtype, [count], bytes(range(count * bits // 8)))]))
    seed("safetensors", "empty", safetensors_image([]))
    seed("safetensors", "metadata", safetensors_image([("a", "F32", [1], b"\0\0\x80?")], {"format": "pt", "k": "v"}))

    # A small bf16 model, quantized into every layout: the layout and safetensors harnesses' seeds.
    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        os.makedirs(model)
        w = (rng.standard_normal((4, 40)) * 0.1).astype(np.float32)
        bf16 = (w.view(np.uint32) >> 16).astype(np.uint16).tobytes()
        image = safetensors_image([("layers.0.mlp.weight", "BF16", [4, 40], bf16),
                                   ("layers.0.norm.weight", "BF16", [40], bf16[:80])], {"format": "pt"})
        with open(os.path.join(model, "model.safetensors"), "wb") as f:
            f.write(image)
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump({"model_type": "llama", "hidden_size": 40}, f)
        seed("layout", "unquantized", open(os.path.join(model, "config.json"), "rb").read() + SEPARATOR + image)
        for scheme, layout in (("fp8-block", "deepseek"), ("fp8-tensor", "compressed-tensors"),
                               ("fp8-channel", "compressed-tensors"), ("fp8-block", "compressed-tensors"),
                               ("fp8-tensor", "autofp8"), ("fp8-channel", "fbgemm"), ("mxfp8", "mxfp8"),
                               ("fp8-block", "native"), ("mxfp8", "native")):
            out = os.path.join(tmp, f"{scheme}-{layout}")
            subprocess.run([cli, "quantize", model, out, "--scheme", scheme, "--layout", layout, "--quiet"],
                           check=True, stdout=subprocess.DEVNULL)
            data = open(os.path.join(out, "model.safetensors"), "rb").read()
            config = open(os.path.join(out, "config.json"), "rb").read()
            seed("layout", f"{scheme}-{layout}", config + SEPARATOR + data)
            seed("layout", f"{scheme}-{layout}-no-config", data)
            seed("safetensors", f"{scheme}-{layout}", data)
            header = data[8:8 + struct.unpack("<Q", data[:8])[0]]
            seed("strict_json", f"header-{scheme}-{layout}", header)
            seed("strict_json", f"config-{scheme}-{layout}", config)

    # The sharded index over fuzz_sharded_index's two fixed shards, and variants of it.
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    index = {"metadata": {"total_size": 18}, "weight_map": {"a.weight": shard1, "a.weight_scale_inv": shard1, "b": shard2}}
    seed("sharded_index", "valid", json.dumps(index, indent=2))
    seed("sharded_index", "no-metadata", json.dumps({"weight_map": index["weight_map"]}))
    seed("sharded_index", "wrong-shard", json.dumps({"weight_map": dict(index["weight_map"], b=shard1)}))
    seed("sharded_index", "escape", json.dumps({"weight_map": dict(index["weight_map"], b="../" + shard2)}))
    seed("strict_json", "index", json.dumps(index))

    # .npy: every dtype, both orders, versions 1.0, 2.0 and 3.0, a scalar and an empty array.
    def npy(array, version=(1, 0)):
        import io
        buf = io.BytesIO()
        np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
        return buf.getvalue()
    for t in (np.float16, np.float32, np.float64):
        seed("npy", f"{np.dtype(t).name}-c", npy(rng.standard_normal((2, 3)).astype(t)))
    seed("npy", "float32-fortran", npy(np.asfortranarray(rng.standard_normal((3, 2)).astype(np.float32))))
    seed("npy", "scalar", npy(np.array(1.5, dtype=np.float32)))
    seed("npy", "empty", npy(np.zeros((0, 3), dtype=np.float32)))
    seed("npy", "version2", npy(np.arange(4, dtype=np.float32), (2, 0)))
    seed("npy", "version3", npy(np.arange(4, dtype=np.float32), (3, 0)))

    # JSON: the syntax's corners.
    for i, text in enumerate(['{}', '[]', '{"a":[1,2.5,-0,1e308,true,false,null,"\\u00e9\\ud83d\\ude00"]}',
                              '{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":1}}}}}}}}', '"\\u0000"', '  {"k": "v"}  ',
                              '{"a":1,"a":2}', '[1e-400, 123456789012345678901234567890]']):
        seed("strict_json", f"text-{i}", text)

    # Numbers in every syntax `fp8kit cast` reads.
    for i, text in enumerate(["1.5", "-0", "0.1", ".5", "1e-3", "2.5E+4", "0x1.8p3", "0X.Cp-2", "-0x1p-149", "inf",
                              "-Infinity", "nan", " 448 ", "65504", "1.0039062500000000001", "3.4028235677973366e38",
                              "1e-46", "0x1.fffffep127", "123456789012345678901234567890e-20", "1e400"]):
        seed("parse_number", f"number-{i}", text)

    # A training checkpoint's header (the harness puts its own data section behind it).
    header = subprocess.run([os.path.join(build_fuzz, "fuzz", "fuzz_train_checkpoint"), "-print_seed_header=1"],
                            check=True, capture_output=True).stdout
    seed("train_checkpoint", "header", header)
    seed("strict_json", "train-header", header)

    # The malformed files the io tests craft.
    with tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, FP8KIT_FUZZ_CORPUS_OUT=out)
        subprocess.run([os.path.join(build, "tests", "test_io"), "--gtest_filter=SafetensorsValidation.*:Npy.*"],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        for harness in os.listdir(out):
            for name in os.listdir(os.path.join(out, harness)):
                data = open(os.path.join(out, harness, name), "rb").read()
                if len(data) <= 65536:
                    seed(harness, name, data)
    for harness, n in sorted(seeds.items()):
        print(f"{harness}: {n} seeds")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
