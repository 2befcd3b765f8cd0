// The safetensors reader on any bytes: parse_safetensors on the image and SafetensorsFile::open on the same bytes
// as a file agree; every tensor it accepts lies inside the image with shape x dtype bytes and converts (or is
// refused with one line); and what it accepts writes back (serialize_safetensors) into a file that reads back the
// same.
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "fp8kit/common/text.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace fp8kit;
using fuzz::check;

struct Seen {
  SafetensorsDType dtype;
  Shape shape;
  std::vector<std::byte> bytes;
  bool operator==(const Seen&) const = default;
};

std::map<std::string, Seen> by_name(const std::vector<SafetensorsTensor>& tensors) {
  std::map<std::string, Seen> out;
  for (const SafetensorsTensor& t : tensors) {
    check(out.emplace(t.name, Seen{t.dtype, t.shape, {t.bytes.begin(), t.bytes.end()}}).second,
          "two tensors named " + printable(t.name) + " accepted");
  }
  return out;
}

void check_view(const SafetensorsView& view, std::span<const std::byte> image) {
  const std::byte* begin = image.data();
  const std::byte* end = image.data() + image.size();
  for (const SafetensorsTensor& t : view.tensors) {
    check(t.bytes.empty() || (t.bytes.data() >= begin && t.bytes.data() + t.bytes.size() <= end),
          "tensor " + printable(t.name) + " points outside the image");
    check(t.bytes.size() == safetensors_byte_size(t.dtype, t.shape) && t.end - t.begin == t.bytes.size(),
          "tensor " + printable(t.name) + " has bytes other than shape x dtype");
    if (tensor_dtype(t.dtype)) fuzz::accepted([&] { (void)to_tensor(t); });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> image(reinterpret_cast<const std::byte*>(data), size);
  SafetensorsView view;
  const bool parsed = fuzz::accepted([&] { view = parse_safetensors(image); });
  if (parsed) check_view(view, image);

  // The same bytes as a file: the same verdict (a file may also be refused as a pickle), the same tensors.
  const auto path = fuzz::scratch() / "input.safetensors";
  fuzz::write_file(path, {data, size});
  std::optional<SafetensorsFile> file;
  const bool opened = fuzz::accepted([&] { file.emplace(SafetensorsFile::open(path)); });
  if (opened) {
    check(parsed, "SafetensorsFile::open accepted what parse_safetensors refused");
    check(by_name(file->tensors()) == by_name(view.tensors) && file->metadata() == view.metadata,
          "SafetensorsFile::open and parse_safetensors read different tensors");
  }
  if (!parsed) return 0;

  // What was read writes back, and the written image reads back the same.
  std::vector<SafetensorsEntry> entries;
  for (const SafetensorsTensor& t : view.tensors) entries.push_back(safetensors_entry(t));
  std::vector<std::byte> written;
  if (!fuzz::accepted([&] { written = serialize_safetensors(entries, view.metadata); })) return 0;
  SafetensorsView again;
  check(fuzz::accepted([&] { again = parse_safetensors(written); }), "a written image does not read back");
  check(by_name(again.tensors) == by_name(view.tensors) && again.metadata == view.metadata,
        "a written image reads back other tensors");
  return 0;
}
