// A small CNN (a 7x7 stride-2 stem, 3x3 blocks, global average pooling, a linear head) built from the nn layers,
// and the generated images it trains on: procedurally drawn shapes and patterns, seeded, no downloads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fp8kit/nn/conv2d.hpp"
#include "fp8kit/nn/head.hpp"
#include "fp8kit/nn/layers.hpp"
#include "fp8kit/nn/linear.hpp"
#include "fp8kit/nn/model.hpp"
#include "fp8kit/nn/pooling.hpp"

namespace fp8kit::nn {

struct CnnConfig {
  std::int64_t image_channels = 3;
  std::int64_t classes = 8;
  std::int64_t stem_channels = 32;
  bool stem_pool = true;  // a 2x2 stride-2 max pool after the stem
  // One 3x3 (padding 1) convolution + ReLU per entry: its output channels and stride.
  std::vector<std::int64_t> block_channels = {64, 64, 64};
  std::vector<std::int64_t> block_strides = {1, 1, 2};
  std::uint64_t seed = 1;
};

// images (N, 3, H, W) -> stem conv 7x7 s2 p3 + ReLU [-> max pool 2x2 s2] -> blocks [conv 3x3 s p1 + ReLU] ->
// global average pool (N, C) -> head Linear (N, classes) -> cross-entropy against targets (N).
// Every convolution runs under the run's recipe, so under FP8 recipes the 7x7 stem (kernel area 49) meets the
// dispatcher's rule (fp8_conv_max_kernel_area, default 32) and falls back explicitly while the 3x3 blocks run in
// FP8. The head stays in bf16 under FP8 recipes, as the GPT's LM head. Layer names: "stem", "blocks.<i>", "head".
class Cnn final : public Model {
 public:
  Cnn(const CnnConfig& config, const PrecisionRecipe& recipe);
  float forward(const Context& ctx, const Batch& batch) override;
  void backward(const Context& ctx) override;
  void release() override { saved_.reset(); }
  std::vector<Parameter*> parameters() override;
  std::vector<Fp8LayerState*> fp8_states() override;
  const CnnConfig& config() const { return config_; }

 private:
  struct ConvSaved {
    Conv2d::Saved conv;
    Relu::Saved relu;
  };
  struct Saved {
    ConvSaved stem;
    std::optional<MaxPool2d::Saved> pool;
    std::vector<ConvSaved> blocks;
    GlobalAvgPool2d::Saved gap;
    ClassifierHead::Saved head;
  };

  CnnConfig config_;
  PrecisionRecipe recipe_;
  Conv2d stem_;
  MaxPool2d pool_;
  std::vector<Conv2d> blocks_;
  GlobalAvgPool2d gap_;
  ClassifierHead head_;
  std::optional<Saved> saved_;
};

// The image classes of ShapesDataset, in label order: "disk", "square", "ring", "cross", "horizontal stripes",
// "vertical stripes", "diagonal stripes", "checkerboard". A dataset uses the first `classes` of them.
const std::vector<std::string>& shape_class_names();

// Generated RGB images (N, 3, size, size) of `classes` classes: each a shape or pattern at a random position, size,
// period and phase, in a random foreground colour on a random background colour (colours in [0, 1], at least 0.3
// apart on average per channel), plus uniform noise in [-0.2, 0.2]; then each image's channels are standardized
// (mean 0, variance 1), as per-image standardization does. Targets (N) int64. The batch of step s depends only on
// (seed, s); shapes are drawn with integer geometry straight from a 64-bit Mersenne Twister (no library
// distributions, whose algorithms differ between standard libraries).
class ShapesDataset final : public Dataset {
 public:
  ShapesDataset(std::int64_t batch, std::int64_t image_size, std::int64_t classes, std::uint64_t seed);
  Batch batch(std::int64_t step) const override;
  Batch eval_batch(std::int64_t index) const override;
  std::string describe() const override;

 private:
  Batch draw(std::uint64_t stream) const;
  std::int64_t batch_, size_, classes_;
  std::uint64_t seed_;
};

}  // namespace fp8kit::nn
