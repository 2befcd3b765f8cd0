// Training checkpoints: k steps + save + resume to N is bit-identical to N uninterrupted steps (losses, weights,
// AdamW moments, amax histories, final loss) under every recipe and for both models; every state piece round-trips;
// each damaged or mismatched checkpoint is refused with one line naming what is wrong; the FP8 export is readable.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>

#include "expect_error.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"
#include "fp8kit/io/fp8_export.hpp"
#include "fp8kit/io/safetensors.hpp"
#include "fp8kit/io/train_checkpoint.hpp"
#include "fp8kit/nn/train.hpp"

namespace fp8kit::nn {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed at the end.
class TempDir {
 public:
  explicit TempDir(std::string name = current_test_name()) {
    path_ = fs::temp_directory_path() / ("fp8kit_ckpt_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  fs::path operator/(const std::string& name) const { return path_ / name; }
  const fs::path& path() const { return path_; }

 private:
  static std::string current_test_name() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    return std::string(info->test_suite_name()) + "_" + info->name();
  }
  fs::path path_;
};

TrainConfig run_of(const std::string& model, std::int64_t steps) {
  TrainConfig c;
  c.model = model;
  c.steps = steps;
  c.seed = 5;
  c.warmup_steps = 2;  // so that the cosine part of the schedule is crossed in a few steps
  c.final_loss_window = 3;
  c.eval_batches = 2;  // the held-out loss is part of what must match, and 2 batches show it as well as 16
  c.batch = 4;         // sequences (images) per step: a resume continues 4 as it would 16
  return c;
}

std::uint32_t bits(float f) {
  return std::bit_cast<std::uint32_t>(f);
}

// The final weights of a run: the checkpoint it saved after its last step, as bytes by tensor name.
std::map<std::string, std::vector<std::byte>> tensors_of(const fs::path& path) {
  const SafetensorsFile f = SafetensorsFile::open(path);
  std::map<std::string, std::vector<std::byte>> out;
  for (const SafetensorsTensor& t : f.tensors()) out[t.name].assign(t.bytes.begin(), t.bytes.end());
  return out;
}

void expect_same_run(const TrainResult& a, const TrainResult& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(bits(a.losses[i]), bits(b.losses[i])) << what << " step " << i;
  }
  EXPECT_EQ(bits(a.final_loss), bits(b.final_loss)) << what;
  EXPECT_EQ(a.skipped_steps, b.skipped_steps) << what;
}

// N uninterrupted steps against k steps, a checkpoint, and a resumed run to N. The uninterrupted run saves every k
// steps, and its checkpoint after step k is copied aside (what a run killed after that save leaves behind); both runs
// save their final state, which must be the same bytes: weights, AdamW moments and step counts, amax histories and
// scales, losses.
void check_bit_identical_resume(TrainConfig config, const PrecisionRecipe& recipe, std::int64_t k) {
  SCOPED_TRACE(config.model + " " + recipe.name() + " moments " + std::string(name(recipe.optimizer_state)) +
               " master " + std::string(name(recipe.master_weights)));
  const TempDir dir;
  const fs::path at_k = dir / "step_k.safetensors";
  TrainCheckpointOptions full;
  full.save_checkpoint = (dir / "full.safetensors").string();
  full.checkpoint_every = k;
  const TrainResult uninterrupted = train_with_checkpoints(config, recipe, full, nullptr, [&](const StepLog& s) {
    if (s.step + 1 == k) fs::copy_file(full.save_checkpoint, at_k);
  });
  const TrainCheckpointInfo info = read_train_checkpoint_info(at_k);
  EXPECT_EQ(info.next_step, k);
  EXPECT_EQ(info.steps, config.steps);

  TrainCheckpointOptions rest;
  rest.resume_from = at_k.string();
  rest.save_checkpoint = (dir / "resumed.safetensors").string();
  std::vector<std::int64_t> steps_run;
  const TrainResult resumed =
      train_with_checkpoints(config, recipe, rest, nullptr, [&](const StepLog& s) { steps_run.push_back(s.step); });
  EXPECT_EQ(resumed.start_step, k);
  ASSERT_FALSE(steps_run.empty());
  EXPECT_EQ(steps_run.front(), k);
  EXPECT_EQ(steps_run.size(), static_cast<std::size_t>(config.steps - k));
  expect_same_run(uninterrupted, resumed, "resumed");
  const auto a = tensors_of(full.save_checkpoint), b = tensors_of(rest.save_checkpoint);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, bytes] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    EXPECT_TRUE(bytes == b.at(name)) << name << " differs";
  }
}

void check_bit_identical_resume(TrainConfig config, const std::string& recipe_name, std::int64_t k) {
  check_bit_identical_resume(std::move(config), *PrecisionRecipe::parse(recipe_name), k);
}

TEST(TrainCheckpoint, ResumeIsBitIdenticalForEveryRecipe) {
  for (const char* recipe : {"fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8", "fp8-delayed-e4m3"}) {
    check_bit_identical_resume(run_of("gpt", 4), recipe, 2);
  }
}

// FP8 and bfloat16 moments with their block scales, bfloat16 master weights with the stochastic rounding's stream
// (seed and step counts) or the Kahan buffer: a resumed run continues bit for bit.
TEST(TrainCheckpoint, ResumeIsBitIdenticalWithLowPrecisionOptimizerState) {
  check_bit_identical_resume(run_of("gpt", 4), "fp8-o2", 2);
  PrecisionRecipe kahan = *PrecisionRecipe::parse("fp8-delayed");
  kahan.optimizer_state = MomentStorage::kBfloat16;
  kahan.master_weights = MasterWeights::kBf16Kahan;
  check_bit_identical_resume(run_of("gpt", 4), kahan, 2);
  check_bit_identical_resume(run_of("cnn", 3), "fp8-o2", 1);
  // The checkpoint holds what the recipe keeps: E4M3 moments with F32 block scales, BF16 parameters.
  const TempDir dir;
  TrainCheckpointOptions save;
  save.save_checkpoint = (dir / "o2.safetensors").string();
  train_with_checkpoints(run_of("gpt", 1), *PrecisionRecipe::parse("fp8-o2"), save, nullptr, {});
  const SafetensorsFile f = SafetensorsFile::open(save.save_checkpoint);
  ASSERT_NE(f.find("transformer.wte.weight"), nullptr);
  EXPECT_EQ(f.find("transformer.wte.weight")->dtype, SafetensorsDType::BF16);
  ASSERT_NE(f.find("optim.exp_avg.transformer.wte.weight"), nullptr);
  EXPECT_EQ(f.find("optim.exp_avg.transformer.wte.weight")->dtype, SafetensorsDType::F8_E4M3);
  ASSERT_NE(f.find("optim.exp_avg_sq_scale_inv.transformer.wte.weight"), nullptr);
  EXPECT_EQ(f.find("optim.exp_avg_sq_scale_inv.transformer.wte.weight")->shape, (Shape{256 * 128 / kMomentBlock}));
  // Resuming under other storage is refused, naming the settings.
  PrecisionRecipe other = *PrecisionRecipe::parse("fp8-o2");
  other.optimizer_state = MomentStorage::kFloat32;
  try {
    check_resumable(save.save_checkpoint, read_train_checkpoint_info(save.save_checkpoint), run_of("gpt", 4), other);
    FAIL() << "a checkpoint with FP8 moments resumed under float32 ones";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--optimizer-state fp8, not fp32"), std::string::npos) << e.what();
  }
}

TEST(TrainCheckpoint, ResumeIsBitIdenticalForTheCnn) {
  check_bit_identical_resume(run_of("cnn", 3), "fp8-delayed", 2);
}

// A skipped step before the checkpoint (its count carried over; AdamW's step counts then lag the run's) and one
// right after it (the restored amax histories must drop that step's NaN).
TEST(TrainCheckpoint, ResumeKeepsTheSkippedSteps) {
  TrainConfig before = run_of("gpt", 3);
  before.inject_nan_step = 0;
  check_bit_identical_resume(before, "fp8-delayed", 2);
  TrainConfig after = run_of("gpt", 3);
  after.inject_nan_step = 2;
  check_bit_identical_resume(after, "fp8-delayed", 2);
}

// ---------------------------------------------------------------- round trip of every piece

TEST(TrainCheckpoint, EveryStatePieceRoundTrips) {
  const TempDir dir;
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-delayed");
  const TrainConfig config = run_of("gpt", 10);
  const auto model = make_model(config, recipe);
  AdamW adamw;
  std::uint64_t seed = 100;
  for (Parameter* p : model->parameters()) {
    p->value = randn(p->value.shape(), ++seed, DType::float32);
    // Every other parameter has optimizer state (a step skipped before its first update leaves none).
    if (seed % 2 == 0) {
      AdamW::State& s = adamw.state()[p->name];
      s.m = randn(p->value.shape(), ++seed, DType::float32);
      s.v = rand(p->value.shape(), ++seed, DType::float32);
      s.step = static_cast<std::int64_t>(seed % 7) + 1;
    }
  }
  float amax = 0.5f;
  for (Fp8LayerState* s : model->fp8_states()) {
    for (int i = 0; i < 5; ++i) {
      s->input.record(amax *= 1.7f);
      s->weight.record(amax * 0.01f);
      s->grad_output.record(amax * 1e-6f);
      s->update();
    }
    s->input.record(3.0f);  // recorded but not yet rolled: slot 0 of the history
  }
  const TrainProgress progress{7, {5.5f, 5.1f, NAN, 4.0f, 3.5f, 3.25f, 3.0f}, 1};
  const fs::path path = dir / "ck.safetensors";
  save_train_checkpoint(path, config, recipe, *model, adamw, progress, "");

  const auto fresh = make_model(config, recipe);
  AdamW restored;
  const TrainProgress back = load_train_checkpoint(path, config, recipe, *fresh, restored);
  EXPECT_EQ(back.next_step, 7);
  EXPECT_EQ(back.skipped_steps, 1);
  ASSERT_EQ(back.losses.size(), progress.losses.size());
  for (std::size_t i = 0; i < back.losses.size(); ++i) EXPECT_EQ(bits(back.losses[i]), bits(progress.losses[i]));
  const auto pa = model->parameters(), pb = fresh->parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(std::memcmp(pa[i]->value.raw(), pb[i]->value.raw(), static_cast<std::size_t>(pa[i]->value.nbytes())), 0)
        << pa[i]->name;
  }
  ASSERT_EQ(restored.state().size(), adamw.state().size());
  for (const auto& [name, s] : adamw.state()) {
    const AdamW::State& r = restored.state().at(name);
    EXPECT_EQ(r.step, s.step) << name;
    EXPECT_EQ(std::memcmp(r.m.raw(), s.m.raw(), static_cast<std::size_t>(s.m.nbytes())), 0) << name;
    EXPECT_EQ(std::memcmp(r.v.raw(), s.v.raw(), static_cast<std::size_t>(s.v.nbytes())), 0) << name;
  }
  const auto sa = model->fp8_states(), sb = fresh->fp8_states();
  for (std::size_t i = 0; i < sa.size(); ++i) {
    for (TensorRole role : {TensorRole::kInput, TensorRole::kWeight, TensorRole::kGradOutput}) {
      EXPECT_EQ(sa[i]->of(role).serialize(), sb[i]->of(role).serialize()) << sa[i]->layer << " " << name(role);
    }
    EXPECT_NE(sb[i]->input.scale(), 1.0f) << sb[i]->layer;  // the state moved away from a fresh one
  }
  const TrainCheckpointInfo info = read_train_checkpoint_info(path);
  EXPECT_EQ(info.model, "gpt");
  EXPECT_EQ(info.seed, config.seed);
  EXPECT_EQ(info.steps, 10);
  EXPECT_EQ(info.adamw.lr, config.adamw.lr);
  EXPECT_EQ(info.warmup_steps, config.warmup_steps);
  EXPECT_EQ(info.recipe.name(), "fp8-delayed");
  EXPECT_EQ(info.recipe.amax_history_length, recipe.amax_history_length);
  EXPECT_EQ(info.recipe.fp8_conv_max_kernel_area, recipe.fp8_conv_max_kernel_area);
}

// The checkpointer's hooks keep the caller's: each of resume, after_step and finish runs the checkpoint work first
// (the file is there when the caller's hook runs), then the caller's.
// Destinations that cannot be written are refused when the checkpointer is built, before any step: a missing
// directory, a directory or a device where a file goes, a file where the export directory goes. With around_write
// the caller decides where the writes happen, and checks.
TEST(TrainCheckpoint, UnwritableDestinationsAreRefusedBeforeTheRun) {
  const TempDir dir;
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-delayed");
  const TrainConfig c = run_of("gpt", 1);
  std::ofstream(dir / "a-file") << "x";
  const std::pair<std::string, std::string> saves[] = {
      {(dir / "missing" / "ck.safetensors").string(), "does not exist; create it first"},
      {dir.path().string(), "is a directory"},
      {"/dev/null", "not a regular file"},
      {(dir / "a-file" / "ck.safetensors").string(), "is a file, not a directory"},
      {"/proc/ck.safetensors", "cannot write into '/proc'"}};  // a probe file, where access(2) passes for root
  for (const auto& [path, why] : saves) {
    TrainCheckpointOptions o;
    o.save_checkpoint = path;
    testing::expect_error([&] { TrainCheckpointer checkpoints(c, recipe, o); }, ErrorKind::kIo, {path, why});
    o.around_write = [](Trainer&, bool, const std::function<void()>&) {};
    EXPECT_NO_THROW(TrainCheckpointer(c, recipe, o));
  }
  TrainCheckpointOptions e;
  e.export_fp8 = (dir / "a-file").string();
  testing::expect_error([&] { TrainCheckpointer checkpoints(c, recipe, e); }, ErrorKind::kIo,
                        {"a-file", "is a file, not a directory"});
  e.export_fp8 = (dir / "a-file" / "deeper" / "model").string();
  testing::expect_error([&] { TrainCheckpointer checkpoints(c, recipe, e); }, ErrorKind::kIo,
                        {"is a file, not a directory"});
  e.export_fp8 = (dir / "new" / "deeper" / "model").string();  // created with its parents when written
  EXPECT_NO_THROW(TrainCheckpointer(c, recipe, e));
  EXPECT_FALSE(fs::exists(dir / "new"));  // checked, not created
  for (const auto& entry : fs::directory_iterator(dir.path())) EXPECT_EQ(entry.path().filename(), "a-file");
}

TEST(TrainCheckpoint, HooksKeepTheCallersOwn) {
  const TempDir dir;
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp32");
  TrainConfig c = run_of("gpt", 3);
  c.steps = 2;
  TrainCheckpointOptions o;
  o.save_checkpoint = (dir / "ck.safetensors").string();
  std::vector<std::string> calls;
  {
    TrainCheckpointer checkpoints(c, recipe, o);
    TrainHooks base;
    base.after_step = [&](Trainer&, const TrainProgress& p) {
      calls.push_back("after " + std::to_string(p.next_step) + (fs::exists(o.save_checkpoint) ? " saved" : ""));
    };
    base.finish = [&](Trainer&, const TrainProgress&) { calls.push_back("finish"); };
    train(c, recipe, nullptr, checkpoints.hooks(std::move(base)));
  }
  EXPECT_EQ(calls, (std::vector<std::string>{"after 1", "after 2 saved", "finish"}));
  TrainConfig longer = c;
  longer.steps = 3;
  TrainCheckpointOptions resume;
  resume.resume_from = o.save_checkpoint;
  TrainCheckpointer checkpoints(longer, recipe, resume);
  TrainHooks base;
  std::int64_t resumed_at = -1;
  base.resume = [&](Trainer&, TrainProgress& p) { resumed_at = p.next_step; };
  EXPECT_EQ(train(longer, recipe, nullptr, checkpoints.hooks(std::move(base))).start_step, 2);
  EXPECT_EQ(resumed_at, 2);  // the caller's resume saw the restored progress
}

// ---------------------------------------------------------------- refusals

// One checkpoint of a 1-step gpt run under fp8-delayed, shared by the refusal tests.
class TrainCheckpointRefusal : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("refusal_suite");
    const TrainConfig c = config();
    TrainCheckpointOptions o;
    o.save_checkpoint = good().string();
    o.export_fp8 = (*dir_ / "export.safetensors").string();
    train_with_checkpoints(c, recipe(), o);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path good() { return *dir_ / "good.safetensors"; }
  static fs::path path(const std::string& name) { return *dir_ / name; }
  static PrecisionRecipe recipe() { return *PrecisionRecipe::parse("fp8-delayed"); }
  static TrainConfig config() {
    TrainConfig c = run_of("gpt", 1);
    c.batch = 0;  // the default (16), which the refusals name
    return c;
  }

  // A copy of the good checkpoint with its tensors and metadata edited.
  static fs::path edited(
      const std::string& name,
      const std::function<void(std::vector<SafetensorsEntry>&, std::map<std::string, std::string>&)>& edit) {
    const SafetensorsFile f = SafetensorsFile::open(good());
    std::vector<SafetensorsEntry> entries;
    for (const SafetensorsTensor& t : f.tensors()) entries.push_back(safetensors_entry(t));
    std::map<std::string, std::string> metadata = f.metadata();
    edit(entries, metadata);
    const fs::path out = path(name);
    write_safetensors(out, entries, metadata);
    return out;
  }

  // Loading `file` into a fresh model fails with one line containing `needle`, and the model is untouched.
  static void expect_refused(const fs::path& file, const std::string& needle, TrainConfig c = config(),
                             PrecisionRecipe r = recipe()) {
    SCOPED_TRACE(needle);
    const auto model = make_model(c, r);
    const Tensor before = model->parameters().front()->value.clone();
    AdamW adamw;
    try {
      load_train_checkpoint(file, c, r, *model, adamw);
      ADD_FAILURE() << "loaded";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
    EXPECT_EQ(
        std::memcmp(before.raw(), model->parameters().front()->value.raw(), static_cast<std::size_t>(before.nbytes())),
        0);
    EXPECT_TRUE(adamw.state().empty());
  }

  // train() refuses to resume from `file` with one line containing `needle`, before any step.
  static void expect_train_refused(const fs::path& file, TrainConfig c, const PrecisionRecipe& r,
                                   const std::string& needle) {
    SCOPED_TRACE(needle);
    TrainCheckpointOptions o;
    o.resume_from = file.string();
    bool stepped = false;
    try {
      train_with_checkpoints(c, r, o, nullptr, [&](const StepLog&) { stepped = true; });
      ADD_FAILURE() << "trained";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(needle), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
    EXPECT_FALSE(stepped);
  }

  static TempDir* dir_;
};
TempDir* TrainCheckpointRefusal::dir_ = nullptr;

TEST_F(TrainCheckpointRefusal, TheGoodCheckpointLoads) {
  const auto model = make_model(config(), recipe());
  AdamW adamw;
  const TrainProgress p = load_train_checkpoint(good(), config(), recipe(), *model, adamw);
  EXPECT_EQ(p.next_step, 1);
  EXPECT_EQ(adamw.state().size(), model->parameters().size());
}

TEST_F(TrainCheckpointRefusal, FilesThatAreNotTrainingCheckpoints) {
  expect_refused(path("missing.safetensors"), "does not exist");
  expect_train_refused(path("missing.safetensors"), config(), recipe(), "does not exist");
  const Tensor x = zeros({2}, DType::float32);
  const std::vector<SafetensorsEntry> one = {safetensors_entry("x", x)};
  write_safetensors(path("plain.safetensors"), one);
  expect_refused(path("plain.safetensors"), "not an fp8kit training checkpoint");
  expect_refused(path("export.safetensors"), "is an FP8 inference export");
  std::ofstream(path("text.safetensors")) << "hello";
  expect_refused(path("text.safetensors"), "text.safetensors");
}

TEST_F(TrainCheckpointRefusal, MetadataVersionAndFields) {
  expect_refused(edited("v2.safetensors", [](auto&, auto& m) { m["fp8kit.train.version"] = "2"; }),
                 "is a version 2 training checkpoint");
  expect_refused(edited("nan_step.safetensors", [](auto&, auto& m) { m["fp8kit.train.next_step"] = "one"; }),
                 "not a number");
  expect_refused(edited("no_seed.safetensors", [](auto&, auto& m) { m.erase("fp8kit.train.seed"); }),
                 "has no 'fp8kit.train.seed'");
  expect_refused(edited("bad_recipe.safetensors", [](auto&, auto& m) { m["fp8kit.train.recipe"] = "fp7"; }),
                 "unknown recipe 'fp7'");
  expect_refused(edited("past_end.safetensors", [](auto&, auto& m) { m["fp8kit.train.next_step"] = "9"; }),
                 "cannot be");
  expect_refused(edited("bad_adamw.safetensors", [](auto&, auto& m) { m["fp8kit.train.adamw"] = "beta1=0.9"; }),
                 "has no valid beta2");
  // A checkpoint from before the optimizer's settings were recorded ran kTrainAdamW's: it still resumes.
  const fs::path legacy = edited("legacy.safetensors", [](auto&, auto& m) { m.erase("fp8kit.train.adamw"); });
  const TrainCheckpointInfo info = read_train_checkpoint_info(legacy);
  EXPECT_EQ(info.adamw.beta2, kTrainAdamW.beta2);
  EXPECT_EQ(info.adamw.weight_decay, kTrainAdamW.weight_decay);
  EXPECT_NO_THROW(check_resumable(legacy, info, config(), recipe()));
}

TEST_F(TrainCheckpointRefusal, ARunThatIsNotTheCheckpointsOne) {
  TrainConfig cnn = config();
  cnn.model = "cnn";
  expect_train_refused(good(), cnn, recipe(), "resume it with --model gpt");
  TrainConfig seed = config();
  seed.seed = 6;
  expect_train_refused(good(), seed, recipe(), "resume it with --seed 5");
  expect_train_refused(good(), config(), *PrecisionRecipe::parse("mxfp8"), "resume it with --recipe fp8-delayed");
  PrecisionRecipe history = recipe();
  history.amax_history_length = 32;
  expect_train_refused(good(), config(), history, "amax_history_length=16");
  PrecisionRecipe area = recipe();
  area.fp8_conv_max_kernel_area = 49;
  expect_train_refused(good(), config(), area, "--fp8-conv-max-kernel-area 32");
  TrainConfig lr = config();
  lr.adamw.lr = 1e-3;
  expect_train_refused(good(), lr, recipe(), "same learning rate");
  TrainConfig decay = config();
  decay.adamw.weight_decay = 0.01;
  expect_train_refused(good(), decay, recipe(), "same optimizer settings");
  TrainConfig beta2 = config();
  beta2.adamw.beta2 = 0.999;
  expect_train_refused(good(), beta2, recipe(), "beta2=0.95");
  TrainConfig batch = config();
  batch.batch = 8;
  expect_train_refused(good(), batch, recipe(), "resume it with --batch 16");
  TrainConfig default_batch = config();  // the default, named: the same run
  default_batch.batch = 16;
  EXPECT_NO_THROW(check_resumable(good(), read_train_checkpoint_info(good()), default_batch, recipe()));
  TrainConfig data = config();
  std::ofstream(path("data.txt")) << "some text to train on, long enough for a window or two of sixty-four bytes...";
  data.data_path = path("data.txt").string();
  expect_train_refused(good(), data, recipe(), "resume it without --data");
  TrainConfig steps = config();
  steps.steps = 0;
  expect_refused(good(), "resume it with --steps 1 or more", steps);
}

TEST_F(TrainCheckpointRefusal, DataIsComparedByContent) {
  const TempDir dir;
  std::string text;
  for (int i = 0; i < 64; ++i) text += "the cat sat on the mat; 17+25=42. ";
  std::ofstream(dir / "a.txt") << text;
  std::ofstream(dir / "moved.txt") << text;
  std::ofstream(dir / "other.txt") << text << "more";
  TrainConfig c = config();
  c.data_path = (dir / "a.txt").string();
  TrainCheckpointOptions save;
  save.save_checkpoint = (dir / "ck.safetensors").string();
  train_with_checkpoints(c, recipe(), save);
  TrainConfig moved = c;
  moved.steps = 2;
  TrainCheckpointOptions resume;
  resume.resume_from = save.save_checkpoint;
  moved.data_path = (dir / "moved.txt").string();
  EXPECT_EQ(train_with_checkpoints(moved, recipe(), resume).start_step, 1);  // the same text under another name
  TrainConfig other = moved;
  other.data_path = (dir / "other.txt").string();
  expect_train_refused(save.save_checkpoint, other, recipe(), "has other contents");
  TrainConfig generated = moved;
  generated.data_path.clear();
  expect_train_refused(save.save_checkpoint, generated, recipe(), "resume it with --data");
}

TEST_F(TrainCheckpointRefusal, TensorsMissingExtraMisshapenOrCorrupted) {
  const std::string wte = "transformer.wte.weight";
  auto drop = [](const std::string& name) {
    return [name](std::vector<SafetensorsEntry>& e, auto&) {
      std::erase_if(e, [&](const SafetensorsEntry& x) { return x.name == name; });
    };
  };
  expect_refused(edited("no_param.safetensors", drop(wte)), "has no tensor '" + wte + "' (a parameter)");
  expect_refused(edited("no_m.safetensors", drop("optim.exp_avg." + wte)), "has no tensor 'optim.exp_avg." + wte);
  expect_refused(edited("no_fp8.safetensors", drop("fp8.lm_head.weight")), "has no tensor 'fp8.lm_head.weight'");
  expect_refused(edited("no_losses.safetensors", drop("train.losses")), "has no tensor 'train.losses'");
  const Tensor small = zeros({3}, DType::float32);
  expect_refused(edited("extra.safetensors",
                        [&](auto& e, auto&) { e.push_back(safetensors_entry("transformer.extra.weight", small)); }),
                 "has tensor 'transformer.extra.weight'");
  const Tensor one = zeros(Shape{}, DType::int64);  // alive until written (an entry views its bytes)
  expect_refused(edited("stranger.safetensors",
                        [&](auto& e, auto&) { e.push_back(safetensors_entry("optim.step.stranger", one)); }),
                 "'stranger', which is not a parameter");
  expect_refused(edited("shape.safetensors",
                        [&](std::vector<SafetensorsEntry>& e, auto&) {
                          for (SafetensorsEntry& x : e) {
                            if (x.name == wte) x.shape = {x.shape[1], x.shape[0]};  // same bytes, transposed shape
                          }
                        }),
                 "the model needs F32 [256, 128]");
  std::vector<std::uint8_t> blob;
  expect_refused(edited("corrupt.safetensors",
                        [&](std::vector<SafetensorsEntry>& e, auto&) {
                          for (SafetensorsEntry& x : e) {
                            if (x.name != "fp8.lm_head.input") continue;
                            const auto* b = reinterpret_cast<const std::uint8_t*>(x.bytes.data());
                            blob.assign(b, b + x.bytes.size());
                            blob[0] ^= 0xFF;  // the magic
                            x.bytes = std::as_bytes(std::span<const std::uint8_t>(blob));
                          }
                        }),
                 "'fp8.lm_head.input' is corrupted");
  expect_refused(edited("truncated.safetensors",
                        [&](std::vector<SafetensorsEntry>& e, auto&) {
                          for (SafetensorsEntry& x : e) {
                            if (x.name != "fp8.lm_head.weight") continue;
                            x.bytes = x.bytes.first(x.bytes.size() - 4);
                            x.shape = {static_cast<std::int64_t>(x.bytes.size())};
                          }
                        }),
                 "'fp8.lm_head.weight' is corrupted");
}

// ---------------------------------------------------------------- the FP8 export

TEST(Fp8Export, OptionsFollowTheRecipeAndTheLayout) {
  const auto r = [](const char* n) { return *PrecisionRecipe::parse(n); };
  EXPECT_EQ(resolve_fp8_export(r("fp8-block"), {}, {}).scheme, QuantScheme::kFp8Block);
  EXPECT_EQ(resolve_fp8_export(r("mxfp8"), {}, {}).scheme, QuantScheme::kMxfp8);
  EXPECT_EQ(resolve_fp8_export(r("fp8-delayed"), {}, {}).scheme, QuantScheme::kFp8Tensor);
  // The layout defaults are `fp8kit quantize`'s (default_layout: the one serving stacks read for the scheme).
  for (const char* n : {"fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block", "mxfp8"}) {
    const Fp8ExportOptions o = resolve_fp8_export(r(n), {}, {});
    EXPECT_EQ(o.layout, default_layout(o.scheme)) << n;
  }
  EXPECT_EQ(resolve_fp8_export(r("fp32"), {}, {}).layout, CheckpointLayout::kCompressedTensors);
  EXPECT_EQ(resolve_fp8_export(r("fp8-block"), {}, {}).layout, CheckpointLayout::kDeepSeek);
  EXPECT_EQ(resolve_fp8_export(r("mxfp8"), {}, {}).layout, CheckpointLayout::kMxfp8);
  EXPECT_EQ(resolve_fp8_export(r("fp8-delayed"), QuantScheme::kFp8Channel, {}).layout,
            CheckpointLayout::kCompressedTensors);
  EXPECT_EQ(resolve_fp8_export(r("fp32"), {}, CheckpointLayout::kNative).scheme, QuantScheme::kFp8Tensor);
  EXPECT_EQ(resolve_fp8_export(r("fp32"), {}, CheckpointLayout::kDeepSeek).scheme, QuantScheme::kFp8Block);
  EXPECT_EQ(resolve_fp8_export(r("fp32"), {}, CheckpointLayout::kFbgemm).scheme, QuantScheme::kFp8Channel);
  EXPECT_EQ(resolve_fp8_export(r("fp8-block"), {}, CheckpointLayout::kCompressedTensors).scheme,
            QuantScheme::kFp8Block);
  EXPECT_THROW(resolve_fp8_export(r("fp32"), QuantScheme::kFp8Tensor, CheckpointLayout::kDeepSeek), Error);
}

TEST(Fp8Export, NativeFileRecordsDtypeOverflowAndRecipe) {
  const TempDir dir;
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-delayed");
  TrainConfig c = run_of("gpt", 2);
  TrainCheckpointOptions o;
  o.export_fp8 = (dir / "model.safetensors").string();
  o.export_layout = CheckpointLayout::kNative;
  o.save_checkpoint = (dir / "ck.safetensors").string();
  train_with_checkpoints(c, recipe, o);
  const SafetensorsFile f = SafetensorsFile::open(o.export_fp8);
  const auto& m = f.metadata();
  EXPECT_EQ(m.at("fp8kit.export.original_dtype"), "float32");
  EXPECT_EQ(m.at("fp8kit.export.overflow"), "saturate");
  EXPECT_EQ(m.at("fp8kit.export.recipe"), "fp8-delayed");
  EXPECT_EQ(m.at("fp8kit.export.model"), "gpt");
  EXPECT_EQ(m.at("fp8kit.export.steps"), "2");
  EXPECT_EQ(detect_layout(f).layout, CheckpointLayout::kNative);
  const SafetensorsFile ck = SafetensorsFile::open(o.save_checkpoint);
  int quantized = 0;
  for (const SafetensorsTensor& t : f.tensors()) {
    if (t.name.ends_with(".scale_inv")) continue;
    if (t.dtype == SafetensorsDType::F32) {  // kept: the same bytes as the final master weight
      EXPECT_TRUE(std::equal(t.bytes.begin(), t.bytes.end(), ck.at(t.name).bytes.begin())) << t.name;
      continue;
    }
    ++quantized;
    EXPECT_EQ(t.dtype, SafetensorsDType::F8_E4M3) << t.name;
    EXPECT_NE(m.at("fp8kit.export.tensor." + t.name).find("dtype=float32;overflow=saturate"), std::string::npos);
    EXPECT_NE(m.at("fp8kit.quant." + t.name).find("dtype=float32;overflow=saturate"), std::string::npos);
    const Tensor w =
        dequantize_checkpoint_tensor(CheckpointLayout::kNative, t, f.at(t.name + ".scale_inv"), DType::float32, {}, m);
    const Tensor master = to_tensor(ck.at(t.name));
    double err = 0, norm = 0;
    for (std::int64_t i = 0; i < w.numel(); ++i) {
      const double d = w.data<float>()[i] - master.data<float>()[i];
      err += d * d;
      norm += double{master.data<float>()[i]} * master.data<float>()[i];
    }
    EXPECT_LT(std::sqrt(err / norm), 0.05) << t.name;  // e4m3's 3 mantissa bits
  }
  EXPECT_EQ(quantized, 8);  // 2 blocks x (c_attn, attn.c_proj, c_fc, mlp.c_proj)
  EXPECT_EQ(f.at("lm_head.weight").dtype, SafetensorsDType::F32);
  EXPECT_EQ(f.at("transformer.wte.weight").dtype, SafetensorsDType::F32);
}

TEST(Fp8Export, DirectoryWithConfigInAServingLayout) {
  const TempDir dir;
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-block");
  const TrainConfig c = run_of("gpt", 2);
  const auto model = make_model(c, recipe);
  const Fp8ExportSummary s = export_fp8_checkpoint(dir / "out", *model, c, recipe, 0,
                                                   resolve_fp8_export(recipe, {}, CheckpointLayout::kDeepSeek));
  EXPECT_EQ(s.quantized.size(), 8u);
  EXPECT_EQ(s.file, dir / "out" / "model.safetensors");
  std::ifstream in(dir / "out" / "config.json");
  const std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const ShardedCheckpoint ck = ShardedCheckpoint::open(dir / "out");
  EXPECT_EQ(detect_layout(ck, config).layout, CheckpointLayout::kDeepSeek);
  EXPECT_EQ(quantized_weights(ck, CheckpointLayout::kDeepSeek).size(), 8u);
  EXPECT_NE(config.find("\"lm_head\""), std::string::npos);  // left out, listed as ignored
}

// A directory export is written together: with config.json's name taken by a folder, nothing is renamed into place
// (the earlier model.safetensors stays, byte for byte, and no temporary file is left); an earlier sharded checkpoint
// there (whose index loaders read before model.safetensors) is removed by the commit.
TEST(Fp8Export, DirectoryIsWrittenAllOrNothing) {
  const TempDir dir;
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-delayed");
  const TrainConfig c = run_of("gpt", 2);
  const auto model = make_model(c, recipe);
  const Fp8ExportOptions options = resolve_fp8_export(recipe, {}, {});
  const fs::path out = dir / "out";
  fs::create_directories(out / "config.json");
  { std::ofstream(out / "model.safetensors") << "the earlier export"; }
  EXPECT_THROW(export_fp8_checkpoint(out, *model, c, recipe, 0, options), Error);
  std::ifstream earlier(out / "model.safetensors");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(earlier)), std::istreambuf_iterator<char>()),
            "the earlier export");
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(out)) files += e.path().filename().string()[0] == '.' ? 100 : 1;
  EXPECT_EQ(files, 2u);  // model.safetensors and the config.json folder, no temporary file
  // A new directory in place of a sharded checkpoint: its shards and index go.
  const fs::path sharded = dir / "sharded";
  fs::create_directories(sharded);
  for (const char* name : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    write_safetensors(sharded / name, std::vector<SafetensorsEntry>{}, {});
  }
  {
    std::ofstream(sharded / "model.safetensors.index.json")
        << R"({"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", )"
        << R"("b": "model-00002-of-00002.safetensors"}})";
  }
  export_fp8_checkpoint(sharded, *model, c, recipe, 0, options);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(sharded)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors"}));
}

// Static activation scales: one `input_scale` per quantized weight, the dequantization scale the layer's delayed
// scaling holds for its input after training; the compressed-tensors config then says static per-tensor
// activations. Refused without delayed scaling and for layouts whose activations are dynamic.
TEST(Fp8Export, StaticInputScalesComeFromTheDelayedScalingState) {
  const TempDir dir;
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("fp8-delayed");
  const TrainConfig c = run_of("gpt", 2);
  const auto model = make_model(c, recipe);  // trained by hand below, to read its states afterwards
  const auto data = make_dataset(c);
  Context ctx;
  ctx.saved_dtype = recipe.saved_dtype();
  ctx.recipe = &recipe;
  StepReport report;
  ctx.report = &report;
  for (std::int64_t step = 0; step < 2; ++step) {
    model->forward(ctx, data->batch(step));
    model->backward(ctx);
    for (Fp8LayerState* st : model->fp8_states()) st->update();
  }
  const Fp8ExportOptions options = resolve_fp8_export(recipe, {}, CheckpointLayout::kCompressedTensors, true);
  export_fp8_checkpoint(dir / "ct", *model, c, recipe, 2, options);
  const ShardedCheckpoint ck = ShardedCheckpoint::open(dir / "ct");
  const std::vector<QuantizedWeight> weights = quantized_weights(ck, CheckpointLayout::kCompressedTensors);
  ASSERT_EQ(weights.size(), 8u);
  std::map<std::string, float> expected;  // the delayed-scaling rule, from the history: 1 / (448 / window max)
  for (const Fp8LayerState* st : model->fp8_states()) {
    const auto h = st->input.history();
    expected[st->layer + ".weight"] = 1.0f / (448.0f / *std::max_element(h.begin(), h.end()));
  }
  for (const QuantizedWeight& w : weights) {
    ASSERT_TRUE(w.input_scale.has_value()) << w.weight;
    const SafetensorsTensor& t = ck.at(*w.input_scale);
    EXPECT_EQ(t.dtype, SafetensorsDType::F32);
    EXPECT_EQ(t.shape, Shape{1});
    const float v = to_tensor(t).data<float>()[0];
    EXPECT_NEAR(v, expected.at(w.weight), 1e-6 * expected.at(w.weight)) << w.weight;
    EXPECT_GT(v, 0.0f);
    EXPECT_NE(v, 1.0f) << w.weight << ": still the initial scale";
  }
  std::ifstream in(dir / "ct" / "config.json");
  const std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(config.find("\"dynamic\": false"), std::string::npos);
  EXPECT_THROW(
      resolve_fp8_export(*PrecisionRecipe::parse("fp8-current"), {}, CheckpointLayout::kCompressedTensors, true),
      Error);
  EXPECT_THROW(resolve_fp8_export(recipe, {}, CheckpointLayout::kDeepSeek, true), Error);
  EXPECT_NO_THROW(resolve_fp8_export(recipe, {}, CheckpointLayout::kAutoFp8, true));
}

TEST(Fp8Export, CnnQuantizesItsLinearHeadAndKeepsConvolutions) {
  const TempDir dir;
  const PrecisionRecipe recipe = *PrecisionRecipe::parse("mxfp8");
  const TrainConfig c = run_of("cnn", 1);
  const auto model = make_model(c, recipe);
  const Fp8ExportSummary s = export_fp8_checkpoint(dir / "cnn.safetensors", *model, c, recipe, 0,
                                                   resolve_fp8_export(recipe, {}, CheckpointLayout::kNative));
  EXPECT_EQ(s.quantized, std::vector<std::string>{"head.weight"});
  const SafetensorsFile f = SafetensorsFile::open(dir / "cnn.safetensors");
  EXPECT_EQ(f.at("stem.weight").dtype, SafetensorsDType::F32);
  EXPECT_EQ(f.at("head.weight.scale_inv").dtype, SafetensorsDType::F8_E8M0);
  EXPECT_EQ(f.metadata().at("fp8kit.export.scheme"), "mxfp8");
}

}  // namespace
}  // namespace fp8kit::nn
