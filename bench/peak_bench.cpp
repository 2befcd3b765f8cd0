// Instruction throughput probes: each runs one instruction over independent accumulators (enough of them to cover
// its latency) in a loop whose operands the compiler cannot fold, and times it. The functions carry their own
// target attributes, so this file needs no ISA flags and each probe runs only where cpu_features() has its ISA.
#include "peak_bench.hpp"

#include <immintrin.h>

#include <chrono>
#include <cstdint>

#include "fp8kit/common/cpu.hpp"
#include "harness.hpp"

namespace fp8kit::bench {
namespace {

constexpr long kIterations = 20'000'000;  // ~0.05-0.2 s per probe and repetition
constexpr long kAmxIterations = 2'000'000;

// Keeps v in a register the compiler must assume changes every iteration.
#define FP8KIT_OPAQUE(v) __asm__ volatile("" : "+v"(v))

template <int kChains>
[[gnu::target("avx2,fma")]] float fma256(long n) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  __m256 a = _mm256_set1_ps(1.0f), b = _mm256_set1_ps(0x1p-30f);
  for (long i = 0; i < n; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(a, b, acc[c]);
    FP8KIT_OPAQUE(b);
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  return lanes[0] + lanes[7];
}

template <int kChains>
[[gnu::target("avx512f")]] float fma512(long n) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0x1p-30f);
  for (long i = 0; i < n; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(a, b, acc[c]);
    FP8KIT_OPAQUE(b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return lanes[0] + lanes[15];
}

template <int kChains>
[[gnu::target("avx512f,avx512bf16")]] float dpbf16(long n) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  __m512i a = _mm512_set1_epi16(0x3F80), b = _mm512_set1_epi16(0x3080);  // bfloat16 1 and 2^-30
  for (long i = 0; i < n; ++i) {
#pragma GCC unroll 16
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], (__m512bh)a, (__m512bh)b);
    FP8KIT_OPAQUE(b);
  }
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  return lanes[0] + lanes[15];
}

// Four accumulator tiles (0-3, 16 x 16 FP32), two left (4-5, 16 x 32 bfloat16) and two right (6-7) operands: the
// 2 x 2 blocking of the AMX GEMM kernel.
struct alignas(64) AmxConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

[[gnu::target("amx-tile,amx-bf16")]] float amx_bf16(long n) {
  AmxConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = 64;
    config.rows[t] = 16;
  }
  alignas(64) static std::uint16_t operand[16 * 32] = {};  // zeros: the products are exact
  alignas(64) static float out[16 * 16];
  _tile_loadconfig(&config);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  for (long i = 0; i < n; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

struct Probe {
  const char* op;
  const char* instruction;
  Isa isa;
  double flops;  // per instruction
  int chains;
  long iterations;
  float (*run)(long);
  std::string (*missing)();
};

std::string missing_avx2() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma ? "" : "avx2/fma";
}
std::string missing_avx512() {
  return cpu_features().avx512f ? "" : "avx512f";
}
std::string missing_bf16() {
  const CpuFeatures& f = cpu_features();
  return !f.avx512f ? "avx512f" : !f.avx512bf16 ? "avx512bf16" : "";
}
std::string missing_amx() {
  return missing_for(Isa::kAmx);
}

constexpr int kChains = 12;  // covers 4-6 cycles of latency at two instructions a cycle

const Probe kProbes[] = {
    {"fp32-fma-256", "vfmadd231ps ymm", Isa::kAvx2, 16, kChains, kIterations, &fma256<kChains>, &missing_avx2},
    {"fp32-fma-512", "vfmadd231ps zmm", Isa::kAvx512, 32, kChains, kIterations, &fma512<kChains>, &missing_avx512},
    {"bf16-dot-512", "vdpbf16ps zmm", Isa::kAvx512Bf16, 64, kChains, kIterations, &dpbf16<kChains>, &missing_bf16},
    {"bf16-amx", "tdpbf16ps", Isa::kAmx, 2.0 * 16 * 16 * 32, 4, kAmxIterations, &amx_bf16, &missing_amx},
};

}  // namespace

std::vector<PeakResult> run_peak_bench(int reps) {
  std::vector<PeakResult> results;
  volatile float sink = 0;
  for (const Probe& p : kProbes) {
    PeakResult r;
    r.op = p.op;
    r.instruction = p.instruction;
    r.isa = std::string(name(p.isa));
    r.flops_per_instruction = p.flops;
    r.chains = p.chains;
    r.skipped = p.missing();
    if (r.skipped.empty()) {
      sink = sink + p.run(p.iterations / 10);  // warm-up: clocks, and the AVX-512/AMX power state
      std::vector<double> seconds;
      for (int i = 0; i < reps; ++i) seconds.push_back(time_once([&] { sink = sink + p.run(p.iterations); }));
      const double instructions = static_cast<double>(p.iterations) * p.chains;
      r.ns_per_instruction = median(seconds) / instructions * 1e9;
      r.gflops = p.flops / r.ns_per_instruction;
    }
    results.push_back(r);
  }
  // The reference: the widest FP32 FMA that ran (what OpenBLAS's sgemm is built on here).
  double fma = 0;
  for (const PeakResult& r : results) {
    if (r.op.starts_with("fp32-fma") && r.gflops > 0) fma = r.gflops;
  }
  for (PeakResult& r : results) r.ratio = fma > 0 && r.gflops > 0 ? r.gflops / fma : 0.0;
  return results;
}

}  // namespace fp8kit::bench
