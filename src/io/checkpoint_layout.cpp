// Checkpoint layouts: names, detection from config.json and tensors, reading a quantized weight and its scale as a
// ScaledTensor (then dequantize), and quantizing a weight into the tensors of a layout.
#include "fp8kit/io/checkpoint_layout.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/parallel.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "io/strict_json.hpp"

namespace fp8kit {
namespace {

constexpr std::string_view kNativeMetadataPrefix = "fp8kit.quant.";

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::int64_t numel_of(const Shape& shape) {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

bool is_fp8_dtype(SafetensorsDType d) {
  const auto t = tensor_dtype(d);
  return t && is_fp8(*t) && *t != DType::float8_e8m0fnu;
}

bool is_high_precision(SafetensorsDType d) {
  return d == SafetensorsDType::F32 || d == SafetensorsDType::BF16 || d == SafetensorsDType::F16 ||
         d == SafetensorsDType::F64;
}

// "a=b;c=d" -> map: the native per-tensor metadata.
std::map<std::string, std::string> parse_fields(std::string_view text) {
  std::map<std::string, std::string> out;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(';', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view field = text.substr(start, end - start);
    const std::size_t eq = field.find('=');
    if (eq != std::string_view::npos) out[std::string(field.substr(0, eq))] = std::string(field.substr(eq + 1));
    start = end + 1;
  }
  return out;
}

// The scale values as float32 (exact for F32, BF16, F16; MX codes are decoded by the caller).
std::vector<float> scale_values(const SafetensorsTensor& scale) {
  const Tensor t = to_tensor(scale);
  const Tensor f = t.to(DType::float32);
  const auto span = f.span<float>();
  return {span.begin(), span.end()};
}

float e8m0_to_float(std::uint8_t code) {
  return decode_to_float(Format::e8m0fnu, code);
}

}  // namespace

// ---------------------------------------------------------------- names

// ---------------------------------------------------------------- the schemes and layouts, as tables

namespace {

// A weight scheme: the scaling layer's granularity under a checkpoint name, and the layout it is written in when
// none is named (the one serving stacks read for it).
struct SchemeRow {
  QuantScheme scheme;
  std::string_view name;
  Granularity granularity;
  CheckpointLayout default_layout;
};
const SchemeRow kSchemes[] = {
    {QuantScheme::kFp8Tensor, "fp8-tensor", Granularity::tensor(), CheckpointLayout::kCompressedTensors},
    {QuantScheme::kFp8Channel, "fp8-channel", Granularity::row(), CheckpointLayout::kCompressedTensors},
    {QuantScheme::kFp8Block, "fp8-block", Granularity::block(128, 128), CheckpointLayout::kDeepSeek},
    {QuantScheme::kMxfp8, "mxfp8", Granularity::mx(MxScaleMode::kFloor), CheckpointLayout::kMxfp8},
};

// A layout: the schemes it stores (all of them: native), whether it stores e5m2 weights (else e4m3fn only), and
// whether it has static activation scales.
struct LayoutRow {
  CheckpointLayout layout;
  std::string_view name;
  std::vector<QuantScheme> schemes;
  bool e5m2;
  bool static_activations;
};
const LayoutRow kLayouts[] = {
    {CheckpointLayout::kDeepSeek, "deepseek", {QuantScheme::kFp8Block}, false, false},
    {CheckpointLayout::kCompressedTensors,
     "compressed-tensors",
     {QuantScheme::kFp8Tensor, QuantScheme::kFp8Channel, QuantScheme::kFp8Block},
     false,
     true},
    {CheckpointLayout::kAutoFp8, "autofp8", {QuantScheme::kFp8Tensor}, false, true},
    {CheckpointLayout::kFbgemm, "fbgemm", {QuantScheme::kFp8Channel}, false, false},
    {CheckpointLayout::kMxfp8, "mxfp8", {QuantScheme::kMxfp8}, false, false},
    {CheckpointLayout::kNative,
     "native",
     {QuantScheme::kFp8Tensor, QuantScheme::kFp8Channel, QuantScheme::kFp8Block, QuantScheme::kMxfp8},
     true,
     true},
};

const SchemeRow& row(QuantScheme scheme) {
  return kSchemes[static_cast<std::size_t>(scheme)];
}
const LayoutRow& row(CheckpointLayout layout) {
  return kLayouts[static_cast<std::size_t>(layout)];
}

}  // namespace

std::string_view name(CheckpointLayout layout) {
  return row(layout).name;
}

std::optional<CheckpointLayout> parse_checkpoint_layout(std::string_view text) {
  for (const LayoutRow& r : kLayouts) {
    if (r.name == text) return r.layout;
  }
  return std::nullopt;
}

std::string_view name(QuantScheme scheme) {
  return row(scheme).name;
}

std::optional<QuantScheme> parse_quant_scheme(std::string_view text) {
  for (const SchemeRow& r : kSchemes) {
    if (r.name == text) return r.scheme;
  }
  return std::nullopt;
}

Granularity granularity_of(QuantScheme scheme) {
  return row(scheme).granularity;
}

std::optional<QuantScheme> scheme_of(const Granularity& g) {
  for (const SchemeRow& r : kSchemes) {
    const Granularity& s = r.granularity;
    if (s.kind != g.kind) continue;
    // (blocks of another size, and MX blocks other than 1 x 32 (a hand-built Granularity), are no scheme's: an
    // mx8 tensor's scales overflowed the mxfp8 scale tensor)
    if ((g.kind == Granularity::Kind::kBlock || g.kind == Granularity::Kind::kMx) &&
        (s.block_rows != g.block_rows || s.block_cols != g.block_cols)) {
      continue;
    }
    return r.scheme;  // MX: either scale rule (the scheme writes FLOOR scales, as OCP MX specifies)
  }
  return std::nullopt;
}

CheckpointLayout default_layout(QuantScheme scheme) {
  return row(scheme).default_layout;
}

std::optional<QuantScheme> implied_scheme(CheckpointLayout layout) {
  const LayoutRow& r = row(layout);
  return r.schemes.size() == 1 ? std::optional<QuantScheme>(r.schemes.front()) : std::nullopt;
}

std::optional<WeightStorage> resolve_storage(std::optional<QuantScheme> scheme, std::optional<CheckpointLayout> layout,
                                             std::optional<QuantScheme> fallback) {
  if (!scheme && layout) scheme = implied_scheme(*layout);
  if (!scheme) scheme = fallback;
  if (!scheme) return std::nullopt;
  return WeightStorage{*scheme, layout.value_or(default_layout(*scheme))};
}

std::optional<std::string> layout_refusal(CheckpointLayout layout, QuantScheme scheme, Format format) {
  const LayoutRow& r = row(layout);
  if (std::find(r.schemes.begin(), r.schemes.end(), scheme) == r.schemes.end()) {
    std::string list;
    for (QuantScheme s : r.schemes) list += (list.empty() ? "" : ", ") + std::string(name(s));
    return "the " + std::string(r.name) + " layout cannot store " + std::string(name(scheme)) + " weights (it stores " +
           list + "; --layout native stores every scheme)";
  }
  if (format == Format::e4m3fn || (format == Format::e5m2 && r.e5m2)) return std::nullopt;
  if (r.e5m2)
    return "the " + std::string(r.name) + " layout stores e4m3fn or e5m2 weights, not " + std::string(name(format));
  return "the " + std::string(r.name) + " layout stores e4m3fn (F8_E4M3) weights, not " + std::string(name(format)) +
         (format == Format::e5m2
              ? " (--layout native stores e5m2)"
              : " (no checkpoint layout stores it: quantize to e4m3fn, or e5m2 for --layout native)");
}

// ---------------------------------------------------------------- config.json

std::optional<QuantizationConfig> parse_quantization_config(std::string_view config_json) {
  // Strictly, as the headers: UTF-8, no duplicate key, and nested at most 64 deep (the parsed value is freed level by
  // level: a file nested 100000 deep overflowed the stack).
  const nlohmann::json j = detail::parse_strict_json(
      config_json, "config.json", 64, [](std::span<const std::string> parents, const std::string& key) {
        std::string where;
        for (const std::string& p : parents) where += (where.empty() ? "" : ".") + p;
        return "config.json has the key " + detail::quoted(key) + " twice" +
               (where.empty() ? std::string() : " in " + detail::quoted(where));
      });
  if (!j.is_object() || !j.contains("quantization_config") || !j["quantization_config"].is_object()) {
    return std::nullopt;
  }
  const nlohmann::json& q = j["quantization_config"];
  QuantizationConfig out;
  // A string field, or "" when absent; any other kind is a malformed config, not a layout to guess.
  const auto text_field = [&q](const char* key) {
    if (!q.contains(key)) return std::string();
    FP8KIT_CHECK_KIND(q[key].is_string(), ErrorKind::kParse, "config.json: quantization_config.", key,
                      " must be a string, not ", detail::json_kind(q[key]));
    return q[key].get<std::string>();
  };
  const std::string method = text_field("quant_method");
  // A block shape [rows, cols] of positive integers (at most Granularity's largest side), or a malformed config.
  auto block_from = [&out](const nlohmann::json& b, const char* field) {
    const auto side = [](const nlohmann::json& v) {
      return v.is_number_unsigned() && v.get<std::uint64_t>() >= 1 &&
             v.get<std::uint64_t>() <= static_cast<std::uint64_t>(Granularity::kMaxBlockSide);
    };
    FP8KIT_CHECK_KIND(b.is_array() && b.size() == 2 && side(b[0]) && side(b[1]), ErrorKind::kParse,
                      "config.json: ", field, " must be [rows, cols], two integers from 1 to ",
                      Granularity::kMaxBlockSide, ", not ", detail::printable(b.dump()).substr(0, 80));
    out.block_rows = b[0].get<std::int64_t>();
    out.block_cols = b[1].get<std::int64_t>();
    return true;
  };
  if (method == "compressed-tensors") {
    out.layout = CheckpointLayout::kCompressedTensors;
    if (q.contains("config_groups") && q["config_groups"].is_object()) {
      for (const auto& [key, group] : q["config_groups"].items()) {
        if (group.is_object() && group.contains("weights") && group["weights"].is_object() &&
            group["weights"].contains("block_structure") && !group["weights"]["block_structure"].is_null()) {
          block_from(group["weights"]["block_structure"], "a config group's weights.block_structure");
        }
      }
    }
  } else if (method == "fbgemm_fp8") {
    out.layout = CheckpointLayout::kFbgemm;
  } else if (method == "modelopt" || method == "fp8kit") {
    const std::string algo = text_field("quant_algo");
    if (method == "fp8kit") out.layout = CheckpointLayout::kNative;
    if (algo == "MXFP8") out.layout = CheckpointLayout::kMxfp8;
  } else if (method.find("fp8") != std::string::npos) {  // vLLM: a quant_method containing "fp8" is serialized FP8
    const bool block = q.contains("weight_block_size") && !q["weight_block_size"].is_null() &&
                       block_from(q["weight_block_size"], "quantization_config.weight_block_size");
    out.layout = block ? CheckpointLayout::kDeepSeek : CheckpointLayout::kAutoFp8;
  }
  return out;
}

// ---------------------------------------------------------------- naming and detection

std::string scale_name(std::string_view weight_name, CheckpointLayout layout) {
  switch (layout) {
    case CheckpointLayout::kDeepSeek:
      return std::string(weight_name) + "_scale_inv";
    case CheckpointLayout::kNative:
      return std::string(weight_name) + ".scale_inv";
    default:
      return std::string(weight_name) + "_scale";
  }
}

std::string input_scale_name(std::string_view weight_name) {
  if (ends_with(weight_name, ".weight")) {
    return std::string(weight_name.substr(0, weight_name.size() - 7)) + ".input_scale";
  }
  return std::string(weight_name) + ".input_scale";
}

namespace {

template <typename Lookup>
LayoutDetection detect_from_tensors(const std::vector<const SafetensorsTensor*>& tensors, const Lookup& find,
                                    const std::map<std::string, std::string>& metadata) {
  if (auto it = metadata.find("fp8kit.layout"); it != metadata.end() && it->second == "native") {
    return {CheckpointLayout::kNative, "__metadata__ fp8kit.layout is 'native'"};
  }
  // Two scales for one weight (any weight, not only the one that decides below): each layout would read one and
  // carry the other along as an ordinary tensor, and the tensors cannot say which of the two dequantizes the weight.
  for (const SafetensorsTensor* t : tensors) {
    if (!is_fp8_dtype(t->dtype)) continue;
    std::vector<std::string> names;  // the layouts' scale names present for this weight (scale_name), each once
    for (CheckpointLayout layout : kAllCheckpointLayouts) {
      std::string n = scale_name(t->name, layout);
      if (find(n) != nullptr && std::find(names.begin(), names.end(), n) == names.end()) names.push_back(std::move(n));
    }
    if (names.size() < 2) continue;
    std::string scales;  // the names come from the file: quoted, as every name this file's messages print
    for (const std::string& n : names) scales += (scales.empty() ? "" : ", ") + detail::quoted(n);
    FP8KIT_THROW(ErrorKind::kParse, "FP8 tensor ", detail::quoted(t->name), " has ", names.size(),
                 " scales of different layouts (", scales, "): remove the one that does not dequantize it, or give a ",
                 "config.json whose quantization_config names the layout");
  }
  for (const SafetensorsTensor* t : tensors) {
    if (!is_fp8_dtype(t->dtype)) continue;
    if (const SafetensorsTensor* s = find(t->name + "_scale_inv")) {
      return {CheckpointLayout::kDeepSeek, "'" + s->name + "' (" + std::string(name(s->dtype)) + " " +
                                               shape_string(s->shape) + ") is a DeepSeek block scale"};
    }
    if (const SafetensorsTensor* s = find(t->name + ".scale_inv")) {
      return {CheckpointLayout::kNative, "'" + s->name + "' is fp8kit's native scale"};
    }
    const SafetensorsTensor* s = find(t->name + "_scale");
    if (s == nullptr) continue;
    const std::string what = "'" + s->name + "' is " + std::string(name(s->dtype)) + " " + shape_string(s->shape);
    if (s->dtype == SafetensorsDType::U8 || s->dtype == SafetensorsDType::F8_E8M0) {
      return {CheckpointLayout::kMxfp8, what + " (E8M0 codes per 32 elements)"};
    }
    if (s->shape.empty() && s->dtype == SafetensorsDType::F32) {
      return {CheckpointLayout::kAutoFp8, what + " (a 0-d per-tensor scale)"};
    }
    const bool row = t->shape.size() == 2 && s->shape.size() == 2 && s->shape[0] == t->shape[0] && s->shape[1] == 1;
    if (row && s->dtype == SafetensorsDType::F32) {
      return {CheckpointLayout::kFbgemm, what + " (a row-wise F32 scale)"};
    }
    return {CheckpointLayout::kCompressedTensors, what + " (a scale in the model's dtype or shape [1] or a grid)"};
  }
  return {std::nullopt, "no FP8 tensor has a scale tensor"};
}

// config.json decides when its layout's scales are there; when they are not, the tensors do (a config that does
// not match its tensors is reported in the evidence).
template <typename Lookup>
LayoutDetection detect_with_config(std::string_view config_json, const std::vector<const SafetensorsTensor*>& tensors,
                                   const Lookup& find, const std::map<std::string, std::string>& metadata) {
  const auto config = config_json.empty() ? std::nullopt : parse_quantization_config(config_json);
  if (!config || !config->layout) return detect_from_tensors(tensors, find, metadata);
  const std::string said = "config.json quantization_config says " + std::string(name(*config->layout));
  for (const SafetensorsTensor* t : tensors) {
    if (is_fp8_dtype(t->dtype) && find(scale_name(t->name, *config->layout)) != nullptr) {
      return {config->layout, said};
    }
  }
  const LayoutDetection from_tensors = detect_from_tensors(tensors, find, metadata);
  if (from_tensors.layout)
    return {from_tensors.layout, said + ", but its scales are not there; " + from_tensors.evidence};
  return {std::nullopt, said + ", but no FP8 weight has its scale"};
}

}  // namespace

LayoutDetection detect_layout(const ShardedCheckpoint& checkpoint, std::string_view config_json) {
  std::map<std::string, std::string> metadata;
  for (const SafetensorsFile& shard : checkpoint.shards()) {
    metadata.insert(shard.metadata().begin(), shard.metadata().end());
  }
  const auto find = [&](const std::string& n) { return checkpoint.find(n); };
  return detect_with_config(config_json, checkpoint.tensors(), find, metadata);
}

LayoutDetection detect_layout(const SafetensorsFile& file, std::string_view config_json) {
  std::vector<const SafetensorsTensor*> tensors;
  for (const SafetensorsTensor& t : file.tensors()) tensors.push_back(&t);
  std::sort(tensors.begin(), tensors.end(), [](auto* a, auto* b) { return a->name < b->name; });
  const auto find = [&](const std::string& n) { return file.find(n); };
  return detect_with_config(config_json, tensors, find, file.metadata());
}

std::vector<QuantizedWeight> quantized_weights(const ShardedCheckpoint& checkpoint, CheckpointLayout layout) {
  std::vector<QuantizedWeight> out;
  for (const SafetensorsTensor* t : checkpoint.tensors()) {
    if (!is_fp8_dtype(t->dtype)) continue;
    const std::string s = scale_name(t->name, layout);
    if (checkpoint.find(s) == nullptr) continue;
    QuantizedWeight w{t->name, s, std::nullopt};
    if (checkpoint.find(input_scale_name(t->name)) != nullptr) w.input_scale = input_scale_name(t->name);
    out.push_back(std::move(w));
  }
  return out;
}

// ---------------------------------------------------------------- reading

namespace {

// What the pair says, checked: the FP8 format, the granularity, the original dtype and overflow policy (native).
struct PairInfo {
  Format format = Format::e4m3fn;
  Granularity granularity;
  DType original_dtype = DType::bfloat16;
  Overflow overflow = Overflow::kSaturate;
  std::int64_t rows = 0, cols = 0, grid = 0;
  bool mx_scale = false;
};

// DeepSeek-V4's block scales: a deepseek `weight_scale_inv` of E8M0 codes (F8_E8M0, or U8) over the configured block
// grid of a 2-D weight, each block's dequantization scale 2^(code - 127). (E8M0 codes of another shape are MX scales.)
bool deepseek_e8m0_blocks(CheckpointLayout layout, const SafetensorsTensor& weight, const SafetensorsTensor& scale,
                          const QuantizationConfig& config) {
  if (layout != CheckpointLayout::kDeepSeek || weight.shape.size() != 2 || scale.shape.size() != 2) return false;
  return scale.shape[0] == ceil_div(weight.shape[0], config.block_rows) &&
         scale.shape[1] == ceil_div(weight.shape[1], config.block_cols);
}

PairInfo inspect_pair(CheckpointLayout layout, const SafetensorsTensor& weight, const SafetensorsTensor& scale,
                      const QuantizationConfig& config, const std::map<std::string, std::string>& native_metadata) {
  weight.check_bytes();
  scale.check_bytes();
  // (a hand-built QuantizationConfig: a block side of 0 divided by zero below)
  FP8KIT_CHECK(config.block_rows >= 1 && config.block_cols >= 1 && config.block_rows <= Granularity::kMaxBlockSide &&
                   config.block_cols <= Granularity::kMaxBlockSide,
               "the quantization config's block is ", config.block_rows, "x", config.block_cols,
               "; each side must be 1..", Granularity::kMaxBlockSide, " (weight_block_size in config.json)");
  FP8KIT_CHECK(is_fp8_dtype(weight.dtype), detail::quoted(weight.name), " is ", name(weight.dtype),
               ", not an FP8 weight (F8_E4M3, F8_E5M2, F8_E4M3FNUZ, F8_E5M2FNUZ)");
  PairInfo p;
  bool guessed_block = false;  // the scale is neither a tensor's nor a channel's: then it must be the block grid
  p.format = *fp8_format(*tensor_dtype(weight.dtype));
  const std::int64_t cols = weight.shape.empty() ? 1 : weight.shape.back();
  const std::int64_t n = numel_of(weight.shape);
  p.rows = n == 0 ? 0 : n / cols;
  p.cols = n == 0 ? 0 : cols;
  const std::string pair = "'" + weight.name + "' " + shape_string(weight.shape) + " with scale '" + scale.name + "' " +
                           std::string(name(scale.dtype)) + " " + shape_string(scale.shape);
  p.mx_scale = scale.dtype == SafetensorsDType::U8 || scale.dtype == SafetensorsDType::F8_E8M0;
  if (layout == CheckpointLayout::kNative) {
    const auto it = native_metadata.find(std::string(kNativeMetadataPrefix) + weight.name);
    FP8KIT_CHECK(it != native_metadata.end(), "native weight ", detail::quoted(weight.name),
                 " has no __metadata__ entry ", detail::quoted(std::string(kNativeMetadataPrefix) + weight.name));
    const auto fields = parse_fields(it->second);
    const auto g = fields.count("granularity") ? Granularity::parse(fields.at("granularity")) : std::nullopt;
    FP8KIT_CHECK(g.has_value(), "native weight ", detail::quoted(weight.name), ": bad metadata ",
                 detail::quoted(it->second));
    p.granularity = *g;
    if (fields.count("dtype")) {
      if (const auto d = parse_dtype(fields.at("dtype")); d && is_floating(*d) && !is_fp8(*d)) p.original_dtype = *d;
    }
    if (fields.count("overflow") && fields.at("overflow") == "non-saturating") p.overflow = Overflow::kNonSaturating;
    FP8KIT_CHECK(p.mx_scale == (p.granularity.kind == Granularity::Kind::kMx), pair, ": a native ",
                 p.granularity.name(), " scale is ", p.mx_scale ? "F32" : "F8_E8M0");
  } else if (layout == CheckpointLayout::kMxfp8 ||
             (p.mx_scale && !deepseek_e8m0_blocks(layout, weight, scale, config))) {
    FP8KIT_CHECK(p.mx_scale, pair, ": an MXFP8 scale holds U8 or F8_E8M0 E8M0 codes");
    p.granularity = Granularity::mx();
  } else {
    FP8KIT_CHECK(weight.shape.size() == 2, pair, ": a quantized weight of this layout is 2-D [out, in]");
    const bool row_shape = (scale.shape.size() == 2 && scale.shape[0] == p.rows && scale.shape[1] == 1) ||
                           (scale.shape.size() == 1 && scale.shape[0] == p.rows);
    if (numel_of(scale.shape) == 1) {
      p.granularity = Granularity::tensor();
    } else if (row_shape) {
      p.granularity = Granularity::row();
    } else {
      p.granularity = Granularity::block(config.block_rows, config.block_cols);
      guessed_block = true;
    }
  }
  if (!p.mx_scale) {
    FP8KIT_CHECK(scale.dtype == SafetensorsDType::F32 || scale.dtype == SafetensorsDType::BF16 ||
                     scale.dtype == SafetensorsDType::F16,
                 pair, ": a scale is F32, BF16 or F16");
  }
  const std::int64_t gr = p.rows == 0 ? 0 : ceil_div(p.rows, p.granularity.rows_per_block(p.rows));
  const std::int64_t gc = p.cols == 0 ? 0 : ceil_div(p.cols, p.granularity.cols_per_block(p.cols));
  p.grid = gr * gc;
  // An empty weight has no block: its writer's grid may count the blocks of its other side ([0, 2] for [0, 256] in
  // 128x128 blocks) or keep one per-tensor scale. Either is read (the grid fp8kit holds for it is empty); nothing is
  // dequantized with them.
  const bool empty_ok = n == 0 && numel_of(scale.shape) <= 1;
  const bool shape_ok =
      empty_ok || (numel_of(scale.shape) == p.grid &&
                   (scale.shape.size() != 2 || p.granularity.kind == Granularity::Kind::kTensor ||
                    p.granularity.kind == Granularity::Kind::kRow || (scale.shape[0] == gr && scale.shape[1] == gc)));
  FP8KIT_CHECK(shape_ok || !guessed_block, pair, ": the scale fits no granularity: one element (tensor), [", p.rows,
               ", 1] or [", p.rows, "] (channel), or [", gr, ", ", gc, "] (", p.granularity.name(), ")");
  FP8KIT_CHECK(shape_ok, pair, ": the scale does not fit ", p.granularity.name(), " granularity (", gr, " x ", gc,
               " scales expected)");
  return p;
}

// The pair's dequantization scales as float32, one per block: MX codes as 2^(code-127), others widened exactly.
// The dequantization scales as float32: finite and >= 0 (0: a block of zeros some writers give scale 0). NaN, an
// infinity, a negative scale or the E8M0 NaN code (255) come from a damaged file: refused, not dequantized into NaN,
// Inf or weights of the wrong sign.
std::vector<float> dequantization_scales(const PairInfo& p, const SafetensorsTensor& scale) {
  std::vector<float> out;
  if (!p.mx_scale) {
    out = scale_values(scale);
  } else {
    out.resize(static_cast<std::size_t>(p.grid));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = e8m0_to_float(static_cast<std::uint8_t>(scale.bytes[i]));
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    FP8KIT_CHECK_KIND(std::isfinite(out[i]) && out[i] >= 0.0f, ErrorKind::kParse, detail::quoted(scale.name),
                      ": scale ", i, " is ", out[i], "; a dequantization scale is finite and >= 0 (a damaged file?)");
  }
  return out;
}

}  // namespace

Granularity scale_granularity(CheckpointLayout layout, const SafetensorsTensor& weight, const SafetensorsTensor& scale,
                              const QuantizationConfig& config,
                              const std::map<std::string, std::string>& native_metadata) {
  return inspect_pair(layout, weight, scale, config, native_metadata).granularity;
}

ScaledTensor load_checkpoint_tensor(CheckpointLayout layout, const SafetensorsTensor& weight,
                                    const SafetensorsTensor& scale, const QuantizationConfig& config,
                                    const std::map<std::string, std::string>& native_metadata) {
  const PairInfo p = inspect_pair(layout, weight, scale, config, native_metadata);
  ScaledTensor m;
  m.original_shape = weight.shape;
  m.original_dtype = p.original_dtype;
  m.format = p.format;
  m.overflow = p.overflow;
  m.granularity = p.granularity;
  m.rows = p.rows;
  m.cols = p.cols;
  const auto n = static_cast<std::size_t>(p.rows * p.cols);
  m.data.resize(n);
  if (n > 0) std::memcpy(m.data.data(), weight.bytes.data(), n);
  std::vector<float> scale_inv = dequantization_scales(p, scale);
  scale_inv.resize(static_cast<std::size_t>(p.grid));  // an empty weight's one per-tensor scale: none is held
  m.scale_inv.resize(scale_inv.size());
  std::copy(scale_inv.begin(), scale_inv.end(), m.scale_inv.begin());
  if (p.granularity.kind == Granularity::Kind::kMx) {
    const auto* codes = reinterpret_cast<const std::uint8_t*>(scale.bytes.data());
    m.scale_e8m0.assign(codes, codes + p.grid);
  }
  return m;
}

Tensor dequantize_checkpoint_tensor(CheckpointLayout layout, const SafetensorsTensor& weight,
                                    const SafetensorsTensor& scale, DType dtype, const QuantizationConfig& config,
                                    const std::map<std::string, std::string>& native_metadata) {
  return dequantize(load_checkpoint_tensor(layout, weight, scale, config, native_metadata), dtype);
}

void dequantize_checkpoint_tensor_into(CheckpointLayout layout, const SafetensorsTensor& weight,
                                       const SafetensorsTensor& scale, DType dtype, std::span<std::byte> out,
                                       const QuantizationConfig& config,
                                       const std::map<std::string, std::string>& native_metadata) {
  const PairInfo p = inspect_pair(layout, weight, scale, config, native_metadata);
  const auto n = static_cast<std::size_t>(p.rows * p.cols);
  FP8KIT_CHECK(is_floating(dtype) && !is_fp8(dtype), "dequantize: the target dtype is ", fp8kit::name(dtype),
               "; dequantize to float32, bfloat16, float16 or float64");
  const auto esize = static_cast<std::size_t>(element_size(dtype));
  FP8KIT_CHECK(out.size() == n * esize, detail::quoted(weight.name), ": the output holds ", out.size(), " bytes, ", n,
               " elements of ", fp8kit::name(dtype), " need ", n * esize);
  FP8KIT_CHECK(reinterpret_cast<std::uintptr_t>(out.data()) % esize == 0, detail::quoted(weight.name),
               ": the output is not aligned to its ", esize, "-byte elements");
  if (dtype != DType::float32 && dtype != DType::bfloat16 && dtype != DType::float16) {
    const Tensor w = dequantize_checkpoint_tensor(layout, weight, scale, dtype, config, native_metadata);
    if (n > 0) std::memcpy(out.data(), w.raw(), out.size());
    return;
  }
  if (n == 0) return;
  const std::vector<float> scale_inv = dequantization_scales(p, scale);
  const auto* codes = reinterpret_cast<const std::uint8_t*>(weight.bytes.data());
  // Elements [offset, offset + count) with one scale, through the conversion kernels (decode, times scale_inv in
  // float32, rounded to nearest even into the output type: what dequantize and Tensor::to do in two steps).
  const auto decode = [&](std::size_t offset, std::size_t count, float s) {
    const std::span<const std::uint8_t> in(codes + offset, count);
    if (dtype == DType::float32) {
      cast_from_fp8(in, p.format, std::span<float>(reinterpret_cast<float*>(out.data()) + offset, count), s);
    } else if (dtype == DType::bfloat16) {
      cast_from_fp8(in, p.format, std::span<bfloat16>(reinterpret_cast<bfloat16*>(out.data()) + offset, count), s);
    } else {
      cast_from_fp8(in, p.format, std::span<float16>(reinterpret_cast<float16*>(out.data()) + offset, count), s);
    }
  };
  if (p.grid == 1) {
    decode(0, n, scale_inv[0]);  // the threaded bulk decode
    return;
  }
  const std::int64_t br = p.granularity.rows_per_block(p.rows), bc = p.granularity.cols_per_block(p.cols);
  const std::int64_t grid_cols = ceil_div(p.cols, bc);
  // Rows split among threads; each block's run stays on its thread (the decode's own threads are nested, inactive).
  detail::RegionErrors errors;  // the kernels' first lookup can throw (a bad FP8KIT_ISA)
#pragma omp parallel for num_threads(::fp8kit::num_threads()) \
    schedule(static) if (n >= (std::size_t{1} << 20) && p.rows > 1)
  for (std::int64_t r = 0; r < p.rows; ++r) {
    errors.guard([&] {
      for (std::int64_t gc = 0; gc < grid_cols; ++gc) {
        const std::int64_t c0 = gc * bc, c1 = std::min(p.cols, c0 + bc);
        decode(static_cast<std::size_t>(r * p.cols + c0), static_cast<std::size_t>(c1 - c0),
               scale_inv[static_cast<std::size_t>((r / br) * grid_cols + gc)]);
      }
    });
  }
  errors.rethrow();
}

// ---------------------------------------------------------------- which tensors are quantized

std::optional<std::string> skip_reason(std::string_view name_view, SafetensorsDType dtype, const Shape& shape,
                                       const std::vector<std::regex>& ignore) {
  const std::string name(name_view);
  // std::regex matches by recursion, a few frames per character: a name of 20000 characters overflowed the stack
  // on '(a|b)*c'. Real tensor names are a few hundred characters at most.
  constexpr std::size_t kMaxMatchedName = 4096;
  FP8KIT_CHECK(ignore.empty() || name.size() <= kMaxMatchedName, "tensor ", detail::quoted(name.substr(0, 40)),
               "... has a name of ", name.size(), " characters, longer than --ignore patterns are matched against (",
               kMaxMatchedName, "); leave out --ignore for this checkpoint");
  if (!is_high_precision(dtype)) return "dtype " + std::string(fp8kit::name(dtype)) + " is not F32/BF16/F16/F64";
  if (shape.size() != 2) return "not 2-D";
  if (numel_of(shape) == 0) return "empty";
  if (!ends_with(name, ".weight")) return "not a '.weight'";
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower.find("embed") != std::string::npos || lower.find("wte") != std::string::npos ||
      lower.find("wpe") != std::string::npos) {
    return "an embedding";
  }
  if (lower.find("norm") != std::string::npos || lower.find("ln_") != std::string::npos) return "a norm";
  if (lower.find("lm_head") != std::string::npos) return "lm_head";
  const std::string module = lower.substr(0, lower.size() - 7);  // without ".weight"
  const std::string last = module.substr(module.rfind('.') == std::string::npos ? 0 : module.rfind('.') + 1);
  if (last == "gate" || last.find("router") != std::string::npos) return "an MoE router";
  // Last: "matches --ignore" names exactly the weights the patterns keep from being quantized.
  for (const std::regex& r : ignore) {
    if (std::regex_search(name, r)) return std::string(kMatchesIgnore);
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- writing

namespace {

// The scale dtype a layout stores for a weight of `dtype`.
DType scale_dtype_for(CheckpointLayout layout, QuantScheme scheme, DType weight_dtype) {
  if (scheme == QuantScheme::kMxfp8) return layout == CheckpointLayout::kNative ? DType::float8_e8m0fnu : DType::uint8;
  if (layout == CheckpointLayout::kCompressedTensors) {
    return weight_dtype == DType::float64 ? DType::bfloat16 : weight_dtype;  // the model's dtype (f64 -> bf16)
  }
  return DType::float32;
}

// Re-encodes x with the (rounded) scales in q, so that the codes go with the scales that are stored.
// The codes of x (float32, bfloat16 or float16 rows) encoded again with q's scales (after they were rounded).
void reencode(MatrixRef x, const ScaledTensor& q, std::uint8_t* codes) {
  const std::int64_t br = q.block_rows(), bc = q.block_cols(), gc_n = q.grid_cols();
  std::vector<float> row(static_cast<std::size_t>(x.cols));
  for (std::int64_t r = 0; r < q.rows; ++r) {
    const float* in = row.data();
    if (x.dtype == DType::float32) {
      in = x.row<float>(r);
    } else if (x.dtype == DType::bfloat16) {
      for (std::int64_t c = 0; c < x.cols; ++c) row[static_cast<std::size_t>(c)] = x.row<bfloat16>(r)[c].to_float();
    } else {
      for (std::int64_t c = 0; c < x.cols; ++c) row[static_cast<std::size_t>(c)] = x.row<float16>(r)[c].to_float();
    }
    for (std::int64_t gc = 0; gc < gc_n; ++gc) {
      const std::int64_t c0 = gc * bc, c1 = std::min(q.cols, c0 + bc);
      const float multiplier = 1.0f / q.scale_inv[static_cast<std::size_t>((r / br) * gc_n + gc)];
      cast_to_fp8(std::span<const float>(in + c0, static_cast<std::size_t>(c1 - c0)),
                  std::span<std::uint8_t>(codes + r * q.cols + c0, static_cast<std::size_t>(c1 - c0)),
                  CastOptions{q.format, q.overflow, Rounding::kNearestEven, multiplier});
    }
  }
}

// The planned scale tensor holding m's scales: its E8M0 codes (MX), or its float32 scales in the plan's dtype
// (the caller has checked that dtype holds them exactly).
Tensor layout_scale_tensor(const PlannedTensor& planned, const ScaledTensor& m) {
  const bool e8m0 = planned.dtype == DType::uint8 || planned.dtype == DType::float8_e8m0fnu;
  FP8KIT_CHECK_KIND(
      numel_of(planned.shape) == static_cast<std::int64_t>(e8m0 ? m.scale_e8m0.size() : m.scale_inv.size()),
      ErrorKind::kInternal, "the scale tensor ", shape_string(planned.shape), " does not hold the ",
      e8m0 ? m.scale_e8m0.size() : m.scale_inv.size(), " scales of the ", m.granularity.name(), " grid");
  if (e8m0) {
    Tensor scale = empty(planned.shape, planned.dtype);
    std::copy(m.scale_e8m0.begin(), m.scale_e8m0.end(), scale.data<std::uint8_t>());
    return scale;
  }
  Tensor s32 = empty(planned.shape, DType::float32);
  std::copy(m.scale_inv.begin(), m.scale_inv.end(), s32.data<float>());
  return s32.to(planned.dtype);
}

// Where quantize_planned puts the codes: into the ScaledTensor, into the caller's buffer, or nowhere (the scales
// alone: an amax pass, no encode).
enum class CodesTo { kScaledTensor, kBuffer, kNowhere };

// What quantize_checkpoint_tensor, quantize_checkpoint_tensor_into and quantize_checkpoint_scale share: x (read
// from a weight of dtype `source`) quantized into m (its codes as `to` says; `codes` is the buffer), the scales the
// layout's dtype rounds rounded and the codes re-encoded with them, and the scale tensor of the plan. A weight
// holding NaN or Inf is refused: saturation would store an infinity as the largest finite value with no trace, and
// the scale of its block comes from the finite values alone.
Tensor quantize_planned(const std::string& name, MatrixRef x, DType source, const std::vector<PlannedTensor>& plan,
                        QuantScheme scheme, Format format, ScaleRounding scale_rounding, ScaledTensor& m, CodesTo to,
                        std::span<std::uint8_t> codes = {}) {
  FP8KIT_CHECK(scale_rounding == ScaleRounding::kExact || scheme != QuantScheme::kMxfp8, "'", name,
               "': power-of-two (ue8m0) scale rounding is for FP8 scales; MX scales are E8M0 already");
  ScaleOptions scale_options;
  scale_options.rounding = scale_rounding;
  const QuantizeOptions options{format, Overflow::kSaturate, granularity_of(scheme), scale_options};
  AmaxResult input;
  switch (to) {
    case CodesTo::kScaledTensor:
      quantize_into(x, options, m, nullptr, &input);
      codes = std::span<std::uint8_t>(m.data.data(), m.data.size());
      break;
    case CodesTo::kBuffer:
      quantize_codes_into(x, options, codes, m, &input);
      break;
    case CodesTo::kNowhere:
      quantize_scales_into(x, options, m, &input);
  }
  FP8KIT_CHECK(!input.has_nonfinite(), detail::quoted(name), " holds ", input.inf_count, " infinite and ",
               input.nan_count, " NaN values",
               source == DType::float64 ? " (float64 values past float32's range count as infinite)" : "",
               "; FP8 would hide them: repair the weight, or leave it unquantized (fp8kit quantize --ignore)");
  const DType sdtype = plan[1].dtype;

  // Scales the layout's dtype rounds (compressed-tensors in BF16/F16): round them, then re-encode the codes.
  if (sdtype == DType::bfloat16 || sdtype == DType::float16) {
    Tensor s = empty({static_cast<std::int64_t>(m.scale_inv.size())}, DType::float32);
    std::copy(m.scale_inv.begin(), m.scale_inv.end(), s.data<float>());
    const Tensor back = s.to(sdtype).to(DType::float32);
    for (std::size_t i = 0; i < m.scale_inv.size(); ++i) {
      const float v = back.data<float>()[i];
      FP8KIT_CHECK(std::isfinite(v) && v > 0.0f, detail::quoted(name), ": the scale ", m.scale_inv[i],
                   " is not representable in ", fp8kit::name(sdtype),
                   " (use --layout native, whose scales are float32)");
      m.scale_inv[i] = v;
    }
    if (to != CodesTo::kNowhere) reencode(x, m, codes.data());
  }

  return layout_scale_tensor(plan[1], m);  // exact: the values were rounded to the scale dtype above
}

// The 2-D view quantize takes of a tensor of this shape (its last dimension the row).
MatrixRef matrix_of(const void* data, DType dtype, const Shape& shape) {
  const std::int64_t numel = numel_of(shape);
  const std::int64_t cols = shape.empty() ? 1 : shape.back();
  return MatrixRef(data, dtype, numel == 0 ? 0 : numel / cols, numel == 0 ? 0 : cols);
}

}  // namespace

std::vector<PlannedTensor> planned_checkpoint_tensors(const std::string& name, const Shape& shape, DType dtype,
                                                      QuantScheme scheme, Format format, CheckpointLayout layout) {
  if (auto refusal = layout_refusal(layout, scheme, format)) FP8KIT_THROW(ErrorKind::kInvalidArgument, *refusal);
  FP8KIT_CHECK(is_floating(dtype) && !is_fp8(dtype), detail::quoted(name), " is ", fp8kit::name(dtype),
               "; only float32, bfloat16, float16 and float64 tensors are quantized");
  FP8KIT_CHECK(layout == CheckpointLayout::kNative || shape.size() == 2, detail::quoted(name), " has shape ",
               shape_string(shape), "; the ", fp8kit::name(layout), " layout quantizes 2-D [out, in] weights");
  FP8KIT_CHECK(numel_of(shape) > 0, detail::quoted(name), " has shape ", shape_string(shape),
               "; empty tensors are not quantized");
  const Granularity g = granularity_of(scheme);
  const std::int64_t cols = shape.empty() ? 1 : shape.back();
  const std::int64_t rows = numel_of(shape) / cols;
  Shape sshape;
  if (scheme == QuantScheme::kFp8Tensor) {
    sshape = layout == CheckpointLayout::kAutoFp8  ? Shape{}
             : layout == CheckpointLayout::kNative ? Shape{1, 1}
                                                   : Shape{1};
  } else {  // channel: [out, 1]; block: the grid; MX: [out, ceil(in/32)]
    sshape = {ceil_div(rows, g.rows_per_block(rows)), ceil_div(cols, g.cols_per_block(cols))};
  }
  return {{name, dtype_of(format), shape}, {scale_name(name, layout), scale_dtype_for(layout, scheme, dtype), sshape}};
}

std::map<std::string, std::string> layout_metadata(const std::string& name, DType dtype, QuantScheme scheme,
                                                   Format format, CheckpointLayout layout) {
  if (layout != CheckpointLayout::kNative) return {};
  return {{"fp8kit.layout", "native"},
          {std::string(kNativeMetadataPrefix) + name,
           "granularity=" + granularity_of(scheme).name() + ";format=" + std::string(fp8kit::name(format)) +
               ";dtype=" + std::string(fp8kit::name(dtype)) + ";overflow=saturate"}};
}

QuantizedCheckpointTensor quantize_checkpoint_tensor(const std::string& name, const Tensor& tensor, QuantScheme scheme,
                                                     Format format, CheckpointLayout layout,
                                                     ScaleRounding scale_rounding) {
  const std::vector<PlannedTensor> plan =
      planned_checkpoint_tensors(name, tensor.shape(), tensor.dtype(), scheme, format, layout);
  const Tensor in = tensor.dtype() == DType::float64 ? tensor.to(DType::float32) : tensor;
  QuantizedCheckpointTensor out;
  const Tensor scale = quantize_planned(name, matrix_of(in.raw(), in.dtype(), tensor.shape()), tensor.dtype(), plan,
                                        scheme, format, scale_rounding, out.scaled, CodesTo::kScaledTensor);
  out.scaled.original_shape = tensor.shape();
  out.scaled.original_dtype = tensor.dtype();
  out.tensors.push_back({plan[0].name, out.scaled.codes()});
  out.tensors.push_back({plan[1].name, scale});
  out.metadata = layout_metadata(name, tensor.dtype(), scheme, format, layout);
  return out;
}

StoredScaledTensor store_scaled_tensor(const std::string& name, const ScaledTensor& scaled, const Shape& shape,
                                       CheckpointLayout layout) {
  const std::optional<QuantScheme> scheme = scheme_of(scaled.granularity);
  FP8KIT_CHECK(scheme.has_value(), detail::quoted(name), " is quantized per ", scaled.granularity.name(),
               ", which no checkpoint layout stores; quantize it per tensor, row, 128x128 block or mx32");
  // The plan reads the matrix off `shape` (its last dimension the row; an empty one is refused there, first), the
  // scales come from the ScaledTensor's own grid: the two must be the same matrix, or the scale tensor the plan sizes
  // would not hold the grid's scales.
  StoredScaledTensor out;
  out.plan = planned_checkpoint_tensors(name, shape, scaled.original_dtype, *scheme, scaled.format, layout);
  const std::int64_t numel = scaled.checked_numel("store_scaled_tensor");
  const std::int64_t cols = shape.empty() ? 1 : shape.back();
  FP8KIT_CHECK(numel_of(shape) == numel && cols == scaled.cols && (cols == 0 || numel / cols == scaled.rows),
               detail::quoted(name), ": shape ", shape_string(shape), " is not the ", scaled.rows, " x ", scaled.cols,
               " matrix of its codes (the last dimension is the row)");
  FP8KIT_CHECK(scaled.data.size() == static_cast<std::size_t>(numel), detail::quoted(name), ": ", scaled.data.size(),
               " codes for ", scaled.rows, " x ", scaled.cols);
  const PlannedTensor& planned = out.plan[1];
  const bool mx = planned.dtype == DType::uint8 || planned.dtype == DType::float8_e8m0fnu;
  const auto blocks = static_cast<std::size_t>(scaled.grid_rows() * scaled.grid_cols());
  FP8KIT_CHECK((mx ? scaled.scale_e8m0.size() : scaled.scale_inv.size()) == blocks, detail::quoted(name), ": ",
               mx ? scaled.scale_e8m0.size() : scaled.scale_inv.size(), " scales for ", blocks, " blocks");
  // What fp8kit's own loaders refuse (a NaN, infinite or negative scale) is not written either.
  for (std::size_t b = 0; b < blocks; ++b) {
    const float s = mx ? mx_scale_value(scaled.scale_e8m0[b]) : scaled.scale_inv[b];
    FP8KIT_CHECK(std::isfinite(s) && s >= 0.0f, detail::quoted(name), ": the scale of block ", b, " is ", s,
                 "; a checkpoint's scales are finite and not negative (quantize the weights again)");
  }
  if (planned.dtype == DType::bfloat16 || planned.dtype == DType::float16) {
    // The codes were encoded with float32 scales; the layout stores them in a 16-bit dtype, so they must be exact
    // there (quantize_checkpoint rounds the scales first and encodes with the rounded ones).
    Tensor s = empty({static_cast<std::int64_t>(blocks)}, DType::float32);
    std::copy(scaled.scale_inv.begin(), scaled.scale_inv.end(), s.data<float>());
    const Tensor back = s.to(planned.dtype).to(DType::float32);
    for (std::size_t i = 0; i < blocks; ++i) {
      FP8KIT_CHECK(back.data<float>()[i] == scaled.scale_inv[i], detail::quoted(name), ": the scale ",
                   scaled.scale_inv[i], " is not exactly a ", fp8kit::name(planned.dtype), ", which the ",
                   fp8kit::name(layout), " layout stores it as (use the native layout, whose scales are float32, or ",
                   "quantize the original weights into this layout)");
    }
  }
  out.scale = layout_scale_tensor(planned, scaled);
  out.metadata = layout_metadata(name, scaled.original_dtype, *scheme, scaled.format, layout);
  return out;
}

namespace {

// The weight's quantization from the mapped file: its rows in place (a copy for float64, or for rows the mapping
// does not align to their element size: a header whose length is not a multiple of 8).
Tensor quantize_mapped(const SafetensorsTensor& weight, QuantScheme scheme, Format format, CheckpointLayout layout,
                       ScaleRounding scale_rounding, CodesTo to, std::span<std::byte> codes) {
  weight.check_bytes();
  const std::optional<DType> dtype = tensor_dtype(weight.dtype);
  FP8KIT_CHECK(dtype.has_value(), detail::quoted(weight.name), " is ", name(weight.dtype),
               "; only float32, bfloat16, float16 and float64 tensors are quantized");
  const std::vector<PlannedTensor> plan =
      planned_checkpoint_tensors(weight.name, weight.shape, *dtype, scheme, format, layout);
  FP8KIT_CHECK(to != CodesTo::kBuffer || codes.size() == static_cast<std::size_t>(numel_of(weight.shape)),
               detail::quoted(weight.name), ": ", codes.size(), " bytes given for ", numel_of(weight.shape), " codes");
  const auto* data = weight.bytes.data();
  DType read_as = *dtype;
  Tensor copy;
  if (*dtype == DType::float64 || reinterpret_cast<std::uintptr_t>(data) % element_size(*dtype) != 0) {
    copy = to_tensor(weight);
    if (*dtype == DType::float64) copy = copy.to(DType::float32);
    data = copy.raw();
    read_as = copy.dtype();
  }
  ScaledTensor m;
  return quantize_planned(weight.name, matrix_of(data, read_as, weight.shape), *dtype, plan, scheme, format,
                          scale_rounding, m, to,
                          std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(codes.data()), codes.size()));
}

}  // namespace

Tensor quantize_checkpoint_tensor_into(const SafetensorsTensor& weight, QuantScheme scheme, Format format,
                                       CheckpointLayout layout, ScaleRounding scale_rounding,
                                       std::span<std::byte> codes) {
  return quantize_mapped(weight, scheme, format, layout, scale_rounding, CodesTo::kBuffer, codes);
}

Tensor quantize_checkpoint_scale(const SafetensorsTensor& weight, QuantScheme scheme, Format format,
                                 CheckpointLayout layout, ScaleRounding scale_rounding) {
  return quantize_mapped(weight, scheme, format, layout, scale_rounding, CodesTo::kNowhere, {});
}

std::optional<std::string> static_input_scale_refusal(CheckpointLayout layout) {
  if (row(layout).static_activations) return std::nullopt;
  std::vector<std::string_view> with;
  for (const LayoutRow& r : kLayouts) {
    if (r.static_activations) with.push_back(r.name);
  }
  std::string list;
  for (std::size_t i = 0; i < with.size(); ++i) {
    list += (i == 0 ? "" : i + 1 == with.size() ? " or " : ", ") + std::string(with[i]);
  }
  return "the " + std::string(name(layout)) +
         " layout has no static activation scales (its activations are quantized dynamically); use " + list;
}

std::string quantization_config_json(CheckpointLayout layout, QuantScheme scheme, Format format,
                                     const std::vector<std::string>& ignored, ScaleRounding scale_rounding,
                                     bool static_input_scales) {
  if (static_input_scales) {
    if (auto refusal = static_input_scale_refusal(layout)) FP8KIT_THROW(ErrorKind::kInvalidArgument, *refusal);
  }
  nlohmann::ordered_json q;
  std::vector<std::string> modules;  // the module names of ignored weights (without ".weight")
  for (const std::string& w : ignored) modules.push_back(ends_with(w, ".weight") ? w.substr(0, w.size() - 7) : w);
  switch (layout) {
    case CheckpointLayout::kDeepSeek:
      q = {{"activation_scheme", "dynamic"},
           {"fmt", "e4m3"},
           {"quant_method", "fp8"},
           {"weight_block_size", {128, 128}},
           {"ignored_layers", modules},           // vLLM's Fp8Config
           {"modules_to_not_convert", modules}};  // Hugging Face's FineGrainedFP8Config
      if (scale_rounding == ScaleRounding::kPowerOfTwoDown) q["scale_fmt"] = "ue8m0";  // DeepSeek-V3.1's config
      break;
    case CheckpointLayout::kAutoFp8:
      q = {{"quant_method", "fp8"},
           {"activation_scheme", static_input_scales ? "static" : "dynamic"},
           {"ignored_layers", modules},
           {"modules_to_not_convert", modules}};
      break;
    case CheckpointLayout::kFbgemm:
      q = {{"quant_method", "fbgemm_fp8"}, {"activation_scale_ub", 1200.0}, {"modules_to_not_convert", modules}};
      break;
    case CheckpointLayout::kMxfp8:
      q = {{"quant_method", "modelopt"}, {"quant_algo", "MXFP8"}, {"ignore", modules}};
      break;
    case CheckpointLayout::kCompressedTensors: {
      const char* strategy = scheme == QuantScheme::kFp8Tensor    ? "tensor"
                             : scheme == QuantScheme::kFp8Channel ? "channel"
                                                                  : "block";
      nlohmann::ordered_json weights = {{"num_bits", 8},
                                        {"type", "float"},
                                        {"strategy", strategy},
                                        {"symmetric", true},
                                        {"dynamic", false},
                                        {"group_size", nullptr},
                                        {"block_structure", nullptr},
                                        {"actorder", nullptr},
                                        {"observer", "minmax"},
                                        {"observer_kwargs", nlohmann::json::object()}};
      if (scheme == QuantScheme::kFp8Block) weights["block_structure"] = {128, 128};
      nlohmann::ordered_json acts = {{"num_bits", 8},      {"type", "float"}, {"strategy", "token"},
                                     {"symmetric", true},  {"dynamic", true}, {"group_size", nullptr},
                                     {"observer", nullptr}};
      if (static_input_scales) {  // one calibrated scale per tensor: `<module>.input_scale`
        acts["strategy"] = "tensor";
        acts["dynamic"] = false;
        acts["observer"] = "minmax";
      } else if (scheme == QuantScheme::kFp8Block) {
        acts["strategy"] = "group";
        acts["group_size"] = 128;
      }
      q = {{"quant_method", "compressed-tensors"},
           {"format", "float-quantized"},
           {"quantization_status", "compressed"},
           {"config_groups",
            {{"group_0",
              {{"targets", {"Linear"}},
               {"weights", weights},
               {"input_activations", acts},
               {"output_activations", nullptr},
               {"format", "float-quantized"}}}}},
           {"ignore", modules},
           {"kv_cache_scheme", nullptr},
           {"sparsity_config", nlohmann::json::object()},
           {"global_compression_ratio", nullptr}};
      break;
    }
    case CheckpointLayout::kNative:
      q = {{"quant_method", "fp8kit"},
           {"scheme", std::string(name(scheme))},
           {"format", std::string(name(format))},
           {"activation_scheme", static_input_scales ? "static" : "dynamic"},
           {"ignore", modules}};
      break;
  }
  return q.dump(2);
}

}  // namespace fp8kit
