// FP8KIT_HD marks the inline functions that host code and CUDA device code share (the scalar codec: one definition
// of every format for the CPU and the GPU). Under nvcc it is __host__ __device__; in host-only builds it is empty.
// (constexpr functions need no mark: the CUDA build compiles device code with --expt-relaxed-constexpr.)
#pragma once

#if defined(__CUDACC__)
#define FP8KIT_HD __host__ __device__
#else
#define FP8KIT_HD
#endif

#include <bit>
#include <cstdint>

namespace fp8kit::hd {

// std::countl_zero and std::bit_width for code shared by host and device. In device code nvcc compiles libstdc++'s
// versions (built on the host-only __builtin_clz*) into a constant: std::countl_zero was 64 for every input on sm_90,
// which broke every device encode (found by the first run on an H200). The device takes the CUDA intrinsics.
constexpr int countl_zero(std::uint64_t x) noexcept {
#if defined(__CUDA_ARCH__)
  return x == 0 ? 64 : __clzll(static_cast<long long>(x));
#else
  return std::countl_zero(x);
#endif
}
constexpr int countl_zero(std::uint32_t x) noexcept {
#if defined(__CUDA_ARCH__)
  return x == 0 ? 32 : __clz(static_cast<int>(x));
#else
  return std::countl_zero(x);
#endif
}
constexpr int bit_width(std::uint32_t x) noexcept {
  return 32 - countl_zero(x);
}

}  // namespace fp8kit::hd
