// The NCCL communicator (a build with the CUDA backend): the collectives of communicator.hpp on device tensors, one
// rank per process and device, NCCL moving the bytes. Reductions stay fp8kit's own: every rank's part goes to its
// owner (grouped ncclSend / ncclRecv), which sums them in FP32 in rank order (max exact, NaN wins) on the device:
// the same bits as the host Communicator's reduce_scatter and all_reduce, for any rank count. NCCL is loaded on first
// use (libnccl.so.2, dlopen); without it, the backend or the device, construction throws Error(kUnsupported).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "fp8kit/dist/communicator.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit::cuda {

namespace detail {
struct NcclState;
}

class NcclCommunicator {
 public:
  // A collective over `host`'s ranks (MPI, or the local communicator of one process): rank 0's NCCL id reaches every
  // rank through host.broadcast; each rank passes the CUDA device it works on.
  NcclCommunicator(Communicator& host, int device);
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int device() const noexcept { return device_; }

  // recv = every rank's `send` in rank order (any dtype, FP8 codes included: bytes): recv holds size() x send's
  // bytes. Counts send's bytes.
  void all_gather(const Tensor& send, Tensor& recv);
  // recv = this rank's part of the reduction over ranks of `send` (float32; size() equal parts of recv's numel, part r
  // to rank r). Counts the bytes of the parts sent to other ranks.
  void reduce_scatter(const Tensor& send, Tensor& recv, ReduceOp op);
  // Element-wise over ranks, in place (float32): a reduce-scatter of even_split parts, then an all-gather of them.
  void all_reduce(Tensor& data, ReduceOp op);

  const CommStats& stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = {}; }

  // The NCCL this process loaded (e.g. "2.28.3"), or why it could not be loaded.
  static std::string nccl_version();

 private:
  // The parts (counts floats each, in rank order) of `send` exchanged and reduced into recv (counts[rank()] floats).
  void reduce_parts(const float* send, const std::vector<std::size_t>& counts, float* recv, ReduceOp op);
  // recv's part r (counts[r] bytes at offset sum(counts[0..r))) from rank r; this rank's from `send`.
  void gather_parts(const void* send, const std::vector<std::size_t>& counts, void* recv);

  std::unique_ptr<detail::NcclState> state_;
  int rank_ = 0, size_ = 1, device_ = 0;
  CommStats stats_;
};

}  // namespace fp8kit::cuda
