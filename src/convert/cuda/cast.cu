// CUDA casts between float32 / bfloat16 / float16 and the five FP8 formats, each through the scalar codec the CPU
// uses (format/codec_inline.hpp, compiled for the device), with the format a template constant so that the
// descriptor folds. Where the pointers are aligned a thread takes 16 bytes of input (the encode) or writes 16 bytes
// of results (the decode, through a per-block table of the 256 results), kBatch of them loaded at a time; the rest
// goes one element a thread (grid-stride).
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
      n, vectors, [&](std::int64_t i) { return *reinterpret_cast<const Vec16<T>*>(in + i); },
      [&](std::int64_t i, const Vec16<T>& v) {
        std::uint32_t words[kElems / 4];
        encode_group<F>(v, scale, spec, seed, offset + static_cast<std::uint64_t>(i), words);
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

// The codes of one 16-byte store of results: four (one 32-bit load) for float32, eight (64 bits) for 16-bit floats.
template <typename T>
using CodesOf = std::conditional_t<sizeof(T) == 4, std::uint32_t, uint2>;

// The decode: for one launch a result depends on its code alone (the codec's decode, times scale_inv, rounded to T
// once), so each block first fills a shared-memory table of the 256 results, and then looks its codes up: where
// the codes and the output are aligned to their sizes, each group of codes (4 for float32, 8 for 16-bit results)
// yields one 16-byte store, consecutive threads storing consecutive 16 bytes; one code a thread elsewhere. (Sixteen
// codes a thread, stored as four 16-byte vectors with the warp's lanes 64 bytes apart, measured 0.45x of memcpy for
// float32 results on the H200.)
template <Format F, typename T>
__global__ void decode_kernel(const std::uint8_t* in, T* out, std::int64_t n, bool vectors, float scale_inv) {
  using Bits = BitsOf<T>;
  using Codes = CodesOf<T>;
  constexpr int kElems = 16 / static_cast<int>(sizeof(T));
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

template <typename T>
void launch_to_fp8(const T* in, std::uint8_t* out, std::int64_t n, const CastOptions& options, int device) {
  use_device(device);
  if (n == 0) return;
  constexpr int kElems = Vec16<T>::kElems;
  const EncodeSpec spec{options.format, options.overflow, options.rounding};
  const bool vectors = vector_aligned<kElems>(in) && vector_aligned<kElems>(out);
  with_format(options.format, [&]<Format F>() {
    encode_kernel<F><<<blocks_for_vectors<kElems>(n, vectors), kThreads, 0, stream_of(device)>>>(
        in, out, n, vectors, options.scale, spec, options.seed, options.stream_offset);
  });
  check_launch("the cast to FP8", device);
}

template <typename T>
void launch_from_fp8(const std::uint8_t* in, Format format, T* out, std::int64_t n, float scale_inv, int device) {
  use_device(device);
  if (n == 0) return;
  constexpr int kElems = 16 / static_cast<int>(sizeof(T));
  const bool vectors = reinterpret_cast<std::uintptr_t>(in) % kElems == 0 && vector_aligned<kElems>(out);
  with_format(format, [&]<Format F>() {
    decode_kernel<F, T>
        <<<blocks_for_vectors<kElems>(n, vectors), kThreads, 0, stream_of(device)>>>(in, out, n, vectors, scale_inv);
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
