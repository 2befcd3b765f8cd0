// The dtype registry (names, sizes, kinds, FP8 formats), the default-dtype rule that refuses FP8 with an
// explanation, and devices (only the CPU allocates in this build).
#include <gtest/gtest.h>

#include <string>

#include "default_dtype_guard.hpp"
#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "fp8kit/tensor/device.hpp"
#include "fp8kit/tensor/dtype.hpp"
#include "fp8kit/tensor/memory.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {
namespace {

// Written by hand from PyTorch (torch.<name>.itemsize, is_floating_point), not derived from the registry.
struct Golden {
  DType dtype;
  const char* name;
  int size;
  bool floating;
  bool fp8;
};
const Golden kGoldens[] = {
    {DType::float32, "float32", 4, true, false},
    {DType::float64, "float64", 8, true, false},
    {DType::float16, "float16", 2, true, false},
    {DType::bfloat16, "bfloat16", 2, true, false},
    {DType::float8_e4m3fn, "float8_e4m3fn", 1, true, true},
    {DType::float8_e5m2, "float8_e5m2", 1, true, true},
    {DType::float8_e4m3fnuz, "float8_e4m3fnuz", 1, true, true},
    {DType::float8_e5m2fnuz, "float8_e5m2fnuz", 1, true, true},
    {DType::float8_e8m0fnu, "float8_e8m0fnu", 1, true, true},
    {DType::int8, "int8", 1, false, false},
    {DType::uint8, "uint8", 1, false, false},
    {DType::int16, "int16", 2, false, false},
    {DType::int32, "int32", 4, false, false},
    {DType::int64, "int64", 8, false, false},
    {DType::bool_, "bool", 1, false, false},
};

TEST(DType, EveryDTypeHasAGolden) {
  ASSERT_EQ(std::size(kGoldens), kAllDTypes.size());
  for (std::size_t i = 0; i < kAllDTypes.size(); ++i) EXPECT_EQ(kGoldens[i].dtype, kAllDTypes[i]);
}

TEST(DType, RegistryMatchesGoldens) {
  for (const Golden& g : kGoldens) {
    SCOPED_TRACE(g.name);
    EXPECT_EQ(name(g.dtype), g.name);
    EXPECT_EQ(element_size(g.dtype), g.size);
    EXPECT_EQ(is_floating(g.dtype), g.floating);
    EXPECT_EQ(is_fp8(g.dtype), g.fp8);
    EXPECT_EQ(fp8_format(g.dtype).has_value(), g.fp8);
    EXPECT_EQ(is_integral(g.dtype), !g.floating && g.dtype != DType::bool_);
  }
}

TEST(DType, NamesRoundTrip) {
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(std::string(name(d)));
    EXPECT_EQ(parse_dtype(name(d)), d);
    EXPECT_EQ(parse_dtype(info(d).short_name), d);
    EXPECT_EQ(parse_dtype("torch." + std::string(name(d))), d);
  }
}

TEST(DType, ShortNamesAndAliases) {
  EXPECT_EQ(parse_dtype("f32"), DType::float32);
  EXPECT_EQ(parse_dtype("f64"), DType::float64);
  EXPECT_EQ(parse_dtype("f16"), DType::float16);
  EXPECT_EQ(parse_dtype("bf16"), DType::bfloat16);
  EXPECT_EQ(parse_dtype("e4m3fn"), DType::float8_e4m3fn);
  EXPECT_EQ(parse_dtype("e5m2"), DType::float8_e5m2);
  EXPECT_EQ(parse_dtype("e4m3fnuz"), DType::float8_e4m3fnuz);
  EXPECT_EQ(parse_dtype("e5m2fnuz"), DType::float8_e5m2fnuz);
  EXPECT_EQ(parse_dtype("e8m0fnu"), DType::float8_e8m0fnu);
  EXPECT_EQ(parse_dtype("float"), DType::float32);
  EXPECT_EQ(parse_dtype("double"), DType::float64);
  EXPECT_EQ(parse_dtype("half"), DType::float16);
  EXPECT_EQ(parse_dtype("int"), DType::int32);
  EXPECT_EQ(parse_dtype("long"), DType::int64);
  EXPECT_EQ(parse_dtype("torch.long"), DType::int64);
  for (const char* bad : {"", "float8", "Float32", "e4m3", "fp8", "torch.", "int128", "bool_"}) {
    EXPECT_FALSE(parse_dtype(bad).has_value()) << bad;
  }
}

TEST(DType, Fp8DTypesAndFormatsCorrespond) {
  for (Format f : kAllFormats) {
    SCOPED_TRACE(std::string(name(f)));
    const DType d = dtype_of(f);
    EXPECT_TRUE(is_fp8(d));
    EXPECT_EQ(fp8_format(d), f);
    EXPECT_EQ(name(d), descriptor(f).torch_name);  // both registries spell it the same way
    EXPECT_EQ(info(d).short_name, descriptor(f).name);
  }
  int fp8_count = 0;
  for (DType d : kAllDTypes) {
    if (!is_fp8(d)) continue;
    ++fp8_count;
    EXPECT_EQ(dtype_of(*fp8_format(d)), d);
  }
  EXPECT_EQ(fp8_count, static_cast<int>(kAllFormats.size()));
}

TEST(DType, ElementTypesMapToTheirDTypes) {
  static_assert(dtype_for<float>() == DType::float32);
  static_assert(dtype_for<bfloat16>() == DType::bfloat16);
  static_assert(dtype_for<std::int64_t>() == DType::int64);
  static_assert(dtype_for<bool>() == DType::bool_);
  static_assert(dtype_for<float8_e5m2fnuz>() == DType::float8_e5m2fnuz);
  EXPECT_TRUE(accepts<std::uint8_t>(DType::uint8));
  for (Format f : kAllFormats) EXPECT_TRUE(accepts<std::uint8_t>(dtype_of(f)));
  EXPECT_FALSE(accepts<std::uint8_t>(DType::int8));
  EXPECT_FALSE(accepts<std::uint8_t>(DType::bool_));
  EXPECT_FALSE(accepts<float8_e4m3fn>(DType::float8_e5m2));
  EXPECT_FALSE(accepts<float>(DType::float64));
}

TEST(DefaultDType, StartsAsFloat32AndAcceptsTheFourFloatingTypes) {
  DefaultDTypeGuard guard;
  EXPECT_EQ(default_dtype(), DType::float32);
  for (DType d : {DType::float64, DType::float16, DType::bfloat16, DType::float32}) {
    set_default_dtype(d);
    EXPECT_EQ(default_dtype(), d);
    EXPECT_EQ(zeros({2}).dtype(), d);
    EXPECT_EQ(tensor({1.0}).dtype(), d);
  }
}

TEST(DefaultDType, RefusesEveryFp8FormatAndSaysWhatInstead) {
  DefaultDTypeGuard guard;
  set_default_dtype(DType::bfloat16);
  for (Format f : kAllFormats) {
    const DType d = dtype_of(f);
    SCOPED_TRACE(std::string(name(d)));
    try {
      set_default_dtype(d);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string(name(d))), std::string::npos) << msg;  // which dtype
      EXPECT_NE(msg.find("no arithmetic"), std::string::npos) << msg;       // why
      EXPECT_NE(msg.find("range"), std::string::npos) << msg;
      EXPECT_NE(msg.find("precision"), std::string::npos) << msg;
      EXPECT_NE(msg.find("float32 or bfloat16"), std::string::npos) << msg;  // what to do instead
      EXPECT_NE(msg.find("convert"), std::string::npos) << msg;
      EXPECT_NE(msg.find("quantize"), std::string::npos) << msg;
    }
    EXPECT_EQ(default_dtype(), DType::bfloat16);  // unchanged
  }
}

TEST(DefaultDType, RefusesIntegersAndBool) {
  DefaultDTypeGuard guard;
  for (DType d : kAllDTypes) {
    if (info(d).kind != DTypeKind::kInt && info(d).kind != DTypeKind::kBool) continue;
    SCOPED_TRACE(std::string(name(d)));
    try {
      set_default_dtype(d);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("floating"), std::string::npos) << e.what();
    }
    EXPECT_EQ(default_dtype(), DType::float32);
  }
}

TEST(Device, NamesAndAvailability) {
  EXPECT_EQ(to_string(Device::cpu()), "cpu");
  EXPECT_EQ(to_string(Device::cuda()), "cuda:0");
  EXPECT_EQ(to_string(Device::cuda(3)), "cuda:3");
  EXPECT_TRUE(is_available(Device::cpu()));
  EXPECT_EQ(is_available(Device::cuda()), cuda::device_count() > 0);
  EXPECT_FALSE(is_available(Device::cuda(cuda::device_count())));
  EXPECT_FALSE(is_available(Device::cuda(-1)));
  EXPECT_EQ(Device{}, Device::cpu());
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
}

// A CUDA device this build or machine does not have (the one after the last) is Error(kUnsupported) naming it and
// why: no backend in the build, no device (the runtime's reason), or the range there is.
TEST(Device, AMissingCudaDeviceIsAClearUnsupportedError) {
  const int count = cuda::device_count();
  const Device missing = Device::cuda(count);
  const std::string why = !cuda::built() ? "no CUDA backend" : count == 0 ? "no CUDA device" : "CUDA device";
  const std::string where = to_string(missing);
  auto expect_unsupported = [&](auto&& call) { testing::expect_error(call, ErrorKind::kUnsupported, {why, where}); };
  expect_unsupported([&] { empty({4}, DType::float32, missing); });
  expect_unsupported([&] { zeros({4}, DType::float8_e4m3fn, missing); });
  expect_unsupported([&] { full({4}, 1.0, DType::bfloat16, missing); });
  expect_unsupported([&] { memory_stats(missing); });
  expect_unsupported([&] { reset_peak_memory(missing); });
  expect_unsupported([&] { check_available(missing); });
  expect_unsupported([&] { ones({2, 2}).to(missing); });
}

}  // namespace
}  // namespace fp8kit
