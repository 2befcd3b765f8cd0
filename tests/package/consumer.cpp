// A program outside the project that finds fp8kit with find_package and links fp8kit::fp8kit.
#include <fp8kit/fp8kit.hpp>

#include <cstdio>

int main() {
  const auto q = fp8kit::float8_e4m3fn::from_float(465.0f, fp8kit::Overflow::kSaturate);
  const fp8kit::Tensor t = fp8kit::tensor({1.0, 1.5, 1.25}, fp8kit::DType::float8_e4m3fn);
  std::printf("%g %s\n", q.to_float(), fp8kit::to_string(t).c_str());
  return q.to_float() == 448.0f ? 0 : 1;
}
