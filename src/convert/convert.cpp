// Entry points of the bulk conversions: check arguments, pick the kernel table for this CPU, split large
// arrays across threads. Results never depend on the kernel or the thread count (stochastic rounding included).
#include "fp8kit/convert.hpp"

#include <omp.h>

#include <algorithm>

#include "cpu/convert_kernels.hpp"
#include "fp8kit/cpu.hpp"
#include "fp8kit/error.hpp"

namespace fp8kit {
namespace convert_detail {

const KernelTable& avx512_kernels() {
  return cpu_features().avx512vbmi ? avx512_kernels_with_vbmi() : avx512_kernels_without_vbmi();
}

const detail::IsaTables<KernelTable>& kernel_tables() {
  static const detail::IsaTables<KernelTable> tables(
      {&scalar_kernels(), &avx2_kernels(), &avx512_kernels(), nullptr, nullptr});
  return tables;
}

}  // namespace convert_detail

namespace {

using convert_detail::active_kernels;

// Below this many elements one thread is faster than waking the others.
constexpr std::size_t kParallelThreshold = std::size_t{1} << 18;
// Chunk boundaries are multiples of this, so SIMD bodies stay full-width.
constexpr std::size_t kChunkAlign = 64;
using convert_detail::kStreamingBytes;

// Runs body(begin, end) over [0, n), in parallel when n is large.
template <typename Body>
void parallel_chunks(std::size_t n, const Body& body) {
  const int threads = num_threads();
  if (n < kParallelThreshold || threads <= 1) {
    body(std::size_t{0}, n);
    return;
  }
  const std::size_t per = (n / static_cast<std::size_t>(threads) + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const std::size_t begin = std::min(n, per * static_cast<std::size_t>(t));
    const std::size_t end = std::min(n, begin + per);
    if (begin < end) body(begin, end);
  }
}

template <typename In>
void cast_to_fp8_impl(std::span<const In> in, std::span<std::uint8_t> out, const CastOptions& options,
                      convert_detail::EncodeFn<In> kernel) {
  FP8KIT_CHECK(in.size() == out.size(), "cast_to_fp8: input has ", in.size(), " elements but output has ", out.size());
  if (in.empty()) return;
  convert_detail::EncodeParams params = convert_detail::make_encode_params(options);
  params.streaming_stores = out.size_bytes() >= kStreamingBytes;
  parallel_chunks(in.size(), [&](std::size_t begin, std::size_t end) {
    convert_detail::EncodeParams chunk = params;
    chunk.options.stream_offset += begin;
    kernel(in.data() + begin, out.data() + begin, end - begin, chunk);
  });
}

template <typename Out>
void cast_from_fp8_impl(std::span<const std::uint8_t> in, Format format, std::span<Out> out, float scale_inv,
                        convert_detail::DecodeFn<Out> kernel) {
  FP8KIT_CHECK(in.size() == out.size(), "cast_from_fp8: input has ", in.size(), " elements but output has ",
               out.size());
  if (in.empty()) return;
  const convert_detail::DecodeParams params{format, scale_inv, out.size_bytes() >= kStreamingBytes};
  parallel_chunks(in.size(), [&](std::size_t begin, std::size_t end) {
    kernel(in.data() + begin, out.data() + begin, end - begin, params);
  });
}

}  // namespace

void cast_to_fp8(std::span<const float> in, std::span<std::uint8_t> out, const CastOptions& options) {
  cast_to_fp8_impl(in, out, options, active_kernels().encode_f32);
}
void cast_to_fp8(std::span<const bfloat16> in, std::span<std::uint8_t> out, const CastOptions& options) {
  cast_to_fp8_impl(in, out, options, active_kernels().encode_bf16);
}
void cast_to_fp8(std::span<const float16> in, std::span<std::uint8_t> out, const CastOptions& options) {
  cast_to_fp8_impl(in, out, options, active_kernels().encode_f16);
}
void cast_from_fp8(std::span<const std::uint8_t> in, Format format, std::span<float> out, float scale_inv) {
  cast_from_fp8_impl(in, format, out, scale_inv, active_kernels().decode_f32);
}
void cast_from_fp8(std::span<const std::uint8_t> in, Format format, std::span<bfloat16> out, float scale_inv) {
  cast_from_fp8_impl(in, format, out, scale_inv, active_kernels().decode_bf16);
}
void cast_from_fp8(std::span<const std::uint8_t> in, Format format, std::span<float16> out, float scale_inv) {
  cast_from_fp8_impl(in, format, out, scale_inv, active_kernels().decode_f16);
}

std::string_view conversion_isa() {
  return name(active_kernels().isa);
}

std::string_view conversion_kernel() {
  return active_kernels().name;
}

}  // namespace fp8kit
