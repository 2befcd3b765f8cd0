// The MPI backend (compiled where CMake found MPI): MPI_COMM_WORLD with errors returned, not fatal, and turned into
// fp8kit errors naming the call and the rank; MPI initialized on first use and finalized with the last communicator.
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/dist/communicator.hpp"

namespace fp8kit {
namespace {

// MPI_Init once per process; MPI_Finalize when the last communicator goes (MPI cannot be initialized again after).
class MpiRuntime {
 public:
  static void acquire() {
    std::lock_guard lock(mutex());
    if (users() > 0) {
      ++users();
      return;
    }
    // MPI_Initialized stays true after MPI_Finalize: ask about the finalize first.
    int finalized = 0;
    MPI_Finalized(&finalized);
    FP8KIT_CHECK_KIND(!finalized, ErrorKind::kUnsupported,
                      "MPI was finalized in this process and cannot start again (keep one communicator for the run)");
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
      ++users();  // the application started MPI: it finalizes it too
      return;
    }
    int provided = 0;
    // FUNNELED: OpenMP threads compute, only the calling thread calls MPI.
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    FP8KIT_CHECK_KIND(rc == MPI_SUCCESS, ErrorKind::kIo, "MPI_Init_thread failed (code ", rc,
                      "): start the job with mpirun, or run without it for one process");
    if (provided < MPI_THREAD_FUNNELED) {
      MPI_Finalize();
      FP8KIT_THROW(ErrorKind::kUnsupported, "this MPI gives thread level ", provided, ", fp8kit needs FUNNELED (",
                   MPI_THREAD_FUNNELED, "): use an MPI built with thread support");
    }
    owns_init() = true;
    ++users();  // only once MPI is up: a failed start leaves no user behind
  }
  static void release() {
    std::lock_guard lock(mutex());
    if (--users() > 0 || !owns_init()) return;
    MPI_Finalize();
    owns_init() = false;
  }

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static int& users() {
    static int n = 0;
    return n;
  }
  static bool& owns_init() {
    static bool b = false;
    return b;
  }
};

int as_int(std::size_t n, const std::string& where) {
  FP8KIT_CHECK(n <= static_cast<std::size_t>(INT_MAX), where, ": ", n, " bytes is more than one MPI call moves (",
               INT_MAX, "); split the payload");
  return static_cast<int>(n);
}

// One user of the MPI runtime, for as long as it lives (a member, so a constructor that throws releases it too).
struct MpiUse {
  MpiUse() { MpiRuntime::acquire(); }
  ~MpiUse() { MpiRuntime::release(); }
  MpiUse(const MpiUse&) = delete;
  MpiUse& operator=(const MpiUse&) = delete;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    // A duplicate of the world: fp8kit's messages never mix with the application's, and errors come back as codes.
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    // The call checks add a collective to every collective: on some ranks only (FP8KIT_DIST_CHECK set for one
    // program of a job), the others would wait in another collective for ever. Agreed here, once: {on, off} of
    // every rank, MAX: both 1 where the ranks differ.
    int seen[2] = {checking_calls() ? 1 : 0, checking_calls() ? 0 : 1};
    check(MPI_Allreduce(MPI_IN_PLACE, seen, 2, MPI_INT, MPI_MAX, comm_), "MPI_Allreduce");
    if (seen[0] == 1 && seen[1] == 1) {
      MPI_Comm_free(&comm_);
      FP8KIT_THROW(ErrorKind::kInvalidArgument, "FP8KIT_DIST_CHECK is 1 on some ranks of this job and not on others ",
                   "(rank ", rank_, ": ", checking_calls() ? "1" : "unset or 0",
                   "); set it alike for every rank (mpirun -x FP8KIT_DIST_CHECK=1)");
    }
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);  // an application that started MPI may have ended it already
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }
  [[noreturn]] void abort(int status) override {
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);  // MPI_Abort does not return; should it, end this process at least
  }

 protected:
  void all_gather_bytes(std::span<const std::byte> send, std::span<std::byte> recv,
                        std::span<const std::size_t> counts) override {
    std::vector<int> c(counts.size()), d(counts.size());
    std::size_t offset = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      c[r] = as_int(counts[r], where("all_gather"));
      d[r] = as_int(offset, where("all_gather"));
      offset += counts[r];
    }
    check(MPI_Allgatherv(send.data(), as_int(send.size(), where("all_gather")), MPI_BYTE, recv.data(), c.data(),
                         d.data(), MPI_BYTE, comm_),
          "MPI_Allgatherv");
  }
  void all_to_all_bytes(std::span<const std::byte> send, std::span<const std::size_t> send_counts,
                        std::span<std::byte> recv, std::span<const std::size_t> recv_counts) override {
    const std::size_t n = send_counts.size();
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    std::size_t so = 0, ro = 0;
    for (std::size_t r = 0; r < n; ++r) {
      sc[r] = as_int(send_counts[r], where("all_to_all"));
      sd[r] = as_int(so, where("all_to_all"));
      rc[r] = as_int(recv_counts[r], where("all_to_all"));
      rd[r] = as_int(ro, where("all_to_all"));
      so += send_counts[r];
      ro += recv_counts[r];
    }
    check(
        MPI_Alltoallv(send.data(), sc.data(), sd.data(), MPI_BYTE, recv.data(), rc.data(), rd.data(), MPI_BYTE, comm_),
        "MPI_Alltoallv");
  }
  void broadcast_bytes(std::span<std::byte> data, int root) override {
    check(MPI_Bcast(data.data(), as_int(data.size(), where("broadcast")), MPI_BYTE, root, comm_), "MPI_Bcast");
  }

 private:
  void check(int rc, const char* call) const {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    FP8KIT_THROW(ErrorKind::kIo, call, " failed on rank ", rank_, " of ", size_, ": ", std::string(text, len));
  }

  MpiUse use_;  // first: MPI is up before the rest and down after it
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
};

}  // namespace

bool mpi_available() {
  return true;
}

std::unique_ptr<Communicator> mpi_communicator() {
  return std::make_unique<MpiCommunicator>();
}

}  // namespace fp8kit
