// `fp8kit bench comm`: what each collective costs per payload, fp32 against bf16 and FP8. The FP8 all-gather is
// FSDP's: each rank quantizes its shard (per tensor, with the agreed amax) and the codes and scales are gathered;
// the reductions are reduce_scatter_sum / all_reduce_sum (cast, exchange, decode, FP32 sums).
#include "comm_bench.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>

#include "fp8kit/dist/fp8_collectives.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/scaling/scale.hpp"
#include "harness.hpp"

namespace fp8kit::bench {
namespace {

struct Dtype {
  const char* name;
  ReducePayload payload;
  bool known_scale = false;  // an FP8 all-gather whose scale is known before (delayed scaling): no amax pass
};
constexpr Dtype kDtypes[] = {{"fp32", ReducePayload::kFloat32},      {"bf16", ReducePayload::kBfloat16},
                             {"e4m3fn", ReducePayload::kE4m3},       {"e5m2", ReducePayload::kE5m2},
                             {"e4m3fn", ReducePayload::kE4m3, true}, {"e5m2", ReducePayload::kE5m2, true}};

// Median over reps of the slowest rank's seconds for fn (each repetition starts from a barrier).
double time_collective(Communicator& comm, const std::function<void()>& fn, int reps) {
  fn();  // warm-up: buffers touched, connections made
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    float s = static_cast<float>(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    comm.all_reduce(std::span<float>(&s, 1), ReduceOp::kMax);
    times.push_back(s);
  }
  return median(times);
}

}  // namespace

std::vector<CommResult> run_comm_bench(Communicator& comm, const std::vector<std::size_t>& sizes, int reps) {
  const int ranks = comm.size(), me = comm.rank();
  std::vector<CommResult> out;
  for (std::size_t size : sizes) {
    const std::size_t elements = size / sizeof(float);
    // This rank's values: the whole payload (reductions) and its shard of it (the all-gather).
    std::vector<float> x(elements);
    std::mt19937 rng(17u + static_cast<unsigned>(me));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : x) v = normal(rng);
    // The payload as a matrix of 4096-element rows (or single elements), cut into row shards as shard_rows cuts a
    // per-tensor weight; the same cut for every dtype.
    const std::size_t cols = elements % 4096 == 0 ? 4096 : 1;
    const auto rows = static_cast<std::int64_t>(elements / cols);
    std::vector<std::size_t> counts(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(shard_rows(rows, 1, r, ranks).rows()) * cols;
    }
    const std::size_t shard = counts[static_cast<std::size_t>(me)];
    std::vector<float> work(elements), part(shard);
    for (const char* op : {"all_gather", "reduce_scatter", "all_reduce"}) {
      double fp32_rate = 0;
      for (const Dtype& d : kDtypes) {
        const std::string o = op;
        if (d.known_scale && o != "all_gather") continue;  // the reductions' pre-scale is always agreed
        std::function<void()> fn;
        std::vector<std::byte> gathered;
        std::vector<bfloat16> half;
        if (o == "all_gather") {
          if (d.payload == ReducePayload::kFloat32) {
            std::vector<std::size_t> bytes(counts.size());
            for (std::size_t r = 0; r < counts.size(); ++r) bytes[r] = counts[r] * sizeof(float);
            fn = [&, bytes] {
              comm.all_gather(std::as_bytes(std::span<const float>(x.data(), shard)),
                              std::as_writable_bytes(std::span<float>(work)), bytes);
            };
          } else if (d.payload == ReducePayload::kBfloat16) {
            std::vector<std::size_t> bytes(counts.size());
            for (std::size_t r = 0; r < counts.size(); ++r) bytes[r] = counts[r] * sizeof(bfloat16);
            half.resize(shard);
            gathered.resize(elements * sizeof(bfloat16));
            fn = [&, bytes] {
              for (std::size_t i = 0; i < shard; ++i) half[i] = bfloat16::from_float(x[i]);
              comm.all_gather(std::as_bytes(std::span<const bfloat16>(half)), gathered, bytes);
            };
          } else {
            const QuantizeOptions q{d.payload == ReducePayload::kE4m3 ? Format::e4m3fn : Format::e5m2,
                                    Overflow::kSaturate,
                                    Granularity::tensor(),
                                    {}};
            const MatrixRef mine_rows(x.data(), static_cast<std::int64_t>(shard / cols),
                                      static_cast<std::int64_t>(cols));
            if (d.known_scale) {
              // The scale every rank already holds (a delayed-scaling history's): one cast pass, then the gather.
              const float scale = compute_scale(4.0f, q.format);  // |x| of a unit normal stays below 4 or saturates
              fn = [&, q, mine_rows, scale] {
                (void)all_gather_rows(comm, quantize_with_scale(mine_rows, q.format, scale, q.overflow), rows);
              };
            } else {
              fn = [&, q, mine_rows] { (void)all_gather_rows(comm, quantize_shard(comm, mine_rows, q), rows); };
            }
          }
        } else if (o == "reduce_scatter") {
          fn = [&] { reduce_scatter_sum(comm, x, part, counts, d.payload); };
        } else {
          fn = [&] {
            std::copy(x.begin(), x.end(), work.begin());
            all_reduce_sum(comm, work, d.payload);
          };
        }
        comm.reset_stats();
        fn();
        const CommStats once = comm.stats();
        const double seconds = time_collective(comm, fn, reps);
        CommResult r;
        r.op = op;
        r.dtype = d.name;
        if (o == "all_gather" && (d.payload == ReducePayload::kE4m3 || d.payload == ReducePayload::kE5m2)) {
          r.scaling = d.known_scale ? "delayed" : "current";
        }
        r.ranks = ranks;
        r.elements = elements;
        // The payload: what this rank handed to the backend in one call, the amax and header exchanges included.
        r.bytes = static_cast<std::size_t>(once.total_bytes());
        r.seconds = seconds;
        r.gbps = seconds > 0 ? static_cast<double>(r.bytes) / seconds / 1e9 : 0;
        r.elements_per_second = seconds > 0 ? static_cast<double>(elements) / seconds : 0;
        if (d.payload == ReducePayload::kFloat32) fp32_rate = r.elements_per_second;
        r.ratio = fp32_rate > 0 ? r.elements_per_second / fp32_rate : 0;
        out.push_back(r);
      }
    }
  }
  return out;
}

}  // namespace fp8kit::bench
