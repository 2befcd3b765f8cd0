"""`python -m fp8kit.bench`: fp8kit's casts from Python against what a Python user has, in one run.

For each thread count: float32 -> e4m3fn and e4m3fn -> float32 on N elements (default 64M, the values spread as
`fp8kit bench convert` spreads them), timed as medians of interleaved repetitions against
  - ml_dtypes: `x.astype(ml_dtypes.float8_e4m3fn)` and back (one thread: that is what it has),
  - PyTorch's `.to(torch.float8_e4m3fn)` and back with torch.set_num_threads(T) (when torch is importable),
  - the C++ kernel's own figure: `fp8kit bench convert --ops ...` at the same size and threads, run in this
    process right after (the binding should add nothing to the kernel: no copy, no conversion),
and the call overhead of fp8kit.cast on a 16-element array. Memory bandwidth drifts on a shared machine: the Python
timings alternate with the C++ benchmark in rounds, and each figure is a median of the rounds' medians. Throughput
counts input plus output bytes (the C++ benchmark's convention). Ratios: the baseline's time / fp8kit's (> 1: fp8kit
is faster); vs C++: the C++ benchmark's time / fp8kit.cast's with out= (1.0: the binding costs nothing).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Optional

import ml_dtypes
import numpy as np

from . import _fp8kit, cast, conversion_kernel

_TARGETS = {"ml_dtypes": 8.0, "torch": 2.0, "c++": 0.9}  # issue targets: >= 8x, >= 2x, within 10%
_OVERHEAD_TARGET_US = 2.0


def _inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 values spread like activations (normal x 2^(3k), k in [-6, 3]) and random FP8 codes."""
    rng = np.random.default_rng(1234)
    x = rng.standard_normal(n, dtype=np.float32)
    x *= np.exp2(3.0 * rng.integers(-6, 4, n)).astype(np.float32)
    codes = rng.integers(0, 256, n, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    return x, codes


# A pause before each timed call when PyTorch is in the run: its OpenMP runtime and fp8kit's are two, and each one's
# idle threads spin for a while after a parallel call, taking the cores from whichever runs next (measured: fp8kit's
# 2-thread decode right after torch's at 1/5 of its speed). 20 ms lets them go to sleep.
_PAUSE_S = 0.02


def _median_times(fns: dict[str, Callable[[], Any]], reps: int, pause: float) -> dict[str, float]:
    """Each function timed `reps` times, interleaved (one call of each per round), after one warm-up call each, with
    `pause` seconds before each timed call."""
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for name, f in fns.items():
            if pause:
                time.sleep(pause)
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def _cpp_figures(n: int, threads: int, reps: int) -> dict[str, float]:
    """Seconds per call of the C++ kernels (`fp8kit bench convert`) for the two casts, non-saturating encode.
    The C++ benchmark binds its OpenMP threads one per CPU unless OMP_PROC_BIND is set, and the main thread would
    stay bound for what this process times next (NumPy, PyTorch, fp8kit.cast): here everything runs as a Python
    user's process does, unbound (OMP_PROC_BIND=false unless the environment says otherwise)."""
    os.environ.setdefault("OMP_PROC_BIND", "false")
    rows = json.loads(_fp8kit.command(["bench", "convert", "--json", "--ops", "f32->e4m3fn,e4m3fn->f32", "--bytes",
                                       str(4 * n), "--threads", str(threads), "--reps", str(reps)]))
    out = {}
    for r in rows:
        if r["op"] == "f32->e4m3fn" and r["overflow"] == "non-saturating" and r["scale"] == 1.0:
            out["encode"] = r["seconds"]
        elif r["op"] == "e4m3fn->f32" and r["scale"] == 1.0:
            out["decode"] = r["seconds"]
    return out


def _call_overhead_us(reps: int) -> dict[str, float]:
    """Microseconds per fp8kit.cast call on 16 float32 elements (median over `reps` batches of 2000 calls)."""
    x = np.linspace(-10, 10, 16, dtype=np.float32)
    out = np.empty(16, ml_dtypes.float8_e4m3fn)
    result = {}
    for name, f in (("cast 16 elements", lambda: cast(x, "e4m3fn")),
                    ("cast 16 elements, out=", lambda: cast(x, "e4m3fn", out=out))):
        batches = []
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(2000):
                f()
            batches.append((time.perf_counter() - start) / 2000 * 1e6)
        result[name] = statistics.median(batches)
    return result


def run(elements: int, threads: list[int], reps: int, rounds: int = 3, with_torch: bool = True) -> list[dict]:
    x, codes = _inputs(elements)
    q = np.empty(elements, ml_dtypes.float8_e4m3fn)
    back = np.empty(elements, np.float32)
    torch: Optional[Any] = None
    if with_torch:
        try:
            import torch  # noqa: F811
        except ImportError:
            torch = None
    rows: list[dict] = []
    bytes_encode, bytes_decode = 5 * elements, 5 * elements  # 4 bytes in + 1 out, 1 in + 4 out

    def row(op: str, t: int, fp8kit_s: float, baseline: str, baseline_s: float, ratio: float, nbytes: int) -> None:
        target = _TARGETS[baseline.split(" ")[0]]
        rows.append({"op": op, "threads": t, "elements": elements, "fp8kit_seconds": fp8kit_s,
                     "fp8kit_gbps": nbytes / fp8kit_s / 1e9, "baseline": baseline, "baseline_seconds": baseline_s,
                     "ratio": ratio, "target": target, "met": ratio >= target, "kernel": conversion_kernel()})

    for t in threads:
        # Against the C++ benchmark: fp8kit.cast writing into arrays it is given, interleaved only with itself, as
        # the C++ harness interleaves its kernel with memcpy. Against the libraries: every call allocates its result
        # (first-touch page faults included, for all alike), PyTorch's calls paused around (_PAUSE_S).
        kernels: dict[str, Callable[[], Any]] = {
            "fp8kit encode out": lambda: cast(x, "e4m3fn", out=q, threads=t),
            "fp8kit decode out": lambda: cast(codes, "float32", out=back, threads=t),
        }
        libraries: dict[str, Callable[[], Any]] = {
            "fp8kit encode": lambda: cast(x, "e4m3fn", threads=t),
            "fp8kit decode": lambda: cast(codes, "float32", threads=t),
            "ml_dtypes encode": lambda: x.astype(ml_dtypes.float8_e4m3fn),
            "ml_dtypes decode": lambda: codes.astype(np.float32),
        }
        if torch is not None:
            torch.set_num_threads(t)
            xt, ct = torch.from_numpy(x), torch.from_numpy(codes.view(np.uint8)).view(torch.float8_e4m3fn)
            libraries["torch encode"] = lambda: xt.to(torch.float8_e4m3fn)
            libraries["torch decode"] = lambda: ct.to(torch.float32)
        # Memory bandwidth on a shared machine drifts by tens of percent within seconds: the Python timings and the
        # C++ benchmark alternate in rounds, and each figure is the median of its rounds' medians.
        rounds_py, rounds_cpp = [], []
        for _ in range(rounds):
            times = _median_times(kernels, reps, 0.0)
            rounds_cpp.append(_cpp_figures(elements, t, reps))
            times.update(_median_times(libraries, reps, _PAUSE_S if torch is not None else 0.0))
            rounds_py.append(times)
        m = {k: statistics.median(r[k] for r in rounds_py) for k in rounds_py[0]}
        cpp = {k: statistics.median(r[k] for r in rounds_cpp) for k in ("encode", "decode")}
        for op, nbytes in (("encode", bytes_encode), ("decode", bytes_decode)):
            name = "f32->e4m3fn" if op == "encode" else "e4m3fn->f32"
            mine = m[f"fp8kit {op}"]
            row(name, t, mine, "ml_dtypes astype", m[f"ml_dtypes {op}"], m[f"ml_dtypes {op}"] / mine, nbytes)
            if torch is not None:
                row(name, t, mine, "torch .to()", m[f"torch {op}"], m[f"torch {op}"] / mine, nbytes)
            mine_out = m[f"fp8kit {op} out"]
            row(name + " out=", t, mine_out, "c++ bench convert", cpp[op], cpp[op] / mine_out, nbytes)
    for name, us in _call_overhead_us(max(reps, 5)).items():
        rows.append({"op": name, "threads": None, "elements": 16, "fp8kit_us": us, "target_us": _OVERHEAD_TARGET_US,
                     "met": us <= _OVERHEAD_TARGET_US, "kernel": conversion_kernel()})
    return rows


def _count(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    try:
        if text and text[-1] in units:
            value = int(text[:-1]) * units[text[-1]]
        else:
            value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a count (digits, optionally K, M or G)") from None
    # The C++ benchmark it runs beside takes the float32 array's bytes, 4 KiB .. 16 GiB.
    if not 1024 <= value <= 4 << 30:
        raise argparse.ArgumentTypeError(f"1K .. 4G elements (the C++ benchmark's 4 KiB .. 16 GiB of float32), "
                                         f"not {value}")
    return value


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fp8kit.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=_count, default=64 << 20, help="float32 elements (default 64M)")
    parser.add_argument("--threads", default=None,
                        help="comma list of thread counts (default: 1, then all cores)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per measurement and round (default 5, >= 3)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of Python timings alternating with the C++ benchmark (default 3)")
    parser.add_argument("--no-torch", action="store_true", help="leave PyTorch out even when it is importable")
    parser.add_argument("--json", action="store_true", help="print a JSON array instead of the table")
    args = parser.parse_args(argv)
    if args.reps < 3:
        parser.error(f"--reps must be at least 3, got {args.reps}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.threads is None:
        threads = [1] + ([os.cpu_count()] if (os.cpu_count() or 1) > 1 else [])
    else:
        try:
            threads = [int(t) for t in args.threads.split(",")]
        except ValueError:
            parser.error(f"--threads: '{args.threads}' is not a comma list of counts")
        if any(t < 1 or t > _fp8kit.max_threads for t in threads):
            parser.error(f"--threads: every count must be 1 .. {_fp8kit.max_threads}, got {args.threads}")
    rows = run(args.elements, threads, args.reps, args.rounds, not args.no_torch)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               "unknown CPU") if os.path.exists("/proc/cpuinfo") else "unknown CPU"
    print(f"fp8kit.cast on {args.elements} elements ({conversion_kernel()} kernels, {cpu}); "
          f"medians of {args.rounds} x {args.reps} "
          f"interleaved repetitions; ratio: baseline time / fp8kit time (c++: the C++ benchmark's time / "
          f"fp8kit.cast's with out=)")
    print(f"{'op':<20} {'threads':>7} {'fp8kit GB/s':>12} {'baseline':<18} {'ratio':>7} {'target':>7}  met")
    for r in rows:
        if r["threads"] is None:
            print(f"{r['op']:<28} {r['fp8kit_us']:.2f} us per call (target <= {r['target_us']:.0f} us)  "
                  f"{'yes' if r['met'] else 'NO'}")
            continue
        print(f"{r['op']:<20} {r['threads']:>7} {r['fp8kit_gbps']:>12.2f} {r['baseline']:<18} {r['ratio']:>7.2f} "
              f"{r['target']:>7.2f}  {'yes' if r['met'] else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
