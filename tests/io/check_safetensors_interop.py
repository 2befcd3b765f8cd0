#!/usr/bin/env python3
"""Live interoperability with the reference safetensors implementation (PyPI `safetensors`, its Rust core).

Usage: check_safetensors_interop.py PATH_TO_safetensors_dump
Checks, through the safetensors_dump helper:
  - files written by safetensors.numpy.save_file (every dtype numpy and ml_dtypes can hold, FP8 included, scalars
    and empty tensors, metadata) are read by fp8kit identically: names, dtypes, shapes, offsets, bytes, metadata;
  - fp8kit's writer produces the same bytes as the reference writer for the same tensors;
  - files written by fp8kit (all 22 dtypes, F4/F6/C64 included) are read by safetensors.safe_open / deserialize;
  - sharded checkpoints written by either side are read by the other;
  - on malformed files (33 crafted, 600 seeded random mutations of a valid one) both accept or both refuse, except
    where fp8kit is documented to be stricter (duplicate keys, NUL in names: docs/checkpoints.md), and fp8kit's
    refusals are one line.
Needs numpy, safetensors and ml_dtypes (checks.require: a skip naming what is missing, a failure under CI).
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checks import check, require, summary  # noqa: E402

require("numpy", "safetensors", "ml_dtypes")
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import safetensors  # noqa: E402
from safetensors.numpy import save, save_file  # noqa: E402

DUMP = sys.argv[1]
RNG = np.random.default_rng(20240611)

NUMPY_DTYPES = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16,
                "I32": np.int32, "U32": np.uint32, "I64": np.int64, "U64": np.uint64, "F16": np.float16,
                "F32": np.float32, "F64": np.float64, "C64": np.complex64}
ML_DTYPES = {"BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
             "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz"}
ALL_DTYPES = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
              "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}
SHAPES = [(), (0,), (3,), (2, 3), (1, 2, 1, 4), (0, 5)]


def dump(*args):
    """Runs safetensors_dump; returns (exit code, parsed stdout or None, stderr)."""
    r = subprocess.run([DUMP, *args], capture_output=True, text=True)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 and r.stdout else None), r.stderr


def numpy_dtypes():
    """safetensors dtype name -> numpy dtype, for every dtype this numpy/ml_dtypes/safetensors can exchange."""
    out = dict(NUMPY_DTYPES)
    for code, name in ML_DTYPES.items():
        if ml_dtypes is None:
            continue
        dt = np.dtype(getattr(ml_dtypes, name))
        try:
            written = safetensors.deserialize(save({"x": np.zeros(2, dt)}))[0][1]["dtype"]
        except Exception as e:  # an older safetensors that does not know the dtype
            print(f"note: safetensors {safetensors.__version__} cannot save {name} ({str(e)[:60]}): {code} skipped")
            continue
        check(f"{name} is saved as {code}", written == code, written)
        out[code] = dt
    return out


def random_array(dt, shape):
    n = int(np.prod(shape, dtype=np.int64))
    if dt == np.bool_:
        return (RNG.integers(0, 2, n) == 1).reshape(shape)
    raw = RNG.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def header_of(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return n, json.loads(f.read(n))


def fp8kit_reads_reference(tmp, dtypes):
    tensors = {f"{code}.{i}": random_array(np.dtype(dt), shape)
               for code, dt in dtypes.items() for i, shape in enumerate(SHAPES)}
    metadata = {"format": "pt", "note": "unicode \u00e9\u4e2d \"quoted\"\n", "empty": ""}
    path = os.path.join(tmp, "ref.safetensors")
    save_file(tensors, path, metadata=metadata)
    rc, got, err = dump("read", path)
    check("fp8kit reads the reference's file", rc == 0, err)
    if rc != 0:
        return
    n, header = header_of(path)
    check("header size", got["header_size"] == n, f"{got['header_size']} != {n}")
    check("metadata", got["metadata"] == metadata, got["metadata"])
    check("tensor count", len(got["tensors"]) == len(tensors))
    reference = dict(safetensors.deserialize(open(path, "rb").read()))
    for t in got["tensors"]:
        name = t["name"]
        ref = reference[name]
        check(f"{name} dtype", t["dtype"] == ref["dtype"], f"{t['dtype']} != {ref['dtype']}")
        check(f"{name} shape", t["shape"] == list(tensors[name].shape), t["shape"])
        check(f"{name} offsets", t["data_offsets"] == header[name]["data_offsets"], t["data_offsets"])
        check(f"{name} bytes", bytes.fromhex(t["hex"]) == tensors[name].tobytes())

    # The same tensors through fp8kit's writer: byte for byte the reference's file (one metadata key, since the
    # reference writes a multi-key map in hash order).
    save_file(tensors, path, metadata={"format": "pt"})
    spec = {"metadata": {"format": "pt"},
            "tensors": [{"name": t["name"], "dtype": t["dtype"], "shape": t["shape"], "hex": t["hex"]}
                        for t in got["tensors"]]}
    spec_path = os.path.join(tmp, "spec.json")
    json.dump(spec, open(spec_path, "w"))
    ours = os.path.join(tmp, "ours.safetensors")
    rc, _, err = dump("write", ours, spec_path)
    check("fp8kit writes the spec", rc == 0, err)
    check("fp8kit's file is byte for byte the reference's", open(ours, "rb").read() == open(path, "rb").read())


def fp8kit_writes_reference_reads(tmp, dtypes):
    spec = {"metadata": {"format": "pt", "producer": "fp8kit"}, "tensors": []}
    for code, bits in ALL_DTYPES.items():
        for i, shape in enumerate([(), (4,), (2, 4), (0, 3), (4, 2, 1)]):
            n = int(np.prod(shape, dtype=np.int64))
            if n * bits % 8:
                continue  # a scalar of F4/F6 does not fill a byte
            raw = RNG.integers(0, 2 if code == "BOOL" else 256, n * bits // 8, dtype=np.uint8).tobytes()
            spec["tensors"].append({"name": f"{code}/{i}", "dtype": code, "shape": list(shape), "hex": raw.hex()})
    spec_path = os.path.join(tmp, "spec_all.json")
    json.dump(spec, open(spec_path, "w"))
    path = os.path.join(tmp, "all.safetensors")
    rc, _, err = dump("write", path, spec_path)
    check("fp8kit writes every dtype", rc == 0, err)
    if rc != 0:
        return
    n, header = header_of(path)
    check("header padded to 8 bytes", n % 8 == 0, n)
    for name, entry in header.items():
        bits = ALL_DTYPES.get(entry.get("dtype"), 0)
        if name != "__metadata__" and bits >= 8:
            check(f"{name} aligned", entry["data_offsets"][0] % (bits // 8) == 0, entry["data_offsets"])
    try:
        reference = dict(safetensors.deserialize(open(path, "rb").read()))
    except Exception as e:
        check("the reference reads fp8kit's file", False, str(e))
        return
    for t in spec["tensors"]:
        ref = reference.get(t["name"])
        check(f"{t['name']} present", ref is not None)
        if ref is None:
            continue
        check(f"{t['name']} dtype", ref["dtype"] == t["dtype"], ref["dtype"])
        check(f"{t['name']} shape", list(ref["shape"]) == t["shape"], ref["shape"])
        check(f"{t['name']} bytes", bytes(ref["data"]) == bytes.fromhex(t["hex"]))
    with safetensors.safe_open(path, framework="np") as f:
        check("safe_open metadata", f.metadata() == spec["metadata"], f.metadata())
        check("safe_open keys", sorted(f.keys()) == sorted(t["name"] for t in spec["tensors"]))
        for t in spec["tensors"]:
            if t["dtype"] in NUMPY_DTYPES:
                expected = np.frombuffer(bytes.fromhex(t["hex"]), NUMPY_DTYPES[t["dtype"]]).reshape(t["shape"])
                got = f.get_tensor(t["name"])  # compared as bytes: random C64/F* bits hold NaNs
                check(f"safe_open {t['name']}", got.dtype == expected.dtype and got.shape == expected.shape
                      and got.tobytes() == expected.tobytes())


def sharded_both_ways(tmp, dtypes):
    tensors = {f"layers.{i}.{code}": random_array(np.dtype(dt), (3, 5))
               for i, (code, dt) in enumerate(dtypes.items())}
    spec = {"metadata": {"format": "pt"},
            "tensors": [{"name": k, "dtype": dict(safetensors.deserialize(save({k: v})))[k]["dtype"],
                         "shape": list(v.shape), "hex": v.tobytes().hex()} for k, v in tensors.items()]}
    spec_path = os.path.join(tmp, "spec_sharded.json")
    json.dump(spec, open(spec_path, "w"))
    out = os.path.join(tmp, "sharded_fp8kit")
    os.mkdir(out)
    rc, files, err = dump("write-sharded", out, spec_path, "100")
    check("fp8kit writes a sharded checkpoint", rc == 0 and len(files) > 2, err)
    if rc != 0:
        return
    index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    check("index total_size", index["metadata"]["total_size"] == sum(v.nbytes for v in tensors.values()))
    check("index weight_map", sorted(index["weight_map"]) == sorted(tensors))
    for shard in sorted(set(index["weight_map"].values())):
        with safetensors.safe_open(os.path.join(out, shard), framework="np") as f:
            check(f"{shard} metadata", f.metadata() == {"format": "pt"})
            for k in f.keys():
                check(f"{k} in {shard}", index["weight_map"][k] == shard)
        for k, v in safetensors.deserialize(open(os.path.join(out, shard), "rb").read()):
            check(f"{k} bytes from {shard}", bytes(v["data"]) == tensors[k].tobytes())

    # The reference's files, sharded as huggingface_hub does, read by fp8kit.
    ref = os.path.join(tmp, "sharded_reference")
    os.mkdir(ref)
    names = sorted(tensors)
    groups = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map = {}
    for i, group in enumerate(groups):
        shard = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: tensors[k] for k in group}, os.path.join(ref, shard), metadata={"format": "pt"})
        weight_map.update({k: shard for k in group})
    total = sum(v.nbytes for v in tensors.values())
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(ref, "model.safetensors.index.json"), "w"), indent=2, sort_keys=True)
    rc, got, err = dump("read-checkpoint", ref)
    check("fp8kit reads the reference's sharded checkpoint", rc == 0, err)
    if rc == 0:
        check("weight_map", got["weight_map"] == weight_map)
        check("index metadata", got["index_metadata"] == {"total_size": str(total)}, got["index_metadata"])
        check("all tensors", [t["name"] for t in got["tensors"]] == names)
        for t in got["tensors"]:
            check(f"{t['name']} bytes (sharded)", bytes.fromhex(t["hex"]) == tensors[t["name"]].tobytes())


def image(header, data=b"", n=None):
    h = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(h) if n is None else n) + h + data


def tensor(name, dtype, shape, begin, end):
    return f'"{name}":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{begin},{end}]}}'


def differential(tmp):
    w = tensor("w", "F32", "[3]", 0, 12)
    cases = [  # (what, file bytes, fp8kit stricter than the reference by design)
        ("valid", image("{" + w + "}", bytes(12)), False),
        ("too short", b"\x01\x00", False),
        ("header too large", image("{}", n=100_000_001), False),
        ("header past the end", image("{}", n=50), False),
        ("empty header", image(""), False),
        ("leading whitespace", image(" \t\n{" + w + "}", bytes(12)), False),
        ("trailing whitespace", image("{" + w + "}\r\n  ", bytes(12)), False),
        ("trailing NUL", image("{" + w + "}\0", bytes(12)), False),
        ("byte-order mark", image(b"\xef\xbb\xbf{}"), False),
        ("not UTF-8", image(b'{"\xff":1}'), False),
        ("array root", image("[]"), False),
        ("deep nesting", image('{"__metadata__":{"a":' + "[" * 200 + "]" * 200 + "}}"), False),
        ("unknown dtype", image("{" + tensor("w", "f32", "[3]", 0, 12) + "}", bytes(12)), False),
        ("negative dimension", image("{" + tensor("w", "F32", "[-3]", 0, 12) + "}", bytes(12)), False),
        ("fractional dimension", image("{" + tensor("w", "F32", "[3.0]", 0, 12) + "}", bytes(12)), False),
        ("three offsets", image('{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12,12]}}', bytes(12)), False),
        ("size mismatch", image("{" + tensor("w", "F32", "[3]", 0, 10) + "}", bytes(10)), False),
        ("wrapping element count", image("{" + tensor("w", "U8", "[4294967296,4294967296]", 0, 0) + "}"), False),
        ("F4 misaligned", image("{" + tensor("w", "F4", "[3]", 0, 2) + "}", bytes(2)), False),
        ("F4 and F6", image("{" + tensor("a", "F4", "[4]", 0, 2) + "," + tensor("b", "F6_E3M2", "[4]", 2, 5) + "}",
                            bytes(5)), False),
        ("not from 0", image("{" + tensor("w", "F32", "[1]", 4, 8) + "}", bytes(8)), False),
        ("gap", image("{" + tensor("a", "F32", "[1]", 0, 4) + "," + tensor("b", "F32", "[1]", 8, 12) + "}",
                      bytes(12)), False),
        ("overlap", image("{" + tensor("a", "F32", "[3]", 0, 12) + "," + tensor("b", "F32", "[2]", 8, 16) + "}",
                          bytes(16)), False),
        ("ten aliases", image("{" + ",".join(tensor(f"t{i}", "F32", "[4]", 0, 16) for i in range(10)) + "}",
                              bytes(16)), False),
        ("past the end", image("{" + tensor("w", "F32", "[4]", 0, 16) + "}", bytes(12)), False),
        ("trailing bytes", image("{" + w + "}", bytes(13)), False),
        ("metadata null", image('{"__metadata__":null,' + w + "}", bytes(12)), False),
        ("metadata number", image('{"__metadata__":{"a":1}}'), False),
        ("unknown field", image('{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12],"x":1}}', bytes(12)), False),
        ("empty tensors", image("{" + tensor("a", "F32", "[0]", 0, 0) + "," + tensor("b", "F32", "[]", 0, 4) + "}",
                                bytes(4)), False),
        ("duplicate tensor", image("{" + w + "," + w + "}", bytes(12)), True),
        ("duplicate metadata key", image('{"__metadata__":{"a":"1","a":"2"}}'), True),
        ("NUL in a name", image("{" + tensor("a\\u0000b", "F32", "[3]", 0, 12) + "}", bytes(12)), True),
    ]
    for what, data, stricter in cases:
        path = os.path.join(tmp, "case.safetensors")
        open(path, "wb").write(data)
        try:
            safetensors.deserialize(data)
            reference_accepts = True
        except Exception:
            reference_accepts = False
        rc, _, err = dump("read", path)
        ours = rc == 0
        if rc not in (0, 2):
            check(f"differential '{what}': clean exit", False, f"exit {rc}: {err}")
        if not ours:
            check(f"differential '{what}': one line", err.count("\n") == 1 and err.startswith("error: "), err)
        if stricter:
            check(f"differential '{what}': fp8kit refuses", not ours)
            if reference_accepts:
                print(f"note: '{what}': the reference accepts it, fp8kit refuses it by design")
        else:
            check(f"differential '{what}': same verdict", ours == reference_accepts,
                  f"fp8kit {'accepts' if ours else 'refuses'}, safetensors {'accepts' if reference_accepts else 'refuses'}"
                  f" {err.strip()}")


def mutation_differential(tmp, count=600):
    """Seeded random mutations of a valid file (bytes flipped, cut, inserted; JSON tokens inserted; the length
    field nudged): both implementations must give the same verdict, except fp8kit's documented refusals."""
    rng = np.random.default_rng(7)
    spec = {"metadata": {"format": "pt"},
            "tensors": [{"name": "w", "dtype": "F64", "shape": [3], "hex": "00" * 24},
                        {"name": "b", "dtype": "U16", "shape": [3], "hex": "01" * 6},
                        {"name": "f", "dtype": "F4", "shape": [4], "hex": "2345"}]}
    spec_path = os.path.join(tmp, "spec_seed.json")
    json.dump(spec, open(spec_path, "w"))
    seed_path = os.path.join(tmp, "seed.safetensors")
    dump("write", seed_path, spec_path)
    seed = open(seed_path, "rb").read()
    tokens = [b"{", b"}", b"[", b"]", b",", b":", b'"', b"0", b"-1", b"1e9", b"18446744073709551615", b"\\u0000",
              b'"__metadata__"', b'"F4"', b"null", b" ", b"\t", b"\n"]
    agree = stricter = 0
    path = os.path.join(tmp, "mutant.safetensors")
    for _ in range(count):
        img = bytearray(seed)
        for _ in range(int(rng.integers(1, 4))):
            kind = int(rng.integers(5))
            if kind == 0 and img:
                img[int(rng.integers(len(img)))] = int(rng.integers(256))
            elif kind == 1 and len(img) > 1:
                del img[int(rng.integers(len(img))):]
            elif kind == 2:
                img.insert(int(rng.integers(len(img) + 1)), int(rng.integers(256)))
            elif kind == 3:
                at = int(rng.integers(len(img) + 1))
                img[at:at] = tokens[int(rng.integers(len(tokens)))]
            elif kind == 4 and len(img) >= 8:
                n = (struct.unpack("<Q", img[:8])[0] + int(rng.integers(-4, 5))) % (1 << 64)
                img[:8] = struct.pack("<Q", n)
        try:
            safetensors.deserialize(bytes(img))
            reference_accepts = True
        except Exception:
            reference_accepts = False
        open(path, "wb").write(img)
        rc, _, err = dump("read", path)
        if (rc == 0) == reference_accepts:
            agree += 1
        elif reference_accepts and ("duplicate" in err or "NUL character" in err):
            stricter += 1
        else:
            check("mutation differential", False, f"fp8kit exit {rc} {err.strip()} on {bytes(img[:120])!r}")
    check("mutation differential", agree + stricter == count, f"{agree} agree, {stricter} stricter of {count}")
    print(f"mutations: {agree} same verdict, {stricter} refused by fp8kit by design, of {count}")


def main():
    print(f"safetensors {safetensors.__version__}, numpy {np.__version__}"
          + (f", ml_dtypes {ml_dtypes.__version__}" if ml_dtypes else ""))
    dtypes = numpy_dtypes()
    with tempfile.TemporaryDirectory() as tmp:
        fp8kit_reads_reference(tmp, dtypes)
        fp8kit_writes_reference_reads(tmp, dtypes)
        sharded_both_ways(tmp, dtypes)
        differential(tmp)
        mutation_differential(tmp)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
