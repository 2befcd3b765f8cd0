// amax on a CUDA device, alone and fused with the cast to FP8, against the CPU's amax() and casts (skipped without a
// device, saying why); and the CPU-only build's refusal.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/cuda_convert.hpp"
#include "fp8kit/scaling/cuda_amax.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "scaling/scaling_test_util.hpp"

namespace fp8kit {
namespace {

using testing::expect_same;

// n values of varied magnitude (normals, subnormals, zeros of both signs), with NaNs and Infs of both signs
// sprinkled in when asked.
Tensor amax_input(std::int64_t n, bool nonfinite) {
  Tensor t = randn({n}, 7);
  float* x = t.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % 97 == 5) x[i] *= 1e-40f;  // subnormal
    if (i % 101 == 3) x[i] = i % 2 ? -0.0f : 0.0f;
    if (nonfinite && i % 1009 == 7) x[i] = std::copysign(std::numeric_limits<float>::quiet_NaN(), i % 2 ? -1.0f : 1.0f);
    if (nonfinite && i % 1013 == 11) x[i] = std::copysign(std::numeric_limits<float>::infinity(), i % 2 ? -1.0f : 1.0f);
  }
  if (n > 1000) x[n / 2] = -123456.75f;  // the largest magnitude, negative, in the middle
  return t;
}

class CudaAmax : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  }
};

TEST_F(CudaAmax, IsTheCpusBitForBit) {
  // (the last more than one pass of the grid: 4096 blocks of 256 threads, four loads of four floats a thread)
  for (std::int64_t n : {0, 1, 7, 255, 257, 100003, (1 << 22) + 3, (1 << 24) + 4099}) {
    for (bool nonfinite : {false, true}) {
      const Tensor host = amax_input(n, nonfinite);
      const Tensor there = host.to(Device::cuda(0));
      expect_same(cuda::amax(static_cast<const float*>(there.data_ptr()), n, 0), amax(host.span<float>()),
                  "n=" + std::to_string(n) + (nonfinite ? " with NaN/Inf" : ""));
    }
  }
}

// The fused pass gives cast_to_fp8's codes and amax's result: every format, both policies, a scale, SR.
TEST_F(CudaAmax, FusedCastGivesTheCastsCodesAndTheAmax) {
  const std::int64_t n = 300007;
  const Tensor host = amax_input(n, true);
  const Tensor there = host.to(Device::cuda(0));
  const AmaxResult want_amax = amax(host.span<float>());
  for (Format format : kAllFormats) {
    for (Overflow overflow : {Overflow::kNonSaturating, Overflow::kSaturate}) {
      for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
        const CastOptions o{format, overflow, rounding, 2.5f, 77, 9};
        Tensor want = empty({n}, DType::float8_e4m3fn);
        cast_to_fp8(host.span<float>(), want.span<std::uint8_t>(), o);
        Tensor got = empty({n}, DType::float8_e4m3fn, Device::cuda(0));
        const AmaxResult a = cuda::cast_to_fp8_with_amax(static_cast<const float*>(there.data_ptr()),
                                                         static_cast<std::uint8_t*>(got.data_ptr()), n, o, 0);
        const std::string what = std::string(name(format)) + (overflow == Overflow::kSaturate ? " sat" : " nonsat") +
                                 (rounding == Rounding::kStochastic ? " sr" : " rne");
        expect_same(a, want_amax, what);
        const Tensor back = got.to(Device::cpu());
        EXPECT_EQ(std::memcmp(back.raw(), want.raw(), static_cast<std::size_t>(n)), 0) << what;
      }
    }
  }
}

// Every device entry point (the casts, amax, the fused pass) refuses a device that is not there, in one line, empty
// inputs included: without the backend because the build has none, with it the device past the last one (cuda:0 on
// a machine without a driver or device).
TEST(CudaBuild, EveryDeviceEntryRefusesADeviceThatIsNotThere) {
  const int missing = cuda::device_count();
  const std::string why = cuda::built() ? "cuda:" + std::to_string(missing) : "no CUDA backend";
  const CastOptions o{Format::e4m3fn, Overflow::kSaturate};
  const std::vector<std::function<void()>> calls = {
      [&] { cuda::cast_to_fp8(static_cast<const float*>(nullptr), nullptr, 0, o, missing); },
      [&] { cuda::cast_from_fp8(nullptr, Format::e5m2, static_cast<float*>(nullptr), 0, 1.0f, missing); },
      [&] { cuda::amax(nullptr, 0, missing); }, [&] { cuda::cast_to_fp8_with_amax(nullptr, nullptr, 0, o, missing); }};
  for (std::size_t i = 0; i < calls.size(); ++i) {
    testing::expect_error(calls[i], ErrorKind::kUnsupported, {why}, "entry " + std::to_string(i));
  }
}

}  // namespace
}  // namespace fp8kit
