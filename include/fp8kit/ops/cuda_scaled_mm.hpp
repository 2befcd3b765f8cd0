// scaled_mm on a CUDA device through cuBLASLt's FP8 matmul (Hopper's FP8 tensor cores): torch._scaled_mm's
// operation on device tensors, with the scales in the layouts fp8kit's ScaledTensor keeps (row-major over the block
// grid), relaid for cuBLASLt inside the call. cuBLASLt is loaded on first use (libcublasLt.so of the toolkit the
// build found), so programs built with the CUDA backend start on machines without it; a build without the backend
// throws Error(kUnsupported).
#pragma once

#include <optional>
#include <string>

#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::cuda {

struct MmOptions {
  DType out_dtype = DType::float32;  // float32, bfloat16, float8_e4m3fn or float8_e5m2
  // N bfloat16 values on the operands' device, added in FP32 before the output conversion (cuBLASLt's FP8 epilogue
  // takes a bfloat16 bias, as torch._scaled_mm requires), or nothing.
  std::optional<Tensor> bias;
  // FP8 outputs only: the output's quantization scale (a float32 scalar on the device): out = cast(result * scale).
  std::optional<Tensor> scale_result;
  // FP8 outputs only: also compute max |result| (before scale_result; the next delayed scale's amax), a float32
  // scalar on the device.
  bool amax = false;
  bool fast_accum = false;  // cuBLASLt's fast accumulation (no periodic promotion to FP32; not with block scales)
};

struct MmResult {
  Tensor out;                        // M x N on the device, options.out_dtype
  Tensor amax;                       // a float32 scalar on the device when options.amax, else empty
  Granularity a_scaling, b_scaling;  // what the scales' shapes were read as
  std::string kernel;                // e.g. "cublasLt 13.1.0 e4m3fn x e4m3fn tensor/tensor -> bfloat16"
};

// out (M x N) = (a (M x K) times b (N x K, the weight layout)^T) with the scales, + bias, on the operands' device,
// queued on the current stream (cuda_stream.hpp; the caller's later work there follows it). a and b are FP8 tensors
// (float8_e4m3fn or float8_e5m2, not both e5m2) on one CUDA device; scale_a and scale_b are float32 tensors there,
// read by their shapes as torch._scaled_mm reads them:
//   per tensor:       scale_a 1 element,                  scale_b 1 element
//   per row/channel:  scale_a M (or M x 1),               scale_b N (or N x 1)
//   1 x 128 blocks:   scale_a M x ceil(K/128),            scale_b N x ceil(K/128) (1 x 128) or
//                                                         ceil(N/128) x ceil(K/128) (128 x 128, DeepSeek-V3)
// Every scale is a dequantization scale (ScaledTensor::scale_inv), row-major over its operand's block grid.
// K and N must be multiples of 16 (cuBLASLt's FP8 tensor-core kernels), and M of 4 with block scales. The results
// contract is scaled_mm's (fp8kit/ops/scaled_mm.hpp) with the tensor cores' accumulation: exact where the sums are
// exact (integer-valued operands and power-of-two scales give scaled_mm_reference's bits), otherwise within the bound
// docs/cuda.md gives. What cuBLASLt of this machine does not run (a scale combination, an output type) is
// Error(kUnsupported) naming it; wrong shapes, dtypes or devices are Error(kInvalidArgument) naming the operand.
MmResult scaled_mm(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                   const MmOptions& options = {});

// The cuBLASLt this process loaded (e.g. "13.1.0"), or why it could not be loaded (a build without the CUDA
// backend says so).
std::string cublaslt_version();

}  // namespace fp8kit::cuda
