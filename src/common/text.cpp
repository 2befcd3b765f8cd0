// printable / quoted: untrusted text made safe for one line.
#include "fp8kit/common/text.hpp"

namespace fp8kit {

std::string printable(std::string_view text, std::size_t limit) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (i == limit) {
      out += "...";
      break;
    }
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string quoted(std::string_view name) {
  std::string out(1, '\'');  // appended piecewise: "'" + std::string trips a false -Wrestrict in GCC 12
  out += printable(name);
  out += '\'';
  return out;
}

}  // namespace fp8kit
