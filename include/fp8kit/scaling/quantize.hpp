// Scaled quantization of a matrix (any tensor viewed with its last dimension as the row) into a ScaledTensor: FP8
// codes plus one dequantization scale per block, at every granularity the field uses, with diagnostics of what was
// lost.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/format.hpp"
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/scaling/scale.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "fp8kit/tensor/tensor_buffer.hpp"

namespace fp8kit {

// How an MX block's E8M0 scale is chosen from its amax.
enum class MxScaleMode : std::uint8_t {
  kFloor,  // OCP MX v1.0: 2^(floor(log2(amax)) - emax_elem); the top of a block can clip (up to ~2x)
  kRceil,  // cuBLAS, Transformer Engine: amax / fp8_max rounded up to a power of two; nothing clips
};

// Which elements share a scale. Every granularity is a block shape over the rows x cols matrix.
struct Granularity {
  enum class Kind : std::uint8_t { kTensor, kRow, kColumn, kBlock, kMx };
  Kind kind = Kind::kTensor;
  std::int64_t block_rows = 0;  // kBlock: the block shape; kMx: 1 x block_cols (32)
  std::int64_t block_cols = 0;
  MxScaleMode mx_mode = MxScaleMode::kFloor;
  // The largest block side: the block grid's arithmetic stays far from int64 overflow (a block larger than the
  // matrix is one block along that side).
  static constexpr std::int64_t kMaxBlockSide = std::int64_t{1} << 31;

  static Granularity tensor() { return {Kind::kTensor}; }
  static Granularity row() { return {Kind::kRow}; }
  static Granularity column() { return {Kind::kColumn}; }
  static Granularity block(std::int64_t rows, std::int64_t cols) { return {Kind::kBlock, rows, cols}; }
  static Granularity mx(MxScaleMode mode = MxScaleMode::kFloor) { return {Kind::kMx, 1, 32, mode}; }

  // "tensor", "row", "col", "block:1x128", "mx32" (FLOOR), "mx32-rceil".
  std::string name() const;
  static std::optional<Granularity> parse(std::string_view text);
  // The block shape on a rows x cols matrix (tensor: the whole matrix; row: 1 x cols; column: rows x 1). A block
  // or MX granularity whose side is not in 1..kMaxBlockSide (a hand-built one) throws Error(kInvalidArgument).
  std::int64_t rows_per_block(std::int64_t rows) const;
  std::int64_t cols_per_block(std::int64_t cols) const;
};

// Throws Error(kInvalidArgument) naming `who` when values cannot be quantized into `format`: e8m0fnu is MX's scale
// format (unsigned powers of two, no zero), so a negative or zero input would come back NaN or 2^-127.
void check_element_format(Format format, const char* who);

struct QuantizeOptions {
  Format format = Format::e4m3fn;  // any format but e8m0fnu (check_element_format)
  Overflow overflow = Overflow::kSaturate;
  Granularity granularity = Granularity::tensor();
  ScaleOptions scale;  // margin, epsilon, power-of-two rounding (not used by MX, whose scales are E8M0)
};

// The one quantized-tensor type of fp8kit: FP8 codes and their dequantization scales,
// x ~= decode(data[r][c]) * scale_inv[block of (r, c)], over the tensor's 2-D view (its last dimension the row),
// with the format, overflow policy, granularity, and the shape and dtype of what was quantized. quantize() makes it
// from a matrix or a Tensor (scaled_tensor.hpp), scaled_mm multiplies it, the checkpoint layouts read and write it,
// and nn's recipes hand it to their GEMMs (RecipeOperand::fp8).
struct ScaledTensor {
  Format format = Format::e4m3fn;
  Overflow overflow = Overflow::kSaturate;
  Granularity granularity;
  std::int64_t rows = 0, cols = 0;
  // On tensor storage (TensorBuffer): counted by memory_stats() as every Tensor is.
  TensorBuffer<std::uint8_t> data;        // rows * cols codes, row-major
  TensorBuffer<float> scale_inv;          // one per block, row-major over the block grid
  TensorBuffer<std::uint8_t> scale_e8m0;  // MX only: the same scales as E8M0 codes
  // What was quantized: its shape (nothing: rows x cols, a matrix) and dtype (dequantize's default target).
  std::optional<Shape> original_shape;
  DType original_dtype = DType::float32;

  std::int64_t block_rows() const { return granularity.rows_per_block(rows); }
  std::int64_t block_cols() const { return granularity.cols_per_block(cols); }
  std::int64_t grid_rows() const { return ceil_div(rows, block_rows()); }
  std::int64_t grid_cols() const { return ceil_div(cols, block_cols()); }
  Shape shape() const { return original_shape.value_or(Shape{rows, cols}); }
  // rows * cols, checked: Error(kInvalidArgument) naming `op` for a negative side or a product past int64 (no such
  // matrix can be in memory). scaled_mm and dequantize check a ScaledTensor's fields with it first.
  std::int64_t checked_numel(std::string_view op) const;
  // Copies as tensors: the codes (the format's FP8 dtype, of shape()) and the dequantization scales (float32,
  // grid_rows x grid_cols).
  Tensor codes() const;
  Tensor scales() const;
};

// A read-only view of what a product reads of a ScaledTensor, over memory the caller owns and keeps alive for the
// call (a NumPy or torch buffer, a mapped file): scaled_mm and fp8_weight_mm take their FP8 operands this way, so
// that a binding multiplies its arrays where they are instead of copying every code first. A ScaledTensor converts
// to it implicitly. The sizes are checked by the product as a ScaledTensor's are (rows * cols codes, one scale per
// block of the granularity).
struct ScaledTensorRef {
  Format format = Format::e4m3fn;
  Granularity granularity = Granularity::tensor();
  std::int64_t rows = 0, cols = 0;
  std::span<const std::uint8_t> data;  // rows * cols codes, row-major
  std::span<const float> scale_inv;    // one per block, row-major over the block grid

  ScaledTensorRef() = default;
  ScaledTensorRef(const ScaledTensor& t)  // NOLINT(google-explicit-constructor): a ScaledTensor is one
      : format(t.format),
        granularity(t.granularity),
        rows(t.rows),
        cols(t.cols),
        data(t.data.data(), t.data.size()),
        scale_inv(t.scale_inv.data(), t.scale_inv.size()) {}

  std::int64_t block_rows() const { return granularity.rows_per_block(rows); }
  std::int64_t block_cols() const { return granularity.cols_per_block(cols); }
  std::int64_t grid_rows() const { return ceil_div(rows, block_rows()); }
  std::int64_t grid_cols() const { return ceil_div(cols, block_cols()); }
  std::int64_t checked_numel(std::string_view op) const;  // as ScaledTensor::checked_numel
};

// What a quantization did to the data.
struct QuantDiagnostics {
  float amax = 0.0f;                  // over all finite inputs
  std::optional<float> scale;         // the quantization scale when there is one for the whole tensor
  std::uint64_t count = 0;            // elements
  std::uint64_t nonzero_finite = 0;   // finite, nonzero inputs
  std::uint64_t underflow_count = 0;  // nonzero finite inputs that became 0
  std::uint64_t saturated_count = 0;  // finite inputs that overflowed after scaling (clamped, or Inf/NaN)
  std::uint64_t nonfinite_count = 0;  // NaN or Inf inputs
  std::optional<double> sqnr_db;      // 10 log10(sum x^2 / sum (x - dq)^2) over finite inputs with finite
                                      // results; none when there is no signal, +inf is reported as none too
  bool exact = false;                 // every finite input came back exactly (error 0)
  double max_abs_error = 0.0;         // over finite inputs with finite results
  double max_rel_error = 0.0;         // over nonzero finite inputs with finite results
  double underflow_fraction() const {
    return nonzero_finite ? static_cast<double>(underflow_count) / static_cast<double>(nonzero_finite) : 0.0;
  }
};

// Quantizes x (float32, bfloat16 or float16 on the CPU, any row stride; the codes are written contiguous); when
// `diagnostics` is given, also measures what was lost (a dequantization and a pass over x). 16-bit rows are widened
// to float32 a chunk of rows at a time (exactly), never as a whole matrix (except per column, or with diagnostics):
// the result is bit for bit that of the float32 matrix. out.original_dtype is x's dtype.
ScaledTensor quantize(MatrixRef x, const QuantizeOptions& options, QuantDiagnostics* diagnostics = nullptr);
// The same into an existing ScaledTensor, reusing its buffers when they are large enough (no allocation then).
// `input`, here and below, when given, receives x's amax and its NaN and Inf counts from the amax pass (no extra
// pass: a caller that must refuse non-finite inputs checks it, as checkpoint quantization does).
void quantize_into(MatrixRef x, const QuantizeOptions& options, ScaledTensor& out,
                   QuantDiagnostics* diagnostics = nullptr, AmaxResult* input = nullptr);
// The same with the codes written to `codes` (rows x cols bytes, row-major) instead of out.data, which is left empty:
// for a caller that owns where the codes go (a checkpoint writer's buffer). out has the scales and the description.
void quantize_codes_into(MatrixRef x, const QuantizeOptions& options, std::span<std::uint8_t> codes, ScaledTensor& out,
                         AmaxResult* input = nullptr);
// The scales alone (the amax pass, no encode): out.data empty, the scales quantize would give.
void quantize_scales_into(MatrixRef x, const QuantizeOptions& options, ScaledTensor& out, AmaxResult* input = nullptr);
// Per-tensor quantization with a scale given rather than computed (delayed scaling's, or one from a checkpoint):
// codes = the cast of x * scale to `format` under `overflow`, scale_inv = 1 / scale. With `diagnostics`, what was
// lost, measured exactly as quantize() measures it (amax and non-finite counts included; d.scale = scale).
ScaledTensor quantize_with_scale(MatrixRef x, Format format, float scale, Overflow overflow = Overflow::kSaturate,
                                 QuantDiagnostics* diagnostics = nullptr);

// Rows [r0, r0 + rows) of a bfloat16 or float16 matrix as float32 (exact), contiguous into `out` (rows * x.cols
// floats): how quantize computes on 16-bit inputs, for a caller that needs their float32 values (quantize_shard).
void widen_rows(MatrixRef x, std::int64_t r0, std::int64_t rows, float* out);

// out has rows * cols elements: decode(code) * scale_inv of its block, in float32.
void dequantize(const ScaledTensor& q, std::span<float> out);

// The E8M0 scale code of an MX block from its amax (NaN -> 0xFF, +Inf -> 0xFE, 0 -> 0x00).
std::uint8_t mx_scale_code(float amax, Format element_format, MxScaleMode mode);
// The dequantization scale an E8M0 code stands for: 2^(code - 127), exactly; NaN for 0xFF.
float mx_scale_value(std::uint8_t code);

}  // namespace fp8kit
