// `fp8kit bench gemm`: the FP8 GEMM (scaled_mm_into) against OpenBLAS sgemm, and the FP8 weight-only GEMV
// (fp8_weight_mm) against OpenBLAS sgemv and the read-bandwidth probe, all in the same run. OpenBLAS is loaded
// at run time (dlopen, never linked), with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset so it picks its own
// kernels for this CPU; its core name is part of every result.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness.hpp"

namespace fp8kit::bench {

// One problem: a GEMM (A M x K times the N x K weights B transposed) or a GEMV (the N x K weights times a
// K-vector: m = 1).
struct GemmShape {
  bool gemv = false;
  std::int64_t m = 0, n = 0, k = 0;
  // "gemm:2048x2048x2048", "gemv:8192x8192" (N x K).
  std::string name() const;
};

// gemm:2048, gemm:4096 (cubes), gemm:16x4096x4096, gemm:64x4096x4096 (small M: decode-time shapes),
// gemv:8192x8192, gemv:16384x8192.
std::vector<GemmShape> default_gemm_shapes();

// Repetitions when --reps is not given: 11 for a GEMV, 15 for a GEMM below 1024^3 multiply-adds, 5 below 4096^3,
// 3 from there on.
int default_gemm_reps(const GemmShape& shape);

struct GemmBenchOptions {
  std::vector<GemmShape> shapes = default_gemm_shapes();
  bool bf16_baseline = true;  // time oneDNN's bf16 matmul too, where it is built in
  std::vector<int> threads = {1, 2};
  int reps = 0;  // 0: default_gemm_reps per shape
};

// What was loaded for the baselines.
struct OpenBlasInfo {
  std::string core;     // openblas_get_corename(): "Zen", "Haswell", ...
  std::string config;   // openblas_get_config(): version and build options ("" when the symbol is missing)
  std::string library;  // the file dlopen resolved
  int max_threads = 0;  // the build's MAX_THREADS (from config): the most threads it runs; 0 where config omits it
};

// Loads libopenblas.so.0 once per process (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset first). Throws
// std::runtime_error, one line naming the Debian package to install, when it cannot.
const OpenBlasInfo& load_openblas();

struct GemmResult {
  // "fp8-gemm", "sgemm", "bf16-gemm", "fp8-gemv" (float32 activations), "fp8-gemv-bf16x" (bfloat16 activations),
  // "sgemv", "read-bandwidth"
  std::string op;
  std::string baseline;  // "sgemm" (fp8-gemm), "sgemv" (fp8-gemv); "" for the baseline rows themselves
  std::string isa;       // the ISA level in force while the row was measured (every row)
  std::string library;   // bf16-gemm rows: "oneDNN 2.6.3 (brg:avx512_core_amx_bf16)"; "" otherwise
  std::string path;      // fp8 rows: name(MmPath) the dispatcher took ("gemm", "gemv"); "" otherwise
  std::string kernel;    // fp8 rows: the kernel that ran ("amx-bf16 32x32", ...); "" otherwise
  GemmShape shape;
  int threads = 1;
  int openblas_threads = 0;  // openblas_get_num_threads() while this row was measured
  int reps = 0;
  std::size_t bytes = 0;        // GEMV rows: weight bytes (N*K fp8, 4*N*K sgemv); read-bandwidth: bytes read
  double seconds = 0;           // median
  double gflops = 0;            // 2*M*N*K / seconds (all GEMM and GEMV rows; 0 for read-bandwidth)
  double gbps = 0;              // GEMV and read-bandwidth rows: bytes / seconds / 1e9; 0 for GEMM rows
  double gweights = 0;          // GEMV rows: N*K weights / seconds / 1e9
  double baseline_seconds = 0;  // the baseline's median, 0 for baseline rows
  // fp8-gemm: gflops / sgemm gflops; fp8-gemv: weights per second / sgemv weights per second; 0 for baseline rows.
  double ratio = 0;
  double bf16_ratio = 0;            // fp8-gemm: gflops / bf16-gemm gflops (0 without the BF16 baseline)
  double read_bandwidth_gbps = 0;   // fp8-gemv: the read probe's GB/s in the same rotation
  double read_bandwidth_ratio = 0;  // fp8-gemv: gbps / read_bandwidth_gbps
  // fp8 rows: ||out_fp8 - out_f32||_2 / ||out_f32||_2 against the OpenBLAS result on the unquantized data (the
  // quantization error, a check that both compute the same product); -1 otherwise.
  double rel_diff = -1;
};

// Runs the benchmark (loads OpenBLAS first); `progress(done, total)` after each shape at each thread count.
std::vector<GemmResult> run_gemm_bench(const GemmBenchOptions& options,
                                       const std::function<void(int, int)>& progress = {});

}  // namespace fp8kit::bench
