// The safetensors writer: entries validated and laid out as the reference writer does (dtype alignment, then
// name; header padded to 8 bytes), then streamed to memory or to an AtomicFile through a small coalescing buffer.
#include "fp8kit/io/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>

#include "fp8kit/common/error.hpp"
#include "fp8kit/io/atomic_file.hpp"
#include "io/safetensors_writer.hpp"
#include "io/strict_json.hpp"

namespace fp8kit {
namespace {

struct Placed {
  const SafetensorsEntry* entry;
  std::uint64_t bytes;
};

// The validated layout: the padded header (with its 8-byte length in front) and the tensors in file order.
struct Layout {
  std::vector<std::byte> prefix;
  std::vector<Placed> order;
};

Layout plan(std::span<const SafetensorsEntry> entries, const std::map<std::string, std::string>& metadata) {
  for (const auto& [key, value] : metadata) {
    FP8KIT_CHECK(detail::is_valid_utf8(key) && detail::is_valid_utf8(value), "metadata entry ", detail::quoted(key),
                 " is not valid UTF-8");
  }
  Layout layout;
  std::set<std::string_view> names;
  for (const SafetensorsEntry& e : entries) {
    FP8KIT_CHECK(e.name.find('\0') == std::string::npos, "tensor name ", detail::quoted(e.name),
                 " contains a NUL character");
    FP8KIT_CHECK(detail::is_valid_utf8(e.name), "tensor name ", detail::quoted(e.name), " is not valid UTF-8");
    FP8KIT_CHECK(e.name != "__metadata__", "'__metadata__' is reserved for the metadata and cannot name a tensor");
    FP8KIT_CHECK(names.insert(e.name).second, "duplicate tensor name ", detail::quoted(e.name));
    std::uint64_t bytes = 0;
    try {
      bytes = safetensors_byte_size(e.dtype, e.shape);
    } catch (const Error& error) {
      FP8KIT_THROW(error.kind(), "tensor ", detail::quoted(e.name), ": ", error.what());
    }
    FP8KIT_CHECK(e.fill || e.bytes.size() == bytes, "tensor ", detail::quoted(e.name), ": ", e.bytes.size(),
                 " bytes given but ", name(e.dtype), " ", shape_string(e.shape), " needs ", bytes);
    layout.order.push_back({&e, bytes});
  }
  // Largest alignment first, then by name: every tensor starts at a multiple of its element size.
  std::sort(layout.order.begin(), layout.order.end(), [](const Placed& a, const Placed& b) {
    return std::make_tuple(static_cast<int>(b.entry->dtype), std::string_view(a.entry->name)) <
           std::make_tuple(static_cast<int>(a.entry->dtype), std::string_view(b.entry->name));
  });

  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  for (const Placed& p : layout.order) {
    FP8KIT_CHECK(offset <= std::numeric_limits<std::uint64_t>::max() - p.bytes,
                 "the tensors hold more than 2^64 bytes");
    header[p.entry->name] = {{"dtype", std::string(name(p.entry->dtype))},
                             {"shape", p.entry->shape},
                             {"data_offsets", {offset, offset + p.bytes}}};
    offset += p.bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  FP8KIT_CHECK(text.size() <= kSafetensorsMaxHeaderSize, "the header would be ", text.size(),
               " bytes, more than the 100 MB limit of safetensors readers");
  layout.prefix.resize(8 + text.size());
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) layout.prefix[static_cast<std::size_t>(i)] = static_cast<std::byte>(n >> (8 * i));
  std::memcpy(layout.prefix.data() + 8, text.data(), text.size());
  return layout;
}

// Streams the layout into `sink` (a callable taking a span of bytes), coalescing small tensors into 1 MiB writes.
template <typename Sink>
void emit(const Layout& layout, Sink&& sink) {
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  std::vector<std::byte> staged(layout.prefix);
  std::vector<std::byte> filled;
  const auto flush = [&] {
    if (!staged.empty()) sink(std::span<const std::byte>(staged));
    staged.clear();
  };
  for (const Placed& p : layout.order) {
    std::span<const std::byte> bytes = p.entry->bytes;
    if (p.entry->fill) {
      filled.assign(static_cast<std::size_t>(p.bytes), std::byte{0});
      p.entry->fill(std::span<std::byte>(filled));
      bytes = filled;
    }
    if (staged.size() + bytes.size() <= kChunk) {
      staged.insert(staged.end(), bytes.begin(), bytes.end());
    } else {
      flush();
      sink(bytes);
    }
  }
  flush();
}

}  // namespace

SafetensorsEntry safetensors_entry(std::string name, const Tensor& tensor) {
  FP8KIT_CHECK(tensor.device().is_cpu(), "tensor ", detail::quoted(name),
               " is not on the CPU: copy it there to write it");
  const auto* p = tensor.raw();
  return {std::move(name),
          safetensors_dtype(tensor.dtype()),
          tensor.shape(),
          std::span<const std::byte>(p, static_cast<std::size_t>(tensor.nbytes())),
          {}};
}

SafetensorsEntry safetensors_entry(const SafetensorsTensor& tensor) {
  return {tensor.name, tensor.dtype, tensor.shape, tensor.bytes, {}};
}

std::vector<std::byte> serialize_safetensors(std::span<const SafetensorsEntry> entries,
                                             const std::map<std::string, std::string>& metadata) {
  const Layout layout = plan(entries, metadata);
  std::vector<std::byte> out;
  emit(layout, [&](std::span<const std::byte> bytes) { out.insert(out.end(), bytes.begin(), bytes.end()); });
  return out;
}

void detail::write_safetensors_to(AtomicFile& file, std::span<const SafetensorsEntry> entries,
                                  const std::map<std::string, std::string>& metadata) {
  const Layout layout = plan(entries, metadata);
  emit(layout, [&](std::span<const std::byte> bytes) { file.write(bytes); });
}

void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> entries,
                       const std::map<std::string, std::string>& metadata) {
  const Layout layout = plan(entries, metadata);  // every check before anything is created
  AtomicFile file(path);
  emit(layout, [&](std::span<const std::byte> bytes) { file.write(bytes); });
  file.commit();
}

}  // namespace fp8kit
