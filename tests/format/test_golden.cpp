// Golden vectors from ml_dtypes (tests/golden/ml_dtypes_vectors.txt, made by make_ml_dtypes_golden.py): every
// conversion fp8kit makes without saturation must give ml_dtypes' code, from float, double, bfloat16 and float16.
#include <gtest/gtest.h>

#include <bit>
#include <fstream>
#include <sstream>
#include <string>

#include "fp8kit/format/codec.hpp"

namespace fp8kit {
namespace {

TEST(Golden, MlDtypesVectors) {
  const std::string path = std::string(FP8KIT_TEST_DATA_DIR) + "/golden/ml_dtypes_vectors.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot open " << path;
  std::string line;
  long checked = 0, mismatches = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string fmt, src, input, code;
    ASSERT_TRUE(fields >> fmt >> src >> input >> code) << line;
    const auto format = parse_format(fmt);
    ASSERT_TRUE(format.has_value()) << line;
    const EncodeSpec spec{*format, Overflow::kNonSaturating};
    const std::uint64_t bits = std::stoull(input, nullptr, 16);
    const auto want = static_cast<std::uint8_t>(std::stoul(code, nullptr, 16));
    std::uint8_t got = 0;
    if (src == "f32") {
      got = encode(std::bit_cast<float>(static_cast<std::uint32_t>(bits)), spec);
    } else if (src == "f64") {
      got = encode(std::bit_cast<double>(bits), spec);
    } else if (src == "bf16") {
      got = encode(bfloat16::from_bits(static_cast<std::uint16_t>(bits)), spec);
    } else if (src == "f16") {
      got = encode(float16::from_bits(static_cast<std::uint16_t>(bits)), spec);
    } else {
      FAIL() << "unknown source type in " << line;
    }
    ++checked;
    if (got != want && ++mismatches <= 20) ADD_FAILURE() << line << " -> fp8kit " << std::hex << int(got);
  }
  EXPECT_GT(checked, 10000);
  EXPECT_EQ(mismatches, 0) << "of " << checked;
}

}  // namespace
}  // namespace fp8kit
