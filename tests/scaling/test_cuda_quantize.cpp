// quantize and dequantize on a CUDA device against the CPU's quantize() and dequantize(), bit for bit: every
// granularity (per tensor, row, column, 1 x 128, 128 x 128, an odd block, MX FLOOR and RCEIL), three element formats,
// both overflow policies, the scale options, float32 / bfloat16 / float16 inputs with special values in them.
// Skipped without a device, saying why; the refusals run in every build.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/scaling/cuda_quantize.hpp"
#include "fp8kit/scaling/scaled_tensor.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "scaling/cuda/dequantize.hpp"

namespace fp8kit {
namespace {

using testing::expect_error;

TEST(CudaQuantizeBuild, RefusesHostTensors) {
  const Tensor x = ones({4, 4});
  if (!cuda::built()) {
    expect_error([&] { cuda::quantize(x, {}); }, ErrorKind::kUnsupported, {"no CUDA backend"});
    return;
  }
  expect_error([&] { cuda::quantize(x, {}); }, ErrorKind::kInvalidArgument, {"x is on the CPU"});
}

class CudaQuantize : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  }
};

// rows x cols values whose magnitudes differ from row to row by up to 2^+-20 (so that per-row and per-block scales
// differ), with subnormals, zeros of both signs, NaN and Inf of both signs, and a whole row of zeros.
Tensor values(std::int64_t rows, std::int64_t cols) {
  Tensor t = randn({rows, cols}, 11);
  float* x = t.data<float>();
  for (std::int64_t r = 0; r < rows; ++r) {
    const float row_scale = std::ldexp(1.0f, static_cast<int>((r * 7) % 41) - 20);
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::int64_t i = r * cols + c;
      x[i] *= row_scale;
      if (i % 97 == 5) x[i] *= 1e-30f;  // subnormal or near it
      if (i % 101 == 3) x[i] = i % 2 ? -0.0f : 0.0f;
      if (i % 1009 == 7) x[i] = std::copysign(std::numeric_limits<float>::quiet_NaN(), i % 2 ? -1.0f : 1.0f);
      if (i % 1013 == 11) x[i] = std::copysign(std::numeric_limits<float>::infinity(), i % 2 ? -1.0f : 1.0f);
      if (r == 2) x[i] = 0.0f;
    }
  }
  return t;
}

template <typename T>
std::vector<std::uint32_t> bits_of(const T& buffer) {
  std::vector<std::uint32_t> out;
  for (const auto& v : buffer) {
    if constexpr (sizeof(v) == 4) {
      out.push_back(std::bit_cast<std::uint32_t>(v));
    } else {
      out.push_back(static_cast<std::uint32_t>(v));
    }
  }
  return out;
}

// cuda::dequantize(got, dtype) is the CPU's dequantize(want, dtype) bit for bit; so is dequantize_tiles (the kernel
// not yet run on a GPU, taken only when asked for: scaling/cuda/dequantize.hpp) where the blocks are 32 x 128 or more
// with columns in fours. Returns whether the tiles ran.
bool expect_dequantize_is_the_cpus(const cuda::QuantizedTensor& got, const ScaledTensor& want, DType dtype,
                                   const std::string& what) {
  const Tensor cpu = dequantize(want, dtype);
  const auto same = [&](const Tensor& device_result) {
    const Tensor dq = device_result.to(Device::cpu());
    return std::memcmp(dq.data_ptr(), cpu.data_ptr(), static_cast<std::size_t>(cpu.nbytes())) == 0;
  };
  EXPECT_TRUE(same(cuda::dequantize(got, dtype))) << what;
  const std::int64_t rows = want.rows, cols = want.cols;
  const std::int64_t br = want.granularity.rows_per_block(rows), bc = want.granularity.cols_per_block(cols);
  const bool several = br < rows || bc < cols;
  if (!several || br < 32 || bc < 128 || cols % 4 != 0 || bc % 4 != 0) return false;
  EXPECT_TRUE(same(cuda_detail::dequantize_with(got, dtype, cuda_detail::DequantizeKernel::kTiles)))
      << what << " (tiles)";
  return true;
}

TEST_F(CudaQuantize, EveryGranularityIsTheCpusBitForBit) {
  const std::int64_t rows = 259, cols = 515;  // no multiple of a block in either direction
  const Tensor host = values(rows, cols);
  const std::vector<Granularity> granularities = {Granularity::tensor(),
                                                  Granularity::row(),
                                                  Granularity::column(),
                                                  Granularity::block(1, 128),
                                                  Granularity::block(128, 128),
                                                  Granularity::block(3, 5),
                                                  Granularity::mx(),
                                                  Granularity::mx(MxScaleMode::kRceil)};
  ScaleOptions tuned;
  tuned.margin = 1;
  tuned.epsilon = 1e-12f;
  tuned.rounding = ScaleRounding::kPowerOfTwoDown;
  int cases = 0;
  for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
    const Tensor x = dtype == DType::float32 ? host : host.to(dtype);
    const Tensor device_x = x.to(Device::cuda(0));
    for (Format format : {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz}) {
      for (const Granularity& g : granularities) {
        for (Overflow overflow : {Overflow::kSaturate, Overflow::kNonSaturating}) {
          for (bool tune : {false, true}) {
            if (tune && g.kind == Granularity::Kind::kMx) continue;  // E8M0 scales take no options
            QuantizeOptions options;
            options.format = format;
            options.overflow = overflow;
            options.granularity = g;
            if (tune) options.scale = tuned;
            const std::string what = std::string(name(dtype)) + " " + std::string(name(format)) + " " + g.name() +
                                     (overflow == Overflow::kSaturate ? " sat" : " nonsat") + (tune ? " tuned" : "");
            const ScaledTensor want = quantize(x, options);
            const cuda::QuantizedTensor got = cuda::quantize(device_x, options);
            const ScaledTensor back = got.to_host();
            ASSERT_EQ(back.data.size(), want.data.size()) << what;
            EXPECT_TRUE(back.data == want.data) << what;
            EXPECT_EQ(bits_of(back.scale_inv), bits_of(want.scale_inv)) << what;
            EXPECT_EQ(bits_of(back.scale_e8m0), bits_of(want.scale_e8m0)) << what;
            EXPECT_EQ(got.scale_inv.shape(), (Shape{want.grid_rows(), want.grid_cols()})) << what;
            // Dequantized on the device: the CPU's values.
            std::vector<float> cpu(want.data.size());
            dequantize(want, cpu);
            const Tensor dq = cuda::dequantize(got).to(Device::cpu());
            EXPECT_EQ(bits_of(dq.span<float>()), bits_of(cpu)) << what;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 3 * 3 * (6 * 4 + 2 * 2));
}

// Many CUDA blocks meeting in one amax (atomics), a tensor larger than one grid pass of the per-tensor kernels (4096
// blocks of 256 threads, 4 vectors of four a thread: 16.7M elements), blocked kernels whose persistent grids take
// many steps (128 x 128 over 1089 blocks and MX over 270k, each more than the GPU holds at once), and the
// dequantize to bfloat16 (the float32 value rounded once), float32 and float16, through dequantize_tiles where the
// blocks are 32 x 128 or more (128 x 128 here with partial blocks at both edges, and 32 x 128 over 2112 blocks).
TEST_F(CudaQuantize, LargeTensorsAndBfloat16Dequantize) {
  const Tensor odd = randn({4200, 4100}, 3), even = randn({2112, 4096}, 5);
  int tiles = 0;
  for (const auto& [x, g] : std::vector<std::pair<const Tensor*, Granularity>>{{&odd, Granularity::tensor()},
                                                                               {&odd, Granularity::block(1, 128)},
                                                                               {&odd, Granularity::block(128, 128)},
                                                                               {&even, Granularity::mx()},
                                                                               {&even, Granularity::block(1, 16)},
                                                                               {&even, Granularity::block(32, 128)}}) {
    QuantizeOptions options;
    options.granularity = g;
    const ScaledTensor want = quantize(*x, options);
    const cuda::QuantizedTensor got = cuda::quantize(x->to(Device::cuda(0)), options);
    const ScaledTensor back = got.to_host();
    EXPECT_TRUE(back.data == want.data) << g.name();
    EXPECT_EQ(bits_of(back.scale_inv), bits_of(want.scale_inv)) << g.name();
    // Every output dtype (and dequantize_tiles for the blocks of 32 x 128 and more, over a thousand of them).
    for (DType out : {DType::bfloat16, DType::float32, DType::float16}) {
      tiles += expect_dequantize_is_the_cpus(got, want, out, g.name() + " " + std::string(name(out))) ? 1 : 0;
    }
  }
  EXPECT_EQ(tiles, 2 * 3);
}

// float32 rows whose blocks are 1 x bc with bc a multiple of 4 dividing the row (rows of 4096; 1 x 8 to 1 x 512,
// MX) take the vector kernels (four elements a load; up to 512, a few lanes a block, several blocks a warp): the
// CPU's bits there too, special values included.
TEST_F(CudaQuantize, AlignedRowBlocksTakeTheVectorKernel) {
  const Tensor host = values(96, 4096);
  const Tensor device_x = host.to(Device::cuda(0));
  int cases = 0;
  for (Format format : {Format::e4m3fn, Format::e5m2, Format::e4m3fnuz}) {
    for (const Granularity& g :
         {Granularity::row(), Granularity::block(1, 128), Granularity::mx(), Granularity::mx(MxScaleMode::kRceil),
          Granularity::block(1, 8), Granularity::block(1, 256), Granularity::block(1, 512)}) {
      for (Overflow overflow : {Overflow::kSaturate, Overflow::kNonSaturating}) {
        QuantizeOptions options;
        options.format = format;
        options.overflow = overflow;
        options.granularity = g;
        const std::string what = std::string(name(format)) + " " + g.name();
        const ScaledTensor want = quantize(host, options);
        const ScaledTensor back = cuda::quantize(device_x, options).to_host();
        EXPECT_TRUE(back.data == want.data) << what;
        EXPECT_EQ(bits_of(back.scale_inv), bits_of(want.scale_inv)) << what;
        EXPECT_EQ(bits_of(back.scale_e8m0), bits_of(want.scale_e8m0)) << what;
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 42);
}

// The four-element vector kernels at their edges: short row blocks (up to four quads a lane, up to 32 lanes a block,
// several blocks a warp) with block counts that fill no warp evenly, the kernels holding a block in registers (a
// warp a block up to 1024 elements, a CUDA block of 256 threads up to 4096, one of 1024 threads up to 16384: 128 x
// 128, 3 x 2048) and the two-pass tile kernel beyond (256 x 128), with partial
// blocks on the right and at the bottom, for every input dtype, and their dequantize; the element-wise kernels take
// the shapes these do not (odd columns), as EveryGranularityIsTheCpusBitForBit checks. The dequantize of blocks of
// 32 rows and 128 columns or more (128 x 128, 256 x 128, 32 x 256) fills a table per block (dequantize_tiles).
TEST_F(CudaQuantize, VectorKernelsAtTheEdgesAreTheCpusBitForBit) {
  int cases = 0, tiles = 0;
  for (const auto& [rows, cols] :
       std::vector<std::pair<std::int64_t, std::int64_t>>{{37, 128}, {300, 260}, {129, 1028}, {19, 1536}}) {
    const Tensor host = values(rows, cols);
    for (DType dtype : {DType::float32, DType::bfloat16, DType::float16}) {
      const Tensor x = dtype == DType::float32 ? host : host.to(dtype);
      const Tensor device_x = x.to(Device::cuda(0));
      for (const Granularity& g :
           {Granularity::block(1, 4), Granularity::block(1, 16), Granularity::block(1, 32), Granularity::block(1, 64),
            Granularity::block(1, 128), Granularity::mx(), Granularity::block(128, 128), Granularity::block(2, 512),
            Granularity::block(64, 16), Granularity::block(32, 32), Granularity::row(), Granularity::block(4, 1024),
            Granularity::block(256, 128), Granularity::block(1, 256), Granularity::block(1, 512),
            Granularity::block(1, 8), Granularity::block(3, 2048), Granularity::block(32, 256)}) {
        for (Format format : {Format::e4m3fn, Format::e5m2fnuz}) {
          QuantizeOptions options;
          options.format = format;
          options.granularity = g;
          const std::string what = std::string(name(dtype)) + " " + std::string(name(format)) + " " + g.name() + " " +
                                   std::to_string(rows) + "x" + std::to_string(cols);
          const ScaledTensor want = quantize(x, options);
          const cuda::QuantizedTensor got = cuda::quantize(device_x, options);
          const ScaledTensor back = got.to_host();
          EXPECT_TRUE(back.data == want.data) << what;
          EXPECT_EQ(bits_of(back.scale_inv), bits_of(want.scale_inv)) << what;
          EXPECT_EQ(bits_of(back.scale_e8m0), bits_of(want.scale_e8m0)) << what;
          // And back to the input's dtype on the device (four codes a thread where the blocks' columns come in
          // fours): the CPU's values.
          tiles += expect_dequantize_is_the_cpus(got, want, dtype, what) ? 1 : 0;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 3 * 18 * 2);
  // 128 x 128, 256 x 128 and 32 x 256 where a matrix holds more than one block (37 x 128: 32 x 256 alone)
  EXPECT_EQ(tiles, 3 * 2 * (1 + 3 + 3 + 3));
}

TEST_F(CudaQuantize, RefusesWhatItCannotQuantize) {
  const Tensor ints = zeros({4, 4}, DType::int32, Device::cuda(0));
  expect_error([&] { cuda::quantize(ints, {}); }, ErrorKind::kInvalidArgument, {"int32", "float32, bfloat16"});
  QuantizeOptions bad;
  bad.granularity = Granularity::block(0, 4);
  expect_error(
      [&] {
        cuda::quantize(ones({4, 4}).to(Device::cuda(0)), bad);
      },
      ErrorKind::kInvalidArgument, {"block shape must be positive"});
  const cuda::QuantizedTensor q = cuda::quantize(ones({4, 4}).to(Device::cuda(0)), {});
  expect_error([&] { cuda::dequantize(q, DType::int8); }, ErrorKind::kInvalidArgument, {"int8 is not a float dtype"});
  // dequantize_tiles, asked for, names what a shape of smaller blocks lacks.
  QuantizeOptions rows_of_128;
  rows_of_128.granularity = Granularity::block(1, 128);
  const cuda::QuantizedTensor thin = cuda::quantize(ones({64, 256}).to(Device::cuda(0)), rows_of_128);
  expect_error([&] { cuda_detail::dequantize_with(thin, DType::float32, cuda_detail::DequantizeKernel::kTiles); },
               ErrorKind::kUnsupported, {"block:1x128 on 64 x 256", "at least 32 x 128"});
  const cuda::QuantizedTensor empty = cuda::quantize(zeros({0, 8}).to(Device::cuda(0)), {});
  EXPECT_EQ(empty.codes.shape(), (Shape{0, 8}));
  EXPECT_EQ(cuda::dequantize(empty).shape(), (Shape{0, 8}));
}

}  // namespace
}  // namespace fp8kit
