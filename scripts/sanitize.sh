#!/usr/bin/env bash
# The sanitizer half of the test suite (scripts/test.sh runs it after the main build's tests): builds build-asan
# with Clang 14, AddressSanitizer and UndefinedBehaviorSanitizer (every finding fatal) and the libFuzzer harnesses,
# runs the unit tests there (ctest label `unit`: not the exhaustive 2^32-input tests, which the main build runs),
# then replays the fuzzers' corpus and fuzzes each harness for FP8KIT_FUZZ_SECONDS (default 15) seconds. CPU code
# only (FP8KIT_CUDA=OFF): the main build compiles and tests the CUDA backend; here the leak check and the build time
# stay on fp8kit's own code, without NVIDIA's static runtime linked into every test and fuzzer.
#   scripts/sanitize.sh [--build-only]
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
case "${1:-}" in
  "") ;;
  --build-only) build_only=1 ;;
  *)
    echo "scripts/sanitize.sh: unknown option '$1' (use --build-only to build without running, or no option)" >&2
    exit 2
    ;;
esac
source scripts/deps.sh
fp8kit_install_deps
# Line tables are all the reports need (file and line of every frame): full debug information made the build a fifth
# slower (convert_avx512.cpp: 72 s against 57 s) for nothing a report prints.
cmake -S . -B build-asan -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only -DNDEBUG" \
  -DFP8KIT_SANITIZE=address,undefined -DFP8KIT_BUILD_FUZZERS=ON -DFP8KIT_BUILD_TOOLS=OFF -DFP8KIT_MPI=OFF -DFP8KIT_PYTHON=OFF -DFP8KIT_CUDA=OFF \
  -DFP8KIT_BUILD_TESTS=ON >/dev/null
cmake --build build-asan -j "$(nproc)"
[ $build_only -eq 1 ] && exit 0
# Leaks are findings too; a report names the file and line (llvm-symbolizer), and any UBSan finding stops the test.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-14 || command -v llvm-symbolizer || true)}"
# All of it but the training tests that repeat whole runs the others already make (each a minute or more under the
# sanitizers; the main build runs them): the goldens' scalar level (the avx2 and avx512 levels run the same trainer
# code here and must give the same bits), resuming under every recipe (resumes run for the cnn, with skipped steps
# and against every refusal), two identical runs per recipe, and the two learning tests (25 GPT steps, the CNN to
# a loss: what they check is convergence, and their steps are the others' steps). The sanitizer half stays near
# 10 minutes of CI.
ctest --test-dir build-asan --output-on-failure --timeout 900 -j "$(nproc)" --label-regex '^unit$' \
  --exclude-regex 'TrainGolden.*/scalar|TrainCheckpoint.ResumeIsBitIdenticalForEveryRecipe|Train.SameSeedAndRecipeGiveBitIdenticalLosses|Train.LossGoesDown|Cnn.LearnsUnderFp32'
scripts/fuzz.sh build-asan "${FP8KIT_FUZZ_SECONDS:-15}"
