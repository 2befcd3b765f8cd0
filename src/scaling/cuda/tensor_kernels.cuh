// The per-tensor kernels that quantize.cu and recipe.cu share (device code, included by .cu files only): the finite
// amax of a tensor into one device word, a group's maximum, and the encode that reads its scale from device memory
// (so that the scale can come from a kernel: no host sync between the amax and the cast).
#pragma once

#include <cstdint>

#include "common/cuda/kernel_util.cuh"
#include "fp8kit/format/codec_inline.hpp"

namespace fp8kit::cuda_detail {

// |v| as float bits when v is finite, else 0 (non-negative floats order as their unsigned bits).
__device__ inline unsigned finite_magnitude(float v) {
  const unsigned bits = __float_as_uint(v) & 0x7FFFFFFFu;
  return bits < 0x7F800000u ? bits : 0u;
}

// The largest `m` of the GROUP threads of a group (warp shuffles, then the group's warps through shared memory).
template <int GROUP>
__device__ unsigned group_max(unsigned m, unsigned* warp_max) {
  m = __reduce_max_sync(0xFFFFFFFFu, m);
  if constexpr (GROUP > 32) {
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    m = 0;
    for (int w = 0; w < GROUP / 32; ++w) m = max(m, warp_max[w]);
  }
  return m;
}

// The finite amax of x[0, n) merged into *result (atomicMax of float bits); *nonfinite set to 1 when x holds a NaN
// or an Inf (when nonfinite is not null).
template <typename T>
__global__ void amax_bits_kernel(const T* x, std::int64_t n, unsigned* result, unsigned* nonfinite) {
  __shared__ unsigned warp_max[kThreads / 32];
  unsigned m = 0;
  bool bad = false;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = widen(x[i]);
    m = max(m, finite_magnitude(v));
    bad |= (__float_as_uint(v) & 0x7FFFFFFFu) >= 0x7F800000u;
  }
  m = group_max<kThreads>(m, warp_max);
  if (threadIdx.x == 0) atomicMax(result, m);
  if (nonfinite != nullptr && __any_sync(0xFFFFFFFFu, bad) && threadIdx.x % 32 == 0) atomicOr(nonfinite, 1u);
}

// codes = encode(x * *multiplier) (the multiplier read from device memory, applied as the CPU applies it).
template <Format F, typename T>
__global__ void encode_tensor_kernel(const T* x, std::int64_t n, const float* multiplier, EncodeSpec encode,
                                     std::uint8_t* codes) {
  constexpr FormatDescriptor d = descriptor(F);
  const float scale = *multiplier;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    codes[i] = encode_value<F>(scaled(widen(x[i]), scale), encode, 0u);
  }
}

}  // namespace fp8kit::cuda_detail
