// parse_strict_json: a UTF-8 validator (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF), then
// nlohmann-json's SAX parser with a handler of our own that builds the value, tracks the keys of each open object and
// the nesting depth. (nlohmann's parser-callback interface did the same in time quadratic in the number of keys: a
// header of 20,000 tensors took 2.4 s to parse, 100,000 over a minute.)
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

}  // namespace

// nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 4: ..." without the bracketed tag.
std::string nlohmann_reason(const std::string& what) {
  const std::size_t close = what.find("] ");
  return printable(close == std::string::npos ? what : what.substr(close + 2), 240);
}

namespace {

// Builds the value as nlohmann's own DOM parser does, refusing nesting deeper than `max_depth` (the top-level
// value is depth 0) and a key an open object already has, each with its one-line message.
class StrictSax {
 public:
  using json = nlohmann::json;
  StrictSax(json& root, std::string_view what, int max_depth, const DuplicateKeyMessage& duplicate_message)
      : root_(root), what_(what), max_depth_(max_depth), duplicate_message_(duplicate_message) {}

  bool null() { return put(json(nullptr)) != nullptr; }
  bool boolean(bool v) { return put(json(v)) != nullptr; }
  bool number_integer(json::number_integer_t v) { return put(json(v)) != nullptr; }
  bool number_unsigned(json::number_unsigned_t v) { return put(json(v)) != nullptr; }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(json(v)) != nullptr; }
  bool string(json::string_t& v) { return put(json(std::move(v))) != nullptr; }
  bool binary(json::binary_t& v) { return put(json(json::binary_t(std::move(v)))) != nullptr; }
  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& key) {
    Frame& top = frames_.back();
    if (!top.keys.insert(key).second) {
      std::vector<std::string> parents;  // the keys of the enclosing objects, outermost first
      for (std::size_t i = 0; i + 1 < frames_.size(); ++i) {
        if (frames_[i].value->is_object()) parents.push_back(frames_[i].last_key);
      }
      FP8KIT_THROW(ErrorKind::kParse, duplicate_message_(parents, key));
    }
    top.last_key = std::move(key);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    FP8KIT_THROW(ErrorKind::kParse, what_, " is not valid JSON: ", nlohmann_reason(e.what()));
  }

 private:
  struct Frame {
    json* value;
    std::set<std::string> keys;  // objects: the keys so far
    std::string last_key;
  };
  // The value's place: the root, the next element of the open array, or the open object's last key.
  json* put(json&& v) {
    if (frames_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *frames_.back().value;
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[frames_.back().last_key];
    slot = std::move(v);
    return &slot;
  }
  bool open(json::value_t type) {
    if (static_cast<int>(frames_.size()) > max_depth_) {
      FP8KIT_THROW(ErrorKind::kParse, what_, " nests deeper than its schema allows (", max_depth_ + 1, " levels)");
    }
    frames_.push_back({put(json(type)), {}, {}});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }

  json& root_;
  std::string_view what_;
  int max_depth_;
  const DuplicateKeyMessage& duplicate_message_;
  std::vector<Frame> frames_;  // the open containers, outermost first
};

}  // namespace

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
  nlohmann::json root;
  StrictSax sax(root, what, max_depth, duplicate_message);
  nlohmann::json::sax_parse(text.begin(), text.end(), &sax, nlohmann::json::input_format_t::json, /*strict=*/true,
                            /*ignore_comments=*/false);
  return root;
}

}  // namespace fp8kit::detail
