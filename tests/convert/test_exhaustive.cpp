// Every float32 input (all 2^32 bit patterns) for every FP8 format and overflow policy: the fast kernels this
// CPU dispatches to must agree with the scalar reference on every one. Threads split the input space.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <bit>
#include <cstdio>
#include <vector>

#include "convert/kernels.hpp"

namespace fp8kit {
namespace {

using convert_detail::KernelTable;

TEST(Exhaustive, EveryFloat32Input) {
  const KernelTable& fast = convert_detail::best_kernels();
  const KernelTable& ref = convert_detail::scalar_kernels();
  if (&fast == &ref) {
    // On a machine without SIMD kernels there is nothing to compare; the scalar codec is checked elsewhere.
    std::printf("only the scalar kernels run on this CPU\n");
  }
  constexpr std::uint64_t kBlock = 1 << 16;
  constexpr std::uint64_t kBlocks = (std::uint64_t{1} << 32) / kBlock;
  for (Format f : kAllFormats) {
    for (Overflow o : {Overflow::kNonSaturating, Overflow::kSaturate}) {
      const auto params = convert_detail::make_encode_params(CastOptions{f, o});
      std::atomic<std::uint64_t> mismatches{0};
      std::atomic<std::uint32_t> first_bad{0};
#pragma omp parallel
      {
        std::vector<float> x(kBlock);
        std::vector<std::uint8_t> a(kBlock), b(kBlock);
#pragma omp for schedule(dynamic, 64)
        for (std::int64_t blk = 0; blk < static_cast<std::int64_t>(kBlocks); ++blk) {
          const auto base = static_cast<std::uint32_t>(static_cast<std::uint64_t>(blk) * kBlock);
          for (std::uint32_t i = 0; i < kBlock; ++i) x[i] = std::bit_cast<float>(base + i);
          fast.encode_f32(x.data(), a.data(), kBlock, params);
          ref.encode_f32(x.data(), b.data(), kBlock, params);
          for (std::uint32_t i = 0; i < kBlock; ++i) {
            if (a[i] != b[i] && mismatches.fetch_add(1) == 0) first_bad = base + i;
          }
        }
      }
      EXPECT_EQ(mismatches.load(), 0u) << fast.isa << " vs scalar, " << name(f)
                                       << (o == Overflow::kSaturate ? " saturating" : " non-saturating")
                                       << ", first mismatch at float bits 0x" << std::hex << first_bad.load();
      std::printf("%s %-8s %-15s 2^32 inputs, %llu mismatches\n", std::string(fast.isa).c_str(),
                  std::string(name(f)).c_str(), o == Overflow::kSaturate ? "saturating" : "non-saturating",
                  static_cast<unsigned long long>(mismatches.load()));
    }
  }
}

}  // namespace
}  // namespace fp8kit
