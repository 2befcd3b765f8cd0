// Tensor basics: factories over every dtype, shapes (0-d, zero-size), shared storage and reshape, typed
// access checks, the matrix view, clone, and allocation accounting (current and peak bytes, alignment, threads).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "default_dtype_guard.hpp"
#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/tensor/memory.hpp"
#include "fp8kit/tensor/tensor.hpp"
#include "fp8kit/tensor/tensor_buffer.hpp"

namespace fp8kit {
namespace {

// The value every dtype holds for `v` (for the small exact values used here).
double held(double v, DType d) {
  if (d == DType::bool_) return v != 0.0 ? 1.0 : 0.0;
  return v;
}

std::int64_t padded(std::int64_t bytes) {
  return (bytes + 63) / 64 * 64;
}

TEST(Tensor, DefaultConstructedIsEmpty) {
  const Tensor t;
  EXPECT_EQ(t.dim(), 1);
  EXPECT_EQ(t.shape(), Shape{0});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0);
  EXPECT_EQ(t.dtype(), DType::float32);
  EXPECT_EQ(t.raw(), nullptr);
}

TEST(Tensor, ShapesAndSizes) {
  const Tensor t = empty({2, 3, 5}, DType::bfloat16);
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 30);
  EXPECT_EQ(t.nbytes(), 60);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 5);
  EXPECT_EQ(t.size(-3), 2);
  EXPECT_THROW(t.size(3), Error);
  EXPECT_THROW(t.size(-4), Error);
  EXPECT_EQ(t.device(), Device::cpu());

  const Tensor scalar = empty({}, DType::float64);  // 0-d: one element
  EXPECT_EQ(scalar.dim(), 0);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.nbytes(), 8);

  const Tensor none = empty({4, 0, 3}, DType::float32);  // zero-size dimension
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.nbytes(), 0);
  EXPECT_EQ(none.shape(), (Shape{4, 0, 3}));

  EXPECT_THROW(empty({2, -1}), Error);
  EXPECT_THROW(empty({std::int64_t{1} << 40, std::int64_t{1} << 40}), Error);
}

TEST(Tensor, ZerosOnesFullForEveryDType) {
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(std::string(name(d)));
    const Tensor z = zeros({3, 7}, d);
    const Tensor o = ones({3, 7}, d);
    const Tensor f = full({17}, 2.0, d);
    EXPECT_EQ(z.dtype(), d);
    EXPECT_EQ(z.shape(), (Shape{3, 7}));
    for (std::int64_t i = 0; i < 21; ++i) {
      // e8m0fnu has no zero: all-zero bits are its smallest value, 2^-127 (as torch.zeros leaves them).
      EXPECT_EQ(z.item_as_double(i), d == DType::float8_e8m0fnu ? std::ldexp(1.0, -127) : 0.0);
      EXPECT_EQ(o.item_as_double(i), 1.0);
    }
    for (std::int64_t i = 0; i < 17; ++i) EXPECT_EQ(f.item_as_double(i), held(2.0, d));
  }
  // full() converts like to(): non-saturating for FP8, truncation for integers.
  EXPECT_TRUE(std::isnan(full({2}, 1000.0, DType::float8_e4m3fn).item_as_double(1)));
  EXPECT_TRUE(std::isinf(full({2}, 1e6, DType::float8_e5m2).item_as_double(0)));
  EXPECT_TRUE(std::isnan(full({2}, 0.0, DType::float8_e8m0fnu).item_as_double(0)));
  EXPECT_EQ(full({1}, -2.7, DType::int32).item_as_double(0), -2.0);
  EXPECT_EQ(full({1}, 3.0, DType::bool_).data<bool>()[0], true);
}

TEST(Tensor, FromValues) {
  const Tensor t = tensor({1.0, 1.5, 1.25}, DType::float8_e4m3fn);
  EXPECT_EQ(t.shape(), Shape{3});
  EXPECT_EQ(t.dtype(), DType::float8_e4m3fn);
  const std::uint8_t* codes = t.data<std::uint8_t>();
  EXPECT_EQ(codes[0], 0x38);  // 1.0 = 0.0111.000
  EXPECT_EQ(codes[1], 0x3C);  // 1.5 = 0.0111.100
  EXPECT_EQ(codes[2], 0x3A);  // 1.25 = 0.0111.010

  // Non-saturating, rounded once from the double: 449 -> 448, 465 -> NaN, 464 + 2^-30 -> NaN.
  const Tensor e4 = tensor({449.0, 465.0, 464.0 + std::ldexp(1.0, -30), -1e9}, DType::float8_e4m3fn);
  EXPECT_EQ(e4.data<std::uint8_t>()[0], 0x7E);
  EXPECT_EQ(e4.data<std::uint8_t>()[1], 0x7F);
  EXPECT_EQ(e4.data<std::uint8_t>()[2], 0x7F);
  EXPECT_EQ(e4.data<std::uint8_t>()[3], 0xFF);

  const std::vector<double> values = {1, 2, 3, 4, 5, 6};
  const Tensor m = tensor(values, {2, 3}, DType::int16);
  EXPECT_EQ(m.shape(), (Shape{2, 3}));
  EXPECT_EQ(m.data<std::int16_t>()[5], 6);
  EXPECT_THROW(tensor(values, {4, 2}), Error);

  const Tensor s = scalar_tensor(0.1, DType::float64);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item_as_double(0), 0.1);
  EXPECT_EQ(tensor({}, DType::float8_e5m2).numel(), 0);

  DefaultDTypeGuard guard;
  EXPECT_EQ(tensor({1.0}).dtype(), DType::float32);
  set_default_dtype(DType::float64);
  EXPECT_EQ(tensor({0.1}).item_as_double(0), 0.1);
}

TEST(Tensor, EmptyLike) {
  const Tensor t = zeros({4, 5}, DType::bfloat16);
  const Tensor a = empty_like(t);
  const Tensor b = empty_like(t, DType::float8_e4m3fn);
  EXPECT_EQ(a.shape(), t.shape());
  EXPECT_EQ(a.dtype(), DType::bfloat16);
  EXPECT_EQ(b.shape(), t.shape());
  EXPECT_EQ(b.dtype(), DType::float8_e4m3fn);
  EXPECT_EQ(b.nbytes(), 20);
  EXPECT_FALSE(a.shares_storage_with(t));
}

TEST(Tensor, CopiesShareStorageCloneDoesNot) {
  Tensor a = tensor({1.0, 2.0, 3.0});
  Tensor b = a;  // shares, like PyTorch
  EXPECT_TRUE(b.shares_storage_with(a));
  b.data<float>()[0] = 42.0f;
  EXPECT_EQ(a.data<float>()[0], 42.0f);

  Tensor c = a.clone();
  EXPECT_FALSE(c.shares_storage_with(a));
  EXPECT_EQ(c.dtype(), a.dtype());
  EXPECT_EQ(c.shape(), a.shape());
  c.data<float>()[1] = -1.0f;
  EXPECT_EQ(a.data<float>()[1], 2.0f);
  EXPECT_EQ(c.data<float>()[0], 42.0f);
  EXPECT_FALSE(Tensor().shares_storage_with(Tensor()));
}

TEST(Tensor, ReshapeSharesStorage) {
  Tensor t = tensor(std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  Tensor r = t.reshape({2, 6});
  EXPECT_EQ(r.shape(), (Shape{2, 6}));
  EXPECT_TRUE(r.shares_storage_with(t));
  EXPECT_EQ(r.raw(), t.raw());
  r.data<float>()[7] = 70.0f;
  EXPECT_EQ(t.item_as_double(7), 70.0);

  EXPECT_EQ(t.reshape({-1}).shape(), Shape{12});
  EXPECT_EQ(t.reshape({2, -1, 3}).shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(t.reshape({12, 1, 1}).dim(), 3);
  EXPECT_THROW(t.reshape({5, 3}), Error);
  EXPECT_THROW(t.reshape({-1, -1}), Error);
  EXPECT_THROW(t.reshape({5, -1}), Error);
  EXPECT_THROW(t.reshape({-2, -6}), Error);

  const Tensor one = tensor({7.0});
  EXPECT_EQ(one.reshape({}).dim(), 0);
  EXPECT_EQ(one.reshape({}).reshape({1, 1}).shape(), (Shape{1, 1}));
  const Tensor none = zeros({0, 4});
  EXPECT_EQ(none.reshape({4, 0, 2}).numel(), 0);
  EXPECT_THROW(none.reshape({-1, 0}), Error);  // cannot infer from zero
}

TEST(Tensor, Matrix) {
  auto v = [](Shape s) { return empty(std::move(s), DType::float8_e4m3fn).matrix(); };
  EXPECT_EQ(v({2, 3, 4}).rows, 6);
  EXPECT_EQ(v({2, 3, 4}).cols, 4);
  EXPECT_EQ(v({5}).rows, 1);
  EXPECT_EQ(v({5}).cols, 5);
  EXPECT_EQ(v({}).rows, 1);
  EXPECT_EQ(v({}).cols, 1);
  EXPECT_EQ(v({3, 0}).rows, 3);
  EXPECT_EQ(v({3, 0}).cols, 0);
  EXPECT_EQ(v({0, 128}).rows, 0);
  EXPECT_EQ(v({0, 128}).cols, 128);
  const Tensor t = empty({7, 1, 33}, DType::bfloat16);
  const MatrixRef m = t.matrix();
  EXPECT_EQ(m.rows, 7);
  EXPECT_EQ(m.cols, 33);
  EXPECT_EQ(m.dtype, DType::bfloat16);
  EXPECT_EQ(m.data, static_cast<const void*>(t.raw()));
  EXPECT_EQ(m.stride(), 33);
  EXPECT_TRUE(m.contiguous());
  EXPECT_NO_THROW(m.element<bfloat16>("test"));
  // The checks name the operation and what does not fit.
  auto message = [](const MatrixRef& x, auto element) {
    try {
      element(x);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto as_float = [](const MatrixRef& x) { x.element<float>("quantize"); };
  EXPECT_NE(message(m, as_float).find("quantize: the matrix is bfloat16, it takes float32"), std::string::npos);
  MatrixRef gpu = m;
  gpu.dtype = DType::float32;
  gpu.device = Device::cuda(0);
  EXPECT_NE(message(gpu, as_float).find("on cuda:0"), std::string::npos);
  const std::vector<float> x(12);
  EXPECT_NE(message(MatrixRef(x.data(), 3, 4, 2), as_float).find("row stride 2 is below the 4 columns"),
            std::string::npos);
  EXPECT_NE(message(MatrixRef(static_cast<const float*>(nullptr), 3, 4), as_float).find("null data"),
            std::string::npos);
  EXPECT_NO_THROW(MatrixRef(static_cast<const float*>(nullptr), 0, 4).element<float>("quantize"));
  const MatrixRef strided(x.data(), 2, 4, 6);
  EXPECT_FALSE(strided.contiguous());
  EXPECT_EQ(strided.row<float>(1), x.data() + 6);
}

// TensorBuffer (ScaledTensor's codes and scales): on tensor storage and counted, copies deep, resize keeps the
// contents and zero-fills, capacity is reused when shrinking and growing back.
TEST(TensorBuffer, VectorSemanticsOnTensorStorage) {
  const std::int64_t before = memory_stats().current_bytes;
  {
    TensorBuffer<float> a;
    EXPECT_TRUE(a.empty());
    EXPECT_EQ(a.data(), nullptr);
    a.resize(100, 2.5f);
    EXPECT_EQ(memory_stats().current_bytes - before, 448);  // 400 bytes in a 64-byte padded storage
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.data()) % 64, 0u);
    EXPECT_EQ(a.storage().dtype(), DType::float32);
    a[7] = -1.0f;
    TensorBuffer<float> b = a;  // deep
    b[7] = 3.0f;
    EXPECT_EQ(a[7], -1.0f);
    EXPECT_FALSE(a == b);
    b[7] = -1.0f;
    EXPECT_TRUE(a == b);
    const float* storage = a.data();
    a.resize(10);
    a.resize(100);  // back within capacity: the same storage, the regrown elements zero
    EXPECT_EQ(a.data(), storage);
    EXPECT_EQ(a[7], -1.0f);
    EXPECT_EQ(a[50], 0.0f);
    a.resize(1000);  // grows: a new storage, contents kept
    EXPECT_EQ(a[7], -1.0f);
    EXPECT_EQ(a.size(), 1000u);
    TensorBuffer<std::uint8_t> c = {1, 2, 3};
    c.push_back(4);
    EXPECT_EQ(c.size(), 4u);
    EXPECT_EQ(c[3], 4);
    TensorBuffer<std::uint8_t> d = std::move(c);
    EXPECT_EQ(d.size(), 4u);
    EXPECT_TRUE(c.empty());
    // assign from a range: one storage of its size (a forward range), each element converted; an input range (read
    // once) element by element. Within capacity the storage stays.
    const std::vector<double> values = {1.5, -2.0, 3.25};
    a.assign(values.begin(), values.end());
    EXPECT_EQ(a.size(), 3u);
    EXPECT_EQ(a[2], 3.25f);
    EXPECT_EQ(a.capacity(), 1000u);
    std::vector<std::uint8_t> bytes(5000);
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(i * 7);
    d.assign(bytes.data(), bytes.data() + bytes.size());
    EXPECT_EQ(d.capacity(), 5000u);
    EXPECT_TRUE(std::equal(d.begin(), d.end(), bytes.begin(), bytes.end()));
    std::istringstream text("7 8 9");
    d.assign(std::istream_iterator<int>(text), std::istream_iterator<int>());
    EXPECT_EQ(d.size(), 3u);
    EXPECT_EQ(d[2], 9);
  }
  EXPECT_EQ(memory_stats().current_bytes, before);  // everything released
}

TEST(Tensor, TypedAccessIsChecked) {
  Tensor bf = zeros({4}, DType::bfloat16);
  EXPECT_NO_THROW(bf.data<bfloat16>());
  EXPECT_EQ(bf.span<bfloat16>().size(), 4u);
  try {
    bf.data<float>();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("float32"), std::string::npos) << msg;
    EXPECT_NE(msg.find("bfloat16"), std::string::npos) << msg;
  }

  const Tensor e4 = zeros({4}, DType::float8_e4m3fn);
  EXPECT_NO_THROW(e4.data<std::uint8_t>());  // raw codes
  EXPECT_NO_THROW(e4.data<float8_e4m3fn>());
  EXPECT_EQ(e4.span<float8_e4m3fn>().size(), 4u);
  try {
    e4.data<float8_e5m2>();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("float8_e5m2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("float8_e4m3fn"), std::string::npos) << msg;
  }
  EXPECT_THROW(e4.data<std::int8_t>(), Error);
  EXPECT_THROW(zeros({2}, DType::int32).data<std::int64_t>(), Error);
  EXPECT_THROW(zeros({2}, DType::int8).data<std::uint8_t>(), Error);
  EXPECT_THROW(zeros({2}, DType::bool_).data<std::uint8_t>(), Error);
  EXPECT_THROW(zeros({2}, DType::float64).span<float>(), Error);
  EXPECT_NO_THROW(zeros({2}, DType::uint8).data<std::uint8_t>());

  // Every dtype accepts exactly its own element type (and FP8 also std::uint8_t).
  auto ok = [](auto&& access) {
    try {
      access();
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(std::string(name(d)));
    const Tensor t = zeros({1}, d);
    EXPECT_EQ(ok([&] { t.data<float>(); }), d == DType::float32);
    EXPECT_EQ(ok([&] { t.data<double>(); }), d == DType::float64);
    EXPECT_EQ(ok([&] { t.data<float16>(); }), d == DType::float16);
    EXPECT_EQ(ok([&] { t.data<std::uint8_t>(); }), d == DType::uint8 || is_fp8(d));
    EXPECT_EQ(ok([&] { t.data<std::int64_t>(); }), d == DType::int64);
    EXPECT_EQ(ok([&] { t.data<bool>(); }), d == DType::bool_);
    EXPECT_EQ(ok([&] { t.data<float8_e8m0fnu>(); }), d == DType::float8_e8m0fnu);
  }
}

TEST(Tensor, ItemAsDouble) {
  const Tensor t = tensor({-1.5, 0.25, 448.0}, DType::float8_e4m3fn);
  EXPECT_EQ(t.item_as_double(0), -1.5);
  EXPECT_EQ(t.item_as_double(2), 448.0);
  EXPECT_THROW(t.item_as_double(3), Error);
  EXPECT_THROW(t.item_as_double(-1), Error);
  Tensor i = zeros({1}, DType::int64);
  i.data<std::int64_t>()[0] = (std::int64_t{1} << 53) + 1;
  EXPECT_EQ(i.item_as_double(0), std::ldexp(1.0, 53));  // rounded to nearest even
  EXPECT_EQ(tensor({1.0, 0.0}, DType::bool_).item_as_double(0), 1.0);
}

TEST(Memory, StorageIsAligned) {
  for (std::int64_t n : {1, 3, 17, 64, 1000}) {
    const Tensor t = empty({n}, DType::float8_e4m3fn);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw()) % 64, 0u) << n;
  }
}

TEST(Memory, CurrentFollowsAllocationsAndFrees) {
  const MemoryStats base = memory_stats();
  {
    const Tensor a = empty({10}, DType::float32);  // 40 bytes -> one 64-byte block
    EXPECT_EQ(memory_stats().current_bytes, base.current_bytes + 64);
    {
      const Tensor b = zeros({1000}, DType::float64);
      EXPECT_EQ(memory_stats().current_bytes, base.current_bytes + 64 + padded(8000));
      const Tensor c = b;                    // shares: no allocation
      const Tensor d = b.reshape({10, -1});  // shares: no allocation
      EXPECT_EQ(memory_stats().current_bytes, base.current_bytes + 64 + padded(8000));
      const Tensor e = b.clone();
      EXPECT_EQ(memory_stats().current_bytes, base.current_bytes + 64 + 2 * padded(8000));
      const Tensor f = b.to(DType::float8_e4m3fn);
      EXPECT_EQ(memory_stats().current_bytes, base.current_bytes + 64 + 2 * padded(8000) + padded(1000));
      const Tensor same = f.to(DType::float8_e4m3fn);  // same dtype: shares
      EXPECT_EQ(memory_stats().current_bytes, base.current_bytes + 64 + 2 * padded(8000) + padded(1000));
    }
    EXPECT_EQ(memory_stats().current_bytes, base.current_bytes + 64);
    const Tensor none = empty({0, 5});  // empty: allocates nothing
    EXPECT_EQ(memory_stats().current_bytes, base.current_bytes + 64);
  }
  EXPECT_EQ(memory_stats().current_bytes, base.current_bytes);
}

TEST(Memory, PeakAndReset) {
  reset_peak_memory();
  const MemoryStats base = memory_stats();
  EXPECT_EQ(base.peak_bytes, base.current_bytes);
  {
    const Tensor big = empty({1 << 20}, DType::float32);  // 4 MiB
    const MemoryStats during = memory_stats();
    EXPECT_EQ(during.current_bytes, base.current_bytes + (4 << 20));
    EXPECT_EQ(during.peak_bytes, base.current_bytes + (4 << 20));
  }
  const Tensor small = empty({16}, DType::float32);
  const MemoryStats after = memory_stats();
  EXPECT_EQ(after.current_bytes, base.current_bytes + 64);
  EXPECT_EQ(after.peak_bytes, base.current_bytes + (4 << 20));  // the peak remembers
  reset_peak_memory();
  EXPECT_EQ(memory_stats().peak_bytes, base.current_bytes + 64);
}

// set_memory_limit: an allocation that would take the tensors past the limit is refused before it takes memory
// (Error kUnsupported, one line, "out of memory"), what is held is untouched, and 0 lifts the limit again.
struct MemoryLimitGuard {  // the limit lifted however the test ends (later tests allocate freely)
  ~MemoryLimitGuard() { set_memory_limit(0); }
};

TEST(Memory, LimitRefusesWhatWouldPassIt) {
  const MemoryLimitGuard guard;
  const std::int64_t before = memory_stats().current_bytes;
  set_memory_limit(before + (8 << 20));
  const Tensor fits = empty({1 << 20}, DType::float32);                  // 4 MiB of 8
  testing::expect_error([] { (void)empty({2 << 20}, DType::float32); },  // 8 MiB more
                        ErrorKind::kUnsupported,
                        {"out of memory: 8388608 bytes more would take the tensors on cpu to"});
  EXPECT_EQ(memory_stats().current_bytes, before + (4 << 20));  // nothing counted for the refused one
  EXPECT_EQ(memory_limit(), before + (8 << 20));
  set_memory_limit(0);
  const Tensor now_fits = empty({2 << 20}, DType::float32);
  EXPECT_EQ(memory_stats().current_bytes, before + (12 << 20));
  EXPECT_THROW(set_memory_limit(-1), Error);
}

// Threads allocating against one limit: the check and the count are one step, so together they never hold more than
// it (16 threads x 100 storages of 1 MiB against a limit of 24 MiB; each holds at most 2 at once).
TEST(Memory, LimitHoldsUnderThreads) {
  const MemoryLimitGuard guard;
  const std::int64_t before = memory_stats().current_bytes;
  reset_peak_memory();
  set_memory_limit(before + (24 << 20));
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        try {
          const Tensor a = empty({1 << 18}, DType::float32), b = empty({1 << 18}, DType::float32);
        } catch (const Error&) {
          refused.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(memory_stats().peak_bytes, before + (24 << 20));
  EXPECT_EQ(memory_stats().current_bytes, before);  // what was refused was never counted
  (void)refused.load();                             // (how many were refused depends on the schedule)
}

// Allocations count in the category in force on their thread (scopes nest and restore), a free subtracts from the
// category the storage was counted in (whatever is in force then), and the peak keeps the breakdown it had.
TEST(Memory, CategoriesFollowTheirScopesAndThePeakKeepsItsBreakdown) {
  const auto idx = [](MemoryCategory c) { return static_cast<std::size_t>(c); };
  reset_peak_memory();
  const MemoryStats base = memory_stats();
  EXPECT_EQ(current_memory_category(), MemoryCategory::kTemporary);
  Tensor params, state;
  {
    MemoryCategoryScope outer(MemoryCategory::kParameters);
    params = empty({1000}, DType::float32);  // 4000 -> 4032 bytes
    {
      MemoryCategoryScope inner(MemoryCategory::kOptimizerState);
      EXPECT_EQ(current_memory_category(), MemoryCategory::kOptimizerState);
      state = empty({100}, DType::bfloat16);  // 200 -> 256
    }
    EXPECT_EQ(current_memory_category(), MemoryCategory::kParameters);
  }
  EXPECT_EQ(current_memory_category(), MemoryCategory::kTemporary);
  {
    const Tensor temp = empty({10000}, DType::float32);  // 40000 bytes: the peak
    const MemoryStats at = memory_stats();
    EXPECT_EQ(at.current_by_category[idx(MemoryCategory::kTemporary)] -
                  base.current_by_category[idx(MemoryCategory::kTemporary)],
              40000);
  }
  MemoryStats now;
  {
    MemoryCategoryScope scope(MemoryCategory::kActivations);
    state = Tensor();  // freed under another scope: still leaves optimizer state
    now = memory_stats();
  }
  EXPECT_EQ(now.current_by_category[idx(MemoryCategory::kOptimizerState)],
            base.current_by_category[idx(MemoryCategory::kOptimizerState)]);
  EXPECT_EQ(now.current_by_category[idx(MemoryCategory::kParameters)] -
                base.current_by_category[idx(MemoryCategory::kParameters)],
            4032);
  EXPECT_EQ(now.peak_bytes, base.current_bytes + 4032 + 256 + 40000);
  EXPECT_EQ(
      now.peak_by_category[idx(MemoryCategory::kTemporary)] - base.current_by_category[idx(MemoryCategory::kTemporary)],
      40000);
  EXPECT_EQ(now.peak_by_category[idx(MemoryCategory::kOptimizerState)] -
                base.current_by_category[idx(MemoryCategory::kOptimizerState)],
            256);
  std::int64_t sum = 0;
  for (const std::int64_t b : now.peak_by_category) sum += b;
  EXPECT_EQ(sum, now.peak_bytes);
  EXPECT_EQ(name(MemoryCategory::kOptimizerState), "optimizer_state");
}

TEST(Memory, ExactUnderThreads) {
  reset_peak_memory();
  const MemoryStats base = memory_stats();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 500; ++i) {
        const Tensor a = empty({100 + t}, DType::float32);
        const Tensor b = a.clone();
        Tensor c = b;
        c = zeros({7}, DType::int64);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const MemoryStats after = memory_stats();
  EXPECT_EQ(after.current_bytes, base.current_bytes);
  EXPECT_GE(after.peak_bytes, base.current_bytes + 2 * padded(400));
  EXPECT_LE(after.peak_bytes, base.current_bytes + 4 * (2 * padded(412) + padded(56)));
}

}  // namespace
}  // namespace fp8kit
