// Entry points of the bulk conversions: check arguments, pick the kernel table for this CPU, split large
// arrays across threads. Results never depend on the kernel or the thread count (stochastic rounding included).
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/convert/cuda_convert.hpp"

#include <omp.h>

#include <algorithm>

#include "common/disjoint.hpp"
#include "common/no_cuda.hpp"
#include "common/parallel.hpp"
#include "cpu/convert_kernels.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"

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

constexpr auto kParallelThreshold = static_cast<std::size_t>(detail::kParallelStreamElements);
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
  detail::check_disjoint("cast_to_fp8", "the input", in.data(), in.size_bytes(), out.data(), out.size_bytes());
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
  detail::check_disjoint("cast_from_fp8", "the input", in.data(), in.size_bytes(), out.data(), out.size_bytes());
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

Stores stores_for(std::size_t output_bytes) {
  return output_bytes >= kStreamingBytes ? Stores::kStreaming : Stores::kCached;
}

namespace {

// Checks the sizes of a segmented call: one scale for each segment of `segment` elements (the last may be shorter).
void check_segments(std::string_view op, std::size_t in, std::size_t out, std::size_t segment, std::size_t scales) {
  FP8KIT_CHECK(in == out, op, ": input has ", in, " elements but output has ", out);
  FP8KIT_CHECK(segment >= 1, op, ": segment must be at least 1 element");
  const std::size_t count = in == 0 ? 0 : (in - 1) / segment + 1;  // (in + segment - 1 wraps for a huge segment)
  FP8KIT_CHECK(scales == count, op, ": ", in, " elements in segments of ", segment, " need ", count, " scales, got ",
               scales);
}

}  // namespace

struct SegmentEncoder::Params {
  convert_detail::EncodeParams encode;
  const convert_detail::KernelTable* kernels;
};

SegmentEncoder::SegmentEncoder(Format format, Overflow overflow)
    : params_(std::make_unique<const Params>(
          Params{convert_detail::make_encode_params(CastOptions{format, overflow}), &active_kernels()})) {}
SegmentEncoder::~SegmentEncoder() = default;
SegmentEncoder::SegmentEncoder(SegmentEncoder&&) noexcept = default;
SegmentEncoder& SegmentEncoder::operator=(SegmentEncoder&&) noexcept = default;

void SegmentEncoder::encode(std::span<const float> in, std::span<std::uint8_t> out, float scale) const {
  FP8KIT_CHECK(in.size() == out.size(), "SegmentEncoder::encode: input has ", in.size(), " elements but output has ",
               out.size());
  if (in.empty()) return;
  detail::check_disjoint("SegmentEncoder::encode", "the input", in.data(), in.size_bytes(), out.data(),
                         out.size_bytes());
  convert_detail::EncodeParams p = params_->encode;
  p.options.scale = scale;
  params_->kernels->encode_f32(in.data(), out.data(), in.size(), p);
}

void SegmentEncoder::encode_segments(std::span<const float> in, std::span<std::uint8_t> out, std::size_t segment,
                                     std::span<const float> scales, std::size_t prefetch_ahead_bytes,
                                     Stores stores) const {
  check_segments("SegmentEncoder::encode_segments", in.size(), out.size(), segment, scales.size());
  if (in.empty()) return;
  detail::check_disjoint("SegmentEncoder::encode_segments", "the input", in.data(), in.size_bytes(), out.data(),
                         out.size_bytes());
  convert_detail::EncodeParams p = params_->encode;
  p.prefetch_ahead_bytes = prefetch_ahead_bytes;
  p.streaming_stores = stores == Stores::kStreaming;
  params_->kernels->encode_f32_segments(in.data(), out.data(), in.size(), segment, scales.data(), p);
}

void decode_segments(std::span<const std::uint8_t> in, Format format, std::span<float> out, std::size_t segment,
                     std::span<const float> scale_invs, Stores stores) {
  check_segments("decode_segments", in.size(), out.size(), segment, scale_invs.size());
  if (in.empty()) return;
  detail::check_disjoint("decode_segments", "the input", in.data(), in.size_bytes(), out.data(), out.size_bytes());
  active_kernels().decode_f32_segments(in.data(), out.data(), in.size(), segment, scale_invs.data(),
                                       convert_detail::DecodeParams{format, 1.0f, stores == Stores::kStreaming});
}

std::string_view conversion_isa() {
  return name(active_kernels().isa);
}

std::string_view conversion_kernel() {
  return active_kernels().name;
}

}  // namespace fp8kit

#ifndef FP8KIT_HAVE_CUDA
// The CPU-only build's CUDA casts (cuda_convert.hpp): there is no device to run them on.
namespace fp8kit::cuda {
void cast_to_fp8(const float*, std::uint8_t*, std::int64_t, const CastOptions&, int) {
  detail::throw_no_cuda_backend("cast_to_fp8");
}
void cast_to_fp8(const bfloat16*, std::uint8_t*, std::int64_t, const CastOptions&, int) {
  detail::throw_no_cuda_backend("cast_to_fp8");
}
void cast_to_fp8(const float16*, std::uint8_t*, std::int64_t, const CastOptions&, int) {
  detail::throw_no_cuda_backend("cast_to_fp8");
}
void cast_from_fp8(const std::uint8_t*, Format, float*, std::int64_t, float, int) {
  detail::throw_no_cuda_backend("cast_from_fp8");
}
void cast_from_fp8(const std::uint8_t*, Format, bfloat16*, std::int64_t, float, int) {
  detail::throw_no_cuda_backend("cast_from_fp8");
}
void cast_from_fp8(const std::uint8_t*, Format, float16*, std::int64_t, float, int) {
  detail::throw_no_cuda_backend("cast_from_fp8");
}
}  // namespace fp8kit::cuda
#endif
