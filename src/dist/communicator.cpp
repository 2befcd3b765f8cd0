// The collectives every backend shares: size checks, byte counts, and the reductions (contributions exchanged as
// bytes through the backend's all-to-all and all-gather, then reduced here in FP32 in rank order); and the local
// backend of a one-rank job.
#include "fp8kit/dist/communicator.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <numeric>
#include <vector>

#include "common/fingerprint.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/dist/nccl_communicator.hpp"
#include "fp8kit/tensor/cuda.hpp"

namespace fp8kit {

std::string_view name(ReduceOp op) {
  return op == ReduceOp::kSum ? "sum" : "max";
}

Communicator::Communicator() {
  const char* v = std::getenv("FP8KIT_DIST_CHECK");
  const std::string_view text = v == nullptr ? "" : v;
  FP8KIT_CHECK(text.empty() || text == "0" || text == "1", "FP8KIT_DIST_CHECK='", text,
               "' is not 0 or 1 (1: every collective first checks that all ranks make the same call)");
  check_calls_ = text == "1";
}

std::string Communicator::where(std::string_view collective) const {
  return std::string(collective) + " on rank " + std::to_string(rank()) + " of " + std::to_string(size());
}

namespace {

std::size_t sum_of(std::span<const std::size_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0});
}

// `where` builds the message prefix only when a check fails (these run on every collective).
template <typename Where>
void check_counts(const Communicator& c, std::string_view what, const Where& where, std::span<const std::size_t> counts,
                  std::size_t total, std::size_t own) {
  FP8KIT_CHECK(static_cast<int>(counts.size()) == c.size(), where(), ": ", counts.size(), " counts for ", c.size(),
               " ranks (give one per rank)");
  FP8KIT_CHECK(sum_of(counts) == total, where(), ": the counts add up to ", sum_of(counts), " ", what,
               ", the buffer holds ", total);
  FP8KIT_CHECK(counts[static_cast<std::size_t>(c.rank())] == own, where(), ": this rank's count is ",
               counts[static_cast<std::size_t>(c.rank())], " ", what, " but it passes ", own);
}

float combine(float a, float b, ReduceOp op) {
  if (op == ReduceOp::kSum) return a + b;
  // max, with NaN winning (a NaN anywhere must not vanish in the reduction)
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
  return std::max(a, b);
}

// One rank's call as the call check compares it: 32 bytes, the same layout on every rank.
struct CallRecord {
  std::uint32_t collective = 0;  // an index into kCollectives
  std::uint32_t refused = 0;     // this rank's own argument checks failed
  std::uint64_t arg = 0;         // the op, or the root
  std::uint64_t size = 0;        // elements or bytes, as the collective counts them
  std::uint64_t counts = 0;      // a fingerprint of the counts (0: none)
  bool same_call(const CallRecord& o) const {
    return collective == o.collective && arg == o.arg && size == o.size && counts == o.counts;
  }
};
static_assert(sizeof(CallRecord) == 32);

constexpr std::string_view kCollectives[] = {"all_gather", "broadcast", "all_to_all", "reduce_scatter", "all_reduce"};

std::uint64_t fingerprint(std::span<const std::size_t> counts) {
  if (counts.empty()) return 0;
  detail::Fingerprint f;
  for (std::size_t c : counts) {
    const auto v = static_cast<std::uint64_t>(c);
    f.add(std::as_bytes(std::span<const std::uint64_t>(&v, 1)));
  }
  return f.value() == 0 ? 1 : f.value();
}

std::string describe_call(const CallRecord& r) {
  const std::string_view name = r.collective < std::size(kCollectives) ? kCollectives[r.collective] : "?";
  std::string text(name);
  if (name == "broadcast") text += " from rank " + std::to_string(r.arg);
  if (name == "reduce_scatter" || name == "all_reduce") {
    // Appended piece by piece: GCC 12 warned (-Wrestrict, a false positive) on "(" + std::string(...) + ")".
    text += '(';
    text += fp8kit::name(static_cast<ReduceOp>(r.arg));
    text += ')';
  }
  if (name != "all_to_all") text += " of " + std::to_string(r.size);
  if (r.counts != 0) {
    char hex[24];
    std::snprintf(hex, sizeof hex, " (counts %08llx)", static_cast<unsigned long long>(r.counts >> 32));
    text += hex;
  }
  return text;
}

}  // namespace

CommEvent::CommEvent(Communicator& comm, std::string_view collective, std::string payload)
    : comm_(comm), before_(comm.stats().total_bytes()) {
  if (comm.profiler() == nullptr) return;
  event_.emplace(comm.profiler(), "comm." + std::string(collective), "comm");
  event_->arg("ranks", std::to_string(comm.size()));
  if (!payload.empty()) event_->arg("payload", std::move(payload));
}

CommEvent::~CommEvent() {
  if (event_) event_->arg("bytes", std::to_string(comm_.stats().total_bytes() - before_));
}

void Communicator::begin_collective(std::string_view collective, std::uint64_t arg, std::uint64_t size,
                                    std::span<const std::size_t> counts, std::span<const std::size_t> recv_counts,
                                    const std::function<void()>& local) {
  if (!check_calls_) return local();
  std::exception_ptr refusal;
  try {
    local();
  } catch (const Error&) {
    refusal = std::current_exception();
  }
  CallRecord mine;
  mine.collective = static_cast<std::uint32_t>(std::find(std::begin(kCollectives), std::end(kCollectives), collective) -
                                               std::begin(kCollectives));
  mine.refused = refusal ? 1 : 0;
  mine.arg = arg;
  mine.size = size;
  mine.counts = collective == "all_to_all" ? 0 : fingerprint(counts);
  const auto n = static_cast<std::size_t>(this->size());
  std::vector<CallRecord> calls(n);
  const std::vector<std::size_t> record_bytes(n, sizeof(CallRecord));
  all_gather_bytes(std::as_bytes(std::span<const CallRecord>(&mine, 1)), std::as_writable_bytes(std::span(calls)),
                   record_bytes);
  if (std::any_of(calls.begin(), calls.end(), [&](const CallRecord& c) { return !c.same_call(calls[0]); })) {
    std::string each;
    for (std::size_t r = 0; r < n; ++r)
      each += (r == 0 ? "rank 0 calls " : ", rank " + std::to_string(r) + " ") + describe_call(calls[r]);
    FP8KIT_THROW(ErrorKind::kInvalidArgument, where(collective),
                 ": the ranks' calls differ (FP8KIT_DIST_CHECK): ", each,
                 "; every rank must make the same collective with the same sizes");
  }
  if (refusal) std::rethrow_exception(refusal);
  for (std::size_t r = 0; r < n; ++r) {
    if (calls[r].refused != 0) {
      FP8KIT_THROW(ErrorKind::kInvalidArgument, where(collective), ": rank ", r,
                   " refused its arguments (its own error says why), so no rank runs it");
    }
  }
  if (collective != "all_to_all") return;
  // Who sends whom how much: rank s's send count for r must be rank r's receive count from s.
  std::vector<std::uint64_t> own(2 * n), all(2 * n * n);
  for (std::size_t r = 0; r < n; ++r) {
    own[r] = counts[r];
    own[n + r] = recv_counts[r];
  }
  all_gather_bytes(std::as_bytes(std::span<const std::uint64_t>(own)), std::as_writable_bytes(std::span(all)),
                   std::vector<std::size_t>(n, 2 * n * sizeof(std::uint64_t)));
  for (std::size_t from = 0; from < n; ++from) {
    for (std::size_t to = 0; to < n; ++to) {
      const std::uint64_t sent = all[from * 2 * n + to], expected = all[to * 2 * n + n + from];
      FP8KIT_CHECK(sent == expected, where(collective), ": rank ", from, " sends rank ", to, " ", sent,
                   " bytes but rank ", to, " expects ", expected, " (FP8KIT_DIST_CHECK)");
    }
  }
}

void Communicator::all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                              std::span<const std::size_t> counts) {
  const CommEvent event(*this, "all_gather");
  begin_collective("all_gather", 0, recv.size(), counts, {}, [&] {
    check_counts(
        *this, "bytes", [this] { return where("all_gather"); }, counts, recv.size(), send.size());
    FP8KIT_CHECK(recv.size() <= kMaxCollectiveBytes, where("all_gather"), ": ", recv.size(), " bytes pass the ",
                 kMaxCollectiveBytes, " bytes one collective moves (split the payload)");
  });
  ++stats_.calls;
  stats_.all_gather_bytes += send.size();
  all_gather_bytes(send, recv, counts);
}

void Communicator::broadcast(std::span<std::byte> data, int root) {
  const CommEvent event(*this, "broadcast");
  begin_collective("broadcast", static_cast<std::uint64_t>(root), data.size(), {}, {}, [&] {
    FP8KIT_CHECK(root >= 0 && root < size(), where("broadcast"), ": root ", root, " is not a rank (0 to ", size() - 1,
                 ")");
    FP8KIT_CHECK(data.size() <= kMaxCollectiveBytes, where("broadcast"), ": ", data.size(), " bytes pass the ",
                 kMaxCollectiveBytes, " bytes one collective moves (split the payload)");
  });
  ++stats_.calls;
  if (rank() == root) stats_.broadcast_bytes += data.size();
  broadcast_bytes(data, root);
}

void Communicator::all_to_all(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                              std::span<std::byte> recv, std::span<const std::size_t> recv_counts) {
  const CommEvent event(*this, "all_to_all");
  const auto me = static_cast<std::size_t>(rank());
  begin_collective("all_to_all", 0, 0, send_counts, recv_counts, [&] {
    FP8KIT_CHECK(static_cast<int>(send_counts.size()) == size() && static_cast<int>(recv_counts.size()) == size(),
                 where("all_to_all"), ": ", send_counts.size(), " send and ", recv_counts.size(),
                 " receive counts for ", size(), " ranks (give one per rank)");
    FP8KIT_CHECK(sum_of(send_counts) == send.size() && sum_of(recv_counts) == recv.size(), where("all_to_all"),
                 ": the counts add up to ", sum_of(send_counts), " and ", sum_of(recv_counts),
                 " bytes, the buffers hold ", send.size(), " and ", recv.size());
    FP8KIT_CHECK(send_counts[me] == recv_counts[me], where("all_to_all"), ": this rank sends itself ", send_counts[me],
                 " bytes but expects ", recv_counts[me]);
    FP8KIT_CHECK(std::max(send.size(), recv.size()) <= kMaxCollectiveBytes, where("all_to_all"), ": ",
                 std::max(send.size(), recv.size()), " bytes pass the ", kMaxCollectiveBytes,
                 " bytes one collective moves (split the payload)");
  });
  ++stats_.calls;
  stats_.all_to_all_bytes += send.size() - send_counts[me];
  all_to_all_bytes(send, send_counts, recv, recv_counts);
}

void Communicator::check_arguments(const std::function<void()>& checks) {
  if (!check_calls_) return checks();
  const CommStats before = stats_;
  try {
    agree_on_error(*this, checks);
  } catch (...) {
    stats_ = before;
    throw;
  }
  stats_ = before;  // (the agreement is the call check's, not counted)
}

void Communicator::count_as(const CommStats& before, std::uint64_t CommStats::*into) {
  const std::uint64_t moved = stats_.total_bytes() - before.total_bytes();
  stats_ = before;
  ++stats_.calls;
  stats_.*into += moved;
}

void Communicator::reduce_scatter(std::span<const float> send, std::span<float> recv,
                                  std::span<const std::size_t> counts, ReduceOp op) {
  const CommEvent event(*this, "reduce_scatter", std::string(name(op)));
  const auto n = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
  begin_collective("reduce_scatter", static_cast<std::uint64_t>(op), send.size(), counts, {}, [&] {
    check_counts(
        *this, "floats", [this] { return where("reduce_scatter"); }, counts, send.size(), recv.size());
    // From the counts alone, the same on every rank: every rank refuses together, none is left in the backend.
    const std::size_t largest = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
    FP8KIT_CHECK(std::max(send.size(), n * largest) <= kMaxCollectiveBytes / sizeof(float), where("reduce_scatter"),
                 ": ", send.size(), " floats in parts of up to ", largest, " pass the ", kMaxCollectiveBytes,
                 " bytes one collective moves (split the payload)");
  });
  // Part r of every rank's send goes to rank r: this rank receives its part from every rank, in rank order.
  std::vector<std::size_t> send_bytes(n), recv_bytes(n, recv.size() * sizeof(float));
  for (std::size_t r = 0; r < n; ++r) send_bytes[r] = counts[r] * sizeof(float);
  std::vector<std::byte> gathered(n * recv.size() * sizeof(float));
  ++stats_.calls;
  stats_.reduce_scatter_bytes += (send.size() - counts[me]) * sizeof(float);
  all_to_all_bytes(std::as_bytes(send), send_bytes, gathered, recv_bytes);
  const auto* parts = reinterpret_cast<const float*>(gathered.data());
  for (std::size_t i = 0; i < recv.size(); ++i) {
    float acc = parts[i];
    for (std::size_t r = 1; r < n; ++r) acc = combine(acc, parts[r * recv.size() + i], op);
    recv[i] = acc;
  }
}

void Communicator::all_reduce(std::span<float> data, ReduceOp op) {
  const CommEvent event(*this, "all_reduce", std::string(name(op)));
  begin_collective("all_reduce", static_cast<std::uint64_t>(op), data.size(), {}, {}, [] {});
  const auto n = static_cast<std::size_t>(size()), me = static_cast<std::size_t>(rank());
  // even_split's parts, each reduced by its owner, then gathered back.
  std::vector<std::size_t> counts(n), bytes(n);
  for (std::size_t r = 0; r < n; ++r) {
    counts[r] = even_part(data.size(), static_cast<int>(r), size());
    bytes[r] = counts[r] * sizeof(float);
  }
  std::vector<float> mine(counts[me]);
  const CommStats before = stats_;
  reduce_scatter(data, mine, counts, op);
  all_gather(std::as_bytes(std::span<const float>(mine)), std::as_writable_bytes(data), bytes);
  count_as(before, &CommStats::all_reduce_bytes);
}

// ---------------------------------------------------------------- the local backend

namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "local"; }
  void barrier() override {}
  [[noreturn]] void abort(int status) override { std::_Exit(status); }

 protected:
  void all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                        std::span<const std::size_t>) override {
    if (!send.empty() && send.data() != recv.data()) std::memmove(recv.data(), send.data(), send.size());
  }
  void all_to_all_bytes(std::span<const std::byte> send, std::span<const std::size_t>, std::span<std::byte> recv,
                        std::span<const std::size_t>) override {
    if (!send.empty() && send.data() != recv.data()) std::memmove(recv.data(), send.data(), send.size());
  }
  void broadcast_bytes(std::span<std::byte>, int) override {}
};

}  // namespace

std::unique_ptr<Communicator> local_communicator() {
  return std::make_unique<LocalCommunicator>();
}

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"}) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

void agree_on_error(Communicator& comm, const std::function<void()>& step) {
  std::string message;
  std::uint8_t kind = 0xFF;  // none: the step went through
  try {
    step();
  } catch (const Error& e) {
    message = e.what();
    kind = static_cast<std::uint8_t>(e.kind());
  } catch (const std::exception& e) {
    message = e.what();
    kind = static_cast<std::uint8_t>(ErrorKind::kInternal);
  }
  std::vector<std::uint8_t> kinds(static_cast<std::size_t>(comm.size()));
  const std::vector<std::size_t> ones(kinds.size(), 1);
  comm.all_gather(std::as_bytes(std::span<const std::uint8_t>(&kind, 1)), std::as_writable_bytes(std::span(kinds)),
                  ones);
  const auto failed = std::find_if(kinds.begin(), kinds.end(), [](std::uint8_t k) { return k != 0xFF; });
  if (failed == kinds.end()) return;
  const int root = static_cast<int>(failed - kinds.begin());
  // The failed rank's message, to every rank.
  std::uint64_t length = comm.rank() == root ? message.size() : 0;
  comm.broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&length, 1)), root);
  message.resize(static_cast<std::size_t>(length));
  comm.broadcast(std::as_writable_bytes(std::span<char>(message.data(), message.size())), root);
  throw AgreedError(static_cast<ErrorKind>(*failed),
                    root == 0 ? message : "rank " + std::to_string(root) + ": " + message, root);
}

int launcher_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    if (const char* r = std::getenv(v)) return std::atoi(r);
  }
  return 0;
}

std::unique_ptr<Communicator> world_communicator() {
  return launched_by_mpi() ? mpi_communicator() : local_communicator();
}

#ifndef FP8KIT_HAVE_MPI
bool mpi_available() {
  return false;
}

std::unique_ptr<Communicator> mpi_communicator() {
  FP8KIT_THROW(ErrorKind::kUnsupported,
               "this fp8kit was built without MPI (install libopenmpi-dev and "
               "openmpi-bin, then reconfigure: FP8KIT_MPI=ON)");
}
#endif

}  // namespace fp8kit

#ifndef FP8KIT_HAVE_NCCL
// A build without the NCCL communicator (no CUDA backend, or no nccl.h at configure time): construction refuses, so
// the other members are unreachable.
namespace fp8kit::cuda {
namespace detail {
struct NcclState {};
}  // namespace detail
NcclCommunicator::NcclCommunicator(Communicator&, int device) {
  check_available(Device::cuda(device));  // the device first, as the NCCL build checks it
  FP8KIT_THROW(ErrorKind::kUnsupported, "cuda::NcclCommunicator: ", nccl_version());
}
NcclCommunicator::~NcclCommunicator() = default;
void NcclCommunicator::all_gather(const Tensor&, Tensor&) {}
void NcclCommunicator::reduce_scatter(const Tensor&, Tensor&, ReduceOp) {}
void NcclCommunicator::all_reduce(Tensor&, ReduceOp) {}
std::string NcclCommunicator::nccl_version() {
  return cuda::built() ? "this build of fp8kit has no NCCL communicator (nccl.h was not found when it was configured)"
                       : "this build of fp8kit has no CUDA backend (build with the CUDA toolkit installed, "
                         "FP8KIT_CUDA=AUTO or ON)";
}
}  // namespace fp8kit::cuda
#endif
