// The dist layer, run as one process and under mpirun with 2 and 3 ranks (ctest runs all three): every collective
// with odd sizes (not divisible by the rank count, empty parts) against a reference each rank computes alone from
// every rank's deterministic data; the byte counts; the amax agreement with NaN; FP8 all-gathers of row shards
// bit-identical to quantizing the whole matrix at every granularity; the refusals, one line on every rank.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/fingerprint.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/dist/communicator.hpp"
#include "fp8kit/dist/data_parallel.hpp"
#include "fp8kit/dist/fp8_collectives.hpp"
#include "fp8kit/dist/fsdp.hpp"
#include "fp8kit/format/codec.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/scaling/scale.hpp"

namespace fp8kit {
namespace {

// One communicator for the whole test run (MPI starts once per process).
Communicator* g_comm = nullptr;
Communicator& comm() {
  return *g_comm;
}

// The call throws fp8kit::Error (kInvalidArgument, one line) naming every part: on each rank, with the same call.
template <class Call>
void testing_expect_agreed_error(Call&& call, std::initializer_list<std::string> parts) {
  try {
    call();
    ADD_FAILURE() << "rank " << comm().rank() << ": no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    for (const std::string& part : parts) EXPECT_NE(what.find(part), std::string::npos) << what;
  }
}

// Rank r's deterministic floats: every rank can compute every other rank's.
std::vector<float> values_of(int r, std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed * 7919u + static_cast<std::uint32_t>(r));
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(Communicator, RankSizeAndBackend) {
  EXPECT_GE(comm().size(), 1);
  EXPECT_GE(comm().rank(), 0);
  EXPECT_LT(comm().rank(), comm().size());
  EXPECT_EQ(comm().backend(), launched_by_mpi() ? "mpi" : "local");
  comm().barrier();
  std::printf("rank %d of %d, backend %s\n", comm().rank(), comm().size(), std::string(comm().backend()).c_str());
}

TEST(Communicator, AllGatherUnevenCounts) {
  const int n = comm().size(), me = comm().rank();
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  std::size_t total = 0;
  for (int r = 0; r < n; ++r) total += counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(2 * r + 1);
  std::vector<std::byte> send(counts[static_cast<std::size_t>(me)]);
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = static_cast<std::byte>(me * 16 + static_cast<int>(i));
  std::vector<std::byte> recv(total);
  comm().reset_stats();
  comm().all_gather(send, recv, counts);
  EXPECT_EQ(comm().stats().all_gather_bytes, send.size());
  std::size_t at = 0;
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i, ++at) {
      ASSERT_EQ(recv[at], static_cast<std::byte>(r * 16 + static_cast<int>(i))) << "rank " << r << " byte " << i;
    }
  }
}

TEST(Communicator, AllReduceSumAndMaxInRankOrder) {
  const int n = comm().size(), me = comm().rank();
  for (std::size_t len : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1001}}) {
    std::vector<float> want_sum(len, 0.0f), want_max(len, -std::numeric_limits<float>::infinity());
    for (int r = 0; r < n; ++r) {
      const auto v = values_of(r, len, 3);
      for (std::size_t i = 0; i < len; ++i) {
        want_sum[i] = r == 0 ? v[i] : want_sum[i] + v[i];  // FP32, rank order
        want_max[i] = std::max(want_max[i], v[i]);
      }
    }
    std::vector<float> sum = values_of(me, len, 3), max = sum;
    comm().reset_stats();
    comm().all_reduce(sum, ReduceOp::kSum);
    comm().all_reduce(max, ReduceOp::kMax);
    ASSERT_EQ(std::memcmp(sum.data(), want_sum.data(), len * sizeof(float)), 0) << len;
    ASSERT_EQ(std::memcmp(max.data(), want_max.data(), len * sizeof(float)), 0) << len;
    // Each all-reduce sends every part but its own (reduce-scatter) and its own part (all-gather).
    EXPECT_EQ(comm().stats().all_reduce_bytes, 2 * len * sizeof(float)) << len;
    EXPECT_EQ(comm().stats().calls, 2u);
  }
}

TEST(Communicator, ReduceScatterUnevenParts) {
  const int n = comm().size(), me = comm().rank();
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  std::size_t total = 0;
  for (int r = 0; r < n; ++r)
    total += counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(r == 1 ? 0 : 5 + r);
  std::size_t offset = 0;
  for (int r = 0; r < me; ++r) offset += counts[static_cast<std::size_t>(r)];
  std::vector<float> want(counts[static_cast<std::size_t>(me)]);
  for (int r = 0; r < n; ++r) {
    const auto v = values_of(r, total, 5);
    for (std::size_t i = 0; i < want.size(); ++i) want[i] = r == 0 ? v[offset + i] : want[i] + v[offset + i];
  }
  std::vector<float> got(want.size());
  comm().reset_stats();
  comm().reduce_scatter(values_of(me, total, 5), got, counts, ReduceOp::kSum);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(comm().stats().reduce_scatter_bytes, (total - want.size()) * sizeof(float));
}

TEST(Communicator, BroadcastAndRefusals) {
  std::vector<std::byte> data(13, std::byte{0});
  const int root = comm().size() - 1;
  if (comm().rank() == root) std::fill(data.begin(), data.end(), std::byte{0x5A});
  comm().broadcast(data, root);
  for (std::byte b : data) ASSERT_EQ(b, std::byte{0x5A});
  auto one_line = [](auto&& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  };
  // Checked before any data moves, on every rank alike: no rank is left waiting in the backend.
  one_line([&] { comm().broadcast(data, comm().size()); }, "is not a rank");
  std::vector<std::byte> out(3);
  const std::vector<std::size_t> wrong(static_cast<std::size_t>(comm().size()) + 1, 1);
  one_line([&] { comm().all_gather(std::span<const std::byte>(out).first(1), out, wrong); }, "counts for");
  comm().barrier();
}

TEST(Fp8Collectives, AmaxAgreementTakesNaNAsInfinity) {
  const int n = comm().size(), me = comm().rank();
  std::vector<float> amax = {static_cast<float>(me), 1.0f,
                             me == n - 1 ? std::numeric_limits<float>::quiet_NaN() : 2.0f};
  all_reduce_amax(comm(), amax);
  EXPECT_EQ(amax[0], static_cast<float>(n - 1));
  EXPECT_EQ(amax[1], 1.0f);
  EXPECT_EQ(amax[2], std::numeric_limits<float>::infinity());  // the NaN of the last rank, everywhere
}

TEST(Fp8Collectives, ShardsCoverTheRowsOnBlockBoundaries) {
  for (int ranks : {1, 2, 3, 5}) {
    for (std::int64_t rows : {0, 1, 127, 128, 300, 1000}) {
      std::int64_t next = 0;
      for (int r = 0; r < ranks; ++r) {
        const RowShard s = shard_rows(rows, 128, r, ranks);
        EXPECT_EQ(s.begin, next);
        EXPECT_TRUE(s.begin % 128 == 0 || s.rows() == 0);
        next = s.end;
      }
      EXPECT_EQ(next, rows);
    }
  }
}

// Every rank quantizes its shard of the same matrix; the gathered result is the whole matrix's quantization.
TEST(Fp8Collectives, AllGatherOfShardsIsTheWholeQuantization) {
  const Granularity granularities[] = {Granularity::tensor(),
                                       Granularity::row(),
                                       Granularity::block(1, 128),
                                       Granularity::block(128, 128),
                                       Granularity::mx(MxScaleMode::kFloor),
                                       Granularity::mx(MxScaleMode::kRceil)};
  for (std::int64_t rows : {1, 131, 300}) {
    const std::int64_t cols = 257;
    std::vector<float> x = values_of(0, static_cast<std::size_t>(rows * cols), 9);  // the same on every rank
    x[5] = std::numeric_limits<float>::quiet_NaN();
    for (const Granularity& g : granularities) {
      for (Format f : {Format::e4m3fn, Format::e5m2}) {
        SCOPED_TRACE(g.name() + " " + std::string(name(f)) + " rows " + std::to_string(rows));
        const QuantizeOptions o{f, Overflow::kSaturate, g};
        const RowShard s = shard_rows(rows, shard_block_rows(g, rows), comm().rank(), comm().size());
        const ScaledTensor mine = quantize_shard(comm(), MatrixRef(x.data() + s.begin * cols, s.rows(), cols), o);
        comm().reset_stats();
        const ScaledTensor got = all_gather_rows(comm(), mine, rows);
        const ScaledTensor want = quantize(MatrixRef(x.data(), rows, cols), o);
        ASSERT_EQ(got.rows, want.rows);
        ASSERT_EQ(got.data, want.data);
        ASSERT_EQ(got.scale_inv, want.scale_inv);
        ASSERT_EQ(got.scale_e8m0, want.scale_e8m0);
        // The codes and scales this rank handed over (MX: the E8M0 codes only), and one small header.
        const std::uint64_t payload =
            mine.data.size() + (g.kind == Granularity::Kind::kTensor ? 0
                                : g.kind == Granularity::Kind::kMx   ? mine.scale_e8m0.size()
                                                                     : mine.scale_inv.size() * sizeof(float));
        EXPECT_GE(comm().stats().all_gather_bytes, payload);
        EXPECT_LE(comm().stats().all_gather_bytes, payload + 64);
      }
    }
  }
}

// bfloat16 shards per tensor: every rank agrees on the amax (an empty shard's rank too: it refused bfloat16 and left
// the others waiting in the agreement), and the gathered codes are quantize()'s of the whole bfloat16 matrix.
TEST(Fp8Collectives, Bfloat16ShardsPerTensorAreTheWholeQuantization) {
  for (std::int64_t rows : {1, 131}) {
    const std::int64_t cols = 65;
    const std::vector<float> x = values_of(0, static_cast<std::size_t>(rows * cols), 9);
    std::vector<bfloat16> xb(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) xb[i] = bfloat16::from_float(x[i]);
    const QuantizeOptions o{Format::e4m3fn, Overflow::kSaturate, Granularity::tensor()};
    const RowShard s = shard_rows(rows, 1, comm().rank(), comm().size());
    const ScaledTensor mine = quantize_shard(comm(), MatrixRef(xb.data() + s.begin * cols, s.rows(), cols), o);
    EXPECT_EQ(mine.original_dtype, DType::bfloat16);
    const ScaledTensor got = all_gather_rows(comm(), mine, rows);
    const ScaledTensor want = quantize(MatrixRef(xb.data(), rows, cols), o);
    EXPECT_EQ(got.original_dtype, DType::bfloat16) << rows;  // the gather kept it (dequantize's default target)
    EXPECT_EQ(got.data, want.data) << rows;
    EXPECT_EQ(got.scale_inv, want.scale_inv) << rows;
  }
}

// The transpose of a row-major matrix (rows x cols -> cols x rows).
std::vector<float> transposed(const float* x, std::int64_t rows, std::int64_t cols) {
  std::vector<float> t(static_cast<std::size_t>(rows * cols));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) t[static_cast<std::size_t>(c * rows + r)] = x[r * cols + c];
  return t;
}

// FSDP's two gathers of a weight W (rows x cols) sharded by rows on a cut that suits both orientations: the row
// shards quantized and gathered by rows give quantize(W); each rank's shard transposed (cols x its rows), quantized
// and gathered by columns gives quantize(W^T) — bit for bit, per tensor, 128x128 blocks and MX.
TEST(Fp8Collectives, ColumnShardsGatherIntoTheTransposesQuantization) {
  const Granularity granularities[] = {Granularity::tensor(), Granularity::block(128, 128),
                                       Granularity::mx(MxScaleMode::kFloor), Granularity::mx(MxScaleMode::kRceil)};
  for (std::int64_t rows : {1, 131, 300}) {
    const std::int64_t cols = 97;
    std::vector<float> w = values_of(0, static_cast<std::size_t>(rows * cols), 13);
    w[7] = std::numeric_limits<float>::infinity();
    const std::vector<float> wt = transposed(w.data(), rows, cols);
    for (const Granularity& g : granularities) {
      SCOPED_TRACE(g.name() + " rows " + std::to_string(rows));
      const QuantizeOptions o{Format::e4m3fn, Overflow::kSaturate, g};
      const std::int64_t cut = std::max(shard_block_rows(g, rows), shard_block_cols(g, rows));
      const RowShard s = shard_rows(rows, cut, comm().rank(), comm().size());
      const ScaledTensor rows_part = quantize_shard(comm(), MatrixRef(w.data() + s.begin * cols, s.rows(), cols), o);
      const ScaledTensor got_rows = all_gather_rows(comm(), rows_part, rows, cut);
      const ScaledTensor want_rows = quantize(MatrixRef(w.data(), rows, cols), o);
      ASSERT_EQ(got_rows.data, want_rows.data);
      ASSERT_EQ(got_rows.scale_inv, want_rows.scale_inv);
      ASSERT_EQ(got_rows.scale_e8m0, want_rows.scale_e8m0);
      const std::vector<float> part_t = transposed(w.data() + s.begin * cols, s.rows(), cols);
      const ScaledTensor cols_part = quantize_shard(comm(), MatrixRef(part_t.data(), cols, s.rows()), o);
      comm().reset_stats();
      const ScaledTensor got = all_gather_cols(comm(), cols_part, rows, cut);
      const ScaledTensor want = quantize(MatrixRef(wt.data(), cols, rows), o);
      ASSERT_EQ(got.rows, cols);
      ASSERT_EQ(got.cols, rows);
      ASSERT_EQ(got.data, want.data);
      ASSERT_EQ(got.scale_inv, want.scale_inv);
      ASSERT_EQ(got.scale_e8m0, want.scale_e8m0);
      const std::uint64_t payload =
          cols_part.data.size() + (g.kind == Granularity::Kind::kTensor ? 0
                                   : g.kind == Granularity::Kind::kMx   ? cols_part.scale_e8m0.size()
                                                                        : cols_part.scale_inv.size() * sizeof(float));
      EXPECT_GE(comm().stats().all_gather_bytes, payload);
      EXPECT_LE(comm().stats().all_gather_bytes, payload + 64);
    }
  }
}

// Float matrices of any dtype gather by rows and by columns, moved as their bytes.
TEST(Fp8Collectives, TensorShardsGatherByRowsAndColumns) {
  const std::int64_t rows = 37, cols = 5;
  const std::vector<float> x = values_of(0, static_cast<std::size_t>(rows * cols), 17);
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    SCOPED_TRACE(std::string(name(dtype)));
    Tensor whole = empty({rows, cols}, DType::float32);
    std::memcpy(whole.raw(), x.data(), x.size() * sizeof(float));
    whole = whole.to(dtype);
    const std::size_t es = static_cast<std::size_t>(element_size(dtype));
    const RowShard s = shard_rows(rows, 4, comm().rank(), comm().size());  // cut in fours: uneven, maybe empty
    Tensor part = empty({s.rows(), cols}, dtype);
    if (part.nbytes() > 0)
      std::memcpy(part.raw(), whole.raw() + s.begin * cols * es, static_cast<std::size_t>(part.nbytes()));
    const Tensor got = all_gather_rows(comm(), part, rows, 4);
    ASSERT_EQ(got.shape(), whole.shape());
    EXPECT_EQ(std::memcmp(got.raw(), whole.raw(), static_cast<std::size_t>(whole.nbytes())), 0);
    // Columns: the transpose's column shards.
    Tensor whole_t = empty({cols, rows}, dtype), part_t = empty({cols, s.rows()}, dtype);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < cols; ++c) {
        std::memcpy(whole_t.raw() + (c * rows + r) * es, whole.raw() + (r * cols + c) * es, es);
        if (r >= s.begin && r < s.end)
          std::memcpy(part_t.raw() + (c * s.rows() + r - s.begin) * es, whole.raw() + (r * cols + c) * es, es);
      }
    const Tensor got_t = all_gather_cols(comm(), part_t, rows, 4);
    ASSERT_EQ(got_t.shape(), whole_t.shape());
    EXPECT_EQ(std::memcmp(got_t.raw(), whole_t.raw(), static_cast<std::size_t>(whole_t.nbytes())), 0);
  }
  if (comm().size() > 1) {
    // A rank cutting otherwise is refused on every rank.
    const bool last = comm().rank() == comm().size() - 1;
    const RowShard s = shard_rows(rows, last ? 1 : 4, comm().rank(), comm().size());
    const Tensor part = zeros({s.rows(), cols}, DType::float32);
    try {
      all_gather_rows(comm(), part, rows, last ? 1 : 4);
      ADD_FAILURE() << "gathered shards cut two ways";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("does not fit rank 0's"), std::string::npos) << e.what();
    }
    comm().barrier();
  }
}

TEST(Fp8Collectives, MismatchedShardsAreRefusedOnEveryRank) {
  const std::int64_t rows = 256, cols = 64;
  const std::vector<float> x = values_of(0, static_cast<std::size_t>(rows * cols), 4);
  const Granularity g = Granularity::block(128, 128);
  const RowShard s = shard_rows(rows, 128, comm().rank(), comm().size());
  // The last rank quantizes in another format: every rank refuses, naming it.
  const Format f = comm().rank() == comm().size() - 1 && comm().size() > 1 ? Format::e5m2 : Format::e4m3fn;
  const ScaledTensor mine =
      quantize(MatrixRef(x.data() + s.begin * cols, s.rows(), cols), QuantizeOptions{f, Overflow::kSaturate, g});
  if (comm().size() == 1) {
    EXPECT_THROW(all_gather_rows(comm(), mine, rows + 1), Error);  // rows that are not the shard's
    return;
  }
  auto refused = [&](const ScaledTensor& shard, std::int64_t total, const std::string& needle) {
    try {
      all_gather_rows(comm(), shard, total);
      ADD_FAILURE() << "gathered mismatched shards: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    comm().barrier();  // nobody was left inside a collective
  };
  refused(mine, rows, "differs from rank 0's");
  // The last rank's whole-matrix row count, or a damaged shard of it: every rank refuses before the data moves.
  const ScaledTensor good = quantize(MatrixRef(x.data() + s.begin * cols, s.rows(), cols),
                                     QuantizeOptions{Format::e4m3fn, Overflow::kSaturate, g});
  const bool last = comm().rank() == comm().size() - 1;
  refused(good, last ? rows - 1 : rows, "gathers");
  ScaledTensor damaged = good;
  if (last) damaged.scale_inv.pop_back();
  refused(damaged, rows, "holds buffers of other sizes");
  // A hand-made granularity the blocks cannot come from (a block of 0 x 0) on the last rank: refused on every rank,
  // that one with its own error (it was thrown before the header exchange, the others waiting in it).
  ScaledTensor no_blocks = good;
  if (last) no_blocks.granularity = Granularity::block(0, 0);
  refused(no_blocks, rows, last ? "this rank's shard" : "holds buffers of other sizes");
  // Another granularity (other block rows, so another expected cut): still the same refusal on every rank.
  const ScaledTensor other_blocks =
      quantize(MatrixRef(x.data() + s.begin * cols, s.rows(), cols),
               QuantizeOptions{Format::e4m3fn, Overflow::kSaturate, last ? Granularity::block(1, 128) : g});
  refused(other_blocks, rows, "differs from rank 0's");
  // A cut that is not the others', and one across blocks.
  try {
    all_gather_rows(comm(), good, rows, last ? 256 : 128);
    ADD_FAILURE() << "gathered shards cut two ways";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuts shards in multiples of"), std::string::npos) << e.what();
  }
  comm().barrier();
  try {
    all_gather_rows(comm(), good, rows, last ? -128 : 128);  // a negative cut (was taken as 0): refused everywhere
    ADD_FAILURE() << "gathered shards with a negative cut";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(last ? "cut -128 is negative" : "holds buffers of other sizes"),
              std::string::npos)
        << e.what();
  }
  comm().barrier();
  try {
    all_gather_rows(comm(), good, rows, 64);  // every rank: 64 splits the 128-row blocks
    ADD_FAILURE() << "gathered shards cut across blocks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("across blocks of 128"), std::string::npos) << e.what();
  }
  comm().barrier();
}

// The payload sums against a reference each rank computes alone with the scalar codec: every rank's contribution
// cast once (FP8 after the power-of-two pre-scale of the global amax), decoded, summed in FP32 in rank order; for
// the all-reduce, the sums cast again with the scale of their own global amax. Bit for bit, for every payload.
float reference_scale(float amax, ReducePayload p) {
  if (p != ReducePayload::kE4m3 && p != ReducePayload::kE5m2) return 1.0f;
  return compute_scale(amax, p == ReducePayload::kE4m3 ? Format::e4m3fn : Format::e5m2,
                       ScaleOptions{0, 0.0f, ScaleRounding::kPowerOfTwoDown});
}
float round_trip(float x, ReducePayload p, float scale) {
  switch (p) {
    case ReducePayload::kFloat32:
      return x;
    case ReducePayload::kBfloat16:
      return bfloat16::from_float(x).to_float();
    default: {
      const Format f = p == ReducePayload::kE4m3 ? Format::e4m3fn : Format::e5m2;
      return decode_to_float(f, encode(x * scale, EncodeSpec{f, Overflow::kNonSaturating})) * (1.0f / scale);
    }
  }
}
float finite_amax(const std::vector<float>& v) {
  float a = 0.0f;
  for (float x : v) {
    if (std::isfinite(x)) a = std::max(a, std::fabs(x));
  }
  return a;
}

TEST(Fp8Collectives, PayloadSumsMatchTheirReference) {
  const int n = comm().size(), me = comm().rank();
  const std::size_t len = 1003;  // not divisible by 2 or 3
  std::vector<std::vector<float>> x(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) x[static_cast<std::size_t>(r)] = values_of(r, len, 21);
  x[0][17] = std::numeric_limits<float>::quiet_NaN();  // a NaN gradient on rank 0 reaches every rank
  for (ReducePayload p :
       {ReducePayload::kFloat32, ReducePayload::kBfloat16, ReducePayload::kE4m3, ReducePayload::kE5m2}) {
    SCOPED_TRACE(std::string(name(p)));
    float amax = 0.0f;
    for (const auto& v : x) amax = std::max(amax, finite_amax(v));
    const float s1 = reference_scale(amax, p);
    std::vector<float> sums(len);
    for (std::size_t i = 0; i < len; ++i) {
      float acc = round_trip(x[0][i], p, s1);
      for (int r = 1; r < n; ++r) acc += round_trip(x[static_cast<std::size_t>(r)][i], p, s1);
      sums[i] = acc;
    }
    const float s2 = reference_scale(finite_amax(sums), p);
    std::vector<float> want(len);
    for (std::size_t i = 0; i < len; ++i) want[i] = round_trip(sums[i], p, s2);

    std::vector<float> got = x[static_cast<std::size_t>(me)];
    all_reduce_sum(comm(), got, p);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), len * sizeof(float)), 0);
    EXPECT_TRUE(std::isnan(got[17]));
    // The reduce-scatter alone: this rank's part of the sums.
    std::vector<std::size_t> counts(static_cast<std::size_t>(n));
    std::size_t offset = 0;
    for (int r = 0; r < n; ++r) counts[static_cast<std::size_t>(r)] = len / n + (r < static_cast<int>(len % n) ? 1 : 0);
    for (int r = 0; r < me; ++r) offset += counts[static_cast<std::size_t>(r)];
    std::vector<float> part(counts[static_cast<std::size_t>(me)]);
    reduce_scatter_sum(comm(), x[static_cast<std::size_t>(me)], part, counts, p);
    EXPECT_EQ(std::memcmp(part.data(), sums.data() + offset, part.size() * sizeof(float)), 0);
  }
  // fp32 is the communicator's own sum.
  std::vector<float> a = x[static_cast<std::size_t>(me)], b = a;
  all_reduce_sum(comm(), a, ReducePayload::kFloat32);
  comm().all_reduce(b, ReduceOp::kSum);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), len * sizeof(float)), 0);
}

// The bytes that make FP8 gradients worth it: an FP8 all-reduce moves about a quarter of an fp32 one (the amax
// all-reduces are the overhead), bf16 half.
TEST(Fp8Collectives, PayloadBytes) {
  const std::vector<float> g = values_of(comm().rank(), 100003, 2);
  std::uint64_t bytes[4] = {};
  const ReducePayload payloads[] = {ReducePayload::kFloat32, ReducePayload::kBfloat16, ReducePayload::kE4m3,
                                    ReducePayload::kE5m2};
  for (int i = 0; i < 4; ++i) {
    std::vector<float> v = g;
    comm().reset_stats();
    all_reduce_sum(comm(), v, payloads[i]);
    bytes[i] = comm().stats().all_reduce_bytes;
    EXPECT_EQ(comm().stats().calls, 1u);
    EXPECT_EQ(comm().stats().total_bytes(), bytes[i]);
  }
  EXPECT_EQ(bytes[0], g.size() * 4);
  EXPECT_LE(static_cast<double>(bytes[1]), 0.52 * static_cast<double>(bytes[0]));
  EXPECT_LE(static_cast<double>(bytes[2]), 0.27 * static_cast<double>(bytes[0]));
  EXPECT_LE(static_cast<double>(bytes[3]), 0.27 * static_cast<double>(bytes[0]));
  if (comm().rank() == 0) {
    std::printf(
        "all_reduce_sum bytes per rank, 100003 floats on %d ranks: fp32 %llu, bf16 %llu (%.3fx), e4m3 %llu "
        "(%.3fx), e5m2 %llu (%.3fx)\n",
        comm().size(), static_cast<unsigned long long>(bytes[0]), static_cast<unsigned long long>(bytes[1]),
        static_cast<double>(bytes[1]) / static_cast<double>(bytes[0]), static_cast<unsigned long long>(bytes[2]),
        static_cast<double>(bytes[2]) / static_cast<double>(bytes[0]), static_cast<unsigned long long>(bytes[3]),
        static_cast<double>(bytes[3]) / static_cast<double>(bytes[0]));
  }
  EXPECT_EQ(parse_reduce_payload("fp8"), ReducePayload::kE5m2);
  EXPECT_EQ(parse_reduce_payload("bf16"), ReducePayload::kBfloat16);
  EXPECT_FALSE(parse_reduce_payload("fp16"));
}

// A step that fails on one rank fails on every rank, with that rank's message and kind: none goes on alone.
TEST(Communicator, AFailureOnOneRankIsEveryRanks) {
  EXPECT_NO_THROW(agree_on_error(comm(), [] {}));
  const int last = comm().size() - 1;
  try {
    agree_on_error(comm(), [&] {
      if (comm().rank() == last) FP8KIT_THROW(ErrorKind::kIo, "cannot write 'x' on rank ", last);
    });
    ADD_FAILURE() << "no rank threw";
  } catch (const AgreedError& e) {
    EXPECT_EQ(e.rank, last);
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    const std::string want =
        (last == 0 ? "" : "rank " + std::to_string(last) + ": ") + "cannot write 'x' on rank " + std::to_string(last);
    EXPECT_EQ(std::string(e.what()), want);
  }
  // The lowest failing rank is the one named; anything that is not an fp8kit::Error is kInternal.
  try {
    agree_on_error(comm(), [] { throw std::runtime_error("boom"); });
    ADD_FAILURE() << "no rank threw";
  } catch (const AgreedError& e) {
    EXPECT_EQ(e.rank, 0);
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_EQ(std::string(e.what()), "boom");
  }
  comm().barrier();  // nobody was left inside a collective
}

// Call checks (FP8KIT_DIST_CHECK=1): ranks that call with different sizes, or whose own arguments are refused on one
// rank only, all throw together naming each rank's call; without them, a rank's all_reduce of another length hung.
// Calls that agree run as before, and the check's traffic is not counted.
TEST(Communicator, CallChecksMakeMismatchesErrorsOnEveryRank) {
  struct On {
    On() { comm().check_calls(true); }
    ~On() { comm().check_calls(false); }
  } on;
  const int n = comm().size(), me = comm().rank();
  std::vector<float> same = values_of(me, 37, 9), plain = same;
  comm().reset_stats();
  comm().all_reduce(same, ReduceOp::kSum);
  const CommStats checked = comm().stats();
  comm().check_calls(false);
  comm().reset_stats();
  comm().all_reduce(plain, ReduceOp::kSum);
  EXPECT_EQ(checked.total_bytes(), comm().stats().total_bytes());
  EXPECT_EQ(same, plain);
  comm().check_calls(true);
  if (n > 1) {
    std::vector<float> mine(static_cast<std::size_t>(10 + me));
    testing_expect_agreed_error(
        [&] { comm().all_reduce(mine, ReduceOp::kMax); },
        {"the ranks' calls differ", "rank 0 calls all_reduce(max) of 10", "rank 1 all_reduce(max) of 11"});
    // A refusal on the last rank only (its count for itself is not what it passes) is every rank's.
    std::vector<std::size_t> counts(static_cast<std::size_t>(n), 2);
    std::vector<float> send(2 * static_cast<std::size_t>(n)), recv(me == n - 1 ? 3 : 2);
    testing_expect_agreed_error([&] { comm().reduce_scatter(send, recv, counts, ReduceOp::kSum); },
                                {me == n - 1 ? "this rank's count is 2 floats but it passes 3"
                                             : "rank " + std::to_string(n - 1) + " refused its arguments"});
    // all_to_all: rank 0 sends rank 1 four bytes, rank 1 expects eight from it.
    std::vector<std::size_t> sends(static_cast<std::size_t>(n), 4), recvs(static_cast<std::size_t>(n), 4);
    if (me == 1) recvs[0] = 8;
    std::vector<std::byte> out(4 * static_cast<std::size_t>(n)),
        in(me == 1 ? 4 * static_cast<std::size_t>(n) + 4 : out.size());
    testing_expect_agreed_error([&] { comm().all_to_all(out, sends, in, recvs); },
                                {"rank 0 sends rank 1 4 bytes but rank 1 expects 8"});
    // The FP8 layer's own argument checks, which run before its first collective (a refusal on the last rank only
    // left the others waiting in the scale's agreement): every rank's error too, naming the rank and why.
    const std::string last = "rank " + std::to_string(n - 1) + ": ";
    for (ReducePayload p : {ReducePayload::kFloat32, ReducePayload::kE4m3}) {
      testing_expect_agreed_error([&] { reduce_scatter_sum(comm(), send, recv, counts, p); },
                                  {last + "reduce_scatter_sum on rank " + std::to_string(n - 1), "the counts add up"});
    }
    const std::int32_t ints[4] = {};
    const std::vector<float> floats = values_of(me, 4, 3);
    const MatrixRef shard = me == n - 1 ? MatrixRef(ints, DType::int32, 2, 2) : MatrixRef(floats.data(), 2, 2);
    testing_expect_agreed_error([&] { quantize_shard(comm(), shard, QuantizeOptions{}); },
                                {last + "quantize_shard: the shard is int32"});
  }
  comm().barrier();  // nobody was left inside a collective
}

// Every collective is a profiler event with the bytes it handed over; an FP8 reduction's parts nest inside it.
TEST(Communicator, CollectivesAreProfilerEventsWithTheirBytes) {
  Profiler profiler;
  std::vector<float> v = values_of(comm().rank(), 1001, 5);
  comm().reset_stats();
  comm().set_profiler(&profiler);
  all_reduce_sum(comm(), v, ReducePayload::kE5m2);
  comm().set_profiler(nullptr);
  std::map<std::string, int> seen;
  for (const ProfileEvent& e : profiler.events()) {
    ++seen[e.name];
    EXPECT_EQ(e.category, "comm") << e.name;
    EXPECT_EQ(e.args.at("ranks"), std::to_string(comm().size())) << e.name;
    if (e.name == "comm.all_reduce_sum") {
      EXPECT_EQ(e.args.at("payload"), "e5m2");
      EXPECT_EQ(e.args.at("bytes"), std::to_string(comm().stats().all_reduce_bytes));
    }
  }
  EXPECT_EQ(seen["comm.all_reduce_sum"], 1);
  EXPECT_EQ(seen["comm.reduce_scatter_sum"], 1);
  EXPECT_EQ(seen["comm.all_reduce_amax"], 2);  // the contributions' scale, then the sums'
  EXPECT_EQ(seen["comm.all_to_all"], 1);
  EXPECT_GE(seen["comm.all_gather"], 1);
  comm().all_reduce(std::span<float>(v.data(), 1), ReduceOp::kSum);  // no profiler: nothing recorded
  EXPECT_EQ(profiler.events().size(),
            static_cast<std::size_t>(
                std::accumulate(seen.begin(), seen.end(), 0, [](int a, const auto& p) { return a + p.second; })));
}

// The data-parallel hooks give every rank the global batch's loss and gradients: each rank's half (third) of the
// batch, weighted by its rows and summed, against one process's whole batch (FP32 rounding apart: the sums over
// rows are split). AdamW hides a gradient scale almost entirely, so this is checked on the gradients themselves.
TEST(DataParallel, LossAndGradientsAreTheGlobalBatchs) {
  nn::TrainConfig c;
  c.steps = 1;
  c.seed = 3;
  c.batch = 6;
  c.eval_batches = 1;
  const nn::PrecisionRecipe recipe = *nn::PrecisionRecipe::parse("fp32");
  nn::Trainer whole(c, recipe);
  const nn::Batch batch = whole.data().batch(0);
  const float want_loss = whole.forward(batch);
  whole.backward();
  const nn::TrainConfig shard_config = data_parallel_config(comm(), c);
  nn::Trainer mine(shard_config, recipe);
  const nn::TrainHooks hooks = data_parallel_hooks(comm(), ReducePayload::kFloat32, 6);
  const auto [begin, end] = even_split(6, comm().rank(), comm().size());
  const float loss = hooks.agree_loss(mine, mine.forward(nn::slice_batch(batch, begin, end)));
  mine.backward();
  hooks.reduce_gradients(mine);
  EXPECT_NEAR(loss, want_loss, 1e-5f * want_loss);
  const auto a = whole.parameters(), b = mine.parameters();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    const float* ga = a[i]->grad.data<float>();
    const float* gb = b[i]->grad.data<float>();
    float scale = 0.0f;
    for (std::int64_t j = 0; j < a[i]->grad.numel(); ++j) scale = std::max(scale, std::fabs(ga[j]));
    for (std::int64_t j = 0; j < a[i]->grad.numel(); ++j) {
      ASSERT_NEAR(gb[j], ga[j], 1e-4f * scale + 1e-12f) << a[i]->name << " " << j;
    }
  }
  EXPECT_TRUE(replicas_identical(comm(), mine.model()));
  EXPECT_EQ(hooks.agree_nonfinite(mine, comm().rank() == comm().size() - 1 ? "non-finite loss" : ""),
            comm().size() == 1
                ? "non-finite loss"
                : (comm().rank() == comm().size() - 1
                       ? "non-finite loss"
                       : "non-finite values on rank " + std::to_string(comm().size() - 1) + " (its guard's verdict)"));
}

// A short run of a global batch of 6 rows, this rank's share of them.
nn::TrainConfig sharded_run(const char* model, std::int64_t steps, std::uint64_t seed) {
  nn::TrainConfig c;
  c.model = model;
  c.steps = steps;
  c.seed = seed;
  c.batch = 6;
  c.eval_batches = 1;
  c.warmup_steps = 1;
  return data_parallel_config(comm(), c);
}

// FSDP against DDP, the same global batch: the gathered weights are bit for bit the whole ones and the gradients'
// fp32 sums run in the same rank order, so the losses and the final weights agree bit for bit, for every recipe and
// both models; between steps no rank holds a full parameter, and the shards add up to the model.
TEST(Fsdp, TrainsBitForBitAsDataParallel) {
  struct Case {
    const char* model;
    const char* recipe;
  };
  const Case cases[] = {{"gpt", "fp32"},        {"gpt", "bf16"},        {"gpt", "fp8-delayed"},
                        {"gpt", "fp8-current"}, {"gpt", "fp8-block"},   {"gpt", "mxfp8"},
                        {"gpt", "mxfp8-fake"},  {"cnn", "fp8-delayed"}, {"cnn", "fp8-block"}};
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.model) + " " + k.recipe);
    const nn::TrainConfig config = sharded_run(k.model, 3, 5);
    const nn::PrecisionRecipe recipe = *nn::PrecisionRecipe::parse(k.recipe);
    std::string ddp_print, fsdp_print;
    nn::TrainHooks ddp_base;
    ddp_base.finish = [&](nn::Trainer& t, const nn::TrainProgress&) {
      ddp_print = parameter_fingerprint(t.model()) + state_fingerprint(t.model());
      EXPECT_TRUE(replicas_identical(comm(), t.model()));  // the weights and the delayed-scaling states
    };
    const nn::TrainResult ddp =
        nn::train(config, recipe, nullptr, data_parallel_hooks(comm(), ReducePayload::kFloat32, 6, ddp_base));

    Fsdp fsdp(comm(), ReducePayload::kFloat32, 6);
    nn::TrainHooks base;
    bool between_steps = false;
    base.after_step = [&](nn::Trainer& t, const nn::TrainProgress& p) {
      if (p.next_step != 1) return;
      between_steps = true;
      for (const nn::Parameter* q : t.parameters()) EXPECT_EQ(q->value.numel(), 0) << q->name;
      ASSERT_EQ(t.trained_parameters().size(), t.parameters().size());
    };
    base.finish = [&](nn::Trainer& t, const nn::TrainProgress&) {
      fsdp_print = parameter_fingerprint(t.model()) + state_fingerprint(t.model());
      EXPECT_TRUE(replicas_identical(comm(), t.model()));
    };
    const nn::TrainResult sharded = nn::train(config, recipe, nullptr, fsdp.hooks(base));
    EXPECT_TRUE(between_steps);
    EXPECT_EQ(sharded.losses, ddp.losses);
    EXPECT_EQ(sharded.final_loss, ddp.final_loss);
    EXPECT_EQ(fsdp_print, ddp_print);
    float held = 0.0f;  // exact: fewer than 2^24 parameters
    for (const nn::Parameter* q : fsdp.shards()) held += static_cast<float>(q->value.numel());
    comm().all_reduce(std::span<float>(&held, 1), ReduceOp::kSum);
    EXPECT_EQ(static_cast<std::int64_t>(held), ddp.parameters);
    // The weights travelled in their GEMM's form.
    const char* form = recipe.is_fp8() ? "e4m3fn" : recipe.kind == nn::RecipeKind::kFp32 ? "float32" : "bfloat16";
    EXPECT_EQ(fsdp.gathered().gemm_weights.count(form), 1u);
    // The GPT's weights, gradients and moments are a good part of its memory (the CNN's are a few kB).
    if (comm().size() > 1 && config.model == "gpt") EXPECT_LT(sharded.peak_bytes, ddp.peak_bytes);
  }
}

// The AdamW state as stored (what a checkpoint writes): every tensor's bytes, by parameter name.
std::string optimizer_fingerprint(const nn::AdamW& optimizer) {
  detail::Fingerprint f;
  for (const auto& [name, s] : optimizer.state()) {
    f.add(std::as_bytes(std::span<const char>(name.data(), name.size())));
    for (const Tensor* t : {&s.m, &s.v, &s.m_scale, &s.v_scale, &s.compensation}) {
      f.add(std::span<const std::byte>(t->raw(), static_cast<std::size_t>(t->nbytes())));
    }
  }
  return f.hex();
}

// A whole trainer's state after some steps, to resume another from (as a checkpoint would: values, AdamW state,
// the delayed-scaling states, the losses so far).
struct Snapshot {
  std::map<std::string, Tensor> values;
  std::map<std::string, nn::AdamW::State> optimizer;
  std::vector<std::vector<std::uint8_t>> scaling;
  std::vector<float> losses;
};

Snapshot snapshot(nn::Trainer& t, const nn::TrainProgress& p) {
  Snapshot s;
  for (const nn::Parameter* q : t.parameters()) s.values[q->name] = q->value.clone();
  for (const auto& [name, state] : t.optimizer().state()) {
    nn::AdamW::State copy = state;
    for (Tensor* x : {&copy.m, &copy.v, &copy.m_scale, &copy.v_scale, &copy.compensation}) *x = x->clone();
    s.optimizer[name] = copy;
  }
  for (nn::Fp8LayerState* l : t.model().fp8_states()) {
    for (const DelayedScaling* d : {&l->input, &l->weight, &l->grad_output}) s.scaling.push_back(d->serialize());
  }
  s.losses = p.losses;
  return s;
}

void restore(const Snapshot& s, nn::Trainer& t, nn::TrainProgress& p) {
  for (nn::Parameter* q : t.parameters()) q->value = s.values.at(q->name).clone();
  for (const auto& [name, state] : s.optimizer) {
    nn::AdamW::State copy = state;
    for (Tensor* x : {&copy.m, &copy.v, &copy.m_scale, &copy.v_scale, &copy.compensation}) *x = x->clone();
    t.optimizer().state()[name] = copy;
  }
  std::size_t i = 0;
  for (nn::Fp8LayerState* l : t.model().fp8_states()) {
    for (DelayedScaling* d : {&l->input, &l->weight, &l->grad_output}) *d = DelayedScaling::deserialize(s.scaling[i++]);
  }
  p.losses = s.losses;
  p.next_step = static_cast<std::int64_t>(s.losses.size());
}

// Low-precision optimizer storage, sharded: FP8 moments (their scale blocks cut with the shards) with bf16-sr master
// weights, under per-tensor and 128-block FP8 weights, and bfloat16 moments with Kahan-compensated bf16 master
// weights. FSDP steps bit for bit as DDP (bfloat16 gradients summed in float32 and rounded once in both); its
// checkpoint gather puts the optimizer state together into DDP's bytes; and a run resumed from a whole state (as a
// checkpoint is read) shards it again, scales and compensation included, and ends where the uninterrupted one does.
TEST(Fsdp, LowPrecisionOptimizerStorageIsDataParallelsBitForBit) {
  struct Case {
    const char* model;
    const char* recipe;
    nn::MomentStorage moments;
    nn::MasterWeights master;
  };
  // The CNN's small parameters (biases of 16 channels) leave some ranks empty shards.
  const Case cases[] = {{"gpt", "fp8-o2", nn::MomentStorage::kFp8, nn::MasterWeights::kBf16Stochastic},
                        {"gpt", "fp8-block", nn::MomentStorage::kFp8, nn::MasterWeights::kBf16Stochastic},
                        {"gpt", "fp8-delayed", nn::MomentStorage::kBfloat16, nn::MasterWeights::kBf16Kahan},
                        {"cnn", "fp8-o2", nn::MomentStorage::kFp8, nn::MasterWeights::kBf16Stochastic}};
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(k.model) + " " + k.recipe);
    const nn::TrainConfig config = sharded_run(k.model, 4, 7);
    nn::PrecisionRecipe recipe = *nn::PrecisionRecipe::parse(k.recipe);
    recipe.optimizer_state = k.moments;
    recipe.master_weights = k.master;

    std::string ddp_print, ddp_state, fsdp_print, fsdp_state = "not written";
    Snapshot middle;
    nn::TrainHooks ddp_base;
    ddp_base.after_step = [&](nn::Trainer& t, const nn::TrainProgress& p) {
      if (p.next_step == 2) middle = snapshot(t, p);
    };
    ddp_base.finish = [&](nn::Trainer& t, const nn::TrainProgress&) {
      ddp_print = parameter_fingerprint(t.model());
      ddp_state = optimizer_fingerprint(t.optimizer());
      EXPECT_TRUE(replicas_identical(comm(), t.model()));
      for (const nn::Parameter* q : t.parameters()) ASSERT_EQ(q->value.dtype(), DType::bfloat16) << q->name;
    };
    const nn::TrainResult ddp =
        nn::train(config, recipe, nullptr, data_parallel_hooks(comm(), ReducePayload::kFloat32, 6, ddp_base));

    for (const bool resumed : {false, true}) {
      SCOPED_TRACE(resumed ? "resumed at step 2" : "from the start");
      Fsdp fsdp(comm(), ReducePayload::kFloat32, 6);
      nn::TrainHooks base;
      if (resumed) base.resume = [&](nn::Trainer& t, nn::TrainProgress& p) { restore(middle, t, p); };
      base.finish = [&](nn::Trainer& t, const nn::TrainProgress&) {
        fsdp_print = parameter_fingerprint(t.model());
        fsdp.around_write()(t, true, [&] { fsdp_state = optimizer_fingerprint(t.optimizer()); });
      };
      const nn::TrainResult sharded = nn::train(config, recipe, nullptr, fsdp.hooks(base));
      EXPECT_EQ(sharded.losses, ddp.losses);
      EXPECT_EQ(sharded.final_loss, ddp.final_loss);
      EXPECT_EQ(fsdp_print, ddp_print);
      if (comm().rank() == 0) EXPECT_EQ(fsdp_state, ddp_state);  // rank 0 writes
      // Every shard starts on a whole scale block (FP8 moments) or random draw (bf16-sr).
      const std::int64_t alignment = k.moments == nn::MomentStorage::kFp8 ? nn::kMomentBlock : 1;
      for (const nn::Parameter* q : fsdp.shards()) EXPECT_EQ(q->first_element % alignment, 0) << q->name;
      // The embeddings, norms and biases travel as they are stored: bfloat16.
      EXPECT_EQ(fsdp.gathered().other_parameters.count("bfloat16"), 1u);
      EXPECT_EQ(fsdp.gathered().other_parameters.count("float32"), 0u);
    }
  }
}

}  // namespace
}  // namespace fp8kit

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::unique_ptr<fp8kit::Communicator> world = fp8kit::world_communicator();
  fp8kit::g_comm = world.get();
  // Every rank prints its own results (a failure on any rank fails the job: mpirun exits nonzero).
  const int rc = RUN_ALL_TESTS();
  world.reset();
  return rc;
}
