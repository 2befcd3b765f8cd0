// The data-parallel hooks of the trainer: the loss and the gradients summed over ranks (weighted by each rank's
// rows), the guard's verdict and the delayed-scaling amaxes agreed, and the replica check.
#include "fp8kit/dist/data_parallel.hpp"

#include <cstdio>
#include <cstring>
#include <vector>

#include "common/fingerprint.hpp"
#include "fp8kit/common/error.hpp"

namespace fp8kit {

nn::TrainConfig data_parallel_config(const Communicator& comm, nn::TrainConfig config) {
  config.batch_shard = {comm.rank(), comm.size()};
  return config;
}

nn::TrainHooks data_parallel_hooks(Communicator& comm, ReducePayload payload, std::int64_t global_rows,
                                   nn::TrainHooks base) {
  // The same on every rank (all refuse together): every rank needs rows.
  FP8KIT_CHECK(global_rows >= comm.size(), "data parallel: a global batch of ", global_rows, " rows leaves some of ",
               comm.size(), " ranks none (give --batch of at least ", comm.size(), ")");
  const auto [begin, end] = even_split(global_rows, comm.rank(), comm.size());
  // This rank's share of every global mean: its rows over all rows, rounded once to float (exact when the share is
  // a power of two). The weighted sum of the ranks' means still rounds otherwise than one mean over all rows.
  const float share = static_cast<float>(end - begin) / static_cast<float>(global_rows);
  Communicator* c = &comm;
  base.agree_loss = [c, share](nn::Trainer&, float loss) {
    float weighted = loss * share;
    c->all_reduce(std::span<float>(&weighted, 1), ReduceOp::kSum);
    return weighted;
  };
  base.reduce_gradients = [c, share, payload](nn::Trainer& t) {
    for (nn::Parameter* p : t.parameters()) {
      // A bfloat16 gradient (bf16 master weights) is summed in float32 and rounded once to nearest even.
      Tensor sum = p->grad.to(DType::float32);  // a float32 gradient itself
      float* g = sum.data<float>();
      const auto n = static_cast<std::size_t>(sum.numel());
      if (share != 1.0f) {
        for (std::size_t i = 0; i < n; ++i) g[i] *= share;
      }
      all_reduce_sum(*c, std::span<float>(g, n), payload);
      if (p->grad.dtype() == DType::bfloat16) {
        bfloat16* out = p->grad.data<bfloat16>();
        for (std::size_t i = 0; i < n; ++i) out[i] = bfloat16::from_float(g[i]);
      }
    }
  };
  base.agree_nonfinite = [c](nn::Trainer&, const std::string& bad) {
    // The lowest rank with a verdict: size - rank for it, 0 for none; the MAX over ranks picks it.
    float mine = bad.empty() ? 0.0f : static_cast<float>(c->size() - c->rank());
    c->all_reduce(std::span<float>(&mine, 1), ReduceOp::kMax);
    if (mine == 0.0f) return std::string();
    const int rank = c->size() - static_cast<int>(mine);
    return rank == c->rank() ? bad : "non-finite values on rank " + std::to_string(rank) + " (its guard's verdict)";
  };
  base.agree_amax = [c](nn::Trainer& t) {
    std::vector<DelayedScaling*> states;
    for (nn::Fp8LayerState* s : t.model().fp8_states()) {
      for (DelayedScaling* d : {&s->input, &s->weight, &s->grad_output}) {
        if (!d->history().empty()) states.push_back(d);
      }
    }
    std::vector<float> amaxes;
    for (DelayedScaling* d : states) amaxes.push_back(d->history()[0]);
    all_reduce_amax(*c, amaxes);
    // record() keeps the larger: every rank's slot becomes the run's maximum.
    for (std::size_t i = 0; i < states.size(); ++i) states[i]->record(amaxes[i]);
  };
  return base;
}

TrainCheckpointOptions::AroundWrite rank_zero_writes(Communicator& comm) {
  Communicator* c = &comm;
  return [c](nn::Trainer&, bool, const std::function<void()>& write) {
    agree_on_error(*c, [&] {
      if (c->rank() == 0) write();
    });
  };
}

std::string parameter_fingerprint(nn::Model& model) {
  detail::Fingerprint f;
  for (const nn::Parameter* p : model.parameters()) {
    f.add(std::span<const std::byte>(p->value.raw(), static_cast<std::size_t>(p->value.nbytes())));
  }
  return f.hex();
}

std::string state_fingerprint(nn::Model& model) {
  detail::Fingerprint f;
  for (nn::Fp8LayerState* s : model.fp8_states()) {
    for (const DelayedScaling* d : {&s->input, &s->weight, &s->grad_output}) {
      const std::vector<std::uint8_t> bytes = d->serialize();
      f.add(std::as_bytes(std::span<const std::uint8_t>(bytes)));
    }
  }
  return f.hex();
}

bool replicas_identical(Communicator& comm, nn::Model& model) {
  const std::string mine = parameter_fingerprint(model) + state_fingerprint(model);
  std::vector<char> all(mine.size() * static_cast<std::size_t>(comm.size()));
  const std::vector<std::size_t> counts(static_cast<std::size_t>(comm.size()), mine.size());
  comm.all_gather(std::as_bytes(std::span<const char>(mine.data(), mine.size())),
                  std::as_writable_bytes(std::span<char>(all)), counts);
  for (int r = 0; r < comm.size(); ++r) {
    if (std::memcmp(all.data() + static_cast<std::size_t>(r) * mine.size(), mine.data(), mine.size()) != 0)
      return false;
  }
  return true;
}

}  // namespace fp8kit
