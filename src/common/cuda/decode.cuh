// The decode of FP8 codes on the device (device code, included by .cu files only): the cast from FP8 (cast.cu) and
// the per-tensor dequantize (quantize.cu) are the same kernel, one taking its scale as a value from the host, the
// other from device memory (a scale a kernel computed: no host sync).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/cuda/kernel_util.cuh"
#include "fp8kit/format/codec_inline.hpp"

namespace fp8kit::cuda_detail {

// The scale of a decode: a value, or a float in device memory read by each CUDA block once.
struct ScaleValue {
  float value;
  __device__ float operator()() const { return value; }
};
struct ScaleAt {
  const float* at;
  __device__ float operator()() const { return *at; }
};

// A result's bits: float32 or a 16-bit float.
template <typename T>
using BitsOf = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;

// The codes of one 16-byte store of results: four (one 32-bit load) for float32, eight (64 bits) for 16-bit floats.
template <typename T>
using CodesOf = std::conditional_t<sizeof(T) == 4, std::uint32_t, uint2>;

// The 256 results of a decode with `scale_inv` (the codec's decode of each code, times scale_inv, rounded to T once)
// as T's bits, into a shared table, by the CUDA block's threads (the caller synchronizes before reading it).
template <Format F, typename T>
__device__ inline void fill_results(BitsOf<T>* table, float scale_inv) {
  for (int c = static_cast<int>(threadIdx.x); c < 256; c += static_cast<int>(blockDim.x)) {
    constexpr FormatDescriptor d = descriptor(F);
    T value;
    narrow(scaled(codec_detail::decode_code(d, static_cast<std::uint8_t>(c)), scale_inv), &value);
    BitsOf<T> bits;
    memcpy(&bits, &value, sizeof(bits));
    table[c] = bits;
  }
}

// The decode: for one launch a result depends on its code alone (the codec's decode, times scale_inv, rounded to T
// once), so each CUDA block first reads the scale and fills a shared-memory table of the 256 results, and then looks
// its codes up: where the codes and the output are aligned to their sizes, each group of codes (4 for float32, 8 for
// 16-bit results) yields one 16-byte store, consecutive threads storing consecutive 16 bytes; one code a thread
// elsewhere. (Sixteen codes a thread, stored as four 16-byte vectors with the warp's lanes 64 bytes apart, measured
// 0.45x of memcpy for float32 results on the H200.)
template <Format F, typename T, typename Scale>
__global__ void decode_kernel(const std::uint8_t* in, T* out, std::int64_t n, bool vectors, Scale scale) {
  using Bits = BitsOf<T>;
  using Codes = CodesOf<T>;
  constexpr int kElems = 16 / static_cast<int>(sizeof(T));
  __shared__ Bits table[256];
  fill_results<F, T>(table, scale());
  __syncthreads();
  const auto look_up = [&](std::uint32_t codes, std::uint32_t* words) {  // four codes, 16 bytes of results
    if constexpr (sizeof(Bits) == 4) {
#pragma unroll
      for (int j = 0; j < 4; ++j) words[j] = table[(codes >> (8 * j)) & 0xFFu];
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        words[j] = static_cast<std::uint32_t>(table[(codes >> (16 * j)) & 0xFFu]) |
                   static_cast<std::uint32_t>(table[(codes >> (16 * j + 8)) & 0xFFu]) << 16;
      }
    }
  };
  grid_stride<kElems>(
      n, vectors, [&](std::int64_t i) { return *reinterpret_cast<const Codes*>(in + i); },
      [&](std::int64_t i, const Codes& c) {
        std::uint32_t words[4];
        if constexpr (sizeof(Bits) == 4) {
          look_up(c, words);
        } else {
          look_up(c.x, words);
          look_up(c.y, words + 2);
        }
        *reinterpret_cast<uint4*>(out + i) = make_uint4(words[0], words[1], words[2], words[3]);
      },
      [&](std::int64_t i) {
        const Bits bits = table[in[i]];
        memcpy(out + i, &bits, sizeof(Bits));
      });
}

// decode_kernel over in[0, n) to out on `stream` (n > 0), its format chosen at run time.
template <typename T, typename Scale>
void launch_decode(const std::uint8_t* in, Format format, T* out, std::int64_t n, Scale scale, cudaStream_t stream) {
  constexpr int kElems = 16 / static_cast<int>(sizeof(T));
  const bool vectors = reinterpret_cast<std::uintptr_t>(in) % kElems == 0 && vector_aligned<kElems>(out);
  with_format(format, [&]<Format F>() {
    decode_kernel<F, T><<<blocks_for_vectors<kElems>(n, vectors), kThreads, 0, stream>>>(in, out, n, vectors, scale);
  });
}

}  // namespace fp8kit::cuda_detail
