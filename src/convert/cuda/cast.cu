// CUDA casts between float32 / bfloat16 / float16 and the five FP8 formats: one thread per element (grid-stride),
// each through the scalar codec the CPU uses (format/codec_inline.hpp, compiled for the device), with the format a
// template constant so that the descriptor folds. Stochastic rounding draws stochastic_bits(seed, offset + i), the
// counter-based bits of the CPU kernels, so both give the same codes for the same seed.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

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
    out[i] = codec_detail::encode_unpacked(d, codec_detail::unpack(x), spec, bits);
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

template <typename T>
void launch_to_fp8(const T* in, std::uint8_t* out, std::int64_t n, const CastOptions& options, int device) {
  use_device(device);
  if (n == 0) return;
  const EncodeSpec spec{options.format, options.overflow, options.rounding};
  with_format(options.format, [&]<Format F>() {
    encode_kernel<F><<<blocks_for(n), kThreads, 0, stream_of(device)>>>(in, out, n, options.scale, spec, options.seed,
                                                                        options.stream_offset);
  });
  check_launch("the cast to FP8", device);
}

template <typename T>
void launch_from_fp8(const std::uint8_t* in, Format format, T* out, std::int64_t n, float scale_inv, int device) {
  use_device(device);
  if (n == 0) return;
  with_format(format, [&]<Format F>() {
    decode_kernel<F><<<blocks_for(n), kThreads, 0, stream_of(device)>>>(in, out, n, scale_inv);
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
