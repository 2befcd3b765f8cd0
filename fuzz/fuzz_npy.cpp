// The .npy reader of `fp8kit analyze` on any bytes: what it accepts has numel x itemsize bytes of data and converts
// to float32 with one value per element; everything else is refused with one line.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fp8kit/io/npy.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace fp8kit;
  NpyArray array;
  if (!fuzz::accepted([&] { array = parse_npy({reinterpret_cast<const std::byte*>(data), size}); })) return 0;
  const std::size_t itemsize = array.dtype == NpyDType::kFloat16 ? 2 : array.dtype == NpyDType::kFloat32 ? 4 : 8;
  std::size_t numel = 1;
  for (const std::int64_t d : array.shape) {
    fuzz::check(d >= 0, "a negative dimension accepted");
    numel *= static_cast<std::size_t>(d);
  }
  fuzz::check(static_cast<std::size_t>(array.numel()) == numel && array.data.size() == numel * itemsize,
              "an array accepted whose data is not numel x itemsize bytes");
  fuzz::check(array.data.size() <= size, "more data than the file holds");
  fuzz::check(array.to_float32().size() == numel, "to_float32 gave another count of values");
  return 0;
}
