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
    out[i] = encode_value<F>(x, spec, bits);
  }
}

// Four elements a thread: one vector load (16 bytes of float32, 8 of a 16-bit type) and one 4-byte store of codes,
// for inputs aligned to four elements (the scalar kernel takes the rest).
template <typename T>
struct alignas(4 * sizeof(T)) Four {
  T e[4];
};

template <Format F, typename T>
__global__ void encode4_kernel(const Four<T>* in, std::uint32_t* out, std::int64_t n4, float scale, EncodeSpec spec,
                               std::uint64_t seed, std::uint64_t offset) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
    const Four<T> v = in[i];
    std::uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const std::uint32_t bits = spec.rounding == Rounding::kStochastic
                                     ? stochastic_bits(seed, offset + static_cast<std::uint64_t>(4 * i + j))
                                     : 0u;
      packed |= static_cast<std::uint32_t>(encode_value<F>(scaled(widen(v.e[j]), scale), spec, bits)) << (8 * j);
    }
    out[i] = packed;
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
  const bool aligned = reinterpret_cast<std::uintptr_t>(in) % sizeof(Four<T>) == 0 &&
                       reinterpret_cast<std::uintptr_t>(out) % sizeof(std::uint32_t) == 0;
  const std::int64_t n4 = aligned ? n / 4 : 0;
  const cudaStream_t stream = stream_of(device);
  with_format(options.format, [&]<Format F>() {
    if (n4 > 0) {
      encode4_kernel<F><<<blocks_for(n4), kThreads, 0, stream>>>(
          reinterpret_cast<const Four<T>*>(in), reinterpret_cast<std::uint32_t*>(out), n4, options.scale, spec,
          options.seed, options.stream_offset);
    }
    if (n > 4 * n4) {
      encode_kernel<F><<<blocks_for(n - 4 * n4), kThreads, 0, stream>>>(
          in + 4 * n4, out + 4 * n4, n - 4 * n4, options.scale, spec, options.seed,
          options.stream_offset + static_cast<std::uint64_t>(4 * n4));
    }
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
