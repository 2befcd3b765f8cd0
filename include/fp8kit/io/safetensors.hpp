// safetensors files: the format's dtype registry, a memory-mapped reader that validates untrusted files at least
// as strictly as the reference implementation (each failure a specific one-line Error), and a crash-safe writer.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "fp8kit/tensor/dtype.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {

// ---------------------------------------------------------------- dtypes
// Every dtype of the safetensors format, spelled as in file headers, in the reference implementation's order
// (increasing alignment; its writer lays tensors out from the last of these to the first).
enum class SafetensorsDType : std::uint8_t {
  BOOL,
  F4,
  F6_E2M3,
  F6_E3M2,
  U8,
  I8,
  F8_E5M2,
  F8_E4M3,
  F8_E8M0,
  F8_E4M3FNUZ,
  F8_E5M2FNUZ,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  C64,
  F64,
  I64,
  U64,
};

struct SafetensorsDTypeInfo {
  SafetensorsDType dtype;
  std::string_view name;              // as in the header: "F8_E4M3"
  int bits;                           // per element: 4 for F4, 6 for F6_*, 64 for C64 (two float32)
  std::optional<DType> tensor_dtype;  // the fp8kit Tensor dtype with the same bits, where fp8kit has one
};

inline constexpr std::array<SafetensorsDTypeInfo, 22> kSafetensorsDTypes = {{
    {SafetensorsDType::BOOL, "BOOL", 8, DType::bool_},
    {SafetensorsDType::F4, "F4", 4, std::nullopt},
    {SafetensorsDType::F6_E2M3, "F6_E2M3", 6, std::nullopt},
    {SafetensorsDType::F6_E3M2, "F6_E3M2", 6, std::nullopt},
    {SafetensorsDType::U8, "U8", 8, DType::uint8},
    {SafetensorsDType::I8, "I8", 8, DType::int8},
    {SafetensorsDType::F8_E5M2, "F8_E5M2", 8, DType::float8_e5m2},
    {SafetensorsDType::F8_E4M3, "F8_E4M3", 8, DType::float8_e4m3fn},  // OCP e4m3fn: max 448, no Inf
    {SafetensorsDType::F8_E8M0, "F8_E8M0", 8, DType::float8_e8m0fnu},
    {SafetensorsDType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8, DType::float8_e4m3fnuz},
    {SafetensorsDType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8, DType::float8_e5m2fnuz},
    {SafetensorsDType::I16, "I16", 16, DType::int16},
    {SafetensorsDType::U16, "U16", 16, std::nullopt},
    {SafetensorsDType::F16, "F16", 16, DType::float16},
    {SafetensorsDType::BF16, "BF16", 16, DType::bfloat16},
    {SafetensorsDType::I32, "I32", 32, DType::int32},
    {SafetensorsDType::U32, "U32", 32, std::nullopt},
    {SafetensorsDType::F32, "F32", 32, DType::float32},
    {SafetensorsDType::C64, "C64", 64, std::nullopt},
    {SafetensorsDType::F64, "F64", 64, DType::float64},
    {SafetensorsDType::I64, "I64", 64, DType::int64},
    {SafetensorsDType::U64, "U64", 64, std::nullopt},
}};

constexpr const SafetensorsDTypeInfo& info(SafetensorsDType d) {
  return kSafetensorsDTypes[static_cast<int>(d)];
}
constexpr std::string_view name(SafetensorsDType d) {
  return info(d).name;
}
constexpr int bit_size(SafetensorsDType d) {
  return info(d).bits;
}
// The Tensor dtype of a safetensors dtype; nothing for U16, U32, U64, C64, F4 and F6_* (their bytes are still
// read and written, only not converted to a Tensor).
constexpr std::optional<DType> tensor_dtype(SafetensorsDType d) {
  return info(d).tensor_dtype;
}
// The safetensors dtype of a Tensor dtype: every DType has one.
constexpr SafetensorsDType safetensors_dtype(DType d) {
  for (const SafetensorsDTypeInfo& i : kSafetensorsDTypes) {
    if (i.tensor_dtype == d) return i.dtype;
  }
  return SafetensorsDType::U8;  // unreachable (checked below)
}
// Exact and case-sensitive, as the format: "F8_E4M3" yes, "f8_e4m3" and "float8_e4m3fn" no.
std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view text);

// The bytes of a tensor of `shape`, with checked arithmetic. Throws Error(kInvalidArgument) for a negative
// dimension, a size past 2^64 bits, or a sub-byte dtype whose elements do not fill whole bytes (F4 [3]).
std::uint64_t safetensors_byte_size(SafetensorsDType dtype, std::span<const std::int64_t> shape);

// The reference implementation's limit on the JSON header (100 MB), applied when reading and writing.
inline constexpr std::uint64_t kSafetensorsMaxHeaderSize = 100'000'000;

// ---------------------------------------------------------------- reading
// One tensor of a validated file.
struct SafetensorsTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::F32;
  Shape shape;                       // logical elements (F4 [4] is 2 bytes); {} is a scalar
  std::uint64_t begin = 0;           // data_offsets, relative to the start of the data section
  std::uint64_t end = 0;             // one past the last byte
  std::span<const std::byte> bytes;  // the tensor's bytes, little-endian, row-major (into the file's mapping)
  std::int64_t numel() const;
  // Error(kInvalidArgument) unless `bytes` are exactly safetensors_byte_size(dtype, shape): a parsed file's always
  // are; every function here that reads a tensor's bytes checks it first (one built by hand may view fewer).
  void check_bytes() const;
};

// A validated file image: what the header says, with each tensor's bytes located in the image.
struct SafetensorsView {
  std::vector<SafetensorsTensor> tensors;       // in file order (by data_offsets)
  std::map<std::string, std::string> metadata;  // `__metadata__`, empty when absent
  std::uint64_t header_size = 0;                // N: the JSON header's length; data starts at byte 8 + N
};

// Parses and validates a whole file image; the returned tensors' bytes point into `file`. Every malformed
// input throws Error(kParse) with one specific line (docs/checkpoints.md lists the rules): header length past
// 100 MB or past the end of the file, a header that is not UTF-8 or not a JSON object of the schema, duplicate
// keys at any level, unknown dtypes, non-string metadata values, sizes that overflow, a byte span that is not
// shape x dtype, offsets that do not tile the data section from 0 to the end of the file with no gap and no
// overlap. Leading and trailing JSON whitespace around the header is accepted, and so is a header not padded
// to 8 bytes. Unknown fields inside a tensor's entry are ignored, as the reference does.
SafetensorsView parse_safetensors(std::span<const std::byte> file);
// The view points into the image: parsing a temporary vector would leave it dangling.
SafetensorsView parse_safetensors(std::vector<std::byte>&& file) = delete;

namespace detail {
class MappedFile;
}

// A safetensors file, memory-mapped read-only and validated once when opened. Cheap to copy (copies share the
// mapping); the tensors' bytes stay valid as long as any copy lives, even if the file is replaced on disk
// (write_safetensors renames a new file into place and never writes into the old one). Truncating the file in
// place while it is mapped is the one thing it cannot survive (the OS sends SIGBUS), as with every mmap reader.
class SafetensorsFile {
 public:
  // Throws Error(kIo) when the file cannot be opened or mapped, Error(kParse) for every validation failure
  // (the message starts with the path), and Error(kInvalidArgument) for a pickle-based PyTorch file (.bin, .pt,
  // .pth, .ckpt, .pkl, or a zip/pickle file under any name): fp8kit never unpickles.
  static SafetensorsFile open(const std::filesystem::path& path);

  const std::filesystem::path& path() const noexcept { return path_; }
  // In file order (by data_offsets).
  const std::vector<SafetensorsTensor>& tensors() const noexcept { return view_.tensors; }
  const std::map<std::string, std::string>& metadata() const noexcept { return view_.metadata; }
  std::uint64_t header_size() const noexcept { return view_.header_size; }
  std::uint64_t file_size() const noexcept;
  // nullptr when there is no such tensor.
  const SafetensorsTensor* find(std::string_view name) const;
  // Throws Error(kInvalidArgument) naming the file when there is no such tensor.
  const SafetensorsTensor& at(std::string_view name) const;

 private:
  std::filesystem::path path_;
  std::shared_ptr<const detail::MappedFile> mapping_;
  SafetensorsView view_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
};

// A copy of a tensor's elements in a Tensor of its dtype. Throws Error(kUnsupported) for the dtypes without a
// Tensor dtype (U16, U32, U64, C64, F4, F6_*), and Error(kParse) for a BOOL byte other than 0 or 1.
Tensor to_tensor(const SafetensorsTensor& tensor);
// The same elements converted to `to` (as Tensor::to converts them) straight into `out` (numel x element_size(to)
// bytes, aligned to the element size), read from the file's bytes in place: no copy of the tensor, no Tensor of the
// result. Errors as to_tensor, and Error(kInvalidArgument) for an `out` of another size.
void convert_tensor_into(const SafetensorsTensor& tensor, DType to, Overflow overflow, std::span<std::byte> out);

// Whether a path names a pickle-based PyTorch file by its extension (.bin, .pt, .pth, .ckpt, .pkl, .pickle).
bool is_pickle_path(const std::filesystem::path& path);
// Throws Error(kInvalidArgument) saying why fp8kit refuses to load `path` (a pickle can run arbitrary code on
// load) and how to convert it.
[[noreturn]] void refuse_pickle(const std::filesystem::path& path);

// ---------------------------------------------------------------- writing
// One tensor to write: its bytes come from `bytes` or, when `fill` is set, from `fill`, which the writer calls
// once, when it reaches the tensor, with a buffer of exactly the tensor's size to fill (so a whole checkpoint
// need not be in memory at once; an exception from `fill` aborts the write and propagates unchanged).
struct SafetensorsEntry {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::F32;
  Shape shape;
  std::span<const std::byte> bytes;  // exactly safetensors_byte_size(dtype, shape) bytes, little-endian
  std::function<void(std::span<std::byte>)> fill;
};

// An entry viewing a Tensor's bytes (CPU tensors; keep `tensor` alive until written).
SafetensorsEntry safetensors_entry(std::string name, const Tensor& tensor);
// An entry viewing a tensor of an open file under its own name (copying between files; keep the file open).
SafetensorsEntry safetensors_entry(const SafetensorsTensor& tensor);

// The file image, laid out as the reference writer does: `__metadata__` first, tensors sorted by dtype
// alignment (largest first) then name, the JSON header padded with spaces to a multiple of 8 bytes so that every
// tensor is aligned to its element size. Throws Error(kInvalidArgument) for a duplicate name, the name
// "__metadata__", a name with a NUL, a byte span that is not shape x dtype, or a header past 100 MB.
std::vector<std::byte> serialize_safetensors(std::span<const SafetensorsEntry> entries,
                                             const std::map<std::string, std::string>& metadata = {});

// Writes the same image to `path`, crash-safely (AtomicFile): into a temporary file in the same directory,
// fsynced, renamed over `path`, then the directory fsynced. An existing file at `path` is never written to: a
// failure or a crash at any point leaves it as it was (or, once renamed, the complete new file). Entries are
// validated before anything is created. Errors: as serialize_safetensors, Error(kIo) when the OS refuses.
void write_safetensors(const std::filesystem::path& path, std::span<const SafetensorsEntry> entries,
                       const std::map<std::string, std::string>& metadata = {});

namespace detail {
constexpr bool safetensors_registry_is_consistent() {
  for (std::size_t i = 0; i < kSafetensorsDTypes.size(); ++i) {
    if (static_cast<std::size_t>(kSafetensorsDTypes[i].dtype) != i) return false;
  }
  for (DType d : kAllDTypes) {
    const auto& i = info(safetensors_dtype(d));
    if (i.tensor_dtype != d || i.bits != 8 * element_size(d)) return false;
  }
  return true;
}
static_assert(safetensors_registry_is_consistent(),
              "kSafetensorsDTypes must be in enum order, with one entry of the same size per DType");
}  // namespace detail

}  // namespace fp8kit
