// CPU features and ISA levels: names, parsing, the ordered levels this CPU runs (with what each missing one lacks),
// and the programmatic cap on dispatch. (FP8KIT_ISA, read once per process, is tested through the CLI.)
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <set>
#include <stdexcept>
#include <string>

#include "common/isa_levels.hpp"
#include "common/parallel.hpp"
#include "fp8kit/common/cpu.hpp"

namespace fp8kit {
namespace {

TEST(Cpu, IsaNamesRoundTrip) {
  std::set<std::string> names;
  for (Isa isa : kAllIsas) {
    EXPECT_EQ(parse_isa(name(isa)), isa) << name(isa);
    names.insert(std::string(name(isa)));
  }
  EXPECT_EQ(names.size(), kAllIsas.size());
  EXPECT_EQ(isa_names(), "scalar, avx2, avx512, avx512-bf16, amx");
  EXPECT_EQ(parse_isa("avx512_bf16"), Isa::kAvx512Bf16);  // /proc/cpuinfo's spelling
  EXPECT_FALSE(parse_isa("avx512f").has_value());
  EXPECT_FALSE(parse_isa("AVX2").has_value());
  EXPECT_FALSE(parse_isa("").has_value());
}

TEST(Cpu, LevelsAreOrderedAndEachRunsOrNamesWhatIsMissing) {
  const std::vector<Isa> levels = cpu_isa_levels();
  ASSERT_FALSE(levels.empty());
  EXPECT_EQ(levels.front(), Isa::kScalar);
  EXPECT_EQ(levels.back(), cpu_max_isa());
  for (std::size_t i = 0; i < levels.size(); ++i) {
    EXPECT_EQ(levels[i], kAllIsas[i]);
    EXPECT_EQ(missing_for(levels[i]), "") << name(levels[i]);
  }
  for (Isa isa : kAllIsas) {
    if (isa > cpu_max_isa()) EXPECT_NE(missing_for(isa), "") << name(isa);
  }
  // The features behind the levels agree with them.
  const CpuFeatures& f = cpu_features();
  EXPECT_EQ(cpu_max_isa() >= Isa::kAvx2, f.avx2 && f.fma && f.f16c);
  EXPECT_EQ(cpu_max_isa() >= Isa::kAvx512,
            cpu_max_isa() >= Isa::kAvx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq);
  EXPECT_EQ(cpu_max_isa() >= Isa::kAmx,
            cpu_max_isa() >= Isa::kAvx512Bf16 && f.amx_tile && f.amx_bf16 && f.amx_permitted);
  const std::vector<std::string> names = f.names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "avx2"), f.avx2 ? 1 : 0);
  EXPECT_EQ(std::count(names.begin(), names.end(), "amx-bf16"), f.amx_bf16 ? 1 : 0);
  std::printf("CPU: %s; features:", f.brand.c_str());
  for (const std::string& n : names) std::printf(" %s", n.c_str());
  std::printf("\nlevels: %s\n", testing::level_report().c_str());
}

TEST(Cpu, SetMaxIsaCapsDispatch) {
  const Isa before = active_isa();
  for (Isa isa : kAllIsas) {
    set_max_isa(isa);
    EXPECT_EQ(active_isa(), std::min(isa, cpu_max_isa())) << name(isa);  // in place of FP8KIT_ISA, if set
  }
  EXPECT_EQ(max_isa_set(), kAllIsas.back());
  set_max_isa(std::nullopt);
  EXPECT_EQ(max_isa_set(), std::nullopt);
  EXPECT_EQ(active_isa(), before);
  {
    testing::ScopedIsa cap(Isa::kScalar);
    EXPECT_EQ(active_isa(), Isa::kScalar);
    {
      testing::ScopedIsa inner(Isa::kAvx2);
      EXPECT_EQ(max_isa_set(), Isa::kAvx2);
    }
    EXPECT_EQ(max_isa_set(), Isa::kScalar);  // the cap the inner scope replaced, put back
  }
  EXPECT_EQ(max_isa_set(), std::nullopt);
  EXPECT_EQ(active_isa(), before);
}

// An error inside an OpenMP region reaches the caller after it (thrown out of the region, it would end the process):
// the first one, and the guarded work after it is skipped; nothing is thrown when nothing failed.
TEST(RegionErrors, TheFirstErrorReachesTheCallerAfterTheRegion) {
  detail::RegionErrors none;
  std::atomic<int> ran{0};
#pragma omp parallel for num_threads(2) schedule(static)
  for (int i = 0; i < 8; ++i) none.guard([&] { ++ran; });
  EXPECT_NO_THROW(none.rethrow());
  EXPECT_EQ(ran.load(), 8);
  detail::RegionErrors errors;
  std::atomic<int> after{0};
#pragma omp parallel for num_threads(1) schedule(static)
  for (int i = 0; i < 8; ++i) {
    errors.guard([&] {
      if (i == 3) throw std::runtime_error("the third");
      if (i == 5) throw std::runtime_error("the fifth");
      if (i > 3) ++after;
    });
  }
  EXPECT_EQ(after.load(), 0);  // skipped once one failed (one thread: in the loop's order)
  try {
    errors.rethrow();
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the third");
  }
}

}  // namespace
}  // namespace fp8kit
