// Fully sharded data parallelism (`fp8kit train --parallel fsdp`), as PyTorch FSDP2 with torchao's FP8 all-gather
// and ZeRO-3: every rank keeps only its rows of each parameter's master value (float32, or bfloat16 under bf16 master
// weights), of its gradient and (so) of the AdamW state (moments in float32, bfloat16 or FP8 with their block scales;
// a Kahan compensation buffer). A GEMM layer's weight is gathered when the layer needs it, in the form its GEMM takes —
// FP8 codes with their scales under FP8 recipes, bfloat16 under bf16, float32 under fp32 — once for forward and again
// for backward (the gathered operand is freed after each use), and its gradient is reduce-scattered as soon as the
// layer has computed it. The other parameters (embeddings, norms, biases) are gathered as stored (float32 or
// bfloat16) before each step's forward and their gradients reduce-scattered after backward.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "fp8kit/dist/communicator.hpp"
#include "fp8kit/dist/fp8_collectives.hpp"
#include "fp8kit/io/train_checkpoint.hpp"
#include "fp8kit/nn/train.hpp"

namespace fp8kit {

// What FSDP's all-gathers moved, by what they carried: "e4m3fn" (FP8 codes, their scales and the gathers' headers),
// "bfloat16", "float32". `elements`: of the gathered (whole) tensors; `bytes`: what this rank handed to the backend
// for them, as CommStats counts (its shard's share: sum over ranks for the whole payload).
struct GatherCount {
  std::uint64_t elements = 0, bytes = 0;
};
struct GatherCounts {
  std::map<std::string, GatherCount> gemm_weights;      // Linear and Conv2d weights, in their GEMM's form
  std::map<std::string, GatherCount> other_parameters;  // embeddings, norms, biases: their master dtype
};

class Fsdp final : public nn::WeightSource {
 public:
  // `grad_payload` carries the gradients' reduce-scatters; `global_rows` is the rows of a global batch (each rank's
  // gradient is weighted by its share of them, as data_parallel_hooks does). The communicator must outlive this.
  Fsdp(Communicator& comm, ReducePayload grad_payload, std::int64_t global_rows);

  // The trainer hooks of an FSDP run: data_parallel_hooks' loss, guard and amax agreement, and
  //   prepare         shard(trainer);
  //   begin_step      gather_direct();
  //   reduce_gradients  reduce_direct() (the GEMM weights' gradients were reduce-scattered during backward);
  //   finish          gather_full(), then base's finish (so the evaluation, a replica check or an export sees
  //                   the whole model).
  // This object must outlive the run.
  nn::TrainHooks hooks(nn::TrainHooks base = {});

  // Splits every parameter of the trainer's model over the ranks: rank r keeps rows shard_rows(rows, cut, r, size)
  // of it (rows: its first dimension; cut: 1, or the recipe's weight blocks for GEMM weights — 128 under fp8-block,
  // 32 under mxfp8 — so that each rank quantizes its rows, and their transpose, on block boundaries; and so that
  // each shard starts on a multiple of AdamW::part_alignment() elements: the shards step bit for bit as the whole),
  // and the same rows of any AdamW state already there (a resumed run). The model's full values and gradients are
  // released; the trainer steps the shards and takes its GEMM weights from this source.
  void shard(nn::Trainer& trainer);
  // The directly read parameters' full values (all-gathered in their master dtype) and zero full gradients (the
  // same dtype), before a forward.
  void gather_direct();
  // Their gradients, weighted by this rank's share, reduce-scattered into the shards' gradients in the payload
  // (summed in float32; a bfloat16 gradient rounded once, as data_parallel_hooks does); the full values and
  // gradients released.
  void reduce_direct();
  // Every parameter's full value (all-gathered as stored; no gradient: nothing trains after it); the weight source is
  // unset, so that the model can be evaluated, exported and compared as an ordinary one. Counted apart from the
  // training's gathers.
  void gather_full();

  // nn::WeightSource: the weight's shard prepared under the call's recipe (per-tensor current scaling with the
  // all-reduced amax) and gathered (all_gather_rows; the transpose: each rank's shard transposed and prepared,
  // all_gather_cols); the gradient weighted and reduce-scattered into the shard's.
  nn::RecipeOperand forward_operand(const nn::GemmCall& call, nn::Parameter& weight) override;
  nn::RecipeOperand backward_operand(const nn::GemmCall& call, nn::Parameter& weight) override;
  void add_gradient(nn::Parameter& weight, Tensor dw) override;

  // How an FSDP run writes its checkpoints and FP8 export (TrainCheckpointOptions::around_write): every rank
  // gathers the whole parameters (and, for a checkpoint, the AdamW state as stored), rank 0 writes, the shards are
  // put back, and a failed write fails on every rank. A checkpoint so written is an ordinary one: a resumed run
  // loads it whole on every rank and shards it again.
  TrainCheckpointOptions::AroundWrite around_write();

  // The weight and direct-parameter gathers of the run so far (not gather_full's, nor the checkpoints').
  const GatherCounts& gathered() const { return gathered_; }
  // This rank's shards, as the trainer steps them.
  std::span<nn::Parameter* const> shards() const { return shard_ptrs_; }

 private:
  struct Shard {
    nn::Parameter* full = nullptr;  // the model's parameter
    nn::Parameter part;             // this rank's rows: value, gradient (the optimizer's)
    Shape shape;                    // the full shape
    std::int64_t rows = 0, cols = 0, cut = 1;
    RowShard mine;
  };
  Shard& shard_of(const nn::Parameter& p);
  Tensor part_matrix(const Shard& s) const;  // the shard's value as (its rows x cols)
  Tensor gather_value(const Shard& s, GatherCounts* counts);
  void reduce_into(Shard& s, Tensor full_grad);
  Tensor gather_blocks(const Shard& s, const Tensor& scales);  // a shard's FP8 moment scales -> the whole's
  nn::RecipeOperand gather_operand(const nn::GemmCall& call, nn::Parameter& weight, bool transposed);
  void write_whole(nn::Trainer& trainer, bool optimizer_state, const std::function<void()>& write);

  Communicator& comm_;
  ReducePayload payload_;
  std::int64_t global_rows_;
  float share_ = 1.0f;
  nn::Trainer* trainer_ = nullptr;
  std::vector<Shard> shards_;
  std::vector<nn::Parameter*> shard_ptrs_;
  std::unordered_map<const nn::Parameter*, std::size_t> index_;
  GatherCounts gathered_;
};

}  // namespace fp8kit
