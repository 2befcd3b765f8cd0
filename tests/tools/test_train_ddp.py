# `fp8kit train --parallel ddp` end to end under mpirun -np 2 (argv[2] is mpirun; without it the checks skip with
# exit 77): fp32 data parallel follows the single-process run to FP32 rounding (each rank's half of the global
# batch, gradients weighted by 1/2 and summed in rank order: only the order of the sums over rows differs),
# fp8-delayed keeps its replicas identical and its losses close, the gradient payload's bytes drop (fp8 a quarter of fp32), one report from rank 0, and the
# refusals. Exits 1 on any failure.
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checks import MPI_ENV, TestList, mpi_script_arguments, run_test_functions, under_mpirun  # noqa: E402

BINARY = None
MPIRUN = None
test = TestList()


def train(ranks, *args):
    cmd = [BINARY, "train", "--json", *args] + (["--parallel", "ddp"] if ranks > 0 else [])
    p = subprocess.run(under_mpirun(MPIRUN, ranks, cmd), capture_output=True, text=True, timeout=300, env=MPI_ENV)
    assert p.returncode == 0, (cmd, p.stderr)
    return json.loads(p.stdout)  # one JSON document: only rank 0 printed


@test
def fp32_data_parallel_is_the_single_process_run():
    single = train(0, "--recipe", "fp32", "--steps", "4", "--batch", "8")[0]
    ddp = train(2, "--recipe", "fp32", "--steps", "4", "--batch", "8")[0]
    for a, b in zip(ddp["losses"], single["losses"]):
        assert abs(a - b) <= 1e-5 * abs(b), (ddp["losses"], single["losses"])
    assert abs(ddp["final_loss"] - single["final_loss"]) <= 1e-4 * single["final_loss"]
    assert ddp["ranks"] == 2 and ddp["parallel"] == "ddp" and ddp["replicas_identical"] is True, ddp


@test
def fp8_delayed_replicas_stay_identical_and_close():
    single = train(0, "--recipe", "fp8-delayed", "--steps", "4", "--batch", "8")[0]
    runs = {p: train(2, "--recipe", "fp8-delayed", "--steps", "4", "--batch", "8", "--grad-reduce", p)[0]
            for p in ("fp32", "bf16", "fp8")}
    for payload, r in runs.items():
        assert r["replicas_identical"] is True, (payload, r)
        assert r["grad_reduce"] == {"fp32": "fp32", "bf16": "bf16", "fp8": "e5m2"}[payload], r
        gap = abs(r["final_loss"] - single["final_loss"]) / single["final_loss"]
        assert gap < 0.01, (payload, r["final_loss"], single["final_loss"])
    b = {p: r["comm_bytes_per_step"]["all_reduce"] for p, r in runs.items()}
    assert b["bf16"] <= 0.52 * b["fp32"] and b["fp8"] <= 0.27 * b["fp32"], b


@test
def refusals_are_one_line_with_status_2():
    for args, needle in ((["--parallel", "fsdp"], "--parallel"), (["--grad-reduce", "fp8"], "needs --parallel ddp"),
                         (["--grad-reduce", "fp32"], "needs --parallel ddp"),
                         (["--grad-reduce", "fp16", "--parallel", "ddp"], "--grad-reduce")):
        p = subprocess.run([BINARY, "train", "--steps", "1", *args], capture_output=True, text=True, timeout=60,
                           env=MPI_ENV)
        assert p.returncode == 2 and needle in p.stderr and p.stderr.count("\n") == 1, (args, p.returncode, p.stderr)


if __name__ == "__main__":
    BINARY, MPIRUN = mpi_script_arguments(sys.argv)
    if MPIRUN is None:
        print("skip: this build has no MPI backend (install libopenmpi-dev openmpi-bin and reconfigure)")
        sys.exit(77 if os.environ.get("CI") != "true" else 1)
    sys.exit(run_test_functions(test))
