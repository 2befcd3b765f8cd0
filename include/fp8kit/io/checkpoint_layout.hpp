// FP8 checkpoint layouts in the wild (DeepSeek block FP8, compressed-tensors, AutoFP8, FBGEMM row-wise, MXFP8) and
// fp8kit's own: detecting which one a checkpoint uses, dequantizing its weights, and quantizing weights into one.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/scaling/scaled_tensor.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {

// How the scales of a quantized weight `W` ([out, in], FP8) are stored. Every layout stores the dequantization
// scale (W ~= fp8 * s). docs/checkpoints.md has the table with every name, shape and dtype.
enum class CheckpointLayout : std::uint8_t {
  kDeepSeek,           // W F8_E4M3 + W_scale_inv F32 [ceil(out/128), ceil(in/128)]; quant_method "fp8" + block size
  kCompressedTensors,  // W + W_scale in the model's dtype: [1] tensor, [out,1] channel, [ceil/128, ceil/128] block
  kAutoFp8,            // W + W_scale F32 [] (0-d); quant_method "fp8" without a block size
  kFbgemm,             // W + W_scale F32 [out,1] (row-wise); quant_method "fbgemm_fp8"
  kMxfp8,              // W + W_scale U8 (E8M0 codes) [out, ceil(in/32)]; ModelOpt quant_algo "MXFP8"
  kNative,             // fp8kit: W (any FP8 dtype) + W.scale_inv F32 over the block grid (F8_E8M0 for MX) + metadata
};

inline constexpr CheckpointLayout kAllCheckpointLayouts[] = {
    CheckpointLayout::kDeepSeek, CheckpointLayout::kCompressedTensors,
    CheckpointLayout::kAutoFp8,  CheckpointLayout::kFbgemm,
    CheckpointLayout::kMxfp8,    CheckpointLayout::kNative};

// "deepseek", "compressed-tensors", "autofp8", "fbgemm", "mxfp8", "native".
std::string_view name(CheckpointLayout layout);
std::optional<CheckpointLayout> parse_checkpoint_layout(std::string_view text);

// What `fp8kit quantize --scheme` asks for: the granularity of the weight scales.
enum class QuantScheme : std::uint8_t {
  kFp8Tensor,   // one scale per tensor
  kFp8Channel,  // one scale per output channel (row)
  kFp8Block,    // one scale per 128 x 128 block (edge blocks are what remains)
  kMxfp8,       // one E8M0 scale per 1 x 32 block (OCP MX, floor rule)
};

inline constexpr QuantScheme kAllQuantSchemes[] = {QuantScheme::kFp8Tensor, QuantScheme::kFp8Channel,
                                                   QuantScheme::kFp8Block, QuantScheme::kMxfp8};

// "fp8-tensor", "fp8-channel", "fp8-block", "mxfp8".
std::string_view name(QuantScheme scheme);
std::optional<QuantScheme> parse_quant_scheme(std::string_view text);
// The granularity a scheme quantizes with (the scaling layer's vocabulary: the schemes are rows of a table over it,
// as the layouts are rows over the schemes), and the scheme of a granularity (MX of either scale rule: mxfp8;
// nothing for a granularity no scheme has, such as 1x128 blocks).
Granularity granularity_of(QuantScheme scheme);
std::optional<QuantScheme> scheme_of(const Granularity& granularity);

// The one place defaults are picked, for `fp8kit quantize` and `fp8kit train --export-fp8` alike. The layout a
// scheme is written in when none is named: the one serving stacks read for it (fp8-tensor and fp8-channel:
// compressed-tensors, fp8-block: deepseek, mxfp8: mxfp8). And the scheme a layout implies when only the layout is
// named: its only one (deepseek: fp8-block, autofp8: fp8-tensor, fbgemm: fp8-channel, mxfp8: mxfp8), nothing for
// the layouts that store several (compressed-tensors, native).
CheckpointLayout default_layout(QuantScheme scheme);
std::optional<QuantScheme> implied_scheme(CheckpointLayout layout);
// A request with the defaults filled in by the two rules above: the scheme given, else the one the layout implies,
// else `fallback` (an export: the recipe's weight scheme); the layout given, else the scheme's default. Nothing when
// no scheme follows (no scheme, a layout that stores several, no fallback). Whether the layout can store the result
// is layout_refusal()'s to say.
struct WeightStorage {
  QuantScheme scheme;
  CheckpointLayout layout;
};
std::optional<WeightStorage> resolve_storage(std::optional<QuantScheme> scheme, std::optional<CheckpointLayout> layout,
                                             std::optional<QuantScheme> fallback = std::nullopt);

// Whether `layout` can store weights of `scheme` in `format`; when not, the reason (one line), else nothing.
// deepseek: fp8-block; compressed-tensors: fp8-tensor, fp8-channel, fp8-block; autofp8: fp8-tensor; fbgemm:
// fp8-channel; mxfp8: mxfp8; all of them e4m3fn only. native: every scheme, e4m3fn or e5m2.
std::optional<std::string> layout_refusal(CheckpointLayout layout, QuantScheme scheme, Format format);

// What a config.json's quantization_config says (the parts fp8kit uses).
struct QuantizationConfig {
  std::optional<CheckpointLayout> layout;  // from quant_method (and quant_algo for ModelOpt)
  std::int64_t block_rows = 128;           // weight_block_size / block_structure when given
  std::int64_t block_cols = 128;
};
// Parses a config.json text; nothing when it has no quantization_config. Throws Error(kParse) for invalid JSON.
std::optional<QuantizationConfig> parse_quantization_config(std::string_view config_json);

// Which layout a checkpoint uses, and why fp8kit thinks so. `layout` is nothing when no tensor is a quantized
// FP8 weight with a scale (an unquantized checkpoint, or FP8 tensors without scales).
struct LayoutDetection {
  std::optional<CheckpointLayout> layout;
  std::string evidence;  // "config.json quant_method 'fp8' with weight_block_size", "tensor 'x' is ...", ...
};
// From config.json's quantization_config when given (its quant_method decides), else fp8kit's metadata (native),
// else the tensors: a `weight_scale_inv` -> deepseek; a U8/F8_E8M0 `weight_scale` -> mxfp8; a 0-d F32
// `weight_scale` -> autofp8; a BF16/F16 scale, a [1] scale or a block grid -> compressed-tensors; an F32 [out,1]
// scale -> fbgemm (compressed-tensors' channel layout in F32 is the same bytes and dequantizes the same). Without a
// config.json that decides, an FP8 tensor with scales of two layouts (`w_scale_inv` and `w_scale`) is refused
// (kParse, naming both): which one dequantizes it is not in the tensors.
LayoutDetection detect_layout(const ShardedCheckpoint& checkpoint, std::string_view config_json = {});
LayoutDetection detect_layout(const SafetensorsFile& file, std::string_view config_json = {});

// One quantized weight of a checkpoint and the tensors that go with it.
struct QuantizedWeight {
  std::string weight;                      // "model.layers.0.mlp.down_proj.weight"
  std::string scale;                       // its weight scale ("...weight_scale_inv", "...weight_scale", ...)
  std::optional<std::string> input_scale;  // a static activation scale, when present (dropped by dequantize)
};
// The quantized weights of a checkpoint in `layout`: every FP8 tensor whose scale tensor (by the layout's naming
// rule) exists, in name order.
std::vector<QuantizedWeight> quantized_weights(const ShardedCheckpoint& checkpoint, CheckpointLayout layout);

// The scale tensor name of weight `name` in a layout: name + "_scale_inv" (deepseek), name + ".scale_inv" (native),
// name + "_scale" (the others). The input scale: the weight name with its last ".weight" replaced by ".input_scale".
std::string scale_name(std::string_view weight_name, CheckpointLayout layout);
std::string input_scale_name(std::string_view weight_name);

// Reads a quantized weight and its scale tensor as fp8kit's ScaledTensor, the granularity decided by the scale's
// shape (one element: per tensor; [out,1] or [out]: per channel; U8/F8_E8M0 [out, ceil(in/32)]: MX; another 2-D
// grid: blocks of `block_rows` x `block_cols`). Native weights take granularity, block shape, format and original
// dtype from `native_metadata` (the file's __metadata__). Scales in BF16/F16 are widened exactly to float32; E8M0
// codes (U8 or F8_E8M0: MX scales, or DeepSeek-V4's block scales over the configured block grid) become
// 2^(code-127). Throws Error(kInvalidArgument) naming the tensors when a shape or dtype does not fit.
ScaledTensor load_checkpoint_tensor(CheckpointLayout layout, const SafetensorsTensor& weight,
                                    const SafetensorsTensor& scale, const QuantizationConfig& config = {},
                                    const std::map<std::string, std::string>& native_metadata = {});
// The granularity load_checkpoint_tensor reads the pair with (the same checks, without copying any data).
Granularity scale_granularity(CheckpointLayout layout, const SafetensorsTensor& weight, const SafetensorsTensor& scale,
                              const QuantizationConfig& config = {},
                              const std::map<std::string, std::string>& native_metadata = {});
// The high-precision weight: fp8kit::dequantize(load_checkpoint_tensor(...), dtype) (bit-exact with it).
// `dtype` is float32, bfloat16, float16 or float64.
Tensor dequantize_checkpoint_tensor(CheckpointLayout layout, const SafetensorsTensor& weight,
                                    const SafetensorsTensor& scale, DType dtype, const QuantizationConfig& config = {},
                                    const std::map<std::string, std::string>& native_metadata = {});
// The same values written straight into `out` (rows x cols elements of `dtype`, aligned to its element size),
// decoded from the mapped codes block by block with no copy of the codes and no float32 tensor in between (bit-exact
// with dequantize_checkpoint_tensor; float64 goes through it). Threads split the rows of large weights.
void dequantize_checkpoint_tensor_into(CheckpointLayout layout, const SafetensorsTensor& weight,
                                       const SafetensorsTensor& scale, DType dtype, std::span<std::byte> out,
                                       const QuantizationConfig& config = {},
                                       const std::map<std::string, std::string>& native_metadata = {});

// Which tensors `fp8kit quantize` turns into FP8: 2-D floating (F32, BF16, F16, F64) tensors named `*.weight`,
// except embeddings (a name with "embed", "wte", "wpe"), norms ("norm", "ln_"), lm_head, MoE routers (last
// module "gate" or "router", e.g. "mlp.gate.weight" [experts, hidden]), and names matching any `ignore` regex
// (std::regex_search, ECMAScript). Returns why a tensor is left as it is, or nothing when it is quantized; the
// patterns are tried last, so kMatchesIgnore means a weight that would be quantized without them.
inline constexpr std::string_view kMatchesIgnore = "matches --ignore";
std::optional<std::string> skip_reason(std::string_view name, SafetensorsDType dtype, const Shape& shape,
                                       const std::vector<std::regex>& ignore = {});

// One tensor of a checkpoint to write.
struct NamedTensor {
  std::string name;
  Tensor tensor;
};
// What quantizing one weight produces: the tensors of the layout (the FP8 weight first, then its scale), the
// __metadata__ entries the layout needs (native only), and the ScaledTensor they were made from.
struct QuantizedCheckpointTensor {
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> metadata;
  ScaledTensor scaled;
};
// The tensors quantize_checkpoint_tensor will produce for a weight of this shape and dtype (names, dtypes, shapes:
// the FP8 weight first, then its scale), and the __metadata__ entries it needs, known before any data is read (so a
// writer can lay out the file first and quantize each tensor when it reaches it). Throws as quantize_checkpoint_tensor.
struct PlannedTensor {
  std::string name;
  DType dtype;
  Shape shape;
};
std::vector<PlannedTensor> planned_checkpoint_tensors(const std::string& name, const Shape& shape, DType dtype,
                                                      QuantScheme scheme, Format format, CheckpointLayout layout);
std::map<std::string, std::string> layout_metadata(const std::string& name, DType dtype, QuantScheme scheme,
                                                   Format format, CheckpointLayout layout);

// Quantizes a 2-D float tensor into `layout`'s tensors (saturating overflow; dynamic activations, so no input
// scale). compressed-tensors stores its scales in the weight's dtype (float64 weights: bfloat16), which rounds
// them: the codes are then re-encoded with the rounded scales, so that dequantizing what is stored is exactly
// fp8kit::dequantize(scaled). Throws Error(kInvalidArgument) for a combination layout_refusal() refuses, a tensor
// that is not 2-D (native: any rank) or not floating, or a scale the layout's dtype cannot hold.
// `scale_rounding` kPowerOfTwoDown gives DeepSeek-V3.1's `scale_fmt: "ue8m0"`: every dequantization scale is the
// power of two 2^ceil(log2(amax / fp8_max)) (the quantization scale rounded down, so nothing saturates), still stored
// in the layout's scale dtype. MX scales are powers of two already (refused as an option there).
QuantizedCheckpointTensor quantize_checkpoint_tensor(const std::string& name, const Tensor& tensor, QuantScheme scheme,
                                                     Format format, CheckpointLayout layout,
                                                     ScaleRounding scale_rounding = ScaleRounding::kExact);

// An already quantized weight stored in `layout`: the plan (names, dtypes and shapes: the FP8 weight of `shape`,
// whose bytes are scaled.data, then its scale), the scale tensor, and the __metadata__ entries the layout needs.
// The scales are stored as they are, never rounded (the codes were encoded with them): a layout whose scale dtype
// does not hold one exactly (compressed-tensors' bfloat16/float16) is refused, naming the native layout.
// Throws Error(kInvalidArgument) for a granularity no layout stores (1x128, 1xN, 128x1 blocks), a combination
// layout_refusal() refuses, a shape that is not rows x cols elements, or scales that do not match the block grid.
struct StoredScaledTensor {
  std::vector<PlannedTensor> plan;
  Tensor scale;
  std::map<std::string, std::string> metadata;
};
StoredScaledTensor store_scaled_tensor(const std::string& name, const ScaledTensor& scaled, const Shape& shape,
                                       CheckpointLayout layout);

// The same quantization of a weight of an open file, its FP8 codes written straight into `codes` (the planned
// weight's bytes) from the mapped input — float32, bfloat16 or float16 rows read in place and widened a chunk at a
// time, with no copy of the tensor and no float32 one (float64, or rows the mapping does not align, through a copy)
// — and the planned scale tensor returned. Bit-exact with quantize_checkpoint_tensor(name, to_tensor(weight), ...).
Tensor quantize_checkpoint_tensor_into(const SafetensorsTensor& weight, QuantScheme scheme, Format format,
                                       CheckpointLayout layout, ScaleRounding scale_rounding,
                                       std::span<std::byte> codes);
// The planned scale tensor alone (an amax pass over the mapped weight, no encode): the one
// quantize_checkpoint_tensor_into returns, for a writer that lays the scales out before the weights.
Tensor quantize_checkpoint_scale(const SafetensorsTensor& weight, QuantScheme scheme, Format format,
                                 CheckpointLayout layout, ScaleRounding scale_rounding = ScaleRounding::kExact);

// The quantization_config (a JSON object, as text) that vLLM and Hugging Face read for a checkpoint written in
// `layout` with `scheme`; `ignored` lists the 2-D weights left unquantized. Native: fp8kit's own marker.
// scale_rounding kPowerOfTwoDown adds `"scale_fmt": "ue8m0"` (deepseek, as DeepSeek-V3.1's config).
// static_input_scales: the checkpoint holds one calibrated `input_scale` per quantized weight (static per-tensor
// activations): compressed-tensors' input_activations become {"strategy": "tensor", "dynamic": false}, autofp8's
// and native's activation_scheme "static". Other layouts have no static form (Error(kInvalidArgument)).
std::string quantization_config_json(CheckpointLayout layout, QuantScheme scheme, Format format,
                                     const std::vector<std::string>& ignored,
                                     ScaleRounding scale_rounding = ScaleRounding::kExact,
                                     bool static_input_scales = false);
// Why a layout cannot hold static input scales (one line), or nothing: compressed-tensors, autofp8 and native can.
std::optional<std::string> static_input_scale_refusal(CheckpointLayout layout);

}  // namespace fp8kit
