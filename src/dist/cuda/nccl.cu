// The NCCL communicator (dist/nccl_communicator.hpp): NCCL loaded with dlopen on first use (as cuBLASLt is: linking
// it would make every CUDA build's program need it to start), its id shared through the host communicator, the
// bytes moved by grouped ncclSend / ncclRecv on the current stream, and the reduction of the parts in rank order by a
// kernel whose combine is the host Communicator's (src/dist/communicator.cpp).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "common/cuda/kernel_util.cuh"
#include "common/cuda/shared_library.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/dist/nccl_communicator.hpp"

namespace fp8kit {
namespace {

using namespace cuda_detail;

struct Nccl {
  decltype(&ncclGetVersion) get_version;
  decltype(&ncclGetUniqueId) get_unique_id;
  decltype(&ncclCommInitRank) init_rank;
  decltype(&ncclCommDestroy) destroy;
  decltype(&ncclSend) send;
  decltype(&ncclRecv) recv;
  decltype(&ncclGroupStart) group_start;
  decltype(&ncclGroupEnd) group_end;
  decltype(&ncclGetErrorString) error_string;
  std::string version;
};

const Nccl& nccl() {
  static std::mutex mutex;
  static std::unique_ptr<Nccl> loaded;
  const std::lock_guard lock(mutex);
  if (loaded) return *loaded;
  static const SharedLibrary library(
      {"libnccl.so." + std::to_string(NCCL_MAJOR), "libnccl.so"}, "NCCL",
      "install NCCL (Debian libnccl2, PyPI nvidia-nccl-cu13) or add its lib folder to LD_LIBRARY_PATH",
      "install NCCL " + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + " or newer");
  auto n = std::make_unique<Nccl>();
  library.bind("ncclGetVersion", n->get_version);
  library.bind("ncclGetUniqueId", n->get_unique_id);
  library.bind("ncclCommInitRank", n->init_rank);
  library.bind("ncclCommDestroy", n->destroy);
  library.bind("ncclSend", n->send);
  library.bind("ncclRecv", n->recv);
  library.bind("ncclGroupStart", n->group_start);
  library.bind("ncclGroupEnd", n->group_end);
  library.bind("ncclGetErrorString", n->error_string);
  int v = 0;
  n->get_version(&v);  // NCCL_VERSION_CODE: major * 10000 + minor * 100 + patch since 2.9
  n->version = dotted_version(v);
  loaded = std::move(n);
  return *loaded;
}

void check_nccl(ncclResult_t status, const std::string& what) {
  if (status == ncclSuccess) return;
  FP8KIT_THROW(ErrorKind::kUnsupported, "NCCL: ", what, ": ", nccl().error_string(status), " (ncclResult ",
               static_cast<int>(status), ")");
}

// out[i] = parts[0][i] combined with parts[1][i], ... in rank order: the host Communicator's combine (FP32 sums;
// max with the first NaN in rank order winning, else std::max's choice).
__global__ void reduce_parts_kernel(const float* parts, int ranks, std::int64_t count, bool sum, float* out) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float acc = parts[i];
    for (int r = 1; r < ranks; ++r) {
      const float b = parts[static_cast<std::int64_t>(r) * count + i];
      if (sum) {
        acc = __fadd_rn(acc, b);
      } else if (isnan(acc) || isnan(b)) {
        acc = isnan(acc) ? acc : b;
      } else {
        acc = acc < b ? b : acc;
      }
    }
    out[i] = acc;
  }
}

std::string where(const char* collective, int rank, int size) {
  return std::string("cuda::NcclCommunicator::") + collective + " on rank " + std::to_string(rank) + " of " +
         std::to_string(size);
}

}  // namespace

namespace cuda {
namespace detail {
struct NcclState {
  ncclComm_t comm = nullptr;
};
}  // namespace detail

std::string NcclCommunicator::nccl_version() {
  try {
    return nccl().version;
  } catch (const Error& e) {
    return e.what();
  }
}

NcclCommunicator::NcclCommunicator(Communicator& host, int device)
    : state_(std::make_unique<detail::NcclState>()), rank_(host.rank()), size_(host.size()), device_(device) {
  check_available(Device::cuda(device));
  use_device(device);
  // Every rank loads NCCL and agrees it did before any of them waits in the broadcast for rank 0's id.
  agree_on_error(host, [] { nccl(); });
  ncclUniqueId id{};
  if (rank_ == 0) check_nccl(nccl().get_unique_id(&id), "ncclGetUniqueId");
  host.broadcast(std::as_writable_bytes(std::span(&id, 1)), 0);
  check_nccl(nccl().init_rank(&state_->comm, size_, id, rank_), where("NcclCommunicator", rank_, size_));
}

NcclCommunicator::~NcclCommunicator() {
  if (state_ && state_->comm != nullptr) nccl().destroy(state_->comm);
}

void NcclCommunicator::gather_parts(const void* send, const std::vector<std::size_t>& counts, void* recv) {
  const cudaStream_t stream = stream_of(device_);
  const auto* in = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  const auto me = static_cast<std::size_t>(rank_);
  const Nccl& n = nccl();
  check_nccl(n.group_start(), "ncclGroupStart");
  std::size_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    const std::size_t bytes = counts[static_cast<std::size_t>(r)];
    if (r == rank_) {
      if (bytes != 0 && out + offset != in) {
        const cudaError_t copied = cudaMemcpyAsync(out + offset, in, bytes, cudaMemcpyDeviceToDevice, stream);
        FP8KIT_CHECK_KIND(copied == cudaSuccess, ErrorKind::kUnsupported,
                          "CUDA: cudaMemcpyAsync: ", cudaGetErrorString(copied));
      }
    } else {
      if (counts[me] != 0) check_nccl(n.send(in, counts[me], ncclUint8, r, state_->comm, stream), "ncclSend");
      if (bytes != 0) check_nccl(n.recv(out + offset, bytes, ncclUint8, r, state_->comm, stream), "ncclRecv");
    }
    offset += bytes;
  }
  check_nccl(n.group_end(), "ncclGroupEnd");
}

void NcclCommunicator::reduce_parts(const float* send, const std::vector<std::size_t>& counts, float* recv,
                                    ReduceOp op) {
  const cudaStream_t stream = stream_of(device_);
  const auto me = static_cast<std::size_t>(rank_);
  const std::size_t mine = counts[me];
  // Every rank's part for this rank, in rank order, then reduced in that order.
  const Tensor staging = empty({static_cast<std::int64_t>(mine) * size_}, DType::float32, Device::cuda(device_));
  auto* parts = static_cast<float*>(staging.data_ptr());
  const Nccl& n = nccl();
  check_nccl(n.group_start(), "ncclGroupStart");
  std::size_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    const std::size_t count = counts[static_cast<std::size_t>(r)];
    float* slot = parts + static_cast<std::size_t>(r) * mine;
    if (r == rank_) {
      if (mine != 0) {
        const cudaError_t copied =
            cudaMemcpyAsync(slot, send + offset, mine * sizeof(float), cudaMemcpyDeviceToDevice, stream);
        FP8KIT_CHECK_KIND(copied == cudaSuccess, ErrorKind::kUnsupported,
                          "CUDA: cudaMemcpyAsync: ", cudaGetErrorString(copied));
      }
    } else {
      if (count != 0) check_nccl(n.send(send + offset, count, ncclFloat32, r, state_->comm, stream), "ncclSend");
      if (mine != 0) check_nccl(n.recv(slot, mine, ncclFloat32, r, state_->comm, stream), "ncclRecv");
    }
    offset += count;
  }
  check_nccl(n.group_end(), "ncclGroupEnd");
  if (mine == 0) return;
  reduce_parts_kernel<<<blocks_for(static_cast<std::int64_t>(mine)), kThreads, 0, stream>>>(
      parts, size_, static_cast<std::int64_t>(mine), op == ReduceOp::kSum, recv);
  check_launch("the reduction of the parts", device_);
}

namespace {
void check_operand(const Tensor& t, const char* name, int device, const std::string& where) {
  FP8KIT_CHECK(t.device() == Device::cuda(device), where, ": ", name, " is on ", to_string(t.device()),
               ": this rank's tensors live on cuda:", device);
}
}  // namespace

void NcclCommunicator::all_gather(const Tensor& send, Tensor& recv) {
  const std::string at = where("all_gather", rank_, size_);
  check_operand(send, "send", device_, at);
  check_operand(recv, "recv", device_, at);
  FP8KIT_CHECK(recv.nbytes() == send.nbytes() * size_, at, ": recv holds ", recv.nbytes(), " bytes for ", size_,
               " ranks' ", send.nbytes(), " (it must hold size() x send's bytes)");
  use_device(device_);
  ++stats_.calls;
  stats_.all_gather_bytes += static_cast<std::uint64_t>(send.nbytes());
  gather_parts(send.data_ptr(),
               std::vector<std::size_t>(static_cast<std::size_t>(size_), static_cast<std::size_t>(send.nbytes())),
               recv.data_ptr());
}

void NcclCommunicator::reduce_scatter(const Tensor& send, Tensor& recv, ReduceOp op) {
  const std::string at = where("reduce_scatter", rank_, size_);
  check_operand(send, "send", device_, at);
  check_operand(recv, "recv", device_, at);
  FP8KIT_CHECK(send.dtype() == DType::float32 && recv.dtype() == DType::float32, at,
               ": reductions take float32 tensors, got ", name(send.dtype()), " and ", name(recv.dtype()));
  FP8KIT_CHECK(send.numel() == recv.numel() * size_, at, ": send holds ", send.numel(), " floats for ", size_,
               " parts of ", recv.numel(), " (it must hold size() x recv's)");
  use_device(device_);
  const std::vector<std::size_t> counts(static_cast<std::size_t>(size_), static_cast<std::size_t>(recv.numel()));
  ++stats_.calls;
  stats_.reduce_scatter_bytes += static_cast<std::uint64_t>(send.numel() - recv.numel()) * sizeof(float);
  reduce_parts(static_cast<const float*>(send.data_ptr()), counts, static_cast<float*>(recv.data_ptr()), op);
}

void NcclCommunicator::all_reduce(Tensor& data, ReduceOp op) {
  const std::string at = where("all_reduce", rank_, size_);
  check_operand(data, "data", device_, at);
  FP8KIT_CHECK(data.dtype() == DType::float32, at, ": reductions take float32 tensors, got ", name(data.dtype()));
  use_device(device_);
  const auto n = static_cast<std::size_t>(data.numel());
  std::vector<std::size_t> counts(static_cast<std::size_t>(size_)), bytes(counts.size());
  for (int r = 0; r < size_; ++r) {
    counts[static_cast<std::size_t>(r)] = even_part(n, r, size_);
    bytes[static_cast<std::size_t>(r)] = counts[static_cast<std::size_t>(r)] * sizeof(float);
  }
  const std::size_t mine = counts[static_cast<std::size_t>(rank_)];
  const Tensor part = empty({static_cast<std::int64_t>(mine)}, DType::float32, Device::cuda(device_));
  auto* values = static_cast<float*>(data.data_ptr());
  reduce_parts(values, counts, static_cast<float*>(part.data_ptr()), op);
  gather_parts(part.data_ptr(), bytes, values);
  // As the host Communicator counts it: the parts sent to other ranks, then this rank's part to every other rank.
  ++stats_.calls;
  stats_.all_reduce_bytes +=
      static_cast<std::uint64_t>(n - mine) * sizeof(float) + static_cast<std::uint64_t>(mine) * sizeof(float);
}

}  // namespace cuda
}  // namespace fp8kit
