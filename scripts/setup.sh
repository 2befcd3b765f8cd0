#!/usr/bin/env bash
# The README's first command: installs what is missing, builds fp8kit in Release, installs the Python package
# (`import fp8kit`), and runs the main job on its embedded default: the article's FP32 vs BF16 vs FP8 comparison on a
# small GPT (fp8kit train, 400 steps per recipe, fp8-o2 with FP8 optimizer state and bf16 master weights among them:
# about 2 minutes on a quiet 2-core machine), after the FP8 format table.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
fp8kit_install_deps
fp8kit_build build
fp8kit_install_python_package
echo
./build/tools/fp8kit/fp8kit formats
echo
./build/tools/fp8kit/fp8kit train --compare fp32,bf16,fp8-delayed,fp8-o2
