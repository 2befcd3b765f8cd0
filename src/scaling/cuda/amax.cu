// amax on a CUDA device, alone and fused with the cast to FP8: each thread keeps the largest finite |x| it saw (as
// float bits: non-negative floats order as their unsigned bits) and its NaN and Inf counts, a warp and then a block
// combine them, and one atomic per block merges them into a 24-byte result on the device, copied back once. The
// cast runs the CPU's scalar codec (format/codec_inline.hpp) on the same elements in the same pass. Four elements a
// thread (16-byte loads) where the pointers are aligned.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>

#include "common/cuda/kernel_util.cuh"
#include "fp8kit/common/error.hpp"
#include "fp8kit/format/codec_inline.hpp"
#include "fp8kit/scaling/cuda_amax.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "scaling/cuda/tensor_kernels.cuh"

namespace fp8kit {
namespace {

using namespace cuda_detail;

struct Partial {
  unsigned int amax_bits = 0;  // |x| of the largest finite element, as bits
  unsigned long long nans = 0;
  unsigned long long infs = 0;
};

__device__ inline void see(float x, Partial& p) {
  const unsigned int bits = __float_as_uint(x) & 0x7FFFFFFFu;
  if (bits > 0x7F800000u) {
    ++p.nans;
  } else if (bits == 0x7F800000u) {
    ++p.infs;
  } else if (bits > p.amax_bits) {
    p.amax_bits = bits;
  }
}

// The block's partials combined (warp shuffles, then the warps' leaders through shared memory) and merged into
// `result` (amax bits, NaN count, Inf count) by thread 0.
__device__ void merge_block(Partial p, unsigned long long* result) {
  for (int offset = 16; offset > 0; offset /= 2) {
    p.amax_bits = max(p.amax_bits, __shfl_down_sync(0xFFFFFFFFu, p.amax_bits, offset));
    p.nans += __shfl_down_sync(0xFFFFFFFFu, p.nans, offset);
    p.infs += __shfl_down_sync(0xFFFFFFFFu, p.infs, offset);
  }
  // (plain arrays: a __shared__ variable takes no initializer, which Partial's members have)
  __shared__ unsigned int warp_amax[kThreads / 32];
  __shared__ unsigned long long warp_nans[kThreads / 32], warp_infs[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_amax[warp] = p.amax_bits;
    warp_nans[warp] = p.nans;
    warp_infs[warp] = p.infs;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    Partial total;
    for (int w = 0; w < kThreads / 32; ++w) {
      total.amax_bits = max(total.amax_bits, warp_amax[w]);
      total.nans += warp_nans[w];
      total.infs += warp_infs[w];
    }
    atomicMax(result, static_cast<unsigned long long>(total.amax_bits));
    if (total.nans != 0) atomicAdd(result + 1, total.nans);
    if (total.infs != 0) atomicAdd(result + 2, total.infs);
  }
}

// see() for each element of a group of four: where all four are finite (the largest |x| bits below Inf's), one
// integer maximum each and no counting; otherwise element by element. (see() an element, with its branches and
// 64-bit counts, is several times the instructions; at memcpy's rate a float32 element has some 40 to spend, fewer
// in a kernel that also encodes.)
__device__ inline void see_group(const Vec16<float>& v, Partial& p) {
  const unsigned bits = magnitude_bits(v);
  if (bits < 0x7F800000u) {
    p.amax_bits = max(p.amax_bits, bits);
    return;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) see(v.e[j], p);
}

__global__ void amax_kernel(const float* x, std::int64_t n, bool vectors, unsigned long long* result) {
  Partial p;
  grid_stride<4>(
      n, vectors, [&](std::int64_t i) { return *reinterpret_cast<const Vec16<float>*>(x + i); },
      [&](std::int64_t, const Vec16<float>& v) { see_group(v, p); }, [&](std::int64_t i) { see(x[i], p); });
  merge_block(p, result);
}

template <Format F>
__global__ void cast_amax_kernel(const float* in, std::uint8_t* out, std::int64_t n, bool vectors, float scale,
                                 EncodeSpec spec, std::uint64_t seed, std::uint64_t offset,
                                 unsigned long long* result) {
  Partial p;
  grid_stride<4>(
      n, vectors, [&](std::int64_t i) { return *reinterpret_cast<const Vec16<float>*>(in + i); },
      [&](std::int64_t i, const Vec16<float>& v) {
        see_group(v, p);
        std::uint32_t word;
        encode_group<F>(v, scale, spec, seed, offset + static_cast<std::uint64_t>(i), &word);  // as cast_to_fp8
        store_codes<4>(out + i, &word);
      },
      [&](std::int64_t i) {
        const float x = in[i];
        see(x, p);
        const std::uint32_t bits =
            spec.rounding == Rounding::kStochastic ? stochastic_bits(seed, offset + static_cast<std::uint64_t>(i)) : 0u;
        out[i] = encode_value<F>(scaled(x, scale), spec, bits);  // as cuda::cast_to_fp8 scales
      });
  merge_block(p, result);
}

// Runs launch(result pointer) on `device` with a zeroed result on it, and reads the result back.
template <typename Launch>
AmaxResult with_result(int device, const char* what, Launch&& launch) {
  const Device gpu = Device::cuda(device);
  Tensor result = zeros({3}, DType::int64, gpu);  // queued on the legacy default stream, as the kernel
  use_device(device);
  launch(static_cast<unsigned long long*>(result.data_ptr()));
  check_launch(what, device);
  const Tensor host = result.to(Device::cpu());  // on the current stream: waits for the kernel
  const std::int64_t* r = host.data<std::int64_t>();
  AmaxResult out;
  const auto bits = static_cast<std::uint32_t>(r[0]);
  std::memcpy(&out.amax, &bits, sizeof(float));
  out.nan_count = static_cast<std::uint64_t>(r[1]);
  out.inf_count = static_cast<std::uint64_t>(r[2]);
  return out;
}

}  // namespace

namespace cuda {

AmaxResult amax(const float* x, std::int64_t n, int device) {
  use_device(device);
  if (n == 0) return {};
  return with_result(device, "amax", [&](unsigned long long* result) {
    const bool vectors = vector_aligned<4>(x);
    amax_kernel<<<blocks_for_vectors<4>(n, vectors, 4096), kThreads, 0, stream_of(device)>>>(x, n, vectors, result);
  });
}

AmaxResult cast_to_fp8_with_amax(const float* in, std::uint8_t* out, std::int64_t n, const CastOptions& options,
                                 int device) {
  use_device(device);
  if (n == 0) return {};
  const EncodeSpec spec{options.format, options.overflow, options.rounding};
  const bool vectors = vector_aligned<4>(in) && vector_aligned<4>(out);
  return with_result(device, "the fused cast and amax", [&](unsigned long long* result) {
    with_format(options.format, [&]<Format F>() {
      cast_amax_kernel<F><<<blocks_for_vectors<4>(n, vectors, 4096), kThreads, 0, stream_of(device)>>>(
          in, out, n, vectors, options.scale, spec, options.seed, options.stream_offset, result);
    });
  });
}

}  // namespace cuda
}  // namespace fp8kit
