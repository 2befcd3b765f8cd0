// isa-emu blob: the AVX-512 level's FP8 -> bfloat16 decode (decode_avx512<bfloat16, kVbmi>,
// src/convert/cpu/convert_avx512.cpp): what left_rows_bf16 runs through cast_from_fp8 at the avx512-bf16 level,
// where the GEMV above reads its activations. shift_decode_rule's results come from the native library (the host
// passes their bytes); the scalar tail is the codec's table (the streaming variant's unaligned head); the encoders'
// helpers, which a decode never calls, trap.
#include "convert/cpu/convert_avx512.cpp"
#include "freestanding.hpp"

namespace fp8kit {
float16 decode_to_float16(Format, std::uint8_t) {
  __builtin_trap();
}
namespace convert_detail {
namespace {
unsigned char shift_rules[5][2][sizeof(ShiftDecodeRule)];
}  // namespace
ShiftDecodeRule shift_decode_rule(Format f, bool to_f16) {
  ShiftDecodeRule r;
  memcpy(&r, shift_rules[static_cast<int>(f)][to_f16 ? 1 : 0], sizeof r);
  return r;
}
void decode_tail(const std::uint8_t* in, bfloat16* out, std::size_t n, const DecodeParams& p) {
  if (p.scale_inv != 1.0f) __builtin_trap();
  for (std::size_t i = 0; i < n; ++i) out[i] = decode_to_bfloat16(p.format, in[i]);
}
void decode_tail(const std::uint8_t*, float16*, std::size_t, const DecodeParams&) {
  __builtin_trap();
}
void decode_tail(const std::uint8_t*, float*, std::size_t, const DecodeParams&) {
  __builtin_trap();
}
template <>
HalfEncodeRule half_encode_rule<float16>(const EncodeParams&, Widen) {
  __builtin_trap();
}
template <>
HalfEncodeRule half_encode_rule<bfloat16>(const EncodeParams&, Widen) {
  __builtin_trap();
}
void decode_segments_tail(const std::uint8_t*, float*, std::size_t, std::size_t, const float*, const DecodeParams&) {
  __builtin_trap();
}
void encode_segments_tail(const float*, std::uint8_t*, std::size_t, std::size_t, const float*, const EncodeParams&) {
  __builtin_trap();
}
}  // namespace convert_detail
}  // namespace fp8kit

extern "C" {
void set_up(const std::uint16_t* bf16_table, const unsigned char* rules) {
  emu::set_bf16_table(bf16_table);
  memcpy(fp8kit::convert_detail::shift_rules, rules, sizeof fp8kit::convert_detail::shift_rules);
}
void run_decode(const std::uint8_t* in, std::uint16_t* out, std::size_t n, int format, int stream) {
  using namespace fp8kit;
  const convert_detail::DecodeParams p{static_cast<Format>(format), 1.0f, stream != 0};
  convert_detail::decode_avx512<bfloat16, true>(in, reinterpret_cast<bfloat16*>(out), n, p);
}
}
