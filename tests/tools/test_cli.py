# End-to-end tests of the fp8kit CLI: runs the binary given as argv[1] and checks its output against results
# computed here independently (an FP8 reference written from the bit layouts). Exits 1 on any failure.
import bisect
import functools
import json
import math
import os
import random
import re
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checks import run_test_functions  # noqa: E402

BINARY = None
TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def run(*args, stdin=None, timeout=120, env=None):
    """Runs fp8kit with args (and extra environment variables); returns (exit status, stdout, stderr) as text. A
    FP8KIT_ISA in the caller's environment is dropped: these checks expect the CPU's best level unless they set one."""
    full_env = {k: v for k, v in os.environ.items() if k != "FP8KIT_ISA"}
    if env is not None:
        full_env.update(env)
    p = subprocess.run([BINARY, *args], input=stdin, capture_output=True, text=True, timeout=timeout, env=full_env)
    return p.returncode, p.stdout, p.stderr


def run_json(*args, stdin=None):
    rc, out, err = run(*args, stdin=stdin)
    assert rc == 0, f"fp8kit {' '.join(args)} exited {rc}: {err.strip()}"
    assert err == "", f"unexpected stderr: {err!r}"
    return json.loads(out)


# ---------------------------------------------------------------- an independent FP8 reference
# name: (exponent bits, mantissa bits, bias, has Inf, NaN style, has -0)
LAYOUTS = {
    "e4m3fn": (4, 3, 7, False, "all_ones", True),
    "e5m2": (5, 2, 15, True, "ieee", True),
    "e4m3fnuz": (4, 3, 8, False, "neg_zero", False),
    "e5m2fnuz": (5, 2, 16, False, "neg_zero", False),
}


def decode(name, code):
    """The value of a code of a signed format, from its bit fields alone."""
    e_bits, m_bits, bias, has_inf, nan_style, _ = LAYOUTS[name]
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> m_bits) & ((1 << e_bits) - 1)
    m = code & ((1 << m_bits) - 1)
    top = (1 << e_bits) - 1
    if nan_style == "neg_zero" and code == 0x80:
        return math.nan
    if nan_style == "all_ones" and e == top and m == (1 << m_bits) - 1:
        return math.nan
    if nan_style == "ieee" and e == top:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * m * 2.0 ** (1 - bias - m_bits)
    return sign * (1 + m / 2**m_bits) * 2.0 ** (e - bias)


@functools.lru_cache(maxsize=None)
def positive_table(name):
    """([values], [codes]) of the positive finite codes, ascending, then the value one step past the maximum
    (code max_code + 1 in a format with one more exponent): where rounding starts to overflow."""
    m_bits = LAYOUTS[name][1]
    pairs = [(decode(name, c), c) for c in range(0x80)]
    pairs = [(v, c) for v, c in pairs if math.isfinite(v)]
    max_value, max_code = pairs[-1]
    pairs.append((max_value + 2.0 ** (math.frexp(max_value)[1] - 1 - m_bits), max_code + 1))
    return [v for v, _ in pairs], [c for _, c in pairs]


def nan_code(name):
    return {"all_ones": 0x7F, "ieee": 0x7E, "neg_zero": 0x80}[LAYOUTS[name][4]]


def ref_encode(x, name, saturate=False):
    """Round to nearest, ties to the even code, of the exact value x, by searching the table of all values."""
    e_bits, m_bits, bias, has_inf, nan_style, neg_zero = LAYOUTS[name]
    if math.isnan(x):
        return nan_code(name)
    values, codes = positive_table(name)
    negative = math.copysign(1.0, x) < 0
    a = abs(x)
    overflow = a > values[-1]
    if not overflow:
        i = bisect.bisect_left(values, a)
        if values[i] == a or i == 0:
            code = codes[i]
        else:
            below, above = a - values[i - 1], values[i] - a
            code = codes[i - 1] if below < above or (below == above and codes[i - 1] % 2 == 0) else codes[i]
        overflow = code == codes[-1]
    if overflow:
        if saturate:
            code = codes[-2]
        elif has_inf:
            code = ((1 << e_bits) - 1) << m_bits
        elif nan_style == "neg_zero":
            return nan_code(name)
        else:
            code = nan_code(name)
    if code == 0 and negative:
        return 0x80 if neg_zero else 0x00
    return code | (0x80 if negative else 0)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same_number(got, expected):
    if isinstance(expected, float) and math.isnan(expected):
        return got == "nan"
    if isinstance(expected, float) and math.isinf(expected):
        return got == ("inf" if expected > 0 else "-inf")
    return isinstance(got, (int, float)) and got == expected


# ---------------------------------------------------------------- help and usage
@test
def help_on_every_command():
    for args in ([], ["formats"], ["cast"], ["bench"], ["bench", "convert"], ["bench", "gemm"], ["bench", "peak"]):
        rc, out, err = run(*args, "--help")
        assert rc == 0, f"{args} --help exited {rc}"
        assert "Usage" in out, f"{args} --help printed no usage: {out[:200]!r}"


@test
def no_command_is_one_line_exit_2():
    rc, out, err = run()
    assert rc == 2, rc
    assert out == "", out
    assert len(err.strip().splitlines()) == 1 and err.startswith("fp8kit"), err


# ---------------------------------------------------------------- formats
@test
def formats_json_constants():
    data = run_json("formats", "--json")
    by_name = {d["name"]: d for d in data}
    assert [d["name"] for d in data] == ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e8m0fnu"], list(by_name)
    expected = {
        # name: (e, m, bias, max, min normal, min subnormal, epsilon, has_inf, has -0, max_code, NaNs, Infs)
        "e4m3fn": (4, 3, 7, 448, 2**-6, 2**-9, 2**-3, False, True, 0x7E, [0x7F, 0xFF], []),
        "e5m2": (5, 2, 15, 57344, 2**-14, 2**-16, 2**-2, True, True, 0x7B,
                 [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF], [0x7C, 0xFC]),
        "e4m3fnuz": (4, 3, 8, 240, 2**-7, 2**-10, 2**-3, False, False, 0x7F, [0x80], []),
        "e5m2fnuz": (5, 2, 16, 57344, 2**-15, 2**-17, 2**-2, False, False, 0x7F, [0x80], []),
        "e8m0fnu": (8, 0, 127, 2.0**127, 2.0**-127, None, 1, False, False, 0xFE, [0xFF], []),
    }
    for name, (e, m, bias, mx, mn, sub, eps, inf, nz, max_code, nans, infs) in expected.items():
        d = by_name[name]
        keys = ("exponent_bits", "mantissa_bits", "bias", "max", "min_normal", "min_subnormal", "epsilon",
                "has_inf", "has_negative_zero", "max_code", "nan_codes", "inf_codes")
        got = tuple(d[k] for k in keys)
        assert got == (e, m, bias, mx, mn, sub, eps, inf, nz, max_code, nans, infs), f"{name}: {got}"
        assert d["torch_name"] == "float8_" + name, d["torch_name"]
        assert isinstance(d["has_inf"], bool) and isinstance(d["has_negative_zero"], bool)
    assert by_name["e8m0fnu"]["min_subnormal"] is None
    assert [n for n, d in by_name.items() if d["has_inf"]] == ["e5m2"]


@test
def formats_json_agrees_with_reference_decoder():
    for d in run_json("formats", "--json"):
        if d["name"] not in LAYOUTS:
            continue
        values, codes = positive_table(d["name"])
        assert (values[-2], codes[-2]) == (d["max"], d["max_code"]), d["name"]
        assert values[0] == 0 and values[1] == d["min_subnormal"], d["name"]
        assert [c for c in range(256) if math.isnan(decode(d["name"], c))] == d["nan_codes"], d["name"]


@test
def formats_table():
    rc, out, err = run("formats")
    assert rc == 0 and err == "", err
    for text in ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e8m0fnu", "448", "57344", "240", "0.001953125",
                 "S.11111.00", "S.1111.111", "S.11111.{01,10,11}", "1.0000.000 (0x80) only",
                 "11111111 (0xFF)",
                 "2^127 (1.70141e+38)", "0 1111 110"):
        assert text in out, f"{text!r} missing from the formats table"


# ---------------------------------------------------------------- cast
ARTICLE_VALUES = ["1.0", "1.5", "1.25", "1.125", "1.1", "0.1", "448", "449", "0.015625", "0.0001"]


def check_rows(rows, texts, formats, saturate=True, parse=float, to_source=f32):
    assert len(rows) == len(texts) * len(formats), (len(rows), len(texts))
    i = 0
    for index, text in enumerate(texts):
        x = to_source(parse(text))
        for name in formats:
            r = rows[i]
            i += 1
            assert r["input"] == text and r["format"] == name and r["index"] == index, r
            assert same_number(r["source_value"], x), (r, x)
            expected = ref_encode(x, name, saturate)
            assert r["code"] == expected, f"{text} -> {name}: got {r['hex']}, expected {expected:#04x}"
            assert r["hex"] == f"{expected:#04x}" and len(r["bits"].replace(" ", "")) == 8, r
            assert int(r["bits"].replace(" ", ""), 2) == expected, r
            value = decode(name, expected)
            assert same_number(r["value"], value), r
            if math.isfinite(value) and math.isfinite(x):
                assert r["abs_error"] == abs(value - x), r
                assert r["rel_error"] == (abs(value - x) / abs(x) if x != 0 else None), r
            else:
                assert r["abs_error"] is None and r["rel_error"] is None, r


@test
def cast_article_values():
    rows = run_json("cast", "--json", *ARTICLE_VALUES)
    check_rows(rows, ARTICLE_VALUES, ["e4m3fn", "e5m2"])
    codes = {(r["input"], r["format"]): r["code"] for r in rows}
    # The article's table, spelled out: 1.1 -> 1.125 in e4m3fn but 1.0 in e5m2; 449 -> 448 in both.
    assert codes[("1.1", "e4m3fn")] == 0x39 and codes[("1.1", "e5m2")] == 0x3C
    assert codes[("449", "e4m3fn")] == 0x7E and codes[("449", "e5m2")] == 0x5F
    assert codes[("0.0001", "e4m3fn")] == 0x00


@test
def cast_every_format_and_float64():
    values = ["0.3", "-2.75", "1e-3", "250", "-0.0", "3e-6", "60000"]
    formats = ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"]
    rows = run_json("cast", "--json", "--from", "float64", "--to", ",".join(formats), *values)
    check_rows(rows, values, formats, saturate=True, to_source=lambda x: x)  # the default
    assert rows == run_json("cast", "--json", "--saturate", "--from", "f64", "--to", ",".join(formats), *values)
    rows = run_json("cast", "--json", "--no-saturate", "--from", "f64", "--to", ",".join(formats), *values)
    check_rows(rows, values, formats, saturate=False, to_source=lambda x: x)


def one(args, value):
    rows = run_json("cast", "--json", *args, "--", value)
    assert len(rows) == 1, rows
    return rows[0]


@test
def cast_overflow_boundaries():
    e4, e4_nonsat = ["--to", "e4m3fn"], ["--to", "e4m3fn", "--no-saturate"]
    assert one(e4_nonsat, "464")["code"] == 0x7E  # halfway to the 480 that does not exist: ties to even 448
    r = one(e4_nonsat, "465")
    assert r["code"] == 0x7F and r["value"] == "nan", r
    assert one(e4, "465")["code"] == 0x7E  # saturating by default, as PyTorch >= 2.12, TE and CUDA
    assert one(e4 + ["--saturate"], "465")["code"] == 0x7E
    assert one(e4, "inf")["code"] == 0x7E
    assert one(e4_nonsat, "inf")["code"] == 0x7F
    assert one(e4, "-inf")["code"] == 0xFE
    r = one(["--to", "e5m2", "--no-saturate"], "61440")
    assert r["code"] == 0x7C and r["value"] == "inf", r
    assert one(["--to", "e5m2", "--no-saturate"], "61439")["code"] == 0x7B
    assert one(["--to", "e5m2"], "61440")["code"] == 0x7B
    check_usage_error(["cast", "--saturate", "--no-saturate", "1"], "contradict")
    r = one(["--to", "e4m3fnuz"], "-0.0")
    assert r["code"] == 0x00 and r["source_value"] == 0.0, r
    assert one(["--to", "e4m3fn"], "-0.0")["code"] == 0x80
    assert one(["--to", "float8_e4m3fn"], "1.1")["code"] == 0x39  # PyTorch spelling of the format


@test
def cast_hex_float_and_special_spellings():
    rows = run_json("cast", "--json", "--to", "e4m3fn", "0x1.8p+3", "-0X1P-9", "0x.8p1", "+2", ".5", "-3e-5")
    assert [r["code"] for r in rows] == [0x54, 0x81, 0x38, 0x40, 0x30, ref_encode(f32(-3e-5), "e4m3fn")], rows
    assert [r["source_value"] for r in rows[:2]] == [12, -2**-9], rows
    rows = run_json("cast", "--json", "--to", "e5m2", "--no-saturate", "NaN", "-Infinity", "+INF", "inf", "1e400", "1e-60")
    assert [r["code"] for r in rows] == [0x7E, 0xFC, 0x7C, 0x7C, 0x7C, 0x00], rows
    assert [r["source_value"] for r in rows] == ["nan", "-inf", "inf", "inf", "inf", 0.0], rows


@test
def cast_negative_values_on_the_command_line():
    rows = run_json("cast", "--json", "--to", "e5m2", "--no-saturate", "-1.5", "2", "-inf", "-.5", "-nan", "-0x1p-2",
                    "-1e2")
    assert [r["input"] for r in rows] == ["-1.5", "2", "-inf", "-.5", "-nan", "-0x1p-2", "-1e2"], rows
    assert [r["code"] for r in rows] == [0xBE, 0x40, 0xFC, 0xB8, 0xFE, 0xB4, 0xD6], rows
    rows = run_json("cast", "--json", "--to", "e4m3fn", "--", "-1.5")
    assert [(r["input"], r["code"]) for r in rows] == [("-1.5", 0xBC)], rows
    rows = run_json("cast", "-0.25", "--json", "--", "-inf", "-.75")
    assert [r["input"] for r in rows] == ["-0.25"] * 2 + ["-inf"] * 2 + ["-.75"] * 2, rows


@test
def cast_table_output():
    rc, out, err = run("cast", "1.1", "-inf")
    assert rc == 0 and err == "", err
    assert "overflow: saturating" in out.splitlines()[0], out  # the default
    assert out.splitlines()[5].split()[:3] == ["-inf", "e5m2", "-57344"], out
    rc, out, err = run("cast", "--no-saturate", "1.1", "-inf")
    assert rc == 0 and err == "", err
    lines = out.splitlines()
    assert "float32" in lines[0] and "non-saturating" in lines[0], lines[0]
    header = ["input", "format", "fp8", "value", "bits", "hex", "abs", "error", "rel", "error"]
    assert lines[1].split() == header, lines[1]
    assert lines[2].split() == ["1.1", "e4m3fn", "1.125", "0", "0111", "001", "0x39", "0.025", "0.0227273"]
    assert lines[5].split() == ["-inf", "e5m2", "-inf", "1", "11111", "00", "0xfc", "-", "-"], lines[5]
    rc, out, err = run("cast", "--saturate", "--to", "e8m0fnu", "1.6e38", "1e-39")
    assert rc == 0 and "saturating" in out.splitlines()[0], out
    assert "2^127 (1.70141e+38)" in out and "2^-127 (5.87747e-39)" in out, out


@test
def cast_bfloat16_and_float16_ties():
    def source(args, text):
        return one(["--to", "e4m3fn"] + args, text)["source_value"]

    bf = ["--from", "bfloat16"]
    assert source(bf, "1.00390625") == 1.0  # exactly halfway between 1 and 1.0078125: ties to even
    assert source(bf, "1.0039062500000000001") == 1.0078125  # the double is 1.00390625; the text is above it
    assert source(bf, "1.0039062499999999999") == 1.0
    assert source(bf, "1.01171875") == 1.015625  # halfway between 1.0078125 (odd) and 1.015625 (even)
    assert source(bf, "-1.0039062500000000001") == -1.0078125
    assert source(bf, "0x1.01p0") == 1.0
    assert source(bf, "0x1.0100000000000000001p0") == 1.0078125  # more bits than a double holds
    assert source(bf, "0x1.00fffffffffffffffffp0") == 1.0
    assert source(["--from", "bf16"], "1.1") == 1.1015625
    f16 = ["--from", "float16"]
    assert source(f16, "1.00048828125") == 1.0
    assert source(f16, "1.00048828125000000001") == 1.0009765625
    assert source(f16, "65520") == "inf"  # the overflow threshold ties to even: Inf
    assert source(f16, "65519.99999999999999999") == 65504
    assert source(f16, "2.98023223876953125e-8") == 0.0  # 2^-25, half the smallest subnormal
    assert source(f16, "2.98023223876953125000001e-8") == 2.0**-24
    assert source(["--from", "f16"], "0.1") == 0.0999755859375
    assert source(["--from", "f32"], "1.1") == f32(1.1)


@test
def cast_stdin_matches_command_line():
    rng = random.Random(20240601)
    values = []
    for i in range(100000):
        kind = i % 5
        if kind == 0:
            values.append(repr(rng.uniform(-500, 500)))
        elif kind == 1:
            values.append(repr(rng.uniform(-1, 1) * 2.0 ** rng.randint(-20, 17)))
        elif kind == 2:
            values.append(f"{rng.uniform(0, 2):.3f}")
        elif kind == 3:
            values.append(rng.choice(["nan", "inf", "-inf", "0", "-0", "448", "464", "465", "61440"]))
        else:
            values.append(float(rng.uniform(-1, 1)).hex())
    text = "\n".join(values[:50]) + "\n\n  \n" + "\n".join(values[50:]) + "\n"  # blank lines are skipped
    rows = run_json("cast", "--json", stdin=text)
    assert len(rows) == 2 * len(values), len(rows)
    few = values[:40]
    direct = run_json("cast", "--json", "--", *few)
    assert direct == rows[: 2 * len(few)], "stdin and command-line results differ"
    parse = lambda t: float.fromhex(t) if "0x" in t else float(t)
    check_rows(rows, values, ["e4m3fn", "e5m2"], parse=parse)
    rc, out, err = run("cast", stdin=text)
    assert rc == 0 and len(out.splitlines()) == 2 + 2 * len(values), (rc, err)


@test
def cast_stochastic_rounding():
    text = "1.1\n" * 1000
    args = ["cast", "--json", "--to", "e4m3fn", "--rounding", "stochastic"]
    a = [r["value"] for r in run_json(*args, "--seed", "1", stdin=text)]
    b = [r["value"] for r in run_json(*args, "--seed", "1", stdin=text)]
    c = [r["value"] for r in run_json(*args, "--seed", "2", stdin=text)]
    assert a == b, "the same seed gave different results"
    assert a != c, "different seeds gave the same 1000 results"
    assert set(a) == {1.0, 1.125}, set(a)
    mean = sum(a) / len(a)
    assert abs(mean - 1.1) < 0.012, mean  # 6 standard deviations of the mean of 1000 draws
    nearest = [r["code"] for r in run_json("cast", "--json", "--to", "e4m3fn", stdin=text)]
    assert set(nearest) == {0x39}, set(nearest)


# ---------------------------------------------------------------- errors
def check_usage_error(args, token, stdin=None):
    rc, out, err = run(*args, stdin=stdin)
    assert rc == 2, f"{args}: exit {rc}"
    assert out == "", f"{args}: stdout not empty: {out[:200]!r}"
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"{args}: stderr has {len(lines)} lines: {err!r}"
    assert token in lines[0], f"{args}: {token!r} not named in {lines[0]!r}"


@test
def cast_bad_inputs():
    check_usage_error(["cast", "1.5", "abc"], "'abc'")
    check_usage_error(["cast", "--to", "e4m3", "1"], "e4m3")
    check_usage_error(["cast", "1", "--bogus"], "--bogus")
    check_usage_error(["cast", "--from", "float8", "1"], "float8")
    check_usage_error(["cast", "--rounding", "up", "1"], "up")
    check_usage_error(["cast", "--seed", "x", "1"], "--seed")
    check_usage_error(["cast", "--seed", "-1", "1"], "'-1'")
    check_usage_error(["cast", "1", "--", "--x"], "--x")
    check_usage_error(["cast", "1.5.2"], "1.5.2")
    check_usage_error(["cast", "0x"], "0x")
    check_usage_error(["cast", "--json"], "line 3", stdin="1\n2\n1,5\n4\n")
    check_usage_error(["cast"], "abc", stdin="1.0\n" * 200000 + "abc\n")
    check_usage_error(["formats", "--bogus"], "--bogus")
    # a mistyped option is named, not what CLI11 found missing first ("--to is required")
    check_usage_error(["convert", "in.safetensors", "out.safetensors", "--too", "f32"], "unknown option '--too'")
    check_usage_error(["analyze", "--tensr", "w", "x.npy"], "unknown option '--tensr'")
    check_usage_error(["bench"], "bench")
    # a format listed twice (under two spellings too) was printed twice; train --compare refused the same mistake
    check_usage_error(["cast", "--to", "e4m3fn,float8_e4m3fn", "1"], "format e4m3fn is listed twice")
    check_usage_error(["analyze", "--format", "e5m2,e5m2", "x.npy"], "format e5m2 is listed twice")
    check_usage_error(["analyze", "--granularity", "row,row", "x.npy"], "row is listed twice")


# ---------------------------------------------------------------- bench
@test
def bench_convert_small():
    rows = run_json("bench", "convert", "--bytes", "1M", "--reps", "3", "--json")
    assert len(rows) > 0
    in_force = run_json("info", "--json")["isa"]
    for r in rows:
        assert isinstance(r["op"], str) and r["op"], r
        assert isinstance(r["threads"], int) and r["threads"] >= 1, r
        for key in ("gbps", "baseline_gbps", "ratio"):
            assert isinstance(r[key], (int, float)) and r[key] > 0, (key, r)
        assert abs(r["ratio"] - r["gbps"] / r["baseline_gbps"]) <= 1e-6 * r["ratio"], r
        assert r["reps"] == 3 and r["levels"] == [in_force], r  # without --isa: the level in force
    # reps is what ran: the scalar reference rows a third as many (at least 3), not --reps
    rows = run_json("bench", "convert", "--bytes", "64K", "--reps", "12", "--threads", "1", "--json")
    scalar = [r for r in rows if "scalar" in r["kernel"]]
    assert scalar and all(r["reps"] == 4 for r in scalar), scalar[:1]
    assert all(r["reps"] == 12 for r in rows if "scalar" not in r["kernel"]), rows[:1]


@test
def bench_convert_measures_each_conversion_table_once():
    # --isa all ran avx512, avx512-bf16 and amx as three blocks that could not be told apart (one table): each table
    # is measured once, its rows name every level they stand for, and a line says which were folded.
    levels = run_json("info", "--json")["levels"]
    rc, out, err = run("bench", "convert", "--bytes", "64K", "--reps", "3", "--threads", "1", "--isa", "all",
                       "--ops", "f32->e4m3fn")
    assert rc == 0, err
    rows = run_json("bench", "convert", "--bytes", "64K", "--reps", "3", "--threads", "1", "--isa", "all", "--ops",
                    "f32->e4m3fn", "--json")
    stood_for = []
    for r in rows:
        if r["levels"] not in stood_for:
            stood_for.append(r["levels"])
    assert [level for group in stood_for for level in group] == levels, (stood_for, levels)
    kernels = {r["kernel"] for r in rows if r["op"] != "read-bandwidth"}
    assert len(kernels) == len(stood_for), (kernels, stood_for)
    folded = [group for group in stood_for if len(group) > 1]
    for group in folded:
        assert f"--isa {', '.join(group[1:])}: the same conversion kernels" in out, (group, out)
    if not folded:
        print("  (every level of this CPU has its own conversion table: nothing folded)")


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b))


@test
def bench_gemm_small():
    args = ("bench", "gemm", "--json", "--shapes", "gemm:64x64x64,gemv:256x256", "--reps", "3", "--threads", "1")
    rc, out, err = run(*args)
    assert rc == 0, f"fp8kit {' '.join(args)} exited {rc}: {err.strip()}"
    assert err == "", f"unexpected stderr: {err!r}"

    def no_constant(name):
        raise AssertionError(f"{name} in the JSON output")

    rows = json.loads(out, parse_constant=no_constant)  # NaN, Infinity: not JSON, and not wanted
    ops = [r["op"] for r in rows]
    gemv_ops = ["fp8-gemv", "fp8-gemv-bf16x", "sgemv", "read-bandwidth"]
    # bf16-gemm: oneDNN's bf16 matmul, where fp8kit was built with it (the README's setup installs libdnnl-dev).
    assert ops in (["fp8-gemm", "sgemm", "bf16-gemm"] + gemv_ops, ["fp8-gemm", "sgemm"] + gemv_ops), ops
    isa = run_json("info", "--json")["isa"]
    for r in rows:
        for key in ("op", "isa", "kernel", "library", "m", "n", "k", "threads", "gflops", "gbps", "baseline", "ratio",
                    "bf16_ratio", "path", "openblas_core", "cpu", "reps", "seconds"):
            assert key in r, (key, r)
        assert r["isa"] == isa, r
        for key, value in r.items():
            assert not isinstance(value, float) or math.isfinite(value), (key, r)
        assert r["threads"] == 1 and r["reps"] == 3, r
        assert isinstance(r["openblas_core"], str) and r["openblas_core"], r
        assert isinstance(r["seconds"], (int, float)) and r["seconds"] > 0, r
    if "bf16-gemm" in ops:
        bf16 = rows.pop(2)
        assert bf16["library"].startswith("oneDNN ") and bf16["kernel"] is None, bf16
        assert isinstance(bf16["gflops"], (int, float)) and bf16["gflops"] > 0, bf16
        assert 0 < bf16["rel_diff"] < 0.01, bf16  # bfloat16 inputs against the float32 product
        assert close(rows[0]["bf16_ratio"], rows[0]["gflops"] / bf16["gflops"]), (rows[0], bf16)
    else:
        assert rows[0]["bf16_ratio"] is None, rows[0]
    fp8_gemm, sgemm, fp8_gemv, fp8_gemv16, sgemv, read = rows
    assert fp8_gemm["kernel"] and fp8_gemv["kernel"] and fp8_gemv16["kernel"], rows
    assert close(fp8_gemv16["read_bandwidth_ratio"], fp8_gemv16["gbps"] / read["gbps"]), (fp8_gemv16, read)
    for r in (fp8_gemm, sgemm):
        assert (r["m"], r["n"], r["k"]) == (64, 64, 64), r
        assert isinstance(r["gflops"], (int, float)) and r["gflops"] > 0, r
    for r in (fp8_gemv, sgemv, read):
        assert (r["m"], r["n"], r["k"]) == (1, 256, 256), r
        assert isinstance(r["gbps"], (int, float)) and r["gbps"] > 0, r
    assert fp8_gemm["baseline"] == "sgemm" and fp8_gemm["path"] == "gemm", fp8_gemm
    assert close(fp8_gemm["ratio"], fp8_gemm["gflops"] / sgemm["gflops"]), (fp8_gemm, sgemm)
    assert fp8_gemv["baseline"] == "sgemv" and fp8_gemv["path"] == "gemv", fp8_gemv
    # GEMV ratios: weights per second against sgemv (4 bytes a weight), GB/s against the read probe.
    assert close(fp8_gemv["ratio"], fp8_gemv["gbps"] / (sgemv["gbps"] / 4)), (fp8_gemv, sgemv)
    assert close(fp8_gemv["read_bandwidth_ratio"], fp8_gemv["gbps"] / read["gbps"]), (fp8_gemv, read)
    assert fp8_gemv["bytes"] == 256 * 256 and sgemv["bytes"] == 4 * 256 * 256 and read["bytes"] == 256 * 256
    for r in (sgemm, sgemv, read):
        assert r["baseline"] is None and r["ratio"] is None and r["path"] is None, r
    for r in (fp8_gemm, fp8_gemv):  # the FP8 product is the float32 one up to e4m3fn's quantization error
        assert 0 < r["rel_diff"] < 0.1, r


@test
def bench_checkpoint_small():
    # 8 bf16 weights of 4096 x 64 (4 MiB) and their f32 twin, in a folder of this test's own, which is left empty.
    with tempfile.TemporaryDirectory() as d:
        rows = run_json("bench", "checkpoint", "--bytes", "4MiB", "--reps", "3", "--dir", d, "--json")
        assert os.listdir(d) == [], os.listdir(d)
    assert [r["op"] for r in rows] == ["quantize fp8-block deepseek", "dequantize --to bf16", "convert --to bf16"]
    for r in rows:
        assert r["baseline"] == "cp+fsync" and r["reps"] == 3 and r["dir"] == d, r
        for key in ("seconds", "baseline_seconds", "ratio"):
            assert isinstance(r[key], (int, float)) and r[key] > 0, (key, r)
        assert close(r["ratio"], r["baseline_seconds"] / r["seconds"], 1e-9), r
    assert rows[0]["baseline_bytes"] == rows[1]["baseline_bytes"] < rows[2]["baseline_bytes"], rows
    check_usage_error(["bench", "checkpoint", "--bytes", "1KiB"], "--bytes")
    check_usage_error(["bench", "checkpoint", "--dir", "/nonexistent/place"], "--dir")
    check_usage_error(["bench", "checkpoint", "--reps", "2"], "--reps")


@test
def bench_checkpoint_interrupted_removes_its_folder():
    # A kill or Ctrl-C left the benchmark's folder of generated checkpoints behind (gigabytes at the default size):
    # the benchmark now stops its child, removes the folder and ends by the same signal.
    for sig, after in ((signal.SIGTERM, 0.0), (signal.SIGINT, 1.5), (signal.SIGHUP, 3.0)):
        with tempfile.TemporaryDirectory() as d:
            p = subprocess.Popen([BINARY, "bench", "checkpoint", "--bytes", "32MiB", "--reps", "80", "--dir", d],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            # Once the benchmark has its folder (its handlers are in place by then), and some time into the run.
            deadline = time.monotonic() + 30
            while not os.listdir(d) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert os.listdir(d), "the benchmark made no folder"
            time.sleep(after)
            p.send_signal(sig)
            _, err = p.communicate(timeout=60)
            assert p.returncode == -sig, (sig, p.returncode, err)
            assert os.listdir(d) == [], (sig, os.listdir(d))


@test
def size_options_share_one_syntax():
    # --bytes (and --max-shard-size, tests/tools/test_checkpoints.py) read B, KB/MB/GB (10^n) and KiB/MiB/GiB or K/M/G.
    for size, rows_of_4096 in (("1MiB", 64), ("1M", 64), ("1048576", 64), ("2MB", 122)):
        rows = run_json("bench", "scaling", "--bytes", size, "--reps", "3", "--threads", "1", "--json")
        probe = [r for r in rows if r["op"] == "read-bandwidth"][0]
        assert probe["bytes"] == rows_of_4096 * 4096 * 4, (size, probe)
    for r in rows:  # dequantize runs no amax (its kernel said "amax + decode")
        assert r["reps"] == 3, r
        assert ("amax" in (r["kernel"] or "")) == (r["op"] in ("amax", "quantize")), r
    # Below one row of 4096 the matrix is one row: the header said "0 MiB" for the 16 KiB it measured.
    rc, out, err = run("bench", "scaling", "--bytes", "4K", "--reps", "3", "--threads", "1")
    assert rc == 0 and "on a 16.0 KiB float32 matrix (1 x 4096" in out, (rc, out, err)
    check_usage_error(["bench", "convert", "--bytes", "5Gb"], "--bytes")
    check_usage_error(["bench", "convert", "--bytes", "1000"], "--bytes")
    # 16 GiB of wide array needs 146 GB of buffers: refused before anything is allocated, naming the memory.
    check_usage_error(["bench", "convert", "--bytes", "16GiB"], "memory")


@test
def bench_peak_rows():
    info = run_json("info", "--json")
    rows = run_json("bench", "peak", "--reps", "3", "--json")
    assert [r["op"] for r in rows] == ["fp32-fma-256", "fp32-fma-512", "bf16-dot-512", "bf16-amx"], rows
    assert [r["flops_per_instruction"] for r in rows] == [16, 32, 64, 16384], rows
    ran = [r for r in rows if r["skipped"] is None]
    for r in rows:
        assert r["threads"] == 1 and r["reps"] == 3 and r["baseline"] == "fp32-fma", r
        if r["isa"] in info["levels"]:
            assert r["skipped"] is None, r  # a level this CPU runs has its instruction
        if r["skipped"] is None:
            assert r["gflops"] > 0 and r["ns_per_instruction"] > 0, r
            assert close(r["gflops"], r["flops_per_instruction"] / r["ns_per_instruction"]), r
        else:
            assert isinstance(r["skipped"], str) and r["skipped"], r
            assert r["gflops"] is None and r["ratio"] is None, r
    # The ratios are over the widest FP32 FMA that ran.
    fma = [r for r in ran if r["op"].startswith("fp32-fma")]
    if fma:
        widest = fma[-1]
        assert close(widest["ratio"], 1.0), widest
        for r in ran:
            assert close(r["ratio"], r["gflops"] / widest["gflops"]), (r, widest)
    check_usage_error(["bench", "peak", "--reps", "2"], "--reps")


@test
def bench_every_level():
    info = run_json("info", "--json")
    all_levels = ["scalar", "avx2", "avx512", "avx512-bf16", "amx"]
    rows = run_json("bench", "convert", "--bytes", "1M", "--reps", "3", "--threads", "1", "--isa", "all", "--json")
    # One pass per conversion table the CPU's levels run, in order (levels above avx512 run avx512's: one pass for
    # them all, its rows' `levels` naming each); each pass's f32->e4m3fn kernel row carries the level of the table
    # it ran (the highest at or below the cap: conversions have tables up to avx512), then the scalar reference row.
    encodes = [r for r in rows if r["op"] == "f32->e4m3fn" and r["overflow"] == "saturate" and r["scale"] == 1]
    passes = [encodes[i]["levels"] for i in range(0, len(encodes), 2)]
    assert [level for levels in passes for level in levels] == info["levels"], (passes, info["levels"])
    order = ["scalar", "avx2", "avx512"]
    for i, levels in enumerate(passes):
        kernel_row, reference_row = encodes[2 * i], encodes[2 * i + 1]
        assert kernel_row["isa"] == order[min(all_levels.index(levels[0]), 2)], (kernel_row, levels)
        assert reference_row["isa"] == "scalar" and reference_row["kernel"] == "scalar", reference_row
        assert reference_row["levels"] == levels, (reference_row, levels)
    check_usage_error(["bench", "convert", "--isa", "avx9"], "avx9")
    check_usage_error(["bench", "gemm", "--isa", "avx2,bogus"], "bogus")
    missing = [level for level in ("avx2", "avx512", "avx512-bf16", "amx") if level not in info["levels"]]
    if missing:
        check_usage_error(["bench", "scaling", "--isa", missing[0]], missing[0])


@test
def bench_device_cuda_refusals():
    # --device: a bad name and the CPU-only options are usage errors; with no device (or no backend), one line
    # naming why, exit 1, before any work. Where a device is present its own check (scripts/device-check.sh) runs
    # the benchmarks.
    check_usage_error(["bench", "gemm", "--device", "gpu"], "'gpu' is not a device")
    check_usage_error(["bench", "convert", "--device", "cuda:x"], "use cpu, cuda or cuda:N")
    check_usage_error(["bench", "scaling", "--device", "cuda", "--threads", "2"], "leave them out with --device cuda")
    check_usage_error(["bench", "gemm", "--device", "cuda", "--isa", "avx2"], "leave them out with --device cuda")
    # --threads 0 is a thread count like -1 (it ran the default sweep, and passed the --device cuda check)
    check_usage_error(["bench", "gemm", "--threads", "0"], "--threads must be at least 1, got 0")
    check_usage_error(["bench", "scaling", "--device", "cuda", "--threads", "0"], "leave them out with --device cuda")
    if run_json("info", "--json")["cuda_runtime"]["devices"]:
        return
    for which in ("convert", "scaling", "gemm"):
        rc, out, err = run("bench", which, "--device", "cuda")
        lines = err.strip().splitlines()
        assert rc == 1 and out == "" and len(lines) == 1, (which, rc, out, err)
        assert "no CUDA" in lines[0] and "cuda" in lines[0], (which, err)


@test
def info_text_and_json():
    rc, out, err = run("info")
    assert rc == 0 and err == "", (rc, err)
    for token in ("fp8kit ", "CPU", "features", "ISA levels", "in force", "convert", "quantize", "gemm", "gemv",
                  "threads", "CUDA", "MPI"):
        assert token in out, (token, out)
    j = run_json("info", "--json")
    for key in ("version", "build_type", "compiler", "cpu", "features", "levels", "isa", "kernels", "contracts",
                "threads", "cuda", "mpi"):
        assert key in j, key
    assert isinstance(j["features"], list) and all(isinstance(f, str) for f in j["features"]), j["features"]
    all_levels = ["scalar", "avx2", "avx512", "avx512-bf16", "amx"]
    assert j["levels"] == all_levels[:len(j["levels"])] and j["levels"][0] == "scalar", j["levels"]
    assert j["isa"] == j["levels"][-1], j  # nothing caps it in this environment
    for family in ("convert", "quantize", "gemm", "gemv", "gemm_f32", "gemv_f32"):
        assert isinstance(j["kernels"][family], str) and j["kernels"][family], (family, j["kernels"])
    assert j["contracts"]["gemm_f32"] == "bit-identical", j["contracts"]
    assert set(j["contracts"].values()) <= {"bit-identical", "fp32-bound"}, j["contracts"]
    assert ("avx2" in j["features"]) == ("avx2" in j["levels"]), j
    # What the build has, as CMake found it (FP8KIT_MPI=AUTO finds MPI where libopenmpi-dev is installed).
    assert j["cuda"] is (os.environ["FP8KIT_TEST_CUDA_BUILT"] == "ON"), j
    assert j["mpi"] is (os.environ["FP8KIT_TEST_MPI_BUILT"] == "ON"), j
    assert ("MPI built" in out) == j["mpi"] and ("CUDA built" in out) == j["cuda"], out
    # The devices the driver shows, or why there are none (never both, never neither).
    c = j["cuda_runtime"]
    assert (len(c["devices"]) > 0) != (c["unavailable"] != ""), c
    if not j["cuda"]:
        assert c["devices"] == [] and "no CUDA backend" in c["unavailable"], c
    for d in c["devices"]:
        assert set(d) == {"index", "name", "compute_capability", "memory_bytes", "multiprocessors"}, d
    # cuBLASLt is loaded at run time: its version, or why it could not be loaded (or that there is no backend).
    if j["cuda"]:
        assert re.fullmatch(r"\d+\.\d+\.\d+", c["cublaslt"]) or "could not be loaded" in c["cublaslt"], c
        assert "cuBLASLt " + c["cublaslt"] in out, out
    else:
        assert "no CUDA backend" in c["cublaslt"], c


@test
def fp8kit_isa_caps_every_family():
    levels = run_json("info", "--json")["levels"]
    for level in levels:
        rc, out, err = run("info", "--json", env={"FP8KIT_ISA": level})
        assert rc == 0, (level, err)
        j = json.loads(out)
        assert j["isa"] == level and j["isa_env"] == level, (level, j)
        if level == "scalar":
            assert all(k.startswith("scalar") for k in j["kernels"].values() if k), j["kernels"]
        if level == "avx2":
            assert j["kernels"]["convert"] == "avx2" and j["kernels"]["gemm"].startswith("avx2"), j["kernels"]
    # A cap above what the CPU has changes nothing.
    j = json.loads(run("info", "--json", env={"FP8KIT_ISA": "amx"})[1])
    assert j["isa"] == levels[-1], j
    # An unknown level: every command refuses it, in one line naming the valid ones, exit 2, before doing anything.
    for args in (["info"], ["formats"], ["cast", "1.5"]):
        rc, out, err = run(*args, env={"FP8KIT_ISA": "avx9"})
        assert rc == 2 and out == "", (args, rc, out)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "FP8KIT_ISA=avx9" in lines[0] and "avx512-bf16" in lines[0], (args, err)


@test
def bench_gemm_bad_shapes():
    for shapes, token in (("gemm:0", "gemm:0"), ("gemv:8192", "gemv:8192"), ("gemm:2x3", "gemm:2x3"),
                          ("conv:3", "conv:3"), ("gemm:64,", "''"), ("gemv:12x-4", "-4"), ("gemm:1e3", "1e3"),
                          ("gemm:100000", "100000"), ("gemv:65536x65536", "16 GiB")):
        check_usage_error(["bench", "gemm", "--shapes", shapes], token)
    check_usage_error(["bench", "gemm", "--reps", "2"], "--reps")
    check_usage_error(["bench", "gemm", "--bytes", "1M"], "--bytes")
    # Past OpenBLAS's MAX_THREADS the sgemm baseline ran fewer threads than its row said.
    config = run_json("bench", "gemm", "--shapes", "gemm:8", "--reps", "3", "--threads", "1", "--json")[0]
    limit = re.search(r"MAX_THREADS=(\d+)", config["openblas_config"] or "")
    if limit and int(limit.group(1)) < 1024:
        over = str(int(limit.group(1)) + 1)
        check_usage_error(["bench", "gemm", "--shapes", "gemm:8", "--threads", over], "MAX_THREADS")


@test
def train_compare_json_trace_scales_plot():
    with tempfile.TemporaryDirectory() as d:
        trace, scales, plot = (os.path.join(d, n) for n in ("trace.json", "scales.jsonl", "loss.svg"))
        args = ("train", "--compare", "fp32,fp8-delayed", "--steps", "3", "--json", "--profile", trace,
                "--log-scales", scales, "--plot", plot)
        rc, out, err = run(*args, timeout=300)
        assert rc == 0, f"fp8kit {' '.join(args)} exited {rc}: {err.strip()}"
        rows = json.loads(out, parse_constant=lambda name: (_ for _ in ()).throw(AssertionError(name)))
        assert [r["recipe"] for r in rows] == ["fp32", "fp8-delayed"], rows
        for r in rows:
            for key in ("recipe", "final_loss", "peak_bytes", "step_ms", "skipped_steps", "memory_ratio"):
                assert key in r, (key, r)
            assert 0 < r["final_loss"] < 10 and r["peak_bytes"] > 0 and r["step_ms"] > 0, r
        assert rows[1]["peak_bytes"] < rows[0]["peak_bytes"], rows
        events = json.load(open(trace))["traceEvents"]
        assert all(e["ph"] == "X" and "dur" in e for e in events)
        gemms = [e for e in events if e["cat"] == "gemm" and e["args"].get("recipe") == "fp8-delayed"]
        assert any(e["args"].get("path") == "fp8" for e in gemms), gemms[:3]
        assert any(e["name"].startswith("quantize") for e in events)
        lines = [json.loads(line) for line in open(scales)]
        assert lines and {"layer", "op", "role", "amax", "scale", "underflow_fraction", "saturated"} <= set(lines[0])
        assert {line["role"] for line in lines} == {"input", "weight", "grad_output"}
        # One line per quantization: a weight's forward and dgrad quantizations were two identical lines.
        keys = [(line["step"], line["layer"], line["op"], line["role"]) for line in lines]
        assert len(keys) == len(set(keys)), [k for k in keys if keys.count(k) > 1][:3]
        assert {(k[2].rsplit(".", 1)[1], k[3]) for k in keys} == {("forward", "input"), ("forward", "weight"),
                                                                   ("dgrad", "grad_output"), ("dgrad", "weight")}
        assert open(plot).read().startswith("<svg")


@test
def train_fp8_o2_storage_and_memory_breakdown():
    args = ("train", "--compare", "fp8-delayed,fp8-o2", "--steps", "3", "--json", "--quiet")
    rc, out, err = run(*args, timeout=300)
    assert rc == 0, f"fp8kit {' '.join(args)} exited {rc}: {err.strip()}"
    rows = {r["recipe"]: r for r in json.loads(out)}
    assert (rows["fp8-delayed"]["optimizer_state"], rows["fp8-delayed"]["master_weights"]) == ("fp32", "fp32"), rows
    assert (rows["fp8-o2"]["optimizer_state"], rows["fp8-o2"]["master_weights"]) == ("fp8", "bf16-sr"), rows
    for r in rows.values():
        b = r["peak_breakdown"]
        assert set(b) == {"parameters", "gradients", "optimizer_state", "activations", "temporary"}, b
        assert sum(b.values()) == r["peak_bytes"], (b, r["peak_bytes"])
    d, o = rows["fp8-delayed"]["peak_breakdown"], rows["fp8-o2"]["peak_breakdown"]
    # bfloat16 values and gradients: half; FP8 moments with a scale per 128: a little over a quarter.
    assert o["parameters"] * 2 <= d["parameters"] + 64 * 40 and o["gradients"] * 2 <= d["gradients"] + 64 * 40, (d, o)
    assert o["optimizer_state"] * 3 < d["optimizer_state"], (d, o)
    # What a step holds beyond the parameter state at its peak (the peaks may fall in different phases: fp8-o2's in
    # the forward, where no gradient is held yet): less with E4M3 saved LayerNorm and GELU inputs.
    assert o["activations"] + o["temporary"] < d["activations"] + d["temporary"], (d, o)
    # bfloat16 master weights export as FP8 like float32 ones.
    with tempfile.TemporaryDirectory() as d:
        out_path = os.path.join(d, "o2.safetensors")
        rc, out, err = run("train", "--recipe", "fp8-o2", "--steps", "2", "--quiet", "--export-fp8", out_path,
                           "--export-layout", "native", timeout=300)
        assert rc == 0, err
        rc, out, err = run("inspect", out_path, "--json")
        assert rc == 0, err
        tensors = {t["name"]: t for t in json.loads(out)["tensors"]}
        assert tensors["transformer.h.0.mlp.c_fc.weight"]["dtype"] == "F8_E4M3", tensors
    # The flags override a recipe's own storage.
    rc, out, err = run("train", "--recipe", "fp8-delayed", "--optimizer-state", "bf16", "--master-weights",
                       "bf16-kahan", "--steps", "2", "--json", "--quiet", timeout=300)
    assert rc == 0, err
    r = json.loads(out)[0]
    assert (r["optimizer_state"], r["master_weights"]) == ("bf16", "bf16-kahan"), r


@test
def train_eval_batches_sets_the_held_out_mean():
    rows = []
    for batches in ("1", "3"):
        args = ("train", "--recipe", "fp32", "--steps", "2", "--eval-batches", batches, "--json", "--quiet")
        rc, out, err = run(*args, timeout=300)
        assert rc == 0, f"fp8kit {' '.join(args)} exited {rc}: {err.strip()}"
        rows.append(json.loads(out)[0])
    assert [r["eval_batches"] for r in rows] == [1, 3], rows
    # The same training (the evaluation never changes it), a mean over other held-out batches.
    assert rows[0]["losses"] == rows[1]["losses"] and rows[0]["final_loss"] != rows[1]["final_loss"], rows


@test
def train_fp32_spread_measures_fp32_against_itself():
    args = ("train", "--model", "cnn", "--compare", "fp32,bf16", "--steps", "40", "--batch", "16", "--eval-batches",
            "2", "--fp32-spread", "2", "--json", "--quiet")
    rc, out, err = run(*args, timeout=300)
    assert rc == 0, f"fp8kit {' '.join(args)} exited {rc}: {err.strip()}"
    rows = {r["recipe"]: r for r in json.loads(out)}
    spread = rows["fp32"]["fp32_spread"]
    assert spread["runs"] == 2 and len(spread["final_losses"]) == 2, spread
    fp32 = rows["fp32"]["final_loss"]
    # One ulp of every initial weight, 40 steps later: other losses, close to fp32's.
    assert all(loss != fp32 and abs(loss - fp32) < 0.2 * fp32 for loss in spread["final_losses"]), (fp32, spread)
    for gap, loss in zip(spread["loss_gaps"], spread["final_losses"]):
        assert abs(gap - (loss - fp32) / fp32) < 1e-6, spread
    assert "fp32_spread" not in rows["bf16"], rows["bf16"]
    rc, out, err = run("train", "--model", "cnn", "--recipe", "fp32", "--steps", "5", "--eval-batches", "1",
                       "--fp32-spread", "1", timeout=300)
    assert rc == 0 and "fp32 against itself: 1 more run, each initial weight one ulp" in out, (rc, out, err)
    # The extra runs are the fp32 row's recipe, storage options included: they were plain fp32, so the gap of FP8
    # moments to FP32 ones (-0.2% here) was reported as fp32's spread (one ulp: -0.003% here).
    rc, out, err = run("train", "--recipe", "fp32", "--steps", "30", "--eval-batches", "4", "--optimizer-state", "fp8",
                       "--fp32-spread", "1", "--json", "--quiet", timeout=300)
    gap = json.loads(out)[0]["fp32_spread"]["loss_gaps"][0] if rc == 0 else None
    assert rc == 0 and abs(gap) < 5e-4, (rc, gap, err)


@test
def train_starts_compares_recipes_by_their_mean_over_one_ulp_starts():
    args = ("train", "--model", "cnn", "--compare", "fp32,bf16", "--steps", "40", "--batch", "16", "--threads", "1", "--eval-batches",
            "2", "--starts", "3", "--json", "--quiet")
    rc, out, err = run(*args, timeout=300)
    assert rc == 0, f"fp8kit {' '.join(args)} exited {rc}: {err.strip()}"
    rows = {r["recipe"]: r for r in json.loads(out)}
    means = {}
    for recipe, r in rows.items():
        starts = r["starts"]
        losses = starts["final_losses"]
        # Start 0 is the row's own run; the others moved (one ulp of every initial weight, 40 steps later).
        assert starts["runs"] == 3 and len(losses) == 3 and losses[0] == r["final_loss"], (recipe, starts)
        assert len(set(losses)) == 3 and all(abs(l - losses[0]) < 0.2 * losses[0] for l in losses), (recipe, losses)
        means[recipe] = sum(losses) / 3
        assert abs(starts["mean_final_loss"] - means[recipe]) <= 1e-6 * means[recipe], (recipe, starts)
    # The gap is the means' (not start 0's), its standard error the two means' carried through their ratio.
    gap = means["bf16"] / means["fp32"] - 1
    assert abs(rows["bf16"]["loss_gap"] - gap) <= 1e-9, (rows["bf16"]["loss_gap"], gap)
    rel_se = {k: statistics.stdev(rows[k]["starts"]["final_losses"]) / math.sqrt(3) / means[k] for k in means}
    se = (1 + gap) * math.sqrt(rel_se["bf16"] ** 2 + rel_se["fp32"] ** 2)
    assert abs(rows["bf16"]["starts"]["loss_gap_standard_error"] - se) <= 1e-6 * se, (rows["bf16"]["starts"], se)
    assert rows["fp32"]["loss_gap"] == 0 and rows["fp32"]["starts"]["loss_gap_standard_error"] is None, rows["fp32"]
    # fp32's perturbed starts are its spread, and the same runs --fp32-spread trains (the same one-ulp moves).
    assert rows["fp32"]["fp32_spread"]["final_losses"] == rows["fp32"]["starts"]["final_losses"][1:], rows["fp32"]
    rc, out, err = run("train", "--model", "cnn", "--recipe", "fp32", "--steps", "40", "--batch", "16", "--threads", "1",
                       "--eval-batches", "2", "--fp32-spread", "1", "--json", "--quiet", timeout=300)
    assert rc == 0 and json.loads(out)[0]["fp32_spread"]["final_losses"] == rows["fp32"]["starts"]["final_losses"][1:2]
    # The tables say what the loss is and print each gap with its standard error.
    rc, out, err = run("train", "--model", "cnn", "--compare", "fp32,bf16", "--steps", "20", "--batch", "8", "--threads", "1",
                       "--eval-batches", "1", "--seeds", "1-2", "--starts", "2", "--quiet", timeout=300)
    assert rc == 0, err
    lines = out.splitlines()
    assert [l.split()[0] for l in lines[2:4]] == ["1", "2"] and lines[2].split()[3].startswith("+-"), out
    assert "the mean over 2 starts of each recipe" in out and "start 1 with each initial weight" in out, out


@test
def train_seeds_summarizes_each_recipe_against_fp32_of_the_same_seed():
    args = ("train", "--compare", "fp32,bf16", "--steps", "3", "--eval-batches", "1", "--seeds", "1,3-4",
            "--fp32-spread", "1", "--json", "--quiet")
    rc, out, err = run(*args, timeout=300)
    assert rc == 0, f"fp8kit {' '.join(args)} exited {rc}: {err.strip()}"
    d = json.loads(out)
    assert d["seeds"] == [1, 3, 4], d["seeds"]
    assert [(r["seed"], r["recipe"]) for r in d["runs"]] == [(s, r) for s in (1, 3, 4) for r in ("fp32", "bf16")]
    fp32 = {r["seed"]: r for r in d["runs"] if r["recipe"] == "fp32"}
    bf16 = {r["seed"]: r for r in d["runs"] if r["recipe"] == "bf16"}
    # Each seed trains on its own data from its own initialization.
    assert len({r["losses"][0] for r in fp32.values()}) == 3, fp32
    gaps = sorted((bf16[s]["final_loss"] - fp32[s]["final_loss"]) / fp32[s]["final_loss"] for s in (1, 3, 4))
    summary = {r["recipe"]: r for r in d["summary"]}
    b = summary["bf16"]
    mean = sum(gaps) / 3
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / 2)
    assert b["runs"] == 3 and b["nonfinite"] == 0, b
    for key, want in (("median_gap", gaps[1]), ("mean_gap", mean), ("sd", sd), ("standard_error", sd / math.sqrt(3)),
                      ("min_gap", gaps[0]), ("max_gap", gaps[2])):
        assert abs(b[key] - want) <= 1e-6 * max(1e-6, abs(want)), (key, b[key], want)
    ratios = sorted(bf16[s]["peak_bytes"] / fp32[s]["peak_bytes"] for s in (1, 3, 4))
    assert abs(b["memory_ratio"] - ratios[1]) < 1e-9, (b, ratios)
    assert summary["fp32"]["median_gap"] == 0 and summary["fp32"]["memory_ratio"] == 1, summary["fp32"]
    # fp32 against itself: one perturbed run per seed, pooled.
    self_gaps = [g for r in fp32.values() for g in r["fp32_spread"]["loss_gaps"]]
    assert d["fp32_spread"]["runs"] == 3 and len(self_gaps) == 3, d
    assert abs(d["fp32_spread"]["max_gap"] - max(self_gaps)) <= 1e-12, (d["fp32_spread"], self_gaps)
    # The table: a line per seed (fp32's loss, bf16's gap), then the summary rows.
    rc, out, err = run("train", "--compare", "fp32,bf16", "--steps", "2", "--eval-batches", "1", "--seeds", "2-3",
                       "--quiet", timeout=300)
    assert rc == 0, err
    lines = out.splitlines()
    assert "seeds 2-3" in lines[0], out
    assert [l.split()[0] for l in lines[2:4]] == ["2", "3"] and lines[2].split()[2].endswith("%"), out
    assert any(l.startswith("bf16 ") and l.split()[1] == "2" for l in lines), out
    assert not any(l.startswith("fp32, one ulp") for l in lines), out


@test
def train_bad_usage_exit_2():
    for args in (("train", "--recipe", "fp9"), ("train", "--recipe", "fp32", "--compare", "bf16"),
                 ("train", "--steps", "0"), ("train", "--data", "/nonexistent/file.txt", "--steps", "1"),
                 ("train", "--on-nonfinite", "ignore"), ("train", "--optimizer-state", "int4"),
                 ("train", "--master-weights", "fp16"), ("train", "--eval-batches", "0"),
                 ("train", "--fp32-spread", "-1"), ("train", "--fp32-spread", "99999999999"), ("train", "--recipe", "bf16", "--fp32-spread", "1"),
                 ("train", "--recipe", "fp32", "--fp32-spread", "1", "--parallel", "ddp"),
                 ("train", "--starts", "0"), ("train", "--starts", "1001"), ("train", "--starts", "2", "--fp32-spread", "1"),
                 ("train", "--starts", "2", "--save-checkpoint", "c.safetensors"), ("train", "--starts", "2", "--parallel", "ddp"),
                 ("train", "--recipe", "fp32", "--steps", "1", "--plot", "--json"),  # (wrote an SVG named --json)
                 ("train", "--recipe", "fp32", "--steps", "1", "--export-fp8", "--json"),
                 ("train", "--seeds", "3-1"), ("train", "--seeds", "1,1"), ("train", "--seeds", "1,x"),
                 ("train", "--seeds", "-1"), ("train", "--seeds", ""), ("train", "--seeds", "1-5000"),
                 ("train", "--seeds", "1-2", "--seed", "3"), ("train", "--seeds", "1-2", "--compare", "bf16,fp8-o2"),
                 ("train", "--seeds", "1-2", "--plot", "loss.svg"), ("train", "--seeds", "1-2", "--parallel", "ddp"),
                 # integers parsed strictly (CLI11 clamped them), empty values refused, threads capped
                 ("train", "--steps", "99999999999999999999"), ("train", "--seed", "-1"), ("train", "--steps", "0x10"),
                 ("train", "--batch", "1.5"), ("train", "--threads", "100000"), ("train", "--threads", "0"),
                 ("train", "--compare", ""),
                 ("train", "--steps", "3", "--inject-nan", "3"), ("train", "--inject-nan", "-5"),
                 ("train", "--data", "."), ("train", "--plot", "/nonexistent-dir/loss.svg"),
                 ("train", "--plot", "p.svg", "--profile", "p.svg"), ("bench", "bogus"), ("bench", "gemm", "--reps", "x"),
                 ("bench", "convert", "--isa", ""), ("bench", "convert", "--isa", "avx2,all"),
                 ("bench", "convert", "--isa", "scalar,scalar"),
                 # control bytes in what is echoed (a name, a path) come out escaped: still one line
                 ("cast", "--to", "e4m3fn\n\x1b[31mx", "1"), ("analyze", "no\nsuch.npy"),
                 ("cast", "--seed", "5", "1.1")):
        rc, out, err = run(*args)
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, (args, rc, out, err)
    # What is wrong with an integer, said as such (not the type's range for "1.5").
    for value, needle in (("1.5", "'1.5' is not a whole decimal number"), ("0x10", "not a whole decimal number"),
                          ("99999999999999999999", "is too large for it")):
        check_usage_error(["train", "--steps", value], needle)
    check_usage_error(["train", "--seed", "-1"], "'-1' is negative")
    check_usage_error(["train", "--starts", "3", "--fp32-spread", "2"], "--starts 3 trains fp32 from the one-ulp starts")
    check_usage_error(["train", "--steps", "2", "--steps", "3"], "--steps is given 2 times; give it once")
    rc, out, err = run("train", "--recipe", "fp8-current", "--steps", "3", "--inject-nan", "1", "--on-nonfinite",
                       "abort")
    assert rc == 1 and "non-finite gradient" in err and "step 1" in err, (rc, err)
    # A plot that cannot be written: said naming --plot, after the table (a long run's results were lost).
    rc, out, err = run("train", "--recipe", "fp32", "--steps", "2", "--eval-batches", "1", "--plot", "/dev/full")
    assert rc == 1 and out.splitlines()[1].startswith("recipe") and err.startswith("fp8kit train: --plot: "), (
        rc, out, err)


@test
def train_never_writes_over_its_inputs_and_writes_outputs_whole():
    with tempfile.TemporaryDirectory() as d:
        text = os.path.join(d, "text.txt")
        with open(text, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog. " * 200)
        with open(text, "rb") as f:
            before = f.read()
        for option in ("--log-scales", "--plot", "--profile"):
            rc, out, err = run("train", "--steps", "2", "--data", text, option, text)
            assert rc == 2 and "is the training data" in err, (option, rc, err)
        with open(text, "rb") as f:
            assert f.read() == before
        # A report replaces an earlier report of its kind (a rerun) or an empty file, never a file that is something
        # else unless --force says so.
        reports = {"--log-scales": os.path.join(d, "s.jsonl"), "--plot": os.path.join(d, "p.svg"),
                   "--profile": os.path.join(d, "t.json")}
        one_step = ("train", "--recipe", "fp8-delayed", "--steps", "1", "--eval-batches", "1", "--quiet")
        for option, path in reports.items():
            with open(path, "w") as f:
                f.write("notes the user keeps\n")
            rc, out, err = run(*one_step, option, path)
            assert rc == 2 and "is not a report fp8kit train wrote" in err and "--force" in err, (option, rc, err)
            assert open(path).read() == "notes the user keeps\n", option
            rc, out, err = run(*one_step, option, path, "--force")
            assert rc == 0 and open(path).read() != "notes the user keeps\n", (option, rc, err)
            rc, out, err = run(*one_step, option, path)  # a rerun replaces its own report
            assert rc == 0, (option, rc, err)
            open(path, "w").close()
            rc, out, err = run(*one_step, option, path)  # an empty file holds nothing
            assert rc == 0 and os.path.getsize(path) > 0, (option, rc, err)
        # A run that aborts leaves a whole log of the steps before (an earlier log stays whole until then).
        log = os.path.join(d, "scales.jsonl")
        with open(log, "w") as f:
            f.write('{"amax":1.0,"layer":"an earlier log","recipe":"fp8-current","step":0}\n')
        rc, out, err = run("train", "--recipe", "fp8-current", "--steps", "4", "--inject-nan", "2", "--on-nonfinite",
                           "abort", "--log-scales", log)
        assert rc == 1, (rc, err)
        with open(log) as f:
            rows = [json.loads(line) for line in f]
        assert rows and {r["step"] for r in rows} == {0, 1}, sorted({r["step"] for r in rows})
        assert not [n for n in os.listdir(d) if ".tmp-" in n], os.listdir(d)
        # The export creates its directory (README: --export-fp8 model-fp8/), not the folders above it (a typo would
        # grow a tree); a plot written through a symlink leaves the link a link.
        target = os.path.join(d, "real.svg")
        with open(target, "w") as f:
            f.write("old")
        os.symlink(target, os.path.join(d, "link.svg"))
        check_usage_error(["train", "--recipe", "fp8-delayed", "--steps", "1", "--export-fp8",
                           os.path.join(d, "new", "model-fp8") + "/"], "does not exist; create it first")
        assert not os.path.exists(os.path.join(d, "new"))
        rc, out, err = run("train", "--recipe", "fp8-delayed", "--steps", "1", "--quiet", "--export-fp8",
                           os.path.join(d, "model-fp8") + "/", "--plot", os.path.join(d, "link.svg"), "--force")
        assert rc == 0, err
        assert os.path.isfile(os.path.join(d, "model-fp8", "model.safetensors")), os.listdir(d)
        assert os.path.islink(os.path.join(d, "link.svg")) and open(target).read().startswith("<svg")


@test
def output_that_cannot_be_written_is_a_failure():
    # stdout on a full device, and --log-scales to one: exit 1 with one line (both were exit 0, the output lost).
    if not os.path.exists("/dev/full"):
        return
    with open("/dev/full", "w") as full:
        p = subprocess.run([BINARY, "formats", "--json"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
    assert p.returncode == 1 and p.stderr.count("\n") == 1 and "cannot write the output" in p.stderr, p.stderr
    code, _, err = run("train", "--recipe", "fp8-delayed", "--steps", "2", "--log-scales", "/dev/full", timeout=300)
    assert code == 1 and err.count("\n") == 1 and "--log-scales: cannot write '/dev/full'" in err, (code, err)


def main():
    global BINARY
    if len(sys.argv) != 2:
        print("usage: test_cli.py PATH_TO_fp8kit", file=sys.stderr)
        return 2
    BINARY = sys.argv[1]
    return run_test_functions(TESTS)


if __name__ == "__main__":
    sys.exit(main())
