// The safetensors reader on crafted untrusted bytes: every malformed file is refused with its own one-line
// message (the reference implementation's rules, plus duplicate keys and NUL in names); what it accepts, we do.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "io/test_files.hpp"

namespace fp8kit {
namespace {

using test_files::st_image;

std::string tensor(const std::string& name, const std::string& dtype, const std::string& shape, std::uint64_t begin,
                   std::uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

// The message of the kParse error parsing `image` throws ("" and a test failure when it is accepted).
std::string rejection(const std::vector<std::byte>& image) {
  test_files::save_for_fuzzing("safetensors", image);
  try {
    (void)parse_safetensors(image);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kParse) << e.what();
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
    return message;
  }
  ADD_FAILURE() << "accepted";
  return "";
}

struct Malformed {
  const char* what;
  std::vector<std::byte> image;
  std::string message;  // the whole message
};

TEST(SafetensorsValidation, EveryMalformedFileHasItsOwnMessage) {
  const std::string w12 = tensor("w", "F32", "[3]", 0, 12);
  const std::vector<Malformed> cases = {
      {"shorter than the length", std::vector<std::byte>(3),
       "the file is 3 bytes, too short for the 8-byte header length"},
      {"header too large", st_image("{}", 0, 9'000'000'000), "header length 9000000000 exceeds the 100 MB limit"},
      {"header length u64 max", st_image("{}", 0, ~std::uint64_t{0}),
       "header length 18446744073709551615 exceeds the 100 MB limit"},
      {"header just over the limit", st_image("{}", 0, 100'000'001),
       "header length 100000001 exceeds the 100 MB limit"},
      {"a text file",
       [] {
         const std::string text = "root:x:0:0:root:/root:/bin/bash\n";
         std::vector<std::byte> bytes(text.size());
         std::memcpy(bytes.data(), text.data(), text.size());
         return bytes;
       }(),
       "not a safetensors file: no JSON header ('{') after the 8-byte header length (those bytes read as "
       "3475222254926655346)"},
      {"header past the end", st_image("{}", 0, 100),
       "header length 100 runs past the end of the file (2 bytes follow the length)"},
      {"truncated header", st_image("{" + w12 + "}", 12, 200),
       "header length 200 runs past the end of the file (67 bytes follow the length)"},
      {"empty header", st_image("", 0), "the header is empty (0 bytes of whitespace)"},
      {"whitespace header", st_image("   \n", 0), "the header is empty (4 bytes of whitespace)"},
      {"not JSON", st_image("{", 0),
       "the header is not valid JSON: parse error at line 1, column 2: syntax error while parsing object key - "
       "unexpected end of input; expected string literal"},
      {"trailing garbage", st_image("{} x", 0),
       "the header is not valid JSON: parse error at line 1, column 4: syntax error while parsing value - invalid "
       "literal; last read: '{} x'; expected end of input"},
      {"trailing NUL", st_image(std::string("{}\0", 3), 0), "the header is not valid JSON: a NUL byte at offset 2"},
      {"NUL then a second header", st_image(std::string("{}\0{\"w\":1}", 10), 0),
       "the header is not valid JSON: a NUL byte at offset 2"},
      {"raw NUL in a string", st_image(std::string("{\"a\0\":1}", 7), 0),
       "the header is not valid JSON: a NUL byte at offset 3"},
      {"two objects", st_image("{}{}", 0),
       "the header is not valid JSON: parse error at line 1, column 3: syntax error while parsing value - "
       "unexpected '{'; expected end of input"},
      {"comment", st_image("{/*x*/}", 0),
       "the header is not valid JSON: parse error at line 1, column 2: syntax error while parsing object key - "
       "invalid literal; last read: '{/'; expected string literal"},
      {"not UTF-8", st_image("{\"w\xFF\":1}", 0), "the header is not valid UTF-8 (byte 0xff at offset 3)"},
      {"overlong UTF-8", st_image("{\"\xC0\xAF\":1}", 0), "the header is not valid UTF-8 (byte 0xc0 at offset 2)"},
      {"UTF-16 surrogate", st_image("{\"\xED\xA0\x80\":1}", 0),
       "the header is not valid UTF-8 (byte 0xed at offset 2)"},
      {"byte-order mark", st_image("\xEF\xBB\xBF{}", 0),
       "the header starts with a UTF-8 byte-order mark, which JSON does not allow"},
      {"array root", st_image("[]", 0), "the header must be a JSON object, not an array"},
      {"string root", st_image("\"x\"", 0), "the header must be a JSON object, not a string"},
      {"deep nesting", st_image("{\"__metadata__\":{\"a\":[[[[[[]]]]]]}}", 0),
       "the header nests deeper than its schema allows (3 levels)"},
      {"entry not an object", st_image("{\"w\":\"x\"}", 0),
       "tensor 'w': the entry must be an object with dtype, shape and data_offsets, not a string"},
      {"missing dtype", st_image("{\"w\":{\"shape\":[3],\"data_offsets\":[0,12]}}", 12),
       "tensor 'w': the entry has no \"dtype\""},
      {"missing shape", st_image("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,12]}}", 12),
       "tensor 'w': the entry has no \"shape\""},
      {"missing offsets", st_image("{\"w\":{\"dtype\":\"F32\",\"shape\":[3]}}", 12),
       "tensor 'w': the entry has no \"data_offsets\""},
      {"dtype not a string", st_image("{\"w\":{\"dtype\":1,\"shape\":[3],\"data_offsets\":[0,12]}}", 12),
       "tensor 'w': dtype must be a string, not a number"},
      {"unknown dtype", st_image("{" + tensor("w", "f32", "[3]", 0, 12) + "}", 12),
       "tensor 'w': unknown dtype 'f32' (safetensors dtypes: BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, "
       "F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64)"},
      {"shape not an array", st_image("{" + tensor("w", "F32", "3", 0, 12) + "}", 12),
       "tensor 'w': shape must be an array, not a number"},
      {"negative dimension", st_image("{" + tensor("w", "F32", "[-3]", 0, 12) + "}", 12),
       "tensor 'w': shape[0] must be a non-negative integer, not -3"},
      {"fractional dimension", st_image("{" + tensor("w", "F32", "[1,3.0]", 0, 12) + "}", 12),
       "tensor 'w': shape[1] must be a non-negative integer, not 3.0"},
      {"exponent dimension", st_image("{" + tensor("w", "F32", "[3e0]", 0, 12) + "}", 12),
       "tensor 'w': shape[0] must be a non-negative integer, not 3.0"},
      {"dimension past u64", st_image("{" + tensor("w", "F32", "[18446744073709551616]", 0, 12) + "}", 12),
       "tensor 'w': shape[0] must be a non-negative integer, not 1.8446744073709552e+19"},
      {"boolean dimension", st_image("{" + tensor("w", "F32", "[true]", 0, 4) + "}", 4),
       "tensor 'w': shape[0] must be a non-negative integer, not a boolean"},
      {"dimension past i64", st_image("{" + tensor("w", "F32", "[9223372036854775808,0]", 0, 0) + "}", 0),
       "tensor 'w': shape[0] is 9223372036854775808, more than 2^63 - 1"},
      {"three offsets", st_image("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12,12]}}", 12),
       "tensor 'w': data_offsets must be two non-negative integers [begin, end], not [0,12,12]"},
      {"negative offset", st_image("{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[-1,0]}}", 0),
       "tensor 'w': data_offsets must be two non-negative integers [begin, end], not [-1,0]"},
      {"offsets reversed", st_image("{" + tensor("w", "U8", "[0]", 4, 0) + "}", 4),
       "tensor 'w': data_offsets [4, 0] end before they begin"},
      {"size mismatch", st_image("{" + tensor("w", "F32", "[3]", 0, 10) + "}", 10),
       "tensor 'w': data_offsets [0, 10] but F32 [3] needs 12 bytes"},
      {"size mismatch, one byte", st_image("{" + tensor("w", "U8", "[1]", 0, 2) + "}", 2),
       "tensor 'w': data_offsets [0, 2] but U8 [1] needs 1 byte"},
      {"element count wraps to 0", st_image("{" + tensor("w", "U8", "[4294967296,4294967296]", 0, 0) + "}", 0),
       "tensor 'w': shape [4294967296, 4294967296] has more than 2^64 elements"},
      {"bit count overflows", st_image("{" + tensor("w", "F64", "[2305843009213693952]", 0, 0) + "}", 0),
       "tensor 'w': F64 [2305843009213693952] is more than 2^64 bits"},
      {"sub-byte misaligned", st_image("{" + tensor("w", "F4", "[3]", 0, 2) + "}", 2),
       "tensor 'w': F4 [3] is 12 bits, not a whole number of bytes"},
      {"not starting at 0", st_image("{" + tensor("w", "F32", "[1]", 4, 8) + "}", 8),
       "tensor 'w' starts at 4 but the data section starts at 0 (offsets must be contiguous)"},
      {"gap", st_image("{" + tensor("a", "F32", "[3]", 0, 12) + "," + tensor("b", "F32", "[1]", 16, 20) + "}", 20),
       "tensor 'b' starts at 16 but the previous tensor 'a' ends at 12 (offsets must be contiguous)"},
      {"overlap", st_image("{" + tensor("a", "F32", "[3]", 0, 12) + "," + tensor("b", "F32", "[2]", 8, 16) + "}", 16),
       "tensor 'b' starts at 8 inside the previous tensor 'a' [0, 12) (tensors must not overlap)"},
      {"past the end", st_image("{" + tensor("w", "F32", "[4]", 0, 16) + "}", 12),
       "tensor 'w' ends at 16 but the data section holds 12 bytes (a truncated file?)"},
      {"trailing bytes", st_image("{" + w12 + "}", 13),
       "the tensors end at 12 but the data section holds 13 bytes (trailing bytes are not allowed)"},
      {"data without tensors", st_image("{}", 1),
       "the tensors end at 0 but the data section holds 1 bytes (trailing bytes are not allowed)"},
      {"duplicate tensor", st_image("{" + w12 + "," + w12 + "}", 12), "duplicate tensor name 'w'"},
      {"duplicate field",
       st_image("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}", 12),
       "tensor 'w': duplicate field 'dtype'"},
      {"duplicate metadata key", st_image("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0),
       "duplicate metadata key 'a'"},
      {"duplicate __metadata__", st_image("{\"__metadata__\":{},\"__metadata__\":{}}", 0),
       "duplicate key '__metadata__'"},
      {"duplicate with a control character",
       st_image("{" + tensor("a\\nb", "F32", "[3]", 0, 12) + "," + tensor("a\\nb", "F32", "[3]", 0, 12) + "}", 12),
       "duplicate tensor name 'a\\x0ab'"},
      {"NUL in a name", st_image("{" + tensor("w\\u0000x", "F32", "[3]", 0, 12) + "}", 12),
       "tensor name 'w\\x00x' contains a NUL character"},
      {"non-string metadata", st_image("{\"__metadata__\":{\"a\":1}}", 0),
       "__metadata__ value of 'a' must be a string, not a number"},
      {"nested metadata", st_image("{\"__metadata__\":{\"a\":{}}}", 0),
       "__metadata__ value of 'a' must be a string, not an object"},
      {"metadata not an object", st_image("{\"__metadata__\":\"x\"}", 0),
       "__metadata__ must be an object of strings, not a string"},
  };
  for (const Malformed& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_EQ(rejection(c.image), c.message);
  }
}

TEST(SafetensorsValidation, ManyTensorsAliasingOneSpanAreRefused) {
  // The reference's test_json_attack: ten tensors over the same 16 bytes (a denial of service by overlap).
  std::string header = "{";
  for (int i = 0; i < 10; ++i) header += (i ? "," : "") + tensor("t" + std::to_string(i), "F32", "[4]", 0, 16);
  header += "}";
  EXPECT_EQ(rejection(st_image(header, 16)),
            "tensor 't1' starts at 0 inside the previous tensor 't0' [0, 16) "
            "(tensors must not overlap)");
}

// A checkpoint of 100,000 tensors (DeepSeek-V3 has about 91,000): every one located, in file order. (With nlohmann's
// parser-callback interface the header's parse took time quadratic in its keys, over a minute here; the strict
// reader's own SAX handler is linear, a fraction of a second.)
TEST(SafetensorsValidation, AHundredThousandTensors) {
  constexpr int kTensors = 100'000;
  std::string header = "{";
  for (int i = 0; i < kTensors; ++i) {
    header +=
        (i ? "," : "") + tensor("layers." + std::to_string(i) + ".weight", "BF16", "[2, 2]", 8ull * i, 8ull * i + 8);
  }
  header += "}";
  const std::vector<std::byte> image = st_image(header, 8ull * kTensors);
  const SafetensorsView view = parse_safetensors(image);
  ASSERT_EQ(view.tensors.size(), static_cast<std::size_t>(kTensors));
  for (int i = 0; i < kTensors; i += 9'973) {
    EXPECT_EQ(view.tensors[static_cast<std::size_t>(i)].begin, 8ull * static_cast<std::uint64_t>(i));
  }
  EXPECT_EQ(view.tensors.back().end, 8ull * kTensors);
}

TEST(SafetensorsValidation, AcceptsWhatTheReferenceAccepts) {
  const std::string w12 = tensor("w", "F32", "[3]", 0, 12);
  const std::vector<std::pair<const char*, std::vector<std::byte>>> accepted = {
      {"leading spaces", st_image("   {" + w12 + "}", 12)},
      {"leading JSON whitespace", st_image("\t\n\r {" + w12 + "}", 12)},
      {"trailing JSON whitespace", st_image("{" + w12 + "} \t\n\r", 12)},
      {"header not padded to 8", st_image("{" + w12 + "}", 12)},
      {"metadata null", st_image("{\"__metadata__\":null," + w12 + "}", 12)},
      {"unknown fields ignored",
       st_image("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12],\"x\":[1]}}", 12)},
      {"negative zero", st_image("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[-0,12]}}", 12)},
      {"empty name", st_image("{" + tensor("", "F32", "[3]", 0, 12) + "}", 12)},
      {"no tensors", st_image("{}", 0)},
      {"only metadata", st_image("{\"__metadata__\":{\"w\":\"x\"}}", 0)},
      {"scalar", st_image("{" + tensor("s", "F32", "[]", 0, 4) + "}", 4)},
      {"empty tensors at one offset",
       st_image("{" + tensor("a", "F32", "[0]", 0, 0) + "," + tensor("b", "F32", "[1]", 0, 4) + "," +
                    tensor("c", "F32", "[0]", 4, 4) + "}",
                4)},
      {"huge empty tensor", st_image("{" + tensor("z", "F64", "[9223372036854775807,0]", 0, 0) + "}", 0)},
      {"F4 and F6",
       st_image("{" + tensor("f", "F4", "[4]", 0, 2) + "," + tensor("g", "F6_E2M3", "[4]", 2, 5) + "}", 5)},
      {"offsets out of name order",
       st_image("{" + tensor("a", "U8", "[1]", 1, 2) + "," + tensor("b", "U8", "[1]", 0, 1) + "}", 2)},
      {"escaped unicode name", st_image("{" + tensor("\\u00e9", "F32", "[3]", 0, 12) + "}", 12)},
  };
  for (const auto& [what, image] : accepted) {
    SCOPED_TRACE(what);
    EXPECT_NO_THROW((void)parse_safetensors(image));
  }
}

TEST(SafetensorsValidation, AcceptedFilesLocateEveryTensor) {
  // Leading whitespace, no padding: the data section starts at an odd offset and tensors are unaligned.
  const std::string header = " {" + tensor("b", "U8", "[3]", 4, 7) + "," + tensor("a", "F32", "[1]", 0, 4) + "}";
  const std::vector<std::byte> image = st_image(header, 7);
  const SafetensorsView view = parse_safetensors(image);
  EXPECT_EQ(view.header_size, header.size());
  ASSERT_EQ(view.tensors.size(), 2u);
  EXPECT_EQ(view.tensors[0].name, "a");  // file order
  EXPECT_EQ(view.tensors[1].name, "b");
  EXPECT_EQ(view.tensors[1].bytes.data(), image.data() + 8 + header.size() + 4);
  EXPECT_EQ(view.tensors[1].bytes.size(), 3u);
  EXPECT_EQ(view.tensors[1].bytes[0], std::byte{4});  // st_image's data counts up from 0
  const Tensor a = to_tensor(view.tensors[0]);        // unaligned source bytes are copied
  EXPECT_EQ(a.dtype(), DType::float32);
  EXPECT_EQ(std::memcmp(a.raw(), image.data() + 8 + header.size(), 4), 0);
  const std::vector<std::byte> escaped = st_image("{" + tensor("\\u00e9", "F32", "[3]", 0, 12) + "}", 12);
  const SafetensorsView unicode = parse_safetensors(escaped);
  EXPECT_EQ(unicode.tensors.at(0).name, "\xC3\xA9");
}

TEST(SafetensorsValidation, HeaderAtTheLimitIsNotTooLarge) {
  // Exactly 100,000,000 bytes is allowed; a file that short of it fails on the length, not on the limit.
  EXPECT_EQ(rejection(st_image("{}", 0, kSafetensorsMaxHeaderSize)),
            "header length 100000000 runs past the end of the file (2 bytes follow the length)");
}

}  // namespace
}  // namespace fp8kit
