// The per-tensor kernels that quantize.cu and recipe.cu share (device code, included by .cu files only): the finite
// amax of a tensor into one device word, a group's maximum, and the encode that reads its scale from device memory
// (so that the scale can come from a kernel: no host sync between the amax and the cast).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/cuda/kernel_util.cuh"
#include "fp8kit/format/codec_inline.hpp"

namespace fp8kit::cuda_detail {

// |v| as float bits when v is finite, else 0 (non-negative floats order as their unsigned bits).
__device__ inline unsigned finite_magnitude(float v) {
  const unsigned bits = __float_as_uint(v) & 0x7FFFFFFFu;
  return bits < 0x7F800000u ? bits : 0u;
}

// The largest finite_magnitude of a group of elements: one float maximum of |x| an element (NaN drops out of
// fmaxf), the elements looked at again only where an Inf came out. (At the H200's 4.2 TB/s every instruction an
// element counts: memcpy's rate leaves some 40 a float32 element, fewer where they are integer ones.)
template <typename T, int N>
__device__ inline unsigned finite_magnitude(const Elems<T, N>& v) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < N; ++j) m = fmaxf(m, fabsf(widen(v.e[j])));
  if (__float_as_uint(m) != 0x7F800000u) return __float_as_uint(m);
  unsigned finite = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) finite = max(finite, finite_magnitude(widen(v.e[j])));
  return finite;
}

// The largest |x| of a group as float bits, NaN and Inf included (0x7F800000 an Inf, above it a NaN): one integer
// maximum an element, so that one comparison of the result tells whether the whole group is finite (amax.cu's
// counting pass and amax_bits_pass look at the elements one by one only where it is not).
template <typename T, int N>
__device__ inline unsigned magnitude_bits(const Elems<T, N>& v) {
  unsigned bits = 0;
#pragma unroll
  for (int j = 0; j < N; ++j) bits = max(bits, __float_as_uint(widen(v.e[j])) & 0x7FFFFFFFu);
  return bits;
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
// or an Inf (when nonfinite is not null); and also(i, group) for each 16-byte group the pass loads (a Vec16<T> at
// element i: where `vectors`) and also(i, element) for each element it loads alone, so that a kernel can do more
// with what it read in the same pass.
template <typename T, typename Also>
__device__ void amax_bits_pass(const T* x, std::int64_t n, bool vectors, unsigned* result, unsigned* nonfinite,
                               Also&& also) {
  __shared__ unsigned warp_max[kThreads / 32];
  unsigned m = 0;
  bool bad = false;
  const auto see = [&](float v) {
    m = max(m, finite_magnitude(v));
    bad |= (__float_as_uint(v) & 0x7FFFFFFFu) >= 0x7F800000u;
  };
  constexpr int kElems = Vec16<T>::kElems;
  grid_stride<kElems>(
      n, vectors, [&](std::int64_t i) { return *reinterpret_cast<const Vec16<T>*>(x + i); },
      [&](std::int64_t i, const Vec16<T>& v) {
        const unsigned bits = magnitude_bits(v);
        if (bits < 0x7F800000u) {
          m = max(m, bits);
        } else {
#pragma unroll
          for (int j = 0; j < kElems; ++j) see(widen(v.e[j]));
        }
        also(i, v);
      },
      [&](std::int64_t i) {
        const T v = x[i];
        see(widen(v));
        also(i, v);
      });
  m = group_max<kThreads>(m, warp_max);
  if (threadIdx.x == 0) atomicMax(result, m);
  if (nonfinite != nullptr && __any_sync(0xFFFFFFFFu, bad) && threadIdx.x % 32 == 0) atomicOr(nonfinite, 1u);
}

// amax_bits_pass alone. 16 bytes a load where `vectors` (launch_amax_bits).
template <typename T>
__global__ void amax_bits_kernel(const T* x, std::int64_t n, bool vectors, unsigned* result, unsigned* nonfinite) {
  amax_bits_pass(x, n, vectors, result, nonfinite, [](std::int64_t, const auto&) {});
}

// codes[i] = encode(x * scale) for a 16-byte group of x at element i (Vec16<T>) or for one element, as the CPU
// encodes (the multiplier applied as the CPU applies it).
template <Format F, typename T, typename V>
__device__ inline void encode_at(std::int64_t i, const V& v, float scale, const EncodeSpec& encode,
                                 std::uint8_t* codes) {
  if constexpr (std::is_same_v<V, T>) {
    codes[i] = encode_value<F>(scaled(widen(v), scale), encode, 0u);
  } else {
    static_assert(std::is_same_v<V, Vec16<T>>, "a 16-byte group or one element");
    constexpr int kElems = Vec16<T>::kElems;
    std::uint32_t words[kElems / 4];
    encode_group<F>(v, scale, encode, 0, 0, words);
    store_codes<kElems>(codes + i, words);
  }
}

// codes = encode(x * *multiplier) (the multiplier read from device memory). 16 bytes of x a load where `vectors`
// (launch_encode_tensor). Where `skip` is not null and *skip is not zero it returns at once (the codes were written
// by an earlier pass).
template <Format F, typename T>
__global__ void encode_tensor_kernel(const T* x, std::int64_t n, bool vectors, const float* multiplier,
                                     EncodeSpec encode, std::uint8_t* codes, const int* skip) {
  if (skip != nullptr && *skip != 0) return;
  constexpr int kElems = Vec16<T>::kElems;
  const float scale = *multiplier;
  grid_stride<kElems>(
      n, vectors, [&](std::int64_t i) { return *reinterpret_cast<const Vec16<T>*>(x + i); },
      [&](std::int64_t i, const Vec16<T>& v) { encode_at<F, T>(i, v, scale, encode, codes); },
      [&](std::int64_t i) { encode_at<F, T>(i, x[i], scale, encode, codes); });
}

// Whether the kernels above take x 16 bytes at a time: x aligned to 16 and the codes (when there are any) to their
// group's size.
template <typename T>
inline bool tensor_vectors(const T* x, const std::uint8_t* codes) {
  constexpr int kElems = Vec16<T>::kElems;
  return vector_aligned<kElems>(x) && reinterpret_cast<std::uintptr_t>(codes) % kElems == 0;
}

// The two kernels above over x[0, n) on `stream` (n > 0).
template <typename T>
void launch_amax_bits(const T* x, std::int64_t n, unsigned* result, unsigned* nonfinite, cudaStream_t stream) {
  const bool vectors = tensor_vectors<T>(x, nullptr);
  amax_bits_kernel<<<blocks_for_vectors<Vec16<T>::kElems>(n, vectors, 4096), kThreads, 0, stream>>>(x, n, vectors,
                                                                                                    result, nonfinite);
}
template <Format F, typename T>
void launch_encode_tensor(const T* x, std::int64_t n, const float* multiplier, EncodeSpec encode, std::uint8_t* codes,
                          cudaStream_t stream, const int* skip = nullptr) {
  const bool vectors = tensor_vectors(x, codes);
  encode_tensor_kernel<F><<<blocks_for_vectors<Vec16<T>::kElems>(n, vectors), kThreads, 0, stream>>>(
      x, n, vectors, multiplier, encode, codes, skip);
}

}  // namespace fp8kit::cuda_detail
