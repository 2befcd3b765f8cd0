"""The avx512-bf16 GEMV under isa-emu, driven as gemv() in src/ops/scaled_mm.cpp drives it: left rows in groups of
kGemvRows = 4 (the bfloat16 rows and A's scale view shifted per group), weight rows in chunks of kGemvChunk = 16.
Weights in four formats; left rows FP8 (e4m3fn, e5m2) or bfloat16 activations; M 1-16, K 64/100/256/1000 (masked
tails), scales per tensor, per row and per 1x128 / 128x128 block; one weight row with a NaN code. Each output
against the FP64 value of the product within mm_error_bound (the kFp32Bound contract, without its subnormal term:
nothing here is subnormal in bfloat16); the NaN row NaN; every output written."""
import struct
import sys

import ml_dtypes
import numpy as np

from emu_common import FORMATS, Arena, bf16_table, emulator

U = 2.0 ** -24
GEMV_ROWS, GEMV_CHUNK = 4, 16
emu, syms = emulator("gemv_avx512bf16")
setup = Arena(emu)
emu.call(syms["set_up"], setup.put(bf16_table()), 1)  # VBMI on: the kernel declines without it
CASE_DATA = setup.at
rng = np.random.default_rng(11)
UNWRITTEN = 0x7FC0DEAD


def decode(codes, f):
    return codes.view(getattr(ml_dtypes, FORMATS[f])).astype(np.float64)


def finite_codes(shape, f):
    codes = rng.integers(0, 256, shape, dtype=np.uint8)
    bad = ~np.isfinite(decode(codes, f))
    while bad.any():
        codes[bad] = rng.integers(0, 256, int(bad.sum()), dtype=np.uint8)
        bad = ~np.isfinite(decode(codes, f))
    return codes


def scales(kind, m, n, nkb):
    """(A's scales, their (r_div, r_stride, kb_stride)), the same for B: ScaleIndex's at(r, kb) =
    data[(r / r_div) * r_stride + kb * kb_stride]."""
    if kind == "tensor":
        return (np.array([0.75], np.float32), (1, 0, 0)), (np.array([2.0 ** -5 * 1.25], np.float32), (1, 0, 0))
    if kind == "row":  # per row of A, per weight row
        return ((rng.uniform(0.5, 2, m).astype(np.float32), (1, 1, 0)),
                (rng.uniform(0.01, 0.1, n).astype(np.float32), (1, 1, 0)))
    return ((rng.uniform(0.5, 2, (m, nkb)).astype(np.float32), (1, nkb, 1)),  # 1x128 and 128x128 (DeepSeek-V3's)
            (rng.uniform(0.01, 0.1, (-(-n // 128), nkb)).astype(np.float32), (128, nkb, 1)))


def at(data, index, r, kb):
    r_div, r_stride, kb_stride = index
    return float(data.reshape(-1)[(r // r_div) * r_stride + kb * kb_stride])


def run_case(wf, left, m, n, k, kind, nan_row):
    """None, or what failed; and the largest |error| / bound."""
    kblock = 128 if kind == "block" else k
    nkb = -(-k // kblock)
    w = finite_codes((n, k), wf)
    if nan_row is not None:
        w[nan_row, rng.integers(0, k)] = {0: 0x7F, 1: 0x7E}.get(wf, 0x80)
    if left == "bfloat16":
        x = rng.normal(0, 3, (m, k)).astype(np.float32).astype(ml_dtypes.bfloat16)
        x_bits, xv = x.view(np.uint16), x.astype(np.float64)
    else:
        lf = FORMATS.index(left)
        xc = finite_codes((m, k), lf)
        xv = decode(xc, lf)
        x_bits = xc.view(getattr(ml_dtypes, left)).astype(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    wv = decode(w, wf)
    (sa, sa_index), (sb, sb_index) = scales(kind, m, n, nkb)
    exact, abs_products = np.zeros((m, n)), np.zeros((m, n))
    for kb in range(nkb):
        products = xv[:, None, kb * kblock:(kb + 1) * kblock] * wv[None, :, kb * kblock:(kb + 1) * kblock]
        s = np.array([[at(sa, sa_index, i, kb) * at(sb, sb_index, j, kb) for j in range(n)] for i in range(m)])
        exact += products.sum(-1) * s
        abs_products += np.abs(products).sum(-1) * s

    arena = Arena(emu, CASE_DATA)
    xa, wa, saa, sba = arena.put(x_bits), arena.put(w), arena.put(sa), arena.put(sb)
    outa = arena.put(np.full((m, n), UNWRITTEN, np.uint32))
    args = arena.at
    for j0 in range(0, n, GEMV_CHUNK):
        j1 = min(n, j0 + GEMV_CHUNK)
        for i0 in range(0, m, GEMV_ROWS):
            packed = struct.pack("<6qQqQ", wf, min(GEMV_ROWS, m - i0), j0, j1, k, kblock, xa + i0 * k * 2, k, wa)
            packed += struct.pack("<Q4qQ4qQq", saa, *sa_index, i0, sba, *sb_index, 0, outa + i0 * n * 4, n)
            emu.write(args, packed)
            if emu.call(syms["run_gemv"], args) != 1:
                return "the kernel declined", 0.0
    got = np.frombuffer(emu.read(outa, m * n * 4), np.float32).reshape(m, n)
    if (got.view(np.uint32) == UNWRITTEN).any():
        return "outputs left unwritten", 0.0
    bad, worst = 0, 0.0
    for i in range(m):
        for j in range(n):
            e, g = exact[i, j], float(got[i, j])
            if j == nan_row:
                bad += not np.isnan(g)
                continue
            bound = (2 * k + 8) * U * abs_products[i, j] + 2 * U * abs(e)
            if not abs(g - e) <= bound:
                bad += 1
            elif bound > 0:
                worst = max(worst, abs(g - e) / bound)
    return (f"{bad} of {m * n} outputs outside the bound" if bad else None), worst


cases, failures, worst_all = 0, [], 0.0
for wf in range(4):
    for left in ("float8_e4m3fn", "float8_e5m2", "bfloat16"):
        for m in (1, 2, 3, 4, 5, 7, 16):
            for k in (64, 100, 256, 1000):
                for kind in ("tensor", "row", "block"):
                    n = 37 if m <= 4 else 21  # whole and partial groups of 8, 4 and 2 weight rows
                    failure, worst = run_case(wf, left, m, n, k, kind, 5 if (m == 3 and k == 100) else None)
                    cases += 1
                    worst_all = max(worst_all, worst)
                    if failure:
                        failures.append(f"{FORMATS[wf]} weights, {left} rows, M={m} K={k} {kind}: {failure}")
print(f"avx512-bf16 GEMV: {cases} cases, {len(failures)} failures; largest |error| / bound {worst_all:.3g}")
for f in failures[:20]:
    print("FAIL", f)
sys.exit(1 if failures else 0)
