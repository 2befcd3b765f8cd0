#!/usr/bin/env bash
# The README's second command (and CI's): installs what is missing, builds, and runs the whole test suite:
# unit tests, all 2^32 float32 inputs per format and policy, ml_dtypes agreement, and the CLI; then the sanitizer
# half (scripts/sanitize.sh): the unit tests again under ASan+UBSan (Clang, build-asan/) and every fuzzer for a
# short budget on top of its corpus.
#   --quick   the main build's tests without the exhaustive 2^32-input tests (ctest label `exhaustive`) and without
#             the sanitizer half: the inner loop while working, about 45 seconds on two cores once built.
set -euo pipefail
cd "$(dirname "$0")/.."
ctest_args=()
case "${1:-}" in
  "") ;;
  --quick) ctest_args+=(--label-exclude exhaustive) ;;
  *)
    echo "scripts/test.sh: unknown option '$1' (use --quick to leave out the exhaustive tests, or no option)" >&2
    exit 2
    ;;
esac
source scripts/deps.sh
fp8kit_install_deps
fp8kit_build build
ctest --test-dir build --output-on-failure --timeout 1500 -j "$(nproc)" "${ctest_args[@]}"
[ "${1:-}" = --quick ] || scripts/sanitize.sh
