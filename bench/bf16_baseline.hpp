// The BF16 GEMM baseline of `fp8kit bench gemm`: oneDNN's bfloat16 matmul (brgemm, AMX or AVX512-BF16 where the
// CPU has them), the library PyTorch's CPU bf16 matmul runs on. Available when fp8kit was configured with oneDNN
// (Debian libdnnl-dev) and oneDNN runs bf16 matmul on this CPU; otherwise `why_missing` says why.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace fp8kit::bench {

struct Bf16Library {
  bool available = false;
  std::string name;         // "oneDNN 2.6.3" (where it is built in)
  std::string why_missing;  // when not available: one line (the package to install, or what this CPU lacks)
};
const Bf16Library& bf16_library();

// C (M x N, float32) = A (M x K, bfloat16 bits) times B^T (B: N x K, bfloat16 bits, the weight layout), as one
// prepared primitive; run() executes it with the current OpenMP thread count.
class Bf16Gemm {
 public:
  Bf16Gemm(std::int64_t m, std::int64_t n, std::int64_t k, const std::uint16_t* a, const std::uint16_t* b, float* c);
  ~Bf16Gemm();
  Bf16Gemm(const Bf16Gemm&) = delete;
  Bf16Gemm& operator=(const Bf16Gemm&) = delete;
  void run();
  // oneDNN's name for the implementation it picked, e.g. "brg:avx512_core_amx_bf16".
  std::string implementation() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8kit::bench
