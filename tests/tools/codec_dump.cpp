// Test helper for check_ml_dtypes.py: converts raw little-endian inputs with fp8kit and writes raw results.
//   codec_dump encode FORMAT SRC(f32|f64|bf16|f16) saturate(0|1) IN OUT   -> one code per input (bulk path;
//   f64: scalar) codec_dump decode FORMAT DST(f32|bf16|f16) IN OUT                      -> decoded values of
//   the codes in IN
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fp8kit/convert/convert.hpp"

using namespace fp8kit;

namespace {
std::vector<char> read_all(const char* path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
template <typename T>
std::vector<T> as(const std::vector<char>& raw) {
  std::vector<T> v(raw.size() / sizeof(T));
  std::memcpy(v.data(), raw.data(), v.size() * sizeof(T));
  return v;
}
template <typename T>
void write_all(const char* path, const std::vector<T>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  const auto format = parse_format(argv[2]);
  if (!format) return 2;
  const std::string type = argv[3];
  if (mode == "encode" && argc == 7) {
    const CastOptions options{*format, argv[4][0] == '1' ? Overflow::kSaturate : Overflow::kNonSaturating};
    const auto raw = read_all(argv[5]);
    std::vector<std::uint8_t> out;
    if (type == "f32") {
      const auto x = as<float>(raw);
      out.resize(x.size());
      cast_to_fp8(x, out, options);
    } else if (type == "bf16") {
      const auto x = as<bfloat16>(raw);
      out.resize(x.size());
      cast_to_fp8(x, out, options);
    } else if (type == "f16") {
      const auto x = as<float16>(raw);
      out.resize(x.size());
      cast_to_fp8(x, out, options);
    } else if (type == "f64") {
      for (double x : as<double>(raw)) out.push_back(encode(x, EncodeSpec{options.format, options.overflow}));
    } else {
      return 2;
    }
    write_all(argv[6], out);
    return 0;
  }
  if (mode == "decode" && argc == 6) {
    const auto codes = as<std::uint8_t>(read_all(argv[4]));
    if (type == "f32") {
      std::vector<float> out(codes.size());
      cast_from_fp8(codes, *format, out);
      write_all(argv[5], out);
    } else if (type == "bf16") {
      std::vector<bfloat16> out(codes.size());
      cast_from_fp8(codes, *format, out);
      write_all(argv[5], out);
    } else if (type == "f16") {
      std::vector<float16> out(codes.size());
      cast_from_fp8(codes, *format, out);
      write_all(argv[5], out);
    } else {
      return 2;
    }
    return 0;
  }
  return 2;
}
