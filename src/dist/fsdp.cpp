// FSDP: parameters sharded by rows over the ranks, GEMM weights gathered in their GEMM's form (FP8 with scales,
// bfloat16, float32) for each use and their gradients reduce-scattered as the layers produce them.
#include "fp8kit/dist/fsdp.hpp"

#include <cstring>
#include <exception>
#include <numeric>

#include "fp8kit/common/error.hpp"
#include "fp8kit/dist/data_parallel.hpp"
#include "fp8kit/format/format.hpp"
#include "fp8kit/scaling/scaled_tensor.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit {
namespace {

// Rows [begin, end) of a tensor along its first dimension, copied (a shape of `end - begin` rows).
Tensor rows_of(const Tensor& t, std::int64_t rows, std::int64_t begin, std::int64_t end) {
  Shape shape = t.shape();
  shape[0] = end - begin;
  Tensor out = empty(shape, t.dtype());
  const std::int64_t row_bytes = rows == 0 ? 0 : t.nbytes() / rows;
  if (out.nbytes() > 0) std::memcpy(out.raw(), t.raw() + begin * row_bytes, static_cast<std::size_t>(out.nbytes()));
  return out;
}

// The FP8 moment scales of rows [begin, end) of a parameter of `cols` columns: its blocks of kMomentBlock elements
// from the one holding element begin x cols (a shard starts on a block: Fsdp::shard cuts so).
std::pair<std::int64_t, std::int64_t> moment_blocks(std::int64_t cols, std::int64_t begin, std::int64_t end) {
  const std::int64_t first = begin * cols / nn::kMomentBlock;
  return {first, begin == end ? first : ceil_div(end * cols, nn::kMomentBlock)};
}

Tensor slice_blocks(const Tensor& scales, std::pair<std::int64_t, std::int64_t> blocks) {
  return rows_of(scales, scales.numel(), blocks.first, blocks.second);
}

// What a gathered operand carried, for GatherCounts.
std::string carried(const nn::RecipeOperand& op) {
  return op.fp8 ? std::string(name(op.fp8->format)) : std::string(name(op.values.dtype()));
}

}  // namespace

Fsdp::Fsdp(Communicator& comm, ReducePayload grad_payload, std::int64_t global_rows)
    : comm_(comm), payload_(grad_payload), global_rows_(global_rows) {
  FP8KIT_CHECK(global_rows >= comm.size(), "fsdp: a global batch of ", global_rows, " rows leaves some of ",
               comm.size(), " ranks none (give --batch of at least ", comm.size(), ")");
  const auto [begin, end] = even_split(global_rows, comm.rank(), comm.size());
  share_ = static_cast<float>(end - begin) / static_cast<float>(global_rows);  // as data_parallel_hooks weighs
}

Fsdp::Shard& Fsdp::shard_of(const nn::Parameter& p) {
  const auto it = index_.find(&p);
  FP8KIT_CHECK(it != index_.end(), "fsdp on rank ", comm_.rank(), ": parameter '", p.name,
               "' is not one of the sharded model's (shard the trainer's model first)");
  return shards_[it->second];
}

void Fsdp::shard(nn::Trainer& trainer) {
  FP8KIT_CHECK(trainer_ == nullptr, "fsdp: shard() once per run (a new Fsdp for another trainer)");
  trainer_ = &trainer;
  // GEMM weights are cut on the run's weight blocks, along both orientations: the forward quantizes rows of W (the
  // granularity's block rows), the input gradient the transpose, whose columns are W's rows (its block columns).
  // The run's recipe decides for every layer: a layer under another recipe (the bf16 LM head of FP8 recipes) takes
  // any cut. One whose FP8 blocks did not fit the cut would be refused by the gathers, on every rank alike.
  const nn::PrecisionRecipe& recipe = trainer.recipe();
  const Granularity weight_blocks =
      recipe.is_fp8() ? nn::granularity_of(recipe, nn::TensorRole::kWeight) : Granularity::tensor();
  // Every shard also starts where AdamW can update a part as the whole (FP8 moments: on a scale block; bf16-sr master
  // weights: on a random draw), so that the sharded run steps bit for bit as the whole one.
  const std::int64_t alignment = trainer.optimizer().part_alignment();
  std::map<std::string, nn::AdamW::State>& moments = trainer.optimizer().state();
  shards_.reserve(trainer.parameters().size());
  for (nn::Parameter* p : trainer.parameters()) {
    Shard s;
    s.full = p;
    s.shape = p->value.shape();
    s.rows = s.shape.empty() ? 1 : s.shape[0];
    s.cols = s.rows == 0 ? 0 : p->value.numel() / s.rows;
    if (p->gemm_weight) {
      s.cut = std::lcm(shard_block_rows(weight_blocks, s.rows), shard_block_cols(weight_blocks, s.rows));
    }
    if (s.cols > 0) s.cut = std::lcm(s.cut, alignment / std::gcd(s.cols, alignment));
    s.mine = shard_rows(s.rows, s.cut, comm_.rank(), comm_.size());
    s.part.name = p->name;
    s.part.first_element = s.mine.begin * s.cols;
    const Tensor value = s.shape.empty() ? p->value.reshape({1}) : p->value;
    {
      MemoryCategoryScope category(MemoryCategory::kParameters);
      s.part.value = rows_of(value, s.rows, s.mine.begin, s.mine.end);
    }
    if (const auto m = moments.find(p->name); m != moments.end()) {
      // A resumed run's whole moments: this shard's rows of them, and of their FP8 scales and Kahan compensation.
      MemoryCategoryScope category(MemoryCategory::kOptimizerState);
      nn::AdamW::State& state = m->second;
      const auto mine = [&](const Tensor& t) {
        return t.numel() == 0 ? t : rows_of(t.reshape(value.shape()), s.rows, s.mine.begin, s.mine.end);
      };
      state.m = mine(state.m);
      state.v = mine(state.v);
      state.compensation = mine(state.compensation);
      if (state.m_scale.numel() > 0) {
        const auto blocks = moment_blocks(s.cols, s.mine.begin, s.mine.end);
        state.m_scale = slice_blocks(state.m_scale, blocks);
        state.v_scale = slice_blocks(state.v_scale, blocks);
      }
    }
    p->value = Tensor();
    p->grad = Tensor();
    index_[p] = shards_.size();
    shards_.push_back(std::move(s));
  }
  for (Shard& s : shards_) shard_ptrs_.push_back(&s.part);
  trainer.set_trained_parameters(shard_ptrs_);
  trainer.set_weight_source(this);
}

Tensor Fsdp::part_matrix(const Shard& s) const {
  return s.part.value.reshape({s.mine.rows(), s.cols});
}

Tensor Fsdp::gather_value(const Shard& s, GatherCounts* counts) {
  const std::uint64_t before = comm_.stats().all_gather_bytes;
  Tensor full = all_gather_rows(comm_, part_matrix(s), s.rows, s.cut).reshape(s.shape);
  if (counts != nullptr) {
    GatherCount& c = counts->other_parameters[std::string(name(full.dtype()))];
    c.elements += static_cast<std::uint64_t>(full.numel());
    c.bytes += comm_.stats().all_gather_bytes - before;
  }
  return full;
}

void Fsdp::gather_direct() {
  for (Shard& s : shards_) {
    if (s.full->gemm_weight) continue;
    MemoryCategoryScope category(MemoryCategory::kParameters);
    s.full->value = gather_value(s, &gathered_);
    s.full->grad = Tensor();  // allocated by the layer's first gradient (nn::gradient)
  }
}

void Fsdp::reduce_into(Shard& s, Tensor full_grad) {
  // In the gradients' dtype first (a bfloat16 one, as an unsharded run accumulates a GEMM weight's gradient), then
  // summed in float32 (so the DDP run's sum: data_parallel_hooks).
  full_grad = full_grad.to(s.part.value.dtype()).to(DType::float32);
  float* g = full_grad.data<float>();
  const std::int64_t n = full_grad.numel();
  if (share_ != 1.0f) {
    for (std::int64_t i = 0; i < n; ++i) g[i] *= share_;
  }
  std::vector<std::size_t> counts(static_cast<std::size_t>(comm_.size()));
  for (int r = 0; r < comm_.size(); ++r) {
    counts[static_cast<std::size_t>(r)] =
        static_cast<std::size_t>(shard_rows(s.rows, s.cut, r, comm_.size()).rows() * s.cols);
  }
  std::vector<float> mine(counts[static_cast<std::size_t>(comm_.rank())]);
  reduce_scatter_sum(comm_, std::span<const float>(g, static_cast<std::size_t>(n)), mine, counts, payload_);
  nn::add_to_gradient(s.part, mine);
}

void Fsdp::reduce_direct() {
  for (Shard& s : shards_) {
    if (s.full->gemm_weight) continue;
    reduce_into(s, std::move(nn::gradient(*s.full)));
    s.full->grad = Tensor();
    s.full->value = Tensor();
  }
}

void Fsdp::gather_full() {
  for (Shard& s : shards_) {
    s.full->value = gather_value(s, nullptr);
    s.full->grad = Tensor();
  }
  if (trainer_ != nullptr) trainer_->set_weight_source(nullptr);
}

nn::RecipeOperand Fsdp::gather_operand(const nn::GemmCall& call, nn::Parameter& weight, bool transposed) {
  Shard& s = shard_of(weight);
  FP8KIT_CHECK(call.recipe != nullptr, "fsdp: a GEMM call without a recipe (", call.op, ")");
  // FP8 travels as FP8 also under fake quantization: the shard quantized for real, the gathered codes dequantized
  // (bit for bit the fake-quantized whole weight).
  nn::PrecisionRecipe real = *call.recipe;
  const bool fake = real.is_fp8() && real.mode == nn::Fp8Mode::kFakeQuant;
  real.mode = nn::Fp8Mode::kReal;
  nn::GemmCall local = call;
  local.recipe = &real;
  Communicator* comm = &comm_;
  local.agree_amax = [comm](float amax) {
    all_reduce_amax(*comm, std::span<float>(&amax, 1));
    return amax;
  };
  const Tensor part = part_matrix(s);
  const nn::RecipeOperand mine = transposed ? nn::prepare_operand_transposed(local, nn::TensorRole::kWeight, part)
                                            : nn::prepare_operand(local, nn::TensorRole::kWeight, part);
  const std::uint64_t before = comm_.stats().all_gather_bytes;
  nn::RecipeOperand out;
  out.blocked = mine.blocked;
  if (mine.fp8) {
    out.fp8 = transposed ? all_gather_cols(comm_, *mine.fp8, s.rows, s.cut)
                         : all_gather_rows(comm_, *mine.fp8, s.rows, s.cut);
  } else {
    out.values = transposed ? all_gather_cols(comm_, mine.values, s.rows, s.cut)
                            : all_gather_rows(comm_, mine.values, s.rows, s.cut);
  }
  GatherCount& c = gathered_.gemm_weights[carried(out)];
  c.elements += static_cast<std::uint64_t>(s.rows * s.cols);
  c.bytes += comm_.stats().all_gather_bytes - before;
  if (fake) {
    out.values = dequantize(*out.fp8, DType::float32);
    out.fp8.reset();
  }
  return out;
}

nn::RecipeOperand Fsdp::forward_operand(const nn::GemmCall& call, nn::Parameter& weight) {
  return gather_operand(call, weight, false);
}

nn::RecipeOperand Fsdp::backward_operand(const nn::GemmCall& call, nn::Parameter& weight) {
  return gather_operand(call, weight, true);
}

void Fsdp::add_gradient(nn::Parameter& weight, Tensor dw) {
  Shard& s = shard_of(weight);
  FP8KIT_CHECK(dw.numel() == s.rows * s.cols, "fsdp: a gradient of ", dw.numel(), " elements for '", weight.name,
               "' of ", s.rows * s.cols);
  reduce_into(s, std::move(dw));
}

Tensor Fsdp::gather_blocks(const Shard& s, const Tensor& scales) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(comm_.size()));
  std::size_t total = 0;
  for (int r = 0; r < comm_.size(); ++r) {
    const RowShard rows = shard_rows(s.rows, s.cut, r, comm_.size());
    const auto [first, end] = moment_blocks(s.cols, rows.begin, rows.end);
    counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(end - first) * sizeof(float);
    total += counts[static_cast<std::size_t>(r)];
  }
  FP8KIT_CHECK(static_cast<std::size_t>(scales.nbytes()) == counts[static_cast<std::size_t>(comm_.rank())],
               "fsdp on rank ", comm_.rank(), ": '", s.part.name, "' has ", scales.numel(),
               " FP8 moment scales for its shard of ", counts[static_cast<std::size_t>(comm_.rank())] / sizeof(float));
  Tensor whole = empty({static_cast<std::int64_t>(total / sizeof(float))}, DType::float32);
  comm_.all_gather(std::span<const std::byte>(scales.raw(), static_cast<std::size_t>(scales.nbytes())),
                   std::span<std::byte>(whole.raw(), total), counts);
  return whole;
}

void Fsdp::write_whole(nn::Trainer& trainer, bool optimizer_state, const std::function<void()>& write) {
  // The whole values (those released between steps) and moments, every rank taking part in every gather.
  std::vector<Shard*> gathered;
  for (Shard& s : shards_) {
    if (s.full->value.numel() == 0 && s.rows * s.cols > 0) {
      s.full->value = gather_value(s, nullptr);
      gathered.push_back(&s);
    }
  }
  std::map<std::string, nn::AdamW::State>& moments = trainer.optimizer().state();
  const nn::AdamWOptions& storage = trainer.optimizer().options();
  std::vector<std::pair<nn::AdamW::State*, nn::AdamW::State>> parts;  // the shards' moments, to put back
  for (Shard& s : shards_) {
    const auto m = optimizer_state ? moments.find(s.part.name) : moments.end();
    if (m == moments.end()) continue;
    nn::AdamW::State& state = m->second;
    parts.emplace_back(&state, state);
    const auto whole = [&](const Tensor& t) {
      return all_gather_rows(comm_, t.reshape({s.mine.rows(), s.cols}), s.rows, s.cut).reshape(s.shape);
    };
    state.m = whole(state.m);
    state.v = whole(state.v);
    // What the options keep (the same on every rank, so all take part in the same gathers).
    if (storage.master == nn::MasterWeights::kBf16Kahan) state.compensation = whole(state.compensation);
    if (storage.moments == nn::MomentStorage::kFp8) {
      state.m_scale = gather_blocks(s, state.m_scale);
      state.v_scale = gather_blocks(s, state.v_scale);
    }
  }
  const auto put_back = [&] {
    for (auto& [state, part] : parts) *state = std::move(part);
    for (Shard* s : gathered) s->full->value = Tensor();
  };
  try {
    agree_on_error(comm_, [&] {
      if (comm_.rank() == 0) write();
    });
  } catch (...) {
    put_back();
    throw;
  }
  put_back();
}

TrainCheckpointOptions::AroundWrite Fsdp::around_write() {
  return [this](nn::Trainer& t, bool optimizer_state, const std::function<void()>& write) {
    write_whole(t, optimizer_state, write);
  };
}

nn::TrainHooks Fsdp::hooks(nn::TrainHooks base) {
  nn::TrainHooks h = data_parallel_hooks(comm_, payload_, global_rows_, std::move(base));
  h.prepare = [this](nn::Trainer& t) { shard(t); };
  h.begin_step = [this](nn::Trainer&) { gather_direct(); };
  h.reduce_gradients = [this](nn::Trainer&) { reduce_direct(); };
  h.finish = [this, finish = std::move(h.finish)](nn::Trainer& t, const nn::TrainProgress& p) {
    gather_full();
    if (finish) finish(t, p);
  };
  return h;
}

}  // namespace fp8kit
