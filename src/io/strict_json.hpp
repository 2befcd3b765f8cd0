// Strict JSON for untrusted checkpoint files (UTF-8 checked first, duplicate keys refused at every level, nesting
// bounded) and one-line message helpers. Private to src/io: nlohmann-json stays out of the public headers.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fp8kit/common/text.hpp"

namespace fp8kit::detail {

// fp8kit/common/text.hpp's, under the names io has always used.
using fp8kit::printable;
using fp8kit::quoted;

// Whether `text` is well-formed UTF-8 (RFC 3629: no overlongs, no surrogates, nothing past U+10FFFF).
bool is_valid_utf8(std::string_view text);

// "an object", "an array", "a string", "a number", "a boolean", "null": for "must be X, not Y" messages.
std::string json_kind(const nlohmann::json& value);

// Builds the message for a duplicate `key` whose enclosing object is reached through the keys `parents`
// (empty for the top-level object).
using DuplicateKeyMessage = std::function<std::string(std::span<const std::string> parents, const std::string& key)>;

// The reason in one of nlohmann's exception messages, without its "[json.exception...] " prefix, made printable
// (nlohmann quotes the input it stopped at: raw bytes of an untrusted file).
std::string nlohmann_reason(const std::string& what);

// Parses `text` (which must be valid UTF-8, with no byte-order mark) into a JSON value. Containers nested
// deeper than `max_depth` (the top-level value is depth 0) are refused while parsing, before they are built.
// Throws Error(kParse) with messages starting with `what` ("the header", "the index"): not UTF-8, a BOM, empty,
// not JSON (nlohmann's position and reason), too deep, or a duplicate key (duplicate_message's text).
nlohmann::json parse_strict_json(std::string_view text, std::string_view what, int max_depth,
                                 const DuplicateKeyMessage& duplicate_message);

}  // namespace fp8kit::detail
