// The CUDA benchmarks of cuda_bench.hpp: CUDA events around `inner` back-to-back runs, the kernels and their
// baselines interleaved round by round (each round in a rotated order), medians.
#include "cuda_bench.hpp"

#include "fp8kit/common/error.hpp"

#ifdef FP8KIT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <memory>

#include "fp8kit/convert/cuda_convert.hpp"
#include "fp8kit/ops/cuda_scaled_mm.hpp"
#include "fp8kit/scaling/cuda_amax.hpp"
#include "fp8kit/scaling/cuda_quantize.hpp"
#include "fp8kit/scaling/cuda_recipe.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "ops/cuda/cublaslt.hpp"
#include "scaling/cuda/dequantize.hpp"
#endif

namespace fp8kit::bench {

#ifdef FP8KIT_HAVE_CUDA
namespace {

void check(cudaError_t status, const char* what) {
  FP8KIT_CHECK_KIND(status == cudaSuccess, ErrorKind::kUnsupported, "CUDA: ", what, ": ", cudaGetErrorString(status));
}

// Seconds per run of each of `runs`, medians over `reps` rounds of `inner` runs between two events.
std::vector<double> time_device(const std::vector<std::function<void()>>& runs, int reps, int inner) {
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (const auto& run : runs) run();  // warm-up: pools, cuBLASLt's kernels, clocks
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<std::vector<double>> samples(runs.size());
  for (int r = 0; r < reps; ++r) {
    for (std::size_t j = 0; j < runs.size(); ++j) {
      const std::size_t i = (j + static_cast<std::size_t>(r)) % runs.size();
      check(cudaEventRecord(start), "cudaEventRecord");
      for (int t = 0; t < inner; ++t) runs[i]();
      check(cudaEventRecord(stop), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float ms = 0.0f;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      samples[i].push_back(static_cast<double>(ms) * 1e-3 / inner);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::vector<double> medians;
  for (auto& s : samples) medians.push_back(median(s));
  return medians;
}

// A host tensor of n normal values, as `dtype`, on `device`.
Tensor device_randn(std::int64_t rows, std::int64_t cols, DType dtype, int device, float scale = 1.0f) {
  Tensor x = randn({rows, cols}, 7);
  if (scale != 1.0f) {
    for (float& v : x.span<float>()) v *= scale;
  }
  return (dtype == DType::float32 ? x : x.to(dtype, Overflow::kSaturate)).to(Device::cuda(device));
}

double dense_fp8_peak_tflops(const std::string& name) {
  const bool hopper = name.find("H100") != std::string::npos || name.find("H200") != std::string::npos;
  if (!hopper) return 0.0;
  if (name.find("NVL") != std::string::npos) return 1671.0;
  if (name.find("PCIe") != std::string::npos) return 1513.0;
  return 1979.0;  // SXM: 989.5 dense BF16, twice that in FP8
}

}  // namespace

std::string cuda_device_description(int device) {
  check_available(Device::cuda(device));
  const std::vector<cuda::DeviceInfo> devices = cuda::devices();  // held: d refers into it
  const cuda::DeviceInfo& d = devices.at(static_cast<std::size_t>(device));
  const int driver = cuda::driver_version();
  return d.name + " (cuda:" + std::to_string(device) + ", compute capability " + std::to_string(d.major) + "." +
         std::to_string(d.minor) + ", driver " + std::to_string(driver / 1000) + "." +
         std::to_string(driver % 1000 / 10) + ", cuBLASLt " + cuda::cublaslt_version() + ")";
}

std::vector<CudaStreamResult> run_cuda_stream_bench(const std::string& which, std::size_t bytes, int reps, int device) {
  FP8KIT_CHECK(which == "convert" || which == "scaling", "run_cuda_stream_bench: ", which,
               " is not convert or scaling");
  check_available(Device::cuda(device));
  const std::int64_t n = static_cast<std::int64_t>(bytes / 4);
  const Tensor f32 = device_randn(1, n, DType::float32, device);
  const Tensor matrix = f32.reshape({-1, n % 4096 == 0 ? 4096 : n});
  const Tensor bf16 = f32.to(Device::cpu()).to(DType::bfloat16).to(Device::cuda(device));
  const Tensor codes = f32.to(DType::float8_e4m3fn, Overflow::kSaturate);
  Tensor out8 = empty({n}, DType::uint8, Device::cuda(device));
  Tensor out32 = empty({n}, DType::float32, Device::cuda(device));
  Tensor out16 = empty({n}, DType::bfloat16, Device::cuda(device));
  Tensor copy = empty({n}, DType::float32, Device::cuda(device));
  const auto* in32 = static_cast<const float*>(f32.data_ptr());
  const auto* in16 = static_cast<const bfloat16*>(bf16.data_ptr());
  const auto* in8 = static_cast<const std::uint8_t*>(codes.data_ptr());
  auto* o8 = static_cast<std::uint8_t*>(out8.data_ptr());
  CastOptions e4m3;
  e4m3.format = Format::e4m3fn;
  e4m3.overflow = Overflow::kSaturate;
  CastOptions e5m2 = e4m3;
  e5m2.format = Format::e5m2;
  struct Op {
    std::string name;
    std::size_t bytes;
    std::function<void()> run;
  };
  std::vector<Op> ops;
  if (which == "convert") {
    ops.push_back({"f32->e4m3fn", 5 * bytes / 4, [&] { cuda::cast_to_fp8(in32, o8, n, e4m3, device); }});
    ops.push_back({"f32->e5m2", 5 * bytes / 4, [&] { cuda::cast_to_fp8(in32, o8, n, e5m2, device); }});
    ops.push_back({"bf16->e4m3fn", 3 * bytes / 4, [&] { cuda::cast_to_fp8(in16, o8, n, e4m3, device); }});
    ops.push_back({"e4m3fn->f32", 5 * bytes / 4, [&] {
                     cuda::cast_from_fp8(in8, Format::e4m3fn, static_cast<float*>(out32.data_ptr()), n, 1.0f, device);
                   }});
    ops.push_back(
        {"e4m3fn->bf16", 3 * bytes / 4,
         [&] { cuda::cast_from_fp8(in8, Format::e4m3fn, static_cast<bfloat16*>(out16.data_ptr()), n, 1.0f, device); }});
  } else {
    ops.push_back({"amax f32", bytes, [&] { cuda::amax(in32, n, device); }});
    ops.push_back({"f32->e4m3fn+amax", 5 * bytes / 4, [&] { cuda::cast_to_fp8_with_amax(in32, o8, n, e4m3, device); }});
    // cuda::quantize of the float32 input as a rows x 4096 matrix (as the CPU's bench scaling), e4m3fn, saturating:
    // reads 4 bytes and writes 1 per element (the scales are a few KiB).
    for (const Granularity& g : {Granularity::tensor(), Granularity::row(), Granularity::block(1, 128),
                                 Granularity::block(128, 128), Granularity::mx()}) {
      QuantizeOptions options;
      options.granularity = g;
      ops.push_back({"quantize " + g.name(), 5 * bytes / 4, [&, options] { cuda::quantize(matrix, options); }});
    }
    // cuda::quantize_delayed per tensor with a calibrated state (e4m3fn, a history of 16): the scale comes from the
    // history, so the amax pass records this step's amax and encodes in the same read.
    {
      DelayedScalingConfig config;
      config.history_length = 16;
      auto state = std::make_shared<cuda::DelayedScalingState>(config, device);
      cuda::quantize_delayed(matrix, *state);
      cuda::update(*state);
      ops.push_back({"quantize delayed", 5 * bytes / 4, [&matrix, state] { cuda::quantize_delayed(matrix, *state); }});
    }
    // cuda::dequantize of those codes back to float32 (reads 1 byte and writes 4 per element), as the CPU's bench;
    // for 128 x 128 also dequantize_tiles, the kernel not yet run on a GPU, which cuda::dequantize takes only once
    // it has been measured faster (docs/cuda.md, "What comes next").
    for (const Granularity& g : {Granularity::tensor(), Granularity::block(128, 128)}) {
      QuantizeOptions options;
      options.granularity = g;
      const auto q = std::make_shared<const cuda::QuantizedTensor>(cuda::quantize(matrix, options));
      ops.push_back({"dequantize " + g.name(), 5 * bytes / 4, [q] { cuda::dequantize(*q); }});
      if (g.kind == Granularity::Kind::kBlock) {
        ops.push_back({"dequantize " + g.name() + " tiles", 5 * bytes / 4, [q] {
                         cuda_detail::dequantize_with(*q, DType::float32, cuda_detail::DequantizeKernel::kTiles);
                       }});
      }
    }
  }
  const std::function<void()> memcpy_run = [&] {
    check(cudaMemcpy(copy.data_ptr(), f32.data_ptr(), bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
  };
  std::vector<CudaStreamResult> results;
  for (const Op& op : ops) {
    const std::vector<double> t = time_device({op.run, memcpy_run}, reps, 10);
    CudaStreamResult r;
    r.op = op.name;
    r.bytes = op.bytes;
    r.reps = reps;
    r.seconds = t[0];
    r.gbps = static_cast<double>(op.bytes) / t[0] / 1e9;
    r.memcpy_gbps = 2.0 * static_cast<double>(bytes) / t[1] / 1e9;
    r.ratio = r.gbps / r.memcpy_gbps;
    results.push_back(r);
  }
  return results;
}

std::vector<CudaGemmResult> run_cuda_gemm_bench(const std::vector<GemmShape>& shapes, int reps, int device) {
  using namespace cuda_detail;
  check_available(Device::cuda(device));
  const double peak = dense_fp8_peak_tflops(cuda::devices().at(static_cast<std::size_t>(device)).name);
  const CublasLt& lt = cublaslt();
  std::vector<CudaGemmResult> results;
  for (const GemmShape& shape : shapes) {
    const std::int64_t m = shape.gemv ? 1 : shape.m, n = shape.n, k = shape.k;
    const Tensor a = device_randn(m, k, DType::float8_e4m3fn, device, 4.0f);
    const Tensor b = device_randn(n, k, DType::float8_e4m3fn, device, 4.0f);
    const Tensor a16 = device_randn(m, k, DType::bfloat16, device), b16 = device_randn(n, k, DType::bfloat16, device);
    const Tensor one = ones({1}).to(Device::cuda(device));
    Tensor out = empty({m, n}, DType::bfloat16, Device::cuda(device));
    cuda::MmOptions options;
    options.out_dtype = DType::bfloat16;
    const std::string kernel = cuda::scaled_mm(a, b, one, one, options).kernel;

    cublasLtHandle_t handle = cublaslt_handle(device);
    const auto plan = [&](LtDescriptors& desc, cudaDataType_t type, bool scaled) {
      desc.create(type, type, CUDA_R_16BF, CUDA_R_16BF, m, n, k, 32u << 20);
      if (scaled) {
        const void* scale = one.data_ptr();
        desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, scale, "A_SCALE_POINTER");
        desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scale, "B_SCALE_POINTER");
      }
      cublasLtMatmulHeuristicResult_t chosen;
      cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
      FP8KIT_CHECK_KIND(desc.choose(handle, chosen, status), ErrorKind::kUnsupported, "cuBLASLt has no ",
                        scaled ? "FP8" : "bf16", " kernel for ", shape.name());
      return chosen;
    };
    LtDescriptors fp8_desc(lt), bf16_desc(lt);
    const cublasLtMatmulHeuristicResult_t fp8_algo = plan(fp8_desc, CUDA_R_8F_E4M3, true);
    const cublasLtMatmulHeuristicResult_t bf16_algo = plan(bf16_desc, CUDA_R_16BF, false);
    const Tensor workspace = empty({32 << 20}, DType::uint8, Device::cuda(device));
    const float alpha = 1.0f, beta = 0.0f;
    const auto direct = [&](const LtDescriptors& desc, const cublasLtMatmulHeuristicResult_t& algo, const Tensor& x,
                            const Tensor& w) {
      check_cublas(
          lt.matmul(handle, desc.op, &alpha, w.data_ptr(), desc.a, x.data_ptr(), desc.b, &beta, out.data_ptr(), desc.c,
                    out.data_ptr(), desc.d, &algo.algo, workspace.data_ptr(), algo.workspaceSize, nullptr),
          "cublasLtMatmul");
    };
    const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    const int inner = flop > 1e11 ? 5 : flop > 1e9 ? 20 : 100;
    const std::vector<double> t =
        time_device({[&] { cuda::scaled_mm(a, b, one, one, options); }, [&] { direct(fp8_desc, fp8_algo, a, b); },
                     [&] { direct(bf16_desc, bf16_algo, a16, b16); }},
                    reps, inner);
    CudaGemmResult r;
    r.shape = shape;
    r.reps = reps;
    r.kernel = kernel;
    r.seconds = t[0];
    r.direct_seconds = t[1];
    r.bf16_seconds = t[2];
    r.tflops = flop / t[0] / 1e12;
    r.direct_tflops = flop / t[1] / 1e12;
    r.bf16_tflops = flop / t[2] / 1e12;
    r.vs_direct = r.tflops / r.direct_tflops;
    r.vs_bf16 = r.tflops / r.bf16_tflops;
    r.peak_tflops = peak;
    results.push_back(r);
  }
  return results;
}

#else

namespace {
[[noreturn]] void no_backend() {
  FP8KIT_THROW(ErrorKind::kUnsupported,
               "--device cuda: this build of fp8kit has no CUDA backend (build with the CUDA toolkit installed, "
               "FP8KIT_CUDA=AUTO or ON)");
}
}  // namespace

std::string cuda_device_description(int) {
  no_backend();
}
std::vector<CudaStreamResult> run_cuda_stream_bench(const std::string&, std::size_t, int, int) {
  no_backend();
}
std::vector<CudaGemmResult> run_cuda_gemm_bench(const std::vector<GemmShape>&, int, int) {
  no_backend();
}

#endif

}  // namespace fp8kit::bench
