// parse_strict_json: a UTF-8 validator (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF), then
// nlohmann-json with a parser callback that tracks the keys of each open object and the nesting depth.
#include "io/strict_json.hpp"

#include <cstdint>
#include <set>
#include <vector>

#include "fp8kit/common/error.hpp"

namespace fp8kit::detail {
namespace {

// The offset of the first byte that is not part of a well-formed UTF-8 sequence, or npos.
std::size_t first_invalid_utf8(std::string_view s) {
  std::size_t i = 0;
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  while (i < s.size()) {
    const unsigned char c = byte(i);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int length = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      length = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      length = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      length = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // past U+10FFFF
    } else {
      return i;
    }
    if (i + static_cast<std::size_t>(length) > s.size()) return i;
    if (byte(i + 1) < lo || byte(i + 1) > hi) return i;
    for (int k = 2; k < length; ++k) {
      if (byte(i + static_cast<std::size_t>(k)) < 0x80 || byte(i + static_cast<std::size_t>(k)) > 0xBF) return i;
    }
    i += static_cast<std::size_t>(length);
  }
  return std::string_view::npos;
}

// nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 4: ..." without the bracketed tag.

struct OpenObject {
  std::set<std::string> keys;
  std::string last_key;
};

}  // namespace

std::string nlohmann_reason(const std::string& what) {
  const std::size_t close = what.find("] ");
  return printable(close == std::string::npos ? what : what.substr(close + 2), 240);
}

bool is_valid_utf8(std::string_view text) {
  return first_invalid_utf8(text) == std::string_view::npos;
}

std::string json_kind(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::number_float:
      return "a fractional number";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "a number";
    default:
      return "an unexpected value";
  }
}

nlohmann::json parse_strict_json(std::string_view text, std::string_view what, int max_depth,
                                 const DuplicateKeyMessage& duplicate_message) {
  if (const std::size_t bad = first_invalid_utf8(text); bad != std::string_view::npos) {
    FP8KIT_THROW(ErrorKind::kParse, what, " is not valid UTF-8 (byte 0x", printable(text.substr(bad, 1)).substr(2),
                 " at offset ", bad, ")");
  }
  // nlohmann-json stops at a NUL as at the end of its input, so "{}\0<anything>" would parse: refuse raw NULs
  // (JSON allows none: inside strings they must be escaped, outside strings they are not whitespace).
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
    FP8KIT_THROW(ErrorKind::kParse, what, " is not valid JSON: a NUL byte at offset ", nul);
  }
  if (text.starts_with("\xEF\xBB\xBF")) {
    FP8KIT_THROW(ErrorKind::kParse, what, " starts with a UTF-8 byte-order mark, which JSON does not allow");
  }
  if (text.find_first_not_of(" \t\n\r") == std::string_view::npos) {
    FP8KIT_THROW(ErrorKind::kParse, what, " is empty (", text.size(), " bytes of whitespace)");
  }
  std::vector<OpenObject> open;  // the objects being parsed, outermost first
  const auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        if (depth > max_depth) {
          FP8KIT_THROW(ErrorKind::kParse, what, " nests deeper than its schema allows (", max_depth + 1, " levels)");
        }
        if (event == Event::object_start) open.emplace_back();
        break;
      case Event::key: {
        std::string key = parsed.get<std::string>();
        if (!open.empty()) {
          if (!open.back().keys.insert(key).second) {
            std::vector<std::string> parents;
            for (std::size_t i = 0; i + 1 < open.size(); ++i) parents.push_back(open[i].last_key);
            FP8KIT_THROW(ErrorKind::kParse, duplicate_message(parents, key));
          }
          open.back().last_key = std::move(key);
        }
        break;
      }
      case Event::object_end:
        if (!open.empty()) open.pop_back();
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true,
                                 /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    FP8KIT_THROW(ErrorKind::kParse, what, " is not valid JSON: ", nlohmann_reason(e.what()));
  }
}

}  // namespace fp8kit::detail
