// The strict JSON reader under every header and index (src/io/strict_json.hpp) on any text: what it accepts is
// valid UTF-8 without a byte-order mark, nested at most as deep as allowed, with no duplicate key, and its value
// written out (nlohmann's dump) reads back the same value; everything else is refused with one line.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "fuzz_support.hpp"
#include "io/strict_json.hpp"

namespace {

constexpr int kMaxDepth = 8;

int depth(const nlohmann::json& v) {
  int deepest = 0;
  if (v.is_structured()) {
    for (const auto& item : v) deepest = std::max(deepest, 1 + depth(item));
  }
  return deepest;
}

std::string duplicate(std::span<const std::string> parents, const std::string& key) {
  return "duplicate key " + fp8kit::quoted(key) + " at depth " + std::to_string(parents.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace fp8kit;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  nlohmann::json value;
  if (!fuzz::accepted([&] { value = detail::parse_strict_json(text, "the input", kMaxDepth, duplicate); })) return 0;
  fuzz::check(detail::is_valid_utf8(text) && !text.starts_with("\xEF\xBB\xBF"), "accepted text that is not UTF-8");
  // Containers are depth 0 at the top: a scalar inside the deepest container allowed adds one.
  fuzz::check(depth(value) <= kMaxDepth + 1, "accepted nesting deeper than the limit");
  const std::string written = value.dump();
  nlohmann::json again;
  fuzz::check(fuzz::accepted([&] { again = detail::parse_strict_json(written, "the output", kMaxDepth, duplicate); }),
              "what was read does not read back once written: " + written.substr(0, 200));
  fuzz::check(again == value, "what was read reads back as another value: " + written.substr(0, 200));
  return 0;
}
