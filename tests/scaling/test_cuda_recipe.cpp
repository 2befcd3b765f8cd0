// Delayed scaling on a CUDA device against the CPU's DelayedScaling, step by step and bit for bit: the codes and
// scales of each step's quantization, and the whole state (scale, history, EMA, calibration) after each update, over
// steps with changing magnitudes, a NaN step, a step the module skipped, four configurations and a state copied from
// the host. Skipped without a device, saying why; the refusal of a missing device runs in every build.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/scaling/cuda_recipe.hpp"
#include "fp8kit/scaling/scaled_tensor.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {
namespace {

using testing::expect_error;

// The device past the last one is not there in any build on any machine (no backend, no driver, or the range).
TEST(CudaRecipeBuild, RefusesADeviceThatIsNotThere) {
  const int missing = cuda::device_count();
  expect_error([&] { cuda::DelayedScalingState state(DelayedScalingConfig{}, missing); }, ErrorKind::kUnsupported,
               {"'cuda:" + std::to_string(missing) + "' is not available"});
}

class CudaRecipe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  }
};

// The nn recipes' delayed quantization on the CPU (src/nn/precision.cpp's prepare_operand): this step's own scale
// until the state is calibrated, the amax recorded (NaN when x is not finite), the cast with that scale.
ScaledTensor cpu_step(const Tensor& x, DelayedScaling& s, Overflow overflow) {
  const AmaxResult a = amax(x.span<float>());
  const bool nonfinite = a.has_nonfinite();
  const float scale = s.calibrated() || nonfinite
                          ? s.scale()
                          : compute_scale(a.amax, s.config().format, ScaleOptions{s.config().margin}, s.scale());
  s.record(nonfinite ? std::numeric_limits<float>::quiet_NaN() : a.amax);
  return quantize_with_scale(x.matrix(), s.config().format, scale, overflow);
}

// Step `step`'s input: magnitudes that move by 2^3 from step to step (both ways), a NaN at step 4.
Tensor input(int step) {
  Tensor x = randn({33, 70}, static_cast<std::uint64_t>(100 + step));
  const float magnitude = std::ldexp(1.0f, (step % 5) * 3 - 6);
  for (float& v : x.span<float>()) v *= magnitude;
  if (step == 4) x.span<float>()[17] = std::numeric_limits<float>::quiet_NaN();
  return x;
}

void run_steps(DelayedScaling cpu, cuda::DelayedScalingState& gpu, int first, int steps, Overflow overflow,
               const std::string& what) {
  for (int step = first; step < first + steps; ++step) {
    const std::string at = what + ", step " + std::to_string(step);
    if (step != 7) {  // step 7: the module did not run (nothing recorded: the update changes nothing)
      const Tensor x = input(step);
      const ScaledTensor want = cpu_step(x, cpu, overflow);
      const cuda::QuantizedTensor got = cuda::quantize_delayed(x.to(Device::cuda(0)), gpu, overflow);
      const ScaledTensor back = got.to_host();
      EXPECT_TRUE(back.data == want.data) << at;
      ASSERT_EQ(back.scale_inv.size(), 1u) << at;
      EXPECT_EQ(std::bit_cast<std::uint32_t>(back.scale_inv[0]), std::bit_cast<std::uint32_t>(want.scale_inv[0])) << at;
    }
    cpu.update();
    cuda::update(gpu);
    EXPECT_EQ(gpu.to_host().serialize(), cpu.serialize()) << at;
    EXPECT_EQ(gpu.scale_inv().to(Device::cpu()).item_as_double(0), cpu.scale_inv()) << at;
  }
}

TEST_F(CudaRecipe, StepsGiveTheCpusCodesScalesAndState) {
  DelayedScalingConfig window;  // fmax over a window the steps wrap several times
  window.history_length = 4;
  DelayedScalingConfig recent;
  recent.history_length = 3;
  recent.algorithm = AmaxCompute::kMostRecent;
  DelayedScalingConfig smoothed;
  smoothed.format = Format::e5m2;
  smoothed.history_length = 5;
  smoothed.margin = 1;
  smoothed.ema_decay = 0.9f;
  DelayedScalingConfig single;
  single.history_length = 1;
  int configs = 0;
  for (const DelayedScalingConfig& config : {window, recent, smoothed, single}) {
    for (Overflow overflow : {Overflow::kSaturate, Overflow::kNonSaturating}) {
      cuda::DelayedScalingState gpu(config, 0);
      run_steps(DelayedScaling(config), gpu, 0, 12, overflow,
                "history " + std::to_string(config.history_length) + (overflow == Overflow::kSaturate ? " sat" : ""));
      ++configs;
    }
  }
  EXPECT_EQ(configs, 8);
}

// A state that ran on the CPU (a checkpoint's) continues on the device as it would have on the CPU.
TEST_F(CudaRecipe, AHostStateContinuesOnTheDevice) {
  DelayedScalingConfig config;
  config.history_length = 6;
  config.ema_decay = 0.5f;
  DelayedScaling cpu(config);
  for (int step = 0; step < 3; ++step) {
    cpu_step(input(step), cpu, Overflow::kSaturate);
    cpu.update();
  }
  ASSERT_TRUE(cpu.calibrated());
  cuda::DelayedScalingState gpu(cpu, 0);
  EXPECT_EQ(gpu.to_host().serialize(), cpu.serialize());
  run_steps(cpu, gpu, 3, 8, Overflow::kSaturate, "from the host");
}

TEST_F(CudaRecipe, RefusesWhatItCannotQuantize) {
  cuda::DelayedScalingState state(DelayedScalingConfig{}, 0);
  expect_error([&] { cuda::quantize_delayed(ones({4}), state); }, ErrorKind::kInvalidArgument, {"x is on cpu"});
  expect_error([&] { cuda::quantize_delayed(zeros({4}, DType::int8, Device::cuda(0)), state); },
               ErrorKind::kInvalidArgument, {"int8"});
  // bfloat16 and float16 input: the same codes as their float32 widening, before the state is calibrated (amax,
  // then the encode) and after it (one pass that does both), at every step.
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    cuda::DelayedScalingState gpu(DelayedScalingConfig{}, 0);
    DelayedScaling cpu(DelayedScalingConfig{});
    for (int step = 0; step < 6; ++step) {
      const Tensor x = input(step).to(dtype);
      const ScaledTensor want = cpu_step(x.to(DType::float32), cpu, Overflow::kSaturate);
      EXPECT_TRUE(cuda::quantize_delayed(x.to(Device::cuda(0)), gpu).to_host().data == want.data)
          << name(dtype) << ", step " << step;
      cpu.update();
      cuda::update(gpu);
    }
    EXPECT_TRUE(cpu.calibrated()) << name(dtype);
  }
}

}  // namespace
}  // namespace fp8kit
