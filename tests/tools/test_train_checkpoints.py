#!/usr/bin/env python3
"""`fp8kit train --save-checkpoint / --resume / --export-fp8` end to end: a run killed after a checkpoint and resumed
prints the same --json losses, final loss and plot as the uninterrupted run and ends in the same bytes; outputs are
never replaced without --force (and never over the checkpoint being resumed); the FP8 export is read by `fp8kit
inspect` and `fp8kit dequantize` and records the original dtype and overflow policy; every refusal is one line on
stderr with exit status 2 and no output written. Usage: test_train_checkpoints.py FP8KIT. Needs only the standard
library (the files are read here with an independent safetensors reader)."""
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checks import read_safetensors_raw, run_test_functions  # noqa: E402

BINARY = None
TESTS = []
STEPS = "4"


def test(fn):
    TESTS.append(fn)
    return fn


def run(*args, timeout=300):
    p = subprocess.run([BINARY, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def run_ok(*args):
    rc, out, err = run(*args)
    assert rc == 0, f"fp8kit {' '.join(map(str, args))} exited {rc}: {err.strip()}"
    return out, err


def check_usage_error(args, needle, must_not_exist=()):
    rc, out, err = run(*args)
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1, (args, rc, out, err)
    assert needle in err, (args, needle, err)
    for path in must_not_exist:
        assert not os.path.exists(path), (args, path)


def read_st(path):
    """An independent reader: {name: (dtype, shape, bytes)}, __metadata__."""
    tensors, meta, _ = read_safetensors_raw(path)
    return tensors, meta


def write_with_metadata(src, dst, edit):
    """A copy of a safetensors file with its __metadata__ edited (same tensors and bytes)."""
    with open(src, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    edit(header["__metadata__"])
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b[8 + n:])


def write_with_bytes(src, dst, tensor, offset, raw):
    """A copy of a safetensors file with bytes of one tensor's data replaced."""
    with open(src, "rb") as f:
        b = bytearray(f.read())
    n = struct.unpack("<Q", b[:8])[0]
    start = json.loads(b[8:8 + n])[tensor]["data_offsets"][0] + 8 + n + offset
    b[start:start + len(raw)] = raw
    with open(dst, "wb") as f:
        f.write(b)


def floats(raw):
    return struct.unpack(f"<{len(raw) // 4}f", raw)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@test
def killed_run_resumes_bit_identically():
    with tempfile.TemporaryDirectory() as d:
        full, at2, resumed = (os.path.join(d, n) for n in ("full.safetensors", "at2.safetensors", "r.safetensors"))
        plot_a, plot_b = os.path.join(d, "a.svg"), os.path.join(d, "b.svg")
        # --eval-batches is not part of the training state, but of what the run reports: the checkpoint records it
        # (a resumed run evaluated 16 batches, another final loss, and reverted --on-nonfinite abort to skip).
        out, _ = run_ok("train", "--recipe", "fp8-delayed", "--steps", STEPS, "--json", "--save-checkpoint", full,
                        "--plot", plot_a, "--eval-batches", "3")
        [a] = json.loads(out)
        assert a["start_step"] == 0 and len(a["losses"]) == 4 and a["checkpoint"] == full, a
        # The same run, killed at step 2 (the guard aborts on an injected NaN) after its step-2 checkpoint.
        rc, out, err = run("train", "--recipe", "fp8-delayed", "--steps", STEPS, "--save-checkpoint", at2,
                           "--checkpoint-every", "2", "--inject-nan", "2", "--on-nonfinite", "abort",
                           "--eval-batches", "3")
        assert rc == 1 and "step 2" in err, (rc, err)
        _, meta = read_st(at2)
        assert meta["fp8kit.train.next_step"] == "2" and meta["fp8kit.train.steps"] == "4", meta
        assert meta["fp8kit.train.eval_batches"] == "3" and meta["fp8kit.train.on_nonfinite"] == "abort", meta
        # A NaN injected before the resumed step was silently never injected.
        check_usage_error(["train", "--resume", at2, "--inject-nan", "1"], "the run resumes at step 2")
        # Resumed with nothing but the checkpoint: model, recipe, seed, steps come from it.
        out, err = run_ok("train", "--resume", at2, "--json", "--save-checkpoint", resumed, "--plot", plot_b)
        assert err == "", err
        [b] = json.loads(out)
        assert b["start_step"] == 2 and b["recipe"] == "fp8-delayed" and b["steps"] == 4, b
        assert b["eval_batches"] == 3, b
        assert a["losses"] == b["losses"], (a["losses"], b["losses"])  # exact: the shortest round-trip decimals
        assert a["final_loss"] == b["final_loss"], (a, b)
        assert a["skipped_steps"] == b["skipped_steps"] == 0
        with open(plot_a) as fa, open(plot_b) as fb:
            assert fa.read() == fb.read()
        ta, ma = read_st(full)
        tb, mb = read_st(resumed)
        assert ta.keys() == tb.keys()
        for name in ta:
            assert ta[name] == tb[name], name
        ma.pop("fp8kit.train.on_nonfinite")
        assert mb.pop("fp8kit.train.on_nonfinite") == "abort"  # the killed run's policy, which the resume took
        assert ma == mb, (ma, mb)
        # The text table of a resumed run is the uninterrupted one's, plus where it resumed.
        out, _ = run_ok("train", "--resume", at2)
        assert "fp8-delayed" in out and f"resumed from {at2} at step 2" in out, out
        # A run resumed at its end evaluates and reports, but ran no step: it has no step time (not 0 ms).
        out, _ = run_ok("train", "--resume", full, "--json")
        [c] = json.loads(out)
        assert c["start_step"] == 4 and c["step_ms"] is None and c["losses"] == a["losses"], c
        assert c["final_loss"] == a["final_loss"], (a, c)
        out, _ = run_ok("train", "--resume", full)
        row = next(line for line in out.splitlines() if line.startswith("fp8-delayed"))
        assert row.split()[3] == "-", row  # recipe, peak memory (2 fields), step time


@test
def outputs_are_replaced_only_with_force():
    with tempfile.TemporaryDirectory() as d:
        ck, ex, plot = os.path.join(d, "ck.safetensors"), os.path.join(d, "ex"), os.path.join(d, "p.svg")
        run_ok("train", "--recipe", "fp32", "--steps", "1", "--save-checkpoint", ck)
        before = digest(ck)
        check_usage_error(["train", "--recipe", "fp32", "--steps", "2", "--save-checkpoint", ck, "--plot", plot],
                          "pass --force", [plot])
        assert digest(ck) == before
        # Never over the checkpoint being resumed, even with --force.
        check_usage_error(["train", "--resume", ck, "--steps", "2", "--save-checkpoint", ck, "--force"],
                          "is the checkpoint to resume from")
        assert digest(ck) == before
        run_ok("train", "--recipe", "fp32", "--steps", "2", "--save-checkpoint", ck, "--force")
        assert read_st(ck)[1]["fp8kit.train.next_step"] == "2"
        # A directory export: a non-empty directory needs --force too.
        os.mkdir(ex)
        with open(os.path.join(ex, "keep.txt"), "w") as f:
            f.write("mine")
        check_usage_error(["train", "--recipe", "fp32", "--steps", "1", "--export-fp8", ex], "pass --force")
        run_ok("train", "--recipe", "fp32", "--steps", "1", "--export-fp8", ex, "--force")
        assert sorted(os.listdir(ex)) == ["config.json", "keep.txt", "model.safetensors"], os.listdir(ex)
        with open(os.path.join(ex, "keep.txt")) as f:
            assert f.read() == "mine"
        assert not [f for f in os.listdir(d) if ".tmp-" in f], os.listdir(d)  # no temporary file left behind


@test
def fp8_export_is_read_by_inspect_and_dequantize():
    with tempfile.TemporaryDirectory() as d:
        ck, ex, back = (os.path.join(d, n) for n in ("ck.safetensors", "ex.safetensors", "back.safetensors"))
        run_ok("train", "--recipe", "fp8-block", "--steps", "2", "--save-checkpoint", ck, "--export-fp8", ex,
               "--export-layout", "native")
        info = json.loads(run_ok("inspect", "--json", "--no-analysis", ex)[0])
        assert info["layout"] == "native", info
        # Without --export-layout, the export picks the layout `fp8kit quantize` picks for the scheme (deepseek for
        # fp8-block, compressed-tensors for fp8-tensor): the same one default.
        for recipe, layout in (("fp8-block", "deepseek"), ("fp8-delayed", "compressed-tensors")):
            dflt = os.path.join(d, recipe + ".safetensors")
            out, _ = run_ok("train", "--recipe", recipe, "--steps", "1", "--export-fp8", dflt)
            assert ", %s layout)" % layout in out, out
            assert json.loads(run_ok("inspect", "--json", "--no-analysis", dflt)[0])["layout"] == layout
        q = {w["weight"]: w["granularity"] for w in info["quantized"]}
        assert len(q) == 8 and "transformer.h.0.mlp.c_fc.weight" in q, q
        assert set(q.values()) == {"block:128x128"}, q
        tensors, meta = read_st(ex)
        assert meta["fp8kit.export.original_dtype"] == "float32" and meta["fp8kit.export.overflow"] == "saturate"
        assert meta["fp8kit.export.recipe"] == "fp8-block" and meta["fp8kit.export.scheme"] == "fp8-block", meta
        for w in q:
            assert "dtype=float32;overflow=saturate" in meta["fp8kit.quant." + w], meta["fp8kit.quant." + w]
            assert "dtype=float32;overflow=saturate" in meta["fp8kit.export.tensor." + w]
            assert tensors[w][0] == "F8_E4M3", tensors[w][:2]
        assert tensors["lm_head.weight"][0] == "F32"
        run_ok("dequantize", ex, back, "--to", "f32")
        restored, _ = read_st(back)
        master, _ = read_st(ck)
        for w in q:  # within e4m3's 3 mantissa bits of the final master weights
            x, y = floats(master[w][2]), floats(restored[w][2])
            err = math.sqrt(sum((u - v) ** 2 for u, v in zip(x, y)) / sum(u * u for u in x))
            assert err < 0.05, (w, err)
        assert restored["lm_head.weight"] == master["lm_head.weight"]
        # A directory in a serving layout, with its config.json.
        dex = os.path.join(d, "served")
        out, _ = run_ok("train", "--recipe", "fp8-current", "--steps", "1", "--export-fp8", dex, "--export-layout",
                        "compressed-tensors", "--export-scheme", "fp8-channel")
        assert "FP8 export: " + dex + " (fp8-channel, compressed-tensors layout)" in out, out
        with open(os.path.join(dex, "config.json")) as f:
            config = json.load(f)
        assert config["quantization_config"]["quant_method"] == "compressed-tensors", config
        info = json.loads(run_ok("inspect", "--json", "--no-analysis", dex)[0])
        assert info["layout"] == "compressed-tensors" and len(info["quantized"]) == 8, info
        # Static activation scales calibrated by delayed scaling: one input_scale per weight, a static config.
        sex = os.path.join(d, "static")
        run_ok("train", "--recipe", "fp8-delayed", "--steps", "2", "--export-fp8", sex, "--export-layout",
               "compressed-tensors", "--export-input-scales")
        info = json.loads(run_ok("inspect", "--json", "--no-analysis", sex)[0])
        assert all(w.get("input_scale") == w["weight"][:-len(".weight")] + ".input_scale" for w in info["quantized"]), info
        tensors, meta = read_st(os.path.join(sex, "model.safetensors"))
        scales = [floats(tensors[w["input_scale"]][2])[0] for w in info["quantized"]]
        assert all(0 < v < 1 for v in scales), scales  # amax/448 of activations of order 1-10
        with open(os.path.join(sex, "config.json")) as f:
            acts = json.load(f)["quantization_config"]["config_groups"]["group_0"]["input_activations"]
        assert acts["dynamic"] is False and acts["strategy"] == "tensor", acts
        assert "static" in meta["fp8kit.export.input_scales"], meta


@test
def refusals_are_one_line_with_status_2():
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "x.safetensors")
        check_usage_error(["train", "--recipe", "fp8-current", "--steps", "1", "--export-fp8", out,
                           "--export-input-scales"], "delayed scaling", [out])
        check_usage_error(["train", "--recipe", "fp8-delayed", "--steps", "1", "--export-fp8", out,
                           "--export-layout", "deepseek", "--export-input-scales"], "no static activation scales", [out])
        check_usage_error(["train", "--recipe", "fp8-delayed", "--steps", "1", "--export-input-scales"], "--export-fp8")
    with tempfile.TemporaryDirectory() as d:
        ck, ex = os.path.join(d, "ck.safetensors"), os.path.join(d, "ex.safetensors")
        run_ok("train", "--recipe", "fp8-delayed", "--steps", "2", "--save-checkpoint", ck, "--export-fp8", ex)
        new = os.path.join(d, "new.safetensors")
        notes = os.path.join(d, "notes.txt")  # not a checkpoint: its reader's error, named as --resume's
        with open(notes, "w") as f:
            f.write("hello\n")
        for args, needle in (
                (["--compare", "fp32,bf16", "--save-checkpoint", new], "not --compare"),
                (["--save-checkpoint", new], "give --recipe"),
                (["--recipe", "fp32", "--checkpoint-every", "2"], "needs --save-checkpoint"),
                (["--recipe", "fp32", "--save-checkpoint", new, "--checkpoint-every", "-1"], "at least 1"),
                (["--compare", "fp32,bf16,fp32"], "fp32 is listed twice"),
                (["--compare", "fp32,"], "has an empty item"),
                (["--compare", ",fp32"], "has an empty item"),
                (["--recipe", "fp32", "--export-scheme", "fp8-block"], "need --export-fp8"),
                (["--recipe", "fp32", "--export-fp8", new, "--export-scheme", "int4"], "unknown --export-scheme"),
                (["--recipe", "fp32", "--export-fp8", new, "--export-layout", "gguf"], "unknown --export-layout"),
                (["--recipe", "fp32", "--export-fp8", new, "--export-layout", "deepseek", "--export-scheme",
                  "fp8-tensor"], "--export-layout native"),
                (["--recipe", "fp32", "--save-checkpoint", os.path.join(d, "x.pt")], "must end in .safetensors"),
                (["--recipe", "fp32", "--save-checkpoint", os.path.join(d, "no", "x.safetensors")], "does not exist"),
                (["--recipe", "fp32", "--export-fp8", os.path.join(d, "no", "ex")], "does not exist; create it first"),
                (["--recipe", "fp32", "--force"], "--force"),
                (["--resume", os.path.join(d, "missing.safetensors")], "does not exist"),
                (["--resume", ex], "is an FP8 inference export"),
                (["--resume", notes], "--resume: " + notes + ": the file is 6 bytes, too short"),
                (["--resume", ck, "--batch", "3"], "resume it with --batch"),
                (["--resume", ck, "--model", "cnn"], "resume it with --model gpt"),
                (["--resume", ck, "--recipe", "mxfp8"], "resume it with --recipe fp8-delayed"),
                (["--resume", ck, "--seed", "9"], "resume it with --seed 1"),
                (["--resume", ck, "--fp8-conv-max-kernel-area", "9"], "--fp8-conv-max-kernel-area 32"),
                (["--resume", ck, "--export-fp8", ck, "--force"], "is the checkpoint to resume from"),
                (["--resume", ck, "--save-checkpoint", new, "--export-fp8", new], "the same file"),
        ):
            check_usage_error(["train", *args], needle, [new])
        # Damaged files: another version, a field that is not a number, a truncated file.
        v2, bad, cut = (os.path.join(d, n) for n in ("v2.safetensors", "bad.safetensors", "cut.safetensors"))
        write_with_metadata(ck, v2, lambda m: m.update({"fp8kit.train.version": "2"}))
        write_with_metadata(ck, bad, lambda m: m.update({"fp8kit.train.steps": "many"}))
        with open(ck, "rb") as f, open(cut, "wb") as g:
            g.write(f.read()[:-100])
        check_usage_error(["train", "--resume", v2], "version 2 training checkpoint")
        # Values training never leaves: a NaN weight or moment ran on through AdamW (every later loss NaN, exit 0), a
        # negative second moment too.
        tensors, _ = read_st(ck)
        weight = next(n for n, (dtype, shape, _) in tensors.items() if dtype == "F32" and len(shape) == 2
                      and not n.startswith("optim."))
        for name, value, needle in ((weight, math.nan, "holds nan at element 1"),
                                    ("optim.exp_avg_sq." + weight, -1.0, "holds -1 at element 1"),
                                    ("optim.exp_avg." + weight, math.inf, "holds inf at element 1")):
            damaged = os.path.join(d, "damaged.safetensors")
            write_with_bytes(ck, damaged, name, 4, struct.pack("<f", value))
            check_usage_error(["train", "--resume", damaged], needle)
            check_usage_error(["train", "--resume", damaged], "(the file is damaged)")
        check_usage_error(["train", "--resume", bad], "not a number")
        for field, value in (("batch", "0"), ("lr", "nan"), ("warmup_steps", "-3")):
            write_with_metadata(ck, bad, lambda m: m.update({"fp8kit.train." + field: value}))
            check_usage_error(["train", "--resume", bad], "which no run has (the file is damaged)")
        check_usage_error(["train", "--resume", cut], "cut.safetensors")
        # A checkpoint past the steps asked for.
        check_usage_error(["train", "--resume", ck, "--steps", "1", "--save-checkpoint", new], "more than the 1")


@test
def bf16_master_weights_export_says_bfloat16():
    """fp8-o2 keeps bf16 master weights: its export's unquantized tensors are BF16, and its metadata and config.json
    said float32."""
    with tempfile.TemporaryDirectory() as d:
        ex = os.path.join(d, "ex")
        run_ok("train", "--recipe", "fp8-o2", "--steps", "1", "--export-fp8", ex)
        tensors, meta = read_st(os.path.join(ex, "model.safetensors"))
        assert "BF16" in {dtype for dtype, _, _ in tensors.values()} and "F32" not in {
            dtype for name, (dtype, _, _) in tensors.items() if not name.endswith("scale")}, tensors.keys()
        assert meta["fp8kit.export.original_dtype"] == "bfloat16", meta
        per_tensor = [v for k, v in meta.items() if k.startswith("fp8kit.export.tensor.")]
        assert per_tensor and all(";dtype=bfloat16;" in v for v in per_tensor), per_tensor
        with open(os.path.join(ex, "config.json")) as f:
            assert json.load(f)["torch_dtype"] == "bfloat16"


@test
def outputs_are_compared_by_the_file_they_name():
    """Two outputs naming one file through two spellings (q.safetensors, ./q.safetensors) passed the check: the export
    replaced the checkpoint. An output named as one of the --export-fp8 directory's files was replaced by it."""
    with tempfile.TemporaryDirectory() as d:
        def refused(args, needle):
            p = subprocess.run([os.path.abspath(BINARY), "train", "--recipe", "fp8-delayed", "--steps", "1", *args],
                               cwd=d, capture_output=True, text=True, timeout=300)
            assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, (args, p)
            assert os.listdir(d) == ["ed"], (args, os.listdir(d))

        os.mkdir(os.path.join(d, "ed"))
        refused(["--save-checkpoint", "q.safetensors", "--export-fp8", "./q.safetensors"], "name the same file")
        refused(["--plot", "p.svg", "--log-scales", "ed/../p.svg"], "name the same file")
        refused(["--save-checkpoint", "ed/model.safetensors", "--export-fp8", "ed"], "that --export-fp8 'ed' writes")
        refused(["--plot", "./ed/config.json", "--export-fp8", "ed/"], "that --export-fp8 'ed/' writes")
        # An earlier sharded checkpoint's names there are removed by the export's commit: not an output either.
        refused(["--save-checkpoint", "ed/model-00001-of-00002.safetensors", "--export-fp8", "ed"],
                "writes or removes")
        # Other names beside the export are a run's folder, as before: the checkpoint and plot stay whole.
        p = subprocess.run([os.path.abspath(BINARY), "train", "--recipe", "fp8-delayed", "--steps", "1",
                            "--save-checkpoint", "ed/train.safetensors", "--plot", "ed/loss.svg", "--export-fp8", "ed"],
                           cwd=d, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        assert sorted(os.listdir(os.path.join(d, "ed"))) == ["config.json", "loss.svg", "model.safetensors",
                                                              "train.safetensors"]
        assert read_st(os.path.join(d, "ed", "train.safetensors"))[1]["fp8kit.train.next_step"] == "1"


@test
def export_directory_never_replaces_an_input():
    """--export-fp8 DIR --force replaced the checkpoint being resumed when it was DIR/model.safetensors, and the --data
    file when it was DIR/config.json; a config.json directory in the way ended the run after training with the
    weights already replaced. All refused before the first step now, with everything left as it was."""
    with tempfile.TemporaryDirectory() as d:
        ed = os.path.join(d, "ed")
        os.mkdir(ed)
        ck = os.path.join(ed, "model.safetensors")
        run_ok("train", "--recipe", "fp32", "--steps", "1", "--save-checkpoint", ck)
        before = digest(ck)
        check_usage_error(["train", "--resume", ck, "--steps", "2", "--export-fp8", ed, "--force"],
                          "(the checkpoint to resume from) is a file the export to")
        assert digest(ck) == before
        text = os.path.join(ed, "config.json")
        with open(text, "w") as f:
            f.write("a small corpus of text for the model to learn from. " * 200)
        check_usage_error(["train", "--recipe", "fp32", "--steps", "1", "--data", text, "--export-fp8", ed, "--force"],
                          "(the training data) is a file the export to")
        assert os.path.getsize(text) == 52 * 200 and digest(ck) == before
        # A checkpoint named as a shard there would be removed as an earlier checkpoint's by the export's commit.
        shard = os.path.join(ed, "model-00001-of-00002.safetensors")
        os.rename(ck, shard)
        check_usage_error(["train", "--resume", shard, "--steps", "2", "--export-fp8", ed, "--force"],
                          "(the checkpoint to resume from) is a file the export to")
        assert digest(shard) == before
        # A folder where the export writes config.json: refused up front, the directory as it was.
        other = os.path.join(d, "other")
        os.makedirs(os.path.join(other, "config.json"))
        check_usage_error(["train", "--recipe", "fp32", "--steps", "1", "--export-fp8", other, "--force"],
                          "is a directory, where the export writes its config.json")
        assert os.listdir(other) == ["config.json"]
        # An export path that is a link to nothing: refused before training (the failed export removed the link).
        link = os.path.join(d, "link")
        os.symlink(os.path.join(d, "gone", "dir"), link)
        check_usage_error(["train", "--recipe", "fp32", "--steps", "1", "--export-fp8", link],
                          "is a symbolic link to")
        assert os.path.islink(link)
        # The CNN's head (its one linear layer) never runs an FP8 GEMM: no input scale to export, said before step 0.
        check_usage_error(["train", "--model", "cnn", "--recipe", "fp8-delayed", "--steps", "1", "--export-fp8",
                           os.path.join(d, "cnn"), "--export-input-scales"], "runs in bfloat16", [os.path.join(d, "cnn")])


@test
def resume_names_what_the_checkpoint_recorded():
    """A checkpoint whose data file moved: the message said '--data: there is no file' to a user who gave no --data.
    Recorded settings no run has (a history of 0, beta2 1.5, a kernel area of 0) named options the user never gave,
    not the file."""
    with tempfile.TemporaryDirectory() as d:
        data, ck = os.path.join(d, "corpus.txt"), os.path.join(d, "ck.safetensors")
        with open(data, "w") as f:
            f.write("the quick brown fox jumps over the lazy dog. " * 100)
        run_ok("train", "--recipe", "fp8-delayed", "--steps", "1", "--data", data, "--save-checkpoint", ck)
        moved = os.path.join(d, "moved.txt")
        os.rename(data, moved)
        check_usage_error(["train", "--resume", ck, "--steps", "2"], "give its new path with --data")
        # A run that fails before its first step (a tensor of the checkpoint missing, found when the trainer loads
        # it) leaves an earlier --log-scales log as it was (it was committed empty).
        log = os.path.join(d, "s.jsonl")
        run_ok("train", "--recipe", "fp8-delayed", "--steps", "1", "--log-scales", log)
        logged = digest(log)
        with open(ck, "rb") as f:
            b = f.read()
        n = struct.unpack("<Q", b[:8])[0]
        header = json.loads(b[8:8 + n])
        victim = next(k for k in header if k.startswith("optim."))
        header[victim + ".renamed"] = header.pop(victim)
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        renamed = os.path.join(d, "renamed.safetensors")
        with open(renamed, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + b[8 + n:])
        rc, _, err = run("train", "--resume", renamed, "--steps", "2", "--data", moved, "--log-scales", log, "--force")
        assert rc != 0 and "renamed.safetensors" in err and digest(log) == logged, (rc, err)
        # one line: the note about --steps (2 against the checkpoint's 1) comes only after a run that succeeded
        assert len(err.strip().splitlines()) == 1, err
        # a gpt checkpoint under --model cnn: named as that, not as the --data the user did not give
        check_usage_error(["train", "--resume", ck, "--model", "cnn", "--data", moved], "is a checkpoint of the gpt")
        check_usage_error(["train", "--resume", ck, "--model", "cnn"], "resume it with --model gpt")
        write_with_metadata(ck, os.path.join(d, "resnet.safetensors"),
                            lambda m: m.update({"fp8kit.train.model": "resnet"}))
        check_usage_error(["train", "--resume", os.path.join(d, "resnet.safetensors"), "--data", moved],
                          "records the model 'resnet', which no fp8kit run trains")
        run_ok("train", "--resume", ck, "--steps", "2", "--data", moved)
        bad = os.path.join(d, "bad.safetensors")
        _, meta = read_st(ck)
        for field, old, new in (("recipe_settings", "amax_history_length=16", "amax_history_length=0"),
                                ("recipe_settings", "fp8_conv_max_kernel_area=32", "fp8_conv_max_kernel_area=0"),
                                ("adamw", "beta2=", "beta2=1.5;x=")):
            key = "fp8kit.train." + field
            assert old in meta[key], (key, meta[key])
            if field == "adamw":  # beta2's value replaced whole
                parts = dict(item.split("=", 1) for item in meta[key].split(";"))
                parts["beta2"] = "1.5"
                value = ";".join(f"{k}={v}" for k, v in parts.items())
            else:
                value = meta[key].replace(old, new)
            write_with_metadata(ck, bad, lambda m: m.update({key: value}))
            check_usage_error(["train", "--resume", bad, "--data", moved], "bad.safetensors")
            check_usage_error(["train", "--resume", bad, "--data", moved], "which no run has (the file is damaged)")


@test
def unreadable_inputs_and_full_disks_end_in_one_line():
    """--data /dev/zero was read without end (gigabytes, then the OOM killer); a checkpoint written past the
    file-size limit (ulimit -f) killed the process by SIGXFSZ, leaving its temporary file."""
    check_usage_error(["train", "--steps", "1", "--data", "/dev/zero"], "is not a regular file")
    import resource
    with tempfile.TemporaryDirectory() as d:
        ck = os.path.join(d, "ck.safetensors")
        limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))  # noqa: E731
        p = subprocess.run([BINARY, "train", "--model", "cnn", "--batch", "4", "--steps", "1", "--recipe", "fp32",
                            "--quiet", "--save-checkpoint", ck], capture_output=True, text=True, timeout=300,
                           preexec_fn=limit)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 1 and len(lines) == 1 and "File too large" in lines[0], (p.returncode, p.stderr)
        assert os.listdir(d) == [], os.listdir(d)  # no checkpoint, no temporary file


def main():
    global BINARY
    if len(sys.argv) != 2:
        print("usage: test_train_checkpoints.py PATH_TO_fp8kit", file=sys.stderr)
        return 2
    BINARY = sys.argv[1]
    return run_test_functions(TESTS)


if __name__ == "__main__":
    sys.exit(main())
