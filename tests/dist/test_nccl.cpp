// The NCCL communicator on one process and device (the local host communicator: one rank), which is what a machine
// with one GPU can run: the all-gather moves the bytes, the reductions give the host Communicator's bits, the byte
// counts are the host's, and wrong operands are refused. Skipped without a device, saying why; the refusal of a
// missing device (or backend, or NCCL) runs in every build. Several ranks need several GPUs (docs/cuda.md).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/dist/communicator.hpp"
#include "fp8kit/dist/nccl_communicator.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {
namespace {

using testing::expect_error;

// The device past the last one is not there in any build on any machine (no backend, no driver, or the range).
TEST(CudaNcclBuild, RefusesWhatIsNotThere) {
  auto host = local_communicator();
  const int missing = cuda::device_count();
  expect_error([&] { cuda::NcclCommunicator comm(*host, missing); }, ErrorKind::kUnsupported,
               {"'cuda:" + std::to_string(missing) + "' is not available"});
  // Loaded on first use: a version where NCCL is installed (CI's machines), else why not.
  const std::string version = cuda::NcclCommunicator::nccl_version();
  EXPECT_TRUE(std::regex_match(version, std::regex(R"(\d+\.\d+\.\d+)")) ||
              version.find("could not be loaded") != std::string::npos ||
              version.find("no CUDA backend") != std::string::npos || version.find("no NCCL") != std::string::npos)
      << version;
}

class CudaNccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  }
};

bool same_bytes(const Tensor& device, const Tensor& host) {
  const Tensor back = device.to(Device::cpu());
  return back.nbytes() == host.nbytes() &&
         std::memcmp(back.data_ptr(), host.data_ptr(), static_cast<std::size_t>(host.nbytes())) == 0;
}

TEST_F(CudaNccl, OneRankMovesTheBytesAndReducesAsTheHost) {
  auto host = local_communicator();
  cuda::NcclCommunicator comm(*host, 0);
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  const Device gpu = Device::cuda(0);
  // FP8 codes all-gathered: the bytes as they are.
  const Tensor codes = randn({1000}, 3).to(DType::float8_e4m3fn);
  Tensor gathered = empty({1000}, DType::float8_e4m3fn, gpu);
  comm.all_gather(codes.to(gpu), gathered);
  EXPECT_TRUE(same_bytes(gathered, codes));
  EXPECT_EQ(comm.stats().all_gather_bytes, 1000u);
  // Reductions: the host communicator's result, NaN included.
  Tensor values = randn({4099}, 4);
  values.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
    Tensor want = values.clone();
    host->all_reduce(want.span<float>(), op);
    Tensor got = values.to(gpu);
    comm.all_reduce(got, op);
    EXPECT_TRUE(same_bytes(got, want)) << name(op);
    Tensor scattered = empty({4099}, DType::float32, gpu);
    comm.reduce_scatter(values.to(gpu), scattered, op);
    EXPECT_TRUE(same_bytes(scattered, want)) << name(op);
  }
  EXPECT_EQ(comm.stats().all_reduce_bytes, 2u * 4099u * 4u);
  EXPECT_EQ(comm.stats().reduce_scatter_bytes, 0u);  // one rank sends nothing to others
  EXPECT_EQ(comm.stats().calls, 5u);
}

TEST_F(CudaNccl, RefusesWrongOperands) {
  auto host = local_communicator();
  cuda::NcclCommunicator comm(*host, 0);
  const Device gpu = Device::cuda(0);
  Tensor recv = empty({8}, DType::float32, gpu);
  expect_error([&] { comm.all_gather(ones({8}), recv); }, ErrorKind::kInvalidArgument, {"send is on cpu"});
  Tensor small = empty({4}, DType::float32, gpu);
  expect_error([&] { comm.all_gather(ones({8}).to(gpu), small); }, ErrorKind::kInvalidArgument,
               {"size() x send's bytes"});
  Tensor ints = zeros({8}, DType::int32, gpu);
  expect_error([&] { comm.all_reduce(ints, ReduceOp::kSum); }, ErrorKind::kInvalidArgument, {"float32"});
  expect_error([&] { comm.reduce_scatter(ones({8}).to(gpu), small, ReduceOp::kSum); }, ErrorKind::kInvalidArgument,
               {"size() x recv's"});
}

}  // namespace
}  // namespace fp8kit
