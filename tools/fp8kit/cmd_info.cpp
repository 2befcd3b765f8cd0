// `fp8kit info`: what this build and this machine run: version, build, compiler, CPU model and features, the ISA
// levels the CPU can run and the one in force (FP8KIT_ISA caps it), the kernel every family dispatches to and its
// results contract, threads, optional backends. A table by default, JSON with --json.
#include <fmt/core.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_common.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/version.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/ops/cuda_scaled_mm.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/tensor/cuda.hpp"

namespace fp8kit::cli {
namespace {

struct InfoOptions {
  bool json = false;
};

std::string joined(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

void run_info(const InfoOptions& o) {
  const BuildInfo build = build_info();
  const CpuFeatures& cpu = cpu_features();
  const Isa isa = active_isa();  // throws (one line, status 2) on an unknown FP8KIT_ISA
  const std::optional<std::string> env = isa_from_environment();
  std::vector<std::string> levels;
  for (Isa level : cpu_isa_levels()) levels.emplace_back(name(level));
  const MmKernels mm = mm_kernels();
  const std::string quantize = fmt::format("{} amax + {} encode", amax_kernel(), conversion_kernel());
  if (o.json) {
    nlohmann::ordered_json j;
    j["version"] = build.version;
    j["build_type"] = build.build_type;
    j["compiler"] = build.compiler;
    j["cpu"] = cpu.brand;
    j["features"] = cpu.names();
    j["levels"] = levels;
    j["isa"] = name(isa);
    j["isa_env"] = env ? nlohmann::ordered_json(*env) : nlohmann::ordered_json(nullptr);
    j["kernels"] = {{"convert", conversion_kernel()},  {"quantize", quantize},    {"gemm", mm.gemm},
                    {"gemm_small_m", mm.gemm_small_m}, {"gemm_f32", mm.gemm_f32}, {"gemv", mm.gemv},
                    {"gemv_f32", mm.gemv_f32}};
    j["contracts"] = {{"gemm", name(mm.gemm_contract)},
                      {"gemm_f32", name(mm.gemm_f32_contract)},
                      {"gemv", name(mm.gemv_contract)},
                      {"gemv_f32", name(mm.gemv_f32_contract)}};
    j["small_m_max"] = mm.small_m_max;
    j["gemv_max_m"] = mm.gemv_max_m;
    j["threads"] = num_threads();
    j["cuda"] = build.cuda;
    nlohmann::ordered_json devices = nlohmann::ordered_json::array();
    for (const cuda::DeviceInfo& d : cuda::devices()) {
      devices.push_back({{"index", d.index},
                         {"name", d.name},
                         {"compute_capability", std::to_string(d.major) + "." + std::to_string(d.minor)},
                         {"memory_bytes", d.memory_bytes},
                         {"multiprocessors", d.multiprocessors}});
    }
    j["cuda_runtime"] = {{"runtime_version", cuda::runtime_version()},
                         {"driver_version", cuda::driver_version()},
                         {"devices", devices},
                         {"unavailable", cuda::unavailable_reason()},
                         {"cublaslt", cuda::cublaslt_version()}};
    j["mpi"] = build.mpi;
    std::fprintf(output(), "%s\n", json_text(j).c_str());
    return;
  }
  std::fprintf(output(), "fp8kit %s (%s build, %s)\n", std::string(build.version).c_str(),
               std::string(build.build_type).c_str(), std::string(build.compiler).c_str());
  std::fprintf(output(), "CPU         %s\n", cpu.brand.c_str());
  std::fprintf(output(), "features    %s\n", joined(cpu.names(), " ").c_str());
  std::fprintf(output(), "ISA levels  %s (the levels this CPU runs, lowest first)\n", joined(levels, " ").c_str());
  std::fprintf(output(), "in force    %s%s\n", std::string(name(isa)).c_str(),
               env ? fmt::format(" (FP8KIT_ISA={})", *env).c_str() : "");
  std::fprintf(output(), "kernels     convert     %s\n", std::string(conversion_kernel()).c_str());
  std::fprintf(output(), "            quantize    %s\n", quantize.c_str());
  std::fprintf(output(), "            gemm        %s (%s)\n", std::string(mm.gemm).c_str(),
               std::string(name(mm.gemm_contract)).c_str());
  if (!mm.gemm_small_m.empty())
    std::fprintf(output(), "            gemm M<=%-3lld %s (%s)\n", static_cast<long long>(mm.small_m_max),
                 std::string(mm.gemm_small_m).c_str(), std::string(name(mm.gemm_contract)).c_str());
  std::fprintf(output(), "            gemm f32    %s (%s)\n", std::string(mm.gemm_f32).c_str(),
               std::string(name(mm.gemm_f32_contract)).c_str());
  std::fprintf(output(), "            gemv        %s (%s, M <= %lld)\n", std::string(mm.gemv).c_str(),
               std::string(name(mm.gemv_contract)).c_str(), static_cast<long long>(mm.gemv_max_m));
  std::fprintf(output(), "            gemv f32    %s (%s, M <= %lld)\n", std::string(mm.gemv_f32).c_str(),
               std::string(name(mm.gemv_f32_contract)).c_str(), static_cast<long long>(kGemvMaxM));
  std::fprintf(output(), "threads     %d (OpenMP; OMP_NUM_THREADS or --threads set it)\n", num_threads());
  std::fprintf(output(), "backends    CUDA %s, MPI %s\n", build.cuda ? "built" : "not built",
               build.mpi ? "built" : "not built");
  if (build.cuda) {
    const auto version = [](int v) {
      return v == 0 ? std::string("none") : fmt::format("{}.{}", v / 1000, v % 1000 / 10);
    };
    std::fprintf(output(), "CUDA        runtime %s, driver %s, cuBLASLt %s\n", version(cuda::runtime_version()).c_str(),
                 version(cuda::driver_version()).c_str(), cuda::cublaslt_version().c_str());
    const std::vector<cuda::DeviceInfo> devices = cuda::devices();
    if (devices.empty()) std::fprintf(output(), "            no device: %s\n", cuda::unavailable_reason().c_str());
    for (const cuda::DeviceInfo& d : devices) {
      std::fprintf(output(), "            cuda:%d %s, compute capability %d.%d, %.1f GiB, %d SMs\n", d.index,
                   d.name.c_str(), d.major, d.minor, static_cast<double>(d.memory_bytes) / (1 << 30),
                   d.multiprocessors);
    }
  }
}

}  // namespace

void add_info_command(CLI::App& app) {
  auto options = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "info", "This build and machine: CPU features, ISA levels, the kernel each family runs (FP8KIT_ISA caps them)");
  cmd->add_flag("--json", options->json, "Print one JSON object instead of the table");
  cmd->footer("FP8KIT_ISA=<level> caps every kernel family at that ISA level (one of " + isa_names() +
              "); a level above what the CPU has changes nothing.\n"
              "JSON keys: version, build_type, compiler, cpu, features, levels, isa, isa_env, kernels (convert, "
              "quantize, gemm,\n"
              "gemm_small_m, gemm_f32, gemv, gemv_f32), contracts, small_m_max, gemv_max_m, threads, cuda (built), "
              "cuda_runtime\n"
              "(runtime_version, driver_version, devices: index, name, compute_capability, memory_bytes, "
              "multiprocessors; unavailable: why there are none), mpi.");
  cmd->callback([options] { run_info(*options); });
}

}  // namespace fp8kit::cli
