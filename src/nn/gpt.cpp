// The small GPT: pre-LN blocks (attention, then a 4x MLP with GELU) over byte tokens, forward and backward through
// the layers' saved state; the generated corpus and the text dataset it trains on.
#include "fp8kit/nn/gpt.hpp"

#include <random>

#include "common/parallel.hpp"
#include "fp8kit/common/error.hpp"
#include "nn_util.hpp"

namespace fp8kit::nn {
namespace {

// Initialization as GPT-2: normal(0, 0.02); the projections into the residual stream scaled by 1/sqrt(2 layers).
constexpr double kInitStd = 0.02;

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = empty(a.shape(), DType::float32);
  const float *x = a.data<float>(), *z = b.data<float>();
  float* o = y.data<float>();
  const std::int64_t n = a.numel();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) \
    schedule(static) if (n >= fp8kit::detail::kParallelLoopElements)
  for (std::int64_t i = 0; i < n; ++i) o[i] = x[i] + z[i];
  return y;
}

}  // namespace

Gpt::Gpt(const GptConfig& c, const PrecisionRecipe& recipe)
    : config_(c),
      recipe_(recipe),
      embed_("transformer", c.vocab, c.seq_len, c.channels, kInitStd, c.seed),
      ln_f_("transformer.ln_f", c.channels),
      head_("lm_head", c.channels, c.vocab, false, c.seed + 7, kInitStd, recipe) {
  FP8KIT_CHECK(c.heads >= 1 && c.layers >= 1, "gpt: heads and layers must be at least 1, got ", c.heads, " and ",
               c.layers);
  FP8KIT_CHECK(c.channels % c.heads == 0, "gpt: channels (", c.channels, ") must be a multiple of heads (", c.heads,
               ")");
  const double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.layers));
  const DType attention = recipe.kind == RecipeKind::kFp32 ? DType::float32 : DType::bfloat16;
  for (std::int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "transformer.h." + std::to_string(l);
    const std::uint64_t s = c.seed + 100 * static_cast<std::uint64_t>(l + 1);
    blocks_.push_back(Block{LayerNorm(p + ".ln_1", c.channels),
                            Linear(p + ".attn.c_attn", c.channels, 3 * c.channels, true, s + 1, kInitStd, &recipe_),
                            CausalSelfAttention{c.heads, attention},
                            Linear(p + ".attn.c_proj", c.channels, c.channels, true, s + 2, proj_std, &recipe_),
                            LayerNorm(p + ".ln_2", c.channels),
                            Linear(p + ".mlp.c_fc", c.channels, 4 * c.channels, true, s + 3, kInitStd, &recipe_),
                            Linear(p + ".mlp.c_proj", 4 * c.channels, c.channels, true, s + 4, proj_std, &recipe_)});
  }
}

float Gpt::forward(const Context& ctx, const Batch& batch) {
  saved_.emplace();
  Saved& s = *saved_;
  Tensor x = embed_.forward(ctx, batch.inputs, s.embed);  // (B, T, C)
  s.blocks.resize(blocks_.size());
  for (std::size_t l = 0; l < blocks_.size(); ++l) {
    Block& b = blocks_[l];
    BlockSaved& bs = s.blocks[l];
    // Each temporary is dropped as soon as the next op has it (reassigned `t`): only what backward saved stays.
    Tensor t = b.ln1.forward(ctx, x, bs.ln1);
    t = b.qkv.forward(ctx, std::move(t), bs.qkv);  // (B, T, 3C)
    t = b.attn.forward(ctx, t, bs.attn);           // (B, T, C)
    x = add(x, b.proj.forward(ctx, std::move(t), bs.proj));
    t = b.ln2.forward(ctx, x, bs.ln2);
    t = b.fc1.forward(ctx, std::move(t), bs.fc1);  // (B, T, 4C)
    t = Gelu::forward(ctx, std::move(t), bs.gelu);
    x = add(x, b.fc2.forward(ctx, std::move(t), bs.fc2));
  }
  Tensor h = ln_f_.forward(ctx, x, s.ln_f);
  x = Tensor();  // the residual stream is dead once normalized; the head releases h before the logits exist
  return head_.forward(ctx, std::move(h), batch.targets, s.head);
}

void Gpt::backward(const Context& ctx) {
  FP8KIT_CHECK(saved_.has_value(), "gpt: backward without a forward");
  Saved& s = *saved_;
  Tensor dx = head_.backward(ctx, s.head);
  dx = ln_f_.backward(ctx, dx, s.ln_f);
  s.ln_f = {};
  for (std::size_t l = blocks_.size(); l-- > 0;) {
    Block& b = blocks_[l];
    BlockSaved& bs = s.blocks[l];
    // x_out = x_mid + fc2(gelu(fc1(ln2(x_mid)))): the residual passes dx through, the branch adds its gradient.
    // Each saved state is released right after its backward, each gradient temporary as soon as it is consumed.
    Tensor g = b.fc2.backward(ctx, dx, bs.fc2);
    bs.fc2 = {};
    g = Gelu::backward(ctx, std::move(g), bs.gelu);
    bs.gelu = {};
    g = b.fc1.backward(ctx, std::move(g), bs.fc1);
    bs.fc1 = {};
    g = b.ln2.backward(ctx, g, bs.ln2);
    bs.ln2 = {};
    dx = add(dx, g);
    g = b.proj.backward(ctx, dx, bs.proj);
    bs.proj = {};
    g = b.attn.backward(ctx, g, bs.attn);
    bs.attn = {};
    g = b.qkv.backward(ctx, std::move(g), bs.qkv);
    bs.qkv = {};
    g = b.ln1.backward(ctx, g, bs.ln1);
    bs.ln1 = {};
    dx = add(dx, g);
  }
  embed_.backward(ctx, dx, s.embed);
  saved_.reset();
}

std::vector<Parameter*> Gpt::parameters() {
  std::vector<Parameter*> p = embed_.parameters();
  auto append = [&](std::vector<Parameter*> more) { p.insert(p.end(), more.begin(), more.end()); };
  for (Block& b : blocks_) {
    append(b.ln1.parameters());
    append(b.qkv.parameters());
    append(b.proj.parameters());
    append(b.ln2.parameters());
    append(b.fc1.parameters());
    append(b.fc2.parameters());
  }
  append(ln_f_.parameters());
  append(head_.linear.parameters());
  return p;
}

std::vector<Fp8LayerState*> Gpt::fp8_states() {
  std::vector<Fp8LayerState*> states;
  for (Block& b : blocks_) {
    for (Linear* l : {&b.qkv, &b.proj, &b.fc1, &b.fc2}) states.push_back(&l->fp8);
  }
  states.push_back(&head_.linear.fp8);
  return states;
}

// ---------------------------------------------------------------- data

std::string generate_corpus(std::uint64_t seed, std::size_t bytes) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  static const char* kNames[] = {"the cat", "a dog", "the bird", "my friend", "the teacher", "a child"};
  static const char* kPlural[] = {"the cats", "two dogs", "the birds", "my friends", "the teachers", "children"};
  static const char* kVerbs[][2] = {{"sees", "see"}, {"likes", "like"}, {"finds", "find"}, {"follows", "follow"}};
  static const char* kObjects[] = {"the ball", "a red box", "the old tree", "some water", "the small house"};
  static const char* kKeys[] = {"alpha", "beta", "gamma", "delta", "omega"};
  std::string text;
  text.reserve(bytes + 64);
  while (text.size() < bytes) {
    switch (pick(3)) {
      case 0: {  // subject-verb agreement
        const bool plural = pick(2) == 1;
        const std::size_t s = pick(6), v = pick(4);
        text += plural ? kPlural[s] : kNames[s];
        text += ' ';
        text += kVerbs[v][plural ? 1 : 0];
        text += ' ';
        text += kObjects[pick(5)];
        text += ". ";
        break;
      }
      case 1: {  // correct additions
        const int a = static_cast<int>(pick(50)), b = static_cast<int>(pick(50));
        text += std::to_string(a) + "+" + std::to_string(b) + "=" + std::to_string(a + b) + ". ";
        break;
      }
      default: {  // a key stated, then recalled
        const std::size_t k = pick(5);
        const int v = static_cast<int>(pick(10));
        text +=
            std::string(kKeys[k]) + " is " + std::to_string(v) + "; so " + kKeys[k] + " is " + std::to_string(v) + ". ";
      }
    }
  }
  text.resize(bytes);
  return text;
}

namespace {

// T-token windows at random starts of `text` (seeded): inputs and the targets one byte later.
Batch windows(const std::string& text, std::int64_t batch, std::int64_t seq_len, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Batch b;
  b.inputs = empty({batch, seq_len}, DType::int64);
  b.targets = empty({batch, seq_len}, DType::int64);
  auto* in = b.inputs.data<std::int64_t>();
  auto* tg = b.targets.data<std::int64_t>();
  const auto span = static_cast<std::uint64_t>(text.size()) - static_cast<std::uint64_t>(seq_len) - 1;
  for (std::int64_t r = 0; r < batch; ++r) {
    const auto start = static_cast<std::size_t>(rng() % (span + 1));
    for (std::int64_t t = 0; t < seq_len; ++t) {
      in[r * seq_len + t] = static_cast<unsigned char>(text[start + static_cast<std::size_t>(t)]);
      tg[r * seq_len + t] = static_cast<unsigned char>(text[start + static_cast<std::size_t>(t) + 1]);
    }
  }
  return b;
}

}  // namespace

TextDataset::TextDataset(std::string text, std::string held_out, std::int64_t batch, std::int64_t seq_len,
                         std::uint64_t seed, std::string source)
    : text_(std::move(text)),
      held_out_(std::move(held_out)),
      batch_(batch),
      seq_len_(seq_len),
      seed_(seed),
      source_(std::move(source)) {
  FP8KIT_CHECK(static_cast<std::int64_t>(text_.size()) > seq_len_ + 1, "the training text (", source_, ") has ",
               text_.size(), " bytes; it needs more than ", seq_len_ + 1);
  FP8KIT_CHECK(static_cast<std::int64_t>(held_out_.size()) > seq_len_ + 1, "the held-out text (", source_, ") has ",
               held_out_.size(), " bytes; it needs more than ", seq_len_ + 1);
}

Batch TextDataset::batch(std::int64_t step) const {
  return windows(text_, batch_, seq_len_, seed_ * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(step));
}

Batch TextDataset::eval_batch(std::int64_t index) const {
  return windows(held_out_, batch_, seq_len_, detail::held_out_stream(seed_) + static_cast<std::uint64_t>(index));
}

std::string TextDataset::describe() const {
  return source_ + " (" + std::to_string(text_.size()) + " bytes, " + std::to_string(held_out_.size()) +
         " held out), batches of " + std::to_string(batch_) + " x " + std::to_string(seq_len_) + " tokens";
}

}  // namespace fp8kit::nn
