// The elementwise, normalization, lookup and loss layers of fp8kit::nn, each a forward/backward pair: LayerNorm,
// GELU (tanh approximation), ReLU, Embedding (and GPT-2's token + position embedding), residual add, cross-entropy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fp8kit/nn/context.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::nn {

// All layers follow the conventions of context.hpp: float32 tensors, `forward` fills a Saved that `backward`
// consumes, parameter gradients accumulate (+=). Rows are independent and spread over threads (OpenMP) when a
// tensor is large; reductions across rows (parameter gradients, the mean loss) always sum in the same order, so
// every result is bit-identical whatever the thread count.

// ---------------------------------------------------------------- LayerNorm
// y = (x - mean) * rstd * weight + bias over the last dimension, rstd = 1 / sqrt(var + eps) with the biased
// variance (PyTorch's nn.LayerNorm). Mean and variance are accumulated in double (two passes), a little more than
// PyTorch's float accumulation, so rows with a large mean keep their precision.
struct LayerNorm {
  Parameter weight;  // (C), ones
  Parameter bias;    // (C), zeros
  float eps = 1e-5f;

  // Parameters are named "<name>.weight" and "<name>.bias".
  LayerNorm(std::string name, std::int64_t channels);

  struct Saved {
    SavedActivation x_hat;  // (..., C) normalized input, in ctx.saved_dtype (or FP8 rows: ctx.fp8_activations)
    Tensor rstd;            // (R) float32
  };
  // x (..., C) -> y (..., C); the leading dimensions are flattened into R rows.
  Tensor forward(const Context& ctx, const Tensor& x, Saved& saved) const;
  // dy (..., C) -> dx (..., C); accumulates weight.grad += sum_r dy * x_hat, bias.grad += sum_r dy.
  Tensor backward(const Context& ctx, const Tensor& dy, const Saved& saved);
  std::vector<Parameter*> parameters();
};

// ---------------------------------------------------------------- GELU
// GPT-2's tanh approximation: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (PyTorch's
// gelu(approximate="tanh")), evaluated as x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)) with a vectorizable exp
// (a few float32 ulp of the formula where gelu is not tiny; for x below about -3, where gelu is below 1e-2 and
// ill-conditioned, the relative error grows towards 1e-5 near x = -10, absolute errors stay below 1e-7). The input is
// saved (in ctx.saved_dtype) and the derivative evaluated from it.
struct Gelu {
  struct Saved {
    SavedActivation x;  // (...) in ctx.saved_dtype (or FP8 rows: ctx.fp8_activations)
  };
  // x (...) -> y (...)
  static Tensor forward(const Context& ctx, const Tensor& x, Saved& saved);
  // The same, written over x's storage when no other tensor shares it once x is saved (a bfloat16 saved copy).
  static Tensor forward(const Context& ctx, Tensor&& x, Saved& saved);
  // dy (...) -> dx (...)
  static Tensor backward(const Context& ctx, const Tensor& dy, const Saved& saved);
  // The same, written over dy's storage when no other tensor shares it (saves the widest buffer of an MLP's backward).
  static Tensor backward(const Context& ctx, Tensor&& dy, const Saved& saved);
};

// ---------------------------------------------------------------- ReLU
// y = max(x, 0); dx = dy where x > 0, else 0 (0 at x == 0, as PyTorch). The mask x > 0 is saved as a bool tensor
// (one byte per element, exact whatever ctx.saved_dtype is).
struct Relu {
  struct Saved {
    Tensor positive;  // (...) bool
  };
  // x (...) -> y (...)
  static Tensor forward(const Context& ctx, const Tensor& x, Saved& saved);
  // dy (...) -> dx (...)
  static Tensor backward(const Context& ctx, const Tensor& dy, const Saved& saved);
};

// ---------------------------------------------------------------- Embedding
// A lookup table: y[n, :] = weight[ids[n], :]. Backward scatter-adds dy rows into weight.grad; columns are
// spread over threads and every row is added in index order, so repeated ids sum deterministically. Ids are
// int64 and must lie in [0, V) (checked, naming the offending id and its position).
struct Embedding {
  Parameter weight;  // (V, C), normal(0, stddev)

  // The parameter is named "<name>.weight".
  Embedding(std::string name, std::int64_t num_embeddings, std::int64_t channels, double stddev, std::uint64_t seed);

  struct Saved {
    Tensor ids;  // (...) int64, shares the caller's tensor
  };
  // ids (...) int64 -> y (..., C)
  Tensor forward(const Context& ctx, const Tensor& ids, Saved& saved) const;
  // dy (..., C) -> nothing (ids have no gradient); accumulates weight.grad[ids[n], :] += dy[n, :].
  void backward(const Context& ctx, const Tensor& dy, const Saved& saved);
  std::vector<Parameter*> parameters();
};

// GPT-2's input layer: y[b, t, :] = wte[tokens[b, t], :] + wpe[t, :] (llm.c's encoder). Parameters are named
// "<name>.wte.weight" (V, C) and "<name>.wpe.weight" (max_positions, C), as in Hugging Face GPT-2 under
// name "transformer".
struct TokenPositionEmbedding {
  Embedding wte;  // (V, C)
  Embedding wpe;  // (max_positions, C)

  TokenPositionEmbedding(std::string name, std::int64_t vocab_size, std::int64_t max_positions, std::int64_t channels,
                         double stddev, std::uint64_t seed);

  struct Saved {
    Tensor tokens;  // (B, T) int64
  };
  // tokens (B, T) int64, T <= max_positions -> y (B, T, C)
  Tensor forward(const Context& ctx, const Tensor& tokens, Saved& saved) const;
  // dy (B, T, C) -> nothing; accumulates wte.grad (scatter-add) and wpe.grad[t] += sum_b dy[b, t].
  void backward(const Context& ctx, const Tensor& dy, const Saved& saved);
  std::vector<Parameter*> parameters();
};

// ---------------------------------------------------------------- residual add
// y = a + b; backward hands dy to both inputs (the same tensor, not a copy: callers never modify gradients in
// place). Saved only holds the shape, to check dy.
struct ResidualAdd {
  struct Saved {
    Shape shape;
  };
  struct Grads {
    Tensor da;  // (...) == dy
    Tensor db;  // (...) == dy
  };
  // a (...), b (...) of the same shape -> y (...)
  static Tensor forward(const Context& ctx, const Tensor& a, const Tensor& b, Saved& saved);
  // dy (...) -> da, db (...)
  static Grads backward(const Context& ctx, const Tensor& dy, const Saved& saved);
};

// ---------------------------------------------------------------- cross-entropy
// Softmax over the last dimension and the negative log-likelihood of the targets, averaged over the R rows:
// loss = (1/R) sum_r (logsumexp(logits[r]) - logits[r, target[r]]). Every row counts (no ignore index); each
// target must lie in [0, V) (checked, naming the row). The logits are saved (ctx.saved_dtype; float32 shares
// the caller's storage, so the loss costs no extra copy of the largest activation) with each row's logsumexp;
// backward recomputes the softmax from them.
struct CrossEntropy {
  struct Saved {
    Tensor logits;     // (..., V) in ctx.saved_dtype
    Tensor logsumexp;  // (R) float32, of the saved (possibly rounded) logits, so backward's softmax sums to 1
    Tensor targets;    // (...) int64, shares the caller's tensor
  };
  // logits (..., V), targets (...) int64 with the same leading shape -> the mean loss. Row sums in double.
  static float forward(const Context& ctx, const Tensor& logits, const Tensor& targets, Saved& saved);
  // dloss (the gradient of the objective with respect to the mean loss, 1 for the loss itself) ->
  // dlogits (..., V) = dloss / R * (softmax(logits) - onehot(target)).
  static Tensor backward(const Context& ctx, float dloss, const Saved& saved);
  // The same, releasing `saved`: dlogits is written over the saved float32 logits when nothing else holds them, so
  // the logits and their gradient (R x V each, the widest tensors of a small-vocabulary model) are never both alive.
  static Tensor backward(const Context& ctx, float dloss, Saved&& saved);
};

}  // namespace fp8kit::nn
