# `fp8kit train --parallel ddp|fsdp` end to end under mpirun -np 2 (argv[2] is mpirun; without it the checks skip
# with exit 77): fp32 data parallel follows the single-process run to FP32 rounding (each rank's half of the global
# batch, gradients weighted by 1/2 and summed in rank order: only the order of the sums over rows differs),
# fp8-delayed keeps its replicas identical and its losses close, the gradient payload's bytes drop (fp8 a quarter of
# fp32); fsdp trains bit for bit as ddp with less memory, its FP8 weight gathers move a quarter of fp32's bytes per
# element; a rank that throws or dies ends the job in bounded time with one line naming it and the step; ranks given
# other settings are refused at start; one report from rank 0, and the refusals. Exits 1 on any failure.
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checks import MPI_ENV, TestList, mpi_script_arguments, run_test_functions, under_mpirun  # noqa: E402

BINARY = None
MPIRUN = None
test = TestList()


def train(ranks, *args, parallel="ddp"):
    # 2 held-out batches, not 16: the runs compared here are evaluated alike, and the evaluation was half the time
    cmd = [BINARY, "train", "--json", "--eval-batches", "2", *args] + (["--parallel", parallel] if ranks > 0 else [])
    p = subprocess.run(under_mpirun(MPIRUN, ranks, cmd), capture_output=True, text=True, timeout=300, env=MPI_ENV)
    assert p.returncode == 0, (cmd, p.stderr)
    return json.loads(p.stdout)  # one JSON document: only rank 0 printed


def fp8kit_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("fp8kit")]


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
def fsdp_is_ddp_bit_for_bit_with_less_memory():
    for recipe in ("fp32", "fp8-delayed"):
        ddp = train(2, "--recipe", recipe, "--steps", "3")[0]
        fsdp = train(2, "--recipe", recipe, "--steps", "3", parallel="fsdp")[0]
        assert fsdp["losses"] == ddp["losses"] and fsdp["final_loss"] == ddp["final_loss"], (ddp, fsdp)
        assert fsdp["parallel"] == "fsdp" and fsdp["replicas_identical"] is True, fsdp
        assert ddp["comm_bytes_per_step"]["all_gather"] == 0, ddp["comm_bytes_per_step"]  # ddp only all-reduces
        assert fsdp["peak_bytes"] < 0.85 * ddp["peak_bytes"], (fsdp["peak_bytes"], ddp["peak_bytes"])
        # Gradients are reduce-scattered (half an all-reduce's bytes), weights gathered.
        c = fsdp["comm_bytes_per_step"]
        assert c["all_gather"] > 0 and c["reduce_scatter"] > 0 and c["all_reduce"] < 1024, c


@test
def fsdp_fp8_weight_gathers_move_a_quarter_of_fp32s_bytes():
    def per_element(run, payload):
        g = run["fsdp_all_gather_per_step"]["gemm_weights"][payload]
        return g["bytes"] / g["elements"]
    runs = {r: train(2, "--recipe", r, "--steps", "2", parallel="fsdp")[0]
            for r in ("fp32", "bf16", "fp8-delayed", "mxfp8")}
    fp32, bf16 = per_element(runs["fp32"], "float32"), per_element(runs["bf16"], "bfloat16")
    assert 4.0 <= fp32 < 4.02 and 2.0 <= bf16 < 2.02, (fp32, bf16)
    for recipe in ("fp8-delayed", "mxfp8"):  # mxfp8: one E8M0 scale per 32 codes travels too
        fp8 = per_element(runs[recipe], "e4m3fn")
        assert fp8 <= 0.27 * fp32 and fp8 <= 0.52 * bf16, (recipe, fp8, fp32, bf16)
        assert "bfloat16" in runs[recipe]["fsdp_all_gather_per_step"]["gemm_weights"], recipe  # the bf16 head
    assert list(runs["fp32"]["fsdp_all_gather_per_step"]["other_parameters"]) == ["float32"], runs["fp32"]


@test
def fsdp_collectives_are_profiler_events_with_bytes():
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        train(2, "--recipe", "fp8-delayed", "--steps", "2", "--profile", trace, parallel="fsdp")
        with open(trace) as f:
            events = json.load(f)["traceEvents"]
    comm = [e for e in events if e.get("cat") == "comm"]
    gathers = [e for e in comm if e["name"] == "comm.all_gather_rows" and e["args"].get("payload") == "e4m3fn"]
    assert gathers and all(int(e["args"]["bytes"]) > 0 and e["args"]["ranks"] == "2" for e in gathers), comm[:3]
    assert any(e["name"] == "comm.all_gather_cols" for e in comm), {e["name"] for e in comm}
    assert any(e["name"] == "comm.reduce_scatter" for e in comm), {e["name"] for e in comm}


@test
def a_rank_that_fails_ends_the_job_with_one_line():
    for spec, rank, step in (("1:2", 1, 2), ("0:1", 0, 1), ("1:2:kill", 1, 2)):
        for parallel in ("ddp", "fsdp"):
            cmd = [BINARY, "train", "--recipe", "fp8-delayed", "--steps", "6", "--eval-batches", "1", "--parallel",
                   parallel, "--inject-rank-failure", spec]
            start = time.monotonic()
            p = subprocess.run(under_mpirun(MPIRUN, 2, cmd), capture_output=True, text=True, timeout=120, env=MPI_ENV)
            took = time.monotonic() - start
            assert p.returncode != 0 and took < 60, (spec, parallel, p.returncode, took)
            if spec.endswith("kill"):
                continue  # the launcher names the killed rank; fp8kit had no chance to
            lines = fp8kit_lines(p.stderr)
            assert len(lines) == 1 and f"rank {rank} of 2 failed at step {step}" in lines[0], (spec, p.stderr)


@test
def a_crashed_run_resumes_bit_identically():
    # A run that dies at step 3 resumes from its step-2 checkpoint to the uninterrupted run's losses and final
    # checkpoint, byte for byte; ddp and fsdp write the same checkpoint (gathered, by rank 0) and the same export.
    # With 128-row FP8 weight blocks, FP8 AdamW moments (block scales cut with the shards) and bf16-sr master weights.
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for parallel in ("ddp", "fsdp"):
            common = ["--recipe", "fp8-block", "--optimizer-state", "fp8", "--master-weights", "bf16-sr", "--steps",
                      "5", "--eval-batches", "2", "--parallel", parallel]
            whole = os.path.join(tmp, parallel + "-whole.safetensors")
            full = subprocess.run(under_mpirun(MPIRUN, 2, [BINARY, "train", "--json", *common, "--save-checkpoint",
                                                           whole, "--export-fp8", os.path.join(tmp, parallel + "-fp8")]),
                                  capture_output=True, text=True, timeout=300, env=MPI_ENV)
            assert full.returncode == 0, full.stderr
            ckpt = os.path.join(tmp, parallel + ".safetensors")
            crash = subprocess.run(under_mpirun(MPIRUN, 2, [BINARY, "train", *common, "--save-checkpoint", ckpt,
                                                            "--checkpoint-every", "2", "--inject-rank-failure", "1:3"]),
                                   capture_output=True, text=True, timeout=300, env=MPI_ENV)
            assert crash.returncode != 0 and os.path.exists(ckpt), crash.stderr
            resumed = os.path.join(tmp, parallel + "-resumed.safetensors")
            again = subprocess.run(under_mpirun(MPIRUN, 2, [BINARY, "train", "--json", *common, "--resume", ckpt,
                                                            "--save-checkpoint", resumed]),
                                   capture_output=True, text=True, timeout=300, env=MPI_ENV)
            assert again.returncode == 0, again.stderr
            a, b = json.loads(full.stdout)[0], json.loads(again.stdout)[0]
            assert b["start_step"] == 2 and a["losses"] == b["losses"] and a["final_loss"] == b["final_loss"], (a, b)
            with open(whole, "rb") as f, open(resumed, "rb") as g:
                files[parallel] = f.read()
                assert files[parallel] == g.read(), parallel
        assert files["ddp"] == files["fsdp"]
        # A finished run resumed with no step left: the export only, and the counts of no step.
        done = subprocess.run(under_mpirun(MPIRUN, 2, [BINARY, "train", "--json", "--parallel", "fsdp", "--resume",
                                                       os.path.join(tmp, "fsdp-whole.safetensors"), "--export-fp8",
                                                       os.path.join(tmp, "late.safetensors")]),
                              capture_output=True, text=True, timeout=300, env=MPI_ENV)
        assert done.returncode == 0, done.stderr
        late = json.loads(done.stdout)[0]
        assert late["start_step"] == 5 and late["comm_bytes_per_step"]["all_gather"] == 0, late
        assert os.path.getsize(os.path.join(tmp, "late.safetensors")) > 0
        for name in os.listdir(os.path.join(tmp, "ddp-fp8")):
            with open(os.path.join(tmp, "ddp-fp8", name), "rb") as f, open(os.path.join(tmp, "fsdp-fp8", name), "rb") as g:
                assert f.read() == g.read(), name


@test
def ranks_given_other_settings_are_refused_at_start():
    # Rank 1 alone gets another seed (as a launcher script could): one line, status 2, no training.
    script = ('if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then s=2; else s=1; fi; '
              f'exec "{BINARY}" train --steps 3 --parallel ddp --seed $s')
    p = subprocess.run(under_mpirun(MPIRUN, 2, ["sh", "-c", script]), capture_output=True, text=True, timeout=120,
                       env=MPI_ENV)
    lines = fp8kit_lines(p.stderr)
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr)
    assert "rank 1 was given --seed '2', rank 0 '1'" in lines[0] and p.stdout == "", p.stderr
    # FP8KIT_DIST_CHECK on rank 1 only: its extra collective per collective would leave the ranks waiting on each
    # other for ever. Refused when the communicator is made, in bounded time, by every rank alike.
    script = ('if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then export FP8KIT_DIST_CHECK=1; fi; '
              f'exec "{BINARY}" train --steps 3 --parallel ddp')
    p = subprocess.run(under_mpirun(MPIRUN, 2, ["sh", "-c", script]), capture_output=True, text=True, timeout=120,
                       env=MPI_ENV)
    lines = fp8kit_lines(p.stderr)
    assert p.returncode != 0 and lines and "FP8KIT_DIST_CHECK is 1 on some ranks" in lines[0], (p.returncode, p.stderr)
    # A usage error every rank sees alike is said once, by rank 0.
    p = subprocess.run(under_mpirun(MPIRUN, 2, [BINARY, "train", "--parallel", "fsdp", "--recipe", "nope"]),
                       capture_output=True, text=True, timeout=120, env=MPI_ENV)
    assert p.returncode == 2 and len(fp8kit_lines(p.stderr)) == 1, p.stderr


@test
def refusals_before_training_are_one_line_from_rank_0():
    def refused(args, needle):
        p = subprocess.run(under_mpirun(MPIRUN, 2, [BINARY, "train", "--steps", "1", "--parallel", "ddp", *args]),
                           capture_output=True, text=True, timeout=120, env=MPI_ENV)
        lines = fp8kit_lines(p.stderr)
        assert p.returncode == 2 and len(lines) == 1 and needle in lines[0], (args, p.returncode, p.stderr)

    with tempfile.TemporaryDirectory() as d:
        # The library's refusal of an export scheme its layout cannot hold: every rank throws it, and rank 0 says it
        # before any rank leaves (it was lost in about one run of five, mpirun killing rank 0 first). Five runs.
        for _ in range(5):
            refused(["--recipe", "fp8-delayed", "--export-fp8", os.path.join(d, "x.safetensors"), "--export-scheme",
                     "mxfp8", "--export-layout", "deepseek"], "deepseek")
        # Training text that cannot be read: refused with the other files, not when training reads it.
        refused(["--data", os.path.join(d, "missing.txt")], "--data: there is no file")
        # A resumed run's global batch is its checkpoint's: one image cannot be split over two ranks.
        ckpt = os.path.join(d, "one.safetensors")
        p = subprocess.run([BINARY, "train", "--model", "cnn", "--recipe", "fp32", "--steps", "1", "--batch", "1",
                            "--save-checkpoint", ckpt], capture_output=True, text=True, timeout=120, env=MPI_ENV)
        assert p.returncode == 0, p.stderr
        refused(["--resume", ckpt], "trained with batch 1: resume it on at most 1 rank")
    # --threads may differ between ranks; a bad value on one rank is said by rank 0, and no rank waits for it.
    script = ('if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then t=0; else t=1; fi; '
              f'exec "{BINARY}" train --steps 1 --parallel ddp --threads $t')
    p = subprocess.run(under_mpirun(MPIRUN, 2, ["sh", "-c", script]), capture_output=True, text=True, timeout=120,
                       env=MPI_ENV)
    lines = fp8kit_lines(p.stderr)
    assert p.returncode == 2 and len(lines) == 1 and "rank 1: --threads must be between 1" in lines[0], p.stderr
    # The hidden fault switch naming a rank the job does not have would never fire: refused.
    refused(["--inject-rank-failure", "5:0"], "rank 5 is not in this job of 2 ranks")


@test
def ranks_reading_other_files_behind_the_same_paths_are_refused():
    # A copy of the checkpoint per node, one of them from another step (it hung under ddp), and another data file
    # behind the same --data path (it trained, "replicas identical: yes"): refused on every rank, one line.
    with tempfile.TemporaryDirectory() as d:
        w0, w1 = os.path.join(d, "w0"), os.path.join(d, "w1")
        os.makedirs(w0)
        os.makedirs(w1)
        for where, steps in ((w0, "2"), (w1, "4")):
            p = subprocess.run([BINARY, "train", "--recipe", "fp32", "--steps", steps, "--eval-batches", "1",
                                "--save-checkpoint", os.path.join(where, "ck.safetensors")], capture_output=True,
                               text=True, timeout=120, env=MPI_ENV)
            assert p.returncode == 0, p.stderr
        script = ('cd "$([ "$OMPI_COMM_WORLD_RANK" = 1 ] && echo {w1} || echo {w0})" && '
                  'exec "{b}" train --parallel ddp --steps 6 --resume ck.safetensors').format(w0=w0, w1=w1, b=os.path.abspath(BINARY))
        p = subprocess.run(under_mpirun(MPIRUN, 2, ["sh", "-c", script]), capture_output=True, text=True,
                           timeout=120, env=MPI_ENV)
        lines = fp8kit_lines(p.stderr)
        assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr)
        assert "rank 1 read its checkpoint's step '4', rank 0 '2'" in lines[0], p.stderr
        for where, text in ((w0, "the cat sat on the mat. " * 200), (w1, "a dog ran in the fog. " * 200)):
            with open(os.path.join(where, "data.txt"), "w") as f:
                f.write(text)
        script = ('cd "$([ "$OMPI_COMM_WORLD_RANK" = 1 ] && echo {w1} || echo {w0})" && '
                  'exec "{b}" train --parallel ddp --steps 1 --data data.txt').format(w0=w0, w1=w1, b=os.path.abspath(BINARY))
        p = subprocess.run(under_mpirun(MPIRUN, 2, ["sh", "-c", script]), capture_output=True, text=True,
                           timeout=120, env=MPI_ENV)
        lines = fp8kit_lines(p.stderr)
        assert p.returncode == 2 and len(lines) == 1 and "--data file's text" in lines[0], (p.returncode, p.stderr)


@test
def a_report_rank_0_cannot_write_after_training_is_one_line():
    # --plot / --profile to a full device: rank 0 alone wrote them after the last collective and threw, skipping the
    # barrier the other ranks waited in (the job hung, nothing printed).
    if not os.path.exists("/dev/full"):
        return
    for option in ("--plot", "--profile"):
        cmd = [BINARY, "train", "--recipe", "fp32", "--parallel", "ddp", "--steps", "2", "--eval-batches", "1", option,
               "/dev/full"]
        p = subprocess.run(under_mpirun(MPIRUN, 2, cmd), capture_output=True, text=True, timeout=120, env=MPI_ENV)
        lines = fp8kit_lines(p.stderr)
        assert p.returncode == 1 and len(lines) == 1 and "/dev/full" in lines[0], (option, p.returncode, p.stderr)


@test
def refusals_are_one_line_with_status_2():
    for args, needle in ((["--parallel", "zero3"], "--parallel"), (["--grad-reduce", "fp8"], "needs --parallel ddp"),
                         (["--grad-reduce", "fp32"], "needs --parallel ddp"),
                         (["--grad-reduce", "fp16", "--parallel", "ddp"], "--grad-reduce"),
                         (["--inject-rank-failure", "1:2"], "needs --parallel"),
                         (["--inject-rank-failure", "1", "--parallel", "ddp"], "RANK:STEP")):
        p = subprocess.run([BINARY, "train", "--steps", "1", *args], capture_output=True, text=True, timeout=60,
                           env=MPI_ENV)
        assert p.returncode == 2 and needle in p.stderr and p.stderr.count("\n") == 1, (args, p.returncode, p.stderr)


if __name__ == "__main__":
    BINARY, MPIRUN = mpi_script_arguments(sys.argv)
    if MPIRUN is None:
        print("skip: this build has no MPI backend (install libopenmpi-dev openmpi-bin and reconfigure)")
        sys.exit(77 if os.environ.get("CI") != "true" else 1)
    sys.exit(run_test_functions(test))
