#!/usr/bin/env bash
# AVX-512 kernels checked for correctness on a CPU without AVX-512, under isa-emu (an x86 emulator that executes
# AVX-512 with VBMI and AVX512-BF16: ../shared/tools/isa-emu, a developer tool, not part of fp8kit or its suite).
# Each check compiles one kernel file freestanding with its level's flags (CMakeLists.txt's FP8KIT_ISA_FLAGS_*) into
# a flat blob and runs it there against a reference; docs/testing.md says what each covers. Speed needs hardware.
#
#   bash tests/emu/run.sh [native build directory, default build]
#
# Needs the native build's libfp8kit.a (for values the checks take from the library), NumPy and ml_dtypes, and
# isa-emu set up as its README says (pip install bochscpu-python==0.4.0); ISA_EMU names its directory if it is not
# ../shared/tools/isa-emu beside the repository. Writes build-emu/.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
emu=${ISA_EMU:-$root/../shared/tools/isa-emu}
native=${1:-$root/build}
out=$root/build-emu
[[ -f $emu/bxrun.py ]] || { echo "tests/emu/run.sh: isa-emu not found at $emu: set ISA_EMU to its directory" >&2; exit 2; }
[[ -f $native/libfp8kit.a ]] || { echo "tests/emu/run.sh: no $native/libfp8kit.a: build fp8kit first (cmake --build build)" >&2; exit 2; }
mkdir -p "$out"

# A level's flags as CMakeLists.txt sets them (each level adds to the one below).
flags_of() {
  local value
  value=$(sed -n "s/^set(FP8KIT_ISA_FLAGS_$1 \"\(.*\)\")\$/\1/p" "$root/CMakeLists.txt")
  [[ -n $value ]] || { echo "tests/emu/run.sh: no FP8KIT_ISA_FLAGS_$1 in CMakeLists.txt" >&2; exit 2; }
  while [[ $value =~ \$\{FP8KIT_ISA_FLAGS_([a-z0-9]+)\} ]]; do
    value=${value//"${BASH_REMATCH[0]}"/$(flags_of "${BASH_REMATCH[1]}")}
  done
  echo "${value//;/ }"
}

# blob NAME LEVEL: tests/emu/NAME.cpp -> build-emu/NAME.bin and NAME.sym (entry points), at isa-emu's code address.
blob() {
  local name=$1 flags
  flags=$(flags_of "$2")
  # shellcheck disable=SC2086  # the flags are words
  g++ -std=c++20 -O3 -DNDEBUG -fno-exceptions -fno-rtti -fno-threadsafe-statics -ffreestanding -fno-stack-protector \
    -fno-asynchronous-unwind-tables -fcf-protection=none -fno-pic -mno-red-zone $flags \
    -I"$root/src" -I"$root/include" -I"$root/tests/emu" -c "$root/tests/emu/$name.cpp" -o "$out/$name.o"
  if [[ -n $(nm -u "$out/$name.o") ]]; then
    echo "tests/emu/run.sh: $name reaches functions outside the blob (stub them in tests/emu/$name.cpp):" >&2
    nm -u "$out/$name.o" | c++filt >&2
    exit 1
  fi
  ld -nostdlib -static --no-warn-rwx-segments -e 0x400000 -T "$root/tests/emu/blob.ld" "$out/$name.o" -o "$out/$name.elf"
  objcopy -O binary "$out/$name.elf" "$out/$name.bin"
  nm "$out/$name.elf" | awk '$2=="T"||$2=="t"{print $3, "0x"$1}' > "$out/$name.sym"
}

gcc -shared -fPIC -O2 -o "$out/libisoc23_shim.so" "$emu/isoc23_shim.c"  # the wheel wants glibc 2.38's symbols
g++ -std=c++20 -O2 -I"$root/src" -I"$root/include" "$root/tests/emu/convert_reference.cpp" "$native/libfp8kit.a" \
  -fopenmp -o "$out/convert_reference"
mkdir -p "$out/encode"
FP8KIT_ISA=scalar "$out/convert_reference" encode-cases "$out/encode"  # the codec's codes
blob convert_avx512 avx512
blob gemv_avx512bf16 avx512bf16

status=0
for check in check_decode_avx512 check_encode_avx512 check_gemv_avx512bf16; do
  (cd "$root/tests/emu" && FP8KIT_EMU_BUILD=$out ISA_EMU=$emu python3 -B "$check.py") || status=1
done
exit $status
