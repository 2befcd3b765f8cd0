// The io layer's checks of hand-built tensors (an audit under ASan): a SafetensorsTensor or NpyArray whose bytes are
// fewer than its dtype and shape take was read past its end by the conversion, quantization and checkpoint paths.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"
#include "fp8kit/io/npy.hpp"
#include "fp8kit/io/safetensors.hpp"

namespace fp8kit {
namespace {

TEST(IoApiEdges, ATensorViewingTooFewBytesIsRefused) {
  std::vector<std::byte> eight(8);
  SafetensorsTensor w{"w", SafetensorsDType::F32, {4, 4}, 0, 8, std::span<const std::byte>(eight)};
  EXPECT_THROW(w.check_bytes(), Error);
  EXPECT_THROW((void)to_tensor(w), Error);
  std::vector<std::byte> out(16 * 2);
  EXPECT_THROW(convert_tensor_into(w, DType::bfloat16, Overflow::kSaturate, out), Error);
  SafetensorsTensor codes{"w", SafetensorsDType::F8_E4M3, {4, 4}, 0, 8, std::span<const std::byte>(eight)};
  std::vector<std::byte> one(4);
  SafetensorsTensor scale{"w_scale", SafetensorsDType::F32, {}, 0, 4, std::span<const std::byte>(one)};
  EXPECT_THROW((void)load_checkpoint_tensor(CheckpointLayout::kCompressedTensors, codes, scale), Error);
  std::vector<std::byte> sixteen(16);
  const SafetensorsTensor whole{"w", SafetensorsDType::F8_E4M3, {4, 4}, 0, 16, std::span<const std::byte>(sixteen)};
  EXPECT_NO_THROW(whole.check_bytes());
}

TEST(IoApiEdges, AnNpyArrayWithTooFewBytesIsRefused) {
  NpyArray a;
  a.dtype = NpyDType::kFloat32;
  a.descr = "<f4";
  a.shape = {4, 4};
  a.data.resize(8);
  EXPECT_THROW((void)a.to_float32(), Error);
  a.shape = {std::int64_t{1} << 40, std::int64_t{1} << 40};
  EXPECT_THROW((void)a.numel(), Error);
}

}  // namespace
}  // namespace fp8kit
