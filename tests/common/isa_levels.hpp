// Tests run every kernel table against its reference once per ISA level: the levels as test parameters (a level
// this CPU cannot run is a skip that names what it lacks), a scoped cap on dispatch, and a one-line report.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <optional>
#include <string>

#include "fp8kit/common/cpu.hpp"

namespace fp8kit::testing {

// What this CPU lacks to run `isa` (and, if asked, VBMI): empty when it can. (FP8KIT_ISA does not matter here:
// ScopedIsa's cap replaces it, so every level the hardware has is tested.)
inline std::string skip_reason(Isa isa, bool needs_vbmi = false) {
  std::string missing = missing_for(isa);
  if (needs_vbmi && !cpu_features().avx512vbmi) missing += missing.empty() ? "avx512vbmi" : ", avx512vbmi";
  return missing.empty() ? "" : "this CPU lacks " + missing;
}

// GTEST_SKIP()s the calling test when the level cannot run here.
#define FP8KIT_SKIP_UNLESS_RUNS(isa, ...)                                                           \
  do {                                                                                              \
    const std::string fp8kit_skip = ::fp8kit::testing::skip_reason(isa __VA_OPT__(, ) __VA_ARGS__); \
    if (!fp8kit_skip.empty()) GTEST_SKIP() << ::fp8kit::name(isa) << ": " << fp8kit_skip;           \
  } while (false)

// Caps dispatch at a level for one scope (the public entries then run that level's kernels).
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa cap) : before_(max_isa_set()) { set_max_isa(cap); }
  ~ScopedIsa() { set_max_isa(before_); }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  std::optional<Isa> before_;  // the cap it replaced, put back (nested scopes)
};

// "ran scalar, avx2, avx512; skipped amx (this CPU lacks amx-tile)" for the levels in kAllIsas.
inline std::string level_report() {
  std::string ran, skipped;
  for (Isa isa : kAllIsas) {
    const std::string why = skip_reason(isa);
    std::string& into = why.empty() ? ran : skipped;
    if (!into.empty()) into += ", ";
    into += std::string(name(isa)) + (why.empty() ? "" : " (" + why + ")");
  }
  return "ran " + ran + (skipped.empty() ? "; skipped none" : "; skipped " + skipped);
}

// Test-name suffixes for parameters of type Isa ("avx512_bf16": gtest names allow no '-').
inline std::string isa_param_name(const ::testing::TestParamInfo<Isa>& info) {
  std::string s(name(info.param));
  for (char& c : s) {
    if (c == '-') c = '_';
  }
  return s;
}

}  // namespace fp8kit::testing
