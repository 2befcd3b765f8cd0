#!/usr/bin/env bash
# The one prepared run for a machine with an NVIDIA GPU and nothing else installed but nvcc, CMake, ninja and
# Python (the lent H200 of docs/cuda.md): builds the library and the tests with the CUDA backend, runs every GPU
# test, runs the CUDA benchmarks (fp8kit bench convert|scaling|gemm --device cuda), and writes the logs to $OUT
# (default ./device-out). Two steps:
#   scripts/device-check.sh --prepare   here, with the Debian packages of scripts/setup.sh installed: copies what
#                                       the build needs and that machine lacks (GoogleTest's sources, the headers and
#                                       CMake packages of nlohmann/json and CLI11, {fmt}'s and its shared library,
#                                       nccl.h; oneDNN and OpenBLAS, compressed, for the CPU benchmarks'
#                                       baselines) into .device/ (git-ignored, about 19 MB)
#   scripts/device-check.sh             there, in the repository root, with .device/ carried along
# Under 8 minutes on 16 cores: GoogleTest ~20 s, fp8kit's library, four test binaries and the CLI ~3 min, the tests
# ~1 min, the benchmarks ~1 min, the exhaustive CUDA cast check (all 2^32 float32 inputs, five formats, both overflow
# policies) about a minute, and last a CPU-only build of the CLI and the CPU benchmarks on two of the host's cores
# (~3 min: its AMX kernels against OpenBLAS and oneDNN, issue 11's figures for a Xeon that is not a 2-vCPU VM).
set -uo pipefail
cd "$(dirname "$0")/.."
deps=.device

if [ "${1:-}" = "--prepare" ]; then
  set -e
  lib=/usr/lib/x86_64-linux-gnu
  nccl_h=/usr/local/cuda/include/nccl.h
  for need in /usr/src/googletest/CMakeLists.txt /usr/include/nlohmann/json.hpp /usr/share/cmake/nlohmann_json \
    /usr/include/CLI /usr/share/cmake/CLI11 /usr/include/fmt $lib/cmake/fmt $lib/libfmt.so "$nccl_h"; do
    [ -e "$need" ] || { echo "device-check --prepare: $need is missing: run scripts/setup.sh first" >&2; exit 2; }
  done
  rm -rf "$deps"
  # Each package under its own prefix, in the layout its CMake files find their prefix from.
  mkdir -p "$deps/json/include" "$deps/json/share/cmake" "$deps/cli11/include" "$deps/cli11/share/cmake" \
    "$deps/fmt/include" "$deps/fmt/lib/x86_64-linux-gnu/cmake"
  cp -r /usr/src/googletest "$deps/googletest"
  cp -r /usr/include/nlohmann "$deps/json/include/"
  cp -r /usr/share/cmake/nlohmann_json "$deps/json/share/cmake/"
  cp -r /usr/include/CLI "$deps/cli11/include/"
  cp -r /usr/share/cmake/CLI11 "$deps/cli11/share/cmake/"
  cp -r /usr/include/fmt "$deps/fmt/include/"
  cp -r $lib/cmake/fmt "$deps/fmt/lib/x86_64-linux-gnu/cmake/"
  cp -a $lib/libfmt.so* "$deps/fmt/lib/x86_64-linux-gnu/"
  mkdir -p "$deps/nccl/include"
  cp "$nccl_h" "$deps/nccl/include/"  # the header alone: the library is loaded at run time
  # The CPU benchmarks' baselines for the GPU machine's host CPU (an Intel Xeon with AMX): oneDNN (headers, library)
  # and OpenBLAS with what they load, xz-compressed under their sonames (~12 MB), unpacked there before the build.
  mkdir -p "$deps/cpu/include" "$deps/cpu/lib"
  cp /usr/include/dnnl*.h* "$deps/cpu/include/"
  cp -r /usr/include/oneapi "$deps/cpu/include/"
  for soname in libdnnl.so.2 libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libOpenCL.so.1; do
    real="$(readlink -f "$lib/$soname")"
    [ -f "$real" ] || { echo "device-check --prepare: $lib/$soname is missing: run scripts/setup.sh first" >&2; exit 2; }
    xz -T2 -6 -c "$real" >"$deps/cpu/lib/$soname.xz"  # (unpacked there with Python's lzma)
  done
  grep -qx '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >>.git/info/exclude
  echo "device-check: $(du -sh "$deps" | cut -f1) in $deps/; carry it (run's carry: [\".device\"]) and run scripts/device-check.sh there"
  exit 0
elif [ -n "${1:-}" ]; then
  echo "scripts/device-check.sh: unknown option '$1' (--prepare here, or no option on the GPU machine)" >&2
  exit 2
fi

[ -d "$deps/googletest" ] && [ -d "$deps/json" ] && [ -d "$deps/cli11" ] && [ -d "$deps/fmt" ] && [ -d "$deps/nccl" ] || {
  echo "device-check: $deps/ is missing: run scripts/device-check.sh --prepare where the packages are, and carry it" >&2
  exit 2
}
out="${OUT:-$PWD/device-out}"
mkdir -p "$out"
jobs="$(nproc)"
status=0
# step NAME COMMAND...: runs it with its output appended to $out/$log.log (log: NAME unless set), prints the end,
# and remembers a failure. At most 8 files come back from the lent machine: the build's steps share build.log.
step() {
  local name=$1 file="$out/${log:-$1}.log"
  shift
  echo "== $name"
  echo "== $name: $*" >>"$file"
  if ! "$@" >>"$file" 2>&1; then
    echo "   FAILED (see $(basename "$file"))"
    tail -n 30 "$file"
    status=1
    return 1
  fi
  tail -n 3 "$file"
}

rm -f "$out"/*.log "$out"/*.json
results="$PWD/build-device/results"  # the tests' JSON stays there: only 8 files come back from $OUT
mkdir -p "$results"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  nvcc --version | tail -n 2
  cmake --version | head -n 1
  lscpu | grep -E 'Model name|^CPU\(s\)'
} >"$out/machine.log" 2>&1
cat "$out/machine.log"

prefix="$PWD/$deps/prefix"
log=build
rm -rf "$deps/gtest-build" "$deps/prefix"  # a build from another machine (its CMake cache names its tools)
step googletest bash -c "cmake -S $deps/googletest -B $deps/gtest-build -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX=$prefix -DBUILD_GMOCK=OFF && cmake --build $deps/gtest-build -j $jobs && \
  cmake --install $deps/gtest-build" || exit 1
step configure cmake -S . -B build-device -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP8KIT_CUDA=ON \
  -DFP8KIT_CUDA_ARCHITECTURES="${FP8KIT_DEVICE_ARCHS:-90-real}" \
  -DFP8KIT_BUILD_TOOLS=ON -DFP8KIT_PYTHON=OFF -DFP8KIT_MPI=OFF -DFP8KIT_BUILD_TESTS=ON \
  -DCMAKE_PREFIX_PATH="$prefix;$PWD/$deps/json;$PWD/$deps/cli11;$PWD/$deps/fmt;$PWD/$deps/nccl" || exit 1
step build cmake --build build-device -j "$jobs" --target test_tensor test_format test_scaling test_ops \
  test_nccl test_exhaustive fp8kit_cli || exit 1
log=
export OMP_WAIT_POLICY=passive
# Every tensor test (the CUDA ones must run, not skip), the codec's, then the exhaustive CUDA cast check.
# The suites that need a device must have run, not skipped: a device was seen.
must_run() {  # must_run JSON SUITE
  python3 - "$1" "$2" <<'PY' || status=1
import json, sys
tests = [t for s in json.load(open(sys.argv[1]))["testsuites"] for t in s["testsuite"]]
skipped = [t["name"] for t in tests if t.get("result") == "SKIPPED" and t.get("classname") == sys.argv[2]]
ran = [t["name"] for t in tests if t.get("result") == "COMPLETED" and t.get("classname") == sys.argv[2]]
print(f"   {sys.argv[2]}: {len(ran)} ran, {len(skipped)} skipped {skipped}")
sys.exit(1 if skipped or not ran else 0)
PY
}
step test_tensor build-device/tests/test_tensor --gtest_output=json:"$results/test_tensor.json"
must_run "$results/test_tensor.json" CudaTensor
must_run "$results/test_tensor.json" CudaStream
step test_scaling build-device/tests/test_scaling --gtest_filter='CudaAmax*:CudaQuantize*:CudaRecipe*:Quantize*:Amax*:Recipe*:Delayed*' \
  --gtest_output=json:"$results/test_scaling.json"
must_run "$results/test_scaling.json" CudaAmax
must_run "$results/test_scaling.json" CudaQuantize
must_run "$results/test_scaling.json" CudaRecipe
# cuBLASLt and NCCL are loaded at run time (dlopen): where the loader does not know them, PyTorch's wheels have them.
for lib in libcublasLt.so libnccl.so; do
  if ! ldconfig -p 2>/dev/null | grep -q "$lib\\."; then
    found="$(find /usr/local /usr/lib /opt "$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)" \
             -name "$lib.*" 2>/dev/null | head -n 1)"
    [ -n "$found" ] && export LD_LIBRARY_PATH="$(dirname "$found")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "   $lib: ${found:-not found}" | tee -a "$out/machine.log"
  fi
done
step test_ops build-device/tests/test_ops --gtest_filter='CudaScaledMm*:ScaledMm.*' \
  --gtest_output=json:"$results/test_ops.json"
must_run "$results/test_ops.json" CudaScaledMm
step test_nccl build-device/tests/test_nccl --gtest_output=json:"$results/test_nccl.json"
must_run "$results/test_nccl.json" CudaNccl
log=test_tensor  # the codec's tests with the tensor tests' log: 8 files come back
step test_format build-device/tests/test_format --gtest_filter='Codec.*'
log=
step exhaustive build-device/tests/test_exhaustive --gtest_filter='Exhaustive.EveryFloat32InputOnCuda'
if grep -q '^\[  SKIPPED \]' "$out/exhaustive.log"; then
  echo "   the exhaustive CUDA check skipped: no device was seen"
  status=1
fi
# The benchmarks after every correctness check (a run cut short by its time limit still has those), all in
# bench.log: casts, amax, quantize and dequantize against device-to-device memcpy, cuda::scaled_mm against direct
# cuBLASLt FP8 and bf16 calls (the issue's figures: >= 0.8x memcpy; >= 0.95x direct, >= 1.6x bf16 at 8192^3).
log=bench
step convert build-device/tools/fp8kit/fp8kit bench convert --device cuda
step scaling build-device/tools/fp8kit/fp8kit bench scaling --device cuda
step gemm build-device/tools/fp8kit/fp8kit bench gemm --device cuda
log=
# Last, once every GPU result is in: the CPU kernels on two of the host's cores (taskset) against OpenBLAS and oneDNN,
# into bench.log, from a CPU-only build of the CLI of its own (linked with the carried oneDNN, so that nothing above
# depends on it); `fp8kit info` first (the CPU, its features, the level in force). Their result does not change the
# check's: the GPU's is what passes or fails. FP8KIT_DEVICE_CPU=0 leaves them out (a rerun of the GPU part alone).
cpu_lib="$PWD/$deps/cpu/lib"
if [ "${FP8KIT_DEVICE_CPU:-1}" != 0 ] && [ -d "$cpu_lib" ] && command -v taskset >/dev/null; then
  gpu_status=$status
  log=bench
  for packed in "$cpu_lib"/*.xz; do  # (Python's lzma: the machine may have no xz)
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$packed" "${packed%.xz}"
  done
  ln -sf libdnnl.so.2 "$cpu_lib/libdnnl.so"
  cpu() {
    taskset -c 0,1 env LD_LIBRARY_PATH="$cpu_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" build-cpu/tools/fp8kit/fp8kit "$@"
  }
  step cpu_configure cmake -S . -B build-cpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DFP8KIT_CUDA=OFF \
    -DFP8KIT_BUILD_TOOLS=ON -DFP8KIT_PYTHON=OFF -DFP8KIT_MPI=OFF -DFP8KIT_BUILD_TESTS=OFF \
    -DCMAKE_PREFIX_PATH="$PWD/$deps/json;$PWD/$deps/cli11;$PWD/$deps/fmt;$PWD/$deps/cpu" &&
    step cpu_build cmake --build build-cpu -j "$jobs" --target fp8kit_cli &&
    step cpu_info cpu info &&
    step cpu_gemm cpu bench gemm &&
    step cpu_convert cpu bench convert &&
    step cpu_scaling cpu bench scaling
  [ $status -eq $gpu_status ] || echo "   the CPU benchmarks failed (bench.log); the GPU check's result stands"
  status=$gpu_status
  log=
fi
echo "device-check: $([ $status -eq 0 ] && echo passed || echo FAILED); logs in $out"
exit $status
