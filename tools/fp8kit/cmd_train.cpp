// `fp8kit train`: trains the small GPT or CNN under one recipe or compares several, and prints the article's table
// (peak memory, median step time, final loss, each against fp32); optional trace, scale log, loss plot, JSON;
// training checkpoints (save, resume) and the FP8 inference export of one recipe's run.
#include <fmt/core.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "cli_common.hpp"
#include "fp8kit/common/cpu.hpp"
#include "fp8kit/common/error.hpp"
#include "fp8kit/dist/data_parallel.hpp"
#include "fp8kit/dist/fsdp.hpp"
#include "fp8kit/io/atomic_file.hpp"
#include "fp8kit/io/checkpoint_layout.hpp"
#include "fp8kit/io/fp8_export.hpp"
#include "fp8kit/io/sharded_checkpoint.hpp"
#include "fp8kit/io/train_checkpoint.hpp"
#include "fp8kit/nn/train.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit::cli {
namespace {

// Every rank's count, in rank order (exact: no float all-reduce).
std::vector<std::int64_t> every_rank(Communicator& comm, std::int64_t mine) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(comm.size()));
  const std::vector<std::size_t> counts(all.size(), sizeof mine);
  comm.all_gather(std::as_bytes(std::span<const std::int64_t>(&mine, 1)), std::as_writable_bytes(std::span(all)),
                  counts);
  return all;
}
// The largest (a peak memory: per rank, the worst) and the sum.
std::int64_t max_over_ranks(Communicator& comm, std::int64_t mine) {
  const std::vector<std::int64_t> all = every_rank(comm, mine);
  return *std::max_element(all.begin(), all.end());
}
std::int64_t sum_over_ranks(Communicator& comm, std::int64_t mine) {
  const std::vector<std::int64_t> all = every_rank(comm, mine);
  return std::accumulate(all.begin(), all.end(), std::int64_t{0});
}

struct TrainArgs {
  std::string model = "gpt";
  std::string recipe;
  std::string compare;
  std::int64_t steps = 400;
  std::int64_t eval_batches = nn::TrainConfig{}.eval_batches;
  std::int64_t fp32_spread = 0;  // fp32 trained again this many times, each initial weight one ulp away
  std::int64_t starts = 1;       // --starts: every recipe trained from this many initial states per seed
  std::uint64_t seed = 1;
  std::string seeds;       // --seeds: a list of seeds, each trained under every recipe (empty: --seed alone)
  std::int64_t batch = 0;  // 0: the model's default
  int threads = 0;
  bool json = false;
  std::string plot, profile, log_scales, data;
  std::string on_nonfinite = "skip";
  int conv_max_area = 32;
  std::int64_t inject_nan = -1;
  std::string save_checkpoint, resume, export_fp8, export_scheme, export_layout;
  bool export_input_scales = false;
  std::int64_t checkpoint_every = 0;
  bool force = false;
  std::string parallel = "none", grad_reduce;   // grad_reduce empty: fp32 (and not given)
  std::string optimizer_state, master_weights;  // empty: each recipe's own
  std::string inject_rank_failure;              // hidden: "RANK:STEP" or "RANK:STEP:kill" (the fault tests)
  // Which options were given: a resumed run takes the others from its checkpoint.
  bool model_given = false, seed_given = false, seeds_given = false, batch_given = false, steps_given = false,
       data_given = false, conv_area_given = false, inject_nan_given = false, threads_given = false,
       eval_batches_given = false, on_nonfinite_given = false;
};

// Refuses, on every rank alike, a job whose ranks were given different settings (a launcher script that passes
// another seed or recipe to one rank trains nonsense that looks fine): each setting that shapes the run or its
// files, of every rank, all-gathered and compared with rank 0's; the first that differs is named with both values.
// (What only rank 0 writes — --json, --plot, --profile, --log-scales — and --threads may differ.)
using Setting = std::pair<const char*, std::string>;

// Each of `settings` of every rank, all-gathered and compared with rank 0's: the first that differs is refused on
// every rank alike, naming both values ("rank 1 <given> <name> '...', rank 0 '...': <fix>").
void check_same_values(Communicator& comm, std::span<const Setting> settings, const char* given, const char* fix) {
  std::string mine;  // every value with its length, so that no two lists read alike
  for (const auto& [option, value] : settings) mine += std::to_string(value.size()) + ":" + value;
  const std::vector<std::int64_t> lengths = every_rank(comm, static_cast<std::int64_t>(mine.size()));
  std::vector<std::size_t> counts(lengths.begin(), lengths.end());
  std::string all(static_cast<std::size_t>(std::accumulate(lengths.begin(), lengths.end(), std::int64_t{0})), '\0');
  comm.all_gather(std::as_bytes(std::span<const char>(mine.data(), mine.size())),
                  std::as_writable_bytes(std::span<char>(all.data(), all.size())), counts);
  // Every rank's values, parsed back.
  std::vector<std::vector<std::string>> values(counts.size());
  std::size_t at = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    const std::size_t end = at + counts[r];
    while (at < end) {
      const std::size_t colon = all.find(':', at);
      const std::size_t n = std::stoul(all.substr(at, colon - at));
      values[r].push_back(all.substr(colon + 1, n));
      at = colon + 1 + n;
    }
  }
  for (std::size_t r = 1; r < values.size(); ++r) {
    for (std::size_t i = 0; i < settings.size(); ++i) {
      if (values[r][i] == values[0][i]) continue;
      const auto shown = [](const std::string& v) { return v.empty() ? std::string("(not given)") : "'" + v + "'"; };
      throw UsageError("rank " + std::to_string(r) + " " + given + " " + settings[i].first + " " + shown(values[r][i]) +
                       ", rank 0 " + shown(values[0][i]) + ": " + fix);
    }
  }
}

void check_same_settings(Communicator& comm, const TrainArgs& a, const char* given = "was given") {
  const Setting settings[] = {{"--model", a.model},
                              {"--recipe", a.recipe},
                              {"--compare", a.compare},
                              {"--steps", std::to_string(a.steps)},
                              {"--eval-batches", std::to_string(a.eval_batches)},
                              {"--fp32-spread", std::to_string(a.fp32_spread)},
                              {"--starts", std::to_string(a.starts)},
                              {"--seed", std::to_string(a.seed)},
                              {"--seeds", a.seeds},
                              {"--batch", std::to_string(a.batch)},
                              {"--data", a.data},
                              {"--on-nonfinite", a.on_nonfinite},
                              {"--fp8-conv-max-kernel-area", std::to_string(a.conv_max_area)},
                              {"--inject-nan", std::to_string(a.inject_nan)},
                              {"--parallel", a.parallel},
                              {"--grad-reduce", a.grad_reduce},
                              {"--optimizer-state", a.optimizer_state},
                              {"--master-weights", a.master_weights},
                              {"--inject-rank-failure", a.inject_rank_failure},
                              {"--resume", a.resume},
                              {"--save-checkpoint", a.save_checkpoint},
                              {"--checkpoint-every", std::to_string(a.checkpoint_every)},
                              {"--export-fp8", a.export_fp8},
                              {"--export-scheme", a.export_scheme},
                              {"--export-layout", a.export_layout}};
  check_same_values(comm, settings, given,
                    "every rank of a job trains the same run (launch them all with the same options)");
}

// A rank that cannot go on in the middle of a run over ranks: one line naming it and the step, then the whole job
// ends (the others may be waiting for it inside a collective).
[[noreturn]] void end_job(Communicator& comm, const std::string& recipe, std::int64_t step, const std::string& what) {
  std::fprintf(stderr, "fp8kit train: rank %d of %d failed at step %lld of %s: %s (ending the job)\n", comm.rank(),
               comm.size(), static_cast<long long>(step), recipe.c_str(), what.c_str());
  std::fflush(stderr);
  comm.abort(1);
  std::_Exit(1);  // abort() does not return (a virtual call: the compiler cannot see it)
}

// --inject-rank-failure RANK:STEP[:kill]: the rank and step at which a rank throws (or kills itself).
struct RankFailure {
  int rank = -1;
  std::int64_t step = -1;
  bool kill = false;
};
RankFailure parse_rank_failure(const std::string& text) {
  RankFailure f;
  if (text.empty()) return f;
  const std::size_t a = text.find(':');
  const std::size_t b = a == std::string::npos ? a : text.find(':', a + 1);
  try {
    if (a == std::string::npos) throw std::invalid_argument(text);
    std::size_t used = 0;
    f.rank = std::stoi(text.substr(0, a), &used);
    if (used != a) throw std::invalid_argument(text);
    const std::string step = text.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
    f.step = std::stoll(step, &used);
    if (used != step.size()) throw std::invalid_argument(text);
    if (b != std::string::npos) {
      if (text.substr(b + 1) != "kill") throw std::invalid_argument(text);
      f.kill = true;
    }
  } catch (const std::logic_error&) {
    throw UsageError("--inject-rank-failure: '" + text + "' (use RANK:STEP or RANK:STEP:kill)");
  }
  if (f.rank < 0 || f.step < 0) throw UsageError("--inject-rank-failure: '" + text + "' (rank and step are >= 0)");
  return f;
}

// The most seeds --seeds lists, and the most extra fp32 runs --fp32-spread asks for (each a whole training run).
constexpr std::size_t kMaxSeeds = 1000;

// --seeds LIST: seeds and inclusive ranges, comma-separated ("1-10", "1,2,5", "1-3,7"), each seed once.
std::vector<std::uint64_t> parse_seeds(const std::string& text) {
  const auto number = [&](const std::string& item) { return parse_integer_option<std::uint64_t>("--seeds", item); };
  std::vector<std::uint64_t> seeds;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const std::size_t dash = item.find('-', 1);
    const std::uint64_t first = number(item.substr(0, dash));
    const std::uint64_t last = dash == std::string::npos ? first : number(item.substr(dash + 1));
    if (last < first)
      throw UsageError("--seeds: the range '" + item + "' runs backwards; write it " + std::to_string(last) + "-" +
                       std::to_string(first));
    if (last - first >= kMaxSeeds || seeds.size() + (last - first + 1) > kMaxSeeds) {
      throw UsageError("--seeds: '" + text + "' lists more than " + std::to_string(kMaxSeeds) + " seeds");
    }
    for (std::uint64_t s = first;; ++s) {
      if (std::find(seeds.begin(), seeds.end(), s) != seeds.end()) {
        throw UsageError("--seeds: seed " + std::to_string(s) + " is listed twice in '" + text + "'");
      }
      seeds.push_back(s);
      if (s == last) break;
    }
  }
  if (seeds.empty() || text.back() == ',')
    throw UsageError("--seeds: '" + text + "' (use seeds and ranges: 1-10 or 1,2,5)");
  return seeds;
}

namespace fs = std::filesystem;

constexpr const char* kDefaultCompare = "fp32,bf16,fp8-delayed,fp8-o2";

// The storage options given on the command line, over a recipe's own.
void apply_storage_options(const TrainArgs& a, nn::PrecisionRecipe& recipe) {
  if (!a.optimizer_state.empty()) {
    const auto s = nn::parse_moment_storage(a.optimizer_state);
    if (!s) throw UsageError("unknown --optimizer-state '" + a.optimizer_state + "' (use fp32, bf16, fp8)");
    recipe.optimizer_state = *s;
  }
  if (!a.master_weights.empty()) {
    const auto m = nn::parse_master_weights(a.master_weights);
    if (!m) throw UsageError("unknown --master-weights '" + a.master_weights + "' (use fp32, bf16-sr, bf16-kahan)");
    recipe.master_weights = *m;
  }
}

std::vector<nn::PrecisionRecipe> parse_recipes(const TrainArgs& a) {
  if (!a.recipe.empty() && !a.compare.empty()) throw UsageError("give --recipe or --compare, not both");
  const std::string list = !a.recipe.empty() ? a.recipe : !a.compare.empty() ? a.compare : kDefaultCompare;
  std::vector<nn::PrecisionRecipe> out;
  const char* option = !a.recipe.empty() ? "--recipe" : "--compare";
  for (std::size_t begin = 0;;) {
    const std::size_t comma = list.find(',', begin);
    const std::string item = list.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    // getline let a trailing comma pass ("fp32," was fp32) where a leading one was an unknown recipe ''
    if (item.empty()) throw UsageError(std::string(option) + ": '" + list + "' has an empty item; remove the comma");
    const auto r = nn::PrecisionRecipe::parse(item);
    if (!r) {
      throw UsageError("unknown recipe '" + item +
                       "' (use fp32, bf16, fp8-delayed, fp8-current, fp8-block, mxfp8, fp8-o2, fp8-delayed-e4m3; "
                       "FP8 ones with -fake for fake quantization)");
    }
    nn::PrecisionRecipe recipe = *r;
    recipe.fp8_conv_max_kernel_area = a.conv_max_area;
    apply_storage_options(a, recipe);
    // A recipe twice trained it twice, the first row's ratios then against the second run (step time 1.17x "vs fp32").
    if (std::any_of(out.begin(), out.end(), [&](const auto& o) { return o.name() == recipe.name(); })) {
      throw UsageError(std::string(option) + ": " + recipe.name() + " is listed twice; give each recipe once");
    }
    out.push_back(recipe);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  if (out.empty()) throw UsageError("no recipe given");
  if (!a.recipe.empty() && out.size() != 1) throw UsageError("--recipe takes one recipe; use --compare for several");
  return out;
}

// "12.3 MB"
std::string megabytes(std::int64_t bytes) {
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

// "fp8-delayed  [#########.....] 120/400 loss 1.2345" on the progress line.
class TrainProgress {
 public:
  TrainProgress(std::string recipe, std::int64_t steps) : recipe_(std::move(recipe)), steps_(steps) {}
  void operator()(const nn::StepLog& s) const {
    if (!line_.on()) return;
    const int width = 30;
    const int filled = static_cast<int>(width * (s.step + 1) / steps_);
    line_.show(fmt::format("{:<12} [{}{}] {}/{} loss {:.4f}", recipe_, std::string(filled, '#'),
                           std::string(width - filled, '.'), s.step + 1, steps_, s.loss));
  }

 private:
  std::string recipe_;
  std::int64_t steps_;
  ProgressLine line_;
};

// The beginnings of the reports train writes, by which a later run knows a file it may replace without --force (a
// file of the same name that is anything else is the user's, and kept).
constexpr std::string_view kPlotSignature = "<!-- fp8kit train --plot -->";
constexpr std::string_view kScaleLogStart = "{\"amax\":";  // JSON lines, keys sorted: amax, layer, ...

// Whether `path` (an existing regular file) is empty or a report of `option` that train wrote.
bool replaceable_report(const std::string& option, const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string head(1024, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<std::size_t>(in.gcount()));
  if (head.empty()) return true;
  if (option == "--plot") return head.starts_with("<svg ") && head.find(kPlotSignature) != std::string::npos;
  if (option == "--profile") return head.starts_with(Profiler::kChromeTraceStart);
  return head.starts_with(kScaleLogStart) && head.find("\"layer\":") != std::string::npos;
}

// Loss curves as an SVG polyline per recipe (log-free, steps on x, loss on y).
void write_plot(const std::string& path, const std::vector<nn::TrainResult>& results) {
  std::ostringstream out;
  const double w = 720, h = 420, left = 60, right = 150, top = 20, bottom = 40;
  float lo = INFINITY, hi = -INFINITY;
  std::size_t steps = 1;
  for (const auto& r : results) {
    steps = std::max(steps, r.losses.size());
    for (float l : r.losses)
      if (std::isfinite(l)) lo = std::min(lo, l), hi = std::max(hi, l);
  }
  if (!(hi > lo)) hi = lo + 1;
  // Ten colours, then the same dashed: the seven recipes and their -fake twins all differ (fp8-o2 was fp32's blue).
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
  constexpr std::size_t kColorCount = std::size(kColors);
  out << fmt::format("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\">\n", w, h);
  out << kPlotSignature << "\n";  // what a later run looks for before it replaces the file
  out << fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", w, h);
  out << fmt::format("<text x=\"{}\" y=\"14\" font-size=\"12\">training loss</text>\n", left);
  const double pw = w - left - right, ph = h - top - bottom;
  out << fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n", left, top,
                     pw, ph);
  for (int t = 0; t <= 4; ++t) {
    const double v = lo + (hi - lo) * t / 4.0, y = top + ph - ph * t / 4.0;
    out << fmt::format("<text x=\"5\" y=\"{:.1f}\" font-size=\"11\">{:.3f}</text>\n", y + 4, v);
  }
  out << fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"11\">step 0 .. {}</text>\n", left, h - 12, steps - 1);
  for (std::size_t i = 0; i < results.size(); ++i) {
    const char* color = kColors[i % kColorCount];
    out << "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" << color << "\""
        << (i >= kColorCount ? " stroke-dasharray=\"6 3\"" : "") << " points=\"";
    for (std::size_t s = 0; s < results[i].losses.size(); ++s) {
      const float l = results[i].losses[s];
      if (!std::isfinite(l)) continue;
      const double x = left + pw * static_cast<double>(s) / static_cast<double>(std::max<std::size_t>(1, steps - 1));
      const double y = top + ph - ph * (l - lo) / (hi - lo);
      out << fmt::format("{:.1f},{:.1f} ", x, y);
    }
    out << "\"/>\n";
    out << fmt::format("<text x=\"{}\" y=\"{}\" font-size=\"12\" fill=\"{}\">{}</text>\n", w - right + 10,
                       top + 16 + 18 * static_cast<double>(i), color, results[i].recipe);
  }
  out << "</svg>\n";
  write_text_file(path, out.str());
}

// --log-scales: JSON lines written to a temporary file as the run goes and renamed over the path at the end, or
// when a step aborts the run or an error ends it (the log up to there): an earlier file of that name stays as it
// was until then.
class ScaleLog {
 public:
  explicit ScaleLog(const std::string& path) : path_(path) {
    if (const std::optional<fs::path> target = atomic_target(path)) {
      file_.emplace(*target);
    } else {
      stream_.open(path, std::ios::binary | std::ios::app);  // a device or a pipe: written as it goes
      if (!stream_) FP8KIT_THROW(ErrorKind::kIo, "--log-scales: cannot write '", path, "': ", std::strerror(errno));
    }
  }
  void line(const std::string& text) {
    written_ = true;
    buffer_ += text;
    buffer_ += '\n';
    if (buffer_.size() >= (std::size_t{1} << 20)) flush();
  }
  void commit() {
    flush();
    if (file_) file_->commit();
    stream_.flush();
    // A device or pipe that took nothing (/dev/full) is a failure, as a file's is.
    if (!file_ && !stream_)
      FP8KIT_THROW(ErrorKind::kIo, "--log-scales: cannot write '", path_, "': ", std::strerror(errno));
  }

 private:
  void flush() {
    if (file_) {
      file_->write(std::as_bytes(std::span<const char>(buffer_.data(), buffer_.size())));
    } else {
      stream_.write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
    }
    buffer_.clear();
  }
  std::string path_;
  std::optional<AtomicFile> file_;
  std::ofstream stream_;
  std::string buffer_;
  bool written_ = false;

 public:
  bool written() const { return written_; }  // any line yet (a step logged)
};

// The absolute, normal form of a path that may not exist yet (symbolic links resolved as far as it exists). Made
// absolute first: weakly_canonical left "q.safetensors" relative and made "./q.safetensors" absolute, so the two
// spellings of one file compared different.
fs::path resolved(const std::string& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  const fs::path canonical = fs::weakly_canonical(ec ? fs::path(path) : absolute, ec);
  return ec ? absolute.lexically_normal() : canonical;
}

// Whether two paths name the same file (or would, once written).
bool same_path(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec);
  return resolved(a) == resolved(b);
}

// The files an --export-fp8 directory gets (export_fp8_checkpoint): no other output may be one of them.
constexpr const char* kExportFiles[] = {"model.safetensors", "config.json"};

// An output of `option` that train will write at the end: checked before any work, so that a long run never ends
// in "cannot write". A .safetensors file (or, where `directory_ok`, any other path is a directory).
void check_train_output(const std::string& option, const std::string& path, bool force, bool directory_ok) {
  std::error_code ec;
  const fs::path p(path);
  const bool file = p.extension() == ".safetensors";
  if (!file && !directory_ok) throw UsageError(option + ": '" + path + "' must end in .safetensors");
  check_output_folder(p, option + ": ");  // (the export directory is created there)
  if (file) {
    if (fs::is_directory(p, ec)) throw UsageError(option + ": '" + path + "' is a directory; give a file name");
    if (fs::exists(p, ec) && !force) throw UsageError(option + ": '" + path + "' exists; pass --force to replace it");
  } else {
    if (fs::exists(p, ec) && !fs::is_directory(p, ec)) {
      throw UsageError(option + ": '" + path + "' is a file; give a directory or a .safetensors file name");
    }
    if (fs::is_directory(p, ec) && !fs::is_empty(p, ec) && !force) {
      throw UsageError(option + ": '" + path + "' exists and is not empty; pass --force to write into it");
    }
  }
}

// The checkpoint options: one run only, pairs that go together, outputs that may be written, and (resuming) the
// options left out taken from the checkpoint. Returns the checkpoint's description when resuming.
std::optional<TrainCheckpointInfo> prepare_checkpoints(TrainArgs& a) {
  const bool any = !a.save_checkpoint.empty() || !a.resume.empty() || !a.export_fp8.empty();
  if (a.checkpoint_every < 0) {
    throw UsageError("--checkpoint-every must be at least 1 (or 0, the default: only at the end), got " +
                     std::to_string(a.checkpoint_every));
  }
  if (a.checkpoint_every > 0 && a.save_checkpoint.empty()) {
    throw UsageError("--checkpoint-every needs --save-checkpoint FILE (where to write)");
  }
  if ((!a.export_scheme.empty() || !a.export_layout.empty() || a.export_input_scales) && a.export_fp8.empty()) {
    throw UsageError(
        "--export-scheme, --export-layout and --export-input-scales need --export-fp8 PATH (where to write)");
  }
  if (a.force && !any && a.plot.empty() && a.profile.empty() && a.log_scales.empty()) {
    throw UsageError(
        "--force replaces the outputs of --save-checkpoint, --export-fp8, --plot, --profile and --log-scales; give "
        "one");
  }
  if (!any) return std::nullopt;
  if (!a.compare.empty()) {
    throw UsageError("--save-checkpoint, --resume and --export-fp8 take one run: give --recipe R, not --compare");
  }
  std::optional<TrainCheckpointInfo> info;
  if (!a.resume.empty()) {
    std::error_code ec;
    if (!fs::exists(a.resume, ec)) throw PathError("--resume: '" + a.resume + "' does not exist", true);
    try {
      info = read_train_checkpoint_info(a.resume);
    } catch (const Error& e) {  // (its messages name the file; this names the option too)
      throw Error(e.kind(), "--resume: " + std::string(e.what()), __FILE__, __LINE__);
    }
    // Before the recorded settings fill in what the user left out: a message about them would name options the
    // user never gave (a gpt checkpoint's --data under --model cnn, a damaged model name as "--model").
    if (info->model != "gpt" && info->model != "cnn") {
      throw UsageError("--resume: '" + a.resume + "' records the model '" + info->model +
                       "', which no fp8kit run trains (models: gpt, cnn): the file is damaged");
    }
    if (a.model_given && a.model != info->model) {
      throw UsageError("--resume: '" + a.resume + "' is a checkpoint of the " + info->model + " model, not the " +
                       a.model + ": resume it with --model " + info->model);
    }
    if (!a.model_given) a.model = info->model;
    if (!a.seed_given) a.seed = info->seed;
    if (!a.batch_given) a.batch = info->batch;
    if (!a.steps_given) a.steps = info->steps;
    if (!a.data_given) a.data = info->data_path;
    if (!a.conv_area_given) a.conv_max_area = info->recipe.fp8_conv_max_kernel_area;
    // Not part of the training state, but of what the uninterrupted run would have reported or done.
    if (!a.eval_batches_given) a.eval_batches = info->eval_batches;
    if (!a.on_nonfinite_given) a.on_nonfinite = info->on_nonfinite == nn::OnNonfinite::kAbort ? "abort" : "skip";
    if (a.recipe.empty()) a.recipe = info->recipe.name();
  }
  if (a.recipe.empty()) {
    throw UsageError("--save-checkpoint and --export-fp8 need one recipe: give --recipe R");
  }
  if (!a.save_checkpoint.empty()) check_train_output("--save-checkpoint", a.save_checkpoint, a.force, false);
  if (!a.export_fp8.empty()) check_train_output("--export-fp8", a.export_fp8, a.force, true);
  return info;
}

// The files a run reads (--data, --resume) and writes (--log-scales, --plot, --profile, --save-checkpoint,
// --export-fp8), checked before any work, so that no output replaces an input or another output and a long run
// never ends in "cannot write": each output's directory exists and is writable.
void check_train_files(const TrainArgs& a, bool writes_reports) {
  std::error_code ec;
  // A path option followed by another option took it as the path (--plot --json wrote an SVG named "--json").
  for (const auto& [option, path] : {std::pair<const char*, const std::string&>{"--data", a.data},
                                     {"--resume", a.resume},
                                     {"--plot", a.plot},
                                     {"--profile", a.profile},
                                     {"--log-scales", a.log_scales},
                                     {"--save-checkpoint", a.save_checkpoint},
                                     {"--export-fp8", a.export_fp8}}) {
    if (path.starts_with("--")) {
      throw UsageError(std::string(option) + ": '" + path + "' looks like an option; give a path (./" + path +
                       " for a file of that name)");
    }
  }
  if (!a.data.empty() && fs::is_directory(a.data, ec)) {
    throw UsageError("--data: '" + a.data + "' is a directory; give a text file");
  }
  if (!a.data.empty() && !std::ifstream(a.data, std::ios::binary)) {
    // Here, where every rank's verdict is agreed, rather than when training reads it (one line, not a job ended).
    const bool missing = !fs::exists(a.data, ec);
    if (!a.data_given) {  // the path the checkpoint being resumed recorded
      throw PathError("the training data of '" + a.resume + "', '" + a.data + "', " +
                          (missing ? "is not there any more" : "cannot be read") +
                          "; give its new path with --data (the checkpoint checks it is the same text)",
                      missing);
    }
    throw PathError(
        "--data: " + std::string(missing ? "there is no file '" : "cannot read '") + a.data + "'; check the path",
        missing);
  }
  const std::pair<const char*, std::string> inputs[] = {{"the training data", a.data},
                                                        {"the checkpoint to resume from", a.resume}};
  // The reports only the first rank writes (not compared across ranks), then the checkpoints.
  const std::pair<const char*, std::string> outputs[] = {{"--log-scales", writes_reports ? a.log_scales : ""},
                                                         {"--plot", writes_reports ? a.plot : ""},
                                                         {"--profile", writes_reports ? a.profile : ""},
                                                         {"--save-checkpoint", a.save_checkpoint},
                                                         {"--export-fp8", a.export_fp8}};
  const bool export_directory = !a.export_fp8.empty() && fs::path(a.export_fp8).extension() != ".safetensors";
  for (std::size_t i = 0; i < std::size(outputs); ++i) {
    const auto& [option, path] = outputs[i];
    if (path.empty()) continue;
    for (const auto& [input, in] : inputs) {
      if (!in.empty() && same_path(path, in)) {
        throw UsageError(std::string(option) + ": '" + path + "' is " + input + "; write to another path");
      }
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (!outputs[j].second.empty() && same_path(path, outputs[j].second)) {
        throw UsageError(std::string(outputs[j].first) + " and " + option + " name the same file; give two paths");
      }
    }
    // The export directory's files (config.json, model.safetensors) would replace another output written there, or
    // be replaced by it, and its commit removes an earlier sharded checkpoint's (model-*-of-*.safetensors and the
    // index): never an input or another output. Other names in it (run/train.safetensors beside the export in run/)
    // are fine.
    const auto export_touches = [&](const std::string& file) {
      if (!export_directory || file.empty()) return false;
      const fs::path f(file);
      const std::string name = f.filename().string();
      if (name != "config.json" && !is_checkpoint_file_name(name)) return false;
      return same_path(f.parent_path().empty() ? std::string(".") : f.parent_path().string(), a.export_fp8);
    };
    if (i != 4 && export_touches(path)) {
      throw UsageError(std::string(option) + ": '" + path + "' is a file that --export-fp8 '" + a.export_fp8 +
                       "' writes or removes; give another path");
    }
    if (i == 4) {
      for (const auto& [input, in] : inputs) {
        if (export_touches(in)) {
          throw UsageError("--export-fp8: '" + in + "' (" + input + ") is a file the export to '" + a.export_fp8 +
                           "' writes or removes; export to another directory");
        }
      }
      for (const char* file : kExportFiles) {  // never a folder in the way of the export's own files
        const fs::path exported = fs::path(a.export_fp8) / file;
        if (export_directory && fs::is_directory(exported, ec)) {
          throw UsageError("--export-fp8: '" + exported.string() + "' is a directory, where the export writes " +
                           "its " + file + "; remove it or export to another directory");
        }
      }
    }
    const fs::path p(path);
    // A report to a device or a pipe (--log-scales /dev/stdout) is written as it is: nothing more to check.
    if (i < 3 && fs::exists(p, ec) && !fs::is_regular_file(p, ec) && !fs::is_directory(p, ec)) continue;
    // A report replaces an earlier one of its kind (a rerun), never a file that is something else.
    if (i < 3 && !a.force && fs::is_regular_file(p, ec) && !replaceable_report(option, p)) {
      throw UsageError(std::string(option) + ": '" + path + "' exists and is not a report fp8kit train wrote; " +
                       "pass --force to replace it, or give another path");
    }
    try {
      // The export may be a directory, which it creates (its parent exists: check_train_output).
      check_writable_destination(p, /*directory=*/i == 4 && p.extension() != ".safetensors");
    } catch (const Error& e) {
      throw UsageError(std::string(option) + ": " + e.what());
    }
  }
}

// `step` on every rank of a run over ranks, its outcome agreed (agree_on_error: a failure on any rank is every rank's,
// and rank 0 reports it, naming the rank); without ranks, step() as it is.
void on_every_rank(Communicator* comm, const std::function<void()>& step) {
  if (comm == nullptr || comm->size() == 1) return step();
  agree_on_error(*comm, [&] {
    try {
      step();
    } catch (const UsageError& e) {
      FP8KIT_THROW(ErrorKind::kInvalidArgument, e.what());  // bad input: status 2, as a UsageError
    }
  });
}

// A double for JSON: null where it is not finite.
nlohmann::json number_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

// (loss - fp32's) / fp32's: NaN where either is not finite.
double loss_gap(double loss, double fp32) {
  return std::isfinite(loss) && std::isfinite(fp32) ? (loss - fp32) / fp32 : NAN;
}

// A gap as the tables print it: "+1.23%", "-" where it is not finite; one that rounds to zero is "+0.00%" (a gap of
// -1e-7 was "-0.00%").
std::string signed_percent(double gap) {
  if (!std::isfinite(gap)) return "-";
  const double rounded = std::round(gap * 10000.0) / 100.0;
  return fmt::format("{:+.2f}%", rounded == 0.0 ? 0.0 : rounded);
}

// A sample's statistics (the finite values; `nonfinite` counts the others).
struct Summary {
  std::size_t n = 0, nonfinite = 0;
  double median = NAN, mean = NAN, sd = NAN, se = NAN, min = NAN, max = NAN;
};
Summary summarize(const std::vector<double>& values) {
  Summary s;
  std::vector<double> v;
  for (const double x : values) (std::isfinite(x) ? v.push_back(x) : void(++s.nonfinite));
  s.n = v.size();
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const std::size_t h = v.size() / 2;
  s.median = v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
  s.min = v.front();
  s.max = v.back();
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  if (v.size() > 1) {
    double ss = 0.0;
    for (const double x : v) ss += (x - s.mean) * (x - s.mean);
    s.sd = std::sqrt(ss / static_cast<double>(v.size() - 1));
    s.se = s.sd / std::sqrt(static_cast<double>(v.size()));
  }
  return s;
}
nlohmann::json summary_json(const Summary& s) {
  return {{"runs", s.n},
          {"nonfinite", s.nonfinite},
          {"median_gap", number_or_null(s.median)},
          {"mean_gap", number_or_null(s.mean)},
          {"standard_error", number_or_null(s.se)},
          {"sd", number_or_null(s.sd)},
          {"min_gap", number_or_null(s.min)},
          {"max_gap", number_or_null(s.max)}};
}

// One seed's runs: a result per recipe (in --compare's order), fp32's --fp32-spread eval losses, and with --starts
// every recipe's eval loss from each of its starts.
struct SeedRuns {
  std::uint64_t seed = 0;
  std::vector<nn::TrainResult> results;
  std::vector<float> spread;
  // --starts K: per recipe (results' order) the eval losses of its K runs, start 0 (results' own) first; empty
  // without --starts.
  std::vector<std::vector<float>> starts;
  const nn::TrainResult* fp32() const {
    for (const auto& r : results)
      if (r.recipe == "fp32") return &r;
    return nullptr;
  }
  // The eval loss results[i]'s recipe is compared by: its run's, or with --starts the mean over its starts (not
  // finite when one of them is not).
  double loss(std::size_t i) const {
    if (starts.empty()) return results[i].final_loss;
    double sum = 0.0;
    for (const float l : starts[i]) sum += l;
    return sum / static_cast<double>(starts[i].size());
  }
  // results[i]'s gap to fp32 of this seed (NaN without fp32), and with --starts its standard error: the two means'
  // standard errors carried through their ratio (delta method), NaN with one start and for fp32's own row.
  double gap(std::size_t i) const {
    const nn::TrainResult* f = fp32();
    return f ? loss_gap(loss(i), loss(index(*f))) : NAN;
  }
  double gap_se(std::size_t i) const {
    const nn::TrainResult* f = fp32();
    if (starts.empty() || f == nullptr || &results[i] == f) return NAN;
    const auto relative_se = [&](std::size_t k) {
      return summarize(std::vector<double>(starts[k].begin(), starts[k].end())).se / loss(k);
    };
    const double ratio = loss(i) / loss(index(*f)), a = relative_se(i), b = relative_se(index(*f));
    return ratio * std::sqrt(a * a + b * b);
  }
  std::size_t index(const nn::TrainResult& r) const { return static_cast<std::size_t>(&r - results.data()); }
};

// One run's JSON object (`fp8kit train --json`): results[i] and, beside fp32's of the same seed, its ratios; fp32's
// row carries its --fp32-spread runs, every row its --starts.
nlohmann::json run_json(const TrainArgs& a, const SeedRuns& s, std::size_t i) {
  const nn::TrainResult& r = s.results[i];
  const nn::TrainResult* fp32 = s.fp32();
  nlohmann::json breakdown = nlohmann::json::object();
  for (std::size_t c = 0; c < kMemoryCategories; ++c) {
    breakdown[std::string(name(static_cast<MemoryCategory>(c)))] = r.peak_by_category[c];
  }
  nlohmann::json o = {{"recipe", r.recipe},
                      {"model", a.model},
                      {"optimizer_state", r.optimizer_state},
                      {"master_weights", r.master_weights},
                      {"peak_breakdown", breakdown},
                      {"steps", a.steps},
                      {"eval_batches", a.eval_batches},
                      {"seed", s.seed},
                      {"final_loss", number_or_null(r.final_loss)},
                      {"train_loss", number_or_null(r.train_loss)},
                      {"peak_bytes", r.peak_bytes},
                      {"step_ms", number_or_null(r.step_ms)},
                      {"skipped_steps", r.skipped_steps},
                      {"parameters", r.parameters},
                      {"threads", num_threads()},
                      {"start_step", r.start_step},
                      {"losses", r.losses}};
  if (fp32 != nullptr) {
    o["memory_ratio"] = static_cast<double>(r.peak_bytes) / static_cast<double>(fp32->peak_bytes);
    o["step_time_ratio"] = number_or_null(r.step_ms / fp32->step_ms);
    o["loss_gap"] = number_or_null(s.gap(i));
  }
  if (!s.starts.empty()) {
    nlohmann::json losses = nlohmann::json::array();
    for (const float l : s.starts[i]) losses.push_back(number_or_null(l));
    o["starts"] = {{"runs", s.starts[i].size()},
                   {"final_losses", losses},
                   {"mean_final_loss", number_or_null(s.loss(i))},
                   {"loss_gap_standard_error", number_or_null(s.gap_se(i))}};
  }
  if (&r == fp32 && !s.spread.empty()) {
    nlohmann::json losses = nlohmann::json::array(), gaps = nlohmann::json::array();
    for (const float l : s.spread) {
      losses.push_back(number_or_null(l));
      gaps.push_back(number_or_null(loss_gap(l, r.final_loss)));
    }
    o["fp32_spread"] = {{"runs", s.spread.size()}, {"final_losses", losses}, {"loss_gaps", gaps}};
  }
  return o;
}

// --starts K's perturbed ones: "start 1" or "starts 1-K".
std::string perturbed_starts(const TrainArgs& a) {
  return a.starts == 2 ? "start 1" : "starts 1-" + std::to_string(a.starts - 1);
}
// What --starts K made of the eval losses, printed under the tables.
std::string starts_note(const TrainArgs& a) {
  return fmt::format(
      "eval loss (and its gap): the mean over {} starts of each recipe, start 0 from the seed's initialization and "
      "{} with each initial weight one ulp up or down (the same for every recipe); +- s.e.: the gap's standard "
      "error from the starts' spread\n",
      a.starts, perturbed_starts(a));
}

// `--seeds`: each seed's eval losses (fp32's, the others as gaps to it), then per recipe the gaps' median, mean and
// standard error, sd and range, with the median memory and step-time ratios; fp32 against itself (--fp32-spread)
// pooled over the seeds as the last row.
void print_seeds(const TrainArgs& a, const std::vector<SeedRuns>& by_seed) {
  const std::vector<nn::TrainResult>& first = by_seed.front().results;
  std::vector<Summary> gaps(first.size());
  std::vector<double> memory(first.size(), NAN), time(first.size(), NAN);
  for (std::size_t i = 0; i < first.size(); ++i) {
    std::vector<double> g, m, t;
    for (const SeedRuns& s : by_seed) {
      const nn::TrainResult &r = s.results[i], &fp32 = *s.fp32();
      g.push_back(s.gap(i));
      m.push_back(static_cast<double>(r.peak_bytes) / static_cast<double>(fp32.peak_bytes));
      t.push_back(r.step_ms / fp32.step_ms);
    }
    gaps[i] = summarize(g);
    memory[i] = summarize(m).median;
    time[i] = summarize(t).median;
  }
  std::vector<double> self;  // fp32 against itself, every seed's perturbed runs
  for (const SeedRuns& s : by_seed)
    for (const float l : s.spread) self.push_back(loss_gap(l, s.fp32()->final_loss));
  const Summary spread = summarize(self);

  if (a.json) {
    nlohmann::json seeds = nlohmann::json::array(), runs = nlohmann::json::array(), summary = nlohmann::json::array();
    for (const SeedRuns& s : by_seed) {
      seeds.push_back(s.seed);
      for (std::size_t i = 0; i < s.results.size(); ++i) runs.push_back(run_json(a, s, i));
    }
    for (std::size_t i = 0; i < first.size(); ++i) {
      nlohmann::json o = summary_json(gaps[i]);
      o["recipe"] = first[i].recipe;
      o["memory_ratio"] = number_or_null(memory[i]);
      o["step_time_ratio"] = number_or_null(time[i]);
      summary.push_back(std::move(o));
    }
    nlohmann::json out = {{"seeds", seeds}, {"runs", runs}, {"summary", summary}};
    if (!self.empty()) out["fp32_spread"] = summary_json(spread);
    std::fprintf(output(), "%s\n", json_text(out).c_str());
    return;
  }
  std::fprintf(output(), "model %s, %lld parameters; data: %s; %s, seeds %s, %s\n", a.model.c_str(),
               static_cast<long long>(first.front().parameters), first.front().data.c_str(),
               counted(a.steps, "step").c_str(), a.seeds.c_str(), counted(num_threads(), "thread").c_str());
  // Each seed: fp32's eval loss, the other recipes' gaps to it, fp32 against itself.
  // (with --starts each gap carries its standard error: wider columns)
  const std::size_t width = a.starts > 1 ? 18 : 14;
  std::string head = fmt::format("{:<8}", "seed");
  for (const auto& r : first) head += fmt::format(" {:>{}}", r.recipe, width);
  if (!self.empty()) head += a.starts > 1 ? "   fp32, one ulp (its starts)" : "   fp32, one ulp (--fp32-spread)";
  std::fprintf(output(), "%s\n", head.c_str());
  for (const SeedRuns& s : by_seed) {
    std::string line = fmt::format("{:<8}", s.seed);
    for (std::size_t i = 0; i < s.results.size(); ++i) {
      if (&s.results[i] == s.fp32()) {
        line += fmt::format(" {:>{}.4f}", s.loss(i), width);
        continue;
      }
      const double se = s.gap_se(i);
      line += fmt::format(" {:>{}}",
                          signed_percent(s.gap(i)) + (std::isfinite(se) ? fmt::format(" +-{:.2f}%", 100.0 * se) : ""),
                          width);
    }
    if (!s.spread.empty()) {
      std::vector<double> g;
      for (const float l : s.spread) g.push_back(loss_gap(l, s.fp32()->final_loss));
      const Summary own = summarize(g);
      line += "   " + signed_percent(own.min) + " .. " + signed_percent(own.max);
    }
    std::fprintf(output(), "%s\n", line.c_str());
  }
  std::fprintf(output(), "\n%-18s %6s %9s %20s %8s %20s %9s %10s\n", "against fp32", "runs", "median", "mean +- s.e.",
               "sd", "min .. max", "memory", "step time");
  const auto row = [&](const std::string& label, const Summary& g, const std::string& mem, const std::string& t) {
    const std::string mean = std::isfinite(g.se)
                                 ? signed_percent(g.mean) + " +- " + fmt::format("{:.2f}%", 100.0 * g.se)
                                 : signed_percent(g.mean);
    const std::string sd = std::isfinite(g.sd) ? fmt::format("{:.2f}%", 100.0 * g.sd) : "-";
    const std::string n = g.nonfinite ? fmt::format("{} (+{} not finite)", g.n, g.nonfinite) : std::to_string(g.n);
    std::fprintf(output(), "%-18s %6s %9s %20s %8s %20s %9s %10s\n", label.c_str(), n.c_str(),
                 signed_percent(g.median).c_str(), mean.c_str(), sd.c_str(),
                 (signed_percent(g.min) + " .. " + signed_percent(g.max)).c_str(), mem.c_str(), t.c_str());
  };
  for (std::size_t i = 0; i < first.size(); ++i) {
    if (first[i].recipe == "fp32") continue;
    row(first[i].recipe, gaps[i], fmt::format("{:.2f}x", memory[i]), fmt::format("{:.2f}x", time[i]));
  }
  if (!self.empty()) row("fp32, one ulp", spread, "-", "-");
  std::fprintf(output(),
               "gap: eval loss (held-out data, %lld batch%s) against fp32's of the same seed; s.e.: sd / sqrt(runs); "
               "memory, step time: medians of the ratios to fp32's\n",
               static_cast<long long>(a.eval_batches), a.eval_batches == 1 ? "" : "es");
  if (!self.empty()) {
    std::fprintf(output(),
                 "fp32, one ulp: fp32 trained again with each initial weight one ulp away, against fp32 of the same "
                 "seed: a recipe's gaps inside that spread are fp32's own run-to-run variation\n");
  }
  if (a.starts > 1) std::fputs(starts_note(a).c_str(), output());
}

// The run, on each rank of a run over ranks (`comm`; nullptr without --parallel). `checked`, when given, turns true
// where the checks end and training begins: before it, whatever fails fails on every rank alike (the same settings,
// the files agreed), after it a rank can fail alone. `collectives_over` turns true on rank 0 after the last
// collective (the other ranks have returned): its reports and files are its own from there.
void train_run(TrainArgs a, Communicator* comm, bool* checked = nullptr, bool* collectives_over = nullptr) {
  // Every rank's settings the same, before anything is read. From there on every rank checks the same options;
  // what can still differ (the files each rank sees) is agreed.
  if (comm) check_same_settings(*comm, a);
  on_every_rank(comm, [&] {  // --threads may differ between ranks (a machine each): checked on each, agreed
    if (a.threads_given && (a.threads < 1 || a.threads > kMaxThreads)) {
      throw UsageError("--threads must be between 1 and " + std::to_string(kMaxThreads) + ", got " +
                       std::to_string(a.threads));
    }
  });
  std::optional<TrainCheckpointInfo> resumed;
  on_every_rank(comm, [&] { resumed = prepare_checkpoints(a); });
  // What each rank's copy of the checkpoint set (a copy per node could differ): the same on every rank.
  if (comm && resumed) check_same_settings(*comm, a, "read from its checkpoint");
  on_every_rank(comm, [&] { check_train_files(a, comm == nullptr || comm->rank() == 0); });
  if (comm && (resumed || !a.data.empty())) {
    // The files behind the same paths, the same on every rank too: the checkpoint's step and bytes, the data's.
    std::vector<Setting> contents;
    on_every_rank(comm, [&] {
      if (resumed) {
        contents.emplace_back("its checkpoint's step", std::to_string(resumed->next_step));
        contents.emplace_back("its checkpoint's bytes (fingerprint)", file_fingerprint(a.resume));
      }
      if (!a.data.empty()) {
        nn::TrainConfig data_config;
        data_config.data_path = a.data;
        contents.emplace_back("its --data file's text (fingerprint)", data_fingerprint(data_config));
      }
    });
    check_same_values(*comm, contents, "read", "every rank must read the same files (copy them alike to every node)");
  }
  if (a.model != "gpt" && a.model != "cnn") {
    throw UsageError("--model: '" + a.model + "' is not available (models: gpt, cnn)");
  }
  if (a.model == "cnn" && !a.data.empty()) {
    throw UsageError("--data is for --model gpt (the cnn trains on generated images)");
  }
  if (a.steps < 1) throw UsageError("--steps must be at least 1, got " + std::to_string(a.steps));
  if (a.eval_batches < 1) {
    throw UsageError("--eval-batches must be at least 1, got " + std::to_string(a.eval_batches));
  }
  if (a.batch < 0 || (a.batch_given && a.batch == 0)) {
    throw UsageError("--batch must be at least 1, got " + std::to_string(a.batch));
  }
  if (a.on_nonfinite != "skip" && a.on_nonfinite != "abort") {
    throw UsageError("--on-nonfinite: '" + a.on_nonfinite + "' (use skip or abort)");
  }
  if (a.conv_max_area < 1) throw UsageError("--fp8-conv-max-kernel-area must be at least 1");
  if (a.inject_nan_given && (a.inject_nan < 0 || a.inject_nan >= a.steps)) {
    throw UsageError("--inject-nan " + std::to_string(a.inject_nan) + ": the run's steps are 0 .. " +
                     std::to_string(a.steps - 1));
  }
  if (a.inject_nan_given && resumed && a.inject_nan < resumed->next_step) {
    throw UsageError("--inject-nan " + std::to_string(a.inject_nan) + ": the run resumes at step " +
                     std::to_string(resumed->next_step) + "; give a step " + std::to_string(resumed->next_step) +
                     " .. " + std::to_string(a.steps - 1));
  }
  std::vector<nn::PrecisionRecipe> recipes = parse_recipes(a);
  // fp32's row (--fp32-spread trains it again; --seeds and --fp32-spread need it): null when not compared.
  const auto fp32_at =
      std::find_if(recipes.begin(), recipes.end(), [](const nn::PrecisionRecipe& r) { return r.name() == "fp32"; });
  const nn::PrecisionRecipe* const fp32_recipe = fp32_at == recipes.end() ? nullptr : &*fp32_at;
  if (a.fp32_spread < 0 || a.fp32_spread > static_cast<std::int64_t>(kMaxSeeds)) {
    throw UsageError("--fp32-spread must be 0 to " + std::to_string(kMaxSeeds) + " (extra fp32 runs per seed), got " +
                     std::to_string(a.fp32_spread));
  }
  if (a.starts < 1 || a.starts > static_cast<std::int64_t>(kMaxSeeds)) {
    throw UsageError("--starts must be 1 to " + std::to_string(kMaxSeeds) + " (runs per recipe and seed), got " +
                     std::to_string(a.starts));
  }
  // (the conflict first: "put fp32 among the recipes" only led a --resume to another refusal)
  for (const auto& [extra, option] : {std::pair{a.fp32_spread > 0, "--fp32-spread"}, {a.starts > 1, "--starts"}}) {
    if (extra && (a.parallel != "none" || !a.resume.empty() || !a.save_checkpoint.empty() || !a.export_fp8.empty())) {
      throw UsageError(std::string(option) +
                       " trains its extra runs in this process from the start: leave out --parallel, --resume, "
                       "--save-checkpoint and --export-fp8");
    }
  }
  if (a.fp32_spread > 0 && a.starts > 1) {
    throw UsageError("--starts " + std::to_string(a.starts) + " trains fp32 from the one-ulp starts --fp32-spread " +
                     "would (and reports its spread over them): leave out --fp32-spread");
  }
  if (a.fp32_spread > 0) {
    if (fp32_recipe == nullptr) {
      throw UsageError("--fp32-spread measures fp32 against itself: put fp32 among the recipes (--compare fp32,...)");
    }
  }
  std::vector<std::uint64_t> seeds{a.seed};
  if (a.seeds_given) {
    if (a.seed_given) throw UsageError("give --seed or --seeds, not both");
    seeds = parse_seeds(a.seeds);
    if (a.parallel != "none" || !a.resume.empty() || !a.save_checkpoint.empty() || !a.export_fp8.empty() ||
        !a.plot.empty() || !a.profile.empty() || !a.log_scales.empty()) {
      throw UsageError(
          "--seeds trains every seed's runs in this process and prints their summary: leave out --parallel, --resume, "
          "--save-checkpoint, --export-fp8, --plot, --profile and --log-scales (or give one seed with --seed)");
    }
    if (fp32_recipe == nullptr) {
      throw UsageError(
          "--seeds compares every recipe with fp32 of the same seed: put fp32 among the recipes (--compare fp32,...)");
    }
  }
  if (resumed && recipes.front().name() == resumed->recipe.name()) {
    // The checkpoint's settings (amax history, margin, ...), with the one the command line may change.
    const int area = recipes.front().fp8_conv_max_kernel_area;
    recipes.front() = resumed->recipe;
    recipes.front().fp8_conv_max_kernel_area = area;
    apply_storage_options(a, recipes.front());  // a different one is refused with the checkpoint's
  }
  std::optional<Fp8ExportOptions> export_options;
  if (!a.export_fp8.empty()) {
    std::optional<QuantScheme> scheme;
    std::optional<CheckpointLayout> layout;
    if (!a.export_scheme.empty() && !(scheme = parse_quant_scheme(a.export_scheme))) {
      throw UsageError("unknown --export-scheme '" + a.export_scheme +
                       "' (use fp8-tensor, fp8-channel, fp8-block, mxfp8)");
    }
    if (!a.export_layout.empty() && !(layout = parse_checkpoint_layout(a.export_layout))) {
      throw UsageError("unknown --export-layout '" + a.export_layout +
                       "' (use native, deepseek, compressed-tensors, autofp8, fbgemm, mxfp8)");
    }
    export_options = resolve_fp8_export(recipes.front(), scheme, layout, a.export_input_scales);
    // The CNN's one linear weight is its head, which always runs in bfloat16 (docs/nn.md): no input scale to export.
    if (a.export_input_scales && a.model == "cnn") {
      throw UsageError(
          "--export-input-scales: the cnn's only linear layer (its head) runs in bfloat16, never an "
          "FP8 GEMM, so it has no input scale; leave the option out");
    }
  }
  if (a.threads > 0) set_num_threads(a.threads);
  // A --batch the machine cannot hold ends in one line, not with the kernel ending the process part-way (Linux lets
  // the allocations through and kills whoever touches too much of them): the tensors may take 90% of what was
  // available at the start.
  // (Ranks on one machine share it: each takes its part. A limit already set, by the caller or a train call
  // running beside this one in the Python package's process, is left as it is, and only one this call set is
  // lifted at its end.)
  const std::uint64_t available = available_memory() / static_cast<std::uint64_t>(local_ranks());
  struct LimitSet {
    bool set = false;
    ~LimitSet() {
      if (set) set_memory_limit(0);
    }
  } limit;
  if (available != 0 && memory_limit() == 0) {
    set_memory_limit(static_cast<std::int64_t>(available / 10 * 9));
    limit.set = true;
  }
  if (a.parallel != "none" && a.parallel != "ddp" && a.parallel != "fsdp") {
    throw UsageError("--parallel: '" + a.parallel + "' (use none, ddp or fsdp)");
  }
  const std::optional<ReducePayload> grad_payload =
      parse_reduce_payload(a.grad_reduce.empty() ? "fp32" : a.grad_reduce);
  if (!grad_payload) throw UsageError("--grad-reduce: '" + a.grad_reduce + "' (use fp32, bf16, fp8, e4m3, e5m2)");
  const bool parallel = a.parallel != "none", fsdp = a.parallel == "fsdp";
  if (!parallel && !a.grad_reduce.empty()) throw UsageError("--grad-reduce needs --parallel ddp or fsdp");
  const RankFailure inject_failure = parse_rank_failure(a.inject_rank_failure);
  if (!parallel && inject_failure.rank >= 0) throw UsageError("--inject-rank-failure needs --parallel ddp or fsdp");
  if (parallel && comm != nullptr && inject_failure.rank >= comm->size()) {
    throw UsageError("--inject-rank-failure: rank " + std::to_string(inject_failure.rank) + " is not in this job of " +
                     std::to_string(comm->size()) + " ranks (0 .. " + std::to_string(comm->size() - 1) + ")");
  }
  nn::TrainConfig defaults;
  defaults.model = a.model;
  // a.batch: the option's, else a resumed checkpoint's, else 0 (the model's default).
  if (comm && (a.batch > 0 ? a.batch : nn::batch_size(defaults)) < comm->size()) {
    // The same on every rank: all refuse together.
    const std::int64_t batch = a.batch > 0 ? a.batch : nn::batch_size(defaults);
    // A resumed run keeps its checkpoint's batch: then the fix is fewer ranks, not another --batch.
    throw UsageError("--parallel " + a.parallel + " over " + std::to_string(comm->size()) +
                     " ranks needs a global --batch of at least " + std::to_string(comm->size()) +
                     " (each rank trains on its rows of it)" +
                     (resumed
                          ? "; " + a.resume + " was trained with batch " + std::to_string(batch) +
                                ": resume it on at most " + std::to_string(batch) + (batch == 1 ? " rank" : " ranks")
                          : std::string()));
  }
  nn::TrainConfig config;
  config.model = a.model;
  config.steps = a.steps;
  config.eval_batches = a.eval_batches;
  config.seed = a.seed;
  config.batch = a.batch;
  config.data_path = a.data;
  config.on_nonfinite = a.on_nonfinite == "abort" ? nn::OnNonfinite::kAbort : nn::OnNonfinite::kSkip;
  config.log_scales = !a.log_scales.empty();
  if (a.inject_nan >= 0) config.inject_nan_step = a.inject_nan;
  if (resumed) {
    // No option sets these: a resumed run continues with its checkpoint's (a run of the library may have others).
    config.adamw = resumed->adamw;
    config.warmup_steps = resumed->warmup_steps;
  }
  TrainCheckpointOptions checkpoint_options;
  checkpoint_options.save_checkpoint = a.save_checkpoint;
  checkpoint_options.checkpoint_every = a.checkpoint_every;
  checkpoint_options.resume_from = a.resume;
  checkpoint_options.export_fp8 = a.export_fp8;
  if (export_options) {
    checkpoint_options.export_scheme = export_options->scheme;
    checkpoint_options.export_layout = export_options->layout;
    checkpoint_options.export_input_scales = export_options->static_input_scales;
  }
  std::string steps_note;  // printed once the runs have succeeded: an error stays the one line on stderr
  if (resumed) {
    on_every_rank(comm, [&] { check_resumable(a.resume, *resumed, config, recipes.front()); });
    if (a.steps != resumed->steps && a.steps > resumed->next_step) {  // (no step runs at its end: nothing to say)
      steps_note = "note: --steps " + std::to_string(a.steps) + " differs from the checkpoint's run (" +
                   std::to_string(resumed->steps) + " steps): from step " + std::to_string(resumed->next_step) +
                   " on, the learning rate followed a " + std::to_string(a.steps) + "-step schedule\n";
    }
  }
  if (comm) config = data_parallel_config(*comm, config);
  const bool quiet = comm && comm->rank() != 0;  // one report, from rank 0
  if (quiet) config.log_scales = false;
  std::optional<ScaleLog> scale_log;
  on_every_rank(comm, [&] {  // only rank 0 opens it; every rank refuses together
    if (config.log_scales) scale_log.emplace(a.log_scales);
  });
  std::optional<Profiler> profiler;
  if (!a.profile.empty()) profiler.emplace();
  if (comm && profiler) comm->set_profiler(&*profiler);  // the collectives' events, with their bytes

  std::vector<SeedRuns> by_seed;       // each seed's runs (one seed unless --seeds)
  std::vector<bool> identical;         // --parallel: every rank's weights the same after each run
  std::vector<CommStats> comm_bytes;   // --parallel: what this rank handed to MPI over each run's steps
  std::vector<GatherCounts> gathered;  // --parallel fsdp: what each run's weight gathers carried
  std::vector<std::vector<Profiler::Summary>> summaries;
  std::vector<ProfileEvent> trace;
  if (checked) *checked = true;
  try {
    for (const std::uint64_t seed : seeds) {
      config.seed = seed;
      const std::string of_seed = a.seeds_given ? ", seed " + std::to_string(seed) : "";
      std::vector<nn::TrainResult> results;
      for (std::size_t ri = 0; ri < recipes.size(); ++ri) {
        const nn::PrecisionRecipe& recipe = recipes[ri];
        TrainProgress progress(recipe.name() + of_seed, a.steps);
        if (profiler) profiler->clear();
        auto on_step = [&](const nn::StepLog& s) {
          progress(s);
          if (scale_log) {
            for (const nn::ScaleRecord& r : s.scales) {
              nlohmann::json line = {{"recipe", recipe.name()},
                                     {"step", s.step},
                                     {"layer", r.layer},
                                     {"op", r.op},
                                     {"role", std::string(nn::name(r.role))},
                                     {"amax", r.amax},
                                     {"scale", r.scale},
                                     {"underflow_fraction", r.underflow_fraction},
                                     {"saturated", r.saturated},
                                     {"nonfinite", r.nonfinite}};
              if (!std::isfinite(r.amax)) line["amax"] = nullptr;
              scale_log->line(json_text(line, -1));
            }
          }
        };
        if (comm) {
          std::optional<Fsdp> sharded;
          if (fsdp) sharded.emplace(*comm, *grad_payload, nn::batch_size(config));
          nn::TrainHooks base;
          if (!quiet) base.on_step = on_step;
          std::int64_t step = 0;  // the step this rank is in, for a failure's line
          base.resume = [&](nn::Trainer&, nn::TrainProgress& p) { step = p.next_step; };  // after a checkpoint's
          // The steps' counts, recorded after the last step (before FSDP's last gather and the replica check), or at
          // the end when no step ran (a resumed run with none left): per rank the largest count (ranks with uneven
          // shards hand over different bytes); FSDP's gathers summed over ranks.
          bool recorded = false;
          const auto record = [&] {
            if (recorded) return;
            recorded = true;
            CommStats s = comm->stats();
            for (std::uint64_t CommStats::*c :
                 {&CommStats::all_gather_bytes, &CommStats::reduce_scatter_bytes, &CommStats::all_reduce_bytes,
                  &CommStats::broadcast_bytes, &CommStats::all_to_all_bytes}) {
              s.*c = static_cast<std::uint64_t>(max_over_ranks(*comm, static_cast<std::int64_t>(s.*c)));
            }
            comm_bytes.push_back(s);
            GatherCounts g = sharded ? sharded->gathered() : GatherCounts{};
            for (auto* counts : {&g.gemm_weights, &g.other_parameters}) {
              for (auto& [carried, count] : *counts) {
                count.bytes = static_cast<std::uint64_t>(sum_over_ranks(*comm, static_cast<std::int64_t>(count.bytes)));
              }
            }
            gathered.push_back(std::move(g));
          };
          base.after_step = [&](nn::Trainer&, const nn::TrainProgress& p) {
            step = p.next_step;
            if (p.next_step == config.steps) record();
          };
          base.finish = [&](nn::Trainer& t, const nn::TrainProgress&) {
            record();
            identical.push_back(replicas_identical(*comm, t.model()));
          };
          // Checkpoints and the export: gathered whole (fsdp) and written by rank 0; a resume is read by every rank.
          TrainCheckpointOptions rank_options = checkpoint_options;
          rank_options.around_write = sharded ? sharded->around_write() : rank_zero_writes(*comm);
          nn::check_train_config(config);
          std::optional<TrainCheckpointer> checkpointer;  // reads the checkpoint to resume and the data: agreed
          on_every_rank(comm, [&] { checkpointer.emplace(config, recipe, rank_options); });
          TrainCheckpointer& checkpoints = *checkpointer;
          comm->reset_stats();  // the run's collectives from here (not the agreement above)
          nn::TrainHooks hooks = sharded ? sharded->hooks(checkpoints.hooks(std::move(base)))
                                         : data_parallel_hooks(*comm, *grad_payload, nn::batch_size(config),
                                                               checkpoints.hooks(std::move(base)));
          if (inject_failure.rank == comm->rank()) {
            // Right after this rank's forward of the step: the others go on into the loss's all-reduce and wait there.
            hooks.agree_loss = [&, agree = std::move(hooks.agree_loss)](nn::Trainer& t, float loss) {
              if (step == inject_failure.step) {
                if (inject_failure.kill) std::raise(SIGKILL);
                throw std::runtime_error("injected failure (--inject-rank-failure)");
              }
              return agree(t, loss);
            };
          }
          try {
            results.push_back(nn::train(config, recipe, profiler ? &*profiler : nullptr, hooks));
            results.back().peak_bytes = max_over_ranks(*comm, results.back().peak_bytes);  // per rank, the largest
          } catch (const nn::NonfiniteAbort&) {
            throw;  // on every rank at the same step (the guard's verdict is agreed): rank 0 reports it
          } catch (const AgreedError&) {
            throw;  // a failed checkpoint write, say: every rank knows, rank 0 reports it
          } catch (const std::exception& e) {
            if (comm->size() > 1) end_job(*comm, recipe.name(), step, e.what());
            throw;
          }
        } else {
          results.push_back(
              train_with_checkpoints(config, recipe, checkpoint_options, profiler ? &*profiler : nullptr, on_step));
        }
        if (profiler) {
          summaries.push_back(profiler->summary());
          for (ProfileEvent e : profiler->events()) {
            e.args["recipe"] = recipe.name();
            e.track = static_cast<int>(ri);
            trace.push_back(std::move(e));
          }
        }
      }
      if (quiet) return;
      if (collectives_over) *collectives_over = true;  // rank 0 alone from here: the others wait in run()'s barrier
      // A run of `recipe` with each initial weight one ulp away (perturb_seed k): --fp32-spread's and --starts'
      // extra runs (without scale log and profile: those are the unperturbed runs').
      const auto perturbed_loss = [&](const nn::PrecisionRecipe& recipe, std::int64_t k, const std::string& label) {
        nn::TrainConfig perturbed = config;
        perturbed.perturb_seed = static_cast<std::uint64_t>(k);
        perturbed.log_scales = false;
        TrainProgress progress(label + of_seed, a.steps);
        return nn::train(perturbed, recipe, nullptr, [&](const nn::StepLog& s) { progress(s); }).final_loss;
      };
      // --fp32-spread K: fp32 again, K times, each run's initial weights one ulp away from the first's (perturb_seed
      // 1..K): how far fp32 lands from itself, the floor under every gap in the table. The fp32 row's own recipe
      // (with --optimizer-state and --master-weights: a plain fp32 one made a gap of the storage look like spread).
      std::vector<float> spread;
      for (std::int64_t k = 1; k <= a.fp32_spread; ++k) {
        spread.push_back(perturbed_loss(*fp32_recipe, k, fmt::format("fp32, perturbed {}/{}", k, a.fp32_spread)));
      }
      // --starts K: every recipe again from starts 1..K-1 (perturb_seed k: the same initial weights for every
      // recipe), compared by their means; fp32's extra starts are its spread too.
      std::vector<std::vector<float>> starts;
      for (std::size_t ri = 0; ri < recipes.size() && a.starts > 1; ++ri) {
        std::vector<float> losses{results[ri].final_loss};
        for (std::int64_t k = 1; k < a.starts; ++k) {
          losses.push_back(perturbed_loss(
              recipes[ri], k, fmt::format("{}, perturbed start {}/{}", recipes[ri].name(), k, a.starts - 1)));
        }
        if (&recipes[ri] == fp32_recipe) spread.assign(losses.begin() + 1, losses.end());
        starts.push_back(std::move(losses));
      }
      by_seed.push_back({seed, std::move(results), std::move(spread), std::move(starts)});
    }
  } catch (const nn::NonfiniteAbort&) {
    // Agreed on every rank: no collective follows, the others wait in run()'s barrier.
    if (collectives_over) *collectives_over = true;
    if (scale_log) scale_log->commit();  // the log up to the step that aborted the run, whole
    throw;
  } catch (...) {
    // Any other end after steps were logged (a checkpoint or the export that cannot be written, after every step
    // trained): the log of those steps is still written, whole; the run's own error is the one reported. Before
    // the first step, an earlier log stays as it was.
    if (scale_log && scale_log->written()) {
      try {
        scale_log->commit();
      } catch (const std::exception&) {
      }
    }
    throw;
  }
  if (scale_log) scale_log->commit();
  if (!steps_note.empty() && !quiet) std::fputs(steps_note.c_str(), stderr);
  if (a.seeds_given) return print_seeds(a, by_seed);
  const std::vector<nn::TrainResult>& results = by_seed.front().results;
  const std::vector<float>& spread = by_seed.front().spread;
  // The trace and the plot: a write that fails is said after the table or the JSON, naming its option, so that a
  // long run's results are printed all the same (exit 1 then).
  std::optional<Error> report_failed;
  const auto write_report = [&](const char* option, const auto& write) {
    try {
      write();
    } catch (const Error& e) {
      if (!report_failed) report_failed.emplace(e.kind(), std::string(option) + ": " + e.what(), e.file(), e.line());
    }
  };
  if (profiler) {
    write_report("--profile", [&] {
      Profiler combined;
      for (ProfileEvent& e : trace) combined.record(std::move(e));
      std::ostringstream trace_json;
      combined.write_chrome_trace(trace_json);
      write_text_file(a.profile, trace_json.str());
    });
  }
  if (!a.plot.empty()) write_report("--plot", [&] { write_plot(a.plot, results); });
  const auto print_results = [&] {
    const SeedRuns& runs = by_seed.front();
    const nn::TrainResult* fp32 = runs.fp32();
    if (a.json) {
      nlohmann::json out = nlohmann::json::array();
      for (std::size_t i = 0; i < results.size(); ++i) {
        const nn::TrainResult& r = results[i];
        nlohmann::json o = run_json(a, runs, i);
        if (comm) {
          const std::int64_t ran = a.steps - r.start_step;  // this process's steps (a resumed run: from its step)
          const auto per_step = [&](std::uint64_t bytes) {
            return ran > 0 ? static_cast<double>(bytes) / static_cast<double>(ran) : 0.0;
          };
          o["ranks"] = comm->size();
          o["parallel"] = a.parallel;
          o["grad_reduce"] = std::string(name(*grad_payload));
          o["comm_bytes_per_step"] = {{"all_gather", per_step(comm_bytes[i].all_gather_bytes)},
                                      {"reduce_scatter", per_step(comm_bytes[i].reduce_scatter_bytes)},
                                      {"all_reduce", per_step(comm_bytes[i].all_reduce_bytes)}};
          if (fsdp) {
            const auto by_payload = [&](const std::map<std::string, GatherCount>& counts) {
              nlohmann::json by = nlohmann::json::object();
              for (const auto& [carried, count] : counts) {
                by[carried] = {{"elements", per_step(count.elements)}, {"bytes", per_step(count.bytes)}};
              }
              return by;
            };
            // Bytes summed over ranks: what every rank handed to MPI for the gathered tensors' elements.
            o["fsdp_all_gather_per_step"] = {{"gemm_weights", by_payload(gathered[i].gemm_weights)},
                                             {"other_parameters", by_payload(gathered[i].other_parameters)}};
          }
          o["replicas_identical"] = static_cast<bool>(identical[i]);
        }
        if (!a.save_checkpoint.empty()) o["checkpoint"] = a.save_checkpoint;
        if (!a.export_fp8.empty()) o["export_fp8"] = a.export_fp8;
        out.push_back(o);
      }
      std::fprintf(output(), "%s\n", json_text(out).c_str());
      return;
    }
    std::fprintf(output(), "model %s, %lld parameters; data: %s; %s, seed %llu, %s\n", a.model.c_str(),
                 static_cast<long long>(results.front().parameters), results.front().data.c_str(),
                 counted(a.steps, "step").c_str(), static_cast<unsigned long long>(a.seed),
                 counted(num_threads(), "thread").c_str());
    if (comm) {
      std::fprintf(output(), "%s: %d ranks (%s), gradients summed in %s; replicas identical: %s\n",
                   fsdp ? "fully sharded data parallel" : "data parallel", comm->size(),
                   std::string(comm->backend()).c_str(), std::string(name(*grad_payload)).c_str(),
                   std::all_of(identical.begin(), identical.end(), [](bool b) { return b; }) ? "yes" : "NO");
    }
    const int gap_width = a.starts > 1 ? 15 : 9;  // with --starts: the gap and its standard error
    std::fprintf(output(), "%-18s %12s %8s %12s %8s %11s %*s %8s\n", "recipe", "peak memory", "vs fp32", "step time",
                 "vs fp32", "eval loss", gap_width, "vs fp32", "skipped");
    for (std::size_t i = 0; i < results.size(); ++i) {
      const nn::TrainResult& r = results[i];
      const std::string mem_ratio =
          fp32 ? fmt::format("{:.2f}x", static_cast<double>(r.peak_bytes) / static_cast<double>(fp32->peak_bytes))
               : "-";
      // A run resumed at its end ran no step: no time (NaN), shown as "-".
      const std::string step_time = std::isfinite(r.step_ms) ? fmt::format("{:.1f} ms", r.step_ms) : "-";
      const double time_vs = fp32 ? r.step_ms / fp32->step_ms : NAN;
      const std::string time_ratio = std::isfinite(time_vs) ? fmt::format("{:.2f}x", time_vs) : "-";
      const double se = runs.gap_se(i);
      const std::string gap =
          fp32 ? signed_percent(runs.gap(i)) + (std::isfinite(se) ? fmt::format(" +-{:.2f}%", 100.0 * se) : "") : "-";
      std::fprintf(output(), "%-18s %12s %8s %12s %8s %11.4f %*s %8lld\n", r.recipe.c_str(),
                   megabytes(r.peak_bytes).c_str(), mem_ratio.c_str(), step_time.c_str(), time_ratio.c_str(),
                   runs.loss(i), gap_width, gap.c_str(), static_cast<long long>(r.skipped_steps));
    }
    std::fprintf(output(),
                 "peak memory: allocation accounting (weights, gradients, AdamW state, activations saved for backward,"
                 " temporaries); step time: median; eval loss: held-out data, %lld batch%s\n",
                 static_cast<long long>(a.eval_batches), a.eval_batches == 1 ? "" : "es");
    if (!spread.empty()) {
      std::vector<double> gaps;
      for (const float l : spread) gaps.push_back(loss_gap(l, fp32->final_loss));
      const Summary g = summarize(gaps);
      const std::string sd = std::isfinite(g.sd) ? fmt::format(", sd {:.2f}%", 100.0 * g.sd) : "";
      std::fprintf(
          output(), "fp32 against itself: %s, each initial weight one ulp up or down: eval loss %s .. %s%s %s\n",
          counted(gaps.size(), "more run").c_str(), signed_percent(g.min).c_str(), signed_percent(g.max).c_str(),
          sd.c_str(),
          (a.starts > 1 ? "(its " + perturbed_starts(a) + " against start 0)"
                        : std::string("(a gap above inside that range is within fp32's own run-to-run spread)"))
              .c_str());
    }
    if (a.starts > 1) std::fputs(starts_note(a).c_str(), output());
    if (resumed) {
      std::fprintf(output(), "resumed from %s at step %lld (peak memory and step time: this process's steps)\n",
                   a.resume.c_str(), static_cast<long long>(results.front().start_step));
    }
    if (!a.save_checkpoint.empty()) {
      std::fprintf(output(), "checkpoint: %s (step %lld)\n", a.save_checkpoint.c_str(),
                   static_cast<long long>(a.steps));
    }
    if (export_options) {
      std::fprintf(output(), "FP8 export: %s (%s, %s layout)\n", a.export_fp8.c_str(),
                   std::string(name(export_options->scheme)).c_str(),
                   std::string(name(export_options->layout)).c_str());
    }
    for (std::size_t ri = 0; ri < summaries.size(); ++ri) {
      std::fprintf(output(), "\nprofile (%s): op, calls, path, reason, total time\n", results[ri].recipe.c_str());
      for (const auto& s : summaries[ri]) {
        if (s.name == "step") continue;
        std::fprintf(output(), "  %-40s %7lld %-11s %-28s %10.1f ms\n", s.name.c_str(), static_cast<long long>(s.calls),
                     s.path.empty() ? "-" : s.path.c_str(), s.reason.empty() ? "-" : s.reason.c_str(),
                     s.total_us / 1000.0);
      }
    }
    if (!a.profile.empty())
      std::fprintf(output(), "\ntrace: %s (open in https://ui.perfetto.dev or chrome://tracing)\n", a.profile.c_str());
  };
  print_results();
  if (report_failed) throw *report_failed;
}

// A run over ranks ends at one barrier, whichever way it ends. An error every rank throws together (the settings'
// check, an agreed failure, a usage error every rank sees alike) is said by rank 0 before it: a rank that exited
// first with the status would have mpirun kill rank 0 before it said why. (A rank failing on its own in the middle
// of the run ends the job itself: end_job.)
void run(const TrainArgs& a) {
  if (a.parallel == "none") return train_run(a, nullptr);
  const std::unique_ptr<Communicator> comm = job_communicator();
  int status = 0;
  bool checked = false, collectives_over = false;
  try {
    train_run(a, comm.get(), &checked, &collectives_over);
  } catch (const UsageError&) {
    status = report_error("fp8kit train", std::current_exception());
  } catch (const AgreedError&) {
    status = report_error("fp8kit train", std::current_exception());
  } catch (const nn::NonfiniteAbort&) {
    status = report_error("fp8kit train", std::current_exception());
  } catch (const std::exception& e) {
    // A check's refusal is every rank's; after the last collective (rank 0's reports: --plot, --profile, the
    // table; the log of an agreed abort) the others wait in the barrier below, so rank 0 says why and joins them.
    // Any other error of this rank alone would leave the others inside a collective: thrown on (the training loop
    // ends the job itself, end_job).
    if (!collectives_over && (checked || dynamic_cast<const Error*>(&e) == nullptr)) throw;
    status = report_error("fp8kit train", std::current_exception());
  }
  comm->barrier();
  if (status != 0) throw ReportedError(status);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a small model under FP32, BF16 and FP8 recipes and compare them");
  auto args = std::make_shared<TrainArgs>();
  cmd->add_option("--model", args->model,
                  "Model: gpt (default; a small GPT on text) or cnn (a small CNN with a 7x7 stem on generated images)");
  cmd->add_option("--recipe", args->recipe,
                  "One recipe: fp32, bf16, fp8-delayed, fp8-current, fp8-block, mxfp8, fp8-o2, fp8-delayed-e4m3");
  cmd->add_option("--compare", args->compare, std::string("Comma list of recipes (default ") + kDefaultCompare + ")");
  cmd->add_option("--optimizer-state", args->optimizer_state,
                  "AdamW moments in fp32, bf16 or fp8 (E4M3 m and sqrt(v), 128-element blocks; default: fp8 for "
                  "fp8-o2, fp32 for the others)");
  cmd->add_option("--master-weights", args->master_weights,
                  "Parameters and gradients in fp32, or bfloat16 with stochastic rounding (bf16-sr) or a Kahan "
                  "buffer (bf16-kahan); default: bf16-sr for fp8-o2, fp32 for the others");
  add_integer_option(cmd, "--steps", args->steps, "Training steps (default 400)");
  add_integer_option(cmd, "--eval-batches", args->eval_batches,
                     "Held-out batches the final loss is the mean of (default " +
                         std::to_string(nn::TrainConfig{}.eval_batches) + ")");
  add_integer_option(cmd, "--fp32-spread", args->fp32_spread,
                     "Train fp32 this many more times, each initial weight one ulp up or down, and report how far "
                     "their eval losses land from fp32's (default 0)");
  add_integer_option(cmd, "--starts", args->starts,
                     "Train every recipe from this many starts per seed, start 0 as seeded and the others with each "
                     "initial weight one ulp up or down (the same for every recipe), and compare the recipes by their "
                     "mean eval loss, with the gap's standard error (default 1; --plot, --profile and --log-scales "
                     "show start 0)");
  add_integer_option(cmd, "--seed", args->seed, "Seed of the data and the initialization (default 1)");
  cmd->add_option("--seeds", args->seeds,
                  "Train every recipe on each of these seeds (1-10, 1,2,5) and summarize each recipe's eval loss "
                  "against fp32's of the same seed: median, mean and standard error, spread");
  add_integer_option(cmd, "--batch", args->batch, "Sequences (gpt) or images (cnn) per step (default 16 / 64)");
  add_integer_option(cmd, "--threads", args->threads, "Threads (default: all cores)");
  cmd->add_option("--data", args->data, "Train the GPT on this text file instead of the generated corpus");
  add_quiet_flag(cmd);
  cmd->add_flag("--json", args->json, "Print a JSON array, one object per recipe");
  cmd->add_option("--plot", args->plot, "Write the loss curves to this SVG file");
  cmd->add_option("--profile", args->profile,
                  "Write a Chrome trace (Perfetto, chrome://tracing) and print per-op tables");
  cmd->add_option("--log-scales", args->log_scales, "Write per-step amax/scale/underflow/saturation as JSON lines");
  cmd->add_option("--on-nonfinite", args->on_nonfinite, "skip (default) or abort on NaN/Inf in an amax or gradient");
  add_integer_option(cmd, "--inject-nan", args->inject_nan,
                     "Write a NaN into a gradient at this step (to see the guard)");
  add_integer_option(cmd, "--fp8-conv-max-kernel-area", args->conv_max_area,
                     "FP8 convolutions only up to this kernel area (default 32)");
  cmd->add_option("--save-checkpoint", args->save_checkpoint,
                  "Write a training checkpoint (.safetensors) after the last step (and every --checkpoint-every)");
  add_integer_option(cmd, "--checkpoint-every", args->checkpoint_every, "Also write the checkpoint every N steps");
  cmd->add_option(
      "--resume", args->resume,
      "Continue the run of this checkpoint with its model, recipe, seed, batch, steps and data (other values "
      "are refused; --steps may extend it)");
  cmd->add_option("--export-fp8", args->export_fp8,
                  "Write the final weights as an FP8 inference checkpoint (.safetensors file, or a directory)");
  cmd->add_option("--export-scheme", args->export_scheme,
                  "fp8-tensor, fp8-channel, fp8-block, mxfp8 (default: the one --export-layout stores, else the "
                  "recipe's: fp8-block, mxfp8, or fp8-tensor)");
  cmd->add_option("--export-layout", args->export_layout,
                  "deepseek, compressed-tensors, autofp8, fbgemm, mxfp8, native (default: the scheme's, as fp8kit "
                  "quantize picks it)");
  cmd->add_flag(
      "--export-input-scales", args->export_input_scales,
      "Static activation scales in the export (input_scale per weight, from the amax histories of a recipe with "
      "delayed scaling: fp8-delayed, fp8-o2)");
  cmd->add_option("--parallel", args->parallel,
                  "none (default), ddp (data parallel over the ranks of mpirun: each trains on its rows of the "
                  "global --batch) or fsdp (ddp with weights, gradients and AdamW state sharded: weights gathered "
                  "in their GEMM's format, FP8 under FP8 recipes)");
  cmd->add_option("--grad-reduce", args->grad_reduce,
                  "Gradient payload of --parallel ddp|fsdp: fp32 (default), bf16, fp8 (e5m2), e4m3, e5m2");
  cmd->add_flag("--force", args->force,
                "Replace existing --save-checkpoint / --export-fp8 outputs, and --plot / --profile / --log-scales "
                "files that are not earlier reports of train");
  // Hidden: the fault tests' switch (a rank that throws, or kills itself, at a step).
  cmd->add_option("--inject-rank-failure", args->inject_rank_failure, "")->group("");
  cmd->callback([args, cmd] {
    TrainArgs a = *args;
    a.model_given = cmd->count("--model") > 0;
    a.seed_given = cmd->count("--seed") > 0;
    a.seeds_given = cmd->count("--seeds") > 0;
    a.batch_given = cmd->count("--batch") > 0;
    a.steps_given = cmd->count("--steps") > 0;
    a.data_given = cmd->count("--data") > 0;
    a.conv_area_given = cmd->count("--fp8-conv-max-kernel-area") > 0;
    a.inject_nan_given = cmd->count("--inject-nan") > 0;
    a.threads_given = cmd->count("--threads") > 0;
    a.eval_batches_given = cmd->count("--eval-batches") > 0;
    a.on_nonfinite_given = cmd->count("--on-nonfinite") > 0;
    run(a);
  });
}

}  // namespace fp8kit::cli
