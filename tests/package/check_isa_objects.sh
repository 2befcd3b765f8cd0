#!/usr/bin/env bash
# The object files compiled for one ISA level (src/<layer>/cpu/*_<isa>.cpp) must define no weak functions: the
# linker keeps one copy of each weak function (template instances, inline functions not inlined) for the whole
# library and may pick the copy compiled for AVX-512, which the rest of the library would then run on a CPU without
# it. Usage: check_isa_objects.sh <the fp8kit target's object directory>
set -euo pipefail
dir="$1"
mapfile -t objects < <(find "$dir" -name '*_avx2.cpp.o' -o -name '*_avx512.cpp.o' -o -name '*_avx512bf16.cpp.o' \
  -o -name '*_amx.cpp.o' | sort)
if [ "${#objects[@]}" -lt 8 ]; then
  echo "found only ${#objects[@]} ISA object files under $dir (expected the avx2, avx512, avx512bf16 and amx kernels)"
  exit 1
fi
status=0
for o in "${objects[@]}"; do
  weak=$(nm -C --defined-only "$o" | awk '$2 == "W" || $2 == "w"' || true)
  if [ -n "$weak" ]; then
    echo "$o defines weak functions (move them out of the ISA-flagged file):"
    echo "$weak"
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "${#objects[@]} ISA object files, no weak functions"
exit "$status"
