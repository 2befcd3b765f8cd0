#!/usr/bin/env bash
# The README's second command (and CI's): installs what is missing, builds, and runs the whole test suite:
# unit tests, all 2^32 float32 inputs per format and policy, ml_dtypes agreement, and the CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
fp8kit_install_deps
fp8kit_build build
ctest --test-dir build --output-on-failure --timeout 1500 -j "$(nproc)"
