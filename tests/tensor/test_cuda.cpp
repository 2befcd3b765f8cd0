// CUDA devices in the tensor layer: what the runtime reports, and (on a machine whose driver shows a device) tensors
// placed there: copies both ways bit for bit, zeros and fills, the per-device allocation accounting, and host code
// refusing device memory. Without a device the tensor tests skip and say why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/same_bits.hpp"
#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/common/version.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/convert/cuda_convert.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "fp8kit/tensor/memory.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {
namespace {

TEST(CudaRuntime, ReportsItselfConsistently) {
  EXPECT_EQ(cuda::built(), build_info().cuda);
  const int count = cuda::device_count();
  EXPECT_GE(count, 0);
  EXPECT_EQ(cuda::devices().size(), static_cast<std::size_t>(count));
  EXPECT_EQ(cuda::unavailable_reason().empty(), count > 0) << cuda::unavailable_reason();
  if (!cuda::built()) {
    EXPECT_EQ(count, 0);
    EXPECT_EQ(cuda::runtime_version(), 0);
    EXPECT_NE(cuda::unavailable_reason().find("no CUDA backend"), std::string::npos);
  } else {
    EXPECT_GE(cuda::runtime_version(), 12000);  // the toolkit this backend needs (cudaMallocAsync pools)
  }
  for (const cuda::DeviceInfo& d : cuda::devices()) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.memory_bytes, 0);
    EXPECT_GE(d.major, 5);
  }
}

class CudaTensor : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  }
};

// Random bytes of every dtype (odd sizes: no multiple of anything) go to the device and back unchanged; a copy
// between two tensors on the device too.
TEST_F(CudaTensor, CopiesBothWaysBitForBit) {
  const Device gpu = Device::cuda(0);
  for (DType dtype : kAllDTypes) {
    for (std::int64_t n : {1, 7, 4099, 1 << 20}) {
      Tensor host = empty({n}, dtype);
      auto* bytes = reinterpret_cast<unsigned char*>(host.raw());
      for (std::int64_t i = 0; i < host.nbytes(); ++i) bytes[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
      const Tensor there = host.to(gpu);
      EXPECT_EQ(there.device(), gpu);
      EXPECT_EQ(there.dtype(), dtype);
      EXPECT_FALSE(there.shares_storage_with(host));
      const Tensor copy = there.clone();
      EXPECT_EQ(copy.device(), gpu);
      EXPECT_TRUE(there.to(gpu).shares_storage_with(there));  // already there: the tensor itself
      const Tensor back = copy.to(Device::cpu());
      ASSERT_EQ(back.nbytes(), host.nbytes());
      EXPECT_EQ(std::memcmp(back.raw(), host.raw(), static_cast<std::size_t>(host.nbytes())), 0)
          << name(dtype) << " " << n;
    }
  }
}

TEST_F(CudaTensor, ZerosAndFillsAreTheHostsBits) {
  const Device gpu = Device::cuda(0);
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float8_e4m3fn, DType::float8_e8m0fnu}) {
    const Tensor z = zeros({3, 333}, dtype, gpu).to(Device::cpu());
    const Tensor zh = zeros({3, 333}, dtype);
    EXPECT_EQ(std::memcmp(z.raw(), zh.raw(), static_cast<std::size_t>(zh.nbytes())), 0) << name(dtype);
    const Tensor f = full({5, 17}, 449.0, dtype, gpu).to(Device::cpu());
    const Tensor fh = full({5, 17}, 449.0, dtype);
    EXPECT_EQ(std::memcmp(f.raw(), fh.raw(), static_cast<std::size_t>(fh.nbytes())), 0) << name(dtype);
  }
}

// The device's own counters: a storage counts its padded size while it lives, the CPU's counters do not move.
TEST_F(CudaTensor, AllocationsCountOnTheirDevice) {
  const Device gpu = Device::cuda(0);
  const MemoryStats before = memory_stats(gpu);
  const std::int64_t cpu_before = memory_stats().current_bytes;
  {
    const MemoryCategoryScope category(MemoryCategory::kActivations);
    const Tensor t = empty({1000}, DType::float8_e5m2, gpu);  // 1000 bytes, counted as 1024
    const MemoryStats during = memory_stats(gpu);
    EXPECT_EQ(during.current_bytes - before.current_bytes, 1024);
    EXPECT_EQ(during.current_by_category[static_cast<std::size_t>(MemoryCategory::kActivations)] -
                  before.current_by_category[static_cast<std::size_t>(MemoryCategory::kActivations)],
              1024);
    EXPECT_GE(during.peak_bytes, during.current_bytes);
    EXPECT_EQ(memory_stats().current_bytes, cpu_before);
  }
  EXPECT_EQ(memory_stats(gpu).current_bytes, before.current_bytes);
}

// Host code refuses device memory with one line naming the device, never reading it.
TEST_F(CudaTensor, HostCodeRefusesDeviceMemory) {
  const Tensor t = ones({4, 4}, DType::float32, Device::cuda(0));
  auto expect_refused = [](auto&& call, const char* what) {
    testing::expect_error(call, ErrorKind::kUnsupported, {"cuda:0", "to(Device::cpu())"}, what);
  };
  expect_refused([&] { (void)t.data<float>(); }, "data");
  expect_refused([&] { (void)t.span<float>(); }, "span");
  expect_refused([&] { (void)t.raw(); }, "raw");
  expect_refused([&] { (void)t.to(DType::bfloat16); }, "to(dtype)");
  expect_refused([&] { (void)t.item_as_double(0); }, "item_as_double");
  EXPECT_NE(t.data_ptr(), nullptr);
  EXPECT_EQ(t.to(DType::float32).data_ptr(), t.data_ptr());  // its own dtype: the tensor itself
}

// Inputs that reach every branch of the codec: all 65536 bfloat16 and float16 bit patterns, and as float32 the
// bfloat16 patterns widened plus 2^20 pseudo-random float32 bit patterns.
Tensor every_pattern(DType dtype) {
  const std::int64_t n = dtype == DType::float32 ? 65536 + (1 << 20) : 65536;
  Tensor t = empty({n}, dtype);
  if (dtype == DType::float32) {
    auto* u = reinterpret_cast<std::uint32_t*>(t.raw());
    for (std::int64_t i = 0; i < 65536; ++i) u[i] = static_cast<std::uint32_t>(i) << 16;
    for (std::int64_t i = 65536; i < n; ++i) u[i] = stochastic_bits(99, static_cast<std::uint64_t>(i));
  } else {
    auto* u = reinterpret_cast<std::uint16_t*>(t.raw());
    for (std::int64_t i = 0; i < n; ++i) u[i] = static_cast<std::uint16_t>(i);
  }
  return t;
}

// Tensor::to on the device gives the CPU's codes and values, every format, both overflow policies, every wide dtype.
TEST_F(CudaTensor, CastsGiveTheCpusBitsThroughTo) {
  const Device gpu = Device::cuda(0);
  for (DType wide : {DType::float32, DType::bfloat16, DType::float16}) {
    const Tensor host = every_pattern(wide);
    const Tensor there = host.to(gpu);
    for (DType fp8 : {DType::float8_e4m3fn, DType::float8_e5m2, DType::float8_e4m3fnuz, DType::float8_e5m2fnuz,
                      DType::float8_e8m0fnu}) {
      for (Overflow overflow : {Overflow::kNonSaturating, Overflow::kSaturate}) {
        const Tensor want = host.to(fp8, overflow);
        const Tensor got = there.to(fp8, overflow).to(Device::cpu());
        EXPECT_TRUE(testing::same_bits(got, want)) << name(wide) << " -> " << name(fp8);
        // and back: every code decoded into the wide dtype
        EXPECT_TRUE(testing::same_bits(want.to(gpu).to(wide).to(Device::cpu()), want.to(wide)))
            << name(fp8) << " -> " << name(wide);
      }
    }
  }
  // a pair CUDA does not convert is refused, not computed on the host
  testing::expect_error([&] { (void)ones({4}, DType::float32, gpu).to(DType::int64); }, ErrorKind::kUnsupported,
                        {"float32 -> int64 on cuda:0"});
  // ... and so is e5m2 -> e5m2 saturating (it clamps infinities on the CPU), where it used to return the tensor as
  // it was, infinities and all; without saturation it is the tensor itself, as on the CPU
  const Tensor e5 = ones({4}, DType::float32, gpu).to(DType::float8_e5m2);
  testing::expect_error([&] { (void)e5.to(DType::float8_e5m2, Overflow::kSaturate); }, ErrorKind::kUnsupported,
                        {"float8_e5m2 -> float8_e5m2 on cuda:0"});
  EXPECT_EQ(e5.to(DType::float8_e5m2, Overflow::kNonSaturating).data_ptr(), e5.data_ptr());
}

// The bulk casts' options on the device: quantization scales, stochastic rounding (the same counter-based bits as
// the CPU: same seed and offset, same codes), dequantization scales; against cast_to_fp8 / cast_from_fp8.
TEST_F(CudaTensor, ScaledAndStochasticCastsGiveTheCpusBits) {
  const Device gpu = Device::cuda(0);
  const Tensor host = every_pattern(DType::float32);
  const Tensor there = host.to(gpu);
  const std::int64_t n = host.numel();
  for (Format format : kAllFormats) {
    for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
      CastOptions o{format, Overflow::kSaturate, rounding, 0.37f, 12345, 1000};
      Tensor want = empty({n}, DType::float8_e4m3fn);  // the codes as bytes
      cast_to_fp8(host.span<float>(), want.span<std::uint8_t>(), o);
      Tensor got = empty({n}, DType::float8_e4m3fn, gpu);
      cuda::cast_to_fp8(static_cast<const float*>(there.data_ptr()), static_cast<std::uint8_t*>(got.data_ptr()), n, o,
                        0);
      EXPECT_TRUE(testing::same_bits(got.to(Device::cpu()), want))
          << name(format) << (rounding == Rounding::kStochastic ? " sr" : "");
    }
    Tensor codes = empty({256}, DType::float8_e4m3fn);
    for (int c = 0; c < 256; ++c)
      codes.span<std::uint8_t>()[static_cast<std::size_t>(c)] = static_cast<std::uint8_t>(c);
    Tensor want = empty({256}, DType::float32);
    cast_from_fp8(codes.span<std::uint8_t>(), format, want.span<float>(), 0.37f);
    const Tensor codes_there = codes.to(gpu);
    Tensor got = empty({256}, DType::float32, gpu);
    cuda::cast_from_fp8(static_cast<const std::uint8_t*>(codes_there.data_ptr()), format,
                        static_cast<float*>(got.data_ptr()), 256, 0.37f, 0);
    EXPECT_TRUE(testing::same_bits(got.to(Device::cpu()), want)) << name(format) << " decode";
  }
}

// The casts take 16 bytes a thread where the pointers allow it and one element a thread elsewhere: every offset of
// input and output against 16-byte alignment and lengths around the vector width give the CPU's bits, for every
// wide dtype, with a quantization scale, round to nearest even and stochastic rounding (whose bits follow the
// element's position), and the decode with a dequantization scale into every wide dtype. The inputs span every
// code (normal values over 2^-12..2^12 of both signs, subnormals, zeros, NaN, Inf), and the outputs are refilled
// with a sentinel before each call, so that a store left out or put in the wrong place fails.
Tensor mixed_values(std::int64_t n, DType dtype) {
  Tensor t = randn({n}, 21);
  float* x = t.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    x[i] = std::ldexp(x[i], static_cast<int>((i * 5) % 25) - 12);
    if (i % 37 == 3) x[i] = std::numeric_limits<float>::denorm_min() * static_cast<float>(i);
    if (i % 41 == 5) x[i] = i % 2 ? -0.0f : 0.0f;
    if (i % 43 == 7) x[i] = std::copysign(std::numeric_limits<float>::quiet_NaN(), i % 2 ? -1.0f : 1.0f);
    if (i % 47 == 11) x[i] = std::copysign(std::numeric_limits<float>::infinity(), i % 2 ? -1.0f : 1.0f);
  }
  return dtype == DType::float32 ? t : t.to(dtype);
}

template <typename T>
void expect_casts_at_every_offset(DType wide) {
  const Device gpu = Device::cuda(0);
  const std::int64_t room = 4096 + 32;
  const Tensor host = mixed_values(room, wide);
  const Tensor there = host.to(gpu);
  const auto* in_host = reinterpret_cast<const T*>(host.raw());
  const auto* in_there = static_cast<const T*>(there.data_ptr());
  Tensor code_sentinel = empty({room}, DType::float8_e4m3fn);
  std::memset(code_sentinel.raw(), 0xA5, static_cast<std::size_t>(code_sentinel.nbytes()));
  Tensor wide_sentinel = empty({room}, wide);
  std::memset(wide_sentinel.raw(), 0xA5, static_cast<std::size_t>(wide_sentinel.nbytes()));
  int distinct_codes = 0;
  for (Format format : {Format::e4m3fn, Format::e5m2fnuz}) {
    for (Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic}) {
      const CastOptions o{format, Overflow::kSaturate, rounding, 0.37f, 777, 5};
      for (std::int64_t in_off : {0, 1, 3, 8, 15}) {
        for (std::int64_t out_off : {0, 1, 4, 8, 13}) {
          for (std::int64_t n : {1, 7, 15, 16, 17, 33, 255, 4000}) {
            const std::string what = std::string(name(wide)) + " <-> " + std::string(name(format)) +
                                     (rounding == Rounding::kStochastic ? " sr" : "") + " at " +
                                     std::to_string(in_off) + "/" + std::to_string(out_off) + ", n " +
                                     std::to_string(n);
            std::vector<std::uint8_t> want(static_cast<std::size_t>(n));
            cast_to_fp8(std::span<const T>(in_host + in_off, static_cast<std::size_t>(n)), want, o);
            if (n == 4000) distinct_codes = static_cast<int>(std::set<std::uint8_t>(want.begin(), want.end()).size());
            Tensor codes_there = code_sentinel.to(gpu);
            auto* codes_ptr = static_cast<std::uint8_t*>(codes_there.data_ptr());
            cuda::cast_to_fp8(in_there + in_off, codes_ptr + out_off, n, o, 0);
            const Tensor codes_back = codes_there.to(Device::cpu());
            const auto* got = reinterpret_cast<const std::uint8_t*>(codes_back.raw());
            EXPECT_EQ(std::vector<std::uint8_t>(got + out_off, got + out_off + n), want) << what;
            EXPECT_TRUE(std::all_of(got, got + out_off, [](std::uint8_t c) { return c == 0xA5; })) << what;
            EXPECT_TRUE(std::all_of(got + out_off + n, got + room, [](std::uint8_t c) { return c == 0xA5; })) << what;
            // and back, with a dequantization scale
            std::vector<T> back_want(static_cast<std::size_t>(n));
            cast_from_fp8(want, format, std::span<T>(back_want), 0.37f);
            Tensor wide_there = wide_sentinel.to(gpu);
            cuda::cast_from_fp8(codes_ptr + out_off, format, static_cast<T*>(wide_there.data_ptr()) + in_off, n, 0.37f,
                                0);
            const Tensor wide_back = wide_there.to(Device::cpu());
            const auto* back = reinterpret_cast<const std::uint8_t*>(wide_back.raw());
            const std::size_t at = static_cast<std::size_t>(in_off) * sizeof(T), len = back_want.size() * sizeof(T);
            EXPECT_EQ(std::memcmp(back + at, back_want.data(), len), 0) << what;
            EXPECT_TRUE(std::all_of(back, back + at, [](std::uint8_t c) { return c == 0xA5; })) << what;
            EXPECT_TRUE(std::all_of(back + at + len, back + wide_back.nbytes(), [](std::uint8_t c) {
              return c == 0xA5;
            })) << what;
          }
        }
      }
      EXPECT_GE(distinct_codes, 100) << name(wide) << " " << name(format) << ": the inputs must reach most codes";
    }
  }
}

TEST_F(CudaTensor, CastsGiveTheCpusBitsAtEveryAlignment) {
  expect_casts_at_every_offset<float>(DType::float32);
  expect_casts_at_every_offset<bfloat16>(DType::bfloat16);
  expect_casts_at_every_offset<float16>(DType::float16);
}

}  // namespace
}  // namespace fp8kit
