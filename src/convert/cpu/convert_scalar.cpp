// The scalar conversion kernels: the codec of codec.hpp applied element by element. This is the reference the
// SIMD kernels are compared with, and the path for stochastic rounding.
#include <algorithm>
#include <array>
#include <bit>

#include "convert_kernels.hpp"
#include "fp8kit/format/codec_inline.hpp"

namespace fp8kit::convert_detail {
namespace {

float widen(float x) {
  return x;
}
float widen(bfloat16 x) {
  return x.to_float();
}
float widen(float16 x) {
  return x.to_float();
}

// The format, overflow policy and rounding are template parameters, and the codec is inlined whole (flatten: with 60
// instantiations in this file GCC stopped inlining its helpers and called max_code() and round_up() per value), so
// that its branches on them fold.
template <Format F, Overflow O, Rounding R, typename In>
[[gnu::flatten]] void encode_loop_for(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  constexpr const FormatDescriptor& d = descriptor(F);
  constexpr EncodeSpec spec{F, O, R};
  const CastOptions& o = p.options;
  auto random_bits = [&](std::size_t i) -> std::uint32_t {
    if constexpr (R == Rounding::kStochastic) return stochastic_bits(o.seed, o.stream_offset + i);
    return 0;
  };
  if (o.scale == 1.0f) {
    for (std::size_t i = 0; i < n; ++i)  // exact, in its own type
      out[i] = codec_detail::encode_unpacked(d, codec_detail::unpack(in[i]), spec, random_bits(i));
  } else {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = codec_detail::encode_unpacked(d, codec_detail::unpack(widen(in[i]) * o.scale), spec, random_bits(i));
  }
}

template <Format F, typename In>
void encode_loop_for(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  const bool saturate = p.options.overflow == Overflow::kSaturate;
  if (p.options.rounding == Rounding::kStochastic) {
    return saturate ? encode_loop_for<F, Overflow::kSaturate, Rounding::kStochastic>(in, out, n, p)
                    : encode_loop_for<F, Overflow::kNonSaturating, Rounding::kStochastic>(in, out, n, p);
  }
  return saturate ? encode_loop_for<F, Overflow::kSaturate, Rounding::kNearestEven>(in, out, n, p)
                  : encode_loop_for<F, Overflow::kNonSaturating, Rounding::kNearestEven>(in, out, n, p);
}

// One instantiation per format, so the descriptor's fields are constants inside the loop.
template <typename In>
void encode_loop(const In* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  switch (p.options.format) {
    case Format::e4m3fn:
      return encode_loop_for<Format::e4m3fn>(in, out, n, p);
    case Format::e5m2:
      return encode_loop_for<Format::e5m2>(in, out, n, p);
    case Format::e4m3fnuz:
      return encode_loop_for<Format::e4m3fnuz>(in, out, n, p);
    case Format::e5m2fnuz:
      return encode_loop_for<Format::e5m2fnuz>(in, out, n, p);
    case Format::e8m0fnu:
      return encode_loop_for<Format::e8m0fnu>(in, out, n, p);
  }
}

float narrow(float x, float) {
  return x;
}
bfloat16 narrow(float x, bfloat16) {
  return bfloat16::from_float(x);
}
float16 narrow(float x, float16) {
  return float16::from_float(x);
}

template <typename Out>
void decode_loop(const std::uint8_t* in, Out* out, std::size_t n, const DecodeParams& p) {
  for (std::size_t i = 0; i < n; ++i) {
    const float x = decode_to_float(p.format, in[i]);
    out[i] = narrow(p.scale_inv == 1.0f ? x : x * p.scale_inv, Out{});
  }
}

}  // namespace

void encode_tail(const float* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  encode_loop(in, out, n, p);
}
void encode_tail(const bfloat16* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  encode_loop(in, out, n, p);
}
void encode_tail(const float16* in, std::uint8_t* out, std::size_t n, const EncodeParams& p) {
  encode_loop(in, out, n, p);
}
void decode_tail(const std::uint8_t* in, float* out, std::size_t n, const DecodeParams& p) {
  decode_loop(in, out, n, p);
}
void decode_tail(const std::uint8_t* in, bfloat16* out, std::size_t n, const DecodeParams& p) {
  decode_loop(in, out, n, p);
}
void decode_tail(const std::uint8_t* in, float16* out, std::size_t n, const DecodeParams& p) {
  decode_loop(in, out, n, p);
}

void encode_segments_tail(const float* in, std::uint8_t* out, std::size_t n, std::size_t segment, const float* scales,
                          const EncodeParams& p) {
  EncodeParams q = p;
  for (std::size_t k = 0; k * segment < n; ++k) {
    q.options.scale = scales[k];
    encode_loop(in + k * segment, out + k * segment, std::min(segment, n - k * segment), q);
  }
}

void decode_segments_tail(const std::uint8_t* in, float* out, std::size_t n, std::size_t segment,
                          const float* scale_invs, const DecodeParams& p) {
  DecodeParams q = p;
  for (std::size_t k = 0; k * segment < n; ++k) {
    q.scale_inv = scale_invs[k];
    decode_loop(in + k * segment, out + k * segment, std::min(segment, n - k * segment), q);
  }
}

const KernelTable& scalar_kernels() {
  static const KernelTable table{
      "scalar",
      Isa::kScalar,
      KernelContract::kBitIdentical,
      &encode_loop<float>,
      &encode_segments_tail,
      &encode_loop<bfloat16>,
      &encode_loop<float16>,
      &decode_loop<float>,
      &decode_segments_tail,
      &decode_loop<bfloat16>,
      &decode_loop<float16>,
  };
  return table;
}

ShiftDecodeRule shift_decode_rule(Format format, bool to_f16) {
  const FormatDescriptor& d = descriptor(format);
  const int out_mantissa = to_f16 ? 10 : 7;
  const int out_bias = to_f16 ? 15 : 127;
  auto out_bits = [&](std::uint8_t code) {
    return to_f16 ? decode_to_float16(format, code).bits : decode_to_bfloat16(format, code).bits;
  };
  ShiftDecodeRule r{};
  r.shift = out_mantissa - d.mantissa_bits;
  r.rebias = static_cast<std::uint16_t>((out_bias - d.bias) * (1 << out_mantissa));
  for (int c = 0; c < 8; ++c) r.small_table[c] = out_bits(static_cast<std::uint8_t>(c));
  r.special_min = 0x100;
  r.inf_magnitude = 0x100;
  if (d.nan == NanEncoding::kAllOnes) r.special_min = 0x7F;
  if (d.nan == NanEncoding::kIeee) {
    r.special_min = static_cast<std::uint16_t>(d.max_exponent_field() << d.mantissa_bits);
    r.inf_magnitude = d.inf_code(false);
  }
  r.inf_bits = d.has_inf ? out_bits(d.inf_code(false)) : 0;
  r.nan_bits = out_bits(d.nan_code(false));
  r.nan_at_0x80 = d.nan == NanEncoding::kNegativeZero;
  r.nan_0x80_bits = r.nan_at_0x80 ? out_bits(0x80) : 0;
  return r;
}

std::optional<ByteDecodeRule> make_byte_decode_rule(Format format, bool to_f16) {
  const FormatDescriptor& d = descriptor(format);
  if (d.nan == NanEncoding::kUnsignedMax || d.mantissa_bits < 2 || d.mantissa_bits > 3) return std::nullopt;  // e8m0fnu
  auto out_bits = [&](int code) {
    const auto c = static_cast<std::uint8_t>(code);
    return to_f16 ? decode_to_float16(format, c).bits : decode_to_bfloat16(format, c).bits;
  };
  ByteDecodeRule r{};
  const ShiftDecodeRule shift = shift_decode_rule(format, to_f16);
  const int out_mantissa = to_f16 ? 10 : 7;
  r.table_high = !to_f16;
  // float16: (m << (10 - mantissa)) + ((15 - bias) << 10); its high byte is m >> (mantissa - 2) plus 4 (15 - bias).
  r.hi_shift = d.mantissa_bits - 2;
  r.hi_mask = static_cast<std::uint8_t>(0x7F >> r.hi_shift);
  r.hi_add = static_cast<std::uint8_t>((15 - d.bias) * 4);
  r.lo_shift = out_mantissa - d.mantissa_bits;
  r.lo_mask = static_cast<std::uint8_t>((0xFF << r.lo_shift) & 0xFF);
  r.lo_flip = !to_f16 && (127 - d.bias) % 2 != 0 ? 0x80 : 0x00;
  r.small_mask = static_cast<std::uint8_t>(0x7F & ~((1 << d.mantissa_bits) - 1));  // the exponent field
  r.special_min = static_cast<std::uint8_t>(std::min<int>(shift.special_min, 0x80));
  r.inf_magnitude = static_cast<std::uint8_t>(std::min<int>(shift.inf_magnitude, 0x80));
  r.inf_hi = static_cast<std::uint8_t>(shift.inf_bits >> 8);
  r.inf_lo = static_cast<std::uint8_t>(shift.inf_bits & 0xFF);
  r.nan_hi = static_cast<std::uint8_t>(shift.nan_bits >> 8);
  r.nan_lo = static_cast<std::uint8_t>(shift.nan_bits & 0xFF);
  r.nan80 = shift.nan_at_0x80;
  r.nan80_hi = static_cast<std::uint8_t>(shift.nan_0x80_bits >> 8);
  r.nan80_lo = static_cast<std::uint8_t>(shift.nan_0x80_bits & 0xFF);
  for (int c = 0; c < 8; ++c) {
    r.small_hi[c] = static_cast<std::uint8_t>(out_bits(c) >> 8);
    r.small_lo[c] = static_cast<std::uint8_t>(out_bits(c) & 0xFF);
  }
  for (int c = 0; c < 128; ++c) {
    if ((c & r.small_mask) == 0 || c >= r.special_min) continue;
    r.hi_table[(c >> 3) & 15] = static_cast<std::uint8_t>(out_bits(c) >> 8);
  }
  // What the kernel computes, code by code, against the codec.
  for (int c = 0; c < 256; ++c) {
    const int m = c & 0x7F, sign = c & 0x80;
    const int high = r.table_high ? r.hi_table[(c >> 3) & 15] : (((m >> r.hi_shift) & r.hi_mask) + r.hi_add) & 0xFF;
    int hi = high | sign, lo = ((c << r.lo_shift) & r.lo_mask) ^ r.lo_flip;
    if ((c & r.small_mask) == 0) hi = r.small_hi[c & 7] | sign, lo = r.small_lo[c & 7];
    if (m >= r.special_min) {
      const bool inf = m == r.inf_magnitude;
      hi = (inf ? r.inf_hi : r.nan_hi) | sign, lo = inf ? r.inf_lo : r.nan_lo;
    }
    if (r.nan80 && c == 0x80) hi = r.nan80_hi, lo = r.nan80_lo;
    if (((hi << 8) | lo) != out_bits(c)) return std::nullopt;
  }
  return r;
}

const ByteDecodeRule* byte_decode_rule(Format format, bool to_f16) {
  static const auto rules = [] {
    std::array<std::array<std::optional<ByteDecodeRule>, kAllFormats.size()>, 2> r;
    for (int f16 = 0; f16 < 2; ++f16)
      for (Format f : kAllFormats) r[f16][static_cast<std::size_t>(f)] = make_byte_decode_rule(f, f16 == 1);
    return r;
  }();
  const auto& rule = rules[to_f16 ? 1 : 0].at(static_cast<std::size_t>(format));
  return rule ? &*rule : nullptr;
}

EncodeParams make_encode_params(const CastOptions& options) {
  const FormatDescriptor& d = descriptor(options.format);
  EncodeParams p{};
  p.options = options;
  p.mantissa_bits = static_cast<std::uint32_t>(d.mantissa_bits);
  p.min_normal_bits = std::bit_cast<std::uint32_t>(static_cast<float>(min_normal(options.format)));
  p.rebias = static_cast<std::uint32_t>(127 - d.bias) << d.mantissa_bits;
  p.subnormal_magic_bits = static_cast<std::uint32_t>(127 + 24 - d.bias - d.mantissa_bits) << 23;
  p.overflow_code = encode(std::bit_cast<float>(0x7F800000u), EncodeSpec{options.format, options.overflow});
  p.nan_code = d.nan_code(false);
  p.sign_on_zero = d.has_negative_zero();
  p.overflow_bits = std::bit_cast<std::uint32_t>(overflow_threshold(options.format));
  return p;
}

template <typename In>
HalfEncodeRule half_encode_rule(const EncodeParams& p, Widen widen) {
  using H = Half16<In>;
  const auto u16 = [](std::uint32_t v) { return static_cast<std::uint16_t>(v); };
  const std::uint8_t max_code = descriptor(p.options.format).max_code();
  return {
      .magic_bits = widen == Widen::kShift ? p.subnormal_magic_bits - (112u << 23) : p.subnormal_magic_bits,
      .round_base = u16((1u << (H::kMantissa - 1 - p.mantissa_bits)) - 1u),
      .rebias = u16(p.rebias - (static_cast<std::uint32_t>(127 - H::kBias) << p.mantissa_bits)),
      .subnormal_below =
          u16(H::pow2_bits(static_cast<int>(p.min_normal_bits >> 23) - 127) >> (H::kMantissa - p.mantissa_bits)),
      .fold_code = p.options.overflow == Overflow::kSaturate ? max_code : p.overflow_code,
      .max_code = max_code,
      .overflow_code = p.overflow_code,
      .nan_code = p.nan_code,
  };
}
template HalfEncodeRule half_encode_rule<bfloat16>(const EncodeParams&, Widen);
template HalfEncodeRule half_encode_rule<float16>(const EncodeParams&, Widen);

}  // namespace fp8kit::convert_detail
