// `fp8kit bench convert|scaling|gemm --device cuda`: the CUDA kernels against the device's own baselines in the same
// run, timed with CUDA events (medians of interleaved rounds): casts, amax and the fused cast+amax against a
// device-to-device cudaMemcpy of the same bytes; cuda::scaled_mm against a direct cuBLASLt FP8 call of the same
// shape (what the wrapper costs) and a cuBLASLt bf16 matmul (what FP8 gains). A build without the CUDA backend, or
// a machine without a device, throws Error(kUnsupported) naming why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gemm_bench.hpp"

namespace fp8kit::bench {

// One kernel against device-to-device memcpy: GB/s count the bytes read plus written, for both.
struct CudaStreamResult {
  std::string op;         // "f32->e4m3fn", "amax f32", "f32->e4m3fn+amax", ...
  std::size_t bytes = 0;  // the kernel's bytes read + written per run
  int reps = 0;
  double seconds = 0;  // median
  double gbps = 0;
  double memcpy_gbps = 0;  // cudaMemcpy device to device of the kernel's input size, median
  double ratio = 0;        // gbps / memcpy_gbps
};
// `which`: "convert" (the casts) or "scaling" (amax, the fused cast + amax, and cuda::quantize per tensor, row,
// 1 x 128, 128 x 128 and MX on a rows x 4096 matrix); `bytes`: the wide input's size.
std::vector<CudaStreamResult> run_cuda_stream_bench(const std::string& which, std::size_t bytes, int reps, int device);

struct CudaGemmResult {
  GemmShape shape;
  int reps = 0;
  std::string kernel;         // cuda::scaled_mm's
  double seconds = 0;         // cuda::scaled_mm, median
  double direct_seconds = 0;  // the direct cuBLASLt FP8 call (descriptors and algorithm chosen once)
  double bf16_seconds = 0;    // cuBLASLt bf16 x bf16 -> bf16
  double tflops = 0, direct_tflops = 0, bf16_tflops = 0;
  double vs_direct = 0;    // tflops / direct_tflops (>= 0.95: the wrapper costs nothing)
  double vs_bf16 = 0;      // tflops / bf16_tflops
  double peak_tflops = 0;  // the device's dense FP8 peak where fp8kit knows it (H100/H200 SXM), else 0
};
// Per-tensor scales, e4m3fn x e4m3fn -> bfloat16, random operands; shapes as `fp8kit bench gemm` takes them (GEMV
// shapes run as M = 1).
std::vector<CudaGemmResult> run_cuda_gemm_bench(const std::vector<GemmShape>& shapes, int reps, int device);

// "NVIDIA H200 (cuda:0, compute capability 9.0, driver 13.0, cuBLASLt 13.1.0)".
std::string cuda_device_description(int device);

}  // namespace fp8kit::bench
