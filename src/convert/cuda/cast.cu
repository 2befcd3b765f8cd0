// CUDA casts between float32 / bfloat16 / float16 and the five FP8 formats, each through the scalar codec the CPU
// uses (format/codec_inline.hpp, compiled for the device), with the format a template constant so that the
// descriptor folds. Where the pointers are aligned a thread takes 16 bytes of input (the encode) or writes 16 bytes
// of results (the decode, through a per-block table of the 256 results), kBatch of them loaded at a time; the rest
// goes one element a thread (grid-stride). The decode is common/cuda/decode.cuh's (shared with the dequantize).
// Stochastic rounding draws stochastic_bits(seed, offset + i), the counter-based bits of the CPU kernels, so both
// give the same codes for the same seed.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "common/cuda/decode.cuh"
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
  launch_decode(in, format, out, n, ScaleValue{scale_inv}, stream_of(device));
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
