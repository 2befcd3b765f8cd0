// Printing in PyTorch's style: a transcription of torch/_tensor_str.py (_Formatter, _vector_str,
// _tensor_str_with_formatter, get_summarized_data, _add_suffixes) over fp8kit's dtypes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "tensor/element.hpp"

namespace fp8kit {
namespace {

// One element as the printer sees it: floating dtypes as a double (float16, bfloat16 and FP8 first become
// their float32 value, as PyTorch converts them with .float()), integers as int64, bool as bool.
struct Element {
  double value = 0.0;
  std::int64_t integer = 0;
};

enum class ElementKind { kFloating, kInteger, kBool };

// Python's str() of a float formatted with "{:.{p}f}" or "{:.{p}e}": "nan" for NaN of either sign (C prints
// "-nan"), "inf", "-inf".
std::string format_double(double v, char conversion, int precision) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  const char spec[] = {'%', '.', '*', conversion, '\0'};
  const int n = std::snprintf(nullptr, 0, spec, precision, v);
  std::string s(static_cast<std::size_t>(n) + 1, '\0');
  std::snprintf(s.data(), s.size(), spec, precision, v);
  s.resize(static_cast<std::size_t>(n));
  return s;
}

std::string pad_left(std::string s, int width) {
  if (static_cast<int>(s.size()) < width) s.insert(0, static_cast<std::size_t>(width) - s.size(), ' ');
  return s;
}

// torch._tensor_str._Formatter: chooses integer, fixed or scientific notation and the column width from the
// (summarized) elements, then formats each element to that width.
class Formatter {
 public:
  Formatter(ElementKind kind, const std::vector<Element>& elements, const PrintOptions& options)
      : kind_(kind), precision_(options.precision) {
    if (kind_ != ElementKind::kFloating) {
      for (const Element& e : elements) width_ = std::max(width_, static_cast<int>(raw(e).size()));
      if (options.sci_mode) sci_mode_ = *options.sci_mode;
      return;
    }
    std::vector<double> nonzero_finite;
    for (const Element& e : elements) {
      if (std::isfinite(e.value) && e.value != 0.0) nonzero_finite.push_back(e.value);
    }
    if (nonzero_finite.empty()) return;  // all zero or non-finite: integer mode, width 1, options ignored
    double min_abs = std::fabs(nonzero_finite[0]);
    double max_abs = min_abs;
    for (double v : nonzero_finite) {
      min_abs = std::min(min_abs, std::fabs(v));
      max_abs = std::max(max_abs, std::fabs(v));
      if (v != std::ceil(v)) int_mode_ = false;
    }
    const bool wide = max_abs / min_abs > 1000.0 || max_abs > 1.0e8;
    if (int_mode_) {
      sci_mode_ = wide;
      for (double v : nonzero_finite) {
        const int w = sci_mode_ ? static_cast<int>(format_double(v, 'e', precision_).size())
                                : static_cast<int>(format_double(v, 'f', 0).size()) + 1;  // + "."
        width_ = std::max(width_, w);
      }
    } else {
      sci_mode_ = wide || min_abs < 1.0e-4;
      for (double v : nonzero_finite) {
        width_ = std::max(width_, static_cast<int>(format_double(v, sci_mode_ ? 'e' : 'f', precision_).size()));
      }
    }
    if (options.sci_mode) sci_mode_ = *options.sci_mode;
  }

  int width() const { return width_; }

  std::string format(const Element& e) const {
    if (kind_ != ElementKind::kFloating) return pad_left(raw(e), width_);
    std::string s;
    if (sci_mode_) {
      s = format_double(e.value, 'e', precision_);
    } else if (int_mode_) {
      s = format_double(e.value, 'f', 0);
      if (std::isfinite(e.value)) s += '.';
    } else {
      s = format_double(e.value, 'f', precision_);
    }
    return pad_left(std::move(s), width_);
  }

 private:
  std::string raw(const Element& e) const {
    if (kind_ == ElementKind::kBool) return e.integer != 0 ? "True" : "False";
    return std::to_string(e.integer);
  }

  ElementKind kind_;
  int precision_;
  bool int_mode_ = true;
  bool sci_mode_ = false;
  int width_ = 1;
};

constexpr int kMaxPrecision = 1074;

// Walks a tensor's elements in PyTorch's nested layout.
class Printer {
 public:
  Printer(const Tensor& t, const PrintOptions& options) : t_(t), options_(options), strides_(t.shape().size()) {
    FP8KIT_CHECK(options.edgeitems >= 1, "PrintOptions::edgeitems must be >= 1, not ", options.edgeitems);
    // 1074 digits write any double exactly (2^-1074 has that many after the point); more only add zeros.
    FP8KIT_CHECK(options.precision >= 0 && options.precision <= kMaxPrecision, "PrintOptions::precision must be 0 to ",
                 kMaxPrecision, ", not ", options.precision);
    std::int64_t stride = 1;
    for (std::size_t d = t.shape().size(); d-- > 0;) {
      strides_[d] = stride;
      stride *= t.shape()[d];
    }
    kind_ = t.dtype() == DType::bool_ ? ElementKind::kBool
            : is_integral(t.dtype())  ? ElementKind::kInteger
                                      : ElementKind::kFloating;
    summarize_ = t.numel() > options.threshold;
  }

  std::string str() {
    std::vector<std::int64_t> indices;
    collect(0, 0, indices);  // get_summarized_data, or every element
    std::vector<Element> elements;
    elements.reserve(indices.size());
    for (std::int64_t i : indices) elements.push_back(element(i));
    formatter_.emplace(kind_, elements, options_);
    return nested(0, 0, static_cast<int>(std::string_view("tensor(").size()));
  }

 private:
  Element element(std::int64_t i) const {
    Element e;
    detail::visit_dtype(t_.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T x = reinterpret_cast<const T*>(t_.raw())[i];
      if constexpr (std::integral<T>) {
        e.integer = static_cast<std::int64_t>(x);
      } else if constexpr (std::same_as<T, double>) {
        e.value = x;
      } else {
        e.value = static_cast<float>(detail::exact_value(x));  // float32, as PyTorch's .float() (exact)
      }
    });
    return e;
  }

  bool summarized(std::int64_t size) const {
    return summarize_ && size > 2 * static_cast<std::int64_t>(options_.edgeitems);
  }

  // The positions of dimension d that are shown: all, or edgeitems at each end.
  std::vector<std::int64_t> shown(int d) const {
    const std::int64_t size = t_.shape()[static_cast<std::size_t>(d)];
    std::vector<std::int64_t> out;
    if (summarized(size)) {
      for (std::int64_t i = 0; i < options_.edgeitems; ++i) out.push_back(i);
      for (std::int64_t i = size - options_.edgeitems; i < size; ++i) out.push_back(i);
    } else {
      for (std::int64_t i = 0; i < size; ++i) out.push_back(i);
    }
    return out;
  }

  void collect(int d, std::int64_t offset, std::vector<std::int64_t>& out) const {
    if (d == t_.dim()) {
      out.push_back(offset);
      return;
    }
    for (std::int64_t i : shown(d)) collect(d + 1, offset + i * strides_[static_cast<std::size_t>(d)], out);
  }

  // _tensor_str_with_formatter for the sub-tensor of dimensions d.. at element `offset`.
  std::string nested(int d, std::int64_t offset, int indent) const {
    const int remaining = t_.dim() - d;
    if (remaining == 0) return formatter_->format(element(offset));
    if (remaining == 1) return vector(d, offset, indent);
    const std::int64_t size = t_.shape()[static_cast<std::size_t>(d)];
    const std::int64_t stride = strides_[static_cast<std::size_t>(d)];
    std::vector<std::string> slices;
    for (std::int64_t i : shown(d)) {
      if (summarized(size) && i == size - options_.edgeitems) slices.emplace_back("...");
      slices.push_back(nested(d + 1, offset + i * stride, indent + 1));
    }
    return bracketed(slices, separator(remaining - 1, indent + 1));
  }

  // _vector_str: the last dimension, wrapped to the line width.
  std::string vector(int d, std::int64_t offset, int indent) const {
    const std::int64_t size = t_.shape()[static_cast<std::size_t>(d)];
    const int element_length = formatter_->width() + 2;
    const int room = options_.linewidth - indent;
    const std::size_t per_line = static_cast<std::size_t>(std::max(1, room > 0 ? room / element_length : 0));
    std::vector<std::string> data;
    for (std::int64_t i : shown(d)) {
      if (summarized(size) && i == size - options_.edgeitems) data.emplace_back(" ...");
      data.push_back(formatter_->format(element(offset + i)));
    }
    std::vector<std::string> lines;
    for (std::size_t i = 0; i < data.size(); i += per_line) {
      const auto end = data.begin() + static_cast<std::ptrdiff_t>(std::min(data.size(), i + per_line));
      std::string line;
      for (auto it = data.begin() + static_cast<std::ptrdiff_t>(i); it != end; ++it) {
        if (!line.empty()) line.append(", ");
        line.append(*it);
      }
      lines.push_back(std::move(line));
    }
    return bracketed(lines, separator(1, indent + 1));
  }

  // "," then `newlines` newlines and `spaces` spaces: what separates rows (PyTorch's "," + "\n" * (dim - 1) +
  // " " * (indent + 1)).
  static std::string separator(int newlines, int spaces) {
    std::string s(1, ',');
    s.append(static_cast<std::size_t>(newlines), '\n');
    s.append(static_cast<std::size_t>(spaces), ' ');
    return s;
  }

  // "[" + separator.join(parts) + "]" (appended piecewise: GCC 12 warns falsely about operator+ chains).
  static std::string bracketed(const std::vector<std::string>& parts, const std::string& separator) {
    std::string out(1, '[');
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (i) out.append(separator);
      out.append(parts[i]);
    }
    out.push_back(']');
    return out;
  }

  const Tensor& t_;
  const PrintOptions& options_;
  std::vector<std::int64_t> strides_;
  ElementKind kind_ = ElementKind::kFloating;
  bool summarize_ = false;
  std::optional<Formatter> formatter_;
};

// _add_suffixes: ", suffix" on the last line while it fits, else on a new line indented like the elements.
std::string add_suffixes(std::string s, const std::vector<std::string>& suffixes, int indent, int linewidth) {
  const std::size_t newline = s.rfind('\n');
  // PyTorch's len(s) - s.rfind("\n") + 1, which counts two more than the last line holds.
  std::int64_t last_line_len = static_cast<std::int64_t>(s.size()) -
                               (newline == std::string::npos ? -1 : static_cast<std::int64_t>(newline)) + 1;
  for (const std::string& suffix : suffixes) {
    const auto suffix_len = static_cast<std::int64_t>(suffix.size());
    if (last_line_len + suffix_len + 2 > linewidth) {
      s += ",\n" + std::string(static_cast<std::size_t>(indent), ' ') + suffix;
      last_line_len = indent + suffix_len;
    } else {
      s += ", " + suffix;
      last_line_len += suffix_len + 2;
    }
  }
  return s + ")";
}

}  // namespace

std::string to_string(const Tensor& t, const PrintOptions& options) {
  const std::string prefix = "tensor(";
  const int indent = static_cast<int>(prefix.size());
  std::vector<std::string> suffixes;
  if (!t.device().is_cpu()) suffixes.push_back("device='" + to_string(t.device()) + "'");
  const std::string dtype_suffix = "dtype=" + std::string(name(t.dtype()));
  std::string body;
  if (t.numel() == 0) {
    // No elements to show the dtype by, so only the default dtype goes unnamed; a shape other than (0,) is
    // printed, as NumPy does.
    if (t.dim() != 1) {
      std::string size = "size=(";
      for (int d = 0; d < t.dim(); ++d)
        size += (d ? ", " : "") + std::to_string(t.shape()[static_cast<std::size_t>(d)]);
      suffixes.push_back(size + ")");
    }
    if (t.dtype() != default_dtype()) suffixes.push_back(dtype_suffix);
    body = "[]";
  } else {
    const DType d = t.dtype();
    if (d != default_dtype() && d != DType::int64 && d != DType::bool_) suffixes.push_back(dtype_suffix);
    body = Printer(t, options).str();
  }
  return add_suffixes(prefix + body, suffixes, indent, options.linewidth);
}

std::ostream& operator<<(std::ostream& out, const Tensor& t) {
  return out << to_string(t);
}

}  // namespace fp8kit
