// cuBLASLt, loaded on first use (dlopen of the toolkit's libcublasLt.so.<major>): linking it would make every
// program of a CUDA build load a 500 MB library at start (0.13 s a process, measured) and refuse to start where it
// is missing. The functions fp8kit calls, typed from cublasLt.h itself.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <string>

namespace fp8kit::cuda_detail {

struct CublasLt {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtGetVersion) get_version;
  decltype(&cublasLtGetStatusString) status_string;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
  std::string version;  // "13.1.0"
};

// The loaded library, or Error(kUnsupported) saying which file could not be loaded and how to make it loadable.
const CublasLt& cublaslt();
// A cuBLASLt handle for `device` (created once, kept for the process; the device must be current).
cublasLtHandle_t cublaslt_handle(int device);
// Throws Error(kUnsupported) "CUDA: cuBLASLt <what>: <status name>" unless status is CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t status, const char* what);

// One matmul's descriptors (the operation, the four matrix layouts, the preference), destroyed however the caller
// ends; create() makes them for out^T (N x M) = op_T(A: K x N) op_N(B: K x M), column-major (row-major out = x w^T
// with x M x K and w N x K), FP32 compute and scale type, and a workspace of at most `workspace_bytes`.
struct LtDescriptors {
  const CublasLt& lt;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;

  explicit LtDescriptors(const CublasLt& lib) : lt(lib) {}
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;
  ~LtDescriptors();
  void create(cudaDataType_t w_type, cudaDataType_t x_type, cudaDataType_t c_type, cudaDataType_t d_type,
              std::int64_t m, std::int64_t n, std::int64_t k, std::uint64_t workspace_bytes);
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attribute, const T& value, const char* what) {
    check_cublas(lt.desc_set(op, attribute, &value, sizeof(value)), what);
  }
  // The heuristic's first algorithm; false when cuBLASLt has none for these descriptors (`status` says why, if any).
  bool choose(cublasLtHandle_t handle, cublasLtMatmulHeuristicResult_t& chosen, cublasStatus_t& status) const;
};

}  // namespace fp8kit::cuda_detail
