// What this CPU can do (read once with cpuid, XCR0 and, for AMX, the OS permission), the ordered ISA levels every
// kernel family dispatches on, the cap FP8KIT_ISA or set_max_isa() puts on them, and the thread count.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fp8kit {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vbmi = false;
  bool avx512bf16 = false;
  bool avx512fp16 = false;
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_int8 = false;
  // The OS lets this process use the AMX tile data (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM) granted at detection).
  bool amx_permitted = false;
  std::string brand;  // the processor brand string, e.g. "AMD EPYC 7B13"

  // The names of the features that are present, in the order above ("avx2", "fma", ..., "amx-permitted").
  std::vector<std::string> names() const;
};

const CpuFeatures& cpu_features();

// The instruction-set levels kernels are written for, lowest first. Each level includes the ones below it:
//   scalar       portable C++
//   avx2         AVX2 + FMA + F16C
//   avx512       AVX-512 F/BW/VL/DQ (VBMI used where present, e.g. for 64-byte table lookups)
//   avx512-bf16  + AVX512-BF16 (vdpbf16ps)
//   amx          + AMX-TILE and AMX-BF16, with the OS permission to use the tile state
enum class Isa : std::uint8_t { kScalar, kAvx2, kAvx512, kAvx512Bf16, kAmx };
inline constexpr std::array<Isa, 5> kAllIsas = {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16, Isa::kAmx};

std::string_view name(Isa isa);  // "scalar", "avx2", "avx512", "avx512-bf16", "amx"
std::optional<Isa> parse_isa(std::string_view text);
// "scalar, avx2, avx512, avx512-bf16, amx": for error messages and --help.
std::string isa_names();

// What this CPU (and OS) lacks for a level, e.g. "avx512bf16" or "the OS permission for AMX tile data"; empty when
// the level can run here.
std::string missing_for(Isa isa);
// The highest level this CPU can run, and every level it can run (scalar first).
Isa cpu_max_isa();
std::vector<Isa> cpu_isa_levels();

// The level kernels dispatch to: the CPU's highest, capped by set_max_isa() where the program set a cap, else by
// FP8KIT_ISA (read once, as oneDNN's ONEDNN_MAX_CPU_ISA). A cap above what the CPU has changes nothing. Throws
// fp8kit::Error (kInvalidArgument) naming the valid levels when FP8KIT_ISA holds an unknown one.
Isa active_isa();
// FP8KIT_ISA as this process read it (nullopt when unset).
std::optional<std::string> isa_from_environment();
// Caps dispatch at `cap` for this process from now on, in place of FP8KIT_ISA (tests and `fp8kit bench --isa` run
// every level the CPU has this way, whatever the environment says); nullopt returns to FP8KIT_ISA. Not for use
// while other threads run kernels.
void set_max_isa(std::optional<Isa> cap);
// The cap set_max_isa set last (nullopt: none, FP8KIT_ISA applies), to put back after capping for a while.
std::optional<Isa> max_isa_set();

// The most threads set_num_threads takes: past it a thread count only oversubscribes the cores (and OpenMP runtimes
// fail to start that many threads: libgomp aborts at 100000).
inline constexpr int kMaxThreads = 1024;
// Threads used by bulk operations, for every thread of the process from this call on (a server that sets it once at
// start-up gets it in its worker threads too); until it is called (or after set_num_threads(std::nullopt)), each
// thread's OpenMP default (OMP_NUM_THREADS, omp_set_num_threads, else the number of cores). It also sets the calling
// thread's OpenMP default (omp_set_num_threads), so OpenMP code of the caller's own agrees. 1 <= n <= kMaxThreads,
// else Error(kInvalidArgument). On the thread that called fork() without exec (multiprocessing's fork workers), in
// the child: one. GNU OpenMP's threads do not survive a fork, and a parallel region there would wait for them
// forever; set_num_threads checks its argument and keeps one there.
void set_num_threads(std::optional<int> n);
// The count set_num_threads set (nullopt: none), to put back after setting one for a while.
std::optional<int> num_threads_set();
// The count fp8kit's next bulk operation on this thread uses: a ScopedNumThreads of this thread's, else
// set_num_threads', else this thread's OpenMP default (1 on the forking thread of a forked child).
int num_threads();

// For the calling thread alone, while it lives, fp8kit's bulk operations use n threads (the Python package's
// `threads=`: one call's count, which no other thread sees). Checked as set_num_threads; scopes nest.
class ScopedNumThreads {
 public:
  explicit ScopedNumThreads(int n);
  ~ScopedNumThreads();
  ScopedNumThreads(const ScopedNumThreads&) = delete;
  ScopedNumThreads& operator=(const ScopedNumThreads&) = delete;

 private:
  int previous_;
};

}  // namespace fp8kit
