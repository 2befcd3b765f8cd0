#!/usr/bin/env bash
# Installs the built fp8kit into a temporary prefix and builds a consumer with find_package(fp8kit): the CMake
# package works from outside the tree. Usage: check_package.sh BUILD_DIR
set -euo pipefail
build_dir="$1"
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
mkdir -p "$work/consumer"
cp "$here/consumer.cpp" "$work/consumer/main.cpp"
cat > "$work/consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(consumer CXX)
find_package(fp8kit CONFIG REQUIRED)
add_executable(consumer main.cpp)
target_link_libraries(consumer PRIVATE fp8kit::fp8kit)
CMAKE
cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/consumer/build" >/dev/null
out="$("$work/consumer/build/consumer")"
echo "$out"
[ "$out" = "448 tensor([1.0000, 1.5000, 1.2500], dtype=float8_e4m3fn)" ]
