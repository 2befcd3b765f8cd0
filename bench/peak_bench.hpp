// `fp8kit bench peak`: what one core issues of the arithmetic instructions the GEMM kernels are built on (FP32 FMA
// at 256 and 512 bits, vdpbf16ps, AMX tdpbf16ps), in GFLOP/s on one thread. They bound what a kernel on each level
// can reach: a GEMM ratio to sgemm is read against the ratio of the instructions under it.
#pragma once

#include <string>
#include <vector>

namespace fp8kit::bench {

struct PeakResult {
  std::string op;                    // "fp32-fma-256", "fp32-fma-512", "bf16-dot-512", "bf16-amx"
  std::string instruction;           // "vfmadd231ps ymm", "vfmadd231ps zmm", "vdpbf16ps zmm", "tdpbf16ps"
  std::string isa;                   // the level whose kernels use it
  double flops_per_instruction = 0;  // multiply and add counted as two
  int chains = 0;                    // independent accumulators in flight
  double ns_per_instruction = 0;     // median over the repetitions (0 where skipped)
  double gflops = 0;                 // flops_per_instruction / ns_per_instruction
  double ratio = 0;                  // gflops over the widest FP32 FMA's on this CPU (0 where skipped)
  std::string skipped;               // why it did not run: the missing CPU feature; empty where it ran
};

// Every probe, skipped ones included (with the reason), in the order above.
std::vector<PeakResult> run_peak_bench(int reps);

}  // namespace fp8kit::bench
