// Scaled quantization at every granularity: block amax -> one scale per block (the scale formula, or E8M0 for
// MX) -> encode each block's row segments with the conversion kernels; dequantization; diagnostics.
#include "fp8kit/scaling/quantize.hpp"

#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cmath>

#include "common/parallel.hpp"
#include "cpu/amax_kernels.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/scaling/scale_inline.hpp"

namespace fp8kit {

// ---------------------------------------------------------------- granularity

std::string Granularity::name() const {
  switch (kind) {
    case Kind::kTensor:
      return "tensor";
    case Kind::kRow:
      return "row";
    case Kind::kColumn:
      return "col";
    case Kind::kBlock:
      return "block:" + std::to_string(block_rows) + "x" + std::to_string(block_cols);
    case Kind::kMx:
      return "mx" + std::to_string(block_cols) + (mx_mode == MxScaleMode::kRceil ? "-rceil" : "");
  }
  return "?";
}

std::optional<Granularity> Granularity::parse(std::string_view text) {
  if (text == "tensor") return tensor();
  if (text == "row" || text == "channel") return row();
  if (text == "col" || text == "column") return column();
  if (text == "mx32" || text == "mx32-floor") return mx(MxScaleMode::kFloor);
  if (text == "mx32-rceil") return mx(MxScaleMode::kRceil);
  constexpr std::string_view kBlock = "block:";
  if (text.substr(0, kBlock.size()) == kBlock) {
    const std::string_view shape = text.substr(kBlock.size());
    const std::size_t x = shape.find('x');
    if (x == std::string_view::npos) return std::nullopt;
    std::int64_t r = 0, c = 0;
    const auto [pr, er] = std::from_chars(shape.data(), shape.data() + x, r);
    const auto [pc, ec] = std::from_chars(shape.data() + x + 1, shape.data() + shape.size(), c);
    if (er != std::errc() || ec != std::errc() || pr != shape.data() + x || pc != shape.data() + shape.size()) {
      return std::nullopt;
    }
    if (r < 1 || c < 1 || r > kMaxBlockSide || c > kMaxBlockSide) return std::nullopt;
    return block(r, c);
  }
  return std::nullopt;
}

namespace {
std::int64_t checked_block_side(const Granularity& g, std::int64_t side) {
  FP8KIT_CHECK_KIND(side >= 1 && side <= Granularity::kMaxBlockSide, ErrorKind::kInvalidArgument, "granularity ",
                    g.kind == Granularity::Kind::kMx ? "mx" : "block", " with a ", g.block_rows, "x", g.block_cols,
                    " block: each side must be 1..", Granularity::kMaxBlockSide,
                    " (make it with Granularity::block(rows, cols) or parse(\"block:RxC\"))");
  return side;
}
}  // namespace

std::int64_t Granularity::rows_per_block(std::int64_t rows) const {
  switch (kind) {
    case Kind::kTensor:
    case Kind::kColumn:
      return std::max<std::int64_t>(rows, 1);
    case Kind::kRow:
    case Kind::kMx:
      return 1;
    case Kind::kBlock:
      return checked_block_side(*this, block_rows);
  }
  return 1;
}

std::int64_t Granularity::cols_per_block(std::int64_t cols) const {
  switch (kind) {
    case Kind::kTensor:
    case Kind::kRow:
      return std::max<std::int64_t>(cols, 1);
    case Kind::kColumn:
      return 1;
    case Kind::kBlock:
    case Kind::kMx:
      return checked_block_side(*this, block_cols);
  }
  return 1;
}

// ---------------------------------------------------------------- MX scales

namespace {
// Per element format, computed once (scale_inline.hpp's mx_constants).
using scale_detail::MxConstants;
constexpr auto kMxConstants = [] {
  std::array<MxConstants, kAllFormats.size()> c{};
  for (Format f : kAllFormats) c[static_cast<std::size_t>(f)] = scale_detail::mx_constants(f);
  return c;
}();
static_assert(kMxConstants[static_cast<std::size_t>(Format::e4m3fn)].emax_elem == 8);
static_assert(kMxConstants[static_cast<std::size_t>(Format::e5m2)].emax_elem == 15);
}  // namespace

void check_element_format(Format format, const char* who) {
  FP8KIT_CHECK(format != Format::e8m0fnu, who,
               ": e8m0fnu is MX's scale format (unsigned powers of two, no zero) and holds no quantized values; "
               "quantize into e4m3fn, e5m2, e4m3fnuz or e5m2fnuz");
}

std::uint8_t mx_scale_code(float amax, Format element_format, MxScaleMode mode) {
  const MxConstants& k = kMxConstants[static_cast<std::size_t>(element_format)];
  return scale_detail::mx_code(amax, k.emax_elem, k.max_reciprocal, mode == MxScaleMode::kRceil);
}

namespace {
using scale_detail::pow2f;
}  // namespace

float mx_scale_value(std::uint8_t code) {
  return scale_detail::mx_value(code);
}

namespace {

// Narrow blocks (single columns, tiny blocks) go element by element; wider ones through the SIMD kernels.
constexpr std::int64_t kKernelMinRun = 16;

void check_shape(MatrixRef x, const Granularity& g) {
  x.element<float>("quantize");
  // The block's sides, checked where the block grid is asked for (Granularity::rows_per_block / cols_per_block).
  (void)g.rows_per_block(x.rows);
  (void)g.cols_per_block(x.cols);
}

}  // namespace

// ---------------------------------------------------------------- quantize / dequantize

namespace {

// The quantization multiplier and dequantization scale of one block from its amax.
void block_scale(float amax, const QuantizeOptions& options, ScaledTensor& q, std::vector<float>& multiplier,
                 std::size_t b) {
  if (options.granularity.kind == Granularity::Kind::kMx) {
    const std::uint8_t code = mx_scale_code(amax, options.format, options.granularity.mx_mode);
    q.scale_e8m0[b] = code;
    q.scale_inv[b] = mx_scale_value(code);
    multiplier[b] = code == 0xFF ? q.scale_inv[b] : pow2f(127 - code);
  } else {
    multiplier[b] = compute_scale(amax, options.format, options.scale);
    q.scale_inv[b] = dequantization_scale(multiplier[b]);
  }
}

// The MX scales of blocks [b0, b0 + n) from their amaxes (multiplier[b] holds block b's amax and becomes its
// multiplier), as block_scale gives them. When every amax is a normal float (and, for RCEIL, amax / fp8_max too)
// the code is integer arithmetic on the exponent field, a loop the compiler vectorizes; otherwise (zero,
// subnormal, Inf or NaN blocks) block_scale block by block.
void mx_block_scales(std::size_t b0, std::size_t n, const QuantizeOptions& options, ScaledTensor& q,
                     std::vector<float>& multiplier) {
  const MxConstants& k = kMxConstants[static_cast<std::size_t>(options.format)];
  const bool rceil = options.granularity.mx_mode == MxScaleMode::kRceil;
  float* amax_and_multiplier = multiplier.data() + b0;
  // Two loops the compiler vectorizes: the codes (and whether every amax qualifies), then the scales and bytes.
  thread_local std::vector<std::uint32_t> scratch;
  scratch.resize(n);
  std::uint32_t* __restrict code_bits = scratch.data();
  const float* amax = amax_and_multiplier;
  std::uint32_t all_normal = 1;
  if (rceil) {
    for (std::size_t b = 0; b < n; ++b) {
      const float a = std::fabs(amax[b]);
      const std::uint32_t bits = std::bit_cast<std::uint32_t>(a * k.max_reciprocal);
      all_normal &= static_cast<std::uint32_t>((bits >> 23) - 1u < 254u);  // and amax itself below Inf/NaN
      all_normal &= static_cast<std::uint32_t>(std::bit_cast<std::uint32_t>(a) < 0x7F800000u);
      const std::uint32_t code = (bits >> 23) + ((bits & 0x7FFFFFu) != 0 ? 1u : 0u);
      code_bits[b] = code < 254u ? code : 254u;
    }
  } else {
    for (std::size_t b = 0; b < n; ++b) {
      const std::uint32_t field = (std::bit_cast<std::uint32_t>(amax[b]) >> 23) & 0xFFu;
      all_normal &= static_cast<std::uint32_t>(field - 1u < 254u);  // rejects zero, subnormals, Inf and NaN
      const auto code = static_cast<std::int32_t>(field) - k.emax_elem;
      code_bits[b] = static_cast<std::uint32_t>(std::max(0, std::min(code, 254)));
    }
  }
  if (all_normal == 0) {
    for (std::size_t b = b0; b < b0 + n; ++b) block_scale(multiplier[b], options, q, multiplier, b);
    return;
  }
  constexpr std::uint32_t kPow2Minus127 = 0x00400000u;  // 2^-127, a float subnormal
  {
    float* __restrict multiplier = amax_and_multiplier;  // in this block the only access to the amax slots
    float* __restrict inverse = q.scale_inv.data() + b0;
    std::uint8_t* __restrict bytes = q.scale_e8m0.data() + b0;
    for (std::size_t b = 0; b < n; ++b) {
      const std::uint32_t c = code_bits[b];
      bytes[b] = static_cast<std::uint8_t>(c);
      multiplier[b] = std::bit_cast<float>(c != 254 ? (254u - c) << 23 : kPow2Minus127);
      inverse[b] = std::bit_cast<float>(c != 0 ? c << 23 : kPow2Minus127);
    }
  }
}

// The scales of blocks [b0, b0 + n) from their amaxes by the scale formula (multiplier[b] holds block b's amax and
// becomes its multiplier), as block_scale gives them. With no margin and no power-of-two rounding, and every amax
// finite and, after epsilon, positive and finite, compute_scale is one correctly rounded division, capped at FLT_MAX
// (and never 0: the smallest fp8_max over the largest float is a normal float): a loop the compiler vectorizes
// (divisions included, as correctly rounded as the scalar ones); otherwise block_scale block by block.
void formula_block_scales(std::size_t b0, std::size_t n, const QuantizeOptions& options, ScaledTensor& q,
                          std::vector<float>& multiplier) {
  const float epsilon = options.scale.epsilon;
  float* amax_and_multiplier = multiplier.data() + b0;
  bool simple = options.scale.margin == 0 && options.scale.rounding == ScaleRounding::kExact;
  if (simple) {
    std::uint32_t ok = 1;
    for (std::size_t b = 0; b < n; ++b) {
      const float a = std::fabs(amax_and_multiplier[b]);
      const float clamped = std::max(a, epsilon);
      ok &= static_cast<std::uint32_t>(std::bit_cast<std::uint32_t>(a) < 0x7F800000u) &
            static_cast<std::uint32_t>(clamped > 0.0f) &
            static_cast<std::uint32_t>(clamped < std::numeric_limits<float>::infinity());
    }
    simple = ok != 0;
  }
  if (!simple) {
    for (std::size_t b = 0; b < n; ++b) block_scale(multiplier[b0 + b], options, q, multiplier, b0 + b);
    return;
  }
  const auto fp8_max = static_cast<float>(max_finite(options.format));
  {
    float* __restrict scales = amax_and_multiplier;  // in this block the only access to the amax slots
    float* __restrict scale_inv = q.scale_inv.data() + b0;
    for (std::size_t b = 0; b < n; ++b) {
      const float scale = fp8_max / std::max(std::fabs(scales[b]), epsilon);
      scales[b] = scale < std::numeric_limits<float>::max() ? scale : std::numeric_limits<float>::max();
    }
    for (std::size_t b = 0; b < n; ++b) scale_inv[b] = dequantization_scale(scales[b]);
  }
}

}  // namespace

namespace {

// What quantizing x into q lost: q dequantized and compared with x element by element. `multiplier` holds each
// block's quantization multiplier (row-major over q's block grid), `total` the amax and non-finite counts of x.
QuantDiagnostics measure(MatrixRef x, const ScaledTensor& q, const std::vector<float>& multiplier,
                         const AmaxResult& total) {
  const std::int64_t br = q.block_rows(), bc = q.block_cols(), grid_cols = q.grid_cols();
  QuantDiagnostics d;
  d.amax = total.amax;
  d.count = q.data.size();
  d.nonfinite_count = total.nan_count + total.inf_count;
  if (x.rows == 0 || x.cols == 0) {  // nothing to measure (and no pass over an empty matrix's rows)
    d.exact = true;
    return d;
  }
  std::vector<float> back(q.data.size());
  dequantize(q, back);
  // Saturated (clamped, or Inf/NaN without saturation): the scaled value is past what rounding brings back
  // to the largest finite code, i.e. at or above the overflow threshold the encoder uses.
  const float threshold = overflow_threshold(q.format);
  double signal = 0.0, noise = 0.0;
  std::uint64_t lost = 0;  // finite inputs that came back NaN or Inf
  for (std::int64_t r = 0; r < x.rows; ++r) {
    const float* row = x.row<float>(r);
    for (std::int64_t c = 0; c < x.cols; ++c) {
      const std::size_t i = static_cast<std::size_t>(r * x.cols + c);
      const double xi = row[c];
      if (!std::isfinite(xi)) continue;
      const float scale = multiplier[static_cast<std::size_t>((r / br) * grid_cols + c / bc)];
      if (std::fabs(row[c] * scale) >= threshold) ++d.saturated_count;
      const double dq = back[i];
      if (xi != 0.0) {
        ++d.nonzero_finite;
        if (dq == 0.0) ++d.underflow_count;
      }
      if (!std::isfinite(dq)) {
        ++lost;  // not exact, whatever else was counted (overflow without saturation is counted above too)
        continue;
      }
      const double err = std::fabs(xi - dq);
      signal += xi * xi;
      noise += err * err;
      d.max_abs_error = std::max(d.max_abs_error, err);
      if (xi != 0.0) d.max_rel_error = std::max(d.max_rel_error, err / std::fabs(xi));
    }
  }
  d.exact = noise == 0.0 && d.saturated_count == 0 && lost == 0;
  if (signal > 0.0 && noise > 0.0) d.sqnr_db = 10.0 * std::log10(signal / noise);
  return d;
}

}  // namespace

namespace {

// The amax of all of x: one threaded pass when its rows are contiguous, else block by block over the rows.
AmaxResult amax_of(MatrixRef x) {
  if (x.contiguous()) return amax(std::span<const float>(x.row<float>(0), static_cast<std::size_t>(x.numel())));
  float all = 0.0f;
  AmaxResult total;
  amax_blocks(x, std::max<std::int64_t>(x.rows, 1), std::max<std::int64_t>(x.cols, 1), std::span<float>(&all, 1),
              &total);
  return total;
}

// codes = encode(x * options.scale) for all of x: one threaded encode when its rows are contiguous, else row by row.
void cast_rows(MatrixRef x, std::uint8_t* codes, const CastOptions& options) {
  const auto n = static_cast<std::size_t>(x.numel());
  if (x.contiguous()) {
    cast_to_fp8(std::span<const float>(x.row<float>(0), n), std::span<std::uint8_t>(codes, n), options);
    return;
  }
  const auto cols = static_cast<std::size_t>(x.cols);
  for (std::int64_t r = 0; r < x.rows; ++r) {
    cast_to_fp8(std::span<const float>(x.row<float>(r), cols), std::span<std::uint8_t>(codes + r * x.cols, cols),
                options);
  }
}

}  // namespace

void widen_rows(MatrixRef x, std::int64_t r0, std::int64_t rows, float* out) {
  FP8KIT_CHECK((x.dtype == DType::bfloat16 || x.dtype == DType::float16) && r0 >= 0 && rows >= 0 && r0 + rows <= x.rows,
               "widen_rows: rows ", r0, " to ", r0 + rows, " of a ", x.rows, "-row ", name(x.dtype),
               " matrix (a bfloat16 or float16 one, rows within it)");
  FP8KIT_CHECK(out != nullptr || rows * x.cols == 0, "widen_rows: null output for ", rows, "x", x.cols, " values");
  for (std::int64_t r = 0; r < rows; ++r) {
    float* o = out + r * x.cols;
    if (x.dtype == DType::bfloat16) {
      const auto* in = reinterpret_cast<const std::uint16_t*>(x.row<bfloat16>(r0 + r));
      for (std::int64_t c = 0; c < x.cols; ++c) o[c] = std::bit_cast<float>(static_cast<std::uint32_t>(in[c]) << 16);
    } else {
      const float16* in = x.row<float16>(r0 + r);
      for (std::int64_t c = 0; c < x.cols; ++c) o[c] = in[c].to_float();
    }
  }
}

ScaledTensor quantize(MatrixRef x, const QuantizeOptions& options, QuantDiagnostics* diagnostics) {
  ScaledTensor q;
  quantize_into(x, options, q, diagnostics);
  return q;
}

namespace {

// q's description of a quantization of x, and its scale buffers sized (not its codes).
void describe(MatrixRef x, const QuantizeOptions& options, ScaledTensor& q) {
  q.original_shape.reset();
  q.original_dtype = x.dtype;
  q.format = options.format;
  q.overflow = options.overflow;
  q.granularity = options.granularity;
  q.rows = x.rows;
  q.cols = x.cols;
  const auto blocks = static_cast<std::size_t>(q.grid_rows() * q.grid_cols());
  q.scale_inv.resize(blocks);
  q.scale_e8m0.resize(options.granularity.kind == Granularity::Kind::kMx ? blocks : 0);
}

// The float32 quantization: q described (describe()), the codes written to `codes` (rows x cols, row-major; none
// when it is null: the scales alone). With `diagnostics`, q.data must be the codes. `input`, when given, receives
// x's amax and non-finite counts (from the amax pass, at no extra cost).
void quantize_float(MatrixRef x, const QuantizeOptions& options, ScaledTensor& q, std::uint8_t* codes,
                    QuantDiagnostics* diagnostics, AmaxResult* input = nullptr) {
  const std::int64_t br = q.block_rows(), bc = q.block_cols();
  const std::int64_t grid_rows = q.grid_rows(), grid_cols = q.grid_cols();
  const auto blocks = static_cast<std::size_t>(grid_rows * grid_cols);
  std::vector<float> multiplier(blocks);
  const SegmentEncoder encoder(options.format, options.overflow);
  AmaxResult total;

  if (x.rows == 0 || x.cols == 0) {
    // No element, so no block (an empty matrix's grid is empty), and no pass over its rows: it may have 2^62.
  } else if (blocks == 1) {
    // One scale for everything: a threaded amax pass, then one threaded scaled encode (two passes over x).
    total = amax_of(x);
    block_scale(total.amax, options, q, multiplier, 0);
    if (codes != nullptr)
      cast_rows(x, codes, CastOptions{options.format, options.overflow, Rounding::kNearestEven, multiplier[0]});
  } else {
    // Fused, block row by block row: the amax of its blocks, their scales, then the encode while the block
    // row is still in cache. Threads split the block rows.
    const EncodeSpec spec{options.format, options.overflow};
    std::vector<AmaxResult> parts(static_cast<std::size_t>(grid_rows));
    const bool segmented = bc % 32 == 0;
    const auto amax_segments = scaling_detail::active_amax_kernels().amax_segments;
    const bool parallel = x.numel() >= detail::kParallelStreamElements && grid_rows > 1;
    // Large outputs take streaming stores where the encoder writes whole 64-byte lines (the AVX-512 one): a plain
    // store first reads the line it writes, 6 bytes of DRAM traffic per element instead of 5 (docs/scaling.md,
    // "Streaming stores, measured again"). The AVX2 encoder's 32-byte ones measured no faster.
    const Stores stores =
        active_isa() >= Isa::kAvx512 ? stores_for(static_cast<std::size_t>(x.numel())) : Stores::kCached;
    auto scales_of = [&](std::int64_t gr) { return multiplier.data() + gr * grid_cols; };
    // Segmented blocks (a multiple of 32 columns): row r's block maxima into its band's amax slots (the band's
    // first row writes them).
    auto amax_row_into = [&](std::int64_t r, float* band_scales, bool first_row, AmaxResult& part) {
      const float* row = x.row<float>(r);
      if (first_row) {
        amax_segments(row, static_cast<std::size_t>(x.cols), static_cast<std::size_t>(bc), band_scales, part);
        return;
      }
      thread_local std::vector<float> row_amax;
      row_amax.resize(static_cast<std::size_t>(grid_cols));
      amax_segments(row, static_cast<std::size_t>(x.cols), static_cast<std::size_t>(bc), row_amax.data(), part);
      for (std::int64_t gc = 0; gc < grid_cols; ++gc)
        band_scales[gc] = std::max(band_scales[gc], row_amax[static_cast<std::size_t>(gc)]);
    };
    // Band gr's amax slots become its multipliers, and its dequantization scales are set.
    auto band_scales_from_amax = [&](std::int64_t gr) {
      const auto b0 = static_cast<std::size_t>(gr * grid_cols);
      (options.granularity.kind == Granularity::Kind::kMx ? mx_block_scales : formula_block_scales)(
          b0, static_cast<std::size_t>(grid_cols), options, q, multiplier);
    };
    auto encode_row = [&](std::int64_t r, const float* band_scales, std::size_t prefetch_ahead_bytes) {
      if (codes == nullptr) return;
      const auto cols = static_cast<std::size_t>(x.cols);
      encoder.encode_segments(std::span<const float>(x.row<float>(r), cols),
                              std::span<std::uint8_t>(codes + r * x.cols, cols), static_cast<std::size_t>(bc),
                              std::span<const float>(band_scales, static_cast<std::size_t>(grid_cols)),
                              prefetch_ahead_bytes, stores);
    };
    // Work on the threads that can throw (the block amaxes' checks, the scale formula's, a scratch buffer): the
    // first error is the caller's, after the region.
    detail::RegionErrors errors;
    if (segmented && br > 1) {
      // Tall bands (128x128: 2 MiB of float32 each) do not stay in L1, and the encode's second read comes from
      // L2: each thread encodes row r of its band while the amax pass reads row r of its next band, so the
      // memory reads of one overlap the compute of the other, with one band's worth of rows live at any time.
#pragma omp parallel num_threads(::fp8kit::num_threads()) if (parallel)
      errors.guard([&] {
        const auto threads = static_cast<std::int64_t>(omp_get_num_threads());
        const auto thread = static_cast<std::int64_t>(omp_get_thread_num());
        const std::int64_t first = grid_rows * thread / threads, last = grid_rows * (thread + 1) / threads;
        auto rows_of = [&](std::int64_t gr) { return std::min(x.rows, (gr + 1) * br) - gr * br; };
        // The encode of row r prefetches row r of the next band, which the amax pass reads right after it.
        const std::size_t prefetch = static_cast<std::size_t>(br * x.stride()) * sizeof(float);
        if (first < last) {
          for (std::int64_t r = 0; r < rows_of(first); ++r)
            amax_row_into(first * br + r, scales_of(first), r == 0, parts[static_cast<std::size_t>(first)]);
          band_scales_from_amax(first);
        }
        for (std::int64_t gr = first; gr < last; ++gr) {
          const std::int64_t next_rows = gr + 1 < last ? rows_of(gr + 1) : 0;
          for (std::int64_t r = 0; r < rows_of(gr); ++r) {
            encode_row(gr * br + r, scales_of(gr), prefetch);
            if (r < next_rows)
              amax_row_into((gr + 1) * br + r, scales_of(gr + 1), r == 0, parts[static_cast<std::size_t>(gr + 1)]);
          }
          if (next_rows > 0) band_scales_from_amax(gr + 1);
        }
      });
    } else {
      // Bands are equal in size: a static split costs nothing per band (bands can be a single short row).
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (parallel)
      for (std::int64_t gr = 0; gr < grid_rows; ++gr) {
        errors.guard([&] {
          const std::int64_t row_begin = gr * br, row_end = std::min(x.rows, row_begin + br);
          const MatrixRef band(x.row<float>(row_begin), row_end - row_begin, x.cols, x.stride());
          float* band_scales = scales_of(gr);
          AmaxResult& part = parts[static_cast<std::size_t>(gr)];
          if (segmented) {
            // Bands of one row (rows, 1x128, MX): one amax call and one encode call, each block a segment. The row is
            // in L1 for the encode, which then prefetches the next band for the amax pass that reads it next (+10-20%
            // at 2 threads).
            amax_row_into(row_begin, band_scales, true, part);
          } else {
            amax_blocks(band, br, bc, std::span<float>(band_scales, static_cast<std::size_t>(grid_cols)), &part);
          }
          band_scales_from_amax(gr);
          if (segmented) {
            encode_row(row_begin, band_scales, static_cast<std::size_t>(x.stride()) * sizeof(float));
            return;
          }
          for (std::int64_t r = row_begin; r < row_end && codes != nullptr; ++r) {
            const float* in_row = x.row<float>(r);
            std::uint8_t* out_row = codes + r * x.cols;
            for (std::int64_t gc = 0; gc < grid_cols; ++gc) {
              const std::int64_t c0 = gc * bc, c1 = std::min(x.cols, c0 + bc);
              const float scale = band_scales[gc];
              const float* in = in_row + c0;
              std::uint8_t* out = out_row + c0;
              if (c1 - c0 >= kKernelMinRun) {
                const auto n = static_cast<std::size_t>(c1 - c0);
                encoder.encode(std::span<const float>(in, n), std::span<std::uint8_t>(out, n), scale);
              } else {
                for (std::int64_t c = 0; c < c1 - c0; ++c) out[c] = encode(scale == 1.0f ? in[c] : in[c] * scale, spec);
              }
            }
          }
        });
      }
    }
    errors.rethrow();
    for (const AmaxResult& part : parts) total.merge(part);
  }
  if (input != nullptr) *input = total;

  if (diagnostics != nullptr) {
    *diagnostics = measure(x, q, multiplier, total);
    // An empty matrix has no block: its scale is the formula's for amax 0 (1, Transformer Engine's guard).
    if (options.granularity.kind == Granularity::Kind::kTensor) {
      diagnostics->scale = multiplier.empty() ? 1.0f : multiplier[0];
    }
  }
}

// bfloat16 / float16 matrices without a float32 copy of the whole: per tensor, an amax pass over rows widened a
// chunk at a time, then the bulk 16-bit scaled encode; per row, block and MX, chunks of whole block rows (about
// kChunkElements) widened into a per-thread buffer and quantized by quantize_float, the chunks split over threads.
// The blocks never cross a chunk, so the result is quantize_float's on the widened matrix, bit for bit. Per column
// (one block row of all the rows) widens the whole matrix.
void quantize_narrow(MatrixRef x, const QuantizeOptions& options, ScaledTensor& q, std::uint8_t* codes,
                     AmaxResult* input) {
  constexpr std::int64_t kChunkElements = std::int64_t{1} << 18;  // 1 MiB of float32
  const std::int64_t br = q.block_rows(), grid_cols = q.grid_cols();
  const bool parallel = x.numel() >= detail::kParallelStreamElements;
  if (options.granularity.kind == Granularity::Kind::kColumn || x.cols == 0 || x.rows == 0) {
    std::vector<float> all(static_cast<std::size_t>(x.numel()));
    widen_rows(x, 0, x.rows, all.data());
    quantize_float(MatrixRef{all.data(), x.rows, x.cols}, options, q, codes, nullptr, input);
    return;
  }
  const std::int64_t band_rows =
      options.granularity.kind == Granularity::Kind::kTensor ? 1 : br;  // rows that share a block
  const std::int64_t chunk_rows = band_rows * std::max<std::int64_t>(1, kChunkElements / (band_rows * x.cols));
  const std::int64_t chunks = ceil_div(x.rows, chunk_rows);
  auto rows_of = [&](std::int64_t c) { return std::min(x.rows, (c + 1) * chunk_rows) - c * chunk_rows; };
  std::vector<AmaxResult> parts(static_cast<std::size_t>(chunks));  // each chunk's amax and non-finite counts
  auto merged = [&parts] {
    AmaxResult total;  // amax over the finite elements, as amax_of gives it
    for (const AmaxResult& part : parts) total.merge(part);
    return total;
  };
  detail::RegionErrors errors;  // the chunks' buffers are allocations: an error is the caller's
  if (options.granularity.kind == Granularity::Kind::kTensor) {
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (parallel && chunks > 1)
    for (std::int64_t c = 0; c < chunks; ++c) {
      errors.guard([&] {
        thread_local std::vector<float> rows;
        rows.resize(static_cast<std::size_t>(rows_of(c) * x.cols));
        widen_rows(x, c * chunk_rows, rows_of(c), rows.data());
        parts[static_cast<std::size_t>(c)] = amax(rows);
      });
    }
    errors.rethrow();
    const AmaxResult total = merged();
    if (input != nullptr) *input = total;
    std::vector<float> multiplier(1);
    block_scale(total.amax, options, q, multiplier, 0);
    if (codes == nullptr) return;
    const CastOptions cast{options.format, options.overflow, Rounding::kNearestEven, multiplier[0]};
    const auto n = static_cast<std::size_t>(x.numel());
    const auto cols = static_cast<std::size_t>(x.cols);
    for (std::int64_t r = 0; r < (x.contiguous() ? 1 : x.rows); ++r) {
      const std::size_t len = x.contiguous() ? n : cols;
      std::uint8_t* out = codes + r * x.cols;
      if (x.dtype == DType::bfloat16) {
        cast_to_fp8(std::span<const bfloat16>(x.row<bfloat16>(r), len), std::span<std::uint8_t>(out, len), cast);
      } else {
        cast_to_fp8(std::span<const float16>(x.row<float16>(r), len), std::span<std::uint8_t>(out, len), cast);
      }
    }
    return;
  }
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (parallel && chunks > 1)
  for (std::int64_t c = 0; c < chunks; ++c) {
    errors.guard([&] {
      thread_local std::vector<float> rows;
      // The chunk's scales: tensor storage, counted (and limited) as the call's temporaries, freed with the chunk (a
      // thread_local one would stay counted for as long as the thread lives).
      ScaledTensor part;
      const std::int64_t r0 = c * chunk_rows, n = rows_of(c);
      rows.resize(static_cast<std::size_t>(n * x.cols));
      widen_rows(x, r0, n, rows.data());
      const MatrixRef chunk{rows.data(), n, x.cols};
      describe(chunk, options, part);
      quantize_float(chunk, options, part, codes == nullptr ? nullptr : codes + r0 * x.cols, nullptr,
                     &parts[static_cast<std::size_t>(c)]);
      const auto b0 = static_cast<std::size_t>((r0 / br) * grid_cols);
      std::copy(part.scale_inv.begin(), part.scale_inv.end(), q.scale_inv.data() + b0);
      if (!part.scale_e8m0.empty()) std::copy(part.scale_e8m0.begin(), part.scale_e8m0.end(), q.scale_e8m0.data() + b0);
    });
  }
  errors.rethrow();
  if (input != nullptr) *input = merged();
}

void check_input(MatrixRef x, const QuantizeOptions& options) {
  const Granularity& g = options.granularity;
  check_element_format(options.format, "quantize");
  FP8KIT_CHECK(x.dtype == DType::float32 || x.dtype == DType::bfloat16 || x.dtype == DType::float16,
               "quantize: the input is ", name(x.dtype), "; quantize float32, bfloat16 or float16 matrices");
  x.check("quantize", x.dtype);
  check_scale_options(options.scale, "quantize");
  // The block's sides, checked where the block grid is asked for (Granularity::rows_per_block / cols_per_block).
  (void)g.rows_per_block(x.rows);
  (void)g.cols_per_block(x.cols);
}

}  // namespace

void quantize_into(MatrixRef x, const QuantizeOptions& options, ScaledTensor& q, QuantDiagnostics* diagnostics,
                   AmaxResult* input) {
  check_input(x, options);
  describe(x, options, q);
  q.data.resize(static_cast<std::size_t>(x.rows * x.cols));
  if (x.dtype == DType::float32) return quantize_float(x, options, q, q.data.data(), diagnostics, input);
  if (diagnostics == nullptr) return quantize_narrow(x, options, q, q.data.data(), input);
  // Diagnostics compare with the input: measured on the widened matrix.
  std::vector<float> all(static_cast<std::size_t>(x.numel()));
  widen_rows(x, 0, x.rows, all.data());
  quantize_float(MatrixRef{all.data(), x.rows, x.cols}, options, q, q.data.data(), diagnostics, input);
}

void quantize_scales_into(MatrixRef x, const QuantizeOptions& options, ScaledTensor& q, AmaxResult* input) {
  check_input(x, options);
  describe(x, options, q);
  q.data.clear();
  if (x.dtype == DType::float32) return quantize_float(x, options, q, nullptr, nullptr, input);
  quantize_narrow(x, options, q, nullptr, input);
}

void quantize_codes_into(MatrixRef x, const QuantizeOptions& options, std::span<std::uint8_t> codes, ScaledTensor& q,
                         AmaxResult* input) {
  check_input(x, options);
  FP8KIT_CHECK(codes.size() == static_cast<std::size_t>(x.numel()), "quantize_codes_into: ", codes.size(),
               " bytes for the codes of a ", x.rows, "x", x.cols, " matrix");
  describe(x, options, q);
  q.data.clear();
  if (x.dtype == DType::float32) return quantize_float(x, options, q, codes.data(), nullptr, input);
  quantize_narrow(x, options, q, codes.data(), input);
}

ScaledTensor quantize_with_scale(MatrixRef x, Format format, float scale, Overflow overflow,
                                 QuantDiagnostics* diagnostics) {
  check_shape(x, Granularity::tensor());
  check_element_format(format, "quantize_with_scale");
  // 0 would dequantize every code through 1 / 0, NaN or Inf would encode every value as NaN: never a scale.
  // Below 1 / FLT_MAX (2.9e-39) its dequantization scale 1 / scale is infinite: every code would come back NaN.
  FP8KIT_CHECK(
      std::isfinite(scale) && scale > 0.0f && std::isfinite(1.0f / scale),
      "quantize_with_scale: the scale must be finite and positive, with a finite 1 / scale (at least 2.9e-39), "
      "got ",
      scale);
  ScaledTensor q;
  q.format = format;
  q.overflow = overflow;
  q.granularity = Granularity::tensor();
  q.rows = x.rows;
  q.cols = x.cols;
  q.data.resize(static_cast<std::size_t>(x.rows * x.cols));
  q.scale_inv.assign(static_cast<std::size_t>(q.grid_rows() * q.grid_cols()), dequantization_scale(scale));  // 0 or 1
  cast_rows(x, q.data.data(), CastOptions{format, overflow, Rounding::kNearestEven, scale});
  if (diagnostics != nullptr) {
    *diagnostics = measure(x, q, std::vector<float>{scale}, amax_of(x));
    diagnostics->scale = scale;
  }
  return q;
}

void dequantize(const ScaledTensor& q, std::span<float> out) {
  const std::int64_t n = q.checked_numel("dequantize");
  FP8KIT_CHECK(static_cast<std::int64_t>(out.size()) == n, "dequantize: output has ", out.size(), " elements, the ",
               q.rows, "x", q.cols, " matrix needs ", n);
  FP8KIT_CHECK(static_cast<std::int64_t>(q.data.size()) == n, "dequantize: data has ", q.data.size(), " codes for a ",
               q.rows, "x", q.cols, " matrix");
  const std::int64_t br = q.block_rows(), bc = q.block_cols();
  const std::int64_t grid_rows = q.grid_rows(), grid_cols = q.grid_cols();
  FP8KIT_CHECK(static_cast<std::int64_t>(q.scale_inv.size()) == grid_rows * grid_cols,
               "dequantize: ", q.scale_inv.size(), " scales for a ", grid_rows, "x", grid_cols, " block grid");
  if (n == 0) return;  // (no pass over an empty matrix's rows: it may have 2^62 of them)
  if (grid_rows * grid_cols == 1) {
    // One scale: the threaded, streaming bulk decode over everything.
    cast_from_fp8(q.data, q.format, out, q.scale_inv[0]);
    return;
  }
  const bool parallel = q.rows * q.cols >= detail::kParallelStreamElements && grid_rows > 1;
  const Stores stores = stores_for(out.size_bytes());
  detail::RegionErrors errors;  // the kernels' first lookup can throw (a bad FP8KIT_ISA)
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (parallel)
  for (std::int64_t gr = 0; gr < grid_rows; ++gr) {
    errors.guard([&] {
      const std::int64_t row_end = std::min(q.rows, (gr + 1) * br);
      for (std::int64_t r = gr * br; r < row_end; ++r) {
        if (bc % 16 == 0) {
          const auto cols = static_cast<std::size_t>(q.cols);
          decode_segments(
              std::span<const std::uint8_t>(q.data.data() + r * q.cols, cols), q.format,
              std::span<float>(out.data() + r * q.cols, cols), static_cast<std::size_t>(bc),
              std::span<const float>(q.scale_inv.data() + gr * grid_cols, static_cast<std::size_t>(grid_cols)), stores);
          continue;
        }
        for (std::int64_t gc = 0; gc < grid_cols; ++gc) {
          const std::int64_t c0 = gc * bc, c1 = std::min(q.cols, c0 + bc);
          const float scale_inv = q.scale_inv[static_cast<std::size_t>(gr * grid_cols + gc)];
          const std::uint8_t* in = q.data.data() + r * q.cols + c0;
          float* dst = out.data() + r * q.cols + c0;
          if (c1 - c0 >= kKernelMinRun) {
            // One block through the bulk decode (inside the band loop's threads it stays on this thread).
            const auto n = static_cast<std::size_t>(c1 - c0);
            cast_from_fp8(std::span<const std::uint8_t>(in, n), q.format, std::span<float>(dst, n), scale_inv);
          } else {
            for (std::int64_t c = 0; c < c1 - c0; ++c) {
              const float v = decode_to_float(q.format, in[c]);
              dst[c] = scale_inv == 1.0f ? v : v * scale_inv;
            }
          }
        }
      }
    });
  }
  errors.rethrow();
}

}  // namespace fp8kit
