// cuda::scaled_mm (ops/cuda_scaled_mm.hpp): the checks, the scales relaid from fp8kit's layout (row-major over each
// operand's block grid) into cuBLASLt's, and one cublasLtMatmul.
//
// Row-major out (M x N) = a (M x K) b^T with b N x K is, in cuBLASLt's column-major terms, out^T (N x M) =
// op_T(b as K x N) op_N(a as K x M): the "TN" form Hopper's FP8 kernels require. cuBLASLt's A is fp8kit's b (its
// scales scale_b, its "outer" dimension N) and cuBLASLt's B is a (scale_a, outer M); K is the inner dimension.
// cuBLASLt's scale layouts (cublasLtMatmulMatrixScale_t, and torch._scaled_mm's checks of them):
//   OUTER_VEC_32F   one float per outer index
//   VEC128_32F      ceil(K/128) x outer, the outer index fastest
//   BLK128x128_32F  ceil(outer/128) x round_up(ceil(K/128), 4), the K block fastest (rows padded to 4)
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <compare>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "common/cuda/kernel_util.cuh"
#include "fp8kit/common/error.hpp"
#include "fp8kit/ops/cuda_scaled_mm.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "ops/cuda/cublaslt.hpp"

namespace fp8kit {
namespace {

using namespace cuda_detail;

constexpr std::int64_t kBlock = 128;                // the K block of cuBLASLt's FP8 block scales
constexpr std::size_t kWorkspaceBytes = 32u << 20;  // cuBLASLt's workspace (split-K and stream-K kernels)
constexpr const char* kWhat = "cuda::scaled_mm";

// dst[r * drs + c * dcs] = src[r * srs + c * scs] over a rows x cols grid: a transpose, a padding or a broadcast
// (a zero source stride) of scales.
__global__ void relayout_kernel(const float* src, std::int64_t rows, std::int64_t cols, std::int64_t srs,
                                std::int64_t scs, float* dst, std::int64_t drs, std::int64_t dcs) {
  const std::int64_t n = rows * cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t r = i / cols, c = i % cols;
    dst[r * drs + c * dcs] = src[r * srs + c * scs];
  }
}

// out[i][j] += bias[j] in FP32 (a float32 output's bias).
__global__ void add_bias_kernel(float* out, std::int64_t m, std::int64_t n, const bfloat16* bias) {
  const std::int64_t total = m * n;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    out[i] = __fadd_rn(out[i], bias[i % n].to_float());
  }
}

cudaDataType_t cuda_type(DType d) {
  switch (d) {
    case DType::float8_e4m3fn:
      return CUDA_R_8F_E4M3;
    case DType::float8_e5m2:
      return CUDA_R_8F_E5M2;
    case DType::bfloat16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

void check_on(const Tensor& t, const char* name, const Device& device) {
  FP8KIT_CHECK(!t.device().is_cpu(), kWhat, ": ", name, " is on the CPU: move it with .to(Device::cuda(", device.index,
               "))");
  FP8KIT_CHECK(t.device() == device, kWhat, ": ", name, " is on ", to_string(t.device()), " and a on ",
               to_string(device), ": put every operand on one device");
}

// What an operand's scales are, read from their shape (rows: M for a, N for b).
Granularity read_scales(const Tensor& s, const char* name, std::int64_t rows, std::int64_t k, bool allow_square) {
  FP8KIT_CHECK(s.dtype() == DType::float32, kWhat, ": ", name, " is ", fp8kit::name(s.dtype()),
               ": scales are float32 dequantization scales");
  const std::int64_t kb = ceil_div(k, kBlock);
  const Shape& shape = s.shape();
  if (s.numel() == 1) return Granularity::tensor();
  if ((shape.size() == 1 && shape[0] == rows) || (shape.size() == 2 && shape[0] == rows && shape[1] == 1)) {
    return Granularity::row();
  }
  if (shape.size() == 2 && shape[0] == rows && shape[1] == kb) return Granularity::block(1, kBlock);
  if (allow_square && shape.size() == 2 && shape[0] == ceil_div(rows, kBlock) && shape[1] == kb) {
    return Granularity::block(kBlock, kBlock);
  }
  FP8KIT_THROW(ErrorKind::kInvalidArgument, kWhat, ": ", name, " has shape ", shape_string(shape), "; expected 1 (per ",
               "tensor), ", rows, " (per row), ", shape_string(Shape{rows, kb}), " (1 x 128 blocks)",
               allow_square ? " or " + shape_string(Shape{ceil_div(rows, kBlock), kb}) + " (128 x 128 blocks)" : "");
}

bool is_block(const Granularity& g) {
  return g.kind == Granularity::Kind::kBlock;
}
bool is_square(const Granularity& g) {
  return is_block(g) && g.block_rows == kBlock;
}

// One operand's scales as cuBLASLt reads them: the mode, and a pointer to them (the caller's tensor when its layout
// is already cuBLASLt's, else `relaid`, filled on the device).
struct LtScales {
  std::int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  const void* pointer = nullptr;
  Tensor relaid;
};

// The scales of an operand with `rows` outer rows read as `from`, for cuBLASLt's `mode`.
LtScales lt_scales(const Tensor& s, const Granularity& from, std::int32_t mode, std::int64_t rows, std::int64_t k,
                   const Device& device) {
  LtScales out;
  out.mode = mode;
  const std::int64_t kb = ceil_div(k, kBlock);
  // The source's strides over a (rows or row blocks) x kb grid.
  const bool scalar = from.kind == Granularity::Kind::kTensor, row = from.kind == Granularity::Kind::kRow;
  const std::int64_t srs = scalar ? 0 : row ? 1 : kb, scs = (scalar || row) ? 0 : 1;
  const bool same = (mode == CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F && scalar) ||
                    (mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F && row) ||
                    (mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F && kb == 1 && !scalar && !is_square(from));
  if (same) {
    out.pointer = s.data_ptr();
    return out;
  }
  std::int64_t grid_rows = rows, grid_cols = kb, drs = 1, dcs = rows, elements = rows * kb;
  if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) {
    grid_cols = 1, dcs = 0, elements = rows;
  } else if (mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F) {
    const std::int64_t padded = ceil_div(kb, 4) * 4;
    grid_rows = ceil_div(rows, kBlock), drs = padded, dcs = 1, elements = grid_rows * padded;
  }
  out.relaid = zeros({elements}, DType::float32, device);  // BLK's padding stays 0 (never read)
  relayout_kernel<<<blocks_for(grid_rows * grid_cols), kThreads, 0, stream_of(device.index)>>>(
      static_cast<const float*>(s.data_ptr()), grid_rows, grid_cols, srs, scs,
      static_cast<float*>(out.relaid.data_ptr()), drs, dcs);
  check_launch("the relayout of scaled_mm's scales", device.index);
  out.pointer = out.relaid.data_ptr();
  return out;
}

// One matmul configuration's descriptors and chosen algorithm, kept for the calls that follow (PyTorch and Transformer
// Engine cache them too): at most kMaxPlans, all dropped when full.
struct PlanKey {
  int device;
  std::int64_t m, n, k;
  DType a, b, out;
  std::int32_t mode_a, mode_b;
  bool fast_accum, bias, scale_result, amax;
  auto operator<=>(const PlanKey&) const = default;
};
struct Plan {
  explicit Plan(const CublasLt& lt) : desc(lt) {}
  LtDescriptors desc;
  cublasLtMatmulHeuristicResult_t algorithm{};
};
constexpr std::size_t kMaxPlans = 256;
struct PlanCache {
  std::mutex mutex;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
};
PlanCache& plan_cache() {
  static PlanCache* cache = new PlanCache;  // never destroyed: cuBLASLt may be gone at exit
  return *cache;
}

std::string format_name(DType d) {
  return std::string(fp8kit::name(d)).substr(7);
}  // "float8_e4m3fn" -> "e4m3fn"

}  // namespace

namespace cuda {

std::string cublaslt_version() {
  try {
    return cuda_detail::cublaslt().version;
  } catch (const Error& e) {
    return e.what();
  }
}

MmResult scaled_mm(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                   const MmOptions& options) {
  const Device device = a.device();
  FP8KIT_CHECK(!device.is_cpu(), kWhat, ": a is on the CPU: move the operands with .to(Device::cuda(i)), or call ",
               "fp8kit::scaled_mm for the CPU");
  using Named = std::initializer_list<std::pair<const Tensor*, const char*>>;
  for (auto [t, name] : Named{{&b, "b"}, {&scale_a, "scale_a"}, {&scale_b, "scale_b"}}) check_on(*t, name, device);
  for (auto [t, name] : Named{{&a, "a"}, {&b, "b"}}) {
    FP8KIT_CHECK(t->dtype() == DType::float8_e4m3fn || t->dtype() == DType::float8_e5m2, kWhat, ": ", name, " is ",
                 fp8kit::name(t->dtype()), ": cuBLASLt multiplies float8_e4m3fn and float8_e5m2 (convert fnuz codes ",
                 "to them first)");
    FP8KIT_CHECK(t->dim() == 2, kWhat, ": ", name, " has shape ", shape_string(t->shape()), ": it must be a matrix");
  }
  FP8KIT_CHECK(!(a.dtype() == DType::float8_e5m2 && b.dtype() == DType::float8_e5m2), kWhat,
               ": e5m2 x e5m2 is not supported (cuBLASLt, like torch._scaled_mm, refuses it): make one operand e4m3fn");
  const std::int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  FP8KIT_CHECK(b.size(1) == k, kWhat, ": a is ", shape_string(a.shape()), " and b ", shape_string(b.shape()),
               ": b is N x K (the weight layout) with a's K = ", k);
  FP8KIT_CHECK(k % 16 == 0 && n % 16 == 0 && k > 0, kWhat, ": K = ", k, " and N = ", n,
               " must be positive multiples of 16 (cuBLASLt's FP8 kernels): pad them with zeros");
  const DType out_dtype = options.out_dtype;
  const bool fp8_out = out_dtype == DType::float8_e4m3fn || out_dtype == DType::float8_e5m2;
  FP8KIT_CHECK(fp8_out || out_dtype == DType::float32 || out_dtype == DType::bfloat16, kWhat, ": out_dtype ",
               fp8kit::name(out_dtype), " is not supported: float32, bfloat16, float8_e4m3fn or float8_e5m2");
  if (options.bias) {
    check_on(*options.bias, "bias", device);
    FP8KIT_CHECK(options.bias->dtype() == DType::bfloat16 && options.bias->numel() == n, kWhat, ": bias is ",
                 fp8kit::name(options.bias->dtype()), " ", shape_string(options.bias->shape()), ": it must be ", n,
                 " bfloat16 values (cuBLASLt's FP8 bias epilogue)");
  }
  FP8KIT_CHECK(!options.amax || fp8_out, kWhat, ": amax is computed with FP8 outputs (cuBLASLt's AMAX_D); for a ",
               fp8kit::name(out_dtype), " output take it from the output (cuda::amax on float32)");
  if (options.scale_result) {
    check_on(*options.scale_result, "scale_result", device);
    FP8KIT_CHECK(fp8_out, kWhat, ": scale_result is for FP8 outputs, and out_dtype is ", fp8kit::name(out_dtype));
    FP8KIT_CHECK(options.scale_result->dtype() == DType::float32 && options.scale_result->numel() == 1, kWhat,
                 ": scale_result must be one float32 value");
  }

  MmResult result;
  result.a_scaling = read_scales(scale_a, "scale_a", m, k, false);
  result.b_scaling = read_scales(scale_b, "scale_b", n, k, true);
  const Granularity& ga = result.a_scaling;
  const Granularity& gb = result.b_scaling;
  const bool blocks = is_block(ga) || is_block(gb);
  const bool rows = !blocks && (ga.kind == Granularity::Kind::kRow || gb.kind == Granularity::Kind::kRow);
  FP8KIT_CHECK(!(blocks && options.fast_accum), kWhat,
               ": fast_accum is not available with block scales (cuBLASLt promotes every block)");
  // cuBLASLt's N (fp8kit's M) is the stride of a's 1 x 128 scales, which its block-scaled kernels take in multiples
  // of 4 (the cuBLAS documentation's layout of 1D and 2D block scaling factors).
  FP8KIT_CHECK(!blocks || m % 4 == 0, kWhat, ": M = ", m,
               " must be a multiple of 4 with block scales (cuBLASLt's layout of them): pad a's rows with zeros");

  cuda_detail::use_device(device.index);
  result.out = empty({m, n}, out_dtype, device);
  if (options.amax) result.amax = zeros({}, DType::float32, device);
  const CublasLt& lt = cuda_detail::cublaslt();
  const std::int32_t mode_a = blocks ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                              : rows ? CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
                                     : CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  const std::int32_t mode_b = is_square(gb) ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : mode_a;
  result.kernel = "cublasLt " + lt.version + " " + format_name(a.dtype()) + " x " + format_name(b.dtype()) + " " +
                  ga.name() + "/" + gb.name() + " -> " + std::string(fp8kit::name(out_dtype));
  if (m == 0 || n == 0) return result;

  // A bias goes into cuBLASLt's epilogue, except beside a float32 output, which some of its FP8 kernels refuse (as
  // PyTorch found): there a kernel adds it after the product, the same FP32 addition before no output rounding.
  const bool epilogue_bias = options.bias && out_dtype != DType::float32;
  const LtScales lt_a = lt_scales(scale_b, gb, mode_b, n, k, device);  // cuBLASLt's A is fp8kit's b
  const LtScales lt_b = lt_scales(scale_a, ga, mode_a, m, k, device);
  const PlanKey key{device.index,
                    m,
                    n,
                    k,
                    a.dtype(),
                    b.dtype(),
                    out_dtype,
                    mode_a,
                    mode_b,
                    options.fast_accum,
                    epilogue_bias,
                    options.scale_result.has_value(),
                    options.amax};
  const void* d_scale = options.scale_result ? options.scale_result->data_ptr() : nullptr;
  const void* bias = epilogue_bias ? options.bias->data_ptr() : nullptr;
  void* amax = options.amax ? result.amax.data_ptr() : nullptr;
  void* out = result.out.data_ptr();
  // The pointers change from call to call; everything else is the plan's (created once per key: the heuristic's
  // search costs more than a small GEMM).
  const auto set_pointers = [&](LtDescriptors& desc) {
    desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, lt_a.pointer, "A_SCALE_POINTER");
    desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, lt_b.pointer, "B_SCALE_POINTER");
    if (d_scale != nullptr) desc.set(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, d_scale, "D_SCALE_POINTER");
    if (amax != nullptr) desc.set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax, "AMAX_D_POINTER");
    if (bias != nullptr) desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "BIAS_POINTER");
  };
  const auto make_plan = [&] {
    auto plan = std::make_unique<Plan>(lt);
    LtDescriptors& desc = plan->desc;
    // C is not read (beta 0) but typed: bfloat16 beside an FP8 D, as cuBLASLt's FP8 table requires.
    desc.create(cuda_type(b.dtype()), cuda_type(a.dtype()), fp8_out ? CUDA_R_16BF : cuda_type(out_dtype),
                cuda_type(out_dtype), m, n, k, kWorkspaceBytes);
    desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode_b, "A_SCALE_MODE");
    desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode_a, "B_SCALE_MODE");
    desc.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<std::int8_t>(options.fast_accum ? 1 : 0), "FAST_ACCUM");
    if (bias != nullptr) {
      desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<std::uint32_t>(CUBLASLT_EPILOGUE_BIAS), "EPILOGUE");
      desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(CUDA_R_16BF), "BIAS_DATA_TYPE");
    }
    set_pointers(desc);
    cublasStatus_t searched = CUBLAS_STATUS_SUCCESS;
    if (!desc.choose(cuda_detail::cublaslt_handle(device.index), plan->algorithm, searched)) {
      int major = 0, minor = 0;
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index);
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device.index);
      FP8KIT_THROW(ErrorKind::kUnsupported, kWhat, ": cuBLASLt ", lt.version, " has no kernel on ", to_string(device),
                   " (compute capability ", major, ".", minor, ") for ", format_name(a.dtype()), " x ",
                   format_name(b.dtype()), " with scales ", ga.name(), " / ", gb.name(), " to ",
                   fp8kit::name(out_dtype), epilogue_bias ? " with a bias" : "", options.amax ? " with amax" : "",
                   searched != CUBLAS_STATUS_SUCCESS ? std::string(" (") + lt.status_string(searched) + ")" : "",
                   ": FP8 needs compute capability 8.9 or later, block and row scales 9.0 and cuBLAS 12.9");
    }
    return plan;
  };

  PlanCache& cache = plan_cache();
  std::lock_guard lock(cache.mutex);  // a plan's descriptors are shared: one call sets and enqueues at a time
  auto found = cache.plans.find(key);
  if (found == cache.plans.end()) {
    if (cache.plans.size() >= kMaxPlans) cache.plans.clear();
    found = cache.plans.emplace(key, make_plan()).first;
  } else {
    set_pointers(found->second->desc);
  }
  Plan& plan = *found->second;
  const Tensor workspace = empty({static_cast<std::int64_t>(plan.algorithm.workspaceSize)}, DType::uint8, device);
  const float alpha = 1.0f, beta = 0.0f;
  // C is not read (beta 0): null, as cuBLASLt allows C == D only when their descriptors are the same, which they
  // are not beside an FP8 D (bfloat16 C).
  check_cublas(lt.matmul(cuda_detail::cublaslt_handle(device.index), plan.desc.op, &alpha, b.data_ptr(), plan.desc.a,
                         a.data_ptr(), plan.desc.b, &beta, nullptr, plan.desc.c, out, plan.desc.d, &plan.algorithm.algo,
                         workspace.data_ptr(), plan.algorithm.workspaceSize, stream_of(device.index)),
               "cublasLtMatmul");
  if (options.bias && !epilogue_bias) {
    add_bias_kernel<<<blocks_for(m * n), kThreads, 0, stream_of(device.index)>>>(
        static_cast<float*>(out), m, n, static_cast<const bfloat16*>(options.bias->data_ptr()));
    check_launch("scaled_mm's bias", device.index);
  }
  return result;
}

}  // namespace cuda
}  // namespace fp8kit
