// The .npy reader: every version, dtype and order it accepts, and a specific error for each malformed input.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/io/npy.hpp"
#include "io/test_files.hpp"

namespace fp8kit {
namespace {

// Builds a .npy file the way numpy.save does (header padded with spaces to a multiple of 64, ending in '\n').
std::vector<std::byte> make_npy(const std::string& dict, const void* data, std::size_t bytes, int major = 1) {
  std::string header = dict;
  const std::size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::vector<std::byte> out;
  auto put = [&](const void* p, std::size_t n) {
    if (n == 0) return;
    const std::size_t at = out.size();
    out.resize(at + n);
    std::memcpy(out.data() + at, p, n);
  };
  const unsigned char magic[] = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<unsigned char>(major), 0};
  put(magic, 8);
  const std::uint32_t len = static_cast<std::uint32_t>(header.size());
  put(&len, major == 1 ? 2 : 4);
  put(header.data(), header.size());
  put(data, bytes);
  return out;
}

TEST(Npy, ReadsFloat32CAndFortranOrder) {
  const float c[] = {1, 2, 3, 4, 5, 6};  // 2 x 3, C order
  const NpyArray a = parse_npy(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", c, sizeof c));
  EXPECT_EQ(a.dtype, NpyDType::kFloat32);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.to_float32(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  const float f[] = {1, 4, 2, 5, 3, 6};  // the same matrix in Fortran order
  const NpyArray b = parse_npy(make_npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f, sizeof f, 2));
  EXPECT_EQ(b.to_float32(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(Npy, ReadsFloat16Float64ScalarsAndEmpty) {
  const std::uint16_t h[] = {0x3C00, 0xC000};  // 1, -2
  EXPECT_EQ(parse_npy(make_npy("{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }", h, sizeof h)).to_float32(),
            (std::vector<float>{1.0f, -2.0f}));
  const double d[] = {0.1};
  const NpyArray s = parse_npy(make_npy("{'descr': '<f8', 'fortran_order': False, 'shape': (), }", d, sizeof d, 3));
  EXPECT_TRUE(s.shape.empty());
  EXPECT_EQ(s.numel(), 1);
  EXPECT_EQ(s.to_float32(), (std::vector<float>{0.1f}));
  const NpyArray e = parse_npy(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }", nullptr, 0));
  EXPECT_EQ(e.numel(), 0);
  // No byte-order character ('f4', as numpy.dtype('f4') reads it) or '=' / '|': the machine's order
  const float v[] = {1.5f, -3.0f};
  for (const char* descr : {"f4", "=f4", "|f4"}) {
    const std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2,), }";
    EXPECT_EQ(parse_npy(make_npy(header, v, sizeof v)).to_float32(), (std::vector<float>{1.5f, -3.0f})) << descr;
  }
}

void expect_parse_error(const std::vector<std::byte>& bytes, const std::string& needle) {
  test_files::save_for_fuzzing("npy", bytes);
  try {
    parse_npy(bytes);
    ADD_FAILURE() << "accepted; expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kParse);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Npy, RejectsMalformedFiles) {
  const float v[] = {1, 2};
  const std::string ok = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  auto good = make_npy(ok, v, sizeof v);
  EXPECT_NO_THROW(parse_npy(good));
  auto bad_magic = good;
  bad_magic[1] = std::byte{'X'};
  expect_parse_error(bad_magic, "magic");
  auto bad_version = good;
  bad_version[6] = std::byte{9};
  expect_parse_error(bad_version, "version 9");
  expect_parse_error(std::vector<std::byte>(good.begin(), good.begin() + 9), "magic");
  expect_parse_error(std::vector<std::byte>(good.begin(), good.end() - 1), "needs 8");  // truncated data
  auto extra = good;
  extra.push_back(std::byte{0});
  expect_parse_error(extra, "needs 8");
  expect_parse_error(make_npy("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", v, sizeof v), "'<i4'");
  expect_parse_error(make_npy("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", v, sizeof v), "big-endian");
  expect_parse_error(make_npy("{'descr': '<f4', 'shape': (2,), }", v, sizeof v), "lacks");
  expect_parse_error(make_npy("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", v, sizeof v),
                     "True or False");
  expect_parse_error(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", v, sizeof v),
                     "non-negative");
  expect_parse_error(make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'extra': 1}", v, sizeof v),
                     "unknown header key");
  expect_parse_error(
      make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999, 99999999999, 99999999999), }", v,
               sizeof v),
      "too large");
  EXPECT_THROW(load_npy("/nonexistent/file.npy"), Error);
}

// An empty array may have dimensions whose product overflows, in either order (found by fuzz/fuzz_npy: numel() and
// the Fortran strides multiplied them as int64 before reaching the zero).
TEST(Npy, EmptyArraysWithHugeDimensions) {
  for (const char* order : {"False", "True"}) {
    const NpyArray a = parse_npy(make_npy(
        std::string("{'descr': '<f4', 'fortran_order': ") + order + ", 'shape': (100000000, 99999999999, 0, 999), }",
        nullptr, 0));
    EXPECT_EQ(a.numel(), 0) << order;
    EXPECT_TRUE(a.data.empty() && a.to_float32().empty()) << order;
  }
}

// What a file says is quoted escaped in messages: an ESC (a terminal escape sequence), other control bytes and
// invalid UTF-8 come out as \xNN, so a corrupted file cannot write to the terminal through an error.
TEST(Npy, MessagesEscapeWhatTheFileSays) {
  const float v[] = {1, 2};
  for (const std::string& bad : {std::string("\x1b[2Jdescr"),
                                 std::string("\xe4"
                                             "escr"),
                                 std::string("a\rb")}) {
    const auto file =
        make_npy("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), '" + bad + "': 1}", v, sizeof v);
    try {
      parse_npy(file);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      for (unsigned char c : what)
        EXPECT_TRUE(c >= 0x20 && c < 0x7F) << "raw byte " << static_cast<int>(c) << " in " << what;
      EXPECT_NE(what.find("\\x"), std::string::npos) << what;
    }
  }
  const auto dtype = make_npy("{'descr': '<\x1b]0;x\x07', 'fortran_order': False, 'shape': (2,), }", v, sizeof v);
  try {
    parse_npy(dtype);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'<\\x1b]0;x\\x07'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fp8kit
