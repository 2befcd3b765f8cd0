// CPU feature detection (cpuid, xgetbv, the Linux AMX permission), the ISA levels and their cap, and the thread
// count shared by every bulk operation.
#include "fp8kit/common/cpu.hpp"

#include <cpuid.h>
#include <omp.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "fp8kit/common/error.hpp"

namespace fp8kit {
namespace {

std::uint64_t xgetbv0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned reg, int n) {
  return ((reg >> n) & 1u) != 0;
}

// Linux keeps AMX's 8 KiB tile data out of a process's signal frames until it asks for it (kernel 5.16+).
bool request_amx_permission() {
#if defined(__linux__)
  constexpr long kArchGetXcompPerm = 0x1022, kArchReqXcompPerm = 0x1023, kXfeatureTileData = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) != 0) return false;
  unsigned long granted = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &granted) != 0) return false;
  return ((granted >> kXfeatureTileData) & 1ul) != 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = bit(c, 27);
  const bool avx = bit(c, 28);
  const std::uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm_state = (xcr0 & 0x6) == 0x6;           // SSE + AVX state
  const bool zmm_state = (xcr0 & 0xE6) == 0xE6;         // + opmask, ZMM_Hi256, Hi16_ZMM
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;  // XTILECFG + XTILEDATA
  f.fma = avx && ymm_state && bit(c, 12);
  f.f16c = avx && ymm_state && bit(c, 29);
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = avx && ymm_state && bit(b, 5);
    f.avx512f = zmm_state && bit(b, 16);
    f.avx512dq = f.avx512f && bit(b, 17);
    f.avx512bw = f.avx512f && bit(b, 30);
    f.avx512vl = f.avx512f && bit(b, 31);
    f.avx512vbmi = f.avx512f && bit(c, 1);
    f.avx512fp16 = f.avx512f && bit(d, 23);
    f.amx_bf16 = tile_state && bit(d, 22);
    f.amx_tile = tile_state && bit(d, 24);
    f.amx_int8 = tile_state && bit(d, 25);
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = f.avx512f && bit(a, 5);
  if (f.amx_tile) f.amx_permitted = request_amx_permission();
  char brand[49] = {};
  unsigned regs[12];
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
    for (unsigned i = 0; i < 3; ++i)
      __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    std::memcpy(brand, regs, 48);
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
    while (!f.brand.empty() && f.brand.front() == ' ') f.brand.erase(f.brand.begin());
  }
  return f;
}

constexpr std::array<std::string_view, kAllIsas.size()> kIsaNames = {"scalar", "avx2", "avx512", "avx512-bf16", "amx"};

// What each level adds to the one below: (feature name, present?) pairs.
std::vector<std::pair<std::string_view, bool>> requirements(Isa isa, const CpuFeatures& f) {
  switch (isa) {
    case Isa::kScalar:
      return {};
    case Isa::kAvx2:
      return {{"avx2", f.avx2}, {"fma", f.fma}, {"f16c", f.f16c}};
    case Isa::kAvx512:
      return {{"avx512f", f.avx512f}, {"avx512bw", f.avx512bw}, {"avx512vl", f.avx512vl}, {"avx512dq", f.avx512dq}};
    case Isa::kAvx512Bf16:
      return {{"avx512bf16", f.avx512bf16}};
    case Isa::kAmx:
      return {
          {"amx-tile", f.amx_tile}, {"amx-bf16", f.amx_bf16}, {"the OS permission for AMX tile data", f.amx_permitted}};
  }
  return {};
}

// The cap from set_max_isa(): -1 when none.
std::atomic<int> g_cap{-1};

struct EnvironmentCap {
  std::optional<std::string> text;  // FP8KIT_ISA as read
  std::optional<Isa> cap;           // parsed, when valid
};

const EnvironmentCap& environment_cap() {
  static const EnvironmentCap env = [] {
    EnvironmentCap e;
    if (const char* v = std::getenv("FP8KIT_ISA"); v != nullptr && *v != '\0') {
      e.text = v;
      e.cap = parse_isa(v);
    }
    return e;
  }();
  return env;
}

}  // namespace

std::vector<std::string> CpuFeatures::names() const {
  const std::pair<const char*, bool> all[] = {
      {"avx2", avx2},
      {"fma", fma},
      {"f16c", f16c},
      {"avx512f", avx512f},
      {"avx512bw", avx512bw},
      {"avx512vl", avx512vl},
      {"avx512dq", avx512dq},
      {"avx512vbmi", avx512vbmi},
      {"avx512bf16", avx512bf16},
      {"avx512fp16", avx512fp16},
      {"amx-tile", amx_tile},
      {"amx-bf16", amx_bf16},
      {"amx-int8", amx_int8},
      {"amx-permitted", amx_permitted},
  };
  std::vector<std::string> out;
  for (const auto& [feature, present] : all) {
    if (present) out.emplace_back(feature);
  }
  return out;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

std::string_view name(Isa isa) {
  return kIsaNames[static_cast<std::size_t>(isa)];
}

std::optional<Isa> parse_isa(std::string_view text) {
  for (Isa isa : kAllIsas) {
    if (name(isa) == text) return isa;
  }
  if (text == "avx512bf16" || text == "avx512_bf16") return Isa::kAvx512Bf16;  // the cpuinfo spellings
  return std::nullopt;
}

std::string isa_names() {
  std::string out;
  for (Isa isa : kAllIsas) {
    if (!out.empty()) out += ", ";
    out += name(isa);
  }
  return out;
}

std::string missing_for(Isa isa) {
  const CpuFeatures& f = cpu_features();
  std::string missing;
  for (Isa level : kAllIsas) {
    if (level > isa) break;
    for (const auto& [feature, present] : requirements(level, f)) {
      if (present) continue;
      if (!missing.empty()) missing += ", ";
      missing += feature;
    }
  }
  return missing;
}

Isa cpu_max_isa() {
  static const Isa max = [] {
    Isa best = Isa::kScalar;
    for (Isa isa : kAllIsas) {
      if (!missing_for(isa).empty()) break;
      best = isa;
    }
    return best;
  }();
  return max;
}

std::vector<Isa> cpu_isa_levels() {
  std::vector<Isa> levels;
  for (Isa isa : kAllIsas) {
    if (isa <= cpu_max_isa()) levels.push_back(isa);
  }
  return levels;
}

std::optional<std::string> isa_from_environment() {
  return environment_cap().text;
}

Isa active_isa() {
  const EnvironmentCap& env = environment_cap();
  FP8KIT_CHECK(!env.text || env.cap.has_value(), "FP8KIT_ISA=", *env.text, " is not an ISA level; use one of ",
               isa_names(), " (or unset it)");
  // The program's own cap, where it set one, replaces the environment's.
  const int set = g_cap.load(std::memory_order_relaxed);
  const std::optional<Isa> cap = set >= 0 ? std::optional<Isa>(static_cast<Isa>(set)) : env.cap;
  return cap && *cap < cpu_max_isa() ? *cap : cpu_max_isa();
}

void set_max_isa(std::optional<Isa> cap) {
  g_cap.store(cap ? static_cast<int>(*cap) : -1, std::memory_order_relaxed);
}

std::optional<Isa> max_isa_set() {
  const int set = g_cap.load(std::memory_order_relaxed);
  return set >= 0 ? std::optional<Isa>(static_cast<Isa>(set)) : std::nullopt;
}

namespace {

// A child of fork() (multiprocessing's and DataLoader's workers, a test's death child): GNU OpenMP's threads do not
// survive the fork, and the forking thread's next parallel region in the child would wait for them forever (its
// thread pool came along). So in a forked process the forking thread (the child's first, and there its only one)
// has its OpenMP default set to 1, and num_threads() (the count every parallel region of fp8kit's names) says 1 on
// it: that thread runs fp8kit on one thread. A thread the child starts later has a pool of its own, which works, and
// the process's count. (posix_spawn and fork + exec run no handlers: a new program starts as any other.)
thread_local bool t_forked = false;

void after_fork_in_child() {
  t_forked = true;
  omp_set_num_threads(1);
}

[[maybe_unused]] const int g_at_fork = pthread_atfork(nullptr, nullptr, after_fork_in_child);

std::atomic<int> g_threads{0};   // set_num_threads' count, every thread's (0: not set)
thread_local int t_threads = 0;  // this thread's ScopedNumThreads count (0: none)

void check_thread_count(int n) {
  FP8KIT_CHECK(n >= 1, "thread count must be at least 1, got ", n);
  FP8KIT_CHECK(n <= kMaxThreads, "thread count must be at most ", kMaxThreads, ", got ", n,
               " (more threads than cores only share them)");
}

}  // namespace

void set_num_threads(std::optional<int> n) {
  if (!n) {
    g_threads.store(0, std::memory_order_relaxed);  // each thread's OpenMP default again
    return;
  }
  check_thread_count(*n);
  g_threads.store(*n, std::memory_order_relaxed);
  omp_set_num_threads(t_forked ? 1 : *n);
}

std::optional<int> num_threads_set() {
  const int set = g_threads.load(std::memory_order_relaxed);
  return set > 0 ? std::optional<int>(set) : std::nullopt;
}

int num_threads() {
  if (t_forked) return 1;
  if (t_threads > 0) return t_threads;
  const int set = g_threads.load(std::memory_order_relaxed);
  return set > 0 ? set : omp_get_max_threads();
}

ScopedNumThreads::ScopedNumThreads(int n) : previous_(t_threads) {
  check_thread_count(n);
  t_threads = n;
}

ScopedNumThreads::~ScopedNumThreads() {
  t_threads = previous_;
}

}  // namespace fp8kit
