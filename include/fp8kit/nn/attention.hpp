// Causal multi-head self-attention (the core after the QKV projection, as llm.c's attention_forward/backward):
// softmax(q k^T / sqrt(hs), causal mask) v per head, with its two products in FP32 or in bfloat16 inputs.
#pragma once

#include <cstdint>

#include "fp8kit/nn/context.hpp"
#include "fp8kit/tensor/dtype.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::nn {

// qkv (B, T, 3C) -> out (B, T, C). Each token's row of qkv is [q | k | v], each C wide; head h owns columns
// [h*hs, (h+1)*hs) of each part, hs = C / heads. For every (b, h) and query position t:
//   s[t2]  = (q_t . k_t2) / sqrt(hs)                     for t2 <= t (the causal mask: later keys are not seen)
//   p[t2]  = exp(s[t2] - max s) / sum exp(s - max s)     (numerically stable softmax; p[t2] = 0 for t2 > t)
//   out_t  = sum_t2 p[t2] v_t2
// `compute` is the precision of the two products (q k^T and p v), and of the three of backward:
//   float32:  every operand in FP32, FP32 accumulation;
//   bfloat16: the operands of each product (q and k, p and v; in backward dout and v, p and dout, ds and k, ds and
//             q) are rounded to bfloat16 (round to nearest even) and the products accumulate in FP32, as Transformer
//             Engine keeps attention in bf16 under its FP8 recipes (fp8_dpa = False by default). The 1/sqrt(hs)
//             scale, the softmax and its gradient stay in FP32.
// Threads: OpenMP over (b, h); each pair is computed by one thread in a fixed order, so the result does not depend
// on the thread count. Within a pair, dot products and the softmax sum run in SIMD lanes (a fixed summation order
// for a given build) and exp is the vectorizable detail::exp_approx (within 2 ulp of e^x).
//
// What forward saves for backward (`saves`):
//   kStatistics (the default, FlashAttention's and Transformer Engine's way): each softmax row's maximum and sum,
//     (B, H, T, 2) float32, and backward recomputes the probabilities from q and k: the same scores in the same
//     order, the same exp, divided by the same sum, so bit for bit the probabilities forward had. B*H*T*2 floats
//     instead of B*H*T*T.
//   kProbabilities: the (B, H, T, T) probabilities themselves, in ctx.saved_dtype (bfloat16 under the bf16 and FP8
//     recipes, so backward's softmax gradient then sees probabilities rounded to bfloat16).
// Backward is bit-identical between the two when the probabilities were saved in float32 (ctx.saved_dtype
// float32), or in bfloat16 compute whatever ctx.saved_dtype is compared with kProbabilities saved in float32: the
// q, k and v backward reads are then the ones forward used. With probabilities saved in bfloat16 (today's bf16 and
// FP8 recipes before kStatistics), kStatistics differs only by that rounding: its softmax gradient uses the float32
// probabilities (tests/nn/test_attention.cpp bounds the difference).
enum class AttentionSaves : std::uint8_t { kStatistics, kProbabilities };

struct CausalSelfAttention {
  std::int64_t heads = 1;
  DType compute = DType::float32;  // float32 or bfloat16
  AttentionSaves saves = AttentionSaves::kStatistics;

  // What backward needs: the input in ctx.saved_dtype, and the softmax statistics (float32) or probabilities.
  struct Saved {
    Tensor qkv;    // (B, T, 3C) the input
    Tensor stats;  // kStatistics: (B, H, T, 2) float32, row t's maximum score and sum of exp(score - maximum)
    Tensor probs;  // kProbabilities: (B, H, T, T) softmax probabilities p[b, h, t, t2], zero above the diagonal
  };

  // qkv (B, T, 3C) float32 -> out (B, T, C) float32; fills `saved`. Throws Error(kInvalidArgument) for a shape
  // that is not (B, T, 3C) with C divisible by heads, a non-float32 input, heads < 1 or an unsupported compute.
  Tensor forward(const Context& ctx, const Tensor& qkv, Saved& saved) const;

  // dout (B, T, C) float32 -> dqkv (B, T, 3C) float32 (a new tensor, written, not accumulated: the layer has no
  // parameters).
  Tensor backward(const Context& ctx, const Tensor& dout, const Saved& saved) const;
};

}  // namespace fp8kit::nn
