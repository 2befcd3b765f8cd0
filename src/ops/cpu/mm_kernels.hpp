// Internal: the matrix-multiply kernels, one table per ISA level (src/ops/cpu/mm_<isa>.cpp), and what they share
// with the driver. Each GEMM kernel owns its tile shape, panel sizes and packing, and declares its results
// contract; scaled_mm.cpp splits the work into panels and tiles, threads and dispatches, and knows no layout.
#pragma once

#include <xmmintrin.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

#include "common/dispatch.hpp"
#include "fp8kit/format/format.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/ops/scaled_mm.hpp"

namespace fp8kit::mm_detail {

// The dequantization scale of output row (of A) or column (of B) r in K block kb:
// data[(r / r_div) * r_stride + kb * kb_stride] (per tensor: both strides 0).
struct ScaleIndex {
  const float* data = nullptr;
  std::int64_t r_div = 1, r_stride = 0, kb_stride = 0;
  std::int64_t r0 = 0;  // row r reads the scales of row r0 + r (a view from row r0 on)
  float at(std::int64_t r, std::int64_t kb) const { return data[((r0 + r) / r_div) * r_stride + kb * kb_stride]; }
  ScaleIndex from_row(std::int64_t r) const {
    ScaleIndex shifted = *this;
    shifted.r0 += r;
    return shifted;
  }
};

// The exact float value of each of the 256 codes of a format (NaN codes decode to NaN).
using DecodeTable = std::array<float, 256>;
const DecodeTable& decode_table(Format f);

// One side of a product as the packers read it: `rows` rows of `k` elements, element (r, kk) at
// [r * ld + kk] (k_contiguous: A, and B as N x K weights) or [kk * ld + r] (B as K x N). FP8 codes (decoded
// exactly), float32 or bfloat16 values.
struct Operand {
  const std::uint8_t* codes = nullptr;
  Format format = Format::e4m3fn;
  const float* f32 = nullptr;
  const bfloat16* bf16 = nullptr;
  std::int64_t rows = 0, k = 0, ld = 0;
  bool k_contiguous = true;

  // Every value is exactly a bfloat16 (FP8 codes or bfloat16 storage), so bfloat16 kernels may take it.
  bool exact_in_bf16() const { return f32 == nullptr; }
  float at(std::int64_t r, std::int64_t kk) const {
    const std::int64_t idx = k_contiguous ? r * ld + kk : kk * ld + r;
    if (codes != nullptr) return decode_table(format)[codes[idx]];
    if (f32 != nullptr) return f32[idx];
    return bf16[idx].to_float();
  }
};

// Packs rows [r0, r0 + rows) x K [k0, k0 + kc) of an operand into the kernel's layout of whole strips of `width`
// rows (mr for the left operand, nr for the right), zero padded in both directions (K to kc_pad = kc rounded up to
// k_align). Strip s starts at dst + s * width * kc_pad elements.
using PackFn = void (*)(const Operand& x, std::int64_t width, std::int64_t r0, std::int64_t rows, std::int64_t k0,
                        std::int64_t kc, void* dst);

// One tile of the output: the left strip (mr rows) times the right strip (nr rows) over the packed K range
// [k_off, k_off + k_len) of panels holding kc_pad K each; c is mr x nr, row stride ldc (column stride 1).
//   accumulate        C[i][j] += sum_k left * right (kBitIdentical kernels continue one FMA chain per output in
//                     increasing k, so a sum split across calls is the uninterrupted one); with `overwrite`,
//                     C[i][j] = the sum from 0 and C is not read
//   scale_accumulate  acc = sum_k left * right from 0; C[i][j] = fma(acc * s_row[i], s_col[j], C[i][j])
using AccumulateFn = void (*)(const void* left, const void* right, std::int64_t kc_pad, std::int64_t k_off,
                              std::int64_t k_len, float* c, std::int64_t ldc, bool overwrite);
using ScaleAccumulateFn = void (*)(const void* left, const void* right, std::int64_t kc_pad, std::int64_t k_off,
                                   std::int64_t k_len, float* c, std::int64_t ldc, const float* s_row,
                                   const float* s_col);

struct GemmKernel {
  std::string_view name;
  KernelContract contract;
  bool bf16_operands;       // takes only operands exact in bfloat16 (FP8 codes, bfloat16); float32 ones go elsewhere
  std::int64_t mr, nr;      // the output tile: mr left rows x nr right rows
  std::int64_t kc, mc, nc;  // K per panel (a multiple of k_align), left rows per panel, right rows per panel
  std::int64_t k_align;     // packed K is padded to a multiple of this; blocked scales need K blocks of it
  std::size_t elem_bytes;   // bytes per packed element
  std::int64_t weights_left_max_m;  // B as N x K and M <= this: run as out^T = B A^T streaming the weights (0: never)
  PackFn pack_left, pack_right;
  AccumulateFn accumulate;
  ScaleAccumulateFn scale_accumulate;
  // The driver prefetches the next output tile's rows while this tile runs. A tile's accumulators start from the
  // output (each K panel adds to the sum so far, in the reference's order), so a tile whose rows are not cached
  // stalls every chain until they arrive: at 4096^3 the output (64 MiB) is read back from memory on each of the 16
  // K panels. On for the kernels it made faster: avx2 (Zen 3), avx512 and avx512-bf16 (Zen 5); the AMX kernel has
  // not been measured with it (docs/gemm.md).
  bool prefetch_next_tile = false;
  void (*start)() = nullptr;   // called by each thread before its first tile (AMX: configure the tiles)
  void (*finish)() = nullptr;  // and after its last (AMX: release the tile state)
  // Optional, for M <= stream_max_m with FP8 weights B (N x K) and unblocked scales: the raw sums out[i][j] =
  // sum_k a[i][k] w[j][k] for weight rows [j0, j1) (a multiple of 16 apart, or up to N), the weights decoded a few K
  // at a time straight into the tiles (no weight panel at all). `x` is the activations packed by pack_right with
  // width 16 over all of K (k_pad = K rounded up to k_align); out has row stride ldo. Brackets its own tile state.
  // Returns false, having done nothing, where it cannot run (the AMX kernel needs VBMI for its decode).
  using StreamFn = bool (*)(const Operand& w, std::int64_t j0, std::int64_t j1, const void* x, std::int64_t m,
                            std::int64_t k_pad, float* out, std::int64_t ldo);
  StreamFn stream_weights = nullptr;
  std::int64_t stream_max_m = 0;
  std::string_view stream_name = {};  // what MmDispatch reports when stream_weights ran
};

// The activation rows of a GEMV: m <= kGemvRows rows of k values (row stride ldx) as float32, and, where the left
// operand is exact in bfloat16, the same rows as bfloat16 (for the kernels that multiply in bfloat16). `rebiased`,
// when not null, is the float32 rows times 2^(127 - bias - c) exactly (bias: the weights' format's; the driver
// checks nothing overflows), which lets a kernel use the FP8 codes' bit patterns as floats without multiplying
// each by 2^(127 - bias); the sums it gets that way are then multiplied by sum_scale = 2^c. For a kernel with
// GemvKernel::lane_chunk set, the float32 rows it reads (rebiased where given, else x) come in that kernel's lane
// order (to_gemv_lane_order), not in k order.
struct GemvInput {
  const float* x = nullptr;
  std::int64_t ldx = 0;
  const bfloat16* x_bf16 = nullptr;
  const float* rebiased = nullptr;
  float sum_scale = 1.0f;
};

// GEMV: output columns [j0, j1) of the rows of x times the FP8 weights w (row j at w + j * k): per K block of
// `kblock`, FP32 partial sums of x[i][k] * decode(w[j][k]), added up per block and scaled as the reference does:
// total = fma(sum * sa(i, kb), sb(j, kb), total); out[i * ldo + j] = total.
// Returns false when it cannot compute these rows within its contract (an Inf or NaN code for the register decode,
// denormals-are-zero set on the calling thread, a left operand it does not take): the driver then recomputes the
// range with the scalar table's kernel, which always succeeds.
inline constexpr std::int64_t kGemvRows = 4;
using GemvFn = bool (*)(Format f, std::int64_t m, std::int64_t j0, std::int64_t j1, std::int64_t k, std::int64_t kblock,
                        const GemvInput& x, const std::uint8_t* w, ScaleIndex sa, ScaleIndex sb, float* out,
                        std::int64_t ldo);

// For the GEMV kernels: run(std::integral_constant<int, kM>{}) with the row count m as a compile-time constant
// (1 to kGemvRows), false for any other m.
template <class Run>
[[gnu::always_inline]] inline bool with_gemv_rows(std::int64_t m, Run&& run) {
  static_assert(kGemvRows == 4, "one case per row count");
  switch (m) {
    case 1:
      return run(std::integral_constant<int, 1>{});
    case 2:
      return run(std::integral_constant<int, 2>{});
    case 3:
      return run(std::integral_constant<int, 3>{});
    case 4:
      return run(std::integral_constant<int, 4>{});
    default:
      return false;
  }
}

// Denormals-are-zero on the calling thread (MXCSR bit 6): the shift-decode GEMVs decline then, since their FP8
// subnormal weights are float subnormals until the rebias multiplies them.
inline bool denormals_are_zero() {
  return (_mm_getcsr() & 0x0040u) != 0;
}

// How the register GEMVs (AVX2, AVX-512 FMA) turn codes into floats: the code sign-extended to 32 bits, shifted
// left by 23 - m and masked with `fields` is the FP8 value times 2^(bias - 127) (FP8 subnormals as float
// subnormals); times the float with bits `rebias_bits` (2^(127 - bias)) it is exact. The codes that trick cannot
// represent are the "special" ones, (code & special_mask) == special_value bytewise: the NaN codes, and e5m2's
// all-ones exponent (Inf and NaN).
struct RegisterDecodeRule {
  std::uint32_t fields;
  std::uint32_t rebias_bits;
  std::uint8_t special_mask, special_value;
};
RegisterDecodeRule register_decode_rule(Format f);

// Where the register GEMVs prefetch their weights (kLocality: into L2 for the shift decodes; into L1 for the two that
// decode through the VBMI tables, which on a Zen 5 read 10-20% faster from DRAM with it, where the shift decodes
// measured slower with it on Zen 4 and Zen 5). A block of kR weight rows is kR * k consecutive bytes that the kernel
// reads as kR streams, `step` bytes of each row per step. The prefetches run one block ahead as a single linear stream:
// at row r of the step at column kk, the byte kk * kR + r * step of the next block, so the next block is in L2 by the
// time this one is done. Measured on a 2-vCPU Zen 4 from DRAM (16384 x 8192, one thread, interleaved with the read
// probe): the AVX512-BF16 GEMV at 0.6x the probe with L1 prefetches 512 bytes ahead in each row, 0.72-0.76x with L2
// prefetches 2048 bytes ahead in each row (1536-2048 the best of those), and ~0.9x one block ahead. Blocks longer than
// kGemvLinearPrefetchMax (two of them would crowd L2) go back to each row's own 2048 bytes ahead. Prefetches never
// fault: past the last row they fetch nothing anyone reads.
inline constexpr std::int64_t kGemvPrefetchBytes = 2048;
inline constexpr std::int64_t kGemvLinearPrefetchMax = std::int64_t{256} << 10;
// __builtin_prefetch's locality: 3 into L1 (prefetcht0), 2 into L2 (prefetcht1).
inline constexpr int kPrefetchToL1 = 3, kPrefetchToL2 = 2;
template <int kR, int kLocality = kPrefetchToL2>
class GemvPrefetch {
 public:
  // The block of rows [j, j + kR) of weights with k bytes per row.
  GemvPrefetch(const std::uint8_t* w, std::int64_t j, std::int64_t k)
      : linear_(kR * k <= kGemvLinearPrefetchMax),
        base_(reinterpret_cast<std::uintptr_t>(w) + static_cast<std::uintptr_t>((j + (linear_ ? kR : 0)) * k)),
        k_(k) {}
  // Before reading `step` bytes of row r at column kk.
  [[gnu::always_inline]] void operator()(std::int64_t kk, int r, std::int64_t step) const {
    const std::uintptr_t at = linear_ ? base_ + static_cast<std::uintptr_t>(kk * kR + r * step)
                                      : base_ + static_cast<std::uintptr_t>(r * k_ + kk + kGemvPrefetchBytes);
    __builtin_prefetch(reinterpret_cast<const void*>(at), 0, kLocality);
  }

 private:
  bool linear_;
  std::uintptr_t base_;
  std::int64_t k_;
};

struct GemvKernel {
  std::string_view name;
  KernelContract contract;
  bool bf16_input = false;  // reads x_bf16 (and declines when it is null)
  GemvFn run;
  // Where not 0, reads x and rebiased in byte-lane order over chunks of this many elements (the bytes of one
  // vector load of codes: 64 for zmm, 32 for ymm; to_gemv_lane_order): the load decodes into four vectors by shifts
  // within each 32-bit lane, code 4i + b landing in lane i of vector b.
  int lane_chunk = 0;
  // Reads GemvInput::rebiased where the driver can make it (the register decodes that use FP8 codes' bits as floats).
  bool rebiased_input = false;
};

// GemvInput::rebiased for the rows x (all of them, in k order) and weights of format `weights` into out, with its
// sum_scale; false (out unspecified) where that cannot be exact: x * 2^(127 - bias - c) must be finite (c > 0 only
// for FP8 left operands, whose products with FP8 weights stay far above the float subnormals after the 2^-c, so the
// kernel's sums are the unscaled ones times 2^-c exactly).
bool rebias_gemv_input(std::span<const float> x, Format weights, bool left_is_fp8, float* out, float& sum_scale);

// The activations for a GEMV kernel with lane_chunk = chunk (4 L elements): m rows of k (row i at x + i * k)
// reordered so that, within each K block of kblock elements, every whole chunk from the block's start (elements c
// to c + 4L - 1) holds x[c + 4i + b] at c + L b + i; the rest of a block (less than a chunk) keeps its order.
void to_gemv_lane_order(const float* x, std::int64_t m, std::int64_t k, std::int64_t kblock, int chunk, float* out);

// The left rows (m x k, row stride k) of an operand that is exact in bfloat16 (a.exact_in_bf16()) as bfloat16, for
// the GEMV kernels that read x_bf16: the same bits as bfloat16::from_float of the exact float32 rows x (which it
// reads only for an operand that is not K-contiguous), FP8 codes decoded straight to bfloat16 by the conversion
// kernels and bfloat16 rows copied (from_float one element at a time cost 0.39 ns per element on a Zen 3, about 3% of
// a 16 x 4096 x 4096 GEMV; the decode 0.10).
void left_rows_bf16(const Operand& a, std::int64_t m, std::int64_t k, const float* x, bfloat16* out);

// The epilogue of one output row, the same arithmetic at every level: v = row[j]; where `sa` is given (the raw
// sums of an unblocked GEMM) v = fma(v * *sa, sb(j, 0), 0), the reference's scaling; then + bias[j] (bias not
// null), the rounding to bfloat16 of bfloat16::from_float (bf16_out); row[j] = v. Returns max |v| over finite v.
using FinishRowFn = float (*)(float* row, std::int64_t n, const float* sa, ScaleIndex sb, const float* bias,
                              bool bf16_out);
float finish_row_scalar(float* row, std::int64_t n, const float* sa, ScaleIndex sb, const float* bias, bool bf16_out);

// A level's kernels. gemm_bf16 / gemv_bf16 run the products whose operands are exact in bfloat16 (every FP8 one);
// null means the level has none and gemm_f32 / gemv_f32 (which take anything) run them.
struct MmKernelTable {
  std::string_view name;
  Isa isa;
  const GemmKernel* gemm_f32;
  const GemmKernel* gemm_bf16;
  const GemvKernel* gemv_f32;
  const GemvKernel* gemv_bf16;
  FinishRowFn finish_row;
  // The largest M the GEMV path takes with gemv_bf16 (left operands exact in bfloat16), kGemvRows rows at a time
  // over the same weight rows; kGemvMaxM where the level's GEMM is the better choice from there on.
  std::int64_t gemv_bf16_max_m = kGemvMaxM;

  // The GEMV kernel for a left operand (exact in bfloat16 or not), and the largest M it takes.
  const GemvKernel& gemv(bool left_exact_in_bf16) const {
    return gemv_bf16 != nullptr && left_exact_in_bf16 ? *gemv_bf16 : *gemv_f32;
  }
  std::int64_t gemv_max_m(bool left_exact_in_bf16) const {
    return gemv_bf16 != nullptr && left_exact_in_bf16 ? gemv_bf16_max_m : kGemvMaxM;
  }
};

// The AVX2 and AVX512-BF16 (no AMX) levels take M up to 16 on the GEMV path: their packed GEMMs decode a whole weight
// panel per call, which does not pay below that (AVX2 on Zen 3: avx2_mm_kernels). AVX512-BF16 on Zen 4, N = K = 4096,
// e4m3fn, 1 / 2 threads: M = 8 40.7 / 74 -> 77 / 131 GFLOP/s, M = 16 47 / 99 -> 113 / 177 (oneDNN bf16: 101-105 /
// 190-198), M = 32 82 / 155 -> 81-89 / 163-167 (no gain there, so 32 stays with the GEMM).
inline constexpr std::int64_t kWideGemvMaxM = 16;
// AVX512-BF16 without AMX goes further, to M = 24, since the GEMV's left rows are 64-byte aligned (docs/gemm.md).
// Zen 5, N = K = 4096, e4m3fn, three alternations, 1 / 2 threads, GFLOP/s: M = 17 GEMV 165-166 / 295-338 against the
// weights-left GEMM's 112-125 / 210-230; M = 24 174-183 / 343-365 against 155-170 / 292-315; M = 28-32 the GEMM is
// ahead (198-215 against 172-182 on one thread).
inline constexpr std::int64_t kAvx512Bf16GemvMaxM = 24;

// Each level's kernels: constant objects in its mm_<isa>.cpp (constinit: no code of an ISA-flagged file runs until
// its level is dispatched). mm_tables.cpp, compiled for no particular ISA, composes them into the tables.
extern const GemmKernel kScalarGemm, kAvx2Gemm, kAvx512Gemm, kAvx512Bf16Gemm, kAmxGemm;
extern const GemvKernel kScalarGemv, kAvx2Gemv, kAvx512Gemv, kAvx512VbmiGemv, kAvx512Bf16Gemv;
float finish_row_avx2(float* row, std::int64_t n, const float* sa, ScaleIndex sb, const float* bias, bool bf16_out);
float finish_row_avx512(float* row, std::int64_t n, const float* sa, ScaleIndex sb, const float* bias, bool bf16_out);

const MmKernelTable& scalar_mm_kernels();
const MmKernelTable& avx2_mm_kernels();
const MmKernelTable& avx512_mm_kernels();
const MmKernelTable& avx512bf16_mm_kernels();
const MmKernelTable& amx_mm_kernels();
const detail::IsaTables<MmKernelTable>& mm_tables();

// For the kernels in ISA-flagged files, which must not instantiate library templates (std::vector, fp8kit::Error,
// ...): the linker keeps one copy of each such weak function for the whole library and may pick the one compiled
// for AVX-512, which the rest of the library then runs on any CPU. A per-thread, 64-byte aligned scratch buffer of
// at least `bytes` (valid until the thread's next call), and FP8 codes to bfloat16 through the conversion kernels.
void* thread_scratch(std::size_t bytes);
// A 64-byte aligned scratch buffer that only grows (one per thread and use: the GEMM driver's packed panels, and
// thread_scratch's; one per call for the GEMV driver's left rows). get() throws fp8kit::Error when it cannot allocate,
// and allocates again on the next call.
class ScratchBuffer {
 public:
  ScratchBuffer() = default;
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  void* get(std::size_t bytes);

 private:
  void* data_ = nullptr;
  std::size_t size_ = 0;
};
void decode_to_bf16(const std::uint8_t* codes, Format format, std::int64_t n, std::uint16_t* out);
inline const MmKernelTable& active_mm_kernels() {
  return mm_tables().active();
}

// The float32 strip packing the FMA kernels share: strip s, dst[(s * kc + kk) * width + i] = x(r0 + s * width + i,
// k0 + kk), zero padded (k-major, so a micro-kernel reads `width` values per k).
void pack_f32_strips(const Operand& x, std::int64_t width, std::int64_t r0, std::int64_t rows, std::int64_t k0,
                     std::int64_t kc, void* dst);

// The bfloat16 packing of the AVX512-BF16 and AMX kernels (mm_avx512bf16.cpp), for operands exact in bfloat16:
//   rows  strip s: `width` rows of kc_pad values, row-major (row i at dst + (s * width + i) * kc_pad)
//   vnni  strip s: width / 16 column groups of 16; group g at dst + (s * width + 16 g) * kc_pad holds, for each
//         K pair p, the 16 rows' (x(r, 2p), x(r, 2p + 1)) side by side: [kc_pad / 2][16][2] (the layout of
//         vdpbf16ps operands and AMX B tiles)
// kc_pad = kc rounded up to 32. FP8 codes are decoded exactly (all 256 codes of every format are bfloat16 values).
void pack_bf16_rows(const Operand& x, std::int64_t width, std::int64_t r0, std::int64_t rows, std::int64_t k0,
                    std::int64_t kc, void* dst);
void pack_bf16_vnni(const Operand& x, std::int64_t width, std::int64_t r0, std::int64_t rows, std::int64_t k0,
                    std::int64_t kc, void* dst);
inline constexpr std::int64_t kBf16KAlign = 32;

}  // namespace fp8kit::mm_detail
