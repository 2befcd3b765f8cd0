// The safetensors reader: header length, strict JSON header (schema, dtypes, metadata), checked sizes, offsets
// tiling the data section from 0 to the end of the file; SafetensorsFile over a mapping; pickle refusal.
#include "fp8kit/io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstring>
#include <limits>
#include <tuple>

#include "fp8kit/common/error.hpp"
#include "io/mapped_file.hpp"
#include "io/strict_json.hpp"

namespace fp8kit {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; fp8kit reads and writes it without byte swapping");

namespace {

using detail::json_kind;
using detail::printable;
using nlohmann::json;

#define ST_FAIL(...) FP8KIT_THROW(ErrorKind::kParse, __VA_ARGS__)

constexpr std::string_view kPickleAdvice =
    "fp8kit does not load pickles (they can run arbitrary code); convert it to .safetensors where you trust it "
    "(safetensors' convert script, or torch.load + safetensors.torch.save_file)";

std::string known_dtypes() {
  std::string s;
  for (const SafetensorsDTypeInfo& i : kSafetensorsDTypes) s += (s.empty() ? "" : ", ") + std::string(i.name);
  return s;
}

// A JSON number that is a non-negative integer (serde's usize: "-0" is 0, fractions and negatives are not).
std::optional<std::uint64_t> as_unsigned(const json& v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer() && v.get<std::int64_t>() == 0) return 0;
  return std::nullopt;
}

// Whether the first bytes are a zip archive (torch.save since PyTorch 1.6) or a raw pickle (protocol 2-5).
std::optional<std::string> pickle_signature(std::span<const std::byte> file) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(file[i]); };
  if (file.size() >= 4 && b(0) == 'P' && b(1) == 'K' && b(2) == 3 && b(3) == 4) {
    return "a zip archive, as torch.save writes (with a pickle inside)";
  }
  if (file.size() >= 2 && b(0) == 0x80 && b(1) >= 2 && b(1) <= 5) {
    return "a Python pickle (protocol " + std::to_string(b(1)) + ")";
  }
  return std::nullopt;
}

std::uint64_t read_le64(std::span<const std::byte> file) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<std::uint64_t>(file[static_cast<std::size_t>(i)]);
  return n;
}

// The field `key` of a tensor's entry; throws when it is missing.
const json& field(const json& entry, const std::string& name, const char* key) {
  const auto it = entry.find(key);
  if (it == entry.end()) ST_FAIL("tensor ", detail::quoted(name), ": the entry has no \"", key, "\"");
  return *it;
}

SafetensorsTensor parse_entry(const std::string& name, const json& entry) {
  if (name.find('\0') != std::string::npos) ST_FAIL("tensor name ", detail::quoted(name), " contains a NUL character");
  if (!entry.is_object()) {
    ST_FAIL("tensor ", detail::quoted(name), ": the entry must be an object with dtype, shape and data_offsets, not ",
            json_kind(entry));
  }
  SafetensorsTensor t;
  t.name = name;
  const json& dtype = field(entry, name, "dtype");
  if (!dtype.is_string()) ST_FAIL("tensor ", detail::quoted(name), ": dtype must be a string, not ", json_kind(dtype));
  const auto parsed = parse_safetensors_dtype(dtype.get_ref<const std::string&>());
  if (!parsed) {
    ST_FAIL("tensor ", detail::quoted(name), ": unknown dtype ", detail::quoted(dtype.get_ref<const std::string&>()),
            " (safetensors dtypes: ", known_dtypes(), ")");
  }
  t.dtype = *parsed;
  const json& shape = field(entry, name, "shape");
  if (!shape.is_array()) ST_FAIL("tensor ", detail::quoted(name), ": shape must be an array, not ", json_kind(shape));
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const auto dim = as_unsigned(shape[i]);
    if (!dim) {
      ST_FAIL("tensor ", detail::quoted(name), ": shape[", i, "] must be a non-negative integer, not ",
              shape[i].is_number() ? printable(shape[i].dump()) : json_kind(shape[i]));
    }
    if (*dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      ST_FAIL("tensor ", detail::quoted(name), ": shape[", i, "] is ", *dim, ", more than 2^63 - 1");
    }
    t.shape.push_back(static_cast<std::int64_t>(*dim));
  }
  const json& offsets = field(entry, name, "data_offsets");
  const bool pair = offsets.is_array() && offsets.size() == 2;
  const auto begin = pair ? as_unsigned(offsets[0]) : std::nullopt;
  const auto end = pair ? as_unsigned(offsets[1]) : std::nullopt;
  if (!begin || !end) {
    ST_FAIL("tensor ", detail::quoted(name), ": data_offsets must be two non-negative integers [begin, end], not ",
            printable(offsets.dump(), 60));
  }
  t.begin = *begin;
  t.end = *end;
  if (t.end < t.begin)
    ST_FAIL("tensor ", detail::quoted(name), ": data_offsets [", t.begin, ", ", t.end, "] end before they begin");
  std::uint64_t bytes = 0;
  try {
    bytes = safetensors_byte_size(t.dtype, t.shape);
  } catch (const Error& e) {
    ST_FAIL("tensor ", detail::quoted(name), ": ", e.what());
  }
  if (t.end - t.begin != bytes) {
    ST_FAIL("tensor ", detail::quoted(name), ": data_offsets [", t.begin, ", ", t.end, "] but ", fp8kit::name(t.dtype),
            " ", shape_string(t.shape), " needs ", bytes, " byte", bytes == 1 ? "" : "s");
  }
  return t;
}

std::map<std::string, std::string> parse_metadata(const json& value) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;  // the reference reads null as "no metadata"
  if (!value.is_object()) ST_FAIL("__metadata__ must be an object of strings, not ", json_kind(value));
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) ST_FAIL("__metadata__ value of ", detail::quoted(key), " must be a string, not ", json_kind(v));
    metadata.emplace(key, v.get<std::string>());
  }
  return metadata;
}

std::string duplicate_key_message(std::span<const std::string> parents, const std::string& key) {
  if (parents.empty()) {
    return key == "__metadata__" ? std::string("duplicate key '__metadata__'")
                                 : "duplicate tensor name " + detail::quoted(key);
  }
  if (parents.front() == "__metadata__") return "duplicate metadata key " + detail::quoted(key);
  return "tensor " + detail::quoted(parents.front()) + ": duplicate field " + detail::quoted(key);
}

}  // namespace

// ---------------------------------------------------------------- dtypes and sizes

std::optional<SafetensorsDType> parse_safetensors_dtype(std::string_view text) {
  for (const SafetensorsDTypeInfo& i : kSafetensorsDTypes) {
    if (i.name == text) return i.dtype;
  }
  return std::nullopt;
}

std::uint64_t safetensors_byte_size(SafetensorsDType dtype, std::span<const std::int64_t> shape) {
  std::uint64_t numel = 1;
  for (std::int64_t dim : shape) {
    FP8KIT_CHECK(dim >= 0, "shape ", shape_string(shape), " has a negative dimension");
    const auto d = static_cast<std::uint64_t>(dim);
    FP8KIT_CHECK(d == 0 || numel <= std::numeric_limits<std::uint64_t>::max() / d, "shape ", shape_string(shape),
                 " has more than 2^64 elements");
    numel *= d;
  }
  FP8KIT_CHECK(numel <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()), "shape ",
               shape_string(shape), " has more than 2^63 - 1 elements");
  const auto bits = static_cast<std::uint64_t>(bit_size(dtype));
  FP8KIT_CHECK(numel <= std::numeric_limits<std::uint64_t>::max() / bits, name(dtype), " ", shape_string(shape),
               " is more than 2^64 bits");
  FP8KIT_CHECK(numel * bits % 8 == 0, name(dtype), " ", shape_string(shape), " is ", numel * bits,
               " bits, not a whole number of bytes");
  return numel * bits / 8;
}

void SafetensorsTensor::check_bytes() const {
  const std::uint64_t expected = safetensors_byte_size(dtype, shape);
  FP8KIT_CHECK(bytes.size() == expected, "tensor ", detail::quoted(name), ": ", bytes.size(), " bytes for ",
               fp8kit::name(dtype), " ", shape_string(shape), ", which takes ", expected);
}

std::int64_t SafetensorsTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------- parsing

SafetensorsView parse_safetensors(std::span<const std::byte> file) {
  if (file.size() < 8) ST_FAIL("the file is ", file.size(), " bytes, too short for the 8-byte header length");
  const std::uint64_t n = read_le64(file);
  const std::uint64_t after_length = file.size() - 8;
  if (n > kSafetensorsMaxHeaderSize || n > after_length) {
    if (const auto pickle = pickle_signature(file))
      ST_FAIL("not a safetensors file but ", *pickle, ": ", kPickleAdvice);
    // A safetensors header is a JSON object right after its length: anything else is another kind of file.
    if (file.size() > 8 && file[8] != std::byte{'{'})
      ST_FAIL("not a safetensors file: no JSON header ('{') after the 8-byte header length (those bytes read as ", n,
              ")");
    if (n > kSafetensorsMaxHeaderSize) ST_FAIL("header length ", n, " exceeds the 100 MB limit");
    ST_FAIL("header length ", n, " runs past the end of the file (", after_length, " bytes follow the length)");
  }
  SafetensorsView view;
  view.header_size = n;
  const std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, static_cast<std::size_t>(n));
  // Depth 2: the header object, tensor entries and __metadata__, the shape and data_offsets arrays.
  const json root = detail::parse_strict_json(text, "the header", 2, duplicate_key_message);
  if (!root.is_object()) ST_FAIL("the header must be a JSON object, not ", json_kind(root));

  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      view.metadata = parse_metadata(value);
    } else {
      view.tensors.push_back(parse_entry(key, value));
    }
  }
  // In file order; ties (empty tensors at one offset) by name, so that errors and listings are deterministic.
  std::sort(view.tensors.begin(), view.tensors.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  const std::uint64_t data_size = after_length - n;
  const std::byte* data = file.data() + 8 + n;
  std::uint64_t position = 0;
  const SafetensorsTensor* previous = nullptr;
  for (SafetensorsTensor& t : view.tensors) {
    if (t.begin != position) {
      if (previous == nullptr) {
        ST_FAIL("tensor ", detail::quoted(t.name), " starts at ", t.begin,
                " but the data section starts at 0 (offsets must be contiguous)");
      }
      if (t.begin > position) {
        ST_FAIL("tensor ", detail::quoted(t.name), " starts at ", t.begin, " but the previous tensor ",
                detail::quoted(previous->name), " ends at ", position, " (offsets must be contiguous)");
      }
      ST_FAIL("tensor ", detail::quoted(t.name), " starts at ", t.begin, " inside the previous tensor ",
              detail::quoted(previous->name), " [", previous->begin, ", ", position, ") (tensors must not overlap)");
    }
    if (t.end > data_size) {
      ST_FAIL("tensor ", detail::quoted(t.name), " ends at ", t.end, " but the data section holds ", data_size,
              " bytes (a truncated file?)");
    }
    t.bytes = std::span<const std::byte>(data + t.begin, static_cast<std::size_t>(t.end - t.begin));
    position = t.end;
    previous = &t;
  }
  if (position != data_size) {
    ST_FAIL("the tensors end at ", position, " but the data section holds ", data_size,
            " bytes (trailing bytes are not allowed)");
  }
  return view;
}

// ---------------------------------------------------------------- files

bool is_pickle_path(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".ckpt" || ext == ".pkl" || ext == ".pickle";
}

void refuse_pickle(const std::filesystem::path& path) {
  FP8KIT_THROW(ErrorKind::kInvalidArgument, "'", printable(path.string(), 400),
               "' is a pickle-based PyTorch file: ", kPickleAdvice);
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  if (is_pickle_path(path)) refuse_pickle(path);
  SafetensorsFile f;
  f.path_ = path;
  f.mapping_ = std::make_shared<const detail::MappedFile>(path);
  try {
    f.view_ = parse_safetensors(f.mapping_->bytes());
  } catch (const Error& e) {
    FP8KIT_THROW(e.kind(), path.string(), ": ", e.what());
  }
  for (std::size_t i = 0; i < f.view_.tensors.size(); ++i) f.by_name_.emplace(f.view_.tensors[i].name, i);
  return f;
}

std::uint64_t SafetensorsFile::file_size() const noexcept {
  return mapping_ ? mapping_->bytes().size() : 0;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &view_.tensors[it->second];
}

const SafetensorsTensor& SafetensorsFile::at(std::string_view name) const {
  const SafetensorsTensor* t = find(name);
  FP8KIT_CHECK(t != nullptr, "no tensor ", detail::quoted(name), " in ", path_.string());
  return *t;
}

namespace {

// The tensor's Tensor dtype, or Error(kUnsupported).
DType tensor_dtype_of(const SafetensorsTensor& t) {
  const auto dtype = tensor_dtype(t.dtype);
  FP8KIT_CHECK_KIND(dtype.has_value(), ErrorKind::kUnsupported, "tensor ", detail::quoted(t.name), ": ", name(t.dtype),
                    " has no fp8kit Tensor dtype (its bytes are in SafetensorsTensor::bytes)");
  return *dtype;
}

}  // namespace

void convert_tensor_into(const SafetensorsTensor& t, DType to, Overflow overflow, std::span<std::byte> out) {
  t.check_bytes();
  const DType from = tensor_dtype_of(t);
  const std::int64_t n = t.numel();
  FP8KIT_CHECK(out.size() == static_cast<std::size_t>(n) * element_size(to), "tensor ", detail::quoted(t.name), ": ",
               out.size(), " bytes for ", n, " elements of ", name(to));
  if (from == DType::bool_ || reinterpret_cast<std::uintptr_t>(t.bytes.data()) % element_size(from) != 0) {
    const Tensor c = to_tensor(t).to(to, overflow);  // checked BOOL bytes, or rows the file does not align
    if (!out.empty()) std::memcpy(out.data(), c.raw(), out.size());
    return;
  }
  convert(t.bytes.data(), from, out.data(), to, n, overflow);
}

Tensor to_tensor(const SafetensorsTensor& t) {
  t.check_bytes();
  const auto dtype = std::optional<DType>(tensor_dtype_of(t));
  if (*dtype == DType::bool_) {
    const auto bad = std::find_if(t.bytes.begin(), t.bytes.end(), [](std::byte b) { return b > std::byte{1}; });
    if (bad != t.bytes.end()) {
      ST_FAIL("tensor ", detail::quoted(t.name), ": BOOL element ", bad - t.bytes.begin(), " is byte ",
              static_cast<int>(*bad), ", not 0 or 1");
    }
  }
  Tensor out = empty(t.shape, *dtype);
  FP8KIT_CHECK_KIND(static_cast<std::uint64_t>(out.nbytes()) == t.bytes.size(), ErrorKind::kInternal, "tensor ",
                    detail::quoted(t.name), ": ", t.bytes.size(), " bytes for a Tensor of ", out.nbytes());
  if (!t.bytes.empty()) std::memcpy(out.raw(), t.bytes.data(), t.bytes.size());
  return out;
}

}  // namespace fp8kit
