// CUDA streams and events: fp8kit's work under a StreamGuard goes to that stream and gives the same bits as on the
// legacy default stream; events order two streams; a stream lives as long as a tensor allocated on it; guards nest.
// Skipped without a device, saying why; the refusals of a missing device run in every build.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "common/same_bits.hpp"
#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/scaling/cuda_quantize.hpp"
#include "fp8kit/scaling/scaled_tensor.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "fp8kit/tensor/cuda_stream.hpp"
#include "fp8kit/tensor/memory.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {
namespace {

using testing::expect_error;

// The device past the last one is not there in any build on any machine (no backend, no driver, or the range).
TEST(CudaStreamBuild, RefusesADeviceThatIsNotThere) {
  const int missing = cuda::device_count();
  const std::string why = "'cuda:" + std::to_string(missing) + "' is not available";
  expect_error([&] { cuda::Stream s(missing); }, ErrorKind::kUnsupported, {why});
  expect_error([&] { cuda::current_stream(missing); }, ErrorKind::kUnsupported, {why});
  expect_error([&] { cuda::Event e(missing); }, ErrorKind::kUnsupported, {why});
}

class CudaStream : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  }
};

TEST_F(CudaStream, GuardsNestAndRestore) {
  EXPECT_TRUE(cuda::current_stream(0).is_legacy());
  const cuda::Stream a(0), b(0);
  EXPECT_FALSE(a.is_legacy());
  EXPECT_FALSE(a == b);
  {
    const cuda::StreamGuard ga(a);
    EXPECT_TRUE(cuda::current_stream(0) == a);
    {
      const cuda::StreamGuard gb(b);
      EXPECT_TRUE(cuda::current_stream(0) == b);
    }
    EXPECT_TRUE(cuda::current_stream(0) == a);
  }
  EXPECT_TRUE(cuda::current_stream(0).is_legacy());
  EXPECT_TRUE(cuda::Stream::legacy(0) == cuda::current_stream(0));
}

// Copies, casts and quantization queued on a stream of their own give the legacy stream's bits.
TEST_F(CudaStream, WorkOnAStreamGivesTheSameBits) {
  const Tensor host = randn({517, 1031}, 5);
  QuantizeOptions options;
  options.granularity = Granularity::block(1, 128);
  const Tensor on_legacy = host.to(Device::cuda(0));
  const cuda::QuantizedTensor q_legacy = cuda::quantize(on_legacy, options);
  const Tensor cast_legacy = on_legacy.to(DType::float8_e5m2);
  const Tensor dq_legacy = cuda::dequantize(q_legacy);
  cuda::synchronize(0);  // the legacy stream's work is done before a non-blocking stream reads its results
  const cuda::Stream s(0);
  const cuda::StreamGuard guard(s);
  const Tensor on_stream = host.to(Device::cuda(0));
  const cuda::QuantizedTensor q_stream = cuda::quantize(on_stream, options);
  const Tensor cast_stream = on_stream.to(DType::float8_e5m2);
  EXPECT_TRUE(testing::same_bits(on_stream, on_legacy));
  EXPECT_TRUE(testing::same_bits(q_stream.codes, q_legacy.codes));
  EXPECT_TRUE(testing::same_bits(q_stream.scale_inv, q_legacy.scale_inv));
  EXPECT_TRUE(testing::same_bits(cast_stream, cast_legacy));
  EXPECT_TRUE(testing::same_bits(cuda::dequantize(q_stream), dq_legacy));
}

// A producer on one stream and a consumer on another, ordered by an event (and nothing else: both non-blocking).
TEST_F(CudaStream, AnEventOrdersTwoStreams) {
  const cuda::Stream producer(0), consumer(0);
  const Tensor host = randn({2048, 2048}, 9);
  const ScaledTensor want = quantize(host, QuantizeOptions{});
  for (int round = 0; round < 3; ++round) {
    cuda::QuantizedTensor q;
    cuda::Event ready(0, true), start(0, true);
    {
      const cuda::StreamGuard g(producer);
      start.record();
      const Tensor x = host.to(Device::cuda(0));
      q = cuda::quantize(x, QuantizeOptions{});
      ready.record();
    }
    ready.wait(consumer);
    Tensor back;
    {
      const cuda::StreamGuard g(consumer);
      back = q.codes.to(Device::cpu());  // on the consumer: after the event, and the host waits for it
    }
    EXPECT_EQ(std::memcmp(back.data_ptr(), want.data.data(), want.data.size()), 0) << "round " << round;
    ready.synchronize();
    EXPECT_TRUE(ready.done());
    EXPECT_GE(ready.seconds_since(start), 0.0);
    producer.synchronize();
    EXPECT_TRUE(producer.done());
  }
}

// A tensor allocated on a stream outlives the Stream object: the stream stays until the tensor is freed, and the
// device's counters come back to where they were.
TEST_F(CudaStream, AStreamLivesAsLongAsItsTensors) {
  const std::int64_t before = memory_stats(Device::cuda(0)).current_bytes;
  Tensor kept;
  {
    const cuda::Stream s(0);
    const cuda::StreamGuard g(s);
    kept = full({1 << 20}, 1.5f).to(Device::cuda(0));
  }
  EXPECT_GT(memory_stats(Device::cuda(0)).current_bytes, before);
  const Tensor back = kept.to(Device::cpu());
  EXPECT_EQ(back.item_as_double(12345), 1.5);
  kept = Tensor();
  cuda::synchronize(0);
  EXPECT_EQ(memory_stats(Device::cuda(0)).current_bytes, before);
}

}  // namespace
}  // namespace fp8kit
