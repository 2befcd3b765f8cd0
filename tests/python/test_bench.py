"""python -m fp8kit.bench runs end to end (a small size, one round): every row it reports, its ratios computed from
its own timings, and its argument errors. (The figures themselves are benchmarks, not tests: docs/python.md.)"""
import json

import pytest

from fp8kit import bench


def test_a_small_run_reports_every_row(capsys):
    assert bench.main(["--elements", "64K", "--reps", "3", "--rounds", "1", "--threads", "1", "--no-torch",
                       "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    timed = [r for r in rows if r["threads"] is not None]
    assert [(r["op"], r["baseline"]) for r in timed] == [
        ("f32->e4m3fn", "ml_dtypes astype"), ("f32->e4m3fn out=", "c++ bench convert"),
        ("e4m3fn->f32", "ml_dtypes astype"), ("e4m3fn->f32 out=", "c++ bench convert")]
    for r in timed:
        assert r["elements"] == 65536 and r["fp8kit_seconds"] > 0 and r["baseline_seconds"] > 0
        assert r["ratio"] == pytest.approx(r["baseline_seconds"] / r["fp8kit_seconds"])
        assert r["met"] == (r["ratio"] >= r["target"])
    overhead = [r for r in rows if r["threads"] is None]
    assert len(overhead) == 2 and all(0 < r["fp8kit_us"] < 1000 for r in overhead)


def test_the_table_and_the_argument_errors(capsys):
    assert bench.main(["--elements", "4096", "--reps", "3", "--rounds", "1", "--threads", "1", "--no-torch"]) == 0
    out = capsys.readouterr().out
    assert "ml_dtypes astype" in out and "us per call" in out
    for args in (["--reps", "2"], ["--rounds", "0"], ["--threads", "0"], ["--threads", "x"], ["--elements", "8"],
                 ["--elements", "lots"],
                 # What the C++ benchmark it runs would refuse (a traceback from inside the run, before):
                 ["--elements", "16"], ["--elements", "5G"], ["--threads", "1,100000"]):
        with pytest.raises(SystemExit) as e:
            bench.main(args)
        assert e.value.code == 2


def test_a_command_run_in_process_leaves_the_thread_count_and_isa_cap():
    """fp8kit's commands run in this process (python -m fp8kit.bench runs bench convert so): one that sets --threads
    or --isa puts the process's settings back when it ends, so the calls after it run as before."""
    from fp8kit import _fp8kit
    before = json.loads(_fp8kit.command(["info", "--json"]))
    _fp8kit.command(["bench", "convert", "--threads", "1", "--isa", "scalar", "--bytes", "1MiB", "--reps", "3",
                     "--ops", "f32->e4m3fn", "--json"])
    after = json.loads(_fp8kit.command(["info", "--json"]))
    assert (after["threads"], after["isa"]) == (before["threads"], before["isa"])
