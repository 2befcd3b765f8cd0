// What this CPU can do (read once with cpuid) and the number of threads bulk operations may use.
#pragma once

#include <string>

namespace fp8kit {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vbmi = false;
  bool avx512bf16 = false;
  std::string brand;  // the processor brand string, e.g. "AMD EPYC 7B13"
};

const CpuFeatures& cpu_features();

// Threads used by bulk operations (default: OpenMP's default, usually the number of cores). n >= 1.
void set_num_threads(int n);
int num_threads();

}  // namespace fp8kit
