// Communicator: the ranks of a job and the collectives fp8kit runs over them (barrier, all-gather, broadcast, and
// reductions that are fp8kit's own: contributions exchanged as bytes, summed in FP32 in rank order, so every rank
// gets the same bits). Backends: local (one process) and MPI (OpenMPI); NCCL joins with the CUDA backend.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "fp8kit/common/error.hpp"
#include "fp8kit/common/even_split.hpp"
#include "fp8kit/common/profiler.hpp"

namespace fp8kit {

// The size of part `index` of `count` of n elements (even_split's): how all_reduce splits its data.
inline std::size_t even_part(std::size_t n, int index, int count) {
  const auto [begin, end] = even_split(static_cast<std::int64_t>(n), index, count);
  return static_cast<std::size_t>(end - begin);
}

enum class ReduceOp : std::uint8_t { kSum, kMax };

// The most bytes one collective moves (all of an all-gather's result, a broadcast, every part of a reduce-scatter):
// what one MPI call's int counts reach. Checked from sizes every rank passes alike, so all ranks refuse together.
inline constexpr std::size_t kMaxCollectiveBytes = 2147483647;
std::string_view name(ReduceOp op);  // "sum", "max"

// Bytes this rank handed to the backend, by collective, since construction or reset_stats().
struct CommStats {
  std::uint64_t all_gather_bytes = 0;
  std::uint64_t reduce_scatter_bytes = 0;
  std::uint64_t all_reduce_bytes = 0;
  std::uint64_t broadcast_bytes = 0;
  std::uint64_t all_to_all_bytes = 0;
  std::uint64_t calls = 0;
  std::uint64_t total_bytes() const {
    return all_gather_bytes + reduce_scatter_bytes + all_reduce_bytes + broadcast_bytes + all_to_all_bytes;
  }
};

// One job's ranks. Not copyable; the MPI backend finalizes MPI when the last communicator it made goes away (RAII).
// Every collective is called by every rank in the same order, with the same sizes (counts, element counts, root
// and op alike on every rank). Errors (sizes that do not fit, a backend failure) throw fp8kit::Error naming the
// collective and this rank. A rank that breaks the contract (all_reduce of 100 floats on one rank and 50 on
// another) leaves the backend waiting or reading garbage, as MPI and NCCL do; with call checks on
// (FP8KIT_DIST_CHECK=1 in the environment when the communicator is made, or check_calls(true)), every collective
// first compares every rank's call (which collective, its op or root, its sizes, whether this rank's own argument
// checks passed) through one all-gather of 32 bytes per rank, and all ranks throw together naming what each
// rank called: the debugging mode of PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL, at one small collective more per
// collective (not counted in stats()).
class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "local", "mpi"
  virtual void barrier() = 0;
  // Ends the whole job now with `status` (MPI_Abort: the launcher kills every rank, also those waiting inside a
  // collective for this one). What a rank that cannot go on calls, so that no other rank is left hanging.
  [[noreturn]] virtual void abort(int status) = 0;

  // recv = every rank's `send`, concatenated in rank order; counts[r] is rank r's byte count (counts.size() ==
  // size(), counts[rank()] == send.size(), their sum == recv.size()). Counts `send.size()` bytes.
  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv, std::span<const std::size_t> counts);
  // `data` of rank `root` to every rank (the same size on every rank). Counts data.size() bytes on the root.
  void broadcast(std::span<std::byte> data, int root);
  // Element-wise over ranks, in place; sums in FP32 in rank order (the same bits on every rank and for every
  // backend), max exact (NaN wins). A reduce-scatter then an all-gather of even_split parts: counts what both hand to
  // the backend, data.size() x 4 bytes (the other ranks' parts, then its own).
  void all_reduce(std::span<float> data, ReduceOp op);
  // recv = the reduction over ranks of this rank's part of `send`: send holds size() parts, part r of counts[r]
  // floats (counts.size() == size(), their sum == send.size(), counts[rank()] == recv.size()). Counts the bytes of
  // the parts sent to other ranks.
  void reduce_scatter(std::span<const float> send, std::span<float> recv, std::span<const std::size_t> counts,
                      ReduceOp op);

  // Part r of `send` (send_counts[r] bytes, parts in rank order) to rank r; recv = every rank's part for this rank,
  // in rank order (recv_counts[r] bytes from rank r). Counts the bytes sent to other ranks.
  void all_to_all(std::span<const std::byte> send, std::span<const std::size_t> send_counts, std::span<std::byte> recv,
                  std::span<const std::size_t> recv_counts);

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }
  // Call checks (above): on or off for every rank alike (a rank that checks waits in the check's all-gather).
  void check_calls(bool on) { check_calls_ = on; }
  bool checking_calls() const { return check_calls_; }
  // Where collectives record their events (CommEvent; null: nowhere). The profiler must outlive its use.
  void set_profiler(Profiler* profiler) { profiler_ = profiler; }
  Profiler* profiler() const { return profiler_; }
  // For a collective built from others (an FP8 reduction: an amax all-reduce, an all-to-all, an all-gather): what was
  // counted since `before` becomes one call of the counter `into`.
  void count_as(const CommStats& before, std::uint64_t CommStats::*into);
  // The argument checks of a collective made of several (the FP8 layer's), which run before its first one: with
  // call checks on, agreed (agree_on_error, not counted in stats()), so that a refusal on some ranks is every rank's
  // error instead of the others waiting in that first collective; without, `checks` as it is.
  void check_arguments(const std::function<void()>& checks);

 protected:
  Communicator();  // reads FP8KIT_DIST_CHECK (unset, 0 or 1)
  // The backend's primitives, called with checked sizes. all_gather_bytes: as all_gather. all_to_all_bytes: the
  // bytes send[send_offsets[r], + send_counts[r]) go to rank r, which receives them at recv_offsets[rank()] (every
  // rank passes its own view of the exchange).
  virtual void all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                                std::span<const std::size_t> counts) = 0;
  virtual void all_to_all_bytes(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                                std::span<std::byte> recv, std::span<const std::size_t> recv_counts) = 0;
  virtual void broadcast_bytes(std::span<std::byte> data, int root) = 0;
  // "all_gather on rank 1 of 3: ...": the prefix of every error a collective throws.
  std::string where(std::string_view collective) const;

 private:
  // Runs this rank's argument checks (`local`, which throws fp8kit::Error), then, with call checks on, agrees with
  // every rank on the call (see above); throws on every rank alike when any rank's call differs or was refused.
  void begin_collective(std::string_view collective, std::uint64_t arg, std::uint64_t size,
                        std::span<const std::size_t> counts, std::span<const std::size_t> recv_counts,
                        const std::function<void()>& local);
  CommStats stats_;
  Profiler* profiler_ = nullptr;
  bool check_calls_ = false;
};

// One collective as a profiler event on the communicator's profiler (when it has one): name "comm.<collective>",
// category "comm", args "bytes" (what this rank handed to the backend within it, as CommStats counts), "ranks",
// and "payload" when given. Collectives built from others (an FP8 reduction's amax all-reduce and exchange) nest.
class CommEvent {
 public:
  CommEvent(Communicator& comm, std::string_view collective, std::string payload = {});
  ~CommEvent();
  CommEvent(const CommEvent&) = delete;
  CommEvent& operator=(const CommEvent&) = delete;

 private:
  Communicator& comm_;
  std::uint64_t before_;
  std::optional<ScopedEvent> event_;
};

// What every rank throws together when a step failed on some rank (agree_on_error): the lowest failing rank's
// error, its kind kept, the message prefixed "rank r: " when r is not 0.
class AgreedError : public Error {
 public:
  AgreedError(ErrorKind kind, std::string message, int failed_rank)
      : Error(kind, std::move(message), __FILE__, __LINE__), rank(failed_rank) {}
  int rank;
};

// Runs `step` on every rank and agrees on how it ended: when it throws on any rank (an fp8kit::Error keeps its kind;
// anything else is kInternal), every rank throws AgreedError with the lowest failing rank's message, so that no rank
// goes on alone into a collective the failed one never reaches. A collective: every rank calls it with its own step
// (reading a file each rank sees on its own, say), and `step` must run no collective itself.
void agree_on_error(Communicator& comm, const std::function<void()>& step);

// A job of one rank: every collective is a copy (or nothing). What fp8kit uses without mpirun.
std::unique_ptr<Communicator> local_communicator();
// Whether this build has the MPI backend (found at configure time: FP8KIT_MPI=AUTO|ON|OFF).
bool mpi_available();
// Whether this process was started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE, PMI_SIZE, ...).
bool launched_by_mpi();
// This process's rank as the launcher set it (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK), before and without MPI;
// 0 when not launched by MPI.
int launcher_rank();
// MPI_COMM_WORLD (MPI initialized on first use, with thread support for OpenMP regions that call no MPI, and
// finalized when the last MPI communicator is destroyed). Throws Error(kUnsupported) in a build without MPI.
std::unique_ptr<Communicator> mpi_communicator();
// The MPI communicator when launched by MPI, else the local one.
std::unique_ptr<Communicator> world_communicator();

}  // namespace fp8kit
