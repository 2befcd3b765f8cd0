// FP8 over a communicator: shards cut on scale-block boundaries, the amax agreement every rank's scale needs (one
// batched MAX all-reduce, NaN as +Inf), and the all-gather of FP8 shards with their scales that gives, bit for bit,
// the quantization of the whole matrix. FP8 travels as bytes with its scales; nothing is summed in FP8.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "fp8kit/dist/communicator.hpp"
#include "fp8kit/scaling/quantize.hpp"
#include "fp8kit/tensor/matrix_ref.hpp"
#include "fp8kit/tensor/tensor.hpp"

namespace fp8kit {

// Rows [begin, end) of a `rows`-row matrix that rank `rank` of `ranks` holds: whole blocks of `block_rows` rows
// (the granularity's; the last block may be short), the blocks split by even_split, in rank order. Shards may be
// empty (more ranks than blocks).
struct RowShard {
  std::int64_t begin = 0, end = 0;
  std::int64_t rows() const { return end - begin; }
};
RowShard shard_rows(std::int64_t rows, std::int64_t block_rows, int rank, int ranks);
// The block rows of a granularity over a matrix of `rows` rows (what shards are cut on): 1 per tensor (one scale)
// and per row, the block's rows for blocks, 1 for MX; per column, all rows (one shard holds the matrix).
std::int64_t shard_block_rows(const Granularity& granularity, std::int64_t rows);
// The same across columns (column shards, all_gather_cols): 1 per tensor and per column, the block's columns for
// blocks, 32 for MX; per row, all columns.
std::int64_t shard_block_cols(const Granularity& granularity, std::int64_t cols);

// Every rank's amaxes, maximum per element, with NaN counted as +Inf (MPI's and NCCL's MAX drop NaN, and ranks
// would then disagree about skipping a step): one all-reduce for all of them, so batch every layer's into one span.
void all_reduce_amax(Communicator& comm, std::span<float> amaxes);

// This rank's shard of a matrix quantized so that the shards gather into the whole matrix's quantization: per tensor
// with the scale of the all-reduced amax (every rank calls this: it is a collective then), otherwise block by block
// locally. `shard` is rows shard_rows(rows, shard_block_rows(...), rank, size) of the matrix.
ScaledTensor quantize_shard(Communicator& comm, MatrixRef shard, const QuantizeOptions& options);

// The whole matrix from every rank's shard (quantize_shard's, or any shards of the same format, overflow policy,
// granularity and columns, cut as shard_rows(rows, cut, rank, size) says, per tensor with one scale): the codes and
// the scales of every block gathered in rank order, bit-identical to quantizing the whole matrix at once. `cut` is
// shard_block_rows (0), or a multiple of it (a cut that also suits another granularity). A shard that does not fit
// the others is refused on every rank, one line naming the rank and what differs.
// MX scales travel as their E8M0 codes only (one byte per 32 elements); the float scales are rebuilt from them.
ScaledTensor all_gather_rows(Communicator& comm, const ScaledTensor& shard, std::int64_t rows, std::int64_t cut = 0);
// The same from column shards: rank r holds columns shard_rows(cols, cut or shard_block_cols(...), r, size) of every
// row (e.g. each rank's quantization of the transpose of its row shard of a weight: the gather is the transpose of the
// whole weight quantized, bit for bit, with per-tensor, block or MX scales).
ScaledTensor all_gather_cols(Communicator& comm, const ScaledTensor& shard, std::int64_t cols, std::int64_t cut = 0);
// A 2-D tensor of any dtype (float32, bfloat16: moved as its bytes) from its row (column) shards cut in blocks of
// `block` rows (columns) as shard_rows says; refused on every rank alike when a shard does not fit.
Tensor all_gather_rows(Communicator& comm, const Tensor& shard, std::int64_t rows, std::int64_t block_rows = 1);
Tensor all_gather_cols(Communicator& comm, const Tensor& shard, std::int64_t cols, std::int64_t block_cols = 1);

// What a sum over ranks (gradients) travels as: float32 as it is; bfloat16, each contribution rounded once to
// nearest even; or FP8 (MS-AMP's FP8 gradients) with a power-of-two pre-scale from the all-reduced amax of every
// contribution, so that none saturates (non-saturating casts: NaN and Inf travel as NaN, and the guard sees them).
// Every rank decodes what it receives and sums in FP32 in rank order: the same bits on every rank.
enum class ReducePayload : std::uint8_t { kFloat32, kBfloat16, kE4m3, kE5m2 };
std::string_view name(ReducePayload payload);  // "fp32", "bf16", "e4m3", "e5m2"
// The names above, and "fp8" for e5m2 (the gradient format of the HYBRID recipes).
std::optional<ReducePayload> parse_reduce_payload(std::string_view text);
// Bytes per element of a payload.
std::size_t payload_bytes(ReducePayload payload);

// recv = the sum over ranks of part rank() of every rank's send (parts as Communicator::reduce_scatter), the
// contributions carried as `payload`. What is exact: float32 contributions (only the FP32 sums round); bfloat16 and
// FP8 round each contribution once (FP8 after the exact power-of-two pre-scale; unscaling is exact), then the sums
// round. Counted as one reduce-scatter: the payload bytes sent to other ranks (plus, for FP8, the amax all-reduce).
void reduce_scatter_sum(Communicator& comm, std::span<const float> send, std::span<float> recv,
                        std::span<const std::size_t> counts, ReducePayload payload);
// data = the sum over ranks, in place: reduce_scatter_sum, then every rank's reduced part all-gathered in the same
// payload (FP8 re-quantized with the all-reduced amax of the sums: a second rounding). Every rank ends with the same
// bits. Counted as one all-reduce.
void all_reduce_sum(Communicator& comm, std::span<float> data, ReducePayload payload);

}  // namespace fp8kit
