#!/usr/bin/env bash
# The README's first command: installs what is missing, builds fp8kit in Release, and runs the main job on its
# embedded default (the article's FP8 format table and scalar precision experiment).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
fp8kit_install_deps
fp8kit_build build
echo
./build/tools/fp8kit/fp8kit formats
echo
./build/tools/fp8kit/fp8kit cast 1.0 1.5 1.25 1.125 1.1 0.1 448 449 0.015625 0.0001
