#!/usr/bin/env bash
# Installs what fp8kit needs on a fresh Debian 12 machine, and nothing that is already there.
# Sourced by setup.sh and test.sh. Debian packages via apt-get, Python packages via pip.
set -euo pipefail

FP8KIT_DEBIAN_PACKAGES=(
  build-essential cmake pkg-config
  libgtest-dev libgmock-dev
  libfmt-dev libcli11-dev nlohmann-json3-dev
  libopenblas0-pthread  # the sgemm/sgemv baselines of `fp8kit bench gemm` (loaded at run time, never linked)
  libdnnl-dev           # oneDNN: the BF16 GEMM baseline of `fp8kit bench gemm` (linked into the benchmark only)
  libopenmpi-dev openmpi-bin  # the dist layer's MPI backend, and mpirun for its tests
  python3
  clang-14 libclang-rt-14-dev libomp-14-dev llvm-14  # the sanitizer build and the fuzzers (scripts/sanitize.sh)
)
# PyPI packages as module:package: numpy, ml_dtypes and safetensors for the tests that compare with them; nanobind
# and scikit-build-core build the Python package (python/), pytest runs its tests.
FP8KIT_PYTHON_PACKAGES=(numpy:numpy ml_dtypes:ml_dtypes safetensors:safetensors nanobind:nanobind
  scikit_build_core:scikit-build-core pytest:pytest)

fp8kit_install_deps() {
  local missing=()
  for p in "${FP8KIT_DEBIAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "fp8kit: installing Debian packages: ${missing[*]}" >&2
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  local py_missing=()
  for p in "${FP8KIT_PYTHON_PACKAGES[@]}"; do
    python3 -c "import ${p%%:*}" 2>/dev/null || py_missing+=("${p##*:}")
  done
  if [ ${#py_missing[@]} -gt 0 ]; then
    echo "fp8kit: installing Python packages: ${py_missing[*]}" >&2
    if ! python3 -m pip --version >/dev/null 2>&1; then
      local sudo=""
      [ "$(id -u)" -ne 0 ] && sudo="sudo"
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
    fi
    python3 -m pip install -q "${py_missing[@]}" 2>/dev/null ||
      python3 -m pip install -q --break-system-packages "${py_missing[@]}"
  fi
}

# Configures and builds fp8kit in Release (tests included) into the given directory.
fp8kit_build() {
  local build_dir="$1"
  cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DFP8KIT_BUILD_TESTS=ON >/dev/null
  cmake --build "$build_dir" -j "$(nproc)"
}

# Installs the fp8kit Python package from this checkout (pip install .: scikit-build-core builds the library and the
# extension in build-python/, kept between runs so that a second install only recompiles what changed).
fp8kit_install_python_package() {
  python3 -m pip install -q --no-build-isolation . 2>/dev/null ||
    python3 -m pip install -q --no-build-isolation --break-system-packages .
}
