// FP8 collectives: row shards on block boundaries, the batched amax agreement, and the all-gather of FP8 shards
// with their scales (a header exchange first, so that every rank refuses the same mismatch).
#include "fp8kit/dist/fp8_collectives.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/convert/convert.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/scaling/amax.hpp"
#include "fp8kit/scaling/scale.hpp"

namespace fp8kit {

RowShard shard_rows(std::int64_t rows, std::int64_t block_rows, int rank, int ranks) {
  FP8KIT_CHECK(rows >= 0 && block_rows >= 1, "shard_rows: ", rows, " rows in blocks of ", block_rows,
               " (rows >= 0, blocks >= 1)");
  const auto [b0, b1] = even_split(ceil_div(rows, block_rows), rank, ranks);  // whole blocks
  return {std::min(rows, b0 * block_rows), std::min(rows, b1 * block_rows)};
}

void all_reduce_amax(Communicator& comm, std::span<float> amaxes) {
  const CommEvent event(comm, "all_reduce_amax");
  for (float& a : amaxes) {
    if (std::isnan(a)) a = std::numeric_limits<float>::infinity();
  }
  comm.all_reduce(amaxes, ReduceOp::kMax);
}

ScaledTensor quantize_shard(Communicator& comm, MatrixRef shard, const QuantizeOptions& options) {
  if (options.granularity.kind != Granularity::Kind::kTensor) return quantize(shard, options);
  // Checked on every rank before the amax agreement, an empty shard's too: a refusal on some ranks only would leave
  // the others waiting in it (with call checks on, every rank refuses together).
  comm.check_arguments([&] {
    FP8KIT_CHECK(shard.dtype == DType::float32 || shard.dtype == DType::bfloat16 || shard.dtype == DType::float16,
                 "quantize_shard: the shard is ", name(shard.dtype),
                 "; quantize float32, bfloat16 or float16 matrices");
  });
  // A bfloat16 / float16 shard widened to float32 (exact): its amax and codes are those of the 16-bit values.
  std::vector<float> wide;
  MatrixRef x = shard;
  if (shard.dtype != DType::float32) {
    wide.resize(static_cast<std::size_t>(shard.numel()));
    widen_rows(shard, 0, shard.rows, wide.data());
    x = MatrixRef{wide.data(), shard.rows, shard.cols};
  }
  float all = 0.0f;
  AmaxResult local;
  if (x.numel() > 0) amax_blocks(x, x.rows, x.cols, std::span<float>(&all, 1), &local);
  // The finite maximum, as quantize() takes it for the whole matrix (its NaN and Inf elements encode as they do
  // there).
  float amax = local.amax;
  all_reduce_amax(comm, std::span<float>(&amax, 1));
  ScaledTensor q =
      quantize_with_scale(x, options.format, compute_scale(amax, options.format, options.scale), options.overflow);
  q.original_dtype = shard.dtype;
  return q;
}

namespace {

// Which way shards are cut: rank r holds rows (or columns) shard_rows(total, block, r, size) of the matrix.
enum class Axis : std::uint8_t { kRows, kCols };

// What every rank says of its shard before the data moves.
struct ShardHeader {
  std::int64_t total, rows, cols, block_rows, block_cols;  // total: the whole matrix's rows (kRows) or columns
  std::int64_t cut;                                        // shards are whole multiples of it along the axis
  std::uint32_t scale_bits;                                // per tensor: the one scale
  std::uint8_t format, overflow, kind, mx_mode;
  std::uint8_t valid;           // the shard's buffers hold what its shape and granularity need
  std::uint8_t original_dtype;  // what was quantized (dequantize's default target): rank 0's is the gather's
  std::uint8_t padding[6];
};

std::string describe(const ShardHeader& h) {
  Granularity g;
  g.kind = static_cast<Granularity::Kind>(h.kind);
  g.block_rows = h.block_rows;
  g.block_cols = h.block_cols;
  g.mx_mode = static_cast<MxScaleMode>(h.mx_mode);
  return std::to_string(h.rows) + "x" + std::to_string(h.cols) + " " +
         std::string(name(static_cast<Format>(h.format))) + " " + g.name() + " blocks " + std::to_string(h.block_rows) +
         "x" + std::to_string(h.block_cols) +
         (static_cast<Overflow>(h.overflow) == Overflow::kSaturate ? " saturating" : " non-saturating");
}

// Whether a shard's buffers hold what its shape and granularity need (a hand-made one may not).
bool buffers_fit(const ScaledTensor& s) {
  std::int64_t elements = 0;
  if (s.rows < 0 || s.cols < 0 || __builtin_mul_overflow(s.rows, s.cols, &elements)) return false;
  const auto blocks = static_cast<std::size_t>(s.grid_rows() * s.grid_cols());  // at most rows x cols
  return s.data.size() == static_cast<std::size_t>(elements) && s.scale_inv.size() == blocks &&
         (s.granularity.kind != Granularity::Kind::kMx || s.scale_e8m0.size() == blocks);
}

// Rank r's slab of `rows` rows of widths[r] bytes each, slabs back to back in rank order, as `rows` rows of all the
// slabs side by side (the column shards of a matrix, gathered, put together).
void interleave(const std::byte* slabs, std::span<const std::size_t> widths, std::size_t rows, std::byte* out) {
  std::size_t stride = 0;
  for (std::size_t w : widths) stride += w;
  std::size_t at = 0;
  for (std::size_t r = 0, offset = 0; r < widths.size(); offset += widths[r], ++r) {
    if (widths[r] == 0) continue;
    for (std::size_t i = 0; i < rows; ++i, at += widths[r])
      std::memcpy(out + i * stride + offset, slabs + at, widths[r]);
  }
}

// Every rank's `mine` (bytes_of(header r) bytes from rank r), in rank order; along kCols, the slabs of `slab_rows`
// rows put side by side.
template <class T, class BytesOf>
void gather(Communicator& comm, std::span<const T> mine, std::span<T> out, std::span<const ShardHeader> all,
            BytesOf bytes_of, Axis axis, std::size_t slab_rows) {
  std::vector<std::size_t> counts(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) counts[r] = bytes_of(all[r]) * sizeof(T);
  if (axis == Axis::kRows) return comm.all_gather(std::as_bytes(mine), std::as_writable_bytes(out), counts);
  std::vector<std::byte> slabs(out.size_bytes());
  comm.all_gather(std::as_bytes(mine), slabs, counts);
  for (std::size_t& c : counts) c /= std::max<std::size_t>(slab_rows, 1);  // bytes per row of each slab
  if (slab_rows > 0) interleave(slabs.data(), counts, slab_rows, reinterpret_cast<std::byte*>(out.data()));
}

// The block extent shards are cut on along `axis` of a matrix with `total` rows (columns): 1 per tensor (one agreed
// scale), the block's extent otherwise (per column along rows, per row along columns: everything, one shard).
std::int64_t block_along(const Granularity& g, Axis axis, std::int64_t total) {
  if (g.kind == Granularity::Kind::kTensor) return 1;
  const std::int64_t t = std::max<std::int64_t>(total, 1);
  return std::max<std::int64_t>(1, axis == Axis::kRows ? g.rows_per_block(t) : g.cols_per_block(t));
}

ScaledTensor gather_shards(Communicator& comm, const ScaledTensor& shard, std::int64_t total, std::int64_t cut,
                           Axis axis, std::string_view collective) {
  const CommEvent event(comm, collective, std::string(name(shard.format)));
  const auto n = static_cast<std::size_t>(comm.size());
  const std::string where =
      std::string(collective) + " on rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size());
  const bool rows_axis = axis == Axis::kRows;
  const bool per_tensor = shard.granularity.kind == Granularity::Kind::kTensor;
  ShardHeader mine;
  std::memset(&mine, 0, sizeof mine);  // padding included: the bytes travel
  mine.total = total;
  mine.rows = shard.rows;
  mine.cols = shard.cols;
  // The block along the cut from the whole matrix; across it, from the shard (the same extent on every rank). A
  // hand-made shard whose granularity cannot say (a block of 0 rows) is refused after the header exchange, on every
  // rank: this one with its own error.
  std::string refusal;
  std::int64_t block_of_cut = 1;
  bool fits = false;
  try {
    FP8KIT_CHECK(cut >= 0, "cut ", cut, " is negative (0 cuts on the blocks, or give a multiple of them)");
    fits = buffers_fit(shard);
    mine.block_rows = rows_axis ? block_along(shard.granularity, axis, total)
                                : shard.granularity.rows_per_block(std::max<std::int64_t>(shard.rows, 1));
    mine.block_cols = rows_axis ? shard.granularity.cols_per_block(std::max<std::int64_t>(shard.cols, 1))
                                : block_along(shard.granularity, axis, total);
    block_of_cut = std::max<std::int64_t>(rows_axis ? mine.block_rows : mine.block_cols, 1);
  } catch (const Error& e) {
    refusal = e.what();
  }
  mine.cut = cut > 0 ? cut : block_of_cut;
  mine.scale_bits = per_tensor && !shard.scale_inv.empty() ? std::bit_cast<std::uint32_t>(shard.scale_inv[0]) : 0u;
  mine.format = static_cast<std::uint8_t>(shard.format);
  mine.overflow = static_cast<std::uint8_t>(shard.overflow);
  mine.kind = static_cast<std::uint8_t>(shard.granularity.kind);
  mine.mx_mode = static_cast<std::uint8_t>(shard.granularity.mx_mode);
  mine.original_dtype = static_cast<std::uint8_t>(shard.original_dtype);
  // A cut across blocks would split a block's scale between ranks.
  mine.valid = refusal.empty() && fits && mine.cut % block_of_cut == 0 ? 1 : 0;
  std::vector<ShardHeader> all(n);
  const std::vector<std::size_t> header_bytes(n, sizeof(ShardHeader));
  comm.all_gather(std::as_bytes(std::span<const ShardHeader>(&mine, 1)), std::as_writable_bytes(std::span(all)),
                  header_bytes);
  FP8KIT_CHECK(refusal.empty(), where, ": this rank's shard: ", refusal);  // (the others refuse it below)
  const auto extent = [&](const ShardHeader& h) { return rows_axis ? h.rows : h.cols; };  // along the cut
  const auto across = [&](const ShardHeader& h) { return rows_axis ? h.cols : h.rows; };
  const char* along = rows_axis ? "rows" : "columns";
  // The same checks on every rank, on the same data: all refuse together or none does.
  std::size_t first = 0;  // the first non-empty shard (per tensor, its scale is the one)
  while (first + 1 < n && extent(all[first]) == 0) ++first;
  // First what does not depend on this rank's own arguments, so that every rank fails the same check.
  for (std::size_t r = 0; r < n; ++r) {
    const ShardHeader& h = all[r];
    FP8KIT_CHECK(h.total == all[0].total, where, ": rank ", r, " gathers ", h.total, " ", along, ", rank 0 ",
                 all[0].total, " (every rank passes the whole matrix's ", along, ")");
    FP8KIT_CHECK(h.valid == 1, where, ": rank ", r, "'s ", h.rows, "x", h.cols,
                 " shard holds buffers of other sizes than its shape and granularity need, or is cut in multiples of ",
                 h.cut, " across blocks of ", rows_axis ? h.block_rows : h.block_cols, " ", along,
                 " (make shards with quantize_shard or quantize, cut on whole blocks)");
  }
  for (std::size_t r = 0; r < n; ++r) {
    const ShardHeader& h = all[r];
    FP8KIT_CHECK(across(h) == across(all[0]) && h.block_rows == all[0].block_rows &&
                     h.block_cols == all[0].block_cols && h.format == all[0].format && h.overflow == all[0].overflow &&
                     h.kind == all[0].kind && h.mx_mode == all[0].mx_mode,
                 where, ": rank ", r, "'s shard (", describe(h), ") differs from rank 0's (", describe(all[0]),
                 "): quantize every shard with the same options");
    FP8KIT_CHECK(h.cut == all[0].cut, where, ": rank ", r, " cuts shards in multiples of ", h.cut, " ", along,
                 ", rank 0 of ", all[0].cut, " (every rank passes the same cut)");
    FP8KIT_CHECK(!per_tensor || extent(h) == 0 || h.scale_bits == all[first].scale_bits, where,
                 ": per-tensor shards with different scales (rank ", r, " and rank ", first,
                 "): agree on one with all_reduce_amax (quantize_shard does)");
  }
  // Now the options (so the blocks) are every rank's: the extents are checked alike everywhere.
  for (std::size_t r = 0; r < n; ++r) {
    const RowShard want = shard_rows(total, all[0].cut, static_cast<int>(r), comm.size());
    FP8KIT_CHECK(extent(all[r]) == want.rows(), where, ": rank ", r, "'s shard has ", extent(all[r]), " ", along,
                 ", the split gives it ", want.rows(), " (", along, " ", want.begin, " to ", want.end, " of ", total,
                 ")");
  }
  ScaledTensor out;
  out.format = shard.format;
  out.overflow = shard.overflow;
  out.granularity = shard.granularity;
  out.original_dtype = static_cast<DType>(all[0].original_dtype);
  out.rows = rows_axis ? total : shard.rows;
  out.cols = rows_axis ? shard.cols : total;
  // The codes, every shard's in rank order.
  out.data.resize(static_cast<std::size_t>(out.rows * out.cols));
  const auto codes_of = [](const ShardHeader& h) { return static_cast<std::size_t>(h.rows * h.cols); };
  gather(comm, std::span<const std::uint8_t>(shard.data.data(), shard.data.size()),
         std::span<std::uint8_t>(out.data.data(), out.data.size()), all, codes_of, axis,
         static_cast<std::size_t>(out.rows));
  if (per_tensor) {
    // One scale, already agreed: the first non-empty shard's (every rank has it in the header).
    const float scale_inv = extent(all[first]) > 0 ? std::bit_cast<float>(all[first].scale_bits) : 1.0f;
    out.scale_inv.assign(static_cast<std::size_t>(out.grid_rows() * out.grid_cols()), scale_inv);
    return out;
  }
  // The scales of every block, shards in rank order (a shard's blocks are its own: it starts on a block boundary).
  // MX scales travel as their E8M0 codes only: the float scales are 2^(code - 127), exactly.
  const auto blocks_of = [&](const ShardHeader& h) {
    return static_cast<std::size_t>(ceil_div(h.rows, all[0].block_rows) * ceil_div(h.cols, all[0].block_cols));
  };
  const auto grid_rows = static_cast<std::size_t>(out.grid_rows());
  out.scale_inv.resize(static_cast<std::size_t>(out.grid_rows() * out.grid_cols()));
  if (shard.granularity.kind == Granularity::Kind::kMx) {
    out.scale_e8m0.resize(out.scale_inv.size());
    gather(comm, std::span<const std::uint8_t>(shard.scale_e8m0.data(), shard.scale_e8m0.size()),
           std::span<std::uint8_t>(out.scale_e8m0.data(), out.scale_e8m0.size()), all, blocks_of, axis, grid_rows);
    for (std::size_t b = 0; b < out.scale_inv.size(); ++b) out.scale_inv[b] = mx_scale_value(out.scale_e8m0[b]);
  } else {
    gather(comm, std::span<const float>(shard.scale_inv.data(), shard.scale_inv.size()),
           std::span<float>(out.scale_inv.data(), out.scale_inv.size()), all, blocks_of, axis, grid_rows);
  }
  return out;
}

// A float matrix (any dtype, moved as bytes) from its shards along `axis`: the extents exchanged first and checked
// against the split on every rank alike.
Tensor gather_matrix(Communicator& comm, const Tensor& shard, std::int64_t total, std::int64_t block, Axis axis,
                     std::string_view collective) {
  const CommEvent event(comm, collective, std::string(name(shard.dtype())));
  const auto n = static_cast<std::size_t>(comm.size());
  const std::string where =
      std::string(collective) + " on rank " + std::to_string(comm.rank()) + " of " + std::to_string(comm.size());
  const MatrixRef m = shard.matrix();
  ShardHeader mine;
  std::memset(&mine, 0, sizeof mine);
  mine.total = total;
  mine.rows = m.rows;
  mine.cols = m.cols;
  mine.block_rows = block;
  mine.format = static_cast<std::uint8_t>(shard.dtype());
  mine.valid = shard.dim() == 2 ? 1 : 0;
  std::vector<ShardHeader> all(n);
  const std::vector<std::size_t> header_bytes(n, sizeof(ShardHeader));
  comm.all_gather(std::as_bytes(std::span<const ShardHeader>(&mine, 1)), std::as_writable_bytes(std::span(all)),
                  header_bytes);
  const bool rows_axis = axis == Axis::kRows;
  const auto extent = [&](const ShardHeader& h) { return rows_axis ? h.rows : h.cols; };
  const auto across = [&](const ShardHeader& h) { return rows_axis ? h.cols : h.rows; };
  for (std::size_t r = 0; r < n; ++r) {
    const ShardHeader& h = all[r];
    FP8KIT_CHECK(h.valid == 1 && h.total == all[0].total && h.block_rows == all[0].block_rows &&
                     h.format == all[0].format && across(h) == across(all[0]),
                 where, ": rank ", r, "'s ", h.rows, "x", h.cols, " shard of ", h.total, " (blocks of ", h.block_rows,
                 ", dtype ", name(static_cast<DType>(h.format)), ") does not fit rank 0's ", all[0].rows, "x",
                 all[0].cols, " of ", all[0].total, " (blocks of ", all[0].block_rows, ", dtype ",
                 name(static_cast<DType>(all[0].format)), "): every rank gathers 2-D shards of one matrix");
  }
  for (std::size_t r = 0; r < n; ++r) {
    const RowShard want = shard_rows(total, all[0].block_rows, static_cast<int>(r), comm.size());
    FP8KIT_CHECK(extent(all[r]) == want.rows(), where, ": rank ", r, "'s shard has ", extent(all[r]),
                 rows_axis ? " rows" : " columns", ", the split gives it ", want.rows(), " of ", total);
  }
  const std::int64_t rows = rows_axis ? total : m.rows, cols = rows_axis ? m.cols : total;
  Tensor out = empty({rows, cols}, shard.dtype());
  const auto bytes_of = [&](const ShardHeader& h) {
    return static_cast<std::size_t>(h.rows * h.cols * element_size(shard.dtype()));
  };
  gather(comm, std::span<const std::byte>(shard.raw(), static_cast<std::size_t>(shard.nbytes())),
         std::span<std::byte>(out.raw(), static_cast<std::size_t>(out.nbytes())), all, bytes_of, axis,
         static_cast<std::size_t>(rows));
  return out;
}

}  // namespace

std::int64_t shard_block_rows(const Granularity& granularity, std::int64_t rows) {
  return block_along(granularity, Axis::kRows, rows);
}

std::int64_t shard_block_cols(const Granularity& granularity, std::int64_t cols) {
  return block_along(granularity, Axis::kCols, cols);
}

ScaledTensor all_gather_rows(Communicator& comm, const ScaledTensor& shard, std::int64_t rows, std::int64_t cut) {
  return gather_shards(comm, shard, rows, cut, Axis::kRows, "all_gather_rows");
}

ScaledTensor all_gather_cols(Communicator& comm, const ScaledTensor& shard, std::int64_t cols, std::int64_t cut) {
  return gather_shards(comm, shard, cols, cut, Axis::kCols, "all_gather_cols");
}

Tensor all_gather_rows(Communicator& comm, const Tensor& shard, std::int64_t rows, std::int64_t block_rows) {
  return gather_matrix(comm, shard, rows, block_rows, Axis::kRows, "all_gather_rows");
}

Tensor all_gather_cols(Communicator& comm, const Tensor& shard, std::int64_t cols, std::int64_t block_cols) {
  return gather_matrix(comm, shard, cols, block_cols, Axis::kCols, "all_gather_cols");
}

// ---------------------------------------------------------------- sums in a payload

namespace {

// The payloads, in enum order: name and bytes per element.
struct PayloadRow {
  ReducePayload payload;
  std::string_view name;
  std::size_t bytes;
};
constexpr PayloadRow kPayloads[] = {{ReducePayload::kFloat32, "fp32", 4},
                                    {ReducePayload::kBfloat16, "bf16", 2},
                                    {ReducePayload::kE4m3, "e4m3", 1},
                                    {ReducePayload::kE5m2, "e5m2", 1}};

}  // namespace

std::string_view name(ReducePayload payload) {
  return kPayloads[static_cast<std::size_t>(payload)].name;
}

std::optional<ReducePayload> parse_reduce_payload(std::string_view text) {
  if (text == "fp8") return ReducePayload::kE5m2;
  for (const PayloadRow& r : kPayloads) {
    if (r.name == text) return r.payload;
  }
  return std::nullopt;
}

std::size_t payload_bytes(ReducePayload payload) {
  return kPayloads[static_cast<std::size_t>(payload)].bytes;
}

namespace {

bool is_fp8(ReducePayload p) {
  return p == ReducePayload::kE4m3 || p == ReducePayload::kE5m2;
}
Format format_of(ReducePayload p) {
  return p == ReducePayload::kE4m3 ? Format::e4m3fn : Format::e5m2;
}

// The payload's pre-scale (1 except FP8: a power of two from every rank's amax of `values`; a collective then).
float agreed_scale(Communicator& comm, std::span<const float> values, ReducePayload payload) {
  if (!is_fp8(payload)) return 1.0f;
  float all = 0.0f;
  AmaxResult local;
  if (!values.empty()) {
    amax_blocks(MatrixRef(values.data(), 1, static_cast<std::int64_t>(values.size())), 1,
                static_cast<std::int64_t>(values.size()), std::span<float>(&all, 1), &local);
  }
  float amax = local.amax;  // finite: a NaN or Inf element travels non-finite, and must not move the scale
  all_reduce_amax(comm, std::span<float>(&amax, 1));
  return compute_scale(amax, format_of(payload), ScaleOptions{0, 0.0f, ScaleRounding::kPowerOfTwoDown});
}

// values * scale in the payload (bf16 or FP8: fp32 sums are the communicator's own), as bytes.
std::vector<std::byte> encode(std::span<const float> values, ReducePayload payload, float scale) {
  std::vector<std::byte> out(values.size() * payload_bytes(payload));
  if (values.empty()) return out;
  if (payload == ReducePayload::kBfloat16) {
    auto* b = reinterpret_cast<bfloat16*>(out.data());
    for (std::size_t i = 0; i < values.size(); ++i) b[i] = bfloat16::from_float(values[i]);
  } else {
    cast_to_fp8(values, std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(out.data()), values.size()),
                CastOptions{format_of(payload), Overflow::kNonSaturating, Rounding::kNearestEven, scale});
  }
  return out;
}

// n values of the payload at `bytes`, times scale_inv, into out (added when `add`: out[i] + v, in that order).
void decode_into(const std::byte* bytes, std::size_t n, ReducePayload payload, float scale_inv, float* out, bool add) {
  if (n == 0) return;
  float* into = out;
  thread_local std::vector<float> decoded;  // where an added part is decoded first
  if (add) {
    decoded.resize(n);
    into = decoded.data();
  }
  if (payload == ReducePayload::kBfloat16) {
    for (std::size_t i = 0; i < n; ++i) {
      bfloat16 b;
      std::memcpy(&b, bytes + 2 * i, 2);
      into[i] = b.to_float();
    }
  } else {
    // decode * scale_inv in float32: exact (scale_inv is a power of two), as the scalar codec's product
    cast_from_fp8(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bytes), n), format_of(payload),
                  std::span<float>(into, n), scale_inv);
  }
  if (add) {
    for (std::size_t i = 0; i < n; ++i) out[i] += into[i];
  }
}

}  // namespace

void reduce_scatter_sum(Communicator& comm, std::span<const float> send, std::span<float> recv,
                        std::span<const std::size_t> counts, ReducePayload payload) {
  const CommEvent event(comm, "reduce_scatter_sum", std::string(name(payload)));
  const auto n = static_cast<std::size_t>(comm.size()), me = static_cast<std::size_t>(comm.rank());
  const std::string where = "reduce_scatter_sum on rank " + std::to_string(me) + " of " + std::to_string(n);
  comm.check_arguments([&] {  // before the scale's agreement, the first collective (with call checks, agreed)
    FP8KIT_CHECK(counts.size() == n, where, ": ", counts.size(), " counts for ", n, " ranks (give one per rank)");
    std::size_t total = 0;
    for (std::size_t c : counts) total += c;
    FP8KIT_CHECK(total == send.size() && counts[me] == recv.size(), where, ": the counts add up to ", total,
                 " floats with ", counts[me], " for this rank; the buffers hold ", send.size(), " and ", recv.size());
    // From the counts alone (the same on every rank): what all_to_all moves at most, the whole send and n parts
    // of the largest, within one collective.
    const std::size_t largest = *std::max_element(counts.begin(), counts.end()), width = payload_bytes(payload);
    FP8KIT_CHECK(std::max(total, n * largest) <= kMaxCollectiveBytes / width, where, ": ", total, " values of ", width,
                 " byte(s) in parts of up to ", largest, " pass the ", kMaxCollectiveBytes,
                 " bytes one collective moves (split the payload)");
  });
  if (payload == ReducePayload::kFloat32) return comm.reduce_scatter(send, recv, counts, ReduceOp::kSum);
  const CommStats before = comm.stats();
  const float scale = agreed_scale(comm, send, payload);
  const float scale_inv = 1.0f / scale;  // exact: a power of two
  const std::size_t width = payload_bytes(payload);
  const std::vector<std::byte> bytes = encode(send, payload, scale);
  std::vector<std::size_t> send_bytes(n), recv_bytes(n, recv.size() * width);
  for (std::size_t r = 0; r < n; ++r) send_bytes[r] = counts[r] * width;
  std::vector<std::byte> parts(n * recv.size() * width);
  comm.all_to_all(bytes, send_bytes, parts, recv_bytes);
  for (std::size_t r = 0; r < n; ++r) {
    decode_into(parts.data() + r * recv.size() * width, recv.size(), payload, scale_inv, recv.data(), r > 0);
  }
  comm.count_as(before, &CommStats::reduce_scatter_bytes);
}

void all_reduce_sum(Communicator& comm, std::span<float> data, ReducePayload payload) {
  const CommEvent event(comm, "all_reduce_sum", std::string(name(payload)));
  if (payload == ReducePayload::kFloat32) return comm.all_reduce(data, ReduceOp::kSum);
  const auto n = static_cast<std::size_t>(comm.size()), me = static_cast<std::size_t>(comm.rank());
  std::vector<std::size_t> counts(n);
  for (std::size_t r = 0; r < n; ++r) counts[r] = even_part(data.size(), static_cast<int>(r), comm.size());
  const CommStats before = comm.stats();
  std::vector<float> mine(counts[me]);
  reduce_scatter_sum(comm, data, mine, counts, payload);
  // The reduced parts, gathered in the payload: FP8 with the scale of the sums' amax, agreed again.
  const float scale = agreed_scale(comm, mine, payload);
  const std::size_t width = payload_bytes(payload);
  const std::vector<std::byte> bytes = encode(mine, payload, scale);
  std::vector<std::size_t> part_bytes(n);
  for (std::size_t r = 0; r < n; ++r) part_bytes[r] = counts[r] * width;
  std::vector<std::byte> all(data.size() * width);
  comm.all_gather(bytes, all, part_bytes);
  decode_into(all.data(), data.size(), payload, 1.0f / scale, data.data(), false);
  comm.count_as(before, &CommStats::all_reduce_bytes);
}

}  // namespace fp8kit
