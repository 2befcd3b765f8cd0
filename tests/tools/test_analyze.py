#!/usr/bin/env python3
"""`fp8kit analyze` on arrays written by numpy.save: JSON fields, values against an independent computation,
the verdict, and one-line errors with exit status 2 for bad files and options. Usage: test_analyze.py FP8KIT."""
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checks import check, require, summary  # noqa: E402

require("numpy", "safetensors", "ml_dtypes")
import numpy as np  # noqa: E402



def run(exe, *args, timeout=None):
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)


def main():
    exe = sys.argv[1]
    with tempfile.TemporaryDirectory() as d:
        rng = np.random.default_rng(1)
        gauss = rng.normal(0, 2, size=(64, 256)).astype(np.float32)
        path = os.path.join(d, "act.npy")
        np.save(path, gauss)
        r = run(exe, "analyze", path, "--json")
        check("json exit 0", r.returncode == 0, r.stderr)
        rows = json.loads(r.stdout)
        check("json has 8 rows (2 formats x 4 granularities)", len(rows) == 8, str(len(rows)))
        needed = {"format", "granularity", "amax", "scale", "sqnr_db", "underflow_fraction", "saturated_count", "nonfinite_count"}
        check("json fields", all(needed <= set(x) for x in rows))
        amax = float(np.max(np.abs(gauss)))
        check("amax", all(x["amax"] == amax for x in rows), f"{rows[0]['amax']} vs {amax}")
        t = [x for x in rows if x["format"] == "e4m3fn" and x["granularity"] == "tensor"][0]
        check("tensor scale = 448 / amax", t["scale"] == np.float32(448.0) / np.float32(amax), str(t["scale"]))
        check("per-row has no single scale", all(x["scale"] is None for x in rows if x["granularity"] != "tensor"))
        # SQNR of e4m3fn per tensor, computed independently with ml_dtypes
        import ml_dtypes
        s = np.float32(448.0) / np.float32(amax)
        q = (gauss * s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * (np.float32(1) / s)
        sqnr = 10 * math.log10(float(np.sum(gauss.astype(np.float64) ** 2)) / float(np.sum((gauss.astype(np.float64) - q) ** 2)))
        check("sqnr matches an ml_dtypes computation", abs(t["sqnr_db"] - sqnr) < 1e-6, f"{t['sqnr_db']} vs {sqnr}")
        check("gaussian holds in e4m3fn", t["sqnr_db"] > 28 and t["saturated_count"] == 0)
        # table output with a verdict line
        r = run(exe, "analyze", path)
        check("table exit 0", r.returncode == 0, r.stderr)
        check("verdict line", r.stdout.strip().splitlines()[-1].startswith("verdict: e4m3fn holds"), r.stdout[-300:])

        # the verdict's coarsest is the fewest scales for the shape, whatever the kind: of a 256 x 1024 weight,
        # 128x128 blocks (16 scales) before rows (256) before columns (1024); a one-block grid is per tensor
        w = os.path.join(d, "w.npy")
        np.save(w, (rng.normal(0, 0.02, size=(256, 1024))).astype(np.float32))
        r = run(exe, "analyze", w, "--json", "--format", "e4m3fn", "--granularity", "col,row,block:128x128")
        rows = json.loads(r.stdout)
        check("scales per granularity", [x["scales"] for x in rows] == [1024, 256, 16], str([x["scales"] for x in rows]))
        check("all hold", all(x["holds"] for x in rows), str([x["holds"] for x in rows]))
        r = run(exe, "analyze", w, "--format", "e4m3fn", "--granularity", "col,row,block:128x128")
        check("verdict: fewest scales", "at 'block:128x128' granularity" in r.stdout.strip().splitlines()[-1], r.stdout[-300:])
        r = run(exe, "analyze", w, "--format", "e4m3fn", "--granularity", "block:256x1024,row,tensor")
        check("verdict: a one-block grid ties with tensor, which comes first",
              "at 'tensor' granularity" in r.stdout.strip().splitlines()[-1], r.stdout[-300:])

        # activations with outliers and tiny values: per tensor underflows, finer granularities help
        x = (rng.normal(0, 1e-3, size=(32, 128)) * np.where(rng.random((32, 128)) < 0.01, 1e6, 1)).astype(np.float64)
        x[0, 0] = np.nan
        p2 = os.path.join(d, "outliers.npy")
        np.save(p2, x)
        r = run(exe, "analyze", p2, "--json", "--format", "e4m3fn", "--granularity", "tensor,block:1x32,mx32-rceil")
        rows = json.loads(r.stdout)
        check("nonfinite counted", all(x["nonfinite_count"] == 1 for x in rows))
        # ... and named beside the verdict, which measures the finite values only (an all-NaN tensor "held" exactly)
        table = run(exe, "analyze", p2).stdout
        check("verdict names the non-finite value", "1 value is NaN or infinite" in table.strip().splitlines()[-1],
              table[-300:])
        by = {x["granularity"]: x for x in rows}
        check("finer blocks underflow less", by["block:1x32"]["underflow_fraction"] < by["tensor"]["underflow_fraction"],
              f"{by['block:1x32']['underflow_fraction']} vs {by['tensor']['underflow_fraction']}")
        check("json has no NaN/Inf", "NaN" not in r.stdout and "Infinity" not in r.stdout)

        # float16, Fortran order, 1-D and 3-D
        np.save(os.path.join(d, "h.npy"), np.asfortranarray(rng.normal(size=(4, 5, 6)).astype(np.float16)))
        r = run(exe, "analyze", os.path.join(d, "h.npy"), "--json")
        check("float16 3-D fortran", r.returncode == 0 and json.loads(r.stdout)[0]["rows"] == 20, r.stderr)
        np.save(os.path.join(d, "v.npy"), np.arange(10, dtype=np.float32))
        r = run(exe, "analyze", os.path.join(d, "v.npy"), "--json", "--no-saturate")
        check("1-D, exact integers", r.returncode == 0 and json.loads(r.stdout)[0]["overflow"] == "non-saturating", r.stderr)

        # errors: one line on stderr, exit 2, nothing on stdout
        bad = os.path.join(d, "bad.npy")
        with open(bad, "wb") as f:
            f.write(b"\x93NUMPY\x01\x00\x10\x00{'descr': '<f4'")
        ints = os.path.join(d, "ints.npy")
        np.save(ints, np.arange(4, dtype=np.int32))
        pt = os.path.join(d, "model.pt")
        with open(pt, "wb") as f:
            f.write(b"\x80\x02")
        for args, needle in [((bad,), "not a valid .npy"), ((ints,), "'<i4'"), ((pt,), "pickle"),
                             ((os.path.join(d, "missing.npy"),), "missing.npy"),
                             ((path, "--granularity", "block:0x4"), "block:0x4"),
                             ((path, "--format", "e4m3"), "e4m3"), ((path, "--format", "e5m2,e8m0fnu"), "MX's scale format"),
                             ((path, "--tensor", "w"), "--tensor"),
                             ((path, "--saturate", "--no-saturate"), "contradict")]:
            r = run(exe, "analyze", *args)
            lines = r.stderr.strip().splitlines()
            check(f"error {needle}", r.returncode == 2 and len(lines) == 1 and needle in lines[0] and r.stdout == "",
                  f"rc={r.returncode} stderr={r.stderr!r} stdout={r.stdout[:100]!r}")
        # safetensors: the same tensor gives the same JSON as its .npy; --tensor picks one of several
        from safetensors.numpy import save_file
        st = os.path.join(d, "model.safetensors")
        save_file({"act": gauss, "w": rng.normal(size=(16, 64)).astype(np.float16),
                   "ids": np.arange(4, dtype=np.int64)}, st)
        r = run(exe, "analyze", st, "--tensor", "act", "--json")
        r_npy = run(exe, "analyze", path, "--json")
        check("safetensors tensor = its npy", r.returncode == 0 and json.loads(r.stdout) == json.loads(r_npy.stdout),
              r.stderr)
        r = run(exe, "analyze", st, "--tensor", "w")
        check("safetensors F16 tensor", r.returncode == 0 and "F16 'w' [16, 64]" in r.stdout, r.stdout[:200] + r.stderr)
        # A name from the file with control bytes (a newline, a terminal escape) is printed escaped, on one line.
        odd = os.path.join(d, "odd.safetensors")
        save_file({"a\nb\x1b[31m.weight": gauss}, odd)
        r = run(exe, "analyze", odd)
        check("a file's name escaped", r.returncode == 0 and "'a\\x0ab\\x1b[31m.weight'" in r.stdout and
              "\x1b" not in r.stdout, r.stdout[:300] + r.stderr)
        # inspect says what analyze would say, per high-precision tensor (integers get no analysis)
        r = run(exe, "inspect", st, "--json")
        tensors = {t["name"]: t for t in json.loads(r.stdout)["tensors"]} if r.returncode == 0 else {}
        check("inspect analysis", r.returncode == 0 and tensors["act"]["e4m3fn_holds_at"] == "tensor" and
              abs(tensors["act"]["e4m3fn_sqnr_db"] - t["sqnr_db"]) < 1e-9 and "e4m3fn_holds_at" not in tensors["ids"],
              r.stderr + r.stdout[:300])
        # A tensor that e4m3fn holds exactly has no SQNR: "exact", null (not 0 dB, the worst score).
        exact = os.path.join(d, "exact.safetensors")
        save_file({"halves": np.array([[3.5, -0.5], [0.0, 1.5]], dtype=np.float32)}, exact)
        r = run(exe, "inspect", exact)
        check("inspect exact text", r.returncode == 0 and "e4m3fn holds at 'tensor' (exact)" in r.stdout,
              r.stdout + r.stderr)
        r = run(exe, "inspect", exact, "--json")
        halves = json.loads(r.stdout)["tensors"][0] if r.returncode == 0 else {}
        check("inspect exact json", halves.get("e4m3fn_holds_at") == "tensor" and halves["e4m3fn_sqnr_db"] is None,
              r.stdout + r.stderr)
        r = run(exe, "inspect", st, "--json", "--no-analysis")
        check("inspect --no-analysis", r.returncode == 0 and
              all("e4m3fn_holds_at" not in x for x in json.loads(r.stdout)["tensors"]), r.stderr)
        for args, needle in [((st,), "--tensor NAME"), ((st, "--tensor", "nope"), "no tensor 'nope'"),
                             ((st, "--tensor", "ids"), "I64")]:
            r = run(exe, "analyze", *args)
            lines = r.stderr.strip().splitlines()
            check(f"safetensors error {needle}", r.returncode == 2 and len(lines) == 1 and needle in lines[0],
                  f"rc={r.returncode} stderr={r.stderr!r}")
        # float64 is read as float32: nonzero values below its range are underflow in every row (they were read as 0
        # and reported exact, 0% underflow); values past it are non-finite. Empty leading dimensions keep the row.
        tiny = os.path.join(d, "tiny64.npy")
        np.save(tiny, rng.normal(0, 1e-50, size=(8, 32)))
        r = run(exe, "analyze", tiny, "--json")
        rows = json.loads(r.stdout) if r.returncode == 0 else []
        check("float64 below float32: all underflow", len(rows) == 8 and all(
            x["underflow_count"] == 256 and x["underflow_fraction"] == 1.0 and not x["exact"] and not x["holds"]
            and x["max_rel_error"] == 1.0 for x in rows), r.stdout[:400] + r.stderr)
        part = rng.normal(0, 1, size=(8, 128))
        part[0, :4] = [1e-50, -1e-60, 1e300, 0.0]
        np.save(tiny, part)
        r = run(exe, "analyze", tiny, "--json", "--granularity", "tensor")
        rows = json.loads(r.stdout) if r.returncode == 0 else []
        check("float64 with a few outside float32", len(rows) == 2 and all(
            x["nonfinite_count"] == 1 and x["underflow_count"] >= 2 for x in rows), r.stdout[:400] + r.stderr)
        r_st = os.path.join(d, "tiny64.safetensors")
        save_file({"w": np.full((4, 4), 1e-46)}, r_st)
        r = run(exe, "inspect", r_st)
        check("inspect float64 below float32 does not hold", r.returncode == 0 and "does not hold" in r.stdout,
              r.stdout + r.stderr)
        for shape, view in (((0, 16), "0 x 16"), ((16, 0), "16 x 0"), ((2, 0, 5), "0 x 5")):
            np.save(tiny, np.zeros(shape, np.float32))
            r = run(exe, "analyze", tiny)
            check(f"empty {shape} viewed as {view}", r.returncode == 0 and f"viewed as {view};" in r.stdout,
                  r.stdout[:200] + r.stderr)
        # A crafted header: an empty tensor of 2^62 rows ran analyze forever (a pass over its rows); (3, 2^62, 0)
        # multiplied its rows past int64.
        def npy_header(shape):
            text = ("{'descr': '<f4', 'fortran_order': False, 'shape': %s, }" % (shape,)).ljust(117) + "\n"
            with open(tiny, "wb") as f:
                f.write(b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode())
        npy_header((2**62, 0))
        r = run(exe, "analyze", tiny, "--json", timeout=60)
        check("empty 2^62 x 0 is analyzed as empty", r.returncode == 0 and all(
            x["rows"] == 2**62 and x["scales"] == 0 and x["exact"] for x in json.loads(r.stdout or "[]")),
            r.stdout[:300] + r.stderr)
        npy_header((3, 2**62, 0))
        r = run(exe, "analyze", tiny)
        check("leading dimensions past int64 refused", r.returncode == 2 and "multiply past 2^63" in r.stderr
              and r.stderr.count("\n") == 1, r.stderr)
        r = run(exe, "analyze", "--help")
        check("help", r.returncode == 0 and "granularity" in r.stdout)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
