"""The AVX-512 level's encoders (encode_avx512<In> for bfloat16, float16 and float32) under isa-emu, against the codes
the native library computes at the scalar level (the codec) bit for bit: every bfloat16 and float16 bit pattern and
393,216 float32 values (each bfloat16 pattern with six low halves), into all five formats, both overflow policies,
round to nearest even and seeded stochastic rounding (the stream from offset 7), scales 1 and 0.375: 120 cases. The
EncodeParams and the 16-bit encode rules are the native library's (convert_reference encode-cases)."""
import os
import struct
import sys

import numpy as np

from emu_common import BUILD, FORMATS, Arena, bf16_table, emulator

cases_dir = os.path.join(BUILD, "encode")
emu, syms = emulator("convert_avx512", 1 << 23)
setup = Arena(emu)
emu.call(syms["set_up"], setup.put(bf16_table()), setup.put(np.zeros(1024, np.uint8)))  # (the decode's tables)
inputs = {0: np.fromfile(os.path.join(cases_dir, "inputs_bf16.bin"), np.uint16),
          1: np.fromfile(os.path.join(cases_dir, "inputs_f16.bin"), np.uint16),
          2: np.fromfile(os.path.join(cases_dir, "inputs_f32.bin"), np.uint32)}
arena = Arena(emu, setup.at)
input_at = {t: arena.put(a) for t, a in inputs.items()}
out_at = arena.put(np.zeros(inputs[2].size + 256, np.uint8))
params_at = arena.at
TYPES = ["bfloat16", "float16", "float32"]

blob = open(os.path.join(cases_dir, "cases.bin"), "rb").read()
params_size, rule_size = struct.unpack_from("<II", blob, 0)
pos, cases, failures = 8, 0, []
while pos < len(blob):
    kind = blob[pos]
    params = blob[pos + 1:pos + 1 + params_size]
    rules = blob[pos + 1 + params_size:pos + 1 + params_size + 8 * rule_size]
    pos += 1 + params_size + 8 * rule_size
    n = inputs[kind].size
    want = np.frombuffer(blob, np.uint8, n, pos)
    pos += n
    fmt, overflow, rounding = params[0], params[1], params[2]
    (scale,) = struct.unpack_from("<f", params, 4)
    emu.write(params_at, params + rules)
    emu.write(out_at, b"\xab" * (n + 256))
    emu.call(syms["run_encode"], input_at[kind], out_at, n, kind, params_at)
    got = np.frombuffer(emu.read(out_at, n), np.uint8)
    mismatches = int((got != want).sum())
    if emu.read(out_at + n, 256) != b"\xab" * 256:
        mismatches = max(mismatches, 1)
    cases += 1
    if mismatches:
        failures.append(f"{TYPES[kind]} -> {FORMATS[fmt][7:]}, {'saturate' if overflow else 'non-saturating'}, "
                        f"{'stochastic' if rounding else 'nearest even'}, scale {scale:g}: {mismatches} of {n} codes")
print(f"AVX-512 encode: {cases} cases, {len(failures)} failures")
for f in failures[:20]:
    print("FAIL", f)
sys.exit(1 if failures or cases != 120 else 0)
