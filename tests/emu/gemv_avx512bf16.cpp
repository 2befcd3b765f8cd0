// isa-emu blob: the avx512-bf16 GEMV (gemv_dpbf16, src/ops/cpu/mm_avx512bf16.cpp) as gemv() in scaled_mm.cpp calls
// it for one group of left rows. The library functions it reaches outside the file are stubbed: cpu_features()
// (every feature off but VBMI, which the host sets), and the GEMM's helpers, which the GEMV never calls.
#include "freestanding.hpp"
#include "ops/cpu/mm_avx512bf16.cpp"

namespace {
alignas(64) unsigned char features[sizeof(fp8kit::CpuFeatures)];  // zeros: no feature
}  // namespace

namespace fp8kit {
const CpuFeatures& cpu_features() {
  return *reinterpret_cast<const CpuFeatures*>(features);
}
namespace mm_detail {
void decode_to_bf16(const std::uint8_t*, Format, std::int64_t, std::uint16_t*) {
  __builtin_trap();  // the GEMM packing's decode without VBMI
}
void* thread_scratch(std::size_t) {
  __builtin_trap();  // the GEMM driver's buffer
}
}  // namespace mm_detail
}  // namespace fp8kit

// One call's arguments, as the host lays them out (int64 and pointers).
struct GemvArgs {
  std::int64_t format, m, j0, j1, k, kblock;
  const std::uint16_t* x_bf16;
  std::int64_t ldx;
  const std::uint8_t* w;
  const float* sa;
  std::int64_t sa_r_div, sa_r_stride, sa_kb_stride, sa_r0;
  const float* sb;
  std::int64_t sb_r_div, sb_r_stride, sb_kb_stride, sb_r0;
  float* out;
  std::int64_t ldo;
};

extern "C" {
void set_up(const std::uint16_t* bf16_table, int vbmi) {
  emu::set_bf16_table(bf16_table);
  features[offsetof(fp8kit::CpuFeatures, avx512vbmi)] = vbmi != 0;
}
int run_gemv(const GemvArgs* a) {
  using namespace fp8kit::mm_detail;
  GemvInput in;
  in.x_bf16 = reinterpret_cast<const fp8kit::bfloat16*>(a->x_bf16);
  in.ldx = a->ldx;
  const ScaleIndex sa{a->sa, a->sa_r_div, a->sa_r_stride, a->sa_kb_stride, a->sa_r0};
  const ScaleIndex sb{a->sb, a->sb_r_div, a->sb_r_stride, a->sb_kb_stride, a->sb_r0};
  return gemv_dpbf16(static_cast<fp8kit::Format>(a->format), a->m, a->j0, a->j1, a->k, a->kblock, in, a->w, sa, sb,
                     a->out, a->ldo)
             ? 1
             : 0;
}
}
