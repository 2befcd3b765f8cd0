// Format names: parsing what users type (fp8kit and PyTorch/ml_dtypes spellings).
#include "fp8kit/format/format.hpp"

namespace fp8kit {

std::optional<Format> parse_format(std::string_view text) {
  for (const FormatDescriptor& d : kFormatDescriptors) {
    if (text == d.name || text == d.torch_name) return d.format;
  }
  return std::nullopt;
}

}  // namespace fp8kit
