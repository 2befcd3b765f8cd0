// `fp8kit bench comm`: the collectives of the dist layer on one payload size after another, in fp32, bf16, e4m3fn
// and e5m2, with the fp32 row of the same op and size as the baseline (run under mpirun -np N; one rank runs them
// locally). Times are the slowest rank's, medians over repetitions.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "fp8kit/dist/communicator.hpp"

namespace fp8kit::bench {

struct CommResult {
  std::string op;     // "all_gather" (shards of elements / ranks each, gathered), "reduce_scatter", "all_reduce"
  std::string dtype;  // "fp32", "bf16", "e4m3fn", "e5m2"
  // FP8 all-gathers: "current" (each rank's amax pass, the amax all-reduce, the cast, the gather: torchao's
  // per-tensor current scaling) or "delayed" (the scale known, as under delayed scaling: the cast and the gather);
  // empty for the other rows.
  std::string scaling;
  int ranks = 1;
  std::size_t elements = 0;  // of the whole payload (an fp32 payload of this many elements is the size asked for)
  std::size_t bytes = 0;     // payload bytes this rank handed to the backend per call (CommStats)
  double seconds = 0;        // median over the repetitions of the slowest rank's time
  double gbps = 0;           // bytes / seconds
  double elements_per_second = 0;
  double ratio = 0;  // elements_per_second over the fp32 row's of the same op and size
};

// Every op and dtype for each size (bytes of an fp32 payload), `reps` repetitions each. A collective: every rank
// calls it; every rank gets the same results.
std::vector<CommResult> run_comm_bench(Communicator& comm, const std::vector<std::size_t>& sizes, int reps);

}  // namespace fp8kit::bench
