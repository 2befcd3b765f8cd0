// The .npy reader: magic, version, header length, the header dict ({'descr': ..., 'fortran_order': ...,
// 'shape': (...)}), then the data; Fortran-ordered arrays are reordered to C order.
#include "fp8kit/io/npy.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string_view>

#include "fp8kit/common/error.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "io/strict_json.hpp"

namespace fp8kit {
namespace {

#define NPY_FAIL(...) FP8KIT_THROW(ErrorKind::kParse, "not a valid .npy file: ", __VA_ARGS__)

std::size_t itemsize(NpyDType d) {
  return d == NpyDType::kFloat16 ? 2 : d == NpyDType::kFloat32 ? 4 : 8;
}

// A tiny parser for the header's Python dict literal (only what NumPy writes).
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : text_(text) {}
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n')) ++pos_;
  }
  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) NPY_FAIL("expected '", c, "' at position ", pos_, " of the header: ", detail::printable(text_));
  }
  std::string string() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"'))
      NPY_FAIL("expected a string in the header");
    const char quote = text_[pos_++];
    const std::size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) NPY_FAIL("unterminated string in the header");
    std::string s(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    NPY_FAIL("fortran_order must be True or False");
  }
  std::vector<std::int64_t> tuple() {
    expect('(');
    std::vector<std::int64_t> dims;
    while (!consume(')')) {
      skip_space();
      std::int64_t v = 0;
      bool any = false;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (v > (std::numeric_limits<std::int64_t>::max() - 9) / 10) NPY_FAIL("a dimension in 'shape' is too large");
        v = v * 10 + (text_[pos_++] - '0');
        any = true;
      }
      if (!any) NPY_FAIL("'shape' must be a tuple of non-negative integers");
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long suffix
      dims.push_back(v);
      if (!consume(',')) {
        expect(')');
        break;
      }
    }
    return dims;
  }
  bool at_end() {
    skip_space();
    return pos_ == text_.size();
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

std::uint32_t read_le(std::span<const std::byte> b, std::size_t at, int n) {
  std::uint32_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<std::uint32_t>(b[at + static_cast<std::size_t>(i)]) << (8 * i);
  return v;
}

}  // namespace

std::int64_t NpyArray::numel() const {
  // A zero anywhere first: (10^8, 10^11, 0) holds no elements, though the product of its first two overflows.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    // parse_npy checked numel x itemsize against the file; an array built by hand is checked here.
    FP8KIT_CHECK(d >= 0 && !__builtin_mul_overflow(n, d, &n), "NpyArray: shape ", shape_string(shape),
                 " has a negative dimension or more elements than memory can hold");
  }
  return n;
}

std::vector<float> NpyArray::to_float32() const {
  const auto n = static_cast<std::size_t>(numel());
  FP8KIT_CHECK(data.size() == n * itemsize(dtype), "NpyArray: ", data.size(), " bytes for ", n, " elements of ", descr,
               " (", n * itemsize(dtype), " bytes)");
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (dtype) {
      case NpyDType::kFloat16: {
        std::uint16_t bits;
        std::memcpy(&bits, data.data() + 2 * i, 2);
        out[i] = float16::from_bits(bits).to_float();
        break;
      }
      case NpyDType::kFloat32:
        std::memcpy(&out[i], data.data() + 4 * i, 4);
        break;
      case NpyDType::kFloat64: {
        double v;
        std::memcpy(&v, data.data() + 8 * i, 8);
        out[i] = static_cast<float>(v);
        break;
      }
    }
  }
  return out;
}

NpyArray parse_npy(std::span<const std::byte> bytes) {
  static constexpr unsigned char kMagic[] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, 6) != 0) {
    NPY_FAIL("the file does not start with the NumPy magic \\x93NUMPY (pickle and .npz files are not read)");
  }
  const int major = static_cast<int>(bytes[6]);
  if (major < 1 || major > 3)
    NPY_FAIL("format version ", major, ".", static_cast<int>(bytes[7]), " is not supported (1.0-3.0 are)");
  const int len_bytes = major == 1 ? 2 : 4;
  const std::size_t header_start = 8 + static_cast<std::size_t>(len_bytes);
  if (bytes.size() < header_start) NPY_FAIL("truncated before the header length");
  const std::size_t header_len = read_le(bytes, 8, len_bytes);
  if (header_len > bytes.size() - header_start)
    NPY_FAIL("the header (", header_len, " bytes) runs past the end of the file");
  std::string_view header(reinterpret_cast<const char*>(bytes.data()) + header_start, header_len);
  if (header.empty() || header.back() != '\n') NPY_FAIL("the header does not end with a newline");

  HeaderParser p(header);
  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<std::vector<std::int64_t>> shape;
  p.expect('{');
  while (!p.consume('}')) {
    const std::string key = p.string();
    p.expect(':');
    if (key == "descr") {
      descr = p.string();
    } else if (key == "fortran_order") {
      fortran = p.boolean();
    } else if (key == "shape") {
      shape = p.tuple();
    } else {
      NPY_FAIL("unknown header key ", detail::quoted(key));
    }
    if (!p.consume(',')) {
      p.expect('}');
      break;
    }
  }
  if (!p.at_end()) NPY_FAIL("unexpected text after the header dict");
  if (!descr || !fortran || !shape) NPY_FAIL("the header lacks one of 'descr', 'fortran_order', 'shape'");

  NpyArray a;
  a.descr = *descr;
  a.shape = *shape;
  const std::string& d = *descr;
  // A byte-order character, or none ('f4': read in this machine's order, as numpy.dtype('f4') is).
  const bool has_order = !d.empty() && (d[0] == '<' || d[0] == '>' || d[0] == '=' || d[0] == '|');
  const bool native_order = !has_order || d[0] == '=' || d[0] == '|';
  const bool little = (!d.empty() && d[0] == '<') || (native_order && std::endian::native == std::endian::little);
  const std::string kind = has_order ? d.substr(1) : d;
  if (kind == "f2" || kind == "f4" || kind == "f8") {
    if (!little)
      FP8KIT_THROW(ErrorKind::kParse, "unsupported .npy dtype ", detail::quoted(d),
                   ": big-endian data; save it little-endian (arr.astype('<", kind, "'))");
    a.dtype = kind == "f2" ? NpyDType::kFloat16 : kind == "f4" ? NpyDType::kFloat32 : NpyDType::kFloat64;
  } else {
    FP8KIT_THROW(ErrorKind::kParse, "unsupported .npy dtype ", detail::quoted(d),
                 ": fp8kit reads float16, float32 and float64 arrays (convert with arr.astype(np.float32))");
  }
  // numel * itemsize with overflow checks
  std::uint64_t numel = 1;
  for (std::int64_t dim : a.shape) {
    if (dim != 0 && numel > std::numeric_limits<std::uint64_t>::max() / static_cast<std::uint64_t>(dim))
      NPY_FAIL("the shape is too large");
    numel *= static_cast<std::uint64_t>(dim);
  }
  const std::uint64_t size = itemsize(a.dtype);
  if (numel > std::numeric_limits<std::uint64_t>::max() / size) NPY_FAIL("the shape is too large");
  const std::size_t data_start = header_start + header_len;
  const std::uint64_t available = bytes.size() - data_start;
  if (available != numel * size) {
    NPY_FAIL("the data holds ", available, " bytes but shape ", a.shape.size(), "-d with ", numel, " elements of ",
             size, " bytes needs ", numel * size);
  }
  const std::byte* src = bytes.data() + data_start;
  a.data.resize(static_cast<std::size_t>(numel * size));
  if (!*fortran || a.shape.size() < 2 || numel == 0) {  // (no strides for an empty array: they could overflow)
    if (!a.data.empty()) std::memcpy(a.data.data(), src, a.data.size());  // memcpy from nullptr is UB even for 0
    return a;
  }
  // Fortran order: the first index varies fastest. Write each element to its C-order position.
  const std::size_t ndim = a.shape.size();
  std::vector<std::int64_t> index(ndim, 0);
  std::vector<std::int64_t> c_stride(ndim, 1);
  for (std::size_t k = ndim - 1; k > 0; --k) c_stride[k - 1] = c_stride[k] * a.shape[k];
  for (std::uint64_t f = 0; f < numel; ++f) {
    std::int64_t c = 0;
    for (std::size_t k = 0; k < ndim; ++k) c += index[k] * c_stride[k];
    std::memcpy(a.data.data() + static_cast<std::size_t>(c) * size, src + f * size, size);
    for (std::size_t k = 0; k < ndim; ++k) {  // next Fortran index
      if (++index[k] < a.shape[k]) break;
      index[k] = 0;
    }
  }
  return a;
}

NpyArray load_npy(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  FP8KIT_CHECK_KIND(static_cast<bool>(in), ErrorKind::kIo, "cannot open '", path.string(), "' for reading");
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  FP8KIT_CHECK_KIND(!in.bad(), ErrorKind::kIo, "error reading '", path.string(), "'");
  const auto* p = reinterpret_cast<const std::byte*>(raw.data());
  try {
    return parse_npy(std::span<const std::byte>(p, raw.size()));
  } catch (const Error& e) {
    FP8KIT_THROW(e.kind(), path.string(), ": ", e.what());
  }
}

}  // namespace fp8kit
