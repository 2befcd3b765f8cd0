// The GEMM/GEMV benchmark: seeded normal data, quantized to e4m3fn once before timing; the FP8 kernels timed in
// rotation with OpenBLAS (loaded with dlopen, so the library itself never depends on it) and the read probe.
#include "gemm_bench.hpp"

#include <dlfcn.h>
#include <link.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <stdexcept>
#include <thread>

#include "bf16_baseline.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "harness.hpp"

namespace fp8kit::bench {
namespace {

constexpr const char* kOpenBlasSoname = "libopenblas.so.0";
constexpr const char* kOpenBlasPackage = "libopenblas0-pthread";

// The CBLAS enums as OpenBLAS's cblas.h numbers them (passed as int, as the C ABI passes enums).
constexpr int kRowMajor = 101;
constexpr int kNoTrans = 111;
constexpr int kTrans = 112;

// The OpenBLAS entry points the benchmark uses. blasint is int: Debian's libopenblas.so.0 is the LP64 build.
struct OpenBlas {
  using Sgemm = void (*)(int order, int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                         const float* b, int ldb, float beta, float* c, int ldc);
  using Sgemv = void (*)(int order, int trans, int m, int n, float alpha, const float* a, int lda, const float* x,
                         int incx, float beta, float* y, int incy);
  Sgemm sgemm = nullptr;
  Sgemv sgemv = nullptr;
  void (*set_num_threads)(int) = nullptr;
  int (*get_num_threads)() = nullptr;
  OpenBlasInfo info;
};

std::string dl_error() {
  const char* e = dlerror();
  return e ? e : "unknown error";
}

template <typename Fn>
Fn symbol(void* handle, const char* name, const std::string& library) {
  dlerror();
  void* p = dlsym(handle, name);
  if (p == nullptr) {
    throw std::runtime_error(std::string("OpenBLAS (") + library + ") has no " + name + ": " + dl_error() +
                             "; install the Debian package " + kOpenBlasPackage);
  }
  return reinterpret_cast<Fn>(p);
}

OpenBlas open_openblas() {
  // OpenBLAS reads its environment when it is loaded: it must not be in the process yet.
  if (void* already = dlopen(kOpenBlasSoname, RTLD_NOW | RTLD_NOLOAD)) {
    dlclose(already);
    throw std::runtime_error(std::string(kOpenBlasSoname) +
                             " was loaded before the benchmark could unset OPENBLAS_CORETYPE (is fp8kit linked "
                             "against a BLAS?)");
  }
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("OPENBLAS_L2_SIZE");
  // Idle OpenBLAS workers spin for 2^28 cycles (~0.1 s) by default, taking cores from the FP8 kernel timed next;
  // 2^4 cycles puts them to sleep at once. It changes no kernel, only how soon its idle threads block.
  setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
  void* handle = dlopen(kOpenBlasSoname, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    throw std::runtime_error("cannot load OpenBLAS for the sgemm/sgemv baselines (" + dl_error() +
                             "); install the Debian package " + kOpenBlasPackage);
  }
  OpenBlas blas;
  blas.info.library = kOpenBlasSoname;
  if (link_map* map = nullptr; dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name)
    blas.info.library = map->l_name;
  const std::string& lib = blas.info.library;
  blas.sgemm = symbol<OpenBlas::Sgemm>(handle, "cblas_sgemm", lib);
  blas.sgemv = symbol<OpenBlas::Sgemv>(handle, "cblas_sgemv", lib);
  blas.set_num_threads = symbol<void (*)(int)>(handle, "openblas_set_num_threads", lib);
  blas.get_num_threads = symbol<int (*)()>(handle, "openblas_get_num_threads", lib);
  const char* core = symbol<char* (*)()>(handle, "openblas_get_corename", lib)();
  blas.info.core = core ? core : "";
  if (auto config = reinterpret_cast<char* (*)()>(dlsym(handle, "openblas_get_config"))) {
    const char* text = config();
    blas.info.config = text ? text : "";
    while (!blas.info.config.empty() && blas.info.config.back() == ' ') blas.info.config.pop_back();
    if (const std::size_t at = blas.info.config.find("MAX_THREADS="); at != std::string::npos)
      blas.info.max_threads = std::atoi(blas.info.config.c_str() + at + 12);
  }
  return blas;  // the handle stays open for the life of the process
}

const OpenBlas& openblas() {
  static const OpenBlas blas = open_openblas();
  return blas;
}

// Standard normal values, the same for a seed whatever the thread count (each 64K chunk has its own stream).
void fill_normal(std::span<float> x, std::uint32_t seed) {
  constexpr std::size_t kChunk = std::size_t{1} << 16;
  const auto chunks = static_cast<std::int64_t>((x.size() + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) num_threads(num_threads())
  for (std::int64_t c = 0; c < chunks; ++c) {
    std::seed_seq seq{seed, static_cast<std::uint32_t>(c), static_cast<std::uint32_t>(c >> 32)};
    std::mt19937 rng(seq);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const std::size_t begin = static_cast<std::size_t>(c) * kChunk;
    const std::size_t end = std::min(x.size(), begin + kChunk);
    for (std::size_t i = begin; i < end; ++i) x[i] = normal(rng);
  }
}

// ||got - want|| / ||want|| (2-norms, in double).
double relative_difference(std::span<const float> got, std::span<const float> want) {
  double diff = 0, norm = 0;
  const auto n = static_cast<std::int64_t>(want.size());
#pragma omp parallel for schedule(static) reduction(+ : diff, norm) num_threads(num_threads())
  for (std::int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  if (norm == 0) return diff == 0 ? 0.0 : 1.0;
  return std::sqrt(diff / norm);
}

// Before every run (warm-ups included) the benchmark sleeps this long, so that the threads of the previous run
// have stopped spinning: libgomp's idle workers spin for a few milliseconds (GOMP_SPINCOUNT's default) and OpenBLAS's
// until OPENBLAS_THREAD_TIMEOUT, and on a machine with few cores a spinning pool takes cores from the one being timed.
constexpr auto kSettle = std::chrono::milliseconds(20);

// Medians of `fns` run in rotation after one warm-up each: repetition r starts with fns[r % n], so each sees the
// others' effect on caches and clocks alike (for two functions, the ABAB/BABA order of time_interleaved). A function
// whose warm-up took less than kShortRun is run once more, untimed, right before each timed run: after the settle
// pause the vCPUs have idled and their threads sleep, and waking them costs milliseconds on a VM (measured: a 1 ms
// 16x4096x4096 GEMM timed 3-8x slower straight after 20 ms of sleep, for oneDNN and fp8kit alike), which would
// measure the wake-up instead of the kernel.
constexpr double kShortRun = 0.02;  // seconds

std::vector<double> time_rotated(const std::vector<std::function<void()>>& fns, int reps) {
  const std::size_t n = fns.size();
  std::vector<bool> short_run(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::this_thread::sleep_for(kSettle);
    short_run[i] = time_once(fns[i]) < kShortRun;
  }
  std::vector<std::vector<double>> times(n);
  for (int r = 0; r < reps; ++r) {
    for (std::size_t j = 0; j < n; ++j) {
      const std::size_t i = (static_cast<std::size_t>(r) + j) % n;
      std::this_thread::sleep_for(kSettle);
      if (short_run[i]) fns[i]();
      times[i].push_back(time_once(fns[i]));
    }
  }
  std::vector<double> medians;
  for (auto& t : times) medians.push_back(median(std::move(t)));
  return medians;
}

double per_second(double amount, double seconds) {
  return seconds > 0 ? amount / seconds : 0.0;
}

QuantizeOptions e4m3fn(Granularity g) {
  return QuantizeOptions{Format::e4m3fn, Overflow::kSaturate, g, ScaleOptions{}};
}

void apply_threads(int threads) {
  set_num_threads(threads);
  openblas().set_num_threads(threads);  // loads OpenBLAS (and starts its threads) before the OpenMP threads are bound
  bind_openmp_threads(threads);
  // Every row says `threads`: a baseline on fewer (OpenBLAS past its MAX_THREADS) would flatter the ratio.
  const int blas_threads = openblas().get_num_threads();
  FP8KIT_CHECK(blas_threads == threads, "--threads ", threads, ": OpenBLAS runs ", blas_threads,
               " threads for it; give at most ", blas_threads);
}

// The same values as bfloat16 bits (round to nearest even), for the BF16 baseline: in a 64-byte aligned buffer, as
// every operand here (a std::vector's 16-byte alignment splits a library's vector loads across cache lines).
Buffer to_bf16(std::span<const float> x) {
  Buffer out(x.size() * sizeof(std::uint16_t));
  const std::span<std::uint16_t> bits = out.as<std::uint16_t>();
  for (std::size_t i = 0; i < x.size(); ++i) bits[i] = bfloat16::from_float(x[i]).bits;
  return out;
}

// The fields every row of one shape and thread count shares.
GemmResult result_for(const GemmShape& s, int threads, int reps) {
  GemmResult r;
  r.shape = s;
  r.threads = threads;
  r.openblas_threads = openblas().get_num_threads();
  r.reps = reps;
  r.isa = std::string(name(active_isa()));
  return r;
}

// fp8-gemm, sgemm and (where built in) bf16-gemm rows for one GEMM shape at each thread count.
void bench_gemm(const GemmShape& s, const GemmBenchOptions& options, int reps, std::vector<GemmResult>& results,
                const std::function<void()>& step) {
  const OpenBlas& blas = openblas();
  const auto mk = static_cast<std::size_t>(s.m * s.k), nk = static_cast<std::size_t>(s.n * s.k);
  const auto mn = static_cast<std::size_t>(s.m * s.n);
  Buffer a(mk * 4), b(nk * 4), c_f32(mn * 4), c_fp8(mn * 4), c_bf16(mn * 4);
  fill_normal(a.as<float>(), 11);
  fill_normal(b.as<float>(), 12);
  const ScaledTensor qa = quantize(MatrixRef{a.as<const float>().data(), s.m, s.k}, e4m3fn(Granularity::tensor()));
  const ScaledTensor qb = quantize(MatrixRef{b.as<const float>().data(), s.n, s.k}, e4m3fn(Granularity::tensor()));
  const bool bf16_wanted = options.bf16_baseline && bf16_library().available;
  Buffer a16 = to_bf16(a.as<const float>().first(bf16_wanted ? mk : 0));
  Buffer b16 = to_bf16(b.as<const float>().first(bf16_wanted ? nk : 0));
  const ScaledMmOptions mm{BLayout::kNK, DType::float32, {}};
  const double flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  for (int threads : options.threads) {
    apply_threads(threads);
    // oneDNN fixes a primitive's thread count when it is created: one per thread count, made after apply_threads
    // (a primitive made once ran the OpenMP count of its creation, OMP_NUM_THREADS=1 under a "threads 2" row).
    std::unique_ptr<Bf16Gemm> bf16;
    bool with_bf16 = bf16_wanted;
    if (with_bf16) {
      try {
        bf16 = std::make_unique<Bf16Gemm>(s.m, s.n, s.k, a16.as<const std::uint16_t>().data(),
                                          b16.as<const std::uint16_t>().data(), c_bf16.as<float>().data());
      } catch (const std::exception&) {
        with_bf16 = false;  // oneDNN has no bf16 matmul for this shape on this CPU: the shape has no bf16-gemm row
      }
    }
    MmDispatch dispatch;
    volatile float sink = 0;
    const auto fp8 = [&] { sink = scaled_mm_into(qa, qb, c_fp8.as<float>().first(mn), mm, &dispatch); };
    const auto sgemm = [&] {
      blas.sgemm(kRowMajor, kNoTrans, kTrans, static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k), 1.0f,
                 a.as<const float>().data(), static_cast<int>(s.k), b.as<const float>().data(), static_cast<int>(s.k),
                 0.0f, c_f32.as<float>().data(), static_cast<int>(s.n));
    };
    std::vector<std::function<void()>> fns = {fp8, sgemm};
    if (with_bf16) fns.emplace_back([&] { bf16->run(); });
    const std::vector<double> t = time_rotated(fns, reps);
    const GemmResult common = result_for(s, threads, reps);
    GemmResult row = common, base = common;
    row.op = "fp8-gemm";
    row.baseline = "sgemm";
    row.path = std::string(name(dispatch.path));
    row.kernel = std::string(dispatch.kernel);
    row.seconds = t[0];
    row.gflops = per_second(flops, t[0]) / 1e9;
    row.baseline_seconds = t[1];
    row.ratio = per_second(t[1], t[0]);
    row.rel_diff = relative_difference(c_fp8.as<const float>().first(mn), c_f32.as<const float>().first(mn));
    base.op = "sgemm";
    base.seconds = t[1];
    base.gflops = per_second(flops, t[1]) / 1e9;
    if (with_bf16) row.bf16_ratio = per_second(t[2], t[0]);
    results.push_back(row);
    results.push_back(base);
    if (with_bf16) {
      GemmResult lib = common;
      lib.op = "bf16-gemm";
      lib.library = bf16_library().name + " (" + bf16->implementation() + ")";
      lib.seconds = t[2];
      lib.gflops = per_second(flops, t[2]) / 1e9;
      lib.rel_diff = relative_difference(c_bf16.as<const float>().first(mn), c_f32.as<const float>().first(mn));
      results.push_back(lib);
    }
    step();
  }
}

// fp8-gemv, sgemv and read-bandwidth rows for one GEMV shape at each thread count.
void bench_gemv(const GemmShape& s, const GemmBenchOptions& options, int reps, std::vector<GemmResult>& results,
                const std::function<void()>& step) {
  const OpenBlas& blas = openblas();
  const auto nk = static_cast<std::size_t>(s.n * s.k);
  const auto n = static_cast<std::size_t>(s.n), k = static_cast<std::size_t>(s.k);
  Buffer w(nk * 4), x(k * 4), y_f32(n * 4), y_fp8(n * 4), probe(nk);
  fill_normal(w.as<float>(), 21);
  fill_normal(x.as<float>(), 22);
  const ScaledTensor qw = quantize(MatrixRef{w.as<const float>().data(), s.n, s.k}, e4m3fn(Granularity::row()));
  // The probe reads as many bytes as the FP8 weights, from a buffer of its own (a copy of the codes).
  std::memcpy(probe.data(), qw.data.data(), nk);
  const MatrixRef xv{x.data(), DType::float32, 1, s.k};
  // The same activations in bfloat16: the weight-only product of bfloat16 models (and the path of the bfloat16 GEMV
  // kernels, which need activations exact in bfloat16).
  Buffer x16 = to_bf16(x.as<const float>().first(k));
  const MatrixRef xv16{x16.data(), DType::bfloat16, 1, s.k};
  Buffer y_fp8_16(n * 4);
  const double flops = 2.0 * static_cast<double>(nk);
  for (int threads : options.threads) {
    apply_threads(threads);
    MmDispatch dispatch;
    volatile std::uint64_t sink = 0;
    MmDispatch dispatch16;
    const auto fp8 = [&] { fp8_weight_mm(xv, qw, y_fp8.as<float>().first(n), {}, &dispatch); };
    const auto fp8_16 = [&] { fp8_weight_mm(xv16, qw, y_fp8_16.as<float>().first(n), {}, &dispatch16); };
    const auto sgemv = [&] {
      blas.sgemv(kRowMajor, kNoTrans, static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, w.as<const float>().data(),
                 static_cast<int>(s.k), x.as<const float>().data(), 1, 0.0f, y_f32.as<float>().data(), 1);
    };
    const auto read = [&] { sink = sink ^ read_all(probe.data(), nk, threads); };
    const std::vector<double> t = time_rotated({fp8, sgemv, read, fp8_16}, reps);
    const GemmResult common = result_for(s, threads, reps);
    GemmResult row = common, base = common, bw = common;
    bw.op = "read-bandwidth";
    bw.bytes = nk;
    bw.seconds = t[2];
    bw.gbps = per_second(static_cast<double>(nk), t[2]) / 1e9;
    row.op = "fp8-gemv";
    row.baseline = "sgemv";
    row.path = std::string(name(dispatch.path));
    row.kernel = std::string(dispatch.kernel);
    row.bytes = nk;
    row.seconds = t[0];
    row.gflops = per_second(flops, t[0]) / 1e9;
    row.gbps = per_second(static_cast<double>(nk), t[0]) / 1e9;
    row.gweights = row.gbps;
    row.baseline_seconds = t[1];
    row.ratio = per_second(t[1], t[0]);  // weights per second over sgemv's weights per second
    row.read_bandwidth_gbps = bw.gbps;
    row.read_bandwidth_ratio = bw.gbps > 0 ? row.gbps / bw.gbps : 0.0;
    row.rel_diff = relative_difference(y_fp8.as<const float>().first(n), y_f32.as<const float>().first(n));
    base.op = "sgemv";
    base.bytes = 4 * nk;
    base.seconds = t[1];
    base.gflops = per_second(flops, t[1]) / 1e9;
    base.gbps = per_second(4.0 * static_cast<double>(nk), t[1]) / 1e9;
    base.gweights = per_second(static_cast<double>(nk), t[1]) / 1e9;
    GemmResult row16 = row;
    row16.op = "fp8-gemv-bf16x";
    row16.kernel = std::string(dispatch16.kernel);
    row16.seconds = t[3];
    row16.gflops = per_second(flops, t[3]) / 1e9;
    row16.gbps = row16.gweights = per_second(static_cast<double>(nk), t[3]) / 1e9;
    row16.ratio = per_second(t[1], t[3]);
    row16.read_bandwidth_ratio = bw.gbps > 0 ? row16.gbps / bw.gbps : 0.0;
    row16.rel_diff = relative_difference(y_fp8_16.as<const float>().first(n), y_f32.as<const float>().first(n));
    results.push_back(row);
    results.push_back(row16);
    results.push_back(base);
    results.push_back(bw);
    step();
  }
}

}  // namespace

std::string GemmShape::name() const {
  return gemv ? "gemv:" + std::to_string(n) + "x" + std::to_string(k)
              : "gemm:" + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
}

std::vector<GemmShape> default_gemm_shapes() {
  return {{false, 2048, 2048, 2048}, {false, 4096, 4096, 4096}, {false, 16, 4096, 4096},
          {false, 64, 4096, 4096},   {true, 1, 8192, 8192},     {true, 1, 16384, 8192}};
}

int default_gemm_reps(const GemmShape& shape) {
  if (shape.gemv) return 11;
  const double volume = static_cast<double>(shape.m) * static_cast<double>(shape.n) * static_cast<double>(shape.k);
  if (volume < 1024.0 * 1024.0 * 1024.0) return 15;  // a few milliseconds each: more repetitions against noise
  return volume < 4096.0 * 4096.0 * 4096.0 ? 5 : 3;
}

const OpenBlasInfo& load_openblas() {
  return openblas().info;
}

std::vector<GemmResult> run_gemm_bench(const GemmBenchOptions& options, const std::function<void(int, int)>& progress) {
  load_openblas();
  const int total = static_cast<int>(options.shapes.size() * options.threads.size());
  int done = 0;
  const auto step = [&] {
    if (progress) progress(++done, total);
  };
  std::vector<GemmResult> results;
  for (const GemmShape& s : options.shapes) {
    const int reps = options.reps > 0 ? options.reps : default_gemm_reps(s);
    if (s.gemv)
      bench_gemv(s, options, reps, results, step);
    else
      bench_gemm(s, options, reps, results, step);
  }
  return results;
}

}  // namespace fp8kit::bench
