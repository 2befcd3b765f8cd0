// The loader of cublaslt.hpp: one dlopen per process, the library kept open, one handle per device.
#include "ops/cuda/cublaslt.hpp"

#include <dlfcn.h>

#include <array>
#include <memory>
#include <mutex>
#include <string>

#include "fp8kit/common/error.hpp"

namespace fp8kit::cuda_detail {
namespace {

// The soname of the toolkit the build compiled against (the ABI the header describes), then the plain name.
const std::array<std::string, 2> kLibraries = {"libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR), "libcublasLt.so"};

template <typename Fn>
void bind(void* library, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  FP8KIT_CHECK_KIND(fn != nullptr, ErrorKind::kUnsupported, "CUDA: ", kLibraries[0], " has no ", name,
                    ": install the cuBLAS of CUDA ", CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR, " or newer");
}

std::unique_ptr<CublasLt> load() {
  void* library = nullptr;
  std::string why;
  for (const std::string& name : kLibraries) {
    library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
    if (why.empty()) why = dlerror();
  }
  FP8KIT_CHECK_KIND(library != nullptr, ErrorKind::kUnsupported, "CUDA: cuBLASLt could not be loaded (", why,
                    "): install the CUDA toolkit's cuBLAS, or add its lib folder to LD_LIBRARY_PATH");
  auto lt = std::make_unique<CublasLt>();
  bind(library, "cublasLtCreate", lt->create);
  bind(library, "cublasLtGetVersion", lt->get_version);
  bind(library, "cublasLtGetStatusString", lt->status_string);
  bind(library, "cublasLtMatmulDescCreate", lt->desc_create);
  bind(library, "cublasLtMatmulDescDestroy", lt->desc_destroy);
  bind(library, "cublasLtMatmulDescSetAttribute", lt->desc_set);
  bind(library, "cublasLtMatrixLayoutCreate", lt->layout_create);
  bind(library, "cublasLtMatrixLayoutDestroy", lt->layout_destroy);
  bind(library, "cublasLtMatmulPreferenceCreate", lt->preference_create);
  bind(library, "cublasLtMatmulPreferenceDestroy", lt->preference_destroy);
  bind(library, "cublasLtMatmulPreferenceSetAttribute", lt->preference_set);
  bind(library, "cublasLtMatmulAlgoGetHeuristic", lt->heuristic);
  bind(library, "cublasLtMatmul", lt->matmul);
  const std::size_t v = lt->get_version();
  lt->version = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
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
