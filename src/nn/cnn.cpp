// The small CNN: stem conv (7x7 s2) + ReLU [+ max pool], 3x3 conv + ReLU blocks, global average pooling and a linear
// head, forward and backward through the layers' saved state; and the generated shapes dataset it trains on.
#include "fp8kit/nn/cnn.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include "fp8kit/common/error.hpp"
#include "nn_util.hpp"

namespace fp8kit::nn {
namespace {

std::int64_t last_channels(const CnnConfig& c) {
  return c.block_channels.empty() ? c.stem_channels : c.block_channels.back();
}

const CnnConfig& checked(const CnnConfig& c) {
  FP8KIT_CHECK(c.image_channels >= 1 && c.classes >= 2 && c.stem_channels >= 1,
               "cnn: needs image channels >= 1, classes >= 2 and stem channels >= 1, got ", c.image_channels, ", ",
               c.classes, ", ", c.stem_channels);
  FP8KIT_CHECK(c.block_channels.size() == c.block_strides.size(), "cnn: ", c.block_channels.size(),
               " block channel counts but ", c.block_strides.size(), " block strides");
  return c;
}

// Head initialization: small, so the first logits are near zero and the first loss near log(classes).
constexpr double kHeadInitStd = 0.02;

}  // namespace

Cnn::Cnn(const CnnConfig& c, const PrecisionRecipe& recipe)
    : config_(checked(c)),
      recipe_(recipe),
      stem_("stem", c.image_channels, c.stem_channels, Window2d::square(7, 2, 3), true, c.seed, 0.0, &recipe_),
      pool_{Window2d::square(2, 2)},
      head_("head", last_channels(c), c.classes, true, c.seed + 7, kHeadInitStd, recipe) {
  std::int64_t in = c.stem_channels;
  blocks_.reserve(c.block_channels.size());
  for (std::size_t i = 0; i < c.block_channels.size(); ++i) {
    const std::uint64_t seed = c.seed + 100 * static_cast<std::uint64_t>(i + 1);
    blocks_.emplace_back("blocks." + std::to_string(i), in, c.block_channels[i],
                         Window2d::square(3, c.block_strides[i], 1), true, seed, 0.0, &recipe_);
    in = c.block_channels[i];
  }
}

float Cnn::forward(const Context& ctx, const Batch& batch) {
  FP8KIT_CHECK(batch.inputs.dtype() == DType::float32 && batch.inputs.dim() == 4 &&
                   batch.inputs.size(1) == config_.image_channels,
               "cnn: images must be float32 (N, ", config_.image_channels, ", H, W)");
  saved_.emplace();
  Saved& s = *saved_;
  Tensor x = Relu::forward(ctx, stem_.forward(ctx, batch.inputs, s.stem.conv), s.stem.relu);  // (N, C1, H/2, W/2)
  if (config_.stem_pool) x = pool_.forward(ctx, x, s.pool.emplace());
  s.blocks.resize(blocks_.size());
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    x = Relu::forward(ctx, blocks_[i].forward(ctx, x, s.blocks[i].conv), s.blocks[i].relu);
  }
  Tensor features = gap_.forward(ctx, x, s.gap);  // (N, C)
  x = Tensor();
  return head_.forward(ctx, std::move(features), batch.targets, s.head);
}

void Cnn::backward(const Context& ctx) {
  FP8KIT_CHECK(saved_.has_value(), "cnn: backward without a forward");
  Saved& s = *saved_;
  Tensor dx = head_.backward(ctx, s.head);  // (N, C)
  dx = gap_.backward(ctx, dx, s.gap);
  for (std::size_t i = blocks_.size(); i-- > 0;) {
    dx = blocks_[i].backward(ctx, Relu::backward(ctx, dx, s.blocks[i].relu), s.blocks[i].conv);
    s.blocks[i] = {};  // release this block's saved activations as soon as they are used
  }
  if (s.pool) dx = pool_.backward(ctx, dx, *s.pool);
  // The images need no gradient: the stem computes its weight gradient only.
  stem_.backward(ctx, Relu::backward(ctx, dx, s.stem.relu), s.stem.conv, Conv2d::InputGradient::kSkip);
  saved_.reset();
}

std::vector<Parameter*> Cnn::parameters() {
  std::vector<Parameter*> p = stem_.parameters();
  auto append = [&](std::vector<Parameter*> more) { p.insert(p.end(), more.begin(), more.end()); };
  for (Conv2d& b : blocks_) append(b.parameters());
  append(head_.linear.parameters());
  return p;
}

std::vector<Fp8LayerState*> Cnn::fp8_states() {
  std::vector<Fp8LayerState*> states = {&stem_.fp8};
  for (Conv2d& b : blocks_) states.push_back(&b.fp8);
  states.push_back(&head_.linear.fp8);
  return states;
}

// ---------------------------------------------------------------- data

const std::vector<std::string>& shape_class_names() {
  static const std::vector<std::string> kNames = {
      "disk", "square", "ring", "cross", "horizontal stripes", "vertical stripes", "diagonal stripes", "checkerboard"};
  return kNames;
}

namespace {

// Draws from a 64-bit generator without library distributions (their algorithms differ between libraries).
struct Draw {
  std::mt19937_64 rng;
  // An integer in [lo, hi].
  std::int64_t between(std::int64_t lo, std::int64_t hi) {
    return lo + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  // A float in [0, 1) from the top 24 bits.
  float unit() { return static_cast<float>(rng() >> 40) * 0x1p-24f; }
};

// Whether pixel (x, y) of an image of `size` belongs to the shape or pattern of class `label` with parameters p.
struct Figure {
  std::int64_t label = 0;
  std::int64_t cx = 0, cy = 0, a = 0, b = 0;    // centre and two sizes (radius, half side, period, thickness, ...)
  std::int64_t x0 = 0, y0 = 0, x1 = 0, y1 = 0;  // the patch of a pattern class, inclusive
  std::int64_t phase = 0;
  bool flip = false;

  bool covers(std::int64_t x, std::int64_t y) const {
    const std::int64_t dx = x - cx, dy = y - cy, d2 = dx * dx + dy * dy;
    const bool in_patch = x >= x0 && x <= x1 && y >= y0 && y <= y1;
    switch (label) {
      case 0:  // disk of radius a
        return d2 <= a * a;
      case 1:  // square of half side a
        return std::abs(dx) <= a && std::abs(dy) <= a;
      case 2:  // ring: outer radius a, thickness b
        return d2 <= a * a && d2 > (a - b) * (a - b);
      case 3:  // cross: arms of half length a, half width b
        return (std::abs(dx) <= b && std::abs(dy) <= a) || (std::abs(dy) <= b && std::abs(dx) <= a);
      case 4:  // horizontal stripes of period a
        return in_patch && (y + phase) % a < a / 2;
      case 5:  // vertical stripes
        return in_patch && (x + phase) % a < a / 2;
      case 6: {                                              // diagonal stripes, either direction
        const std::int64_t t = flip ? x + y : x - y + 1024;  // x - y + 1024 >= 0 for sizes <= 1024
        return in_patch && (t + phase) % a < a / 2;
      }
      default:  // checkerboard of cell a
        return in_patch && ((x + phase) / a + (y + phase) / a) % 2 == 0;
    }
  }
};

Figure random_figure(Draw& d, std::int64_t label, std::int64_t size) {
  Figure f;
  f.label = label;
  const std::int64_t s = size;
  auto centre = [&](std::int64_t r) {
    const std::int64_t margin = std::min(r, s / 2 - 1);
    f.cx = d.between(margin, s - 1 - margin);
    f.cy = d.between(margin, s - 1 - margin);
  };
  switch (label) {
    case 0:
      f.a = d.between(s / 8, s / 3);
      centre(f.a);
      break;
    case 1:
      f.a = d.between(s / 8, s / 4 + 1);
      centre(f.a);
      break;
    case 2:
      f.a = d.between(s / 5, s / 3 + 1);
      f.b = d.between(2, 3);
      centre(f.a);
      break;
    case 3:
      f.a = d.between(s / 5, s / 3 + 1);
      f.b = d.between(1, 2);
      centre(f.a);
      break;
    default: {
      f.a = label == 7 ? d.between(3, 6) : d.between(4, 8);
      f.phase = d.between(0, 15);
      f.flip = d.between(0, 1) == 1;
      const std::int64_t w = d.between(s / 2, s), h = d.between(s / 2, s);
      f.x0 = d.between(0, s - w);
      f.y0 = d.between(0, s - h);
      f.x1 = f.x0 + w - 1;
      f.y1 = f.y0 + h - 1;
    }
  }
  return f;
}

}  // namespace

ShapesDataset::ShapesDataset(std::int64_t batch, std::int64_t image_size, std::int64_t classes, std::uint64_t seed)
    : batch_(batch), size_(image_size), classes_(classes), seed_(seed) {
  const auto available = static_cast<std::int64_t>(shape_class_names().size());
  FP8KIT_CHECK(batch >= 1, "shapes dataset: batch must be at least 1, got ", batch);
  FP8KIT_CHECK(image_size >= 16 && image_size <= 1024, "shapes dataset: image size must be in [16, 1024], got ",
               image_size);
  FP8KIT_CHECK(classes >= 2 && classes <= available, "shapes dataset: classes must be in [2, ", available, "], got ",
               classes);
}

Batch ShapesDataset::batch(std::int64_t step) const {
  return draw(seed_ * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(step));
}

// Held-out images: the same distribution from another random stream (the images training sees are never repeated).
Batch ShapesDataset::eval_batch(std::int64_t index) const {
  return draw(detail::held_out_stream(seed_) + static_cast<std::uint64_t>(index));
}

// images (N, 3, S, S) float32, targets (N) int64.
Batch ShapesDataset::draw(std::uint64_t stream) const {
  Draw d{std::mt19937_64(stream)};
  const std::int64_t s = size_, plane = s * s;
  Batch b;
  b.inputs = empty({batch_, 3, s, s}, DType::float32);
  b.targets = empty({batch_}, DType::int64);
  float* img = b.inputs.data<float>();
  std::int64_t* tg = b.targets.data<std::int64_t>();
  for (std::int64_t n = 0; n < batch_; ++n) {
    const std::int64_t label = d.between(0, classes_ - 1);
    tg[n] = label;
    float bg[3], fg[3];
    for (float& v : bg) v = d.unit();
    float distance = 0.0f;
    do {  // a foreground colour at least 0.3 from the background on average per channel
      distance = 0.0f;
      for (int c = 0; c < 3; ++c) {
        fg[c] = d.unit();
        distance += std::fabs(fg[c] - bg[c]) / 3.0f;
      }
    } while (distance < 0.3f);
    const Figure f = random_figure(d, label, s);
    float* out = img + n * 3 * plane;
    for (std::int64_t y = 0; y < s; ++y) {
      for (std::int64_t x = 0; x < s; ++x) {
        const bool on = f.covers(x, y);
        for (int c = 0; c < 3; ++c) out[c * plane + y * s + x] = (on ? fg[c] : bg[c]) + 0.4f * d.unit() - 0.2f;
      }
    }
    // Per-image standardization: each channel's mean removed (the colours' offsets are gone, the shapes remain),
    // then one scale for the image so that its pixels have variance 1 (a channel where the colours barely differ
    // stays faint instead of being blown up to noise of variance 1).
    double sum2 = 0;
    for (int c = 0; c < 3; ++c) {
      float* p = out + c * plane;
      double sum = 0;
      for (std::int64_t i = 0; i < plane; ++i) sum += p[i];
      const auto mean = static_cast<float>(sum / static_cast<double>(plane));
      for (std::int64_t i = 0; i < plane; ++i) {
        p[i] -= mean;
        sum2 += static_cast<double>(p[i]) * p[i];
      }
    }
    const auto inv = static_cast<float>(1.0 / std::sqrt(sum2 / static_cast<double>(3 * plane) + 1e-4));
    for (std::int64_t i = 0; i < 3 * plane; ++i) out[i] *= inv;
  }
  return b;
}

std::string ShapesDataset::describe() const {
  std::string names;
  for (std::int64_t c = 0; c < classes_; ++c) names += (c ? ", " : "") + shape_class_names()[c];
  return "generated shapes (" + std::to_string(classes_) + " classes: " + names + "), batches of " +
         std::to_string(batch_) + " x 3x" + std::to_string(size_) + "x" + std::to_string(size_) + " images";
}

}  // namespace fp8kit::nn
