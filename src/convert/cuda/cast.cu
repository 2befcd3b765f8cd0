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

// The encode: 16 bytes of input a thread (four float32 or eight 16-bit elements, one store of their codes) where
// the input is aligned to 16 bytes and the output to the codes' size, one element a thread elsewhere.
template <Format F, typename T>
__global__ void encode_kernel(const T* in, std::uint8_t* out, std::int64_t n, bool vectors, float scale,
                              EncodeSpec spec, std::uint64_t seed, std::uint64_t offset) {
  constexpr int kElems = Vec16<T>::kElems;
  grid_stride<kElems>(
      n, vectors,
      [&](std::int64_t i) {
        std::uint32_t words[kElems / 4];
        encode_group<F>(*reinterpret_cast<const Vec16<T>*>(in + i), scale, spec, seed,
                        offset + static_cast<std::uint64_t>(i), words);
        store_codes<kElems>(out + i, words);
      },
      [&](std::int64_t i) {
        const std::uint32_t bits =
            spec.rounding == Rounding::kStochastic ? stochastic_bits(seed, offset + static_cast<std::uint64_t>(i)) : 0u;
        out[i] = encode_value<F>(scaled(widen(in[i]), scale), spec, bits);
      });
}

// A result's bits: float32 or a 16-bit float.
template <typename T>
using BitsOf = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;

// The decode: for one launch a result depends on its code alone (the codec's decode, times scale_inv, rounded to T
// once), so each block first fills a shared-memory table of the 256 results, and then looks its codes up: sixteen
// a thread (one 16-byte load, 16 * sizeof(T) bytes stored as 16-byte vectors) where the codes and the output are
// aligned to 16 bytes, one a thread elsewhere.
template <Format F, typename T>
__global__ void decode_kernel(const std::uint8_t* in, T* out, std::int64_t n, bool vectors, float scale_inv) {
  using Bits = BitsOf<T>;
  constexpr int kPerWord = 4 / static_cast<int>(sizeof(Bits));  // results in one 32-bit word of the output
  constexpr int kStores = static_cast<int>(sizeof(Bits));       // 16-byte stores for 16 results
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
  grid_stride<16>(
      n, vectors,
      [&](std::int64_t i) {
        const uint4 v = *reinterpret_cast<const uint4*>(in + i);
        const std::uint32_t code_words[4] = {v.x, v.y, v.z, v.w};
        auto* dst = reinterpret_cast<uint4*>(out + i);
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
          dst[q] = make_uint4(words[0], words[1], words[2], words[3]);
        }
      },
      [&](std::int64_t i) {
        const Bits bits = table[in[i]];
        memcpy(out + i, &bits, sizeof(Bits));
      });
}

template <typename T>
void launch_to_fp8(const T* in, std::uint8_t* out, std::int64_t n, const CastOptions& options, int device) {
  use_device(device);
  if (n == 0) return;
  constexpr int kElems = Vec16<T>::kElems;
  const EncodeSpec spec{options.format, options.overflow, options.rounding};
  const bool vectors = vector_aligned<kElems>(in) && vector_aligned<kElems>(out);
  with_format(options.format, [&]<Format F>() {
    encode_kernel<F><<<blocks_for_vectors<kElems>(n), kThreads, 0, stream_of(device)>>>(
        in, out, n, vectors, options.scale, spec, options.seed, options.stream_offset);
  });
  check_launch("the cast to FP8", device);
}

template <typename T>
void launch_from_fp8(const std::uint8_t* in, Format format, T* out, std::int64_t n, float scale_inv, int device) {
  use_device(device);
  if (n == 0) return;
  const bool vectors = vector_aligned<16>(in) && reinterpret_cast<std::uintptr_t>(out) % 16 == 0;
  with_format(format, [&]<Format F>() {
    decode_kernel<F, T><<<blocks_for_vectors<16>(n), kThreads, 0, stream_of(device)>>>(in, out, n, vectors, scale_inv);
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
