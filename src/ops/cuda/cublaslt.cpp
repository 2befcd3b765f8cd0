// The loader of cublaslt.hpp: one dlopen per process, the library kept open, one handle per device.
#include "ops/cuda/cublaslt.hpp"

#include <array>
#include <memory>
#include <mutex>
#include <string>

#include "common/cuda/shared_library.hpp"
#include "fp8kit/common/error.hpp"

namespace fp8kit::cuda_detail {
namespace {

std::unique_ptr<CublasLt> load() {
  static const SharedLibrary library({"libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR), "libcublasLt.so"},
                                     "cuBLASLt",
                                     "install the CUDA toolkit's cuBLAS, or add its lib folder to LD_LIBRARY_PATH",
                                     "install the cuBLAS of CUDA " + std::to_string(CUBLAS_VER_MAJOR) + "." +
                                         std::to_string(CUBLAS_VER_MINOR) + " or newer");
  auto lt = std::make_unique<CublasLt>();
  library.bind("cublasLtCreate", lt->create);
  library.bind("cublasLtGetVersion", lt->get_version);
  library.bind("cublasLtGetStatusString", lt->status_string);
  library.bind("cublasLtMatmulDescCreate", lt->desc_create);
  library.bind("cublasLtMatmulDescDestroy", lt->desc_destroy);
  library.bind("cublasLtMatmulDescSetAttribute", lt->desc_set);
  library.bind("cublasLtMatrixLayoutCreate", lt->layout_create);
  library.bind("cublasLtMatrixLayoutDestroy", lt->layout_destroy);
  library.bind("cublasLtMatmulPreferenceCreate", lt->preference_create);
  library.bind("cublasLtMatmulPreferenceDestroy", lt->preference_destroy);
  library.bind("cublasLtMatmulPreferenceSetAttribute", lt->preference_set);
  library.bind("cublasLtMatmulAlgoGetHeuristic", lt->heuristic);
  library.bind("cublasLtMatmul", lt->matmul);
  lt->version = dotted_version(static_cast<long>(lt->get_version()));
  return lt;
}

}  // namespace

const CublasLt& cublaslt() {
  // Loaded once; a failure is not remembered, so that its message is given to every caller (and a library
  // installed meanwhile is found).
  static std::mutex mutex;
  static std::unique_ptr<CublasLt> loaded;
  std::lock_guard lock(mutex);
  if (!loaded) loaded = load();
  return *loaded;
}

cublasLtHandle_t cublaslt_handle(int device) {
  static std::mutex mutex;
  static std::array<cublasLtHandle_t, 64> handles{};
  FP8KIT_CHECK_KIND(device >= 0 && device < static_cast<int>(handles.size()), ErrorKind::kUnsupported,
                    "CUDA: device cuda:", device, " is beyond the 64 fp8kit keeps cuBLASLt handles for");
  const CublasLt& lt = cublaslt();
  std::lock_guard lock(mutex);
  if (handles[device] == nullptr) check_cublas(lt.create(&handles[device]), "cublasLtCreate");
  return handles[device];
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  FP8KIT_THROW(ErrorKind::kUnsupported, "CUDA: cuBLASLt ", what, ": ", cublaslt().status_string(status), " (status ",
               static_cast<int>(status), ")");
}

LtDescriptors::~LtDescriptors() {
  if (preference) lt.preference_destroy(preference);
  for (cublasLtMatrixLayout_t layout : {a, b, c, d}) {
    if (layout) lt.layout_destroy(layout);
  }
  if (op) lt.desc_destroy(op);
}

void LtDescriptors::create(cudaDataType_t w_type, cudaDataType_t x_type, cudaDataType_t c_type, cudaDataType_t d_type,
                           std::int64_t m, std::int64_t n, std::int64_t k, std::uint64_t workspace_bytes) {
  check_cublas(lt.desc_create(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "TRANSA");
  set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "TRANSB");
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  check_cublas(lt.layout_create(&a, w_type, u(k), u(n), k), "cublasLtMatrixLayoutCreate(A)");
  check_cublas(lt.layout_create(&b, x_type, u(k), u(m), k), "cublasLtMatrixLayoutCreate(B)");
  check_cublas(lt.layout_create(&c, c_type, u(n), u(m), n), "cublasLtMatrixLayoutCreate(C)");
  check_cublas(lt.layout_create(&d, d_type, u(n), u(m), n), "cublasLtMatrixLayoutCreate(D)");
  check_cublas(lt.preference_create(&preference), "cublasLtMatmulPreferenceCreate");
  check_cublas(lt.preference_set(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                 sizeof(workspace_bytes)),
               "MAX_WORKSPACE_BYTES");
}

bool LtDescriptors::choose(cublasLtHandle_t handle, cublasLtMatmulHeuristicResult_t& chosen,
                           cublasStatus_t& status) const {
  int found = 0;
  chosen = {};
  status = lt.heuristic(handle, op, a, b, c, d, preference, 1, &chosen, &found);
  return status == CUBLAS_STATUS_SUCCESS && found > 0;
}

}  // namespace fp8kit::cuda_detail
