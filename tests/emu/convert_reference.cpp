// Native helper of the isa-emu conversion checks (tests/emu/run.sh), linked against the native library:
//   convert_reference shift-rules        the bytes of shift_decode_rule(format, to_f16), five formats x both
//                                        targets, in hex, one per line (convert_avx512.cpp's set_up takes them)
//   convert_reference encode-cases DIR   the encode check's inputs and cases: DIR/inputs_{bf16,f16,f32}.bin and
//                                        DIR/cases.bin, each case with its EncodeParams, the HalfEncodeRules the
//                                        kernel asks for, and the codes the library computes (run it with
//                                        FP8KIT_ISA=scalar: the codec's codes)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "convert/cpu/convert_kernels.hpp"

namespace {

using namespace fp8kit;
using namespace fp8kit::convert_detail;

template <typename T>
void put(std::FILE* f, const T& v) {
  std::fwrite(&v, sizeof v, 1, f);
}

template <typename T>
void write_all(const std::string& path, const std::vector<T>& v) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fwrite(v.data(), sizeof(T), v.size(), f);
  std::fclose(f);
}

// Every 16-bit pattern; float32 values: each bfloat16 pattern with six low halves (round-to-odd's edges among them).
std::vector<std::uint16_t> every_half() {
  std::vector<std::uint16_t> v(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<std::uint16_t>(i);
  return v;
}
std::vector<float> floats() {
  std::vector<float> v;
  for (std::uint32_t hi = 0; hi < 65536; ++hi)
    for (const std::uint32_t lo : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const std::uint32_t bits = hi << 16 | lo;
      float x;
      std::memcpy(&x, &bits, sizeof x);
      v.push_back(x);
    }
  return v;
}

template <typename In>
std::vector<std::uint8_t> codes_of(const std::vector<In>& in, const CastOptions& o) {
  std::vector<std::uint8_t> out(in.size());
  cast_to_fp8(std::span<const In>(in), std::span<std::uint8_t>(out), o);
  return out;
}

int encode_cases(const std::string& dir) {
  const std::vector<std::uint16_t> halves = every_half();
  std::vector<bfloat16> bf16(halves.size());
  std::vector<float16> f16(halves.size());
  for (std::size_t i = 0; i < halves.size(); ++i) {
    bf16[i].bits = halves[i];
    f16[i].bits = halves[i];
  }
  const std::vector<float> f32 = floats();
  write_all(dir + "/inputs_bf16.bin", halves);
  write_all(dir + "/inputs_f16.bin", halves);
  write_all(dir + "/inputs_f32.bin", f32);
  std::FILE* f = std::fopen((dir + "/cases.bin").c_str(), "wb");
  if (f == nullptr) {
    std::perror("cases.bin");
    return 1;
  }
  put(f, static_cast<std::uint32_t>(sizeof(EncodeParams)));
  put(f, static_cast<std::uint32_t>(sizeof(HalfEncodeRule)));
  const Widen widens[] = {Widen::kUnpack, Widen::kShift, Widen::kCvt, Widen::kNone};
  for (int type = 0; type < 3; ++type)
    for (int format = 0; format < 5; ++format)
      for (const Overflow overflow : {Overflow::kSaturate, Overflow::kNonSaturating})
        for (const Rounding rounding : {Rounding::kNearestEven, Rounding::kStochastic})
          for (const float scale : {1.0f, 0.375f}) {
            CastOptions o{static_cast<Format>(format), overflow, rounding, scale};
            o.seed = 0x9E3779B97F4A7C15ull;
            o.stream_offset = 7;
            const EncodeParams p = make_encode_params(o);
            put(f, static_cast<std::uint8_t>(type));
            put(f, p);
            for (const Widen w : widens) put(f, half_encode_rule<bfloat16>(p, w));
            for (const Widen w : widens) put(f, half_encode_rule<float16>(p, w));
            const std::vector<std::uint8_t> codes = type == 0   ? codes_of(bf16, o)
                                                    : type == 1 ? codes_of(f16, o)
                                                                : codes_of(f32, o);
            std::fwrite(codes.data(), 1, codes.size(), f);
          }
  std::fclose(f);
  return 0;
}

int shift_rules() {
  for (int f = 0; f < 5; ++f) {
    for (const bool to_f16 : {false, true}) {
      const auto rule = shift_decode_rule(static_cast<Format>(f), to_f16);
      const auto* bytes = reinterpret_cast<const unsigned char*>(&rule);
      for (std::size_t i = 0; i < sizeof rule; ++i) std::printf("%02x", bytes[i]);
      std::printf("\n");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "shift-rules") return shift_rules();
  if (argc == 3 && std::string(argv[1]) == "encode-cases") return encode_cases(argv[2]);
  std::fprintf(stderr, "usage: convert_reference shift-rules | encode-cases DIR\n");
  return 2;
}
