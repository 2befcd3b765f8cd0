// The FP8 inference export of a trained model (`fp8kit train --export-fp8`): its 2-D linear weights quantized into
// a checkpoint layout (by default the one `fp8kit quantize` writes for the scheme), the rest FP32, and in __metadata__
// the original dtype and overflow policy of every quantized weight and the recipe the model was trained with.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "fp8kit/io/checkpoint_layout.hpp"
#include "fp8kit/nn/model.hpp"
#include "fp8kit/nn/precision.hpp"
#include "fp8kit/nn/train.hpp"

namespace fp8kit {

// What resolve_fp8_export() decides (its defaults are the ones to use; these members' are only initial values).
struct Fp8ExportOptions {
  QuantScheme scheme = QuantScheme::kFp8Tensor;
  CheckpointLayout layout = CheckpointLayout::kCompressedTensors;
  Format format = Format::e4m3fn;
  // Static activation scales calibrated by training: each quantized weight's `<module>.input_scale` (F32 [1]) is
  // the dequantization scale its layer's delayed scaling holds for the input (scale_inv(): from the amax history
  // by the recipe's algorithm, margin applied; max / 448 by default), which serving stacks apply to activations instead
  // of computing each batch's amax. Needs a delayed-scaling recipe and a layout with static activations
  // (compressed-tensors, autofp8, native).
  bool static_input_scales = false;
};

// The options for a recipe and what the user chose. The scheme, when not given: the one the layout needs (deepseek:
// fp8-block, mxfp8: mxfp8, autofp8: fp8-tensor, fbgemm: fp8-channel), else the recipe's weight granularity
// (fp8-block for fp8-block, mxfp8 for mxfp8, fp8-tensor otherwise). The layout, when not given: default_layout()
// of the scheme, the one `fp8kit quantize` picks (resolve_storage() applies both rules). Throws
// Error(kInvalidArgument) with layout_refusal()'s line for a combination the layout cannot store.
// static_input_scales is refused (Error(kInvalidArgument), one line) for recipes without delayed scaling and for
// layouts without static activations.
Fp8ExportOptions resolve_fp8_export(const nn::PrecisionRecipe& recipe, std::optional<QuantScheme> scheme,
                                    std::optional<CheckpointLayout> layout, bool static_input_scales = false);

struct Fp8ExportSummary {
  std::filesystem::path file;          // the safetensors file written
  std::vector<std::string> quantized;  // weight names, in parameter order
  std::vector<std::string> kept;       // parameters left as they are (skip_reason(): embeddings, norms, lm_head, ...)
  std::uint64_t bytes = 0;             // of the tensors
};

// Writes the model's parameters as an inference checkpoint: the weights skip_reason() accepts (2-D float `.weight`
// tensors other than embeddings, norms, lm_head; convolution weights are 4-D and stay as they are) quantized with
// quantize_checkpoint_tensor() (saturating), every other parameter in the model's dtype (FP32, or BF16 under bf16
// master weights) under its own name. `path` ending in
// .safetensors is one file; any other path is a directory (created with its parents) holding model.safetensors and a
// config.json with the layout's quantization_config, written together: both are staged and synced before either is
// renamed into place, so a failure until then (a full disk, a folder in the way) leaves the directory as it was and
// removes the folders it created (only a rename itself failing, between the two, leaves them apart); a sharded
// checkpoint of the prefix "model" left there by an earlier write goes with the commit. __metadata__: "format" "pt";
// "fp8kit.export.*": recipe, model, seed, steps, scheme, layout, format, original_dtype (the parameters' dtype: float32
// or bfloat16), overflow (saturate); "fp8kit.export.tensor.<weight>" =
// "scheme=...;format=...;dtype=<original_dtype>;overflow=saturate" for each quantized weight, config.json's torch_dtype
// the same; and the native layout's own entries. Crash-safe (AtomicFile). Throws Error(kInvalidArgument) when no weight
// is quantized.
Fp8ExportSummary export_fp8_checkpoint(const std::filesystem::path& path, nn::Model& model,
                                       const nn::TrainConfig& config, const nn::PrecisionRecipe& recipe,
                                       std::int64_t steps_done, const Fp8ExportOptions& options);

}  // namespace fp8kit
