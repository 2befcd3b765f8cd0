// The training-checkpoint loader behind `fp8kit train --resume` on any header: at start the harness trains the
// small run below for one step and saves its checkpoint (deterministic: the same bytes every time); each input is
// a JSON header put in front of that checkpoint's data section. read_train_checkpoint_info reads the metadata,
// load_train_checkpoint checks it against the run and restores a fresh model and optimizer from the tensors the
// header locates — every outcome a restore or a refusal with one line. The seed is the checkpoint's own header.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fp8kit/io/train_checkpoint.hpp"
#include "fp8kit/nn/train.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace fp8kit;

nn::TrainConfig run_config() {
  nn::TrainConfig c;
  c.model = "gpt";
  c.steps = 1;
  c.seed = 5;
  c.eval_batches = 1;
  return c;
}

nn::PrecisionRecipe run_recipe() {
  return *nn::PrecisionRecipe::parse("fp8-delayed");
}

// The checkpoint the run saves, split at the end of its header: the header's text, and the data section after it.
struct Saved {
  std::string header;
  std::vector<std::uint8_t> data;
};
const Saved& saved() {
  static const Saved s = [] {
    const std::filesystem::path path = fuzz::scratch() / "saved.safetensors";
    TrainCheckpointOptions options;
    options.save_checkpoint = path.string();
    train_with_checkpoints(run_config(), run_recipe(), options);
    std::ifstream in(path, std::ios::binary);
    const std::vector<std::uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::uint64_t n = 0;
    std::memcpy(&n, file.data(), sizeof n);
    const auto end = file.begin() + 8 + static_cast<std::ptrdiff_t>(n);
    return Saved{std::string(file.begin() + 8, end), std::vector<std::uint8_t>(end, file.end())};
  }();
  return s;
}

}  // namespace

// The run trains here, before the first input (its seconds are not an input's time). `-print_seed_header=1` (a
// harness flag, not libFuzzer's): prints the saved checkpoint's header, the seed, and exits.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const Saved& s = saved();
  for (int i = 1; i < *argc; ++i) {
    if (std::string((*argv)[i]) != "-print_seed_header=1") continue;
    std::fwrite(s.header.data(), 1, s.header.size(), stdout);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::vector<std::uint8_t>& tensors = saved().data;
  std::vector<std::uint8_t> file(8 + size + tensors.size());
  const std::uint64_t header = size;
  std::memcpy(file.data(), &header, sizeof header);
  if (size > 0) std::memcpy(file.data() + 8, data, size);
  std::memcpy(file.data() + 8 + size, tensors.data(), tensors.size());
  const std::filesystem::path path = fuzz::scratch() / "resume.safetensors";
  fuzz::write_file(path, file);

  TrainCheckpointInfo info;
  if (!fuzz::accepted([&] { info = read_train_checkpoint_info(path); })) return 0;
  const nn::TrainConfig config = run_config();
  const nn::PrecisionRecipe recipe = run_recipe();
  // One model for every input (building one per input took most of the time): a load checks everything before it
  // writes anything, so a refused input leaves it as it was and an accepted one overwrites all of it.
  static const auto model = nn::make_model(config, recipe);
  fuzz::accepted([&] {
    nn::AdamW optimizer;
    const nn::TrainProgress progress = load_train_checkpoint(path, config, recipe, *model, optimizer);
    fuzz::check(progress.next_step == info.next_step, "load_train_checkpoint's step is not the metadata's");
  });
  return 0;
}
