// The names of the kernel contracts (fp8kit/common/kernel_contract.hpp), as fp8kit info and the benches print them.
#include "fp8kit/common/kernel_contract.hpp"

namespace fp8kit {

std::string_view name(KernelContract contract) {
  return contract == KernelContract::kBitIdentical ? "bit-identical" : "fp32-bound";
}

}  // namespace fp8kit
