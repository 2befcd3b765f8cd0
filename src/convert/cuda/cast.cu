// CUDA casts between float32 / bfloat16 / float16 and the five FP8 formats, each through the scalar codec the CPU
// uses (format/codec_inline.hpp, compiled for the device), with the format a template constant so that the
// descriptor folds. Where the pointers are aligned a thread takes 16 bytes of input (the encode) or 16 codes (the
// decode, through a per-block table of the 256 results); the rest goes one element a thread (grid-stride).
// Stochastic rounding draws stochastic_bits(seed, offset + i), the counter-based bits of the CPU kernels, so both
// give the same codes for the same seed.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/cuda/kernel_util.cuh"
#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/cuda_convert.hpp"
#include "fp8kit/format/codec_inline.hpp"

namespace fp8kit {
namespace {

using namespace cuda_detail;

template <Format F, typename T>
__global__ void encode_kernel(const T* in, std::uint8_t* out, std::int64_t n, float scale, EncodeSpec spec,
                              std::uint64_t seed, std::uint64_t offset) {
  constexpr FormatDescriptor d = descriptor(F);
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::uint32_t bits =
        spec.rounding == Rounding::kStochastic ? stochastic_bits(seed, offset + static_cast<std::uint64_t>(i)) : 0u;
    const float x = scaled(widen(in[i]), scale);
    out[i] = encode_value<F>(x, spec, bits);
  }
}

// 16 bytes of input a thread (four float32 or eight 16-bit elements): one vector load and one store of the codes
// (4 or 8 bytes), for inputs aligned to 16 bytes and outputs aligned to the codes' size (the scalar kernel takes
// the rest). The H200 measured the float32 cast at 0.90x device-to-device memcpy this way; 8-byte loads of 16-bit
// inputs (four elements) left the bfloat16 cast at 0.59x.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kElems = 16 / static_cast<int>(sizeof(T));
  T e[kElems];
};
template <int kElems>
using CodesOf = std::conditional_t<kElems == 4, std::uint32_t, uint2>;

template <Format F, typename T>
__global__ void encode16_kernel(const Vec16<T>* in, CodesOf<Vec16<T>::kElems>* out, std::int64_t nv, float scale,
                                EncodeSpec spec, std::uint64_t seed, std::uint64_t offset) {
  constexpr int kElems = Vec16<T>::kElems;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < nv; i += stride) {
    const Vec16<T> v = in[i];
    std::uint32_t packed[2] = {0u, 0u};
#pragma unroll
    for (int j = 0; j < kElems; ++j) {
      const std::uint32_t bits = spec.rounding == Rounding::kStochastic
                                     ? stochastic_bits(seed, offset + static_cast<std::uint64_t>(kElems * i + j))
                                     : 0u;
      packed[j / 4] |= static_cast<std::uint32_t>(encode_value<F>(scaled(widen(v.e[j]), scale), spec, bits))
                       << (8 * (j % 4));
    }
    if constexpr (kElems == 4) {
      out[i] = packed[0];
    } else {
      out[i] = make_uint2(packed[0], packed[1]);
    }
  }
}

template <Format F, typename T>
__global__ void decode_kernel(const std::uint8_t* in, T* out, std::int64_t n, float scale_inv) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    constexpr FormatDescriptor d = descriptor(F);
    narrow(scaled(codec_detail::decode_code(d, in[i]), scale_inv), out + i);
  }
}

// A result's bits: float32 or a 16-bit float.
template <typename T>
using BitsOf = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;

// Sixteen codes a thread: one 16-byte load, each code looked up in a table of the 256 results, and 16 * sizeof(T)
// bytes stored as 16-byte vectors, for codes aligned to 16 bytes and outputs to 16 (the scalar kernel takes the
// rest). For one launch a result depends on its code alone (the codec's decode, times scale_inv, rounded to T once),
// so each block first fills the table in shared memory with exactly what decode_kernel computes per element.
template <Format F, typename T>
__global__ void decode16_kernel(const uint4* in, uint4* out, std::int64_t n16, float scale_inv) {
  using Bits = BitsOf<T>;
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(Bits));  // results in one 32-bit word of the output
  constexpr int kStores = 16 * static_cast<int>(sizeof(Bits)) / 16;
  __shared__ Bits table[256];
  for (int c = static_cast<int>(threadIdx.x); c < 256; c += static_cast<int>(blockDim.x)) {
    constexpr FormatDescriptor d = descriptor(F);
    T value;
    narrow(scaled(codec_detail::decode_code(d, static_cast<std::uint8_t>(c)), scale_inv), &value);
    Bits bits;
    memcpy(&bits, &value, sizeof(Bits));
    table[c] = bits;
  }
  __syncthreads();
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n16; i += stride) {
    const uint4 v = in[i];
    const std::uint32_t code_words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int q = 0; q < kStores; ++q) {
      std::uint32_t words[4];
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        std::uint32_t word = 0;
#pragma unroll
        for (int p = 0; p < kPerWord; ++p) {
          const int j = (4 * q + t) * kPerWord + p;  // the code's index among the sixteen
          const std::uint32_t code = (code_words[j / 4] >> (8 * (j % 4))) & 0xFFu;
          word |= static_cast<std::uint32_t>(table[code]) << (8 * sizeof(Bits) * p);
        }
        words[t] = word;
      }
      out[i * kStores + q] = make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
}

template <typename T>
void launch_to_fp8(const T* in, std::uint8_t* out, std::int64_t n, const CastOptions& options, int device) {
  use_device(device);
  if (n == 0) return;
  using V = Vec16<T>;
  using Codes = CodesOf<V::kElems>;
  const EncodeSpec spec{options.format, options.overflow, options.rounding};
  const bool aligned = reinterpret_cast<std::uintptr_t>(in) % sizeof(V) == 0 &&
                       reinterpret_cast<std::uintptr_t>(out) % sizeof(Codes) == 0;
  const std::int64_t nv = aligned ? n / V::kElems : 0;
  const std::int64_t done = nv * V::kElems;
  const cudaStream_t stream = stream_of(device);
  with_format(options.format, [&]<Format F>() {
    if (nv > 0) {
      encode16_kernel<F><<<blocks_for(nv), kThreads, 0, stream>>>(reinterpret_cast<const V*>(in),
                                                                  reinterpret_cast<Codes*>(out), nv, options.scale,
                                                                  spec, options.seed, options.stream_offset);
    }
    if (n > done) {
      encode_kernel<F><<<blocks_for(n - done), kThreads, 0, stream>>>(
          in + done, out + done, n - done, options.scale, spec, options.seed,
          options.stream_offset + static_cast<std::uint64_t>(done));
    }
  });
  check_launch("the cast to FP8", device);
}

template <typename T>
void launch_from_fp8(const std::uint8_t* in, Format format, T* out, std::int64_t n, float scale_inv, int device) {
  use_device(device);
  if (n == 0) return;
  const bool aligned =
      reinterpret_cast<std::uintptr_t>(in) % 16 == 0 && reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
  const std::int64_t n16 = aligned ? n / 16 : 0;
  const std::int64_t done = 16 * n16;
  const cudaStream_t stream = stream_of(device);
  with_format(format, [&]<Format F>() {
    if (n16 > 0) {
      decode16_kernel<F, T><<<blocks_for(n16), kThreads, 0, stream>>>(reinterpret_cast<const uint4*>(in),
                                                                      reinterpret_cast<uint4*>(out), n16, scale_inv);
    }
    if (n > done) {
      decode_kernel<F><<<blocks_for(n - done), kThreads, 0, stream>>>(in + done, out + done, n - done, scale_inv);
    }
  });
  check_launch("the cast from FP8", device);
}

}  // namespace

namespace cuda {

void cast_to_fp8(const float* in, std::uint8_t* out, std::int64_t n, const CastOptions& options, int device) {
  launch_to_fp8(in, out, n, options, device);
}
void cast_to_fp8(const bfloat16* in, std::uint8_t* out, std::int64_t n, const CastOptions& options, int device) {
  launch_to_fp8(in, out, n, options, device);
}
void cast_to_fp8(const float16* in, std::uint8_t* out, std::int64_t n, const CastOptions& options, int device) {
  launch_to_fp8(in, out, n, options, device);
}
void cast_from_fp8(const std::uint8_t* in, Format format, float* out, std::int64_t n, float scale_inv, int device) {
  launch_from_fp8(in, format, out, n, scale_inv, device);
}
void cast_from_fp8(const std::uint8_t* in, Format format, bfloat16* out, std::int64_t n, float scale_inv, int device) {
  launch_from_fp8(in, format, out, n, scale_inv, device);
}
void cast_from_fp8(const std::uint8_t* in, Format format, float16* out, std::int64_t n, float scale_inv, int device) {
  launch_from_fp8(in, format, out, n, scale_inv, device);
}

}  // namespace cuda
}  // namespace fp8kit
