// The safetensors writer: entries validated and laid out as the reference writer does (dtype alignment, then
// name; header padded to 8 bytes), then streamed to memory, or to an AtomicFile by a writer thread while the next
// tensor is filled.
#include "fp8kit/io/safetensors.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
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

// A byte buffer that grows without initializing what it adds (a filled tensor overwrites all of it).
class ByteBuffer {
 public:
  std::byte* reserve(std::size_t n) {
    if (n > capacity_) {
      data_.reset(new std::byte[n]);  // default-initialized: no clearing pass, no page touched before the fill
      capacity_ = n;
    }
    return data_.get();
  }
  std::byte* data() const { return data_.get(); }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t capacity_ = 0;
};

// Where emit() writes. write() hands over bytes that stay valid until the buffer `slot` they live in is reused
// (slot -1: bytes that live until the end, the input's or the header's); free(slot) returns once that buffer's
// bytes are written, so it may be filled again; finish() once everything is written; abandon() drops what is not
// written yet and returns once nothing is being written (an error on emit's side, before its buffers go).
struct Sink {
  virtual ~Sink() = default;
  virtual void write(std::span<const std::byte> bytes, int slot) = 0;
  virtual void free(int slot) = 0;
  virtual void finish() = 0;
  virtual void abandon() noexcept = 0;
};

// Appends to a vector as it is given the bytes.
class MemorySink final : public Sink {
 public:
  explicit MemorySink(std::vector<std::byte>& out) : out_(out) {}
  void write(std::span<const std::byte> bytes, int) override { out_.insert(out_.end(), bytes.begin(), bytes.end()); }
  void free(int) override {}
  void finish() override {}
  void abandon() noexcept override {}

 private:
  std::vector<std::byte>& out_;
};

// Writes to an AtomicFile on a thread of its own, in order, so that the next tensor is computed while this one goes
// to the kernel (and, when the page cache pushes back, to the disk). Its errors come back from the next write(),
// free() or finish(); destroyed before finish() (an error on the other side), it stops and joins.
class WriteBehindSink final : public Sink {
 public:
  explicit WriteBehindSink(AtomicFile& file) : file_(file), thread_([this] { run(); }) {}
  ~WriteBehindSink() override {
    abandon();
    thread_.join();
  }
  void write(std::span<const std::byte> bytes, int slot) override {
    std::unique_lock lock(mutex_);
    rethrow();
    queue_.push_back({bytes, slot});
    if (slot >= 0) pending_[slot] = true;
    changed_.notify_all();
  }
  void free(int slot) override {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !pending_[slot] || error_; });
    rethrow();
  }
  void finish() override {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return (queue_.empty() && !writing_) || error_; });
    rethrow();
  }
  void abandon() noexcept override {
    std::unique_lock lock(mutex_);
    stop_ = true;
    queue_.clear();
    changed_.notify_all();
    changed_.wait(lock, [&] { return !writing_; });
  }

 private:
  struct Item {
    std::span<const std::byte> bytes;
    int slot;
  };
  void rethrow() {
    if (error_) std::rethrow_exception(error_);
  }
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_ || error_) return;
      const Item item = queue_.front();
      queue_.pop_front();
      writing_ = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        file_.write(item.bytes);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      writing_ = false;
      if (item.slot >= 0) pending_[item.slot] = false;
      if (error) error_ = error;
      changed_.notify_all();
      if (error_) return;
    }
  }

  AtomicFile& file_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Item> queue_;
  bool pending_[2] = {false, false};
  bool writing_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest is ready
};

// Streams the layout into `sink` through two buffers: each holds either one filled tensor or small tensors
// coalesced up to 1 MiB, and is filled while the other is being written. Tensors given as bytes (an input file's
// mapping) that do not fit the 1 MiB go to the sink as they are, without a copy.
void emit(const Layout& layout, Sink& sink) {
  constexpr std::size_t kChunk = std::size_t{1} << 20;
  ByteBuffer buffers[2];
  // Leaving by an exception (a fill's, or the sink's), nothing may still be writing from the buffers.
  struct Abandon {
    Sink& sink;
    ~Abandon() { sink.abandon(); }
  } abandon{sink};
  int slot = 0;
  std::size_t staged = 0;  // bytes coalesced in buffers[slot]
  const auto next_slot = [&] {
    slot ^= 1;
    sink.free(slot);
    staged = 0;
  };
  const auto flush = [&] {
    if (staged == 0) return;
    sink.write(std::span<const std::byte>(buffers[slot].data(), staged), slot);
    next_slot();
  };
  const auto stage = [&](std::span<const std::byte> bytes) {
    if (staged + bytes.size() > kChunk) flush();
    if (bytes.size() > kChunk) {
      sink.write(bytes, -1);
      return;
    }
    if (bytes.empty()) return;  // (an empty tensor's span may have no address)
    std::byte* at = buffers[slot].reserve(kChunk);
    std::memcpy(at + staged, bytes.data(), bytes.size());
    staged += bytes.size();
  };
  stage(layout.prefix);
  for (const Placed& p : layout.order) {
    if (!p.entry->fill) {
      stage(p.entry->bytes);
      continue;
    }
    flush();
    const auto n = static_cast<std::size_t>(p.bytes);
    std::byte* at = buffers[slot].reserve(std::max(n, kChunk));
    p.entry->fill(std::span<std::byte>(at, n));
    sink.write(std::span<const std::byte>(at, n), slot);
    next_slot();
  }
  flush();
  sink.finish();
}

// The file image into an open AtomicFile, written behind the fills.
void emit_to(AtomicFile& file, const Layout& layout) {
  WriteBehindSink sink(file);
  emit(layout, sink);
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
  MemorySink sink(out);
  emit(layout, sink);
  return out;
}

void detail::write_safetensors_to(AtomicFile& file, std::span<const SafetensorsEntry> entries,
                                  const std::map<std::string, std::string>& metadata) {
  emit_to(file, plan(entries, metadata));
}

void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> entries,
                       const std::map<std::string, std::string>& metadata) {
  const Layout layout = plan(entries, metadata);  // every check before anything is created
  AtomicFile file(path);
  emit_to(file, layout);
  file.commit();
}

}  // namespace fp8kit
