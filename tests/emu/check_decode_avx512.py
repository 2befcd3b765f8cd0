"""The AVX-512 level's FP8 -> bfloat16 decode (VBMI byte tables; e8m0fnu's own path) under isa-emu, against the
codec's bfloat16 of every code bit for bit (NaN codes: a NaN): the plain and the streaming-store variants, lengths
around the 64-code step, output offsets that move the streaming variant's unaligned head; nothing written outside
the output."""
import subprocess
import sys

import ml_dtypes
import numpy as np

from emu_common import BUILD, FORMATS, Arena, bf16_table, emulator

emu, syms = emulator("convert_avx512")
table = bf16_table()
native = subprocess.run([f"{BUILD}/convert_reference", "shift-rules"], capture_output=True, text=True, check=True)
rules = bytes.fromhex("".join(native.stdout.split()))
setup = Arena(emu)
table_at, rules_at = setup.put(table), setup.put(np.frombuffer(rules, np.uint8))
emu.call(syms["set_up"], table_at, rules_at)
IN, OUT, GUARD = setup.at, setup.at + 0x4000, 256
rng = np.random.default_rng(5)
cases, failures = 0, []
for f in range(5):
    nan_code = np.isnan(table[f].view(ml_dtypes.bfloat16).astype(np.float32))
    for n in (0, 1, 31, 63, 64, 65, 127, 256, 1000, 4097):
        for stream in (0, 1):
            for offset in ((0, 2, 62) if stream else (0, 6)):
                codes = rng.permutation(np.resize(np.arange(256, dtype=np.uint8), n))
                emu.write(IN, codes.tobytes())
                emu.write(OUT, b"\xab" * (offset + 2 * n + GUARD))
                emu.call(syms["run_decode"], IN, OUT + offset, n, f, stream)
                got = np.frombuffer(emu.read(OUT + offset, 2 * n), np.uint16)
                want, nan = table[f][codes], nan_code[codes]
                ok = (np.array_equal(got[~nan], want[~nan])
                      and np.isnan(got[nan].view(ml_dtypes.bfloat16).astype(np.float32)).all()
                      and emu.read(OUT, offset) == b"\xab" * offset
                      and emu.read(OUT + offset + 2 * n, GUARD) == b"\xab" * GUARD)
                cases += 1
                if not ok:
                    failures.append(f"{FORMATS[f]} n={n} stream={stream} offset={offset}")
print(f"AVX-512 decode to bfloat16: {cases} cases, {len(failures)} failures")
for f in failures[:20]:
    print("FAIL", f)
sys.exit(1 if failures else 0)
