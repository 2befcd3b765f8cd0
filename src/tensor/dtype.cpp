// The dtype registry's parsing of names, and the process-wide default dtype with the rule that keeps FP8 (and
// integers) out of it.
#include "fp8kit/tensor/dtype.hpp"

#include <atomic>
#include <utility>

#include "fp8kit/common/error.hpp"

namespace fp8kit {
namespace {

// PyTorch's aliases (torch.float is float32, torch.int is int32, torch.long is int64, ...).
constexpr std::pair<std::string_view, DType> kAliases[] = {
    {"float", DType::float32}, {"double", DType::float64}, {"half", DType::float16},
    {"short", DType::int16},   {"int", DType::int32},      {"long", DType::int64},
};

std::atomic<DType> g_default_dtype{DType::float32};

}  // namespace

std::optional<DType> parse_dtype(std::string_view text) {
  if (text.starts_with("torch.")) text.remove_prefix(6);
  for (const DTypeInfo& i : kDTypeInfos) {
    if (text == i.name || text == i.short_name) return i.dtype;
  }
  for (const auto& [alias, dtype] : kAliases) {
    if (text == alias) return dtype;
  }
  return std::nullopt;
}

void set_default_dtype(DType d) {
  if (is_fp8(d)) {
    const Format f = *fp8_format(d);
    const FormatDescriptor& desc = descriptor(f);
    FP8KIT_THROW(ErrorKind::kInvalidArgument, "set_default_dtype(", name(d), "): an FP8 dtype cannot be the default ",
                 "dtype. FP8 is a storage format with no arithmetic of its own, and its range (largest finite value ",
                 max_finite(f), ") and precision (", desc.mantissa_bits,
                 " mantissa bits) are far too small for values ",
                 "created without a scale: ones, randn, sums and gradients would overflow, underflow or lose most of ",
                 "their digits. Create tensors in float32 or bfloat16 (the default stays ", name(default_dtype()),
                 ") and convert explicitly, e.g. t.to(DType::", name(d), ", Overflow::kSaturate), or quantize with ",
                 "a scale computed from the tensor's amax.");
  }
  FP8KIT_CHECK(info(d).kind == DTypeKind::kFloat, "set_default_dtype(", name(d),
               "): only a floating dtype (float32, float64, float16 or bfloat16) can be the default dtype, as in ",
               "PyTorch; pass integer and bool dtypes to the factories explicitly");
  g_default_dtype.store(d, std::memory_order_relaxed);
}

DType default_dtype() {
  return g_default_dtype.load(std::memory_order_relaxed);
}

}  // namespace fp8kit
