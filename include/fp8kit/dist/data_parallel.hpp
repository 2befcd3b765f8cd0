// Data-parallel training over a communicator (`fp8kit train --parallel ddp`): every rank holds the whole model and
// trains on its rows of each global batch; the trainer's hooks make the loss, the gradients, the guard's verdict and
// the delayed-scaling amaxes the run's, so every rank takes the same step and the replicas stay identical.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "fp8kit/dist/communicator.hpp"
#include "fp8kit/dist/fp8_collectives.hpp"
#include "fp8kit/io/train_checkpoint.hpp"
#include "fp8kit/nn/train.hpp"

namespace fp8kit {

// config with its batch shard set for this rank of `comm` (the global batch is config's; even_split splits it).
nn::TrainConfig data_parallel_config(const Communicator& comm, nn::TrainConfig config);

// `base` with the data-parallel hooks (base's own reduce_gradients, agree_loss, agree_nonfinite and agree_amax are
// replaced; the others kept):
//   agree_loss        the mean over ranks weighted by their rows (an FP32 all-reduce);
//   reduce_gradients  every parameter's gradient times this rank's share of the rows, then summed over ranks in
//                     `payload` (all_reduce_sum, one per parameter: FP8 payloads get a scale per tensor; a
//                     bfloat16 gradient is widened, summed in float32 and rounded once to nearest even);
//   agree_nonfinite   any rank's verdict skips the step on every rank ("non-finite ... on rank r");
//   agree_amax        every FP8 state's amaxes of this step, MAX over ranks (one batched all_reduce_amax).
// `global_rows` is the rows of a global batch (batch_size(config)). The communicator must outlive the run.
nn::TrainHooks data_parallel_hooks(Communicator& comm, ReducePayload payload, std::int64_t global_rows,
                                   nn::TrainHooks base = {});

// How a data-parallel run writes its checkpoints and FP8 export (TrainCheckpointOptions::around_write): every
// replica is whole and the same, so rank 0 writes, and a failed write fails on every rank (agree_on_error). A
// checkpoint to resume from is read by every rank (it must be where all of them see it).
TrainCheckpointOptions::AroundWrite rank_zero_writes(Communicator& comm);

// A fingerprint of every parameter's bytes (16 hex digits, FNV-1a 64); of every FP8 layer state (the delayed-scaling
// amax histories and scales, serialized); and whether every rank has the same two (under fsdp the weights are the
// gathered ones, so the states are what can differ).
std::string parameter_fingerprint(nn::Model& model);
std::string state_fingerprint(nn::Model& model);
bool replicas_identical(Communicator& comm, nn::Model& model);

}  // namespace fp8kit
