// isa-emu blob: the AVX-512 level's conversion kernels (src/convert/cpu/convert_avx512.cpp): the FP8 -> bfloat16
// decode (decode_avx512<bfloat16, kVbmi>: what left_rows_bf16 runs through cast_from_fp8 at the avx512-bf16 level,
// where the GEMV reads its activations) and the encoders from bfloat16, float16 and float32 (encode_avx512<In>).
// The values the kernels take from the scalar level come from the native library (the host passes their bytes:
// shift_decode_rule's, half_encode_rule's for each case); the decode's scalar tail (the streaming variant's
// unaligned head) is the codec's table; what neither path calls traps.
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
namespace {
HalfEncodeRule half_rules[2][4];  // [bfloat16, float16][Widen]: this case's, from the host
}  // namespace
template <>
HalfEncodeRule half_encode_rule<bfloat16>(const EncodeParams&, Widen widen) {
  return half_rules[0][static_cast<int>(widen)];
}
template <>
HalfEncodeRule half_encode_rule<float16>(const EncodeParams&, Widen widen) {
  return half_rules[1][static_cast<int>(widen)];
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
// One encode case: the rules half_encode_rule returns (2 x 4, as convert_reference writes them), then
// encode_avx512<In> of n inputs (type 0 bfloat16, 1 float16, 2 float32) with the native EncodeParams p.
void run_encode(const void* in, std::uint8_t* out, std::size_t n, int type, const unsigned char* params_and_rules) {
  using namespace fp8kit;
  using namespace fp8kit::convert_detail;
  EncodeParams p;
  memcpy(&p, params_and_rules, sizeof p);
  memcpy(half_rules, params_and_rules + sizeof p, sizeof half_rules);
  if (type == 0) encode_avx512<bfloat16>(static_cast<const bfloat16*>(in), out, n, p);
  if (type == 1) encode_avx512<float16>(static_cast<const float16*>(in), out, n, p);
  if (type == 2) encode_avx512<float>(static_cast<const float*>(in), out, n, p);
}
void run_decode(const std::uint8_t* in, std::uint16_t* out, std::size_t n, int format, int stream) {
  using namespace fp8kit;
  const convert_detail::DecodeParams p{static_cast<Format>(format), 1.0f, stream != 0};
  convert_detail::decode_avx512<bfloat16, true>(in, reinterpret_cast<bfloat16*>(out), n, p);
}
}
