// fp8kit's public headers in one include, layer by layer (the order of DESIGN.md), except the training layer
// (fp8kit/nn/*.hpp) and what builds on it (io/train_checkpoint.hpp, io/fp8_export.hpp, dist/data_parallel.hpp,
// dist/fsdp.hpp), the CUDA backend's (*/cuda*.hpp, dist/nccl_communicator.hpp: include them where the device is
// used), and the bodies for kernels (format/codec_inline.hpp, scaling/scale_inline.hpp).
#pragma once

#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/common/kernel_contract.hpp"
#include "fp8kit/common/profiler.hpp"
#include "fp8kit/common/text.hpp"
#include "fp8kit/common/version.hpp"

#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/float8.hpp"
#include "fp8kit/format/format.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/format/parse_number.hpp"

#include "fp8kit/convert/convert.hpp"

#include "fp8kit/tensor/device.hpp"
#include "fp8kit/tensor/dtype.hpp"
#include "fp8kit/tensor/matrix_ref.hpp"
#include "fp8kit/tensor/memory.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "fp8kit/tensor/tensor_buffer.hpp"

#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/scaling/analysis.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/scaling/recipe.hpp"
#include "fp8kit/scaling/scale.hpp"
#include "fp8kit/scaling/scaled_tensor.hpp"

#include "fp8kit/ops/scaled_mm.hpp"

#include "fp8kit/io/atomic_file.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"
#include "fp8kit/io/npy.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"

#include "fp8kit/dist/communicator.hpp"
#include "fp8kit/dist/fp8_collectives.hpp"
