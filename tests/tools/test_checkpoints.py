#!/usr/bin/env python3
"""`fp8kit quantize / inspect / dequantize / convert` end to end on a small model written with the PyPI safetensors
package: every layout's tensors and config as vLLM reads them, dequantized values against numpy formulas (the
reference doc's), --force, inputs untouched, one-line errors with exit 2. Usage: test_checkpoints.py FP8KIT."""
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from checks import check, read_safetensors_raw, require, summary  # noqa: E402

require("numpy", "ml_dtypes", "safetensors")
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

NP = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F8_E4M3": ml_dtypes.float8_e4m3fn,
      "F8_E5M2": ml_dtypes.float8_e5m2, "U8": np.uint8, "F8_E8M0": np.uint8, "I64": np.int64}


def run(exe, *args):
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True)


def read_st(path):
    """An independent reader: header JSON + raw bytes -> {name: numpy array}, metadata."""
    raw, meta, header = read_safetensors_raw(path)
    out = {name: np.frombuffer(data, dtype=NP[dtype]).reshape(shape) for name, (dtype, shape, data) in raw.items()}
    return out, meta, header


def read_dir(d):
    tensors, meta, header = {}, {}, {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            t, m, h = read_st(os.path.join(d, f))
            tensors.update(t)
            meta.update(m)
            header.update(h)
    return tensors, meta, header


def digest(path):
    h = hashlib.sha256()
    for root, _, files in sorted(os.walk(path)) if os.path.isdir(path) else [("", [], [path])]:
        for f in sorted(files):
            with open(os.path.join(root, f), "rb") as fh:
                h.update(f.encode() + fh.read())
    return h.hexdigest()


def one_line_error(r, command):
    lines = r.stderr.strip().splitlines()
    return r.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"fp8kit {command}: ")


def make_model(d, rng):
    """A tiny Llama-like model in two shards + index, config.json and a tokenizer file."""
    bf = ml_dtypes.bfloat16
    t = {
        "model.embed_tokens.weight": rng.normal(0, 1, (50, 64)),
        "model.layers.0.input_layernorm.weight": rng.normal(1, 0.1, (64,)),
        "model.layers.0.self_attn.q_proj.weight": rng.normal(0, 0.02, (130, 200)) * np.linspace(0.1, 10, 200),
        "model.layers.0.self_attn.q_proj.bias": rng.normal(0, 0.1, (130,)),
        "model.layers.0.self_attn.o_proj.weight": rng.normal(0, 0.05, (64, 130)),
        "model.layers.0.mlp.gate.weight": rng.normal(0, 0.1, (4, 64)),
        "model.layers.0.mlp.experts.0.up_proj.weight": rng.normal(0, 0.03, (96, 64)),
        "model.norm.weight": rng.normal(1, 0.1, (64,)),
        "lm_head.weight": rng.normal(0, 0.1, (50, 64)),
    }
    t = {k: v.astype(bf) for k, v in t.items()}
    t["model.layers.0.pos_ids"] = np.arange(5, dtype=np.int64)
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[:5], "model-00002-of-00002.safetensors": names[5:]}
    for f, ns in shards.items():
        save_file({n: t[n] for n in ns}, os.path.join(d, f), metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(v.nbytes for v in t.values())},
             "weight_map": {n: f for f, ns in shards.items() for n in ns}}
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "torch_dtype": "bfloat16"}, f)
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        f.write('{"version": "1.0"}')
    return t


QUANTIZED = ["model.layers.0.mlp.experts.0.up_proj.weight", "model.layers.0.self_attn.o_proj.weight",
             "model.layers.0.self_attn.q_proj.weight"]


def expand(scale, rows, cols, br, bc):
    """Block scales repeated over their blocks (edge blocks cut), as DeepSeek's fp8_cast_bf16 / llama.cpp do."""
    return np.repeat(np.repeat(scale, br, axis=0), bc, axis=1)[:rows, :cols]


def reference_dequant(layout, w, s):
    """The formula each layout's readers use, in float32: w_fp8 * scale (broadcast per layout)."""
    w32 = w.astype(np.float32)
    rows, cols = w.shape
    if layout in ("deepseek", "native-block"):
        return w32 * expand(s.astype(np.float32), rows, cols, 128, 128)
    if layout == "mxfp8":
        scale = np.ldexp(np.float32(1), s.astype(np.int32) - 127).astype(np.float32)
        return w32 * expand(scale, rows, cols, 1, 32)
    return w32 * s.astype(np.float32)  # [] / [1] / [out, 1] broadcast


def peak_anon_mib(cmd):
    """Runs cmd, sampling its anonymous resident memory (heap, not the mapped input) every few milliseconds."""
    import time
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            pass
        time.sleep(0.002)
    p.communicate()
    return p.returncode, peak / 1024


def check_bounded_memory(exe, root):
    """Streaming: the peak is about the largest tensor's, the same for 4 tensors as for 16."""
    if not os.path.exists("/proc/self/status"):
        return
    rng = np.random.default_rng(5)
    peaks = {}
    for n in (4, 16):
        d = os.path.join(root, f"mem{n}")
        os.mkdir(d)
        save_file({f"l.{i}.proj.weight": rng.normal(0, 1, (2048, 2048)).astype(ml_dtypes.bfloat16) for i in range(n)},
                  os.path.join(d, "model.safetensors"))
        rq, q = peak_anon_mib([exe, "quantize", d, d + "-q", "--scheme", "fp8-block"])
        rd, dq = peak_anon_mib([exe, "dequantize", d + "-q", d + "-d"])
        check(f"memory: {n} tensors run", rq == 0 and rd == 0)
        peaks[n] = (q, dq)
    for i, what in enumerate(["quantize", "dequantize"]):
        small, large = peaks[4][i], peaks[16][i]
        check(f"memory: {what} peak does not grow with the tensor count", large <= small * 1.2 + 4,
              f"{small:.1f} MiB for 4 tensors, {large:.1f} MiB for 16 (8 MiB each)")


def check_foreign_files(exe, root, rng):
    """Checkpoints quantized here with numpy + ml_dtypes, as DeepSeek / llm-compressor / ModelOpt write them (not by
    fp8kit): fp8kit dequantizes them to exactly the reference formula."""
    e4 = ml_dtypes.float8_e4m3fn
    w = rng.normal(0, 0.05, (300, 200)).astype(np.float32)
    rows, cols = w.shape
    # DeepSeek: per 128x128 block (edge blocks zero-padded, which does not change their amax), s = amax / 448
    gr, gc = -(-rows // 128), -(-cols // 128)
    padded = np.zeros((gr * 128, gc * 128), np.float32)
    padded[:rows, :cols] = w
    amax = np.abs(padded.reshape(gr, 128, gc, 128)).max(axis=(1, 3))
    s_ds = (amax / 448).astype(np.float32)
    q_ds = (w / expand(s_ds, rows, cols, 128, 128)).astype(e4)
    # compressed-tensors channel, BF16 scales [out, 1]
    s_ct = (np.abs(w).max(axis=1, keepdims=True) / 448).astype(ml_dtypes.bfloat16)
    q_ct = np.clip(w / s_ct.astype(np.float32), -448, 448).astype(e4)
    # ModelOpt MXFP8: U8 exponents per 32 columns (any power of two works for reading)
    gm = -(-cols // 32)
    exps = (127 + np.ceil(np.log2(np.abs(np.pad(w, ((0, 0), (0, gm * 32 - cols)))).reshape(rows, gm, 32).max(axis=2) / 448)))
    s_mx = exps.astype(np.uint8)
    q_mx = (w / expand(np.ldexp(np.float32(1), s_mx.astype(np.int32) - 127).astype(np.float32), rows, cols, 1, 32)).astype(e4)
    cases = [("deepseek", {"m.weight": q_ds, "m.weight_scale_inv": s_ds}, "m.weight_scale_inv", "deepseek"),
             ("compressed-tensors", {"m.weight": q_ct, "m.weight_scale": s_ct, "m.input_scale": np.ones([1], np.float32)},
              "m.weight_scale", "channel"),
             ("mxfp8", {"m.weight": q_mx, "m.weight_scale": s_mx}, "m.weight_scale", "mxfp8")]
    for layout, tensors, scale, ref in cases:
        path = os.path.join(root, f"foreign-{layout}.safetensors")
        save_file(tensors, path)
        r = run(exe, "inspect", path, "--json")
        check(f"foreign {layout}: detected", r.returncode == 0 and json.loads(r.stdout)["layout"] == layout, r.stdout[:300])
        r = run(exe, "dequantize", path, path + ".f32.safetensors", "--to", "f32")
        d, _, _ = read_st(path + ".f32.safetensors")
        check(f"foreign {layout}: dequantized to the reference formula", r.returncode == 0 and sorted(d) == ["m.weight"] and
              np.array_equal(d["m.weight"], reference_dequant(ref, tensors["m.weight"], tensors[scale])), r.stderr)
        check(f"foreign {layout}: close to the original", np.all(np.abs(d["m.weight"] - w) <= 0.07 * np.abs(w) + 1e-5))
    # Two layouts in one file (a DeepSeek pair beside a compressed-tensors one) would come out half quantized.
    mixed = os.path.join(root, "foreign-mixed.safetensors")
    save_file({"a.weight": q_ds, "a.weight_scale_inv": s_ds, "b.weight": q_ct, "b.weight_scale": s_ct}, mixed)
    r = run(exe, "dequantize", mixed, mixed + ".out.safetensors")
    check("foreign mixed layouts: refused in one line", one_line_error(r, "dequantize") and
          "'b.weight' has its scale as 'b.weight_scale'" in r.stderr and not os.path.exists(mixed + ".out.safetensors"),
          r.stderr)
    # Empty weights as other writers leave them (a per-tensor scale; a block grid counting the other side's blocks):
    # read and dequantized to empty tensors of their shape, beside a weight that is not empty.
    for layout, scale_name, scale in (("autofp8", "e.weight_scale", np.array(0.5, np.float32)),
                                      ("deepseek", "e.weight_scale_inv", np.ones((0, 2), np.float32))):
        path = os.path.join(root, f"foreign-empty-{layout}.safetensors")
        save_file({"e.weight": np.zeros((0, 256), e4), scale_name: scale, "m.weight": q_ds,
                   "m.weight_scale" if layout == "autofp8" else "m.weight_scale_inv":
                   np.array(0.01, np.float32) if layout == "autofp8" else s_ds}, path)
        r = run(exe, "dequantize", path, path + ".f32.safetensors", "--to", "f32")
        d, _, _ = read_st(path + ".f32.safetensors") if r.returncode == 0 else ({}, None, None)
        check(f"empty weight, {layout} scale: dequantized to an empty tensor", r.returncode == 0 and
              sorted(d) == ["e.weight", "m.weight"] and d["e.weight"].shape == (0, 256) and d["m.weight"].shape == (300, 200),
              r.stderr)
    # One weight with scales of two layouts: which one dequantizes it is not in the tensors. dequantize refuses it
    # naming both (it took the DeepSeek one and carried the other into the output as an ordinary tensor); inspect
    # shows the file, the question as its evidence; a config.json naming the layout decides.
    both = os.path.join(root, "foreign-two-scales.safetensors")
    save_file({"m.weight": q_ds, "m.weight_scale_inv": s_ds, "m.weight_scale": np.array(0.01, np.float32)}, both)
    r = run(exe, "dequantize", both, both + ".out.safetensors")
    check("two scales for one weight: refused in one line", one_line_error(r, "dequantize") and
          "'m.weight' has 2 scales of different layouts ('m.weight_scale_inv', 'm.weight_scale')" in r.stderr and
          not os.path.exists(both + ".out.safetensors"), r.stderr)
    r = run(exe, "inspect", both, "--json")
    check("two scales for one weight: inspect shows the question", r.returncode == 0 and
          json.loads(r.stdout)["layout"] is None and "has 2 scales" in json.loads(r.stdout)["evidence"], r.stdout[:300])
    d = os.path.join(root, "two-scales-model")
    os.makedirs(d)
    shutil.copy(both, os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}, f)
    r = run(exe, "dequantize", d, d + "-out", "--to", "f32")
    out, _, _ = read_dir(d + "-out") if r.returncode == 0 else ({}, None, None)
    check("two scales for one weight: config.json decides", r.returncode == 0 and
          np.array_equal(out.get("m.weight"), reference_dequant("deepseek", q_ds, s_ds)), r.stderr)


def check_model_directory_files(exe, root, rng):
    """A sentence-transformers model directory (a fixture of its own): quantize, dequantize and convert write the
    weights and copy every other file, subfolders included, byte for byte; not pickles, not hidden files."""
    src = os.path.join(root, "st-model")
    os.makedirs(os.path.join(src, "1_Pooling"))
    os.makedirs(os.path.join(src, "2_Dense"))
    os.makedirs(os.path.join(src, ".cache", "huggingface"))
    bf = ml_dtypes.bfloat16
    save_file({"encoder.layer.0.dense.weight": rng.normal(0, 0.05, (64, 32)).astype(bf),
               "embeddings.word_embeddings.weight": rng.normal(0, 1, (20, 32)).astype(bf)},
              os.path.join(src, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump({"architectures": ["BertModel"], "hidden_size": 32, "torch_dtype": "bfloat16"}, f)
    companions = {
        "modules.json": '[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]',
        "sentence_bert_config.json": '{"max_seq_length": 256}',
        "1_Pooling/config.json": '{"word_embedding_dimension": 32, "pooling_mode_mean_tokens": true}',
        "2_Dense/config.json": '{"in_features": 32, "out_features": 16}',
        "README.md": "# a model\n",
        "tokenizer.json": '{"version": "1.0"}',
        "vocab.txt": "[PAD]\n[UNK]\n" * 1000,
    }
    for rel, text in companions.items():
        with open(os.path.join(src, rel), "w") as f:
            f.write(text)
    save_file({"linear.weight": rng.normal(0, 0.1, (16, 32)).astype(np.float32)},
              os.path.join(src, "2_Dense", "model.safetensors"))
    companions["2_Dense/model.safetensors"] = None  # a sub-module's weights: copied as they are
    os.symlink("vocab.txt", os.path.join(src, "vocab-link.txt"))
    companions["vocab-link.txt"] = companions["vocab.txt"]
    with open(os.path.join(src, "pytorch_model.bin"), "wb") as f:
        f.write(b"\x80\x02}q\x00.")  # a pickle: never read, never copied
    # Weights beside the checkpoint's own (Mistral's consolidated.safetensors): left behind, and named.
    save_file({"tok_embeddings.weight": rng.normal(0, 1, (20, 32)).astype(bf)}, os.path.join(src, "consolidated.safetensors"))
    left_out = ["consolidated.safetensors", "pytorch_model.bin"]
    with open(os.path.join(src, ".cache", "huggingface", "lock"), "w") as f:
        f.write("x")
    before = digest(src)
    for cmd in (["quantize", "--scheme", "fp8-channel", "--layout", "compressed-tensors"], ["convert", "--to", "f16"]):
        out = os.path.join(root, "st-" + cmd[0])
        r = run(exe, cmd[0], src, out, *cmd[1:], "--json")
        check(f"model directory {cmd[0]}: exit 0", r.returncode == 0, r.stderr)
        if r.returncode != 0:
            continue
        report = json.loads(r.stdout)
        check(f"model directory {cmd[0]}: files_copied", report.get("files_copied") == len(companions), str(report))
        check(f"model directory {cmd[0]}: files_not_copied named", report.get("files_not_copied") == left_out and
              "note: not copied: consolidated.safetensors, pytorch_model.bin (" in r.stderr, f"{report} {r.stderr}")
        got = sorted(os.path.relpath(os.path.join(d, n), out) for d, _, ns in os.walk(out) for n in ns)
        want = sorted(list(companions) + ["config.json", "model.safetensors"])
        check(f"model directory {cmd[0]}: the same files, subfolders included", got == want, f"{got} != {want}")
        for rel in companions:
            with open(os.path.join(src, rel), "rb") as a, open(os.path.join(out, rel), "rb") as b:
                check(f"model directory {cmd[0]}: {rel} byte for byte", a.read() == b.read())
        check(f"model directory {cmd[0]}: the link copied as a file", not os.path.islink(os.path.join(out, "vocab-link.txt")))
        if cmd[0] == "quantize":
            r = run(exe, "dequantize", out, out + "-bf16", "--json")
            check("model directory dequantize: exit 0", r.returncode == 0, r.stderr)
            if r.returncode == 0:
                check("model directory dequantize: files_copied", json.loads(r.stdout).get("files_copied") == len(companions))
                check("model directory dequantize: 1_Pooling kept",
                      os.path.exists(os.path.join(out + "-bf16", "1_Pooling", "config.json")))
    check("model directory: the input untouched", digest(src) == before)
    # --force into an OUT whose 2_Dense is a symbolic link back into the input: copying the input's 2_Dense/ through
    # it replaced the input's own files (exit 0). Refused, one line, the input untouched.
    linked = os.path.join(root, "st-linked")
    os.makedirs(linked)
    os.symlink(src, os.path.join(linked, "2_Dense"))
    r = run(exe, "quantize", src, linked, "--scheme", "fp8-block", "--force")
    check("an output link into the input: refused", r.returncode == 2 and "leads into the input directory" in r.stderr
          and r.stderr.count("\n") == 1, r.stderr)
    check("an output link into the input: the input untouched", digest(src) == before)
    check("an output link into the input: nothing written", sorted(os.listdir(linked)) == ["2_Dense"],
          str(os.listdir(linked)))
    # A link at a file's own name (left by an earlier run, say) is replaced by the copy, not written through: fine.
    file_linked = os.path.join(root, "st-file-linked")
    os.makedirs(file_linked)
    os.symlink(os.path.join(src, "tokenizer.json"), os.path.join(file_linked, "tokenizer.json"))
    r = run(exe, "quantize", src, file_linked, "--scheme", "fp8-block", "--force")
    check("a link at a companion's name: replaced", r.returncode == 0 and
          not os.path.islink(os.path.join(file_linked, "tokenizer.json")), r.stderr)
    check("a link at a companion's name: the input untouched", digest(src) == before)
    # An input whose model.safetensors is a link to OUT's own (a cache of links): the write replaced the input's
    # weights (exit 0). Refused, --force or not, both files as they were.
    out_dir, in_dir = os.path.join(root, "st-out-shard"), os.path.join(root, "st-in-link")
    os.makedirs(out_dir)
    os.makedirs(in_dir)
    shutil.copy(os.path.join(src, "model.safetensors"), os.path.join(out_dir, "model.safetensors"))
    os.symlink(os.path.join(out_dir, "model.safetensors"), os.path.join(in_dir, "model.safetensors"))
    weights = digest(out_dir)
    r = run(exe, "convert", in_dir, out_dir, "--to", "f16", "--force")
    check("an input shard that is OUT's file: refused", r.returncode == 2 and "(an input file) is" in r.stderr and
          r.stderr.count("\n") == 1, r.stderr)
    check("an input shard that is OUT's file: untouched", digest(out_dir) == weights)
    # A directory output in a folder that does not exist (a typo): refused, no folders made.
    r = run(exe, "quantize", src, os.path.join(root, "no-such", "q"), "--scheme", "fp8-tensor")
    check("a directory output's missing folder: refused", r.returncode == 2 and "does not exist" in r.stderr and
          not os.path.exists(os.path.join(root, "no-such")), r.stderr)
    check_many_companions(exe, root, rng)
    check_partial_block_note(exe, root, rng)
    check_damaged_scales_refused(exe, root, rng)
    check_overflow_is_announced(exe, root, rng)
    check_nonfinite_weights_refused(exe, root, rng)
    check_json_with_a_non_utf8_path(exe, root, rng)
    check_all_or_nothing(exe, root, src)
    check_metadata_carried(exe, root, rng)


def check_json_with_a_non_utf8_path(exe, root, rng):
    """A path that is not UTF-8 (Linux allows any bytes) in a --json report: the byte as U+FFFD and exit 0 (the
    JSON library threw after the output was written: exit 1)."""
    src = os.fsencode(root) + b"/w\xfe.safetensors"
    save_file({"fc.weight": rng.normal(0, 0.1, (16, 32)).astype(np.float32)}, os.fsdecode(src))
    p = subprocess.run([exe, "quantize", src, os.path.join(root, "w-q.safetensors"), "--scheme", "fp8-tensor",
                        "--json"], capture_output=True)
    check("non-UTF-8 path: exit 0", p.returncode == 0, p.stderr)
    if p.returncode == 0:
        check("non-UTF-8 path: the byte as U+FFFD", json.loads(p.stdout)["input"].endswith("w\ufffd.safetensors"))


def check_damaged_scales_refused(exe, root, rng):
    """A scale that is NaN, infinite or negative (a damaged file) is refused, exit 2 naming the scale; it was
    dequantized into NaN, Inf or weights of the wrong sign with exit 0. A scale of 0 (a block of zeros) is read."""
    w = rng.normal(0, 1, (4, 4)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    for label, value in (("nan", np.nan), ("inf", np.inf), ("negative", -1.0), ("zero", 0.0)):
        src = os.path.join(root, f"scale-{label}.safetensors")
        save_file({"l.weight": w, "l.weight_scale_inv": np.array([[value]], np.float32)}, src)
        r = run(exe, "dequantize", src, os.path.join(root, f"scale-{label}-bf16.safetensors"))
        if label == "zero":
            check("damaged scales: a zero scale is read", r.returncode == 0, r.stderr)
        else:
            check(f"damaged scales: {label} refused", r.returncode == 2 and "l.weight_scale_inv" in r.stderr
                  and r.stderr.count("\n") == 1, r.stderr)


def check_nonfinite_weights_refused(exe, root, rng):
    """A weight holding Inf or NaN, or a float64 weight with a value past float32's range, is refused by every
    scheme (exit 2, one line naming the weight, no output): saturation stored the infinity as 448 times the scale,
    with exit 0. Under --ignore the weight is copied as it is and the others quantized."""
    cases = {"inf-f32": (np.float32, np.inf), "nan-bf16": (ml_dtypes.bfloat16, np.nan), "big-f64": (np.float64, 1e300)}
    for label, (dtype, bad) in cases.items():
        w = rng.normal(0, 1, (8, 256))
        w[3, 200] = bad
        src = os.path.join(root, f"nonfinite-{label}.safetensors")
        save_file({"l.weight": w.astype(dtype), "m.weight": rng.normal(0, 1, (8, 256)).astype(dtype)}, src)
        for scheme in ("fp8-tensor", "fp8-channel", "fp8-block", "mxfp8"):
            out = os.path.join(root, f"nonfinite-{label}-{scheme}.safetensors")
            r = run(exe, "quantize", src, out, "--scheme", scheme)
            check(f"non-finite weight {label} {scheme}: refused",
                  one_line_error(r, "quantize") and "'l.weight'" in r.stderr and not os.path.exists(out), r.stderr)
            if label == "big-f64":
                check("non-finite weight: the float64 range named", "past float32's range" in r.stderr, r.stderr)
        out = os.path.join(root, f"nonfinite-{label}-ignored.safetensors")
        r = run(exe, "quantize", src, out, "--scheme", "fp8-tensor", "--ignore", "^l\\.weight$")
        check(f"non-finite weight {label}: --ignore copies it", r.returncode == 0, r.stderr)
        if r.returncode == 0:
            t, _, _ = read_st(out)
            check(f"non-finite weight {label}: copied bit for bit",
                  t["l.weight"].tobytes() == w.astype(dtype).tobytes() and t["m.weight"].dtype == ml_dtypes.float8_e4m3fn)


def check_partial_block_note(exe, root, rng):
    """A deepseek weight with a side over 128 that is not a multiple of it: written (partial edge blocks are the
    layout's), and counted on the summary line and in --json, since Hugging Face transformers' FP8 dequantization
    misreads or refuses such grids; none for whole blocks or one-block sides, or for compressed-tensors, whose config
    states the block size."""
    src = os.path.join(root, "partial.safetensors")
    save_file({"a.weight": rng.normal(0, 1, (200, 130)).astype(np.float32),
               "b.weight": rng.normal(0, 1, (256, 128)).astype(np.float32)}, src)
    r = run(exe, "quantize", src, os.path.join(root, "partial-ds.safetensors"), "--scheme", "fp8-block")
    check("partial blocks: written, the line naming the first such weight",
          r.returncode == 0 and "1 with partial edge blocks (first: a.weight [200, 130])" in r.stdout
          and "transformers" in r.stdout and r.stderr == "", r.stdout + r.stderr)
    r = run(exe, "quantize", src, os.path.join(root, "partial-ds2.safetensors"), "--scheme", "fp8-block", "--json")
    check("partial blocks: counted in --json",
          r.returncode == 0 and json.loads(r.stdout)["partial_block_weights"] == 1, r.stdout + r.stderr)
    r = run(exe, "quantize", src, os.path.join(root, "partial-ct.safetensors"), "--scheme", "fp8-block", "--layout",
            "compressed-tensors", "--json")
    check("partial blocks: none counted for compressed-tensors",
          r.returncode == 0 and json.loads(r.stdout)["partial_block_weights"] == 0, r.stdout + r.stderr)
    # whole blocks, and sides of one block (64: a grid of 1, which any reader gets right), are not counted
    whole = os.path.join(root, "whole.safetensors")
    save_file({"b.weight": rng.normal(0, 1, (256, 128)).astype(np.float32),
               "c.weight": rng.normal(0, 1, (64, 100)).astype(np.float32),
               "d.weight": rng.normal(0, 1, (100, 256)).astype(np.float32)}, whole)
    r = run(exe, "quantize", whole, os.path.join(root, "whole-ds.safetensors"), "--scheme", "fp8-block", "--json")
    check("whole blocks and one-block sides: none counted",
          r.returncode == 0 and json.loads(r.stdout)["partial_block_weights"] == 0, r.stdout + r.stderr)


def check_overflow_is_announced(exe, root, rng):
    """dequantize --to f16 of weights past 65504 and convert --to f16 (or to FP8 without saturation) wrote infinities
    with exit 0 and not a word, where quantize refuses non-finite weights: the count is a note on stderr and
    `overflowed` in --json; nothing is noted where nothing overflowed."""
    src = os.path.join(root, "overflow.safetensors")
    w = rng.normal(0, 1, (16, 256)).astype(np.float32)
    w[2, :10] = 1e5  # past float16's 65504 (and, unscaled, e4m3fn's 448)
    save_file({"l.weight": w}, src)
    q = os.path.join(root, "overflow-q.safetensors")
    r = run(exe, "quantize", src, q, "--scheme", "fp8-tensor")
    check("overflow: quantize", r.returncode == 0, r.stderr)
    # (the advice names what keeps the values: it named bf16 or f32 for --to bf16 and f32 themselves)
    for cmd, args, count, target, advice in (
            ("dequantize", [q, "--to", "f16"], 10, "float16", "dequantize --to bf16 or f32 keeps them"),
            ("convert", [src, "--to", "f16"], 10, "float16", "convert to bf16, f32 or f64 (wider ranges) to keep them"),
            ("convert", [src, "--to", "e4m3fn", "--no-saturate"], 10, "float8_e4m3fn", "--saturate keeps")):
        out = os.path.join(root, f"overflow-{cmd}-{target}.safetensors")
        r = run(exe, cmd, *args[:1], out, *args[1:])
        note = [line for line in r.stderr.splitlines() if line.startswith("note:")]
        check(f"overflow: {cmd} {target} noted", r.returncode == 0 and len(note) == 1 and
              f"{count} finite values of 'l.weight' became inf or NaN past {target}'s range: {advice}" in note[0],
              r.stderr)
        r = run(exe, cmd, *args[:1], out + ".json.safetensors", *args[1:], "--json")
        check(f"overflow: {cmd} {target} counted in --json",
              r.returncode == 0 and json.loads(r.stdout)["overflowed"] == count, r.stdout + r.stderr)
    for cmd, args in (("dequantize", [q, "--to", "bf16"]), ("convert", [src, "--to", "e4m3fn"])):
        r = run(exe, cmd, args[0], os.path.join(root, f"overflow-none-{cmd}.safetensors"), *args[1:], "--json")
        check(f"overflow: none for {cmd} {args[-1]}", r.returncode == 0 and r.stderr == "" and
              json.loads(r.stdout)["overflowed"] == 0, r.stdout + r.stderr)


def check_many_companions(exe, root, rng):
    """More companion files than the soft limit on open files (each staged copy holds its temporary file open until
    the commit): the command raises its soft limit to the hard one and copies them all."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 400:
        print(f"skip: many companions (the hard limit on open files is {hard})")
        return
    src = os.path.join(root, "many-files")
    os.makedirs(os.path.join(src, "extra"))
    save_file({"fc.weight": rng.normal(0, 0.1, (16, 32)).astype(np.float32)}, os.path.join(src, "model.safetensors"))
    for i in range(300):
        with open(os.path.join(src, "extra", f"{i}.txt"), "w") as f:
            f.write(str(i))
    out = os.path.join(root, "many-files-q")
    p = subprocess.run([exe, "quantize", src, out, "--layout", "native", "--scheme", "fp8-tensor", "--json"], capture_output=True, text=True,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (128, hard)))
    check("many companions: exit 0", p.returncode == 0, p.stderr)
    if p.returncode == 0:
        check("many companions: all copied", json.loads(p.stdout).get("files_copied") == 300, p.stdout)


def check_metadata_carried(exe, root, rng):
    """The input's __metadata__ travels to the output of convert, quantize and dequantize (a diffusion checkpoint's
    notes, a modelspec), "format" set to "pt"; fp8kit's own native-layout keys are written by quantize and dropped
    by dequantize."""
    src = os.path.join(root, "meta.safetensors")
    save_file({"blocks.0.attn.weight": rng.normal(0, 0.05, (64, 32)).astype(np.float32)}, src,
              metadata={"format": "tf", "modelspec.title": "a model", "notes": '{"x": [1]}'})
    kept = {"modelspec.title": "a model", "notes": '{"x": [1]}', "format": "pt"}
    steps = [("convert", src, "meta-f16.safetensors", "--to", "f16"),
             ("quantize", src, "meta-q.safetensors", "--layout", "native", "--scheme", "fp8-tensor"),
             ("dequantize", os.path.join(root, "meta-q.safetensors"), "meta-dq.safetensors")]
    for cmd, inp, out, *opts in steps:
        r = run(exe, cmd, inp, os.path.join(root, out), *opts)
        check(f"metadata {cmd}: exit 0", r.returncode == 0, r.stderr)
        if r.returncode != 0:
            continue
        _, meta, _ = read_st(os.path.join(root, out))
        own = {k: v for k, v in meta.items() if k.startswith("fp8kit.")}
        check(f"metadata {cmd}: the input's kept", {k: meta.get(k) for k in kept} == kept, str(meta))
        check(f"metadata {cmd}: fp8kit's own only where quantized", bool(own) == (cmd == "quantize"), str(meta))


def check_all_or_nothing(exe, root, src):
    """A directory output is written whole or not at all: every file is staged and synced before the first rename.
    A failure after the weights are written (here: a companion's folder cannot be created, a file stands in its
    place) leaves an existing output (--force) byte for byte as it was, with no temporary files; an output that
    cannot be created is an I/O error (exit 1); a directory holding only an interrupted write's temporary files
    counts as empty."""
    out = os.path.join(root, "aon-out")
    os.makedirs(out)
    old = {"model.safetensors": b"old weights", "config.json": b'{"old": true}', "1_Pooling": b"a file, not a folder"}
    for name, data in old.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    before = digest(out)
    r = run(exe, "quantize", src, out, "--layout", "deepseek", "--force")
    # (named in OUT, where the user looks: not in the staging directory, removed by then)
    check("all or nothing: exit 1 (I/O), one line", r.returncode == 1 and f"{out}/1_Pooling" in r.stderr and
          ".tmp-" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr)
    check("all or nothing: the output as it was", digest(out) == before and sorted(os.listdir(out)) == sorted(old),
          str(sorted(os.listdir(out))))
    # A directory where a file goes (README.md here) is found before the first rename: nothing renamed either.
    os.remove(os.path.join(out, "1_Pooling"))
    os.makedirs(os.path.join(out, "README.md"))
    before = digest(out)
    r = run(exe, "quantize", src, out, "--layout", "deepseek", "--force")
    check("all or nothing: a directory in the way, exit 1", r.returncode == 1 and "README.md" in r.stderr, r.stderr)
    check("all or nothing: nothing renamed", digest(out) == before and
          sorted(os.listdir(out)) == ["README.md", "config.json", "model.safetensors"], str(sorted(os.listdir(out))))
    blocker = os.path.join(root, "aon-file")
    with open(blocker, "w") as f:
        f.write("x")
    r = run(exe, "quantize", src, os.path.join(blocker, "sub"), "--layout", "deepseek")
    # (A file where OUT's folder should be: said before any work, as a path the user gave wrong.)
    check("an output directory under a file: refused", r.returncode == 2 and "is not a directory" in r.stderr and
          open(blocker).read() == "x", f"rc={r.returncode} {r.stderr}")
    leftover = os.path.join(root, "aon-leftover")
    os.makedirs(leftover)
    with open(os.path.join(leftover, ".model.safetensors.tmp-12345-0"), "wb") as f:
        f.write(b"half a file")
    r = run(exe, "quantize", src, leftover, "--layout", "deepseek")
    check("an interrupted write's temporary file: not 'not empty'", r.returncode == 0, r.stderr)
    check("an interrupted write's temporary file: removed by the next write",
          not os.path.exists(os.path.join(leftover, ".model.safetensors.tmp-12345-0")), str(os.listdir(leftover)))


def check_killed_replace_is_old_or_new(exe, root, src):
    """A --force directory output killed at any moment (SIGKILL: nothing cleaned up) is the old checkpoint or the new
    one, whole: the output is staged beside OUT and swapped in with one rename. The process is killed right after
    each of its renames in turn (FP8KIT_CRASH_AFTER_RENAMES=N, the files committed into the staging directory and the
    exchange), and at random moments. (With the files renamed into OUT one by one, a kill after the second rename
    leaves new shards beside the old ones; a review on 2026-12-06 found 3 mixes in 40 random kills of an 8-shard
    `convert --force`.) The user's own file in OUT stays; what the kills leave beside OUT goes with the next write."""
    out = os.path.join(root, "kill-out")
    shard = ["--max-shard-size", "9000"]

    def state():
        """'bf16' or 'f16' when OUT is one whole checkpoint of that dtype, else a description of the mix."""
        index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
        shards = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
        if shards != sorted(set(index["weight_map"].values())):
            return f"index names {sorted(set(index['weight_map'].values()))}, files {shards}"
        dtypes = {h["dtype"] for f in shards for n, h in read_st(os.path.join(out, f))[2].items()
                  if n != "model.layers.0.pos_ids"}
        torch_dtype = json.load(open(os.path.join(out, "config.json")))["torch_dtype"]
        if dtypes == {"BF16"} and torch_dtype == "bfloat16":
            return "bf16"
        if dtypes == {"F16"} and torch_dtype == "float16":
            return "f16"
        return f"shards {sorted(dtypes)}, config {torch_dtype}"

    def write_old():
        r = run(exe, "convert", src, out, "--to", "bf16", "--force", *shard)
        if r.returncode != 0:
            raise RuntimeError(f"convert --to bf16 failed: {r.stderr}")

    write_old()
    with open(os.path.join(out, "notes.txt"), "w") as f:
        f.write("the user's")
    check("killed replace: the shards are many", len([f for f in os.listdir(out) if f.startswith("model-")]) >= 6,
          str(os.listdir(out)))
    new_cmd = [exe, "convert", src, out, "--to", "f16", "--force", *shard]
    seen, mixed, point = {"bf16": 0, "f16": 0}, [], 0
    while point < 64:  # each commit point in turn, until a run gets past them all
        point += 1
        write_old()
        p = subprocess.run(new_cmd, capture_output=True, env=dict(os.environ, FP8KIT_CRASH_AFTER_RENAMES=str(point)))
        now = state()
        seen[now] = seen.get(now, 0) + 1
        if now not in ("bf16", "f16"):
            mixed.append(f"killed after rename {point}: {now}")
        if p.returncode == 0:
            break
        check(f"killed replace: killed after rename {point}", p.returncode == -signal.SIGKILL, p.stderr)
    check("killed replace: a run gets past every commit point", p.returncode == 0 and state() == "f16", p.stderr)
    start = time.monotonic()
    run(exe, *new_cmd[1:])
    took = time.monotonic() - start
    rng = random.Random(7)
    for i in range(10):  # and at random moments
        write_old()
        p = subprocess.Popen(new_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0, took * 1.2))
        p.kill()
        p.wait()
        now = state()
        seen[now] = seen.get(now, 0) + 1
        if now not in ("bf16", "f16"):
            mixed.append(f"killed at random ({i}): {now}")
    check("killed replace: always the old or the new checkpoint, never a mix", not mixed, "; ".join(mixed))
    check("killed replace: the user's file stays", open(os.path.join(out, "notes.txt")).read() == "the user's")
    write_old()
    left = [f for f in os.listdir(root) if f.startswith(".kill-out.tmp-")]
    check("killed replace: what the kills left beside OUT is gone after the next write", not left, str(left))
    print(f"killed replace: killed after each of {point - 1} renames and 10 times at random: {seen.get('bf16', 0)} "
          f"left the old checkpoint, {seen.get('f16', 0)} the new one, {len(mixed)} a mix")


def check_inspect_memory(exe, root):
    """inspect keeps nothing per tensor for its output (text or --json): its peak grows with the tensor count by what
    the headers take (about 1 KB a tensor), not by the analysis or the JSON document."""
    if not os.path.exists("/proc/self/status"):
        return
    peaks = {}
    for n in (2000, 20000):
        path = os.path.join(root, f"many{n}.safetensors")
        save_file({f"model.layers.{i}.w": np.full((4, 4), i % 7, dtype=ml_dtypes.bfloat16) for i in range(n)}, path)
        for mode in ([], ["--json"]):
            rc, peak = peak_anon_mib([exe, "inspect", path, *mode])
            check(f"inspect {n} tensors {mode}: exit 0", rc == 0)
            peaks[(n, tuple(mode))] = peak
    for mode in ((), ("--json",)):
        grown = peaks[(20000, mode)] - peaks[(2000, mode)]
        check(f"inspect {list(mode)}: memory per tensor bounded", grown <= 18000 * 1.5 / 1024,
              f"{peaks[(2000, mode)]:.1f} MiB for 2,000 tensors, {peaks[(20000, mode)]:.1f} MiB for 20,000")


def stderr_on_a_terminal(cmd):
    """Runs cmd with stderr on a pseudo-terminal (stdout a pipe): its exit status and what it wrote to stderr."""
    import pty
    master, slave = pty.openpty()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    p.wait()
    os.close(master)
    return p.returncode, b"".join(chunks).decode(errors="replace")


def check_progress(exe, root, src):
    """A progress line with throughput and ETA on a terminal, rewritten in place and cleared; nothing on a pipe
    or with --quiet."""
    for cmd in (["quantize", src, os.path.join(root, "p-q"), "--scheme", "fp8-block", "--force"],
                ["convert", src, os.path.join(root, "p-c"), "--to", "f32", "--force"]):
        rc, err = stderr_on_a_terminal([exe, *cmd])
        check(f"{cmd[0]} on a terminal: exit 0", rc == 0, err)
        check(f"{cmd[0]} on a terminal: a progress line with MB/s and ETA",
              f"{cmd[0]} [1/" in err and "MB/s" in err and "ETA" in err and "\r" in err, repr(err[:300]))
        check(f"{cmd[0]} on a terminal: the line is cleared", err.endswith("\r\x1b[K") or "\r\x1b[K" in err[-20:], repr(err[-40:]))
        rc, err = stderr_on_a_terminal([exe, *cmd, "--quiet"])
        check(f"{cmd[0]} --quiet on a terminal: nothing on stderr", rc == 0 and err == "", repr(err[:200]))
        r = run(exe, *cmd)
        check(f"{cmd[0]} on a pipe: nothing on stderr", r.returncode == 0 and r.stderr == "", r.stderr[:200])
    rc, err = stderr_on_a_terminal([exe, "inspect", src])
    check("inspect on a terminal: a progress line over the tensors it analyzes",
          rc == 0 and "inspect [1/" in err and "MB/s" in err, repr(err[:300]))
    rc, err = stderr_on_a_terminal([exe, "inspect", src, "--quiet"])
    check("inspect --quiet on a terminal: nothing on stderr", rc == 0 and err == "", repr(err[:200]))
    rc, err = stderr_on_a_terminal([exe, "train", "--recipe", "fp32", "--steps", "3"])
    check("train on a terminal: the progress bar", rc == 0 and "fp32" in err and "3/3" in err, repr(err[:300]))
    rc, err = stderr_on_a_terminal([exe, "train", "--recipe", "fp32", "--steps", "3", "--quiet"])
    check("train --quiet on a terminal: nothing on stderr", rc == 0 and err == "", repr(err[:200]))


def check_json_reports(exe, root, src, single):
    """quantize, dequantize and convert --json: one object each, its counts as the checkpoint has them and its byte
    counts those of the files read and written."""
    def files_bytes(path):
        if os.path.isdir(path):
            return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))
        return os.path.getsize(path)

    def report(*args):
        r = run(exe, *args, "--json")
        ok = r.returncode == 0 and r.stderr == ""
        j = json.loads(r.stdout) if ok else {}
        check(f"--json {args[0]} runs", ok, r.stderr)
        return j

    q = os.path.join(root, "json-q")
    j = report("quantize", src, q, "--scheme", "fp8-block")
    n_src = len(read_dir(src)[0])
    check("quantize --json", j.get("command") == "quantize" and j.get("input") == src and j.get("output") == q and
          j.get("quantized", 0) > 0 and j["quantized"] + j["copied"] == n_src and j.get("layout") == "deepseek" and
          j.get("scheme") == "fp8-block" and j.get("bytes_in") == files_bytes(src) and
          j.get("bytes_out") == files_bytes(q) and j.get("seconds", -1) > 0, j)
    d = os.path.join(root, "json-d")
    jd = report("dequantize", q, d, "--to", "f32")
    check("dequantize --json", jd.get("dequantized") == j.get("quantized") and jd.get("to") == "float32" and
          jd.get("dropped_scales") == j.get("quantized") and jd.get("bytes_out") == files_bytes(d) and
          jd.get("bytes_in") == files_bytes(q), jd)
    # An index file as IN: the bytes of the shards it lists (it said the index's own size).
    index = os.path.join(src, "model.safetensors.index.json")
    if os.path.exists(index):
        ji = report("quantize", index, os.path.join(root, "json-ix.safetensors"), "--scheme", "fp8-block")
        check("quantize --json of an index: bytes_in the shards'", ji.get("bytes_in") == files_bytes(src), ji)
    c = os.path.join(root, "json-c.safetensors")
    jc = report("convert", single, c, "--to", "f16")
    check("convert --json", jc.get("cast", -1) + jc.get("copied", -1) == len(read_st(single)[0]) and
          jc.get("to") == "float16" and "overflow" not in jc and jc.get("bytes_out") == files_bytes(c), jc)


def main():
    exe = sys.argv[1]
    rng = np.random.default_rng(3)
    with tempfile.TemporaryDirectory() as root:
        src = os.path.join(root, "model")
        os.mkdir(src)
        orig = make_model(src, rng)
        src_digest = digest(src)

        cases = [  # (scheme, layout, format, scale suffix, reference key, quant_method)
            ("fp8-block", None, "e4m3fn", "_scale_inv", "deepseek", "fp8"),
            ("fp8-channel", "compressed-tensors", "e4m3fn", "_scale", "channel", "compressed-tensors"),
            ("fp8-block", "compressed-tensors", "e4m3fn", "_scale", "deepseek", "compressed-tensors"),
            ("fp8-tensor", "autofp8", "e4m3fn", "_scale", "tensor", "fp8"),
            ("fp8-channel", "fbgemm", "e4m3fn", "_scale", "channel", "fbgemm_fp8"),
            ("mxfp8", None, "e4m3fn", "_scale", "mxfp8", "modelopt"),
            ("fp8-block", "native", "e5m2", ".scale_inv", "native-block", "fp8kit"),
        ]
        for scheme, layout, fmt, suffix, ref, method in cases:
            tag = f"{scheme}/{layout or 'default'}/{fmt}"
            out = os.path.join(root, f"q-{scheme}-{layout}")
            args = ["quantize", src, out, "--scheme", scheme, "--format", fmt] + (["--layout", layout] if layout else [])
            r = run(exe, *args)
            check(f"{tag}: quantize exit 0", r.returncode == 0, r.stderr)
            if r.returncode != 0:
                continue
            q, meta, header = read_dir(out)
            cfg = json.load(open(os.path.join(out, "config.json")))
            qc = cfg.get("quantization_config", {})
            check(f"{tag}: config keeps its keys", cfg.get("hidden_size") == 64 and cfg["architectures"])
            check(f"{tag}: quant_method", qc.get("quant_method") == method, str(qc))
            check(f"{tag}: tokenizer copied", os.path.exists(os.path.join(out, "tokenizer.json")))
            expect_layout = layout or {"fp8-block": "deepseek", "mxfp8": "mxfp8"}[scheme]
            if expect_layout == "deepseek":
                skipped = ["lm_head", "model.embed_tokens", "model.layers.0.mlp.gate"]
                check(f"{tag}: DeepSeek config", qc == {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                                         "weight_block_size": [128, 128], "ignored_layers": skipped,
                                                         "modules_to_not_convert": skipped}, str(qc))
            if expect_layout == "compressed-tensors":
                g = qc["config_groups"]["group_0"]
                check(f"{tag}: CT config", qc["format"] == "float-quantized" and g["targets"] == ["Linear"] and
                      g["weights"]["type"] == "float" and g["weights"]["num_bits"] == 8 and
                      g["weights"]["strategy"] == scheme.split("-")[1] and g["input_activations"]["dynamic"] is True, str(qc))
            r = run(exe, "inspect", out, "--json")
            check(f"{tag}: inspect exit 0", r.returncode == 0, r.stderr)
            info = json.loads(r.stdout)
            check(f"{tag}: detected layout", info["layout"] == expect_layout, info["layout"])
            check(f"{tag}: quantized weights", sorted(x["weight"] for x in info["quantized"]) == QUANTIZED,
                  str(info["quantized"]))
            for name in QUANTIZED:
                w, s = q[name], q[name + suffix]
                check(f"{tag}: {name} dtype", header[name]["dtype"] == ("F8_E4M3" if fmt == "e4m3fn" else "F8_E5M2"))
                rows, cols = w.shape
                shape = {"deepseek": [-(-rows // 128), -(-cols // 128)], "native-block": [-(-rows // 128), -(-cols // 128)],
                         "channel": [rows, 1], "mxfp8": [rows, -(-cols // 32)],
                         "tensor": []}[ref]
                check(f"{tag}: {name} scale shape", list(s.shape) == shape, f"{s.shape} vs {shape}")
                sdt = header[name + suffix]["dtype"]
                want = {"compressed-tensors": "BF16", "mxfp8": "U8"}.get(expect_layout, "F32")
                check(f"{tag}: {name} scale dtype", sdt == want, sdt)
            for name in orig:
                if name not in QUANTIZED:
                    check(f"{tag}: {name} copied", q[name].tobytes() == orig[name].tobytes())
            deq = out + "-deq"
            r = run(exe, "dequantize", out, deq, "--to", "f32")
            check(f"{tag}: dequantize exit 0", r.returncode == 0, r.stderr)
            d, _, dheader = read_dir(deq)
            check(f"{tag}: dequantized names", sorted(d) == sorted(orig), str(sorted(d)))
            dcfg = json.load(open(os.path.join(deq, "config.json")))
            check(f"{tag}: quantization_config removed", "quantization_config" not in dcfg and dcfg["torch_dtype"] == "float32")
            # the PyPI reader opens every file fp8kit wrote and reads the float32 weights the same
            for folder in (out, deq):
                for f in sorted(os.listdir(folder)):
                    if f.endswith(".safetensors"):
                        with safe_open(os.path.join(folder, f), framework="numpy") as h:
                            check(f"{tag}: safetensors opens {os.path.basename(folder)}/{f}", len(list(h.keys())) > 0)
            with safe_open(os.path.join(deq, "model.safetensors"), framework="numpy") as h:
                check(f"{tag}: safetensors reads the dequantized weights",
                      all(np.array_equal(h.get_tensor(n), d[n]) for n in QUANTIZED))
            for name in QUANTIZED:
                ref_vals = reference_dequant(ref, q[name], q[name + suffix])
                check(f"{tag}: {name} = numpy formula", np.array_equal(d[name], ref_vals) and dheader[name]["dtype"] == "F32")
                x = orig[name].astype(np.float32)
                rel = (0.07 if fmt == "e4m3fn" else 0.13) + (0.13 if scheme == "mxfp8" else 0)
                check(f"{tag}: {name} close to the original",
                      np.all(np.abs(d[name] - x) <= rel * np.abs(x) + 1e-4 * np.max(np.abs(x))))
            for name in orig:
                if name not in QUANTIZED:
                    check(f"{tag}: {name} passes through", d[name].tobytes() == orig[name].tobytes())

        # DeepSeek-V3.1's ue8m0 scales: powers of two, never below the block amax / 448 (nothing saturates)
        out = os.path.join(root, "q-ue8m0")
        r = run(exe, "quantize", src, out, "--scheme", "fp8-block", "--scale-fmt", "ue8m0")
        check("ue8m0: quantize exit 0", r.returncode == 0, r.stderr)
        q, _, _ = read_dir(out)
        qc = json.load(open(os.path.join(out, "config.json")))["quantization_config"]
        check("ue8m0: config scale_fmt", qc.get("scale_fmt") == "ue8m0" and qc["quant_method"] == "fp8", str(qc))
        for name in QUANTIZED:
            s = q[name + "_scale_inv"].astype(np.float64)
            mant, _ = np.frexp(s)
            check(f"ue8m0: {name} scales are powers of two", np.all(mant == 0.5), str(s))
            x = orig[name].astype(np.float32)
            rows, cols = x.shape
            gr, gc = -(-rows // 128), -(-cols // 128)
            padded = np.zeros((gr * 128, gc * 128), np.float32)
            padded[:rows, :cols] = x
            amax = np.abs(padded.reshape(gr, 128, gc, 128)).max(axis=(1, 3))
            check(f"ue8m0: {name} scale >= amax / 448 and < 2 amax / 448",
                  np.all(s >= amax / 448) and np.all(s < 2 * amax / 448), f"{s} {amax / 448}")
        deq = out + "-deq"
        r = run(exe, "dequantize", out, deq, "--to", "f32")
        d, _, _ = read_dir(deq)
        for name in QUANTIZED:
            x = orig[name].astype(np.float32)
            check(f"ue8m0: {name} = numpy formula and close to the original",
                  r.returncode == 0 and np.array_equal(d[name], reference_dequant("deepseek", q[name], q[name + "_scale_inv"]))
                  and np.all(np.abs(d[name] - x) <= 0.07 * np.abs(x) + 1e-4 * np.max(np.abs(x))))
        for args, needle in ((["--scheme", "mxfp8", "--scale-fmt", "ue8m0"], "E8M0"),
                             (["--scheme", "fp8-block", "--scale-fmt", "e8m0"], "--scale-fmt")):
            dest = os.path.join(root, "q-refused")
            r = run(exe, "quantize", src, dest, *args)
            check(f"ue8m0 refusal {args}", one_line_error(r, "quantize") and needle in r.stderr and
                  not os.path.exists(dest), r.stderr)

        check("input directory untouched", digest(src) == src_digest)

        # bf16 output (the default) and inspect's table
        out = os.path.join(root, "q-fp8-block-None")
        r = run(exe, "dequantize", out, os.path.join(root, "bf16"))
        d, _, dheader = read_dir(os.path.join(root, "bf16"))
        check("default --to bf16", r.returncode == 0 and dheader[QUANTIZED[0]]["dtype"] == "BF16", r.stderr)
        r = run(exe, "inspect", out)
        check("inspect table", r.returncode == 0 and "layout: deepseek" in r.stdout and "quantized weights: 3" in r.stdout
              and "scale of model.layers.0.self_attn.q_proj.weight" in r.stdout, r.stdout[:400])

        # sharded outputs: shards + index, read back through the index
        sh = os.path.join(root, "sharded")
        r = run(exe, "quantize", src, sh, "--scheme", "fp8-block", "--max-shard-size", "20KB")
        files = sorted(os.listdir(sh)) if os.path.isdir(sh) else []
        shards = [f for f in files if f.endswith(".safetensors")]
        check("--max-shard-size splits", r.returncode == 0 and len(shards) > 1 and
              all(f.startswith("model-0") and f.endswith(f"-of-{len(shards):05d}.safetensors") for f in shards),
              r.stderr + str(files))
        index = json.load(open(os.path.join(sh, "model.safetensors.index.json"))) if "model.safetensors.index.json" in files else {}
        q, _, header = read_dir(sh)
        check("index maps every tensor", sorted(index.get("weight_map", {})) == sorted(q), str(index)[:300])
        r = run(exe, "inspect", sh, "--json")
        check("inspect a sharded output", r.returncode == 0 and json.loads(r.stdout)["shards"] == len(shards) and
              json.loads(r.stdout)["layout"] == "deepseek", r.stderr)
        r = run(exe, "dequantize", sh, sh + "-d", "--to", "f32", "--max-shard-size", "30KiB")  # binary units too
        d, _, _ = read_dir(sh + "-d")
        check("dequantize a sharded checkpoint into shards", r.returncode == 0 and sorted(d) == sorted(orig) and
              os.path.exists(os.path.join(sh + "-d", "model.safetensors.index.json")), r.stderr)
        check("same values as unsharded", all(np.array_equal(d[n], reference_dequant("deepseek", q[n], q[n + "_scale_inv"]))
                                              for n in QUANTIZED))

        # single files, --ignore, --force
        single = os.path.join(root, "single.safetensors")
        save_file({k: orig[k] for k in ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight"]},
                  single)
        single_digest = digest(single)
        qs = os.path.join(root, "single-q.safetensors")
        r = run(exe, "quantize", single, qs, "--scheme", "fp8-channel", "--ignore", "o_proj")
        check("single file quantize", r.returncode == 0, r.stderr)
        q, _, header = read_st(qs)
        check("--ignore leaves o_proj", header["model.layers.0.self_attn.o_proj.weight"]["dtype"] == "BF16" and
              header["model.layers.0.self_attn.q_proj.weight"]["dtype"] == "F8_E4M3")
        before = digest(qs)
        r = run(exe, "quantize", single, qs, "--scheme", "fp8-tensor")
        check("existing output refused", one_line_error(r, "quantize") and "--force" in r.stderr, r.stderr)
        check("refused output untouched", digest(qs) == before)
        r = run(exe, "quantize", single, qs, "--scheme", "fp8-tensor", "--force")
        check("--force replaces", r.returncode == 0 and digest(qs) != before, r.stderr)
        r = run(exe, "dequantize", qs, os.path.join(root, "single-d.safetensors"))
        check("single file dequantize", r.returncode == 0, r.stderr)
        r = run(exe, "dequantize", qs, os.path.join(root, "single-d.safetensors"))
        check("dequantize refuses existing output", one_line_error(r, "dequantize"), r.stderr)
        check("input file untouched", digest(single) == single_digest)

        # convert: plain casts, against numpy / ml_dtypes
        cf = os.path.join(root, "single-f16.safetensors")
        r = run(exe, "convert", single, cf, "--to", "f16")
        c, _, _ = read_st(cf)
        check("convert to f16", r.returncode == 0 and all(np.array_equal(c[k], v.astype(np.float32).astype(np.float16))
                                                          for k, v in read_st(single)[0].items()), r.stderr)
        ce = os.path.join(root, "single-e4m3.safetensors")
        r = run(exe, "convert", single, ce, "--to", "e4m3fn", "--saturate")
        c, _, _ = read_st(ce)
        check("convert to e4m3fn", r.returncode == 0 and all(
            c[k].view(np.uint8).tobytes() == v.astype(np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).tobytes()
            for k, v in read_st(single)[0].items()), r.stderr)
        cd = os.path.join(root, "model-f32")
        r = run(exe, "convert", src, cd, "--to", "f32")
        c, _, _ = read_dir(cd)
        check("convert a directory", r.returncode == 0 and c["lm_head.weight"].dtype == np.float32 and
              c["model.layers.0.pos_ids"].dtype == np.int64 and
              json.load(open(os.path.join(cd, "config.json")))["torch_dtype"] == "float32", r.stderr)

        # a layout that stores one scheme implies it: --layout deepseek without --scheme is fp8-block
        implied = os.path.join(root, "q-implied")
        r = run(exe, "quantize", src, implied, "--layout", "deepseek")
        check("quantize --layout deepseek implies fp8-block", r.returncode == 0 and
              "(fp8-block e4m3fn, deepseek layout" in r.stdout, r.stdout + r.stderr)

        # errors: one line, exit 2
        pickle = os.path.join(root, "pytorch_model.bin")
        with open(pickle, "wb") as f:
            f.write(b"\x80\x02}q\x00.")
        folder_config = os.path.join(root, "folder-config")  # (its output had no config.json, and said nothing)
        shutil.copytree(src, folder_config, ignore=shutil.ignore_patterns("config.json"))
        os.makedirs(os.path.join(folder_config, "config.json"))
        bad = [
            (["dequantize", folder_config, os.path.join(root, "x0")], "dequantize", "config.json' is not a file"),
            (["quantize", src, os.path.join(root, "x1"), "--scheme", "fp8"], "quantize", "unknown --scheme"),
            (["quantize", src, os.path.join(root, "x1")], "quantize", "--scheme is needed"),
            (["quantize", src, os.path.join(root, "x1"), "--layout", "compressed-tensors"], "quantize",
             "stores more than one scheme"),
            (["quantize", src, os.path.join(root, "x2"), "--scheme", "fp8-tensor", "--layout", "deepseek"], "quantize",
             "cannot store fp8-tensor"),
            (["quantize", src, os.path.join(root, "x3"), "--scheme", "fp8-block", "--format", "e5m2"], "quantize",
             "e4m3fn"),
            (["quantize", src, os.path.join(root, "x4"), "--scheme", "mxfp8", "--layout", "fbgemm"], "quantize",
             "cannot store mxfp8"),
            (["quantize", src, os.path.join(root, "x5"), "--scheme", "fp8-block", "--ignore", "("], "quantize",
             "regular expression"),
            # every weight kept by --ignore: named as the cause, not "has no weight to quantize"
            (["quantize", src, os.path.join(root, "x5"), "--scheme", "fp8-block", "--ignore", "."], "quantize",
             "matches --ignore, so nothing is left to quantize"),
            # one regex per --ignore: a second word is refused, not taken as a pattern
            (["quantize", src, os.path.join(root, "x5"), "--scheme", "fp8-block", "--ignore", "a", "b"], "quantize",
             "not expected: b"),
            (["quantize", out, os.path.join(root, "x6"), "--scheme", "fp8-block"], "quantize", "already quantized"),
            (["quantize", src, src, "--scheme", "fp8-block", "--force"], "quantize", "is the input"),
            (["quantize", pickle, os.path.join(root, "x7.safetensors"), "--scheme", "fp8-block"], "quantize", "pickle"),
            (["dequantize", pickle, os.path.join(root, "x8.safetensors")], "dequantize", "pickle"),
            (["dequantize", src, os.path.join(root, "x9")], "dequantize", "no quantized FP8 weights"),
            (["dequantize", out, os.path.join(root, "x10"), "--to", "e4m3fn"], "dequantize", "--to"),
            (["dequantize", os.path.join(root, "missing"), os.path.join(root, "x11")], "dequantize", "does not exist"),
            (["inspect", pickle], "inspect", "pickle"),
            (["convert", out, os.path.join(root, "x12"), "--to", "bf16"], "convert", "use fp8kit dequantize"),
            (["convert", single, os.path.join(root, "x13.safetensors"), "--to", "i32"], "convert", "--to"),
            (["convert", single, os.path.join(root, "x14.safetensors"), "--to", "bf16", "--saturate"], "convert",
             "--saturate"),
            (["convert", src, single, "--to", "f16", "--force"], "convert", "is a file"),
            (["convert", single, os.path.join(root, "x13.safetensors"), "--to", "f16", "--max-shard-size", "1GB"],
             "convert", "directory outputs"),
            (["quantize", src, os.path.join(root, "x14"), "--scheme", "fp8-block", "--max-shard-size", "5 GiB"],
             "quantize", "--max-shard-size"),
            (["quantize", src, os.path.join(root, "x14"), "--scheme", "fp8-block", "--max-shard-size", "0MiB"],
             "quantize", "--max-shard-size"),
            (["quantize", src, os.path.join(root, "x14"), "--scheme", "fp8-block", "--max-shard-size", ""],
             "quantize", "--max-shard-size: an empty value"),
            # past uint64 (or 2^62 bytes) is too large, not "not a size"
            (["quantize", src, os.path.join(root, "x14"), "--scheme", "fp8-block", "--max-shard-size",
              "18446744073709551616"], "quantize", "is too large (at most 2^62 bytes)"),
            (["quantize", src, os.path.join(root, "x14"), "--scheme", "fp8-block", "--max-shard-size",
              "4611686018427387905"], "quantize", "is too large"),
            (["convert", src, os.path.join(src, "out"), "--to", "f16"], "convert", "is inside the input directory"),
            # a directory input written to a name ending in .safetensors made a directory of that name
            (["quantize", src, os.path.join(root, "x15.safetensors"), "--scheme", "fp8-block"], "quantize",
             "give a directory name"),
            (["convert", single, os.path.join(root, "nodir", "x.safetensors"), "--to", "f16"], "convert",
             "does not exist; create it first"),
        ]
        for args, command, text in bad:
            r = run(exe, *args)
            check(f"error: {' '.join(args[:1] + args[3:])}", one_line_error(r, command) and text in r.stderr,
                  f"rc={r.returncode} {r.stderr!r}")
        check_json_reports(exe, root, src, single)
        check_bounded_memory(exe, root)
        check_inspect_memory(exe, root)
        check_foreign_files(exe, root, rng)
        check_model_directory_files(exe, root, rng)
        check_progress(exe, root, src)
        check_killed_replace_is_old_or_new(exe, root, src)
        check("no output left by refused commands", not any(os.path.exists(os.path.join(root, f"x{i}")) for i in range(15))
              and not os.path.exists(os.path.join(root, "x15.safetensors")))
        check("input directory still untouched", digest(src) == src_digest)
    return summary()


if __name__ == "__main__":
    sys.exit(main())
