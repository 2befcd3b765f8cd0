// Every float32 input (all 2^32 bit patterns) for every FP8 format and overflow policy: every SIMD kernel table
// this CPU can run must agree with the scalar reference on every one. The reference is computed once per block
// and compared with each table; threads split the input space. The tables this CPU cannot run are named as
// skipped, with what it lacks.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <cstring>

#include "common/isa_levels.hpp"
#include "convert/cpu/convert_kernels.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/convert/cuda_convert.hpp"
#include "fp8kit/format/format.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {
namespace {

using convert_detail::KernelTable;

struct Candidate {
  const KernelTable* table;
  std::string skipped;  // why it cannot run here, or empty
};

std::vector<Candidate> candidates() {
  return {
      {&convert_detail::avx2_kernels(), testing::skip_reason(Isa::kAvx2)},
      {&convert_detail::avx512_kernels(), testing::skip_reason(Isa::kAvx512, true)},
      {&convert_detail::avx512_kernels_without_vbmi(), testing::skip_reason(Isa::kAvx512)},
  };
}

// The formats to check: the one FP8KIT_EXHAUSTIVE_FORMAT names (ctest runs one test per format, each on one
// thread, so that `ctest -j2` keeps each on a core of its own), or all of them when it is unset.
std::vector<Format> formats_to_check() {
  const char* only = std::getenv("FP8KIT_EXHAUSTIVE_FORMAT");
  if (only == nullptr) return {kAllFormats.begin(), kAllFormats.end()};
  const std::optional<Format> f = parse_format(only);
  if (!f) ADD_FAILURE() << "FP8KIT_EXHAUSTIVE_FORMAT=" << only << " is not a format";
  return f ? std::vector<Format>{*f} : std::vector<Format>{};
}

TEST(Exhaustive, EveryFloat32Input) {
  const std::vector<Format> formats = formats_to_check();
  std::vector<const KernelTable*> tables;
  for (const Candidate& c : candidates()) {
    // (tables that share their float32 encoder, as the two AVX-512 variants do, are checked once)
    if (c.skipped.empty() && (tables.empty() || tables.back()->encode_f32 != c.table->encode_f32)) {
      tables.push_back(c.table);
    } else if (!c.skipped.empty()) {
      std::printf("skipped %s: %s\n", std::string(c.table->name).c_str(), c.skipped.c_str());
    }
  }
  if (tables.empty())
    GTEST_SKIP() << "no SIMD kernel table runs on this CPU (" << testing::skip_reason(Isa::kAvx2)
                 << "); the scalar codec is checked in test_format";
  const KernelTable& ref = convert_detail::scalar_kernels();
  constexpr std::uint64_t kBlock = 1 << 16;
  constexpr std::uint64_t kBlocks = (std::uint64_t{1} << 32) / kBlock;
  for (Format f : formats) {
    for (Overflow o : {Overflow::kNonSaturating, Overflow::kSaturate}) {
      const auto params = convert_detail::make_encode_params(CastOptions{f, o});
      std::vector<std::atomic<std::uint64_t>> mismatches(tables.size());
      std::vector<std::atomic<std::uint32_t>> first_bad(tables.size());
#pragma omp parallel
      {
        std::vector<float> x(kBlock);
        std::vector<std::uint8_t> a(kBlock), b(kBlock);
#pragma omp for schedule(dynamic, 64)
        for (std::int64_t blk = 0; blk < static_cast<std::int64_t>(kBlocks); ++blk) {
          const auto base = static_cast<std::uint32_t>(static_cast<std::uint64_t>(blk) * kBlock);
          for (std::uint32_t i = 0; i < kBlock; ++i) x[i] = std::bit_cast<float>(base + i);
          ref.encode_f32(x.data(), b.data(), kBlock, params);
          for (std::size_t t = 0; t < tables.size(); ++t) {
            tables[t]->encode_f32(x.data(), a.data(), kBlock, params);
            for (std::uint32_t i = 0; i < kBlock; ++i) {
              if (a[i] != b[i] && mismatches[t].fetch_add(1) == 0) first_bad[t] = base + i;
            }
          }
        }
      }
      for (std::size_t t = 0; t < tables.size(); ++t) {
        EXPECT_EQ(mismatches[t].load(), 0u) << tables[t]->name << " vs scalar, " << name(f)
                                            << (o == Overflow::kSaturate ? " saturating" : " non-saturating")
                                            << ", first mismatch at float bits 0x" << std::hex << first_bad[t].load();
        std::printf("%-12s %-8s %-15s 2^32 inputs, %llu mismatches\n", std::string(tables[t]->name).c_str(),
                    std::string(name(f)).c_str(), o == Overflow::kSaturate ? "saturating" : "non-saturating",
                    static_cast<unsigned long long>(mismatches[t].load()));
      }
    }
  }
}

// The same on a CUDA device (skipped without one): every float32 bit pattern through cuda::cast_to_fp8 against the
// CPU's bulk cast, every format (or FP8KIT_EXHAUSTIVE_FORMAT's), both overflow policies, in chunks of 2^28 inputs
// that go to the device once for all of them.
TEST(Exhaustive, EveryFloat32InputOnCuda) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  const std::vector<Format> formats = formats_to_check();
  constexpr std::int64_t kChunk = std::int64_t{1} << 28;
  const Device gpu = Device::cuda(0);
  Tensor x = empty({kChunk}, DType::float32);
  Tensor want = empty({kChunk}, DType::float8_e4m3fn);  // codes, as bytes
  Tensor got_there = empty({kChunk}, DType::float8_e4m3fn, gpu);
  struct Count {
    Format f;
    Overflow o;
    std::uint64_t mismatches = 0;
    std::uint64_t first_bad = 0;
  };
  std::vector<Count> counts;
  for (Format f : formats)
    for (Overflow o : {Overflow::kNonSaturating, Overflow::kSaturate}) counts.push_back({f, o});
  for (std::int64_t base = 0; base < (std::int64_t{1} << 32); base += kChunk) {
    auto* bits = reinterpret_cast<std::uint32_t*>(x.raw());
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < kChunk; ++i) bits[i] = static_cast<std::uint32_t>(base + i);
    const Tensor there = x.to(gpu);
    for (Count& c : counts) {
      const CastOptions options{c.f, c.o};
      cast_to_fp8(x.span<float>(), want.span<std::uint8_t>(), options);
      cuda::cast_to_fp8(static_cast<const float*>(there.data_ptr()), static_cast<std::uint8_t*>(got_there.data_ptr()),
                        kChunk, options, 0);
      const Tensor got = got_there.to(Device::cpu());
      const std::uint8_t* a = got.span<std::uint8_t>().data();
      const std::uint8_t* b = want.span<std::uint8_t>().data();
      if (std::memcmp(a, b, static_cast<std::size_t>(kChunk)) == 0) continue;
      for (std::int64_t i = 0; i < kChunk; ++i) {
        if (a[i] != b[i] && c.mismatches++ == 0) c.first_bad = static_cast<std::uint64_t>(base + i);
      }
    }
  }
  for (const Count& c : counts) {
    EXPECT_EQ(c.mismatches, 0u) << "cuda vs cpu, " << name(c.f)
                                << (c.o == Overflow::kSaturate ? " saturating" : " non-saturating")
                                << ", first mismatch at float bits 0x" << std::hex << c.first_bad;
    std::printf("%-12s %-8s %-15s 2^32 inputs, %llu mismatches\n", "cuda", std::string(name(c.f)).c_str(),
                c.o == Overflow::kSaturate ? "saturating" : "non-saturating",
                static_cast<unsigned long long>(c.mismatches));
  }
}

}  // namespace
}  // namespace fp8kit
