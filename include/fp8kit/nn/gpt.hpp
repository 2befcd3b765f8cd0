// A small GPT (pre-LN transformer blocks, as GPT-2 / llm.c) over bytes, built from the nn layers, and the text data
// it trains on: a generated corpus with structure to learn, or any text file.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fp8kit/nn/attention.hpp"
#include "fp8kit/nn/head.hpp"
#include "fp8kit/nn/layers.hpp"
#include "fp8kit/nn/linear.hpp"
#include "fp8kit/nn/model.hpp"

namespace fp8kit::nn {

struct GptConfig {
  std::int64_t vocab = 256;  // bytes
  std::int64_t seq_len = 64;
  std::int64_t channels = 128;
  std::int64_t layers = 2;
  std::int64_t heads = 4;
  std::uint64_t seed = 1;
};

// tokens (B, T) -> wte + wpe -> blocks [x + attn(ln1(x)); x + mlp(ln2(x))] -> ln_f -> lm_head -> cross-entropy.
// Every Linear runs under the run's recipe except the LM head, which FP8 recipes keep in bf16 (as DeepSeek-V3 and
// common Transformer Engine practice keep the output head in higher precision); attention's own two products run
// in bf16 under bf16 and FP8 recipes (Transformer Engine's default), in FP32 under fp32.
class Gpt final : public Model {
 public:
  Gpt(const GptConfig& config, const PrecisionRecipe& recipe);
  float forward(const Context& ctx, const Batch& batch) override;
  void backward(const Context& ctx) override;
  void release() override { saved_.reset(); }
  std::vector<Parameter*> parameters() override;
  std::vector<Fp8LayerState*> fp8_states() override;
  const GptConfig& config() const { return config_; }

 private:
  struct Block {
    LayerNorm ln1;
    Linear qkv;
    CausalSelfAttention attn;
    Linear proj;
    LayerNorm ln2;
    Linear fc1;
    Linear fc2;
  };
  struct BlockSaved {
    LayerNorm::Saved ln1;
    Linear::Saved qkv;
    CausalSelfAttention::Saved attn;
    Linear::Saved proj;
    LayerNorm::Saved ln2;
    Linear::Saved fc1;
    Gelu::Saved gelu;
    Linear::Saved fc2;
  };
  struct Saved {
    TokenPositionEmbedding::Saved embed;
    std::vector<BlockSaved> blocks;
    LayerNorm::Saved ln_f;
    ClassifierHead::Saved head;
  };

  GptConfig config_;
  PrecisionRecipe recipe_;
  TokenPositionEmbedding embed_;
  std::vector<Block> blocks_;
  LayerNorm ln_f_;
  ClassifierHead head_;
  std::optional<Saved> saved_;
};

// A deterministic generated corpus (seeded): sentences from a small grammar with agreement, correct additions
// ("17+25=42."), and key-value recalls — structure a small model learns in a few hundred steps.
std::string generate_corpus(std::uint64_t seed, std::size_t bytes);

// Random windows of a byte string: inputs (B, T) and targets shifted by one. Batch of step s depends only on
// (seed, s). Held-out batches are windows of `held_out` (text the training batches never read), drawn the same way.
class TextDataset final : public Dataset {
 public:
  TextDataset(std::string text, std::string held_out, std::int64_t batch, std::int64_t seq_len, std::uint64_t seed,
              std::string source);
  Batch batch(std::int64_t step) const override;
  Batch eval_batch(std::int64_t index) const override;
  std::string describe() const override;

 private:
  std::string text_, held_out_;
  std::int64_t batch_, seq_len_;
  std::uint64_t seed_;
  std::string source_;
};

}  // namespace fp8kit::nn
