// safetensors: the dtype registry, round trips of every dtype with metadata, the writer's layout (byte for byte
// the reference writer's), Tensor conversions both ways, the writer's input checks and the pickle refusal.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "io/test_files.hpp"

namespace fp8kit {
namespace {

using test_files::error_of;
using test_files::pattern_bytes;
using test_files::read_file;
using test_files::TempDir;

// A shape whose elements fill whole bytes in every dtype (F4 needs an even count, F6 a multiple of 4).
Shape shape_for(SafetensorsDType d) {
  if (bit_size(d) == 4) return {2, 4};
  if (bit_size(d) == 6) return {4, 3};
  return {3, 5};
}

std::vector<std::byte> from_hex(const std::string& hex) {
  std::vector<std::byte> out(hex.size() / 2);
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::byte>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return out;
}

TEST(SafetensorsDType, RegistryNamesBitsAndTensorDTypes) {
  const std::map<std::string, int> bits = {
      {"BOOL", 8},    {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6},     {"U8", 8},          {"I8", 8},
      {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
      {"U16", 16},    {"F16", 16},    {"BF16", 16},   {"I32", 32},        {"U32", 32},        {"F32", 32},
      {"C64", 64},    {"F64", 64},    {"I64", 64},    {"U64", 64}};
  ASSERT_EQ(bits.size(), kSafetensorsDTypes.size());
  for (const SafetensorsDTypeInfo& i : kSafetensorsDTypes) {
    SCOPED_TRACE(std::string(i.name));
    EXPECT_EQ(parse_safetensors_dtype(i.name), i.dtype);
    EXPECT_EQ(bit_size(i.dtype), bits.at(std::string(i.name)));
  }
  EXPECT_EQ(tensor_dtype(SafetensorsDType::F8_E4M3), DType::float8_e4m3fn);
  EXPECT_EQ(tensor_dtype(SafetensorsDType::F8_E5M2), DType::float8_e5m2);
  EXPECT_EQ(tensor_dtype(SafetensorsDType::F8_E8M0), DType::float8_e8m0fnu);
  EXPECT_EQ(tensor_dtype(SafetensorsDType::F8_E4M3FNUZ), DType::float8_e4m3fnuz);
  EXPECT_EQ(tensor_dtype(SafetensorsDType::F8_E5M2FNUZ), DType::float8_e5m2fnuz);
  for (auto d : {SafetensorsDType::U16, SafetensorsDType::U32, SafetensorsDType::U64, SafetensorsDType::C64,
                 SafetensorsDType::F4, SafetensorsDType::F6_E2M3, SafetensorsDType::F6_E3M2}) {
    EXPECT_FALSE(tensor_dtype(d).has_value()) << name(d);
  }
  for (DType d : kAllDTypes) EXPECT_EQ(tensor_dtype(safetensors_dtype(d)), d) << fp8kit::name(d);
  for (const char* text : {"f32", "float32", "F8_E4M3FN", "e4m3fn", "", " F32"}) {
    EXPECT_FALSE(parse_safetensors_dtype(text).has_value()) << text;
  }
}

TEST(SafetensorsDType, ByteSizeIsCheckedArithmetic) {
  EXPECT_EQ(safetensors_byte_size(SafetensorsDType::F32, std::vector<std::int64_t>{3}), 12u);
  EXPECT_EQ(safetensors_byte_size(SafetensorsDType::F32, std::vector<std::int64_t>{}), 4u);  // a scalar
  EXPECT_EQ(safetensors_byte_size(SafetensorsDType::BF16, std::vector<std::int64_t>{0, 7}), 0u);
  EXPECT_EQ(safetensors_byte_size(SafetensorsDType::F4, std::vector<std::int64_t>{2, 3}), 3u);
  EXPECT_EQ(safetensors_byte_size(SafetensorsDType::F6_E3M2, std::vector<std::int64_t>{8}), 6u);
  EXPECT_EQ(safetensors_byte_size(SafetensorsDType::C64, std::vector<std::int64_t>{2}), 16u);
  const auto fails = [](SafetensorsDType d, std::vector<std::int64_t> shape, const std::string& fragment) {
    const Error e = error_of([&] { (void)safetensors_byte_size(d, shape); });
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  };
  fails(SafetensorsDType::F4, {3}, "F4 [3] is 12 bits, not a whole number of bytes");
  fails(SafetensorsDType::F6_E2M3, {2}, "not a whole number of bytes");
  fails(SafetensorsDType::F32, {-1}, "negative");
  // 2^32 x 2^32 wraps to 0 in unchecked 64-bit arithmetic (the safetensors-cpp out-of-bounds bug).
  fails(SafetensorsDType::U8, {std::int64_t{1} << 32, std::int64_t{1} << 32}, "more than 2^64 elements");
  fails(SafetensorsDType::F64, {std::int64_t{1} << 61}, "more than 2^64 bits");
}

TEST(Safetensors, RoundTripsEveryDTypeWithMetadata) {
  TempDir dir;
  std::vector<std::vector<std::byte>> data;
  std::vector<SafetensorsEntry> entries;
  for (const SafetensorsDTypeInfo& i : kSafetensorsDTypes) {
    const Shape shape = shape_for(i.dtype);
    data.push_back(pattern_bytes(safetensors_byte_size(i.dtype, shape), static_cast<std::uint32_t>(data.size())));
    entries.push_back({"t." + std::string(i.name), i.dtype, shape, data.back(), {}});
  }
  const std::vector<std::byte> scalar = pattern_bytes(4, 99);
  entries.push_back({"scalar", SafetensorsDType::F32, {}, scalar, {}});
  entries.push_back({"empty", SafetensorsDType::BF16, {0, 3}, {}, {}});
  entries.push_back({"empty_f4", SafetensorsDType::F4, {5, 0}, {}, {}});
  const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                       {"note",
                                                        "\xC3\xBCnic\xC3\xB6"
                                                        "de \"quoted\"\n\ttab"},
                                                       {"empty", ""}};

  const auto path = dir / "all.safetensors";
  write_safetensors(path, entries, metadata);
  EXPECT_EQ(test_files::list_dir(dir.path()), std::vector<std::string>{"all.safetensors"});  // no temporary left
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata(), metadata);
  ASSERT_EQ(f.tensors().size(), entries.size());
  for (const SafetensorsEntry& e : entries) {
    SCOPED_TRACE(e.name);
    const SafetensorsTensor& t = f.at(e.name);
    EXPECT_EQ(t.dtype, e.dtype);
    EXPECT_EQ(t.shape, e.shape);
    EXPECT_TRUE(std::ranges::equal(t.bytes, e.bytes));
  }
  EXPECT_EQ(f.at("scalar").numel(), 1);
  EXPECT_EQ(f.at("empty").numel(), 0);
  // The file is exactly the in-memory image, and parsing the image gives the same tensors.
  const std::vector<std::byte> image = serialize_safetensors(entries, metadata);
  EXPECT_EQ(read_file(path), image);
  EXPECT_EQ(f.file_size(), image.size());
  const SafetensorsView view = parse_safetensors(image);
  ASSERT_EQ(view.tensors.size(), f.tensors().size());
  for (std::size_t i = 0; i < view.tensors.size(); ++i) EXPECT_EQ(view.tensors[i].name, f.tensors()[i].name);
}

TEST(Safetensors, LayoutIsAlignedAndPaddedAsTheReferenceWriter) {
  std::vector<std::vector<std::byte>> data;
  std::vector<SafetensorsEntry> entries;
  const Shape shape = {1, 2, 3, 4, 5, 6, 4};
  for (const std::string n : {"z", "a", "m"}) {
    for (const SafetensorsDTypeInfo& i : kSafetensorsDTypes) {
      data.push_back(pattern_bytes(safetensors_byte_size(i.dtype, shape), 3));
      entries.push_back({n + std::string(i.name), i.dtype, shape, data.back(), {}});
    }
  }
  const std::vector<std::byte> image = serialize_safetensors(entries, {{"k", "v"}});
  const SafetensorsView view = parse_safetensors(image);
  EXPECT_EQ(view.header_size % 8, 0u);
  EXPECT_EQ(static_cast<char>(image[8]), '{');
  const std::string header(reinterpret_cast<const char*>(image.data()) + 8, view.header_size);
  EXPECT_TRUE(header.starts_with("{\"__metadata__\":{\"k\":\"v\"},")) << header.substr(0, 40);
  for (std::size_t i = 0; i < view.tensors.size(); ++i) {
    const SafetensorsTensor& t = view.tensors[i];
    if (bit_size(t.dtype) >= 8) EXPECT_EQ(t.begin % static_cast<unsigned>(bit_size(t.dtype) / 8), 0u) << t.name;
    if (i > 0) {  // dtype descending (alignment), then name
      const SafetensorsTensor& p = view.tensors[i - 1];
      EXPECT_TRUE(p.dtype > t.dtype || (p.dtype == t.dtype && p.name < t.name)) << p.name << " " << t.name;
    }
  }
}

TEST(Safetensors, MatchesTheReferenceWriterByteForByte) {
  // safetensors 0.8.0: save({"w": arange(4, float32).reshape(2, 2), "b": float8_e4m3fn codes [0x38, 0x40, 0xc0],
  // "m": [True, False], "h": bfloat16 [1.5]}, metadata={"format": "pt"}).
  const std::vector<std::byte> golden = from_hex(
      "08010000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a227074227d2c2277223a7b2264747970"
      "65223a22463332222c227368617065223a5b322c325d2c22646174615f6f666673657473223a5b302c31365d7d2c2268223a"
      "7b226474797065223a2242463136222c227368617065223a5b315d2c22646174615f6f666673657473223a5b31362c31385d"
      "7d2c2262223a7b226474797065223a2246385f45344d33222c227368617065223a5b335d2c22646174615f6f666673657473"
      "223a5b31382c32315d7d2c226d223a7b226474797065223a22424f4f4c222c227368617065223a5b325d2c22646174615f6f"
      "666673657473223a5b32312c32335d7d7d2020202020000000000000803f0000004000004040c03f3840c00100");
  const SafetensorsView reference = parse_safetensors(golden);
  std::vector<SafetensorsEntry> entries;
  for (const SafetensorsTensor& t : reference.tensors) entries.push_back(safetensors_entry(t));
  std::reverse(entries.begin(), entries.end());  // the writer orders them itself
  EXPECT_EQ(serialize_safetensors(entries, reference.metadata), golden);
  EXPECT_EQ(reference.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
}

TEST(Safetensors, FileWithoutTensors) {
  const std::vector<std::byte> image = serialize_safetensors({}, {});
  EXPECT_EQ(image, test_files::st_image("{}      ", 0));
  const SafetensorsView view = parse_safetensors(image);
  EXPECT_TRUE(view.tensors.empty());
  EXPECT_TRUE(view.metadata.empty());
}

TEST(Safetensors, TensorsConvertBothWays) {
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(std::string(fp8kit::name(d)));
    const Tensor source = tensor({0.0, 1.0, 1.5, 0.0, 3.0, 1.0}, DType::float32).reshape({2, 3}).to(d);
    const SafetensorsEntry entry = safetensors_entry("x", source);
    EXPECT_EQ(entry.dtype, safetensors_dtype(d));
    const std::vector<SafetensorsEntry> entries = {entry};
    const std::vector<std::byte> image = serialize_safetensors(entries);
    const Tensor back = to_tensor(parse_safetensors(image).tensors.at(0));
    EXPECT_EQ(back.dtype(), d);
    EXPECT_EQ(back.shape(), (Shape{2, 3}));
    EXPECT_EQ(std::memcmp(back.raw(), source.raw(), static_cast<std::size_t>(source.nbytes())), 0);
  }
}

TEST(Safetensors, ToTensorRefusesWhatATensorCannotHold) {
  const std::vector<std::byte> two = pattern_bytes(4, 1);
  const std::vector<SafetensorsEntry> u16 = {{"u", SafetensorsDType::U16, {2}, two, {}}};
  const std::vector<std::byte> u16_image = serialize_safetensors(u16);
  const Error e = error_of([&] { (void)to_tensor(parse_safetensors(u16_image).tensors.at(0)); });
  EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  EXPECT_NE(std::string(e.what()).find("tensor 'u': U16 has no fp8kit Tensor dtype"), std::string::npos) << e.what();

  const std::vector<std::byte> flags = {std::byte{0}, std::byte{1}, std::byte{2}};
  const std::vector<SafetensorsEntry> bools = {{"m", SafetensorsDType::BOOL, {3}, flags, {}}};
  const std::vector<std::byte> bool_image = serialize_safetensors(bools);
  const Error b = error_of([&] { (void)to_tensor(parse_safetensors(bool_image).tensors.at(0)); });
  EXPECT_EQ(b.kind(), ErrorKind::kParse);
  EXPECT_STREQ(b.what(), "tensor 'm': BOOL element 2 is byte 2, not 0 or 1");
}

// convert_tensor_into casts a file's tensor in place into a caller's buffer exactly as to_tensor(t).to() does: every
// pair of float dtypes (FP8 included, both overflow policies), a tensor the file leaves misaligned (through a copy),
// BOOL (its bytes checked), and a buffer of the wrong size refused.
TEST(Safetensors, ConvertIntoMatchesToTensorTo) {
  std::vector<float> values(1000);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = std::ldexp(static_cast<float>(i % 37) - 18.0f, static_cast<int>(i % 41) - 20);
  values[7] = std::numeric_limits<float>::quiet_NaN();
  values[8] = -std::numeric_limits<float>::infinity();
  const Tensor base = tensor(std::vector<double>(values.begin(), values.end()), DType::float64);
  const DType floats[] = {DType::float64, DType::float32,       DType::bfloat16,
                          DType::float16, DType::float8_e4m3fn, DType::float8_e5m2};
  for (DType from : floats) {
    const Tensor src = base.to(from);
    const std::vector<SafetensorsEntry> entries = {safetensors_entry("x", src)};
    const std::vector<std::byte> image = serialize_safetensors(entries);
    // The same tensor one byte further into a copy of the image: misaligned for every dtype wider than a byte.
    std::vector<std::byte> shifted(image.size() + 1);
    std::memcpy(shifted.data() + 1, image.data(), image.size());
    const SafetensorsView aligned = parse_safetensors(image);
    const SafetensorsView moved = parse_safetensors(std::span<const std::byte>(shifted).subspan(1));
    for (DType to : floats) {
      for (Overflow overflow : {Overflow::kNonSaturating, Overflow::kSaturate}) {
        SCOPED_TRACE(std::string(name(from)) + " -> " + std::string(name(to)));
        const Tensor want = src.to(to, overflow);
        for (const SafetensorsView* v : {&aligned, &moved}) {
          std::vector<std::byte> out(static_cast<std::size_t>(want.nbytes()) + 8);
          const auto at = std::span<std::byte>(out).subspan(8, static_cast<std::size_t>(want.nbytes()));
          convert_tensor_into(v->tensors[0], to, overflow, at);
          EXPECT_EQ(std::memcmp(at.data(), want.raw(), at.size()), 0);
        }
      }
    }
  }
  const std::vector<std::byte> flags = {std::byte{0}, std::byte{1}, std::byte{2}};
  const std::vector<SafetensorsEntry> bool_entries = {{"m", SafetensorsDType::BOOL, {3}, flags, {}}};
  const std::vector<std::byte> bools = serialize_safetensors(bool_entries);
  std::vector<std::byte> out(12);
  EXPECT_EQ(error_of([&] {
              convert_tensor_into(parse_safetensors(bools).tensors[0], DType::float32, Overflow::kSaturate, out);
            }).kind(),
            ErrorKind::kParse);
  const std::vector<std::byte> twelve = pattern_bytes(12, 1);
  const std::vector<SafetensorsEntry> f32_entries = {{"f", SafetensorsDType::F32, {3}, twelve, {}}};
  const std::vector<std::byte> f32 = serialize_safetensors(f32_entries);
  std::vector<std::byte> small(5);
  EXPECT_EQ(error_of([&] {
              convert_tensor_into(parse_safetensors(f32).tensors[0], DType::bfloat16, Overflow::kSaturate, small);
            }).kind(),
            ErrorKind::kInvalidArgument);
}

TEST(Safetensors, FillIsCalledOnceWhenTheWriterReachesTheTensor) {
  std::vector<std::string> calls;
  const auto filler = [&calls](std::string name, std::byte value) {
    return [&calls, name, value](std::span<std::byte> out) {
      calls.push_back(name + ":" + std::to_string(out.size()));
      std::fill(out.begin(), out.end(), value);
    };
  };
  std::vector<SafetensorsEntry> entries = {{"b", SafetensorsDType::U8, {3}, {}, filler("b", std::byte{7})},
                                           {"a", SafetensorsDType::F64, {2}, {}, filler("a", std::byte{9})}};
  const std::vector<std::byte> image = serialize_safetensors(entries);
  const SafetensorsView view = parse_safetensors(image);
  EXPECT_EQ(calls, (std::vector<std::string>{"a:16", "b:3"}));  // file order: F64 before U8
  EXPECT_EQ(view.tensors.at(1).bytes[2], std::byte{7});
  EXPECT_EQ(view.tensors.at(0).bytes[15], std::byte{9});
}

TEST(Safetensors, WriterRefusesBadEntriesBeforeCreatingAnything) {
  TempDir dir;
  const std::vector<std::byte> twelve = pattern_bytes(12, 1);
  const auto refused = [&](std::vector<SafetensorsEntry> entries, std::map<std::string, std::string> metadata,
                           const std::string& message) {
    const Error e = error_of([&] { write_safetensors(dir / "out.safetensors", entries, metadata); });
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    EXPECT_TRUE(test_files::list_dir(dir.path()).empty());
  };
  const SafetensorsEntry w = {"w", SafetensorsDType::F32, {3}, twelve, {}};
  refused({w, w}, {}, "duplicate tensor name 'w'");
  refused({{"__metadata__", SafetensorsDType::F32, {3}, twelve, {}}}, {}, "'__metadata__' is reserved");
  refused({{std::string("a\0b", 3), SafetensorsDType::F32, {3}, twelve, {}}}, {},
          "tensor name 'a\\x00b' contains a NUL");
  refused({{"bad\xFF", SafetensorsDType::F32, {3}, twelve, {}}}, {}, "tensor name 'bad\\xff' is not valid UTF-8");
  refused({{"w", SafetensorsDType::F32, {4}, twelve, {}}}, {}, "tensor 'w': 12 bytes given but F32 [4] needs 16");
  refused({{"w", SafetensorsDType::F4, {3}, twelve, {}}}, {}, "tensor 'w': F4 [3] is 12 bits");
  refused({{"w", SafetensorsDType::F32, {-3}, twelve, {}}}, {}, "tensor 'w': shape [-3] has a negative dimension");
  refused({w}, {{"k", "\xC0\x80"}}, "metadata entry 'k' is not valid UTF-8");
}

TEST(Safetensors, CopiesTensorsBetweenFiles) {
  TempDir dir;
  const std::vector<std::byte> a = pattern_bytes(24, 5), b = pattern_bytes(3, 6);
  const std::vector<SafetensorsEntry> entries = {{"a", SafetensorsDType::F64, {3}, a, {}},
                                                 {"b", SafetensorsDType::F8_E5M2, {3}, b, {}}};
  write_safetensors(dir / "one.safetensors", entries, {{"format", "pt"}});
  const SafetensorsFile one = SafetensorsFile::open(dir / "one.safetensors");
  std::vector<SafetensorsEntry> copies;
  for (const SafetensorsTensor& t : one.tensors()) copies.push_back(safetensors_entry(t));
  write_safetensors(dir / "two.safetensors", copies, one.metadata());
  EXPECT_EQ(read_file(dir / "one.safetensors"), read_file(dir / "two.safetensors"));
  EXPECT_EQ(one.find("nope"), nullptr);
  const Error e = error_of([&] { (void)one.at("nope"); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(std::string(e.what()).find("no tensor 'nope' in "), std::string::npos);
}

TEST(Safetensors, PickleFilesAreRefusedByExtension) {
  TempDir dir;
  const std::vector<std::byte> valid = serialize_safetensors({}, {});
  for (const std::string file : {"model.bin", "model.pt", "model.pth", "model.ckpt", "x.pkl", "x.pickle", "M.PT"}) {
    test_files::write_file(dir / file, valid);  // even a valid safetensors image: the name says pickle
    const Error e = error_of([&] { (void)SafetensorsFile::open(dir / file); });
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << file;
    EXPECT_EQ(std::string(e.what()),
              "'" + (dir / file).string() +
                  "' is a pickle-based PyTorch file: fp8kit does not load pickles (they can run arbitrary code); "
                  "convert it to .safetensors where you trust it (safetensors' convert script, or torch.load + "
                  "safetensors.torch.save_file)");
    EXPECT_TRUE(is_pickle_path(file));
  }
  EXPECT_FALSE(is_pickle_path("model.safetensors"));
  EXPECT_FALSE(is_pickle_path("binary"));
}

TEST(Safetensors, PickleContentIsRecognizedUnderAnyName) {
  TempDir dir;
  const std::string zip = std::string("PK\x03\x04", 4) + "archive/data.pkl and more bytes";
  const std::string pickle = std::string("\x80\x02}q\x00(X\x06\x00\x00\x00weightq\x01", 20);
  for (const auto& [content, what] : {std::pair{zip, std::string("a zip archive, as torch.save writes")},
                                      std::pair{pickle, std::string("a Python pickle (protocol 2)")}}) {
    test_files::write_text(dir / "renamed.safetensors", content);
    const Error e = error_of([&] { (void)SafetensorsFile::open(dir / "renamed.safetensors"); });
    EXPECT_EQ(e.kind(), ErrorKind::kParse);
    const std::string message = e.what();
    EXPECT_TRUE(message.starts_with((dir / "renamed.safetensors").string() + ": not a safetensors file but " + what))
        << message;
    EXPECT_NE(message.find("fp8kit does not load pickles (they can run arbitrary code)"), std::string::npos);
  }
}

TEST(Safetensors, OpenErrorsNameTheFile) {
  TempDir dir;
  test_files::write_file(dir / "bad.safetensors", test_files::st_image("{", 0));
  const Error e = error_of([&] { (void)SafetensorsFile::open(dir / "bad.safetensors"); });
  EXPECT_EQ(e.kind(), ErrorKind::kParse);
  EXPECT_TRUE(std::string(e.what()).starts_with((dir / "bad.safetensors").string() + ": the header is not valid JSON"))
      << e.what();
  const Error missing = error_of([&] { (void)SafetensorsFile::open(dir / "missing.safetensors"); });
  EXPECT_EQ(missing.kind(), ErrorKind::kIo);
  EXPECT_NE(std::string(missing.what()).find("No such file or directory"), std::string::npos);
  const Error directory = error_of([&] { (void)SafetensorsFile::open(dir.path()); });
  EXPECT_EQ(directory.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(std::string(directory.what()).find("is a directory"), std::string::npos);
  // A pipe is refused at once (it waited for a writer forever), as a device is.
  ASSERT_EQ(::mkfifo((dir / "pipe.safetensors").c_str(), 0600), 0);
  const Error pipe = error_of([&] { (void)SafetensorsFile::open(dir / "pipe.safetensors"); });
  EXPECT_EQ(pipe.kind(), ErrorKind::kInvalidArgument);
  EXPECT_NE(std::string(pipe.what()).find("is not a regular file (it is a pipe)"), std::string::npos) << pipe.what();
  EXPECT_EQ(error_of([] { (void)SafetensorsFile::open("/dev/null"); }).kind(), ErrorKind::kInvalidArgument);
  test_files::write_text(dir / "empty.safetensors", "");
  const Error empty = error_of([&] { (void)SafetensorsFile::open(dir / "empty.safetensors"); });
  EXPECT_EQ(empty.kind(), ErrorKind::kParse);
  EXPECT_NE(std::string(empty.what()).find("the file is 0 bytes, too short for the 8-byte header length"),
            std::string::npos);
}

}  // namespace
}  // namespace fp8kit
