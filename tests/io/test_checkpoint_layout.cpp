// Checkpoint layouts: every layout x scheme x format round trip through a safetensors image (bit-exact against
// fp8kit::dequantize, close to the original), names and shapes of the stored scales, detection, ignore rules, refusals.
#include <gtest/gtest.h>

#include <algorithm>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"
#include "io/test_files.hpp"

namespace fp8kit {
namespace {

using test_files::error_of;
using test_files::TempDir;

// A weight with rows of very different magnitudes (so per-channel and per-block scales differ) and a few zeros.
Tensor make_weight(std::int64_t rows, std::int64_t cols, DType dtype, std::uint64_t seed = 7) {
  Tensor x = randn({rows, cols}, seed, DType::float32);
  float* p = x.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::ldexp(1.0f, static_cast<int>(r % 9) - 4);
    for (std::int64_t c = 0; c < cols; ++c) p[r * cols + c] *= row_scale;
  }
  if (x.numel() > 3) p[3] = 0.0f;
  return x.to(dtype);
}

// The quantized tensors serialized and parsed back, as a reader of the file sees them.
struct Image {
  std::vector<std::byte> bytes;
  SafetensorsView view;
  std::map<std::string, std::string> metadata;
  const SafetensorsTensor& at(const std::string& n) const {
    for (const SafetensorsTensor& t : view.tensors) {
      if (t.name == n) return t;
    }
    throw std::runtime_error("no tensor " + n);
  }
};

Image serialize(const QuantizedCheckpointTensor& q) {
  std::vector<SafetensorsEntry> entries;
  for (const NamedTensor& t : q.tensors) entries.push_back(safetensors_entry(t.name, t.tensor));
  Image image;
  image.bytes = serialize_safetensors(entries, q.metadata);
  image.view = parse_safetensors(std::span<const std::byte>(image.bytes));
  image.metadata = image.view.metadata;
  return image;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), static_cast<std::size_t>(a.nbytes())) == 0;
}

// FP8's rounding error: half an ulp relative (e4m3 2^-4, e5m2 2^-3), MX FLOOR scales clip the top of a block by
// up to 1/8 more; subnormals and flushed values are bounded by the tensor's amax times a tiny fraction.
double tolerance(Format f, QuantScheme s, double x, double amax) {
  const double rel = (f == Format::e4m3fn ? 0.0625 : 0.125) + (s == QuantScheme::kMxfp8 ? 0.13 : 0.01);
  return rel * std::fabs(x) + amax * 1e-4;
}

const std::vector<std::pair<std::int64_t, std::int64_t>> kShapes = {{1, 1}, {3, 7}, {1, 33}, {129, 257}, {200, 130}};

TEST(CheckpointLayout, NamesRoundTrip) {
  for (CheckpointLayout l : kAllCheckpointLayouts) EXPECT_EQ(parse_checkpoint_layout(name(l)), l);
  for (QuantScheme s : kAllQuantSchemes) EXPECT_EQ(parse_quant_scheme(name(s)), s);
  EXPECT_FALSE(parse_checkpoint_layout("DeepSeek"));
  EXPECT_FALSE(parse_quant_scheme("fp8"));
  EXPECT_EQ(name(CheckpointLayout::kCompressedTensors), "compressed-tensors");
  EXPECT_EQ(granularity_of(QuantScheme::kFp8Block).name(), "block:128x128");
  EXPECT_EQ(granularity_of(QuantScheme::kMxfp8).name(), "mx32");
}

// Every layout x scheme x format x input dtype x awkward shape: either refused with the layout's reason, or
// stored in the layout's names/shapes/dtypes and read back bit-exactly as fp8kit::dequantize of the same matrix.
// The defaults come from the two tables: every scheme's default layout stores it; a layout that stores one scheme
// implies it, the two that store several imply nothing; resolve_storage applies the rules in order; scheme_of
// inverts granularity_of.
TEST(CheckpointLayout, DefaultsFromTheTables) {
  for (QuantScheme s : kAllQuantSchemes) {
    EXPECT_FALSE(layout_refusal(default_layout(s), s, Format::e4m3fn)) << name(s);
    EXPECT_EQ(scheme_of(granularity_of(s)), s) << name(s);
    const auto r = resolve_storage(s, std::nullopt);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->scheme, s);
    EXPECT_EQ(r->layout, default_layout(s));
  }
  EXPECT_EQ(default_layout(QuantScheme::kFp8Tensor), CheckpointLayout::kCompressedTensors);
  EXPECT_EQ(default_layout(QuantScheme::kFp8Channel), CheckpointLayout::kCompressedTensors);
  EXPECT_EQ(default_layout(QuantScheme::kFp8Block), CheckpointLayout::kDeepSeek);
  EXPECT_EQ(default_layout(QuantScheme::kMxfp8), CheckpointLayout::kMxfp8);
  EXPECT_EQ(implied_scheme(CheckpointLayout::kDeepSeek), QuantScheme::kFp8Block);
  EXPECT_EQ(implied_scheme(CheckpointLayout::kAutoFp8), QuantScheme::kFp8Tensor);
  EXPECT_EQ(implied_scheme(CheckpointLayout::kFbgemm), QuantScheme::kFp8Channel);
  EXPECT_EQ(implied_scheme(CheckpointLayout::kMxfp8), QuantScheme::kMxfp8);
  EXPECT_FALSE(implied_scheme(CheckpointLayout::kCompressedTensors));
  EXPECT_FALSE(implied_scheme(CheckpointLayout::kNative));
  for (CheckpointLayout l : kAllCheckpointLayouts) {
    if (const auto s = implied_scheme(l)) EXPECT_FALSE(layout_refusal(l, *s, Format::e4m3fn)) << name(l);
  }
  // given > implied > fallback; the layout given > the scheme's default
  EXPECT_EQ(resolve_storage(std::nullopt, CheckpointLayout::kFbgemm)->scheme, QuantScheme::kFp8Channel);
  EXPECT_EQ(resolve_storage(std::nullopt, CheckpointLayout::kFbgemm, QuantScheme::kFp8Block)->scheme,
            QuantScheme::kFp8Channel);
  EXPECT_EQ(resolve_storage(std::nullopt, CheckpointLayout::kNative, QuantScheme::kMxfp8)->scheme, QuantScheme::kMxfp8);
  EXPECT_EQ(resolve_storage(QuantScheme::kFp8Tensor, CheckpointLayout::kNative)->layout, CheckpointLayout::kNative);
  EXPECT_FALSE(resolve_storage(std::nullopt, CheckpointLayout::kCompressedTensors));
  EXPECT_FALSE(resolve_storage(std::nullopt, std::nullopt));
  EXPECT_EQ(scheme_of(Granularity::mx(MxScaleMode::kRceil)), QuantScheme::kMxfp8);
  EXPECT_FALSE(scheme_of(Granularity::block(1, 128)));
  EXPECT_FALSE(scheme_of(Granularity::column()));
  EXPECT_EQ(*static_input_scale_refusal(CheckpointLayout::kDeepSeek),
            "the deepseek layout has no static activation scales (its activations are quantized dynamically); use "
            "compressed-tensors, autofp8 or native");
}

TEST(CheckpointLayout, RoundTripEveryLayoutAndScheme) {
  int supported = 0, refused = 0;
  for (CheckpointLayout layout : kAllCheckpointLayouts) {
    for (QuantScheme scheme : kAllQuantSchemes) {
      for (Format format : {Format::e4m3fn, Format::e5m2}) {
        const auto refusal = layout_refusal(layout, scheme, format);
        for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
          for (const auto& [rows, cols] : kShapes) {
            SCOPED_TRACE(std::string(name(layout)) + " " + std::string(name(scheme)) + " " + std::string(name(format)) +
                         " " + std::string(name(dtype)) + " " + std::to_string(rows) + "x" + std::to_string(cols));
            const Tensor w = make_weight(rows, cols, dtype);
            if (refusal) {
              const Error e = error_of([&] { quantize_checkpoint_tensor("m.weight", w, scheme, format, layout); });
              EXPECT_EQ(e.what(), *refusal);
              ++refused;
              continue;
            }
            ++supported;
            const QuantizedCheckpointTensor q = quantize_checkpoint_tensor("m.weight", w, scheme, format, layout);
            ASSERT_EQ(q.tensors.size(), 2u);
            EXPECT_EQ(q.tensors[0].name, "m.weight");
            EXPECT_EQ(q.tensors[0].tensor.dtype(), dtype_of(format));
            EXPECT_EQ(q.tensors[0].tensor.shape(), w.shape());
            EXPECT_EQ(q.tensors[1].name, scale_name("m.weight", layout));
            // The plan a streaming writer lays out first is what quantizing produces.
            const auto plan = planned_checkpoint_tensors("m.weight", w.shape(), dtype, scheme, format, layout);
            ASSERT_EQ(plan.size(), 2u);
            for (std::size_t i = 0; i < 2; ++i) {
              EXPECT_EQ(plan[i].name, q.tensors[i].name);
              EXPECT_EQ(plan[i].dtype, q.tensors[i].tensor.dtype());
              EXPECT_EQ(plan[i].shape, q.tensors[i].tensor.shape());
            }
            EXPECT_EQ(layout_metadata("m.weight", dtype, scheme, format, layout), q.metadata);
            // An already quantized weight stored in the layout (fp8kit.save) is what quantizing it there writes.
            {
              const StoredScaledTensor stored = store_scaled_tensor("m.weight", q.scaled, w.shape(), layout);
              ASSERT_EQ(stored.plan.size(), 2u);
              EXPECT_EQ(stored.plan[0].name, plan[0].name);
              EXPECT_EQ(stored.plan[1].name, plan[1].name);
              EXPECT_TRUE(same_bits(stored.scale, q.tensors[1].tensor));
              EXPECT_EQ(stored.metadata, q.metadata);
            }
            // As fp8kit quantize writes: from the weight in a file image straight into the writer's buffer.
            {
              std::vector<SafetensorsEntry> entries = {safetensors_entry("m.weight", w)};
              const std::vector<std::byte> input = serialize_safetensors(entries);
              const SafetensorsView view = parse_safetensors(std::span<const std::byte>(input));
              std::vector<std::byte> codes(static_cast<std::size_t>(w.numel()), std::byte{0xAB});
              const Tensor scale = quantize_checkpoint_tensor_into(view.tensors[0], scheme, format, layout,
                                                                   ScaleRounding::kExact, codes);
              EXPECT_EQ(std::memcmp(codes.data(), q.tensors[0].tensor.raw(), codes.size()), 0);
              EXPECT_TRUE(same_bits(scale, q.tensors[1].tensor));
              EXPECT_TRUE(
                  same_bits(quantize_checkpoint_scale(view.tensors[0], scheme, format, layout), q.tensors[1].tensor));
            }
            const Granularity g = granularity_of(scheme);
            const Image image = serialize(q);
            const SafetensorsTensor& sw = image.at("m.weight");
            const SafetensorsTensor& ss = image.at(scale_name("m.weight", layout));
            const Tensor back32 =
                dequantize_checkpoint_tensor(layout, sw, ss, DType::float32, QuantizationConfig{}, image.metadata);
            EXPECT_TRUE(same_bits(back32, dequantize(q.scaled, DType::float32)));
            const Granularity read = scale_granularity(layout, sw, ss, QuantizationConfig{}, image.metadata);
            if (g.rows_per_block(rows) < rows || g.cols_per_block(cols) < cols) {  // more than one scale
              EXPECT_EQ(read.name(), g.name());
            }
            const Tensor back16 =
                dequantize_checkpoint_tensor(layout, sw, ss, DType::bfloat16, QuantizationConfig{}, image.metadata);
            EXPECT_TRUE(same_bits(back16, dequantize(q.scaled, DType::bfloat16)));
            // Straight into a buffer, as fp8kit dequantize writes: the same bits for every output dtype.
            for (DType to : {DType::float32, DType::bfloat16, DType::float16, DType::float64}) {
              const Tensor want = dequantize(q.scaled, to);
              Tensor got = empty(w.shape(), to);
              dequantize_checkpoint_tensor_into(layout, sw, ss, to,
                                                std::span<std::byte>(got.raw(), static_cast<std::size_t>(got.nbytes())),
                                                QuantizationConfig{}, image.metadata);
              EXPECT_TRUE(same_bits(got, want)) << name(to);
            }
            const Tensor orig = w.to(DType::float32);
            double amax = 0.0;
            for (float v : orig.span<float>()) amax = std::max(amax, std::fabs(static_cast<double>(v)));
            int bad = 0;
            for (std::int64_t i = 0; i < orig.numel(); ++i) {
              const double x = orig.data<float>()[i], y = back32.data<float>()[i];
              if (std::fabs(x - y) > tolerance(format, scheme, x, amax)) ++bad;
            }
            EXPECT_EQ(bad, 0);
          }
        }
      }
    }
  }
  EXPECT_EQ(supported, 15 * 3 * static_cast<int>(kShapes.size()));  // 11 layout x scheme with e4m3fn, 4 with e5m2
  EXPECT_GT(refused, 0);
}

TEST(CheckpointLayout, ScaleNamesShapesAndDtypes) {
  const Tensor w = make_weight(129, 257, DType::bfloat16);
  struct Case {
    CheckpointLayout layout;
    QuantScheme scheme;
    std::string scale;
    SafetensorsDType dtype;
    Shape shape;
  };
  const std::vector<Case> cases = {
      {CheckpointLayout::kDeepSeek, QuantScheme::kFp8Block, "m.weight_scale_inv", SafetensorsDType::F32, {2, 3}},
      {CheckpointLayout::kCompressedTensors, QuantScheme::kFp8Tensor, "m.weight_scale", SafetensorsDType::BF16, {1}},
      {CheckpointLayout::kCompressedTensors,
       QuantScheme::kFp8Channel,
       "m.weight_scale",
       SafetensorsDType::BF16,
       {129, 1}},
      {CheckpointLayout::kCompressedTensors, QuantScheme::kFp8Block, "m.weight_scale", SafetensorsDType::BF16, {2, 3}},
      {CheckpointLayout::kAutoFp8, QuantScheme::kFp8Tensor, "m.weight_scale", SafetensorsDType::F32, {}},
      {CheckpointLayout::kFbgemm, QuantScheme::kFp8Channel, "m.weight_scale", SafetensorsDType::F32, {129, 1}},
      {CheckpointLayout::kMxfp8, QuantScheme::kMxfp8, "m.weight_scale", SafetensorsDType::U8, {129, 9}},
      {CheckpointLayout::kNative, QuantScheme::kFp8Block, "m.weight.scale_inv", SafetensorsDType::F32, {2, 3}},
      {CheckpointLayout::kNative, QuantScheme::kMxfp8, "m.weight.scale_inv", SafetensorsDType::F8_E8M0, {129, 9}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(name(c.layout)) + " " + std::string(name(c.scheme)));
    const Image image = serialize(quantize_checkpoint_tensor("m.weight", w, c.scheme, Format::e4m3fn, c.layout));
    const SafetensorsTensor& s = image.at(c.scale);
    EXPECT_EQ(s.dtype, c.dtype);
    EXPECT_EQ(s.shape, c.shape);
    EXPECT_EQ(image.at("m.weight").dtype, SafetensorsDType::F8_E4M3);
  }
  // DeepSeek's block scale is the dequantization scale of each 128x128 block (edge blocks: what remains): the
  // reciprocal of the quantization scale 448/amax, each rounded once in float32 (Transformer Engine's scale_inv),
  // within an ulp of amax/448.
  const Tensor w32 = w.to(DType::float32);
  const Image ds = serialize(
      quantize_checkpoint_tensor("m.weight", w, QuantScheme::kFp8Block, Format::e4m3fn, CheckpointLayout::kDeepSeek));
  const Tensor scale = to_tensor(ds.at("m.weight_scale_inv"));
  for (int br = 0; br < 2; ++br) {
    for (int bc = 0; bc < 3; ++bc) {
      float amax = 0.0f;
      for (int r = br * 128; r < std::min(129, br * 128 + 128); ++r) {
        for (int c = bc * 128; c < std::min(257, bc * 128 + 128); ++c) {
          amax = std::max(amax, std::fabs(w32.data<float>()[r * 257 + c]));
        }
      }
      EXPECT_EQ(scale.data<float>()[br * 3 + bc], 1.0f / (448.0f / amax)) << br << "," << bc;
    }
  }
  // Native metadata says everything needed to get the tensor back.
  const Image native = serialize(
      quantize_checkpoint_tensor("m.weight", w, QuantScheme::kFp8Block, Format::e5m2, CheckpointLayout::kNative));
  EXPECT_EQ(native.metadata.at("fp8kit.layout"), "native");
  EXPECT_EQ(native.metadata.at("fp8kit.quant.m.weight"),
            "granularity=block:128x128;format=e5m2;dtype=bfloat16;overflow=saturate");
  const ScaledTensor loaded = load_checkpoint_tensor(CheckpointLayout::kNative, native.at("m.weight"),
                                                     native.at("m.weight.scale_inv"), {}, native.metadata);
  EXPECT_EQ(loaded.original_dtype, DType::bfloat16);
  EXPECT_EQ(loaded.format, Format::e5m2);
}

TEST(CheckpointLayout, NativeStoresAnyRank) {
  const Tensor w = randn({2, 3, 40}, 3, DType::float32);
  const QuantizedCheckpointTensor q =
      quantize_checkpoint_tensor("e.w", w, QuantScheme::kMxfp8, Format::e4m3fn, CheckpointLayout::kNative);
  const Image image = serialize(q);
  const Tensor back = dequantize_checkpoint_tensor(CheckpointLayout::kNative, image.at("e.w"),
                                                   image.at("e.w.scale_inv"), DType::float32, {}, image.metadata);
  EXPECT_EQ(back.shape(), w.shape());
  EXPECT_TRUE(same_bits(back, dequantize(q.scaled, DType::float32)));
}

TEST(CheckpointLayout, DetectionFromConfig) {
  const auto layout_of = [](const std::string& q) {
    return parse_quantization_config("{\"quantization_config\": " + q + "}")->layout;
  };
  EXPECT_EQ(
      layout_of(R"({"activation_scheme":"dynamic","fmt":"e4m3","quant_method":"fp8","weight_block_size":[128,128]})"),
      CheckpointLayout::kDeepSeek);
  EXPECT_EQ(layout_of(R"({"quant_method":"fp8","activation_scheme":"static"})"), CheckpointLayout::kAutoFp8);
  EXPECT_EQ(layout_of(R"({"quant_method":"compressed-tensors","format":"float-quantized"})"),
            CheckpointLayout::kCompressedTensors);
  EXPECT_EQ(layout_of(R"({"quant_method":"fbgemm_fp8"})"), CheckpointLayout::kFbgemm);
  EXPECT_EQ(layout_of(R"({"quant_method":"modelopt","quant_algo":"MXFP8"})"), CheckpointLayout::kMxfp8);
  EXPECT_EQ(layout_of(R"({"quant_method":"fp8kit"})"), CheckpointLayout::kNative);
  EXPECT_FALSE(layout_of(R"({"quant_method":"gptq"})"));
  EXPECT_FALSE(parse_quantization_config(R"({"hidden_size": 4})"));
  const auto ds =
      parse_quantization_config(R"({"quantization_config":{"quant_method":"fp8","weight_block_size":[64,32]}})");
  EXPECT_EQ(ds->block_rows, 64);
  EXPECT_EQ(ds->block_cols, 32);
  const auto ct = parse_quantization_config(
      R"({"quantization_config":{"quant_method":"compressed-tensors","config_groups":{"FP8_BLOCK":{"weights":{"block_structure":[64,64]}}}}})");
  EXPECT_EQ(ct->block_rows, 64);
  EXPECT_EQ(error_of([] { parse_quantization_config("{not json"); }).kind(), ErrorKind::kParse);
  // nlohmann quotes the bytes it stopped at; from an untrusted config.json they come out escaped (found by
  // fuzz/fuzz_layout: a 0xFF byte reached the message raw).
  const std::string bad = error_of([] { parse_quantization_config("{\"a\": 1,\xff\x1b[2J}"); }).what();
  EXPECT_NE(bad.find("0xff"), std::string::npos) << bad;  // not UTF-8 (checked before the JSON)
  const std::string escaped = error_of([] { parse_quantization_config("{\"a\": 1,\x1b[2J}"); }).what();
  EXPECT_TRUE(std::all_of(escaped.begin(), escaped.end(), [](char c) { return c >= 0x20 && c < 0x7F; })) << escaped;
  // Malformed configs are refused (kParse), not guessed at: nesting past 64 (100000 levels overflowed the stack), a
  // duplicate key, a quant_method that is not a string, a block shape that is not two positive integers.
  for (
      const std::string& config :
      {"{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", std::string(R"({"a": 1, "a": 2})"),
       std::string(R"({"quantization_config":{"quant_method":5}})"),
       std::string(R"({"quantization_config":{"quant_method":"fp8","weight_block_size":[0,0]}})"),
       std::string(R"({"quantization_config":{"quant_method":"fp8","weight_block_size":[128]}})"),
       std::string(R"({"quantization_config":{"quant_method":"fp8","weight_block_size":[128.5,128]}})"),
       std::string(R"({"quantization_config":{"quant_method":"fp8","weight_block_size":[-128,128]}})"),
       std::string(R"({"quantization_config":{"quant_method":"fp8","weight_block_size":"128"}})"),
       std::string(
           R"({"quantization_config":{"quant_method":"compressed-tensors","config_groups":{"g":{"weights":{"block_structure":[64]}}}}})")}) {
    EXPECT_EQ(error_of([&] { parse_quantization_config(config); }).kind(), ErrorKind::kParse) << config.substr(0, 100);
  }
  // null where a layout has no block shape (compressed-tensors writes block_structure: null) is no block.
  EXPECT_EQ(
      parse_quantization_config(R"({"quantization_config":{"quant_method":"fp8","weight_block_size":null}})")->layout,
      CheckpointLayout::kAutoFp8);
  EXPECT_TRUE(std::all_of(bad.begin(), bad.end(), [](char c) { return c >= 0x20 && c < 0x7F; })) << bad;
  // Every layout's own quantization_config is detected as that layout.
  for (CheckpointLayout l : kAllCheckpointLayouts) {
    for (QuantScheme s : kAllQuantSchemes) {
      if (layout_refusal(l, s, Format::e4m3fn)) continue;
      EXPECT_EQ(layout_of(quantization_config_json(l, s, Format::e4m3fn, {"lm_head.weight"})), l) << name(l);
    }
  }
}

TEST(CheckpointLayout, DetectionFromTensors) {
  TempDir dir;
  const Tensor w = make_weight(130, 70, DType::bfloat16);
  const Tensor norm = ones({70}, DType::bfloat16);
  struct Case {
    CheckpointLayout layout;
    QuantScheme scheme;
    CheckpointLayout detected;
  };
  const std::vector<Case> cases = {
      {CheckpointLayout::kDeepSeek, QuantScheme::kFp8Block, CheckpointLayout::kDeepSeek},
      {CheckpointLayout::kCompressedTensors, QuantScheme::kFp8Tensor, CheckpointLayout::kCompressedTensors},
      {CheckpointLayout::kCompressedTensors, QuantScheme::kFp8Channel, CheckpointLayout::kCompressedTensors},
      {CheckpointLayout::kAutoFp8, QuantScheme::kFp8Tensor, CheckpointLayout::kAutoFp8},
      {CheckpointLayout::kFbgemm, QuantScheme::kFp8Channel, CheckpointLayout::kFbgemm},
      {CheckpointLayout::kMxfp8, QuantScheme::kMxfp8, CheckpointLayout::kMxfp8},
      {CheckpointLayout::kNative, QuantScheme::kFp8Channel, CheckpointLayout::kNative},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(name(c.layout)));
    const QuantizedCheckpointTensor q =
        quantize_checkpoint_tensor("l.0.q_proj.weight", w, c.scheme, Format::e4m3fn, c.layout);
    std::vector<SafetensorsEntry> entries = {safetensors_entry("l.0.norm.weight", norm)};
    for (const NamedTensor& t : q.tensors) entries.push_back(safetensors_entry(t.name, t.tensor));
    const Tensor input_scale = scalar_tensor(0.5, DType::float32);
    if (c.layout == CheckpointLayout::kAutoFp8)
      entries.push_back(safetensors_entry("l.0.q_proj.input_scale", input_scale));
    const auto path = dir / (std::string(name(c.layout)) + ".safetensors");
    write_safetensors(path, entries, q.metadata);
    const SafetensorsFile f = SafetensorsFile::open(path);
    EXPECT_EQ(detect_layout(f).layout, c.detected);
    const ShardedCheckpoint ck = ShardedCheckpoint::open(path);
    EXPECT_EQ(detect_layout(ck).layout, c.detected);
    const auto weights = quantized_weights(ck, c.detected);
    ASSERT_EQ(weights.size(), 1u);
    EXPECT_EQ(weights[0].weight, "l.0.q_proj.weight");
    EXPECT_EQ(weights[0].scale, scale_name("l.0.q_proj.weight", c.detected));
    EXPECT_EQ(weights[0].input_scale.has_value(), c.layout == CheckpointLayout::kAutoFp8);
    // A config.json decides over the tensors when its layout's scales are there; otherwise the tensors do.
    const std::string ct = R"({"quantization_config":{"quant_method":"compressed-tensors"}})";
    const LayoutDetection with_config = detect_layout(f, ct);
    if (scale_name("x", c.detected) == scale_name("x", CheckpointLayout::kCompressedTensors)) {
      EXPECT_EQ(with_config.layout, CheckpointLayout::kCompressedTensors);
      EXPECT_EQ(with_config.evidence, "config.json quantization_config says compressed-tensors");
    } else {
      EXPECT_EQ(with_config.layout, c.detected);
      EXPECT_NE(with_config.evidence.find("but its scales are not there"), std::string::npos) << with_config.evidence;
    }
  }
  // No scales: nothing quantized.
  const auto plain = dir / "plain.safetensors";
  write_safetensors(plain, std::vector<SafetensorsEntry>{safetensors_entry("a.weight", w)});
  EXPECT_FALSE(detect_layout(SafetensorsFile::open(plain)).layout);
  const LayoutDetection plain_config =
      detect_layout(SafetensorsFile::open(plain), R"({"quantization_config":{"quant_method":"fp8"}})");
  EXPECT_FALSE(plain_config.layout);
  EXPECT_EQ(plain_config.evidence, "config.json quantization_config says autofp8, but no FP8 weight has its scale");
  // A weight with a DeepSeek scale and a compressed-tensors one: the tensors cannot say which dequantizes it, so
  // detection refuses it, naming both; a config.json that names the layout decides.
  const QuantizedCheckpointTensor ds =
      quantize_checkpoint_tensor("a.weight", w, QuantScheme::kFp8Block, Format::e4m3fn, CheckpointLayout::kDeepSeek);
  std::vector<SafetensorsEntry> both;
  for (const NamedTensor& t : ds.tensors) both.push_back(safetensors_entry(t.name, t.tensor));
  const Tensor other = scalar_tensor(0.5, DType::float32);
  both.push_back(safetensors_entry("a.weight_scale", other));
  const auto two = dir / "two-scales.safetensors";
  write_safetensors(two, both, ds.metadata);
  testing::expect_error(
      [&] { (void)detect_layout(SafetensorsFile::open(two)); }, ErrorKind::kParse,
      {"'a.weight' has 2 scales of different layouts ('a.weight_scale_inv', 'a.weight_scale')", "config.json"});
  testing::expect_error([&] { (void)detect_layout(ShardedCheckpoint::open(two)); }, ErrorKind::kParse,
                        {"'a.weight' has 2 scales"});
  // ... whichever weight it is: here the first (name order) has one scale and decides, the second has two.
  std::vector<SafetensorsEntry> later = both;
  for (SafetensorsEntry& e : later) e.name = "z" + e.name.substr(1);
  for (const NamedTensor& t : ds.tensors) later.push_back(safetensors_entry(t.name, t.tensor));
  const auto second = dir / "two-scales-second.safetensors";
  write_safetensors(second, later, ds.metadata);
  testing::expect_error([&] { (void)detect_layout(SafetensorsFile::open(second)); }, ErrorKind::kParse,
                        {"'z.weight' has 2 scales"});
  // The names come from the file: a control character in them is printed escaped, never raw.
  std::vector<SafetensorsEntry> escaped = both;
  for (SafetensorsEntry& e : escaped) e.name = "\x1b[2J" + e.name;
  const auto odd = dir / "two-scales-escaped.safetensors";
  write_safetensors(odd, escaped, ds.metadata);
  try {
    (void)detect_layout(SafetensorsFile::open(odd));
    ADD_FAILURE() << "two scales with an escape in their names were not refused";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\x1b'), std::string::npos) << what;
    EXPECT_NE(what.find("'\\x1b[2Ja.weight' has 2 scales"), std::string::npos) << what;
    EXPECT_NE(what.find("'\\x1b[2Ja.weight_scale'"), std::string::npos) << what;
  }
  const char* block = R"({"quantization_config":{"quant_method":"fp8","weight_block_size":[128,128]}})";
  EXPECT_EQ(detect_layout(SafetensorsFile::open(two), block).layout, CheckpointLayout::kDeepSeek);
  EXPECT_EQ(detect_layout(SafetensorsFile::open(two), R"({"quantization_config":{"quant_method":"fp8"}})").layout,
            CheckpointLayout::kAutoFp8);
}

TEST(CheckpointLayout, DefaultIgnoreRules) {
  const Shape m = {64, 32};
  const auto bf = SafetensorsDType::BF16;
  EXPECT_FALSE(skip_reason("model.layers.0.self_attn.q_proj.weight", bf, m));
  EXPECT_FALSE(skip_reason("model.layers.0.mlp.gate_proj.weight", bf, m));
  EXPECT_FALSE(skip_reason("model.layers.0.mlp.experts.3.down_proj.weight", SafetensorsDType::F32, m));
  EXPECT_EQ(skip_reason("model.embed_tokens.weight", bf, m), "an embedding");
  EXPECT_EQ(skip_reason("transformer.wte.weight", bf, m), "an embedding");
  EXPECT_EQ(skip_reason("lm_head.weight", bf, m), "lm_head");
  EXPECT_EQ(skip_reason("model.layers.0.mlp.gate.weight", bf, {8, 32}), "an MoE router");
  EXPECT_EQ(skip_reason("model.layers.0.block_sparse_moe.router.weight", bf, {8, 32}), "an MoE router");
  EXPECT_EQ(skip_reason("model.layers.0.input_layernorm.weight", bf, {32}), "not 2-D");
  EXPECT_EQ(skip_reason("model.norm_like_proj.weight", bf, m), "a norm");
  EXPECT_EQ(skip_reason("model.layers.0.self_attn.q_proj.bias", bf, {64}), "not 2-D");
  EXPECT_EQ(skip_reason("model.layers.0.mlp.up_proj.lora", bf, m), "not a '.weight'");
  EXPECT_EQ(skip_reason("model.layers.0.mlp.up_proj.weight", SafetensorsDType::F8_E4M3, m),
            "dtype F8_E4M3 is not F32/BF16/F16/F64");
  EXPECT_EQ(skip_reason("model.layers.0.mlp.up_proj.weight", SafetensorsDType::I32, m),
            "dtype I32 is not F32/BF16/F16/F64");
  const std::vector<std::regex> ignore = {std::regex("layers\\.0\\."), std::regex("v_proj$")};
  EXPECT_EQ(skip_reason("model.layers.0.mlp.up_proj.weight", bf, m, ignore), "matches --ignore");
  EXPECT_FALSE(skip_reason("model.layers.1.mlp.up_proj.weight", bf, m, ignore));
  // A name too long to match by std::regex's recursion (20000 characters overflowed the stack) is refused when
  // there are patterns; without them it is only a name.
  const std::string long_name = std::string(20000, 'a') + ".weight";
  EXPECT_THROW(skip_reason(long_name, bf, m, {std::regex("(a|b)*c")}), Error);
  EXPECT_FALSE(skip_reason(long_name, bf, m));
  EXPECT_EQ(skip_reason(std::string(4000, 'a') + "c.weight", bf, m, {std::regex("(a|b)*c")}), "matches --ignore");
}

TEST(CheckpointLayout, Refusals) {
  const Tensor w = make_weight(4, 40, DType::float32);
  EXPECT_EQ(std::string(error_of([&] {
                          quantize_checkpoint_tensor("w", w, QuantScheme::kFp8Tensor, Format::e4m3fn,
                                                     CheckpointLayout::kDeepSeek);
                        }).what()),
            "the deepseek layout cannot store fp8-tensor weights (it stores fp8-block; --layout native stores every "
            "scheme)");
  EXPECT_EQ(std::string(error_of([&] {
                          quantize_checkpoint_tensor("w", w, QuantScheme::kFp8Block, Format::e5m2,
                                                     CheckpointLayout::kDeepSeek);
                        }).what()),
            "the deepseek layout stores e4m3fn (F8_E4M3) weights, not e5m2 (--layout native stores e5m2)");
  EXPECT_TRUE(layout_refusal(CheckpointLayout::kNative, QuantScheme::kFp8Block, Format::e4m3fnuz));
  EXPECT_TRUE(layout_refusal(CheckpointLayout::kCompressedTensors, QuantScheme::kMxfp8, Format::e4m3fn));
  EXPECT_TRUE(layout_refusal(CheckpointLayout::kFbgemm, QuantScheme::kFp8Tensor, Format::e4m3fn));
  const Tensor w3 = randn({2, 3, 4}, 1, DType::float32);
  EXPECT_NE(std::string(error_of([&] {
                          quantize_checkpoint_tensor("w", w3, QuantScheme::kFp8Block, Format::e4m3fn,
                                                     CheckpointLayout::kDeepSeek);
                        }).what())
                .find("quantizes 2-D [out, in] weights"),
            std::string::npos);
  const Tensor ints = zeros({4, 4}, DType::int32);
  EXPECT_EQ(error_of([&] {
              quantize_checkpoint_tensor("w", ints, QuantScheme::kFp8Tensor, Format::e4m3fn, CheckpointLayout::kNative);
            }).kind(),
            ErrorKind::kInvalidArgument);
  // Reading: a scale that does not fit the weight, a weight that is not FP8, native without its metadata.
  const Image ds =
      serialize(quantize_checkpoint_tensor("m.weight", make_weight(300, 200, DType::float32), QuantScheme::kFp8Block,
                                           Format::e4m3fn, CheckpointLayout::kDeepSeek));
  const SafetensorsTensor& weight = ds.at("m.weight");
  const SafetensorsTensor& scale = ds.at("m.weight_scale_inv");
  EXPECT_NE(
      std::string(error_of([&] {
                    load_checkpoint_tensor(CheckpointLayout::kDeepSeek, weight, scale, QuantizationConfig{{}, 64, 64});
                  }).what())
          .find("the scale fits no granularity: one element (tensor), [300, 1] or [300] (channel), or [5, 4] "
                "(block:64x64)"),
      std::string::npos);
  EXPECT_NE(std::string(error_of([&] { load_checkpoint_tensor(CheckpointLayout::kDeepSeek, scale, scale); }).what())
                .find("not an FP8 weight"),
            std::string::npos);
  EXPECT_NE(std::string(error_of([&] { load_checkpoint_tensor(CheckpointLayout::kNative, weight, scale); }).what())
                .find("has no __metadata__ entry"),
            std::string::npos);
  EXPECT_NE(std::string(error_of([&] { load_checkpoint_tensor(CheckpointLayout::kMxfp8, weight, scale); }).what())
                .find("U8 or F8_E8M0"),
            std::string::npos);
}

// An empty weight ([0, 256]) as other writers leave it: one per-tensor scale, or a block grid that counts the other
// side's blocks ([0, 2]), or MX codes for none. Each reads as the empty ScaledTensor fp8kit holds (no scales) and
// dequantizes to an empty tensor of the weight's shape; a scale with more than one element and none to scale is
// still refused.
TEST(CheckpointLayout, EmptyWeightWithTheScalesOtherWritersGiveIt) {
  const Tensor codes = empty({0, 256}, DType::float8_e4m3fn);
  const Tensor one = scalar_tensor(0.5, DType::float32), grid = empty({0, 2}, DType::float32);
  Tensor mx = empty({0, 8}, DType::float8_e8m0fnu);
  const Tensor three = tensor(std::vector<double>{1, 2, 3}, Shape{3}, DType::float32);
  struct Case {
    CheckpointLayout layout;
    const char* scale_name;
    const Tensor* scale;
    Granularity::Kind kind;
  };
  for (const Case& c : {Case{CheckpointLayout::kAutoFp8, "x.weight_scale", &one, Granularity::Kind::kTensor},
                        Case{CheckpointLayout::kDeepSeek, "x.weight_scale_inv", &grid, Granularity::Kind::kBlock},
                        Case{CheckpointLayout::kMxfp8, "x.weight_scale", &mx, Granularity::Kind::kMx}}) {
    SCOPED_TRACE(std::string(name(c.layout)));
    std::vector<std::byte> bytes = serialize_safetensors(
        std::vector<SafetensorsEntry>{safetensors_entry("x.weight", codes), safetensors_entry(c.scale_name, *c.scale)});
    const SafetensorsView v = parse_safetensors(std::span<const std::byte>(bytes));
    const SafetensorsTensor& w = v.tensors[0].name == "x.weight" ? v.tensors[0] : v.tensors[1];
    const SafetensorsTensor& s = v.tensors[0].name == "x.weight" ? v.tensors[1] : v.tensors[0];
    const ScaledTensor m = load_checkpoint_tensor(c.layout, w, s);
    EXPECT_EQ(m.granularity.kind, c.kind);
    EXPECT_TRUE(m.data.empty());
    EXPECT_TRUE(m.scale_inv.empty());
    EXPECT_EQ(m.original_shape, (Shape{0, 256}));
    const Tensor out = dequantize_checkpoint_tensor(c.layout, w, s, DType::bfloat16);
    EXPECT_EQ(out.shape(), (Shape{0, 256}));
    std::vector<std::byte> none;
    EXPECT_NO_THROW(dequantize_checkpoint_tensor_into(c.layout, w, s, DType::float32, none));
  }
  std::vector<std::byte> bytes = serialize_safetensors(
      std::vector<SafetensorsEntry>{safetensors_entry("x.weight", codes), safetensors_entry("x.weight_scale", three)});
  const SafetensorsView v = parse_safetensors(std::span<const std::byte>(bytes));
  const SafetensorsTensor& w = v.tensors[0].name == "x.weight" ? v.tensors[0] : v.tensors[1];
  const SafetensorsTensor& s = v.tensors[0].name == "x.weight" ? v.tensors[1] : v.tensors[0];
  testing::expect_error([&] { (void)load_checkpoint_tensor(CheckpointLayout::kCompressedTensors, w, s); },
                        ErrorKind::kInvalidArgument, {"'x.weight' [0, 256] with scale 'x.weight_scale' F32 [3]"});
}

// A DeepSeek weight written by hand (codes and amax/448 scales computed here) reads back as code * scale.
TEST(CheckpointLayout, DeepSeekHandWrittenEdgeBlocks) {
  const std::int64_t rows = 130, cols = 129;
  Tensor codes = empty({rows, cols}, DType::float8_e4m3fn);
  for (std::int64_t i = 0; i < rows * cols; ++i)
    codes.data<std::uint8_t>()[i] = static_cast<std::uint8_t>((i * 37) % 126);
  const std::vector<double> sv = {0.5, 0.25, 2.0, 0.125};
  const Tensor scale = tensor(sv, Shape{2, 2}, DType::float32);
  const std::vector<SafetensorsEntry> entries = {safetensors_entry("x.weight", codes),
                                                 safetensors_entry("x.weight_scale_inv", scale)};
  std::vector<std::byte> bytes = serialize_safetensors(entries);
  const SafetensorsView v = parse_safetensors(std::span<const std::byte>(bytes));
  const Tensor out = dequantize_checkpoint_tensor(
      CheckpointLayout::kDeepSeek, v.tensors[1].name == "x.weight" ? v.tensors[1] : v.tensors[0],
      v.tensors[1].name == "x.weight" ? v.tensors[0] : v.tensors[1], DType::float32);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const float expect = decode_to_float(Format::e4m3fn, codes.data<std::uint8_t>()[r * cols + c]) *
                           static_cast<float>(sv[static_cast<std::size_t>((r / 128) * 2 + c / 128)]);
      ASSERT_EQ(out.data<float>()[r * cols + c], expect) << r << "," << c;
    }
  }
}

// DeepSeek-V4 stores the block scales as F8_E8M0 codes: over the configured block grid they are block scales
// (2^(code - 127) each), through both dequantize paths; E8M0 codes over the MX grid stay MX scales.
TEST(CheckpointLayout, DeepSeekE8m0BlockScales) {
  const std::int64_t rows = 200, cols = 300;
  Tensor codes = empty({rows, cols}, DType::float8_e4m3fn);
  for (std::int64_t i = 0; i < rows * cols; ++i)
    codes.data<std::uint8_t>()[i] = static_cast<std::uint8_t>((i * 37) % 126);
  const std::vector<std::uint8_t> sv = {118, 127, 130, 121, 125, 0};  // 2^-9, 1, 8, 2^-6, 2^-2, 2^-127
  Tensor scale = empty({2, 3}, DType::float8_e8m0fnu);
  std::copy(sv.begin(), sv.end(), scale.data<std::uint8_t>());
  const std::vector<SafetensorsEntry> entries = {safetensors_entry("x.weight", codes),
                                                 safetensors_entry("x.weight_scale_inv", scale)};
  std::vector<std::byte> bytes = serialize_safetensors(entries);
  const SafetensorsView v = parse_safetensors(std::span<const std::byte>(bytes));
  const SafetensorsTensor& w = v.tensors[0].name == "x.weight" ? v.tensors[0] : v.tensors[1];
  const SafetensorsTensor& s = v.tensors[0].name == "x.weight" ? v.tensors[1] : v.tensors[0];
  ASSERT_EQ(s.dtype, SafetensorsDType::F8_E8M0);
  EXPECT_EQ(scale_granularity(CheckpointLayout::kDeepSeek, w, s).name(), "block:128x128");
  const Tensor out = dequantize_checkpoint_tensor(CheckpointLayout::kDeepSeek, w, s, DType::float32);
  std::vector<float> into(static_cast<std::size_t>(rows * cols));
  dequantize_checkpoint_tensor_into(CheckpointLayout::kDeepSeek, w, s, DType::float32,
                                    std::as_writable_bytes(std::span(into)));
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const int e = sv[static_cast<std::size_t>((r / 128) * 3 + c / 128)] - 127;
      const float expect =
          decode_to_float(Format::e4m3fn, codes.data<std::uint8_t>()[r * cols + c]) * std::ldexp(1.0f, e);
      ASSERT_EQ(out.data<float>()[r * cols + c], expect) << r << "," << c;
      ASSERT_EQ(into[static_cast<std::size_t>(r * cols + c)], expect) << r << "," << c;
    }
  }
  // The same codes over the MX grid ([rows, cols / 32]): MX scales, as before.
  Tensor mx = empty({rows, 10}, DType::float8_e8m0fnu);
  std::fill_n(mx.data<std::uint8_t>(), rows * 10, std::uint8_t{127});
  const std::vector<SafetensorsEntry> mx_entries = {safetensors_entry("x.weight", codes),
                                                    safetensors_entry("x.weight_scale_inv", mx)};
  bytes = serialize_safetensors(mx_entries);
  const SafetensorsView m = parse_safetensors(std::span<const std::byte>(bytes));
  const SafetensorsTensor& mw = m.tensors[0].name == "x.weight" ? m.tensors[0] : m.tensors[1];
  const SafetensorsTensor& ms = m.tensors[0].name == "x.weight" ? m.tensors[1] : m.tensors[0];
  EXPECT_EQ(scale_granularity(CheckpointLayout::kDeepSeek, mw, ms).kind, Granularity::Kind::kMx);
  // A hand-built config with a block side of 0 divided by zero (SIGFPE); one past the largest side is refused too.
  for (const auto& [br, bc] :
       {std::pair<std::int64_t, std::int64_t>{0, 0}, {128, 0}, {-1, 128}, {Granularity::kMaxBlockSide + 1, 128}}) {
    QuantizationConfig config;
    config.block_rows = br;
    config.block_cols = bc;
    testing::expect_error(
        [&] { (void)dequantize_checkpoint_tensor(CheckpointLayout::kDeepSeek, w, s, DType::float32, config); },
        ErrorKind::kInvalidArgument, {"the quantization config's block is"});
  }
}

// quantize_checkpoint_tensor_into reads float64 weights and weights the file does not align to their element size
// (a header whose length is not a multiple of 8) through a copy, with the same result; a wrong buffer is refused.
TEST(CheckpointLayout, QuantizeIntoFloat64AndMisalignedWeights) {
  const std::int64_t rows = 300, cols = 260;
  for (DType dtype : {DType::float64, DType::bfloat16, DType::float16, DType::float32}) {
    SCOPED_TRACE(std::string(name(dtype)));
    const Tensor w = make_weight(rows, cols, dtype, 11);
    const QuantizedCheckpointTensor want =
        quantize_checkpoint_tensor("m.weight", w, QuantScheme::kFp8Block, Format::e4m3fn, CheckpointLayout::kDeepSeek);
    // The file image by hand: a header of odd length puts the data at an odd offset.
    std::string header = "{\"m.weight\":{\"dtype\":\"" + std::string(name(safetensors_dtype(dtype))) +
                         "\",\"shape\":[" + std::to_string(rows) + "," + std::to_string(cols) +
                         "],\"data_offsets\":[0," + std::to_string(w.nbytes()) + "]}}";
    if (header.size() % 2 == 0) header += ' ';
    std::vector<std::byte> image(8 + header.size() + static_cast<std::size_t>(w.nbytes()));
    for (int i = 0; i < 8; ++i) image[static_cast<std::size_t>(i)] = static_cast<std::byte>(header.size() >> (8 * i));
    std::memcpy(image.data() + 8, header.data(), header.size());
    std::memcpy(image.data() + 8 + header.size(), w.raw(), static_cast<std::size_t>(w.nbytes()));
    const SafetensorsView view = parse_safetensors(std::span<const std::byte>(image));
    ASSERT_NE(reinterpret_cast<std::uintptr_t>(view.tensors[0].bytes.data()) % 2, 0u);
    std::vector<std::byte> codes(static_cast<std::size_t>(w.numel()));
    const Tensor scale = quantize_checkpoint_tensor_into(view.tensors[0], QuantScheme::kFp8Block, Format::e4m3fn,
                                                         CheckpointLayout::kDeepSeek, ScaleRounding::kExact, codes);
    EXPECT_EQ(std::memcmp(codes.data(), want.tensors[0].tensor.raw(), codes.size()), 0);
    EXPECT_TRUE(same_bits(scale, want.tensors[1].tensor));
    EXPECT_TRUE(same_bits(
        quantize_checkpoint_scale(view.tensors[0], QuantScheme::kFp8Block, Format::e4m3fn, CheckpointLayout::kDeepSeek),
        want.tensors[1].tensor));
    std::vector<std::byte> short_buffer(codes.size() - 1);
    EXPECT_THROW(quantize_checkpoint_tensor_into(view.tensors[0], QuantScheme::kFp8Block, Format::e4m3fn,
                                                 CheckpointLayout::kDeepSeek, ScaleRounding::kExact, short_buffer),
                 Error);
  }
}

// A weight with NaN or Inf, or a float64 value past float32's range, is refused by every scheme and entry point
// (saturation would store the infinity as the largest finite value, and the scale ignores it), naming the weight.
TEST(CheckpointLayout, NonFiniteWeightsAreRefused) {
  const std::int64_t rows = 256, cols = 256;
  for (DType dtype : {DType::float64, DType::bfloat16, DType::float32}) {
    for (double bad : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(), 1e300}) {
      if (bad == 1e300 && dtype != DType::float64) continue;
      Tensor w = make_weight(rows, cols, dtype, 5).to(DType::float64);
      w.data<double>()[rows * cols - 7] = bad;
      w = w.to(dtype);
      for (QuantScheme scheme : kAllQuantSchemes) {
        SCOPED_TRACE(std::string(name(dtype)) + " " + std::to_string(bad) + " " + std::string(name(scheme)));
        const CheckpointLayout layout = scheme == QuantScheme::kMxfp8      ? CheckpointLayout::kMxfp8
                                        : scheme == QuantScheme::kFp8Block ? CheckpointLayout::kDeepSeek
                                                                           : CheckpointLayout::kCompressedTensors;
        testing::expect_error([&] { (void)quantize_checkpoint_tensor("m.weight", w, scheme, Format::e4m3fn, layout); },
                              ErrorKind::kInvalidArgument,
                              {"'m.weight' holds", dtype == DType::float64 ? "past float32's range" : "--ignore"});
        const std::string header = "{\"m.weight\":{\"dtype\":\"" + std::string(name(safetensors_dtype(dtype))) +
                                   "\",\"shape\":[256,256],\"data_offsets\":[0," + std::to_string(w.nbytes()) + "]}}";
        std::vector<std::byte> image(8 + header.size() + static_cast<std::size_t>(w.nbytes()));
        for (int i = 0; i < 8; ++i)
          image[static_cast<std::size_t>(i)] = static_cast<std::byte>(header.size() >> (8 * i));
        std::memcpy(image.data() + 8, header.data(), header.size());
        std::memcpy(image.data() + 8 + header.size(), w.raw(), static_cast<std::size_t>(w.nbytes()));
        const SafetensorsView view = parse_safetensors(std::span<const std::byte>(image));
        std::vector<std::byte> codes(static_cast<std::size_t>(w.numel()));
        testing::expect_error(
            [&] {
              (void)quantize_checkpoint_tensor_into(view.tensors[0], scheme, Format::e4m3fn, layout,
                                                    ScaleRounding::kExact, codes);
            },
            ErrorKind::kInvalidArgument, {"'m.weight' holds"});
        testing::expect_error([&] { (void)quantize_checkpoint_scale(view.tensors[0], scheme, Format::e4m3fn, layout); },
                              ErrorKind::kInvalidArgument, {"'m.weight' holds"});
      }
    }
  }
}

// dequantize_checkpoint_tensor_into on a weight large enough for its threaded path, every code of every FP8 format
// (NaN, Inf, subnormals, both zeros) and scales of all sizes: bit for bit what the Tensor path gives, and the checks.
TEST(CheckpointLayout, DequantizeIntoMatchesTheTensorPath) {
  const std::int64_t rows = 1030, cols = 1100;  // 9 x 9 blocks of 128 x 128, the last ones partial
  for (DType fp8 : {DType::float8_e4m3fn, DType::float8_e5m2, DType::float8_e4m3fnuz, DType::float8_e5m2fnuz}) {
    Tensor codes = empty({rows, cols}, fp8);
    for (std::int64_t i = 0; i < rows * cols; ++i)
      codes.data<std::uint8_t>()[i] = static_cast<std::uint8_t>((i * 37 + i / 251) % 256);
    std::vector<double> sv(81);
    for (std::size_t i = 0; i < sv.size(); ++i)
      sv[i] = std::ldexp(1.0 + 0.1 * static_cast<double>(i % 7), int(i % 61) - 30);
    const Tensor scale = tensor(sv, Shape{9, 9}, DType::float32);
    const std::vector<SafetensorsEntry> entries = {safetensors_entry("x.weight", codes),
                                                   safetensors_entry("x.weight_scale_inv", scale)};
    const std::vector<std::byte> bytes = serialize_safetensors(entries);
    const SafetensorsView v = parse_safetensors(std::span<const std::byte>(bytes));
    const SafetensorsTensor& w = v.tensors[1].name == "x.weight" ? v.tensors[1] : v.tensors[0];
    const SafetensorsTensor& s = v.tensors[1].name == "x.weight" ? v.tensors[0] : v.tensors[1];
    for (DType to : {DType::float32, DType::bfloat16, DType::float16}) {
      const Tensor want = dequantize_checkpoint_tensor(CheckpointLayout::kDeepSeek, w, s, to);
      Tensor got = empty({rows, cols}, to);
      dequantize_checkpoint_tensor_into(CheckpointLayout::kDeepSeek, w, s, to,
                                        std::span<std::byte>(got.raw(), static_cast<std::size_t>(got.nbytes())));
      EXPECT_TRUE(same_bits(got, want)) << name(fp8) << " -> " << name(to);
    }
    Tensor small = empty({rows, cols - 1}, DType::bfloat16);
    const Error e = error_of([&] {
      dequantize_checkpoint_tensor_into(CheckpointLayout::kDeepSeek, w, s, DType::bfloat16,
                                        std::span<std::byte>(small.raw(), static_cast<std::size_t>(small.nbytes())));
    });
    EXPECT_NE(std::string(e.what()).find("need"), std::string::npos) << e.what();
  }
}

TEST(CheckpointLayout, StoreScaledTensorRefusesWhatNoLayoutHoldsExactly) {
  const Tensor w = make_weight(130, 256, DType::bfloat16);
  const QuantizeOptions row{Format::e4m3fn, Overflow::kSaturate, Granularity::row()};
  const ScaledTensor q = quantize(w, row);
  // compressed-tensors stores the scales in the weight's dtype: these float32 scales are not bfloat16 values.
  testing::expect_error([&] { store_scaled_tensor("m.weight", q, w.shape(), CheckpointLayout::kCompressedTensors); },
                        ErrorKind::kInvalidArgument, {"is not exactly a bfloat16"});
  // Powers of two are, and are stored as they are.
  QuantizeOptions pow2 = row;
  pow2.scale.rounding = ScaleRounding::kPowerOfTwoDown;
  const ScaledTensor p = quantize(w, pow2);
  const StoredScaledTensor stored = store_scaled_tensor("m.weight", p, w.shape(), CheckpointLayout::kCompressedTensors);
  EXPECT_EQ(stored.scale.dtype(), DType::bfloat16);
  const Tensor back = stored.scale.to(DType::float32);
  EXPECT_TRUE(std::equal(p.scale_inv.begin(), p.scale_inv.end(), back.data<float>()));
  // No layout stores 1x128 blocks; a shape that is not the codes' is refused; so is a layout's own refusal.
  const ScaledTensor blocks = quantize(w, {Format::e4m3fn, Overflow::kSaturate, Granularity::block(1, 128)});
  testing::expect_error([&] { store_scaled_tensor("m.weight", blocks, w.shape(), CheckpointLayout::kNative); },
                        ErrorKind::kInvalidArgument, {"which no checkpoint layout stores"});
  // Nor MX blocks other than 1 x 32 (a hand-built Granularity): mx8's scales overflowed the mxfp8 scale tensor.
  for (const std::int64_t width : {8, 16, 64}) {
    const ScaledTensor mx = quantize(
        w, {Format::e4m3fn, Overflow::kSaturate, Granularity{Granularity::Kind::kMx, 1, width, MxScaleMode::kFloor}});
    for (const CheckpointLayout layout : {CheckpointLayout::kMxfp8, CheckpointLayout::kNative}) {
      testing::expect_error([&] { store_scaled_tensor("m.weight", mx, w.shape(), layout); },
                            ErrorKind::kInvalidArgument, {"which no checkpoint layout stores"});
    }
  }
  // What the loaders refuse is not written: a NaN, infinite or negative scale.
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), -1.0f, std::numeric_limits<float>::infinity()}) {
    ScaledTensor changed = q;
    changed.scale_inv[3] = bad;
    testing::expect_error([&] { store_scaled_tensor("m.weight", changed, w.shape(), CheckpointLayout::kNative); },
                          ErrorKind::kInvalidArgument, {"the scale of block 3 is", "finite and not negative"});
  }
  testing::expect_error(
      [&] {
        store_scaled_tensor("m.weight", q, Shape{130, 255}, CheckpointLayout::kFbgemm);
      },
      ErrorKind::kInvalidArgument, {"shape [130, 255] is not the 130 x 256 matrix of its codes"});
  // The same element count in another matrix: the plan would size the scales by [256, 130]'s 256 rows (or, the
  // other way round, write past a scale tensor sized for fewer rows): refused before anything is copied.
  testing::expect_error(
      [&] {
        store_scaled_tensor("m.weight", q, Shape{256, 130}, CheckpointLayout::kFbgemm);
      },
      ErrorKind::kInvalidArgument, {"shape [256, 130] is not the 130 x 256 matrix of its codes"});
  const ScaledTensor tall = quantize(make_weight(256, 4, DType::float32), row);
  testing::expect_error(
      [&] {
        store_scaled_tensor("m.weight", tall, Shape{4, 256}, CheckpointLayout::kFbgemm);
      },
      ErrorKind::kInvalidArgument, {"shape [4, 256] is not the 256 x 4 matrix of its codes"});
  ScaledTensor short_codes = q;
  short_codes.data.pop_back();
  testing::expect_error([&] { store_scaled_tensor("m.weight", short_codes, w.shape(), CheckpointLayout::kFbgemm); },
                        ErrorKind::kInvalidArgument, {"33279 codes for 130 x 256"});
  testing::expect_error([&] { store_scaled_tensor("m.weight", q, w.shape(), CheckpointLayout::kDeepSeek); },
                        ErrorKind::kInvalidArgument, {"the deepseek layout cannot store fp8-channel weights"});
}

}  // namespace
}  // namespace fp8kit
