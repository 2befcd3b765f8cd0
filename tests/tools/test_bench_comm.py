# `fp8kit bench comm` end to end: as one process, and under mpirun -np 2 (argv[2], when given, is mpirun): the JSON
# rows (every op x dtype x size, the fp32 row as each group's baseline, one report from rank 0), the bytes a rank
# hands over (FP8 a quarter of fp32's, bf16 a half), and the refusals. Exits 1 on any failure.
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checks import MPI_ENV, TestList, mpi_script_arguments, run_test_functions, under_mpirun  # noqa: E402

BINARY = None
MPIRUN = None
test = TestList()


def bench(ranks, *args):
    cmd = under_mpirun(MPIRUN, ranks if ranks > 1 else 0, [BINARY, "bench", "comm", *args])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=MPI_ENV)
    return p.returncode, p.stdout, p.stderr


def check_rows(rows, ranks, sizes):
    ops, dtypes = ["all_gather", "reduce_scatter", "all_reduce"], ["fp32", "bf16", "e4m3fn", "e5m2"]
    # The FP8 all-gathers twice: with current scaling (the amax agreed) and with a scale known before (delayed).
    assert len(rows) == (len(ops) * len(dtypes) + 2) * len(sizes), len(rows)
    for r in rows:
        for key in ("op", "dtype", "ranks", "elements", "bytes", "seconds", "gbps", "elements_per_second", "ratio",
                    "baseline", "backend"):
            assert key in r, (key, r)
        assert r["ranks"] == ranks and r["baseline"] == "fp32" and r["seconds"] > 0, r
        assert r["backend"] == ("mpi" if ranks > 1 else "local"), r
    for size in sizes:
        for op in ops:
            group = {r["dtype"]: r for r in rows
                     if r["op"] == op and r["elements"] == size // 4 and r["scaling"] != "delayed"}
            assert set(group) == set(dtypes), (op, size, group.keys())
            for r in group.values():
                fp8_gather = op == "all_gather" and r["dtype"] in ("e4m3fn", "e5m2")
                assert r["scaling"] == ("current" if fp8_gather else None), r
            if op == "all_gather":
                delayed = {r["dtype"]: r for r in rows
                           if r["op"] == op and r["elements"] == size // 4 and r["scaling"] == "delayed"}
                assert set(delayed) == {"e4m3fn", "e5m2"}, delayed.keys()
                for d, r in delayed.items():  # no amax all-reduce: a little fewer bytes than current scaling's
                    assert r["bytes"] <= group[d]["bytes"] and r["bytes"] <= 0.27 * group["fp32"]["bytes"], r
            assert abs(group["fp32"]["ratio"] - 1.0) < 1e-12, group["fp32"]
            fp32 = group["fp32"]["bytes"]
            if fp32 == 0:  # one rank's reduce-scatter sends nothing to others
                continue
            assert group["bf16"]["bytes"] <= 0.52 * fp32, (op, group["bf16"]["bytes"], fp32)
            for fp8 in ("e4m3fn", "e5m2"):
                assert group[fp8]["bytes"] <= 0.27 * fp32, (op, fp8, group[fp8]["bytes"], fp32)


@test
def one_process_json():
    rc, out, err = bench(1, "--json", "--sizes", "64KiB,1MiB", "--reps", "3")
    assert rc == 0, err
    check_rows(json.loads(out), 1, [64 << 10, 1 << 20])


@test
def two_ranks_json_from_rank_zero():
    if MPIRUN is None:
        print("skip: no mpirun (this build has no MPI backend)")
        return
    rc, out, err = bench(2, "--json", "--sizes", "64KiB,1MiB", "--reps", "3")
    assert rc == 0, err
    check_rows(json.loads(out), 2, [64 << 10, 1 << 20])  # one JSON document: only rank 0 printed


@test
def refusals_are_one_line_with_status_2():
    for args, needle in ((["--sizes", "12"], "outside 1KiB..1GiB"), (["--reps", "1"], "--reps"),
                         (["--sizes", "1MiB,x"], "--sizes")):
        rc, out, err = bench(1, *args)
        assert rc == 2 and needle in err and err.count("\n") == 1, (args, rc, err)


if __name__ == "__main__":
    BINARY, MPIRUN = mpi_script_arguments(sys.argv)
    sys.exit(run_test_functions(test))
