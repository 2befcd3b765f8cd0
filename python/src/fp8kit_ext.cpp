// fp8kit._fp8kit: the C++ library's entries on raw arrays, for the package's Python layer (python/fp8kit), which
// resolves dtypes, hands over NumPy arrays (torch tensors as NumPy views of their memory) and allocates outputs; and
// the command-line tool's commands (tools/fp8kit/cli.hpp) for `python -m fp8kit` and the checkpoint functions.
// Bindings only: every number comes from the library. The GIL is released around every kernel and command;
// fp8kit::Error becomes ValueError (bad input) or OSError (files), a command's UsageError ValueError, each with
// fp8kit's one-line message.
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <numpy/arrayobject.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "cli.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/common/version.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/format.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"
#include "fp8kit/ops/scaled_mm.hpp"
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/scaling/analysis.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/scaling/recipe.hpp"
#include "fp8kit/scaling/scaled_tensor.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace nb = nanobind;

namespace fp8kit::python {
// A C-contiguous NumPy array of any dtype, read through NumPy's C API: its data, element count and element width.
// (ml_dtypes' FP8 and bfloat16 dtypes travel neither by DLPack nor by the buffer protocol, so the arrays would need a
// bits view in Python first: half of a small cast's cost.) Or a contiguous CPU torch.Tensor that is not a negated
// view, read through its methods: the package hands its tensors over as they are (a NumPy view of a tensor costs
// microseconds, more than the cast of a small one). Outputs (Writable) must be writeable; inputs may be read-only
// (np.frombuffer, memory maps).
template <bool Writable>
struct NumpyArray {
  void* ptr = nullptr;
  std::size_t count = 0;
  int item_bits = 0;
  void* data() const { return ptr; }
  std::size_t size() const { return count; }
};

// `o`'s memory when it is a contiguous CPU torch.Tensor that is not a negated view (false for anything else,
// torch not imported included; no Python error is left set).
inline bool torch_tensor_memory(PyObject* o, void*& ptr, std::size_t& count, int& item_bits) noexcept {
  static PyObject* tensor_type = nullptr;  // torch.Tensor, kept once torch is imported
  if (tensor_type == nullptr) {
    static PyObject* const name = PyUnicode_InternFromString("torch");
    PyObject* torch = name != nullptr ? PyImport_GetModule(name) : nullptr;
    if (torch == nullptr) {
      PyErr_Clear();
      return false;
    }
    tensor_type = PyObject_GetAttrString(torch, "Tensor");
    Py_DECREF(torch);
    if (tensor_type == nullptr) {
      PyErr_Clear();
      return false;
    }
  }
  if (PyObject_IsInstance(o, tensor_type) != 1) {
    PyErr_Clear();
    return false;
  }
  // The names, interned once: a lookup by a C string would build a Python string on every call.
  static PyObject* const is_cpu_name = PyUnicode_InternFromString("is_cpu");
  static PyObject* const is_contiguous_name = PyUnicode_InternFromString("is_contiguous");
  static PyObject* const is_neg_name = PyUnicode_InternFromString("is_neg");
  static PyObject* const data_ptr_name = PyUnicode_InternFromString("data_ptr");
  static PyObject* const numel_name = PyUnicode_InternFromString("numel");
  static PyObject* const element_size_name = PyUnicode_InternFromString("element_size");
  if (is_cpu_name == nullptr || is_contiguous_name == nullptr || is_neg_name == nullptr || data_ptr_name == nullptr ||
      numel_name == nullptr || element_size_name == nullptr) {
    PyErr_Clear();
    return false;
  }
  const auto call = [o](PyObject* method) { return PyObject_CallMethodNoArgs(o, method); };
  const auto is = [](PyObject* r, PyObject* want) {  // r (a new reference or null) is Py_True / Py_False
    const bool yes = r == want;
    Py_XDECREF(r);
    return yes;
  };
  const auto integer = [](PyObject* r, long long& v) {
    if (r == nullptr) return false;
    v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return !(v == -1 && PyErr_Occurred());
  };
  long long data = 0, numel = 0, element_size = 0;
  const bool ok = is(PyObject_GetAttr(o, is_cpu_name), Py_True) && is(call(is_contiguous_name), Py_True) &&
                  is(call(is_neg_name), Py_False) && integer(call(data_ptr_name), data) &&
                  integer(call(numel_name), numel) && integer(call(element_size_name), element_size) && numel >= 0 &&
                  element_size > 0 && (data != 0 || numel == 0);  // (a wrapper subclass or fake tensor: no memory)
  PyErr_Clear();
  if (!ok) return false;
  ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(data));
  count = static_cast<std::size_t>(numel);
  item_bits = 8 * static_cast<int>(element_size);
  return true;
}
}  // namespace fp8kit::python

namespace nanobind::detail {
template <bool Writable>
struct type_caster<fp8kit::python::NumpyArray<Writable>> {
  NB_TYPE_CASTER(fp8kit::python::NumpyArray<Writable>, const_name("numpy.ndarray"))
  bool from_python(handle src, uint8_t, cleanup_list*) noexcept {
    if (!PyArray_Check(src.ptr()))
      return fp8kit::python::torch_tensor_memory(src.ptr(), value.ptr, value.count, value.item_bits);
    auto* a = reinterpret_cast<PyArrayObject*>(src.ptr());
    if (!PyArray_IS_C_CONTIGUOUS(a) || (Writable && !PyArray_ISWRITEABLE(a))) return false;
    value.ptr = PyArray_DATA(a);
    value.count = static_cast<std::size_t>(PyArray_SIZE(a));
    value.item_bits = 8 * static_cast<int>(PyArray_ITEMSIZE(a));
    return true;
  }
  static handle from_cpp(const Value&, rv_policy, cleanup_list*) noexcept { return handle(); }
};
}  // namespace nanobind::detail

namespace fp8kit::python {
namespace {

using Input = NumpyArray<false>;
using Array = NumpyArray<true>;

Format format_named(std::string_view text) {
  if (const std::optional<Format> f = parse_format(text)) return *f;
  throw nb::value_error(
      ("unknown FP8 format '" + std::string(text) + "' (use e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e8m0fnu)").c_str());
}

// The number of elements of `a`, checked to be of `bits`-wide elements.
template <typename A>
std::size_t elements(const A& a, int bits, const char* what) {
  if (a.item_bits != bits) {
    throw nb::type_error(
        (std::string(what) + " must have " + std::to_string(bits) + "-bit elements, got " + std::to_string(a.item_bits))
            .c_str());
  }
  return a.size();
}

// Runs `work` with the GIL released and, when `threads` is given, that many OpenMP threads for this call.
template <typename Work>
void run(std::optional<int> threads, const Work& work) {
  if (threads && *threads < 1)
    throw nb::value_error(("threads must be at least 1, got " + std::to_string(*threads)).c_str());
  nb::gil_scoped_release release;
  std::optional<ScopedNumThreads> count;  // this thread's alone: another Python thread's calls keep theirs
  if (threads) count.emplace(*threads);
  work();
}

nb::list formats() {
  nb::list out;
  for (Format f : kAllFormats) {
    const FormatDescriptor& d = descriptor(f);
    nb::dict e;
    e["name"] = std::string(d.name);
    e["torch_name"] = std::string(d.torch_name);
    e["sign_bits"] = d.has_sign ? 1 : 0;
    e["exponent_bits"] = d.exponent_bits;
    e["mantissa_bits"] = d.mantissa_bits;
    e["bias"] = d.bias;
    e["max"] = max_finite(f);
    e["max_code"] = static_cast<int>(d.max_code());
    e["min_normal"] = min_normal(f);
    const std::optional<double> min_sub = min_subnormal(f);
    e["min_subnormal"] = min_sub ? nb::cast(*min_sub) : nb::none();
    e["epsilon"] = epsilon(f);
    e["has_zero"] = d.has_zero();
    e["has_negative_zero"] = d.has_negative_zero();
    e["has_inf"] = d.has_inf;
    e["inf_encoding"] = d.has_inf ? nb::cast(inf_encoding(f)) : nb::none();
    nb::list inf_codes, nan_codes;
    for (int c = 0; c < 256; ++c) {
      if (d.is_inf(static_cast<std::uint8_t>(c))) inf_codes.append(c);
      if (d.is_nan(static_cast<std::uint8_t>(c))) nan_codes.append(c);
    }
    e["inf_codes"] = inf_codes;
    e["nan_encoding"] = nan_encoding(f);
    e["nan_codes"] = nan_codes;
    out.append(e);
  }
  return out;
}

// in: float32, or bfloat16/float16 bits (`kind`); out: uint8 codes of the same length.
void cast_to_fp8(Input in, std::string_view kind, Array out, std::string_view format, bool saturate, float scale,
                 bool stochastic, std::uint64_t seed, std::optional<int> threads) {
  const std::size_t n = elements(in, kind == "float32" ? 32 : 16, "the input");
  if (elements(out, 8, "the output") != n) throw nb::value_error("the output must have as many elements as the input");
  const CastOptions options{format_named(format),
                            saturate ? Overflow::kSaturate : Overflow::kNonSaturating,
                            stochastic ? Rounding::kStochastic : Rounding::kNearestEven,
                            scale,
                            seed,
                            0};
  auto* codes = static_cast<std::uint8_t*>(out.data());
  run(threads, [&] {
    if (kind == "float32") {
      fp8kit::cast_to_fp8(std::span<const float>(static_cast<const float*>(in.data()), n),
                          std::span<std::uint8_t>(codes, n), options);
    } else if (kind == "bfloat16") {
      fp8kit::cast_to_fp8(std::span<const bfloat16>(static_cast<const bfloat16*>(in.data()), n),
                          std::span<std::uint8_t>(codes, n), options);
    } else {
      fp8kit::cast_to_fp8(std::span<const float16>(static_cast<const float16*>(in.data()), n),
                          std::span<std::uint8_t>(codes, n), options);
    }
  });
}

// in: uint8 codes; out: float32, or bfloat16/float16 bits (`kind`) of the same length.
void cast_from_fp8(Input in, std::string_view format, Array out, std::string_view kind, float scale_inv,
                   std::optional<int> threads) {
  const std::size_t n = elements(in, 8, "the input");
  if (elements(out, kind == "float32" ? 32 : 16, "the output") != n)
    throw nb::value_error("the output must have as many elements as the input");
  const Format f = format_named(format);
  const auto* codes = static_cast<const std::uint8_t*>(in.data());
  run(threads, [&] {
    if (kind == "float32") {
      fp8kit::cast_from_fp8(std::span<const std::uint8_t>(codes, n), f,
                            std::span<float>(static_cast<float*>(out.data()), n), scale_inv);
    } else if (kind == "bfloat16") {
      fp8kit::cast_from_fp8(std::span<const std::uint8_t>(codes, n), f,
                            std::span<bfloat16>(static_cast<bfloat16*>(out.data()), n), scale_inv);
    } else {
      fp8kit::cast_from_fp8(std::span<const std::uint8_t>(codes, n), f,
                            std::span<float16>(static_cast<float16*>(out.data()), n), scale_inv);
    }
  });
}

DType dtype_named(std::string_view text) {
  const std::optional<DType> d = parse_dtype(text);
  if (!d || !is_floating(*d)) throw nb::value_error(("unknown floating dtype '" + std::string(text) + "'").c_str());
  return *d;
}

// Tensor::to's conversion between any two floating dtypes (FP8 included), element by element, each rounded once.
void convert_elements(Input in, std::string_view from, Array out, std::string_view to, bool saturate,
                      std::optional<int> threads) {
  const DType f = dtype_named(from), t = dtype_named(to);
  const std::size_t n = elements(in, 8 * static_cast<int>(element_size(f)), "the input");
  if (elements(out, 8 * static_cast<int>(element_size(t)), "the output") != n)
    throw nb::value_error("the output must have as many elements as the input");
  run(threads, [&] {
    convert(in.data(), f, out.data(), t, static_cast<std::int64_t>(n),
            saturate ? Overflow::kSaturate : Overflow::kNonSaturating);
  });
}

// Whether `n` elements are exactly a rows x cols matrix (rows * cols past int64 is not: it wrapped to 0, and an
// empty buffer passed for a 2^62 x 4 matrix).
bool holds_matrix(std::size_t n, std::int64_t rows, std::int64_t cols) {
  std::int64_t product = 0;
  return rows >= 0 && cols >= 0 && !__builtin_mul_overflow(rows, cols, &product) &&
         static_cast<std::size_t>(product) == n;
}

// A rows x cols matrix over the bits of float32, bfloat16 or float16 elements (`kind`; float64 where float64_ok).
MatrixRef matrix(const Input& in, const std::string& kind, std::int64_t rows, std::int64_t cols,
                 bool float64_ok = false) {
  const DType d = dtype_named(kind);
  if (d != DType::float32 && d != DType::bfloat16 && d != DType::float16 && !(float64_ok && d == DType::float64))
    throw nb::value_error(("quantize takes float32, bfloat16 or float16, not " + kind).c_str());
  if (!holds_matrix(elements(in, 8 * static_cast<int>(element_size(d)), "the input"), rows, cols))
    throw nb::value_error("the input does not hold rows x cols elements");
  return MatrixRef(in.data(), d, rows, cols);
}

Granularity granularity_named(const std::string& text) {
  if (const std::optional<Granularity> g = Granularity::parse(text)) return *g;
  throw nb::value_error(("unknown granularity '" + text +
                         "' (use tensor, row, col, block:RxC with sides 1..2147483648 such as block:1x128 or "
                         "block:128x128, mx32, mx32-rceil)")
                            .c_str());
}

ScaledTensor quantize_matrix(Input in, const std::string& kind, std::int64_t rows, std::int64_t cols,
                             const std::string& format, const std::string& granularity, bool saturate, int margin,
                             bool pow2, std::optional<int> threads) {
  const MatrixRef x = matrix(in, kind, rows, cols);
  ScaleOptions scale;
  scale.margin = margin;
  scale.rounding = pow2 ? ScaleRounding::kPowerOfTwoDown : ScaleRounding::kExact;
  const QuantizeOptions options{format_named(format), saturate ? Overflow::kSaturate : Overflow::kNonSaturating,
                                granularity_named(granularity), scale};
  ScaledTensor q;
  run(threads, [&] { quantize_into(x, options, q); });
  return q;
}

// out (float32, bfloat16 or float16 bits: `kind`) = the dequantized values, rows x cols.
void dequantize_matrix(const ScaledTensor& q, Array out, const std::string& kind, std::optional<int> threads) {
  const DType d = dtype_named(kind);
  const auto n = static_cast<std::size_t>(q.rows * q.cols);
  if (elements(out, 8 * static_cast<int>(element_size(d)), "the output") != n)
    throw nb::value_error("the output does not hold rows x cols elements");
  run(threads, [&] {
    if (d == DType::float32) {
      dequantize(q, std::span<float>(static_cast<float*>(out.data()), n));
    } else {
      const Tensor wide = dequantize(q, DType::float32);
      convert(wide.raw(), DType::float32, out.data(), d, wide.numel());
    }
  });
}

// The amax per block of `granularity` over float32 elements, and the NaN and Inf counts of all of them.
nb::tuple amax_matrix(Input in, std::int64_t rows, std::int64_t cols, const std::string& granularity,
                      std::optional<int> threads) {
  const MatrixRef x = matrix(in, "float32", rows, cols);
  const Granularity g = granularity_named(granularity);
  const std::int64_t br = std::max<std::int64_t>(1, g.rows_per_block(rows));
  const std::int64_t bc = std::max<std::int64_t>(1, g.cols_per_block(cols));
  const std::int64_t grid_rows = (rows + br - 1) / br, grid_cols = (cols + bc - 1) / bc;
  auto* blocks = new std::vector<float>(static_cast<std::size_t>(grid_rows * grid_cols));
  nb::capsule owner(blocks, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  AmaxResult total;
  if (rows * cols > 0) run(threads, [&] { amax_blocks(x, br, bc, *blocks, &total); });
  nb::ndarray<nb::numpy, float, nb::ndim<2>> result(
      blocks->data(), {static_cast<std::size_t>(grid_rows), static_cast<std::size_t>(grid_cols)}, owner);
  return nb::make_tuple(result, total.nan_count, total.inf_count);
}

// A number argument (int, float or NumPy's; not a string or a bool), by the package's own check: one-line TypeError.
double real_arg(const char* name, nb::handle value) {
  return nb::cast<double>(nb::module_::import_("fp8kit._arrays").attr("check_real")(name, value));
}

// An amax for DelayedScaling: a number whose float32 rounding does not overflow (1e300 would be recorded as Inf, a step
// that keeps the previous scale, although nothing overflowed); Inf and NaN themselves are recorded as they are.
float amax_arg(nb::handle value) {
  const double amax = real_arg("amax", value);
  if (std::isfinite(amax) && !std::isfinite(static_cast<float>(amax))) {
    throw nb::value_error(
        ("amax must be within float32's range (scales are float32), got " + nb::cast<std::string>(nb::repr(value)))
            .c_str());
  }
  return static_cast<float>(amax);
}

// A view of a product's FP8 operand over the caller's arrays (codes and scales), checked against rows x cols and the
// granularity's block grid. The arrays stay alive for the call: nanobind holds them.
ScaledTensorRef scaled_operand(const Input& codes, const std::string& format, std::int64_t rows, std::int64_t cols,
                               const Input& scales, const std::string& granularity, const char* what) {
  const std::size_t count = elements(codes, 8, what);
  if (!holds_matrix(count, rows, cols))
    throw nb::value_error((std::string(what) + " does not hold rows x cols codes").c_str());
  ScaledTensorRef q;
  q.format = format_named(format);
  q.granularity = granularity_named(granularity);
  q.rows = rows;
  q.cols = cols;
  q.data = {static_cast<const std::uint8_t*>(codes.data()), count};
  const std::size_t blocks = static_cast<std::size_t>(q.grid_rows() * q.grid_cols());
  const std::size_t given = elements(scales, 32, "the scales");
  if (blocks == 0) {
    // An empty matrix has no block, but torch._scaled_mm takes the scales of its shapes all the same (one value,
    // or M x 1 rows of an M x 0 matrix): the package checked those shapes; every product is 0 whatever they hold.
    return q;
  }
  if (given != blocks) {
    throw nb::value_error((std::string("the scales of ") + what + " must hold " + std::to_string(blocks) +
                           " values for granularity " + granularity + ", not " + std::to_string(scales.size()))
                              .c_str());
  }
  q.scale_inv = {static_cast<const float*>(scales.data()), blocks};
  return q;
}

// (copyreg.__newobj__, (type,), state): pickle's own reduction of a class with __getstate__ / __setstate__ under
// protocol 2, given for every protocol (0 and 1 otherwise refuse an extension type).
nb::tuple reduce_with_state(nb::handle self) {
  const nb::object newobj = nb::module_::import_("copyreg").attr("__newobj__");
  return nb::make_tuple(newobj, nb::make_tuple(self.type()), self.attr("__getstate__")());
}

// A ScaledTensor's whole state for pickle and copy.deepcopy: (version, format, saturating, granularity, rows, cols,
// original dtype, codes, scale_inv, scale_e8m0) with the buffers as bytes (native byte order, as NumPy's pickles).
constexpr int kScaledTensorStateVersion = 1;

// An MX ScaledTensor's E8M0 codes made again from its scale_inv, which Python can write into (a view that
// dequantize reads): what pickling and save() store must be the scales the tensor uses. A scale that no E8M0 code
// holds (a power of two from 2^-127 to 2^127, or NaN) is a ValueError naming the block.
void refresh_mx_codes(ScaledTensor& q) {
  if (q.granularity.kind != Granularity::Kind::kMx) return;
  q.scale_e8m0.resize(q.scale_inv.size());
  for (std::size_t b = 0; b < q.scale_inv.size(); ++b) {
    const float s = q.scale_inv[b];
    // The codec's e8m0fnu code of s (NaN for NaN): a scale is one exactly where that code decodes to it again.
    const std::uint8_t code = fp8kit::encode(s, fp8kit::EncodeSpec{Format::e8m0fnu, Overflow::kNonSaturating});
    const float back = mx_scale_value(code);
    if (!std::isnan(s) && std::memcmp(&back, &s, sizeof s) != 0) {
      throw nb::value_error(("an MX ScaledTensor's scale_inv holds " +
                             nb::cast<std::string>(nb::repr(nb::float_(static_cast<double>(s)))) + " at block " +
                             std::to_string(b) +
                             ", which no E8M0 scale is: MX scales are powers of two from 2^-127 to 2^127 "
                             "(quantize again, or change scale_inv only to such powers)")
                                .c_str());
    }
    q.scale_e8m0[b] = code;
    q.scale_inv[b] = back;  // (a NaN as E8M0's NaN decodes, whatever its payload)
  }
}

nb::tuple scaled_tensor_state(ScaledTensor& q) {
  refresh_mx_codes(q);
  const auto bytes = [](const void* p, std::size_t n) { return nb::bytes(static_cast<const char*>(p), n); };
  return nb::make_tuple(kScaledTensorStateVersion, std::string(name(q.format)), q.overflow == Overflow::kSaturate,
                        q.granularity.name(), q.rows, q.cols, std::string(name(q.original_dtype)),
                        bytes(q.data.data(), q.data.size()), bytes(q.scale_inv.data(), q.scale_inv.size() * 4),
                        bytes(q.scale_e8m0.data(), q.scale_e8m0.size()));
}

// The ScaledTensor a scaled_tensor_state gave, every field checked (a state is data: it may come from anywhere).
ScaledTensor scaled_tensor_from_state(nb::handle given) {
  const auto refuse = [](const std::string& what) {
    throw nb::value_error(("not a ScaledTensor state (" + what + "); it comes from pickling a ScaledTensor").c_str());
  };
  if (!nb::isinstance<nb::tuple>(given)) refuse("a tuple is expected");
  const auto state = nb::borrow<nb::tuple>(given);
  if (state.size() != 10) refuse("10 fields are expected, not " + std::to_string(state.size()));
  try {
    if (const auto version = nb::cast<std::int64_t>(state[0]); version != kScaledTensorStateVersion)
      refuse("version " + std::to_string(version) + "; this fp8kit reads version 1");
    ScaledTensor q;
    q.format = format_named(nb::cast<std::string>(state[1]));
    q.overflow = nb::cast<bool>(state[2]) ? Overflow::kSaturate : Overflow::kNonSaturating;
    q.granularity = granularity_named(nb::cast<std::string>(state[3]));
    q.rows = nb::cast<std::int64_t>(state[4]);
    q.cols = nb::cast<std::int64_t>(state[5]);
    q.original_dtype = dtype_named(nb::cast<std::string>(state[6]));
    const auto codes = nb::cast<nb::bytes>(state[7]), scales = nb::cast<nb::bytes>(state[8]),
               e8m0 = nb::cast<nb::bytes>(state[9]);
    if (!holds_matrix(codes.size(), q.rows, q.cols)) refuse("the codes do not hold rows x cols bytes");
    const auto blocks = static_cast<std::size_t>(q.grid_rows() * q.grid_cols());
    if (scales.size() != 4 * blocks) refuse("scale_inv does not hold one float32 per block");
    const bool mx = q.granularity.kind == Granularity::Kind::kMx;
    if (e8m0.size() != (mx ? blocks : 0)) refuse("the E8M0 scales do not match the granularity");
    const auto* c = reinterpret_cast<const std::uint8_t*>(codes.c_str());
    q.data.assign(c, c + codes.size());
    std::vector<float> scale_inv(blocks);
    std::memcpy(scale_inv.data(), scales.c_str(), scales.size());
    q.scale_inv.assign(scale_inv.begin(), scale_inv.end());
    const auto* m = reinterpret_cast<const std::uint8_t*>(e8m0.c_str());
    q.scale_e8m0.assign(m, m + e8m0.size());
    for (std::size_t b = 0; mx && b < blocks; ++b) {
      const float expected = mx_scale_value(q.scale_e8m0[b]);  // bit for bit: code 0xFF is NaN
      if (std::memcmp(&q.scale_inv[b], &expected, sizeof expected) != 0)
        refuse("an MX scale differs from its E8M0 code");
    }
    return q;
  } catch (const nb::cast_error&) {
    refuse("a field of the wrong type");
  }
  return {};  // not reached: refuse throws
}

// out (m x n float32, or bfloat16 bits: `out_kind`) = scaled_mm(a, b) with torch._scaled_mm's semantics; returns
// the output amax and the kernel that ran.
nb::tuple scaled_mm_matrix(Input a_codes, const std::string& a_format, std::int64_t m, std::int64_t k, Input a_scales,
                           const std::string& a_granularity, Input b_codes, const std::string& b_format,
                           std::int64_t b_rows, std::int64_t b_cols, Input b_scales, const std::string& b_granularity,
                           bool b_is_nk, std::optional<Input> bias, Array out, const std::string& out_kind,
                           std::optional<int> threads) {
  // The operands are read where they are (no copy of the codes: a weight matrix is the product's bulk).
  const ScaledTensorRef a = scaled_operand(a_codes, a_format, m, k, a_scales, a_granularity, "a");
  const ScaledTensorRef b = scaled_operand(b_codes, b_format, b_rows, b_cols, b_scales, b_granularity, "b");
  const std::int64_t n = b_is_nk ? b_rows : b_cols;
  const DType out_dtype = dtype_named(out_kind);
  if (out_dtype != DType::float32 && out_dtype != DType::bfloat16)
    throw nb::value_error(("out_dtype must be float32 or bfloat16, not " + out_kind).c_str());
  if (elements(out, out_dtype == DType::float32 ? 32 : 16, "the output") != static_cast<std::size_t>(m * n))
    throw nb::value_error("the output does not hold m x n elements");
  ScaledMmOptions options;
  options.b_layout = b_is_nk ? BLayout::kNK : BLayout::kKN;
  options.out_dtype = out_dtype;
  if (bias) {
    if (elements(*bias, 32, "the bias") != static_cast<std::size_t>(n))
      throw nb::value_error(("the bias must hold n = " + std::to_string(n) + " float32 values").c_str());
    options.bias = std::span<const float>(static_cast<const float*>(bias->data()), static_cast<std::size_t>(n));
  }
  float amax = 0.0f;
  MmDispatch dispatch;
  run(threads, [&] {
    if (out_dtype == DType::float32) {
      amax = scaled_mm_into(a, b, std::span<float>(static_cast<float*>(out.data()), static_cast<std::size_t>(m * n)),
                            options, &dispatch);
    } else {
      std::vector<float> values(static_cast<std::size_t>(m * n));  // already rounded to bfloat16 values
      amax = scaled_mm_into(a, b, values, options, &dispatch);
      convert(values.data(), DType::float32, out.data(), DType::bfloat16, m * n);
    }
  });
  return nb::make_tuple(amax, std::string(dispatch.kernel));
}

nb::object number_or_none(std::optional<double> v) {
  if (!v || !std::isfinite(*v)) return nb::none();
  return nb::cast(*v);
}

// `fp8kit analyze --json`'s rows for a matrix of float32, bfloat16, float16 or float64 elements: one dict per format x
// granularity, with the same keys.
nb::list analyze_matrix(Input in, const std::string& kind, std::int64_t rows, std::int64_t cols,
                        const std::vector<std::string>& format_names, const std::vector<std::string>& granularity_names,
                        bool saturate, std::optional<int> threads) {
  const MatrixRef x = matrix(in, kind, rows, cols, /*float64_ok=*/true);  // analyze() rounds it, counting losses
  std::vector<Format> formats;
  for (const std::string& f : format_names) formats.push_back(format_named(f));
  std::vector<Granularity> granularities;
  for (const std::string& g : granularity_names) granularities.push_back(granularity_named(g));
  const Overflow overflow = saturate ? Overflow::kSaturate : Overflow::kNonSaturating;
  std::vector<AnalysisRow> results;
  run(threads, [&] { results = analyze(x, formats, granularities, overflow); });
  nb::list out;
  for (const AnalysisRow& r : results) {
    nb::dict e;
    e["format"] = std::string(name(r.format));
    e["granularity"] = r.granularity.name();
    e["overflow"] = saturate ? "saturate" : "non-saturating";
    e["rows"] = rows;
    e["cols"] = cols;
    e["amax"] = r.d.amax;
    e["scale"] = r.d.scale ? nb::cast(*r.d.scale) : nb::none();
    e["scales"] = r.scales;
    e["sqnr_db"] = number_or_none(r.d.sqnr_db);
    e["exact"] = r.d.exact;
    e["underflow_fraction"] = r.d.underflow_fraction();
    e["underflow_count"] = r.d.underflow_count;
    e["saturated_count"] = r.d.saturated_count;
    e["nonfinite_count"] = r.d.nonfinite_count;
    e["max_abs_error"] = number_or_none(r.d.max_abs_error);
    e["max_rel_error"] = number_or_none(r.d.max_rel_error);
    e["holds"] = r.holds();
    out.append(e);
  }
  return out;
}

// `fp8kit ARGS...` in this process, its output returned as a string (the CLI's own code: cli::run_into).
std::string run_command(const std::vector<std::string>& args) {
  char* buffer = nullptr;
  std::size_t size = 0;
  std::FILE* out = open_memstream(&buffer, &size);
  if (out == nullptr) throw std::runtime_error("open_memstream failed");
  const auto close = [&] {
    std::fclose(out);
    std::string text(buffer != nullptr ? buffer : "", size);
    std::free(buffer);
    return text;
  };
  try {
    nb::gil_scoped_release release;
    cli::run_into(args, out);
  } catch (...) {
    close();
    throw;
  }
  return close();
}

// `fp8kit ARGS...` as the tool runs it (output on stdout, errors on stderr); returns the exit status.
int run_main(const std::vector<std::string>& args) {
  std::vector<const char*> argv{"fp8kit"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  nb::gil_scoped_release release;
  const int status = cli::run(static_cast<int>(argv.size()), argv.data());
  std::fflush(stdout);
  return status;
}

// A checkpoint's tensors for fp8kit.load: {name: (safetensors dtype, shape, bytes, shard path, file offset)} with
// the bytes a read-only view of the mapped file (kept mapped while any view lives) and where they are in which file
// (for a torch tensor over a copy-on-write mapping of its own), each quantized FP8 weight with its scales as
// {name: ScaledTensor} (the codes copied into it; its scale tensors are not listed on their own), the layout, and
// {shard path: its first 8 + N bytes as they were parsed} (so a second mapping can check it sees the same file).
nb::tuple load_checkpoint(const std::string& path, const std::string& config_json) {
  // Opening, validating, detecting and decoding the quantized weights run without the GIL (other Python threads go
  // on meanwhile); the Python objects are made after.
  std::shared_ptr<ShardedCheckpoint> checkpoint;
  std::optional<CheckpointLayout> layout;
  std::vector<std::pair<std::string, ScaledTensor>> quantized_weights_loaded;
  std::vector<const SafetensorsTensor*> plain_tensors;
  {
    nb::gil_scoped_release release;
    checkpoint = std::make_shared<ShardedCheckpoint>(ShardedCheckpoint::open(path));
    std::map<std::string, std::string> metadata;
    for (const SafetensorsFile& shard : checkpoint->shards())
      metadata.insert(shard.metadata().begin(), shard.metadata().end());
    const LayoutDetection detection = detect_layout(*checkpoint, config_json);
    layout = detection.layout;
    const QuantizationConfig config = config_json.empty()
                                          ? QuantizationConfig{}
                                          : parse_quantization_config(config_json).value_or(QuantizationConfig{});
    std::map<std::string, const QuantizedWeight*> by_weight;
    std::map<std::string, bool> scales;
    std::vector<QuantizedWeight> weights;
    if (layout) {
      weights = quantized_weights(*checkpoint, *layout);
      for (const QuantizedWeight& w : weights) {
        by_weight[w.weight] = &w;
        scales[w.scale] = true;
      }
    }
    for (const SafetensorsTensor* t : checkpoint->tensors()) {
      if (scales.count(t->name)) continue;
      if (auto it = by_weight.find(t->name); it != by_weight.end()) {
        quantized_weights_loaded.emplace_back(
            t->name, load_checkpoint_tensor(*layout, *t, checkpoint->at(it->second->scale), config, metadata));
        continue;
      }
      plain_tensors.push_back(t);
    }
  }
  nb::dict plain, quantized, headers;
  for (auto& [weight, q] : quantized_weights_loaded) quantized[weight.c_str()] = nb::cast(std::move(q));
  std::map<const SafetensorsTensor*, const SafetensorsFile*> shard_of;
  for (const SafetensorsFile& shard : checkpoint->shards())
    for (const SafetensorsTensor& t : shard.tensors()) shard_of[&t] = &shard;
  for (const SafetensorsTensor* t : plain_tensors) {
    const SafetensorsFile& shard = *shard_of.at(t);
    const std::uint64_t data_start = 8 + shard.header_size();
    if (!headers.contains(shard.path().string().c_str())) {
      const std::byte* file_start = t->bytes.data() - t->begin - data_start;  // the tensor is in the file's mapping
      headers[shard.path().string().c_str()] = nb::bytes(file_start, data_start);
    }
    auto* owner = new std::shared_ptr<ShardedCheckpoint>(checkpoint);
    nb::capsule keep(owner, [](void* p) noexcept { delete static_cast<std::shared_ptr<ShardedCheckpoint>*>(p); });
    nb::ndarray<nb::numpy, nb::ro, std::uint8_t, nb::ndim<1>> bytes(
        reinterpret_cast<const std::uint8_t*>(t->bytes.data()), {t->bytes.size()}, keep);
    nb::list shape;
    for (std::int64_t d : t->shape) shape.append(d);
    plain[t->name.c_str()] = nb::make_tuple(std::string(name(t->dtype)), nb::tuple(shape), bytes, shard.path().string(),
                                            data_start + t->begin);
  }
  return nb::make_tuple(plain, quantized, layout ? nb::cast(std::string(name(*layout))) : nb::none(), headers);
}

// The layout fp8kit.save stores a scheme's ScaledTensors in by default: the serving layout whose scales are float32
// (or E8M0), so that the scales are stored exactly as the codes were encoded with them (fp8-channel's default,
// compressed-tensors, rounds its scales to the model's dtype).
CheckpointLayout exact_layout(QuantScheme scheme) {
  switch (scheme) {
    case QuantScheme::kFp8Tensor:
      return CheckpointLayout::kAutoFp8;
    case QuantScheme::kFp8Channel:
      return CheckpointLayout::kFbgemm;
    case QuantScheme::kFp8Block:
      return CheckpointLayout::kDeepSeek;
    case QuantScheme::kMxfp8:
      return CheckpointLayout::kMxfp8;
  }
  return CheckpointLayout::kNative;
}

// fp8kit.save: a .safetensors file from plain tensors [(name, safetensors dtype, shape, contiguous bytes)] and
// quantized weights [(name, ScaledTensor, shape)], the latter in one layout (`layout`, or exact_layout of their
// schemes), written crash-safely; the bytes are written from where they are. An existing file is replaced only
// with `force`.
void save_checkpoint(const std::string& path, const nb::list& plain, const nb::list& scaled,
                     const std::optional<std::string>& layout_name, const std::map<std::string, std::string>& metadata,
                     bool force) {
  std::optional<CheckpointLayout> layout;
  if (layout_name) {
    layout = parse_checkpoint_layout(*layout_name);
    FP8KIT_CHECK(layout.has_value(), "unknown layout '", *layout_name,
                 "' (use deepseek, compressed-tensors, autofp8, fbgemm, mxfp8 or native)");
  }
  std::vector<SafetensorsEntry> entries;
  std::vector<std::tuple<std::string, const ScaledTensor*, Shape>> weights;
  for (nb::handle item : plain) {
    const auto t = nb::cast<nb::tuple>(item);
    const auto dtype_name = nb::cast<std::string>(t[1]);
    const std::optional<SafetensorsDType> dtype = parse_safetensors_dtype(dtype_name);
    FP8KIT_CHECK(dtype.has_value(), "unknown safetensors dtype '", dtype_name, "'");
    const auto bytes = nb::cast<nb::ndarray<const std::uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>>(t[3]);
    entries.push_back({nb::cast<std::string>(t[0]),
                       *dtype,
                       nb::cast<Shape>(t[2]),
                       std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()),
                       {}});
  }
  for (nb::handle item : scaled) {
    const auto t = nb::cast<nb::tuple>(item);
    auto* q = nb::cast<ScaledTensor*>(t[1]);
    refresh_mx_codes(*q);
    weights.emplace_back(nb::cast<std::string>(t[0]), q, nb::cast<Shape>(t[2]));
    const std::optional<QuantScheme> scheme = scheme_of(std::get<1>(weights.back())->granularity);
    const CheckpointLayout own = scheme ? exact_layout(*scheme) : CheckpointLayout::kNative;
    if (!layout_name && layout && *layout != own) {
      FP8KIT_THROW(ErrorKind::kInvalidArgument, "the quantized weights' layouts differ ('",
                   std::get<0>(weights.front()), "': ", name(*layout), ", '", std::get<0>(weights.back()),
                   "': ", name(own),
                   "): pass layout='native', which stores every scheme (per tensor, per row, 128x128 blocks, "
                   "mx32), or save them to separate files");
    }
    if (!layout_name) layout = own;
  }
  std::map<std::string, std::string> header_metadata = metadata;
  std::vector<StoredScaledTensor> stored;
  stored.reserve(weights.size());
  {
    nb::gil_scoped_release release;
    for (const auto& [name, q, shape] : weights) {
      stored.push_back(store_scaled_tensor(name, *q, shape, *layout));
      const StoredScaledTensor& s = stored.back();
      entries.push_back({s.plan[0].name,
                         safetensors_dtype(s.plan[0].dtype),
                         s.plan[0].shape,
                         std::as_bytes(std::span(q->data.data(), q->data.size())),
                         {}});
      entries.push_back(safetensors_entry(s.plan[1].name, s.scale));
      for (const auto& [key, value] : s.metadata) {
        const auto [it, added] = header_metadata.emplace(key, value);
        FP8KIT_CHECK(added || it->second == value, "metadata key '", key, "' is the ", fp8kit::name(*layout),
                     " layout's (for '", name, "'); use another key");
      }
    }
    const std::filesystem::path target(path);
    FP8KIT_CHECK(force || !std::filesystem::exists(target), "'", path, "' exists; pass force=True to replace it");
    FP8KIT_CHECK(!std::filesystem::is_directory(target), "'", path, "' is a directory; name a .safetensors file");
    write_safetensors(target, entries, header_metadata);
  }
}

}  // namespace
}  // namespace fp8kit::python

NB_MODULE(_fp8kit, m) {
  using namespace fp8kit::python;
  m.doc() = "fp8kit's C++ library on raw arrays (use the fp8kit package, not this module)";
  if (_import_array() < 0) throw nb::python_error();
  // A torch view of a ScaledTensor's codes (q.data.t()) still alive when the interpreter exits keeps the NumPy array
  // and through it the ScaledTensor, which torch's tensors are never collected to release: nanobind would report it
  // as "leaked 1 instances ... a reference counting issue", alarming and false (memory stays flat over any number of
  // calls: tests/python/test_quantize.py, test_results_are_released).
  nb::set_leak_warnings(false);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const fp8kit::cli::PathError& e) {
      PyErr_SetString(e.missing() ? PyExc_FileNotFoundError : PyExc_OSError, e.what());
    } catch (const fp8kit::cli::UsageError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const fp8kit::Error& e) {
      if (e.kind() == fp8kit::ErrorKind::kIo) {
        PyErr_SetString(PyExc_OSError, e.what());
      } else {
        PyErr_SetString(PyExc_ValueError, e.what());
      }
    }
  });
  m.attr("__version__") = fp8kit::kVersion;
  m.attr("max_threads") = fp8kit::kMaxThreads;  // what set_num_threads takes at most
  m.def("formats", &formats, "Every FP8 format fp8kit knows, as `fp8kit formats --json` lists them.");
  m.def("cast_to_fp8", &cast_to_fp8, nb::arg("input"), nb::arg("kind"), nb::arg("out"), nb::arg("format"),
        nb::arg("saturate"), nb::arg("scale"), nb::arg("stochastic"), nb::arg("seed"), nb::arg("threads").none(),
        "out = encode(input * scale): float32, bfloat16 or float16 bits (`kind`) to FP8 codes.");
  m.def("cast_from_fp8", &cast_from_fp8, nb::arg("input"), nb::arg("format"), nb::arg("out"), nb::arg("kind"),
        nb::arg("scale_inv"), nb::arg("threads").none(),
        "out = decode(input) * scale_inv: FP8 codes to float32, bfloat16 or float16 bits (`kind`).");
  m.def("convert", &convert_elements, nb::arg("input"), nb::arg("from_dtype"), nb::arg("out"), nb::arg("to_dtype"),
        nb::arg("saturate"), nb::arg("threads").none(),
        "Tensor::to's conversion between two floating dtypes (names as PyTorch's), on raw elements.");
  nb::class_<fp8kit::ScaledTensor>(m, "ScaledTensor", "FP8 codes and their dequantization scales (C++'s ScaledTensor)")
      .def_prop_ro(
          "codes",
          [](nb::handle self) {
            auto& q = nb::cast<fp8kit::ScaledTensor&>(self);
            return nb::ndarray<nb::numpy, std::uint8_t, nb::ndim<2>>(
                q.data.data(), {static_cast<std::size_t>(q.rows), static_cast<std::size_t>(q.cols)}, self);
          },
          nb::rv_policy::reference_internal, "The codes, rows x cols uint8: a view (no copy) of this object's buffer.")
      .def_prop_ro(
          "scale_inv",
          [](nb::handle self) {
            auto& q = nb::cast<fp8kit::ScaledTensor&>(self);
            return nb::ndarray<nb::numpy, float, nb::ndim<2>>(
                q.scale_inv.data(), {static_cast<std::size_t>(q.grid_rows()), static_cast<std::size_t>(q.grid_cols())},
                self);
          },
          nb::rv_policy::reference_internal, "The dequantization scales, one per block (grid rows x grid cols).")
      .def_prop_ro("format", [](const fp8kit::ScaledTensor& q) { return std::string(fp8kit::name(q.format)); })
      .def_prop_ro("granularity", [](const fp8kit::ScaledTensor& q) { return q.granularity.name(); })
      .def_prop_ro("saturating",
                   [](const fp8kit::ScaledTensor& q) { return q.overflow == fp8kit::Overflow::kSaturate; })
      .def_prop_ro("original_dtype",
                   [](const fp8kit::ScaledTensor& q) { return std::string(fp8kit::name(q.original_dtype)); })
      .def_prop_ro("shape",
                   [](const fp8kit::ScaledTensor& q) {
                     nb::list dims;
                     for (const std::int64_t d : q.shape()) dims.append(d);
                     return nb::tuple(dims);
                   })
      .def_prop_ro("rows", [](const fp8kit::ScaledTensor& q) { return q.rows; })
      .def_prop_ro("cols", [](const fp8kit::ScaledTensor& q) { return q.cols; })
      .def("__getstate__", &scaled_tensor_state)
      .def("__setstate__", [](fp8kit::ScaledTensor* self,
                              nb::handle state) { new (self) fp8kit::ScaledTensor(scaled_tensor_from_state(state)); })
      .def("__reduce__", &reduce_with_state);
  m.def("quantize", &quantize_matrix, nb::arg("input"), nb::arg("kind"), nb::arg("rows"), nb::arg("cols"),
        nb::arg("format"), nb::arg("granularity"), nb::arg("saturate"), nb::arg("margin"), nb::arg("pow2"),
        nb::arg("threads").none(), "Scaled quantization of a matrix (the fused amax + scale + encode).");
  m.def("dequantize", &dequantize_matrix, nb::arg("q"), nb::arg("out"), nb::arg("kind"), nb::arg("threads").none(),
        "out = decode(code) * scale_inv of its block.");
  m.def(
      "one_row_blocks",
      [](const std::string& granularity) { return granularity_named(granularity).rows_per_block(2) == 1; },
      nb::arg("granularity"), "Whether each block of the granularity lies in one row (row, block:1xC, mx32).");
  m.def("amax", &amax_matrix, nb::arg("input"), nb::arg("rows"), nb::arg("cols"), nb::arg("granularity"),
        nb::arg("threads").none(), "(amax per block over the finite elements, NaN count, Inf count).");
  m.def("scaled_mm", &scaled_mm_matrix, nb::arg("a"), nb::arg("a_format"), nb::arg("m"), nb::arg("k"),
        nb::arg("a_scales"), nb::arg("a_granularity"), nb::arg("b"), nb::arg("b_format"), nb::arg("b_rows"),
        nb::arg("b_cols"), nb::arg("b_scales"), nb::arg("b_granularity"), nb::arg("b_is_nk"), nb::arg("bias").none(),
        nb::arg("out"), nb::arg("out_kind"), nb::arg("threads").none(),
        "torch._scaled_mm's product into out; returns (output amax, the kernel that ran).");
  nb::class_<fp8kit::DelayedScaling>(
      m, "DelayedScaling",
      "Delayed scaling (Transformer Engine's recipe): one tensor role's amax history and "
      "scale. Each step: quantize with .scale, then update(amax) with the step's amax.")
      .def(
          "__init__",
          [](fp8kit::DelayedScaling* self, nb::handle format, nb::handle history, nb::handle algorithm_value,
             nb::handle margin_value, nb::handle ema_value) {
            // The package's own checks (one-line TypeError / ValueError), as every other function's integers.
            const nb::object check_int = nb::module_::import_("fp8kit._arrays").attr("check_int");
            const int history_length = nb::cast<int>(check_int("history_length", history, 1, 1 << 24));
            const int margin = nb::cast<int>(check_int("margin", margin_value, -127, 127));
            // A name, or a dtype object (ml_dtypes, NumPy, torch) named as the rest of the package names it.
            if (format.is_none()) throw nb::type_error("format must be a format name or dtype, not None");
            std::string name =
                nb::isinstance<nb::str>(format)
                    ? nb::cast<std::string>(format)
                    : nb::cast<std::string>(nb::module_::import_("fp8kit._arrays").attr("resolve_dtype")(format));
            if (name.starts_with("float8_")) name = name.substr(7);
            if (!nb::isinstance<nb::str>(algorithm_value)) {
              throw nb::type_error(("algorithm must be 'max' or 'most_recent', not " +
                                    nb::cast<std::string>(nb::str(nb::type_name(algorithm_value.type()))))
                                       .c_str());
            }
            const std::string algorithm = nb::cast<std::string>(algorithm_value);
            std::optional<float> ema_decay;  // a number as everywhere (NumPy's too), rounded to float32
            if (!ema_value.is_none()) ema_decay = static_cast<float>(real_arg("ema_decay", ema_value));
            if (algorithm != "max" && algorithm != "most_recent")
              throw nb::value_error(("algorithm must be 'max' or 'most_recent', not '" + algorithm + "'").c_str());
            if (ema_decay && !(*ema_decay >= 0.0f && *ema_decay < 1.0f)) {
              throw nb::value_error(("ema_decay must be in [0, 1) as a float32, got " +
                                     nb::cast<std::string>(nb::repr(ema_value)) +
                                     (*ema_decay == 1.0f ? " (it rounds to 1)" : ""))
                                        .c_str());
            }
            fp8kit::DelayedScalingConfig config;
            config.format = format_named(name);
            config.history_length = history_length;
            config.algorithm = algorithm == "max" ? fp8kit::AmaxCompute::kMax : fp8kit::AmaxCompute::kMostRecent;
            config.margin = margin;
            config.ema_decay = ema_decay;
            new (self) fp8kit::DelayedScaling(config);
          },
          // .none() everywhere: the checks above say what is wrong in one line, not nanobind's signature list.
          nb::arg("format").none() = "e4m3fn", nb::arg("history_length").none() = 1024,
          nb::arg("algorithm").none() = "max", nb::arg("margin").none() = 0, nb::arg("ema_decay").none() = nb::none())
      .def_prop_ro("scale", &fp8kit::DelayedScaling::scale, "The quantization scale to use now (q = cast(x * scale)).")
      .def_prop_ro("scale_inv", &fp8kit::DelayedScaling::scale_inv, "1 / scale: what a GEMM or checkpoint takes.")
      .def_prop_ro(
          "amax_history",
          [](const fp8kit::DelayedScaling& d) {
            auto* copy = new std::vector<float>(d.history().begin(), d.history().end());
            nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
            return nb::ndarray<nb::numpy, float, nb::ndim<1>>(copy->data(), {copy->size()}, owner);
          },
          nb::rv_policy::move, "The amax history (a copy): slot 0 is the step being recorded, the rest earlier steps.")
      .def_prop_ro("smoothed_amax", &fp8kit::DelayedScaling::smoothed_amax)
      .def_prop_ro("calibrated", &fp8kit::DelayedScaling::calibrated,
                   "Whether an update has computed the scale from a finite, nonzero amax (until then: scale 1).")
      .def_prop_ro("format",
                   [](const fp8kit::DelayedScaling& d) { return std::string(fp8kit::name(d.config().format)); })
      .def(
          "record", [](fp8kit::DelayedScaling& d, nb::handle amax) { d.record(amax_arg(amax)); },
          nb::arg("amax").none(),
          "Records an amax of the current step (the maximum of the calls since the last update).")
      .def(
          "update",
          [](fp8kit::DelayedScaling& d, nb::handle amax) {
            if (!amax.is_none()) d.record(amax_arg(amax));
            d.update();
          },
          nb::arg("amax").none() = nb::none(),
          "Records `amax` (when given), then Transformer Engine's amax_and_scale_update: the window's amax gives the "
          "next scale (NaN/Inf/0 keep the previous one) and the history rolls.")
      .def("discard_step", &fp8kit::DelayedScaling::discard_step, "Forgets what was recorded since the last update.")
      .def(
          "state",
          [](const fp8kit::DelayedScaling& d) {
            const std::vector<std::uint8_t> bytes = d.serialize();
            return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
          },
          "The whole state (config, scale, history, smoothing) as versioned bytes, for checkpoints.")
      .def_static(
          "from_state",
          [](nb::handle given) {
            if (!nb::isinstance<nb::bytes>(given)) {
              throw nb::type_error(("state must be bytes (what DelayedScaling.state() returns), not " +
                                    nb::cast<std::string>(nb::str(nb::type_name(given.type()))))
                                       .c_str());
            }
            const auto state = nb::borrow<nb::bytes>(given);
            return fp8kit::DelayedScaling::deserialize(
                std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(state.c_str()), state.size()));
          },
          nb::arg("state"), "The DelayedScaling a state() gave (ValueError for bytes that are not one).")
      .def("__getstate__",
           [](const fp8kit::DelayedScaling& d) {
             const std::vector<std::uint8_t> bytes = d.serialize();
             return nb::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
           })
      .def("__setstate__",
           [](fp8kit::DelayedScaling* self, nb::handle given) {
             if (!nb::isinstance<nb::bytes>(given)) {
               throw nb::type_error(("a DelayedScaling state must be bytes, not " +
                                     nb::cast<std::string>(nb::str(nb::type_name(given.type()))))
                                        .c_str());
             }
             const auto state = nb::borrow<nb::bytes>(given);
             new (self) fp8kit::DelayedScaling(fp8kit::DelayedScaling::deserialize(
                 std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(state.c_str()), state.size())));
           })
      .def("__reduce__", &reduce_with_state);
  m.def("analyze", &analyze_matrix, nb::arg("input"), nb::arg("kind"), nb::arg("rows"), nb::arg("cols"),
        nb::arg("formats"), nb::arg("granularities"), nb::arg("saturate"), nb::arg("threads").none(),
        "`fp8kit analyze --json`'s rows (one dict per format x granularity) for a matrix.");
  m.def("command", &run_command, nb::arg("args"),
        "Runs `fp8kit ARGS...` in this process and returns what it printed; errors are raised.");
  m.def("main", &run_main, nb::arg("args"), "Runs `fp8kit ARGS...` as the tool does; returns the exit status.");
  m.def("load", &load_checkpoint, nb::arg("path"), nb::arg("config_json"),
        "(plain tensors as (dtype, shape, read-only bytes, shard path, file offset), quantized weights as "
        "ScaledTensors, layout or None, {shard path: header bytes}).");
  m.def("save", &save_checkpoint, nb::arg("path"), nb::arg("plain"), nb::arg("scaled"), nb::arg("layout").none(),
        nb::arg("metadata"), nb::arg("force"),
        "Writes plain tensors (name, dtype, shape, bytes) and ScaledTensors (name, tensor, shape) to a .safetensors "
        "file.");
  m.def(
      "conversion_kernel", [] { return std::string(fp8kit::conversion_kernel()); },
      "The conversion kernels in force (e.g. avx512-vbmi).");
}
