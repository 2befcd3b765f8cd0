// Delayed scaling on the device (scaling/cuda_recipe.hpp): the state in device memory, the history a ring (the roll
// moves an index, not the window), the quantization as three kernels in a row (the amax of x, which also encodes x
// once the state is calibrated; one thread for this step's scale and the record; the encode reading that scale,
// which returns at once where the first did it) and the update as one CUDA block. The arithmetic is
// DelayedScaling's (src/scaling/recipe.cpp) and prepare_operand's (src/nn/precision.cpp), operation for operation.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "common/cuda/kernel_util.cuh"
#include "fp8kit/common/error.hpp"
#include "fp8kit/scaling/cuda_recipe.hpp"
#include "fp8kit/scaling/scale_inline.hpp"
#include "scaling/cuda/tensor_kernels.cuh"

namespace fp8kit {
namespace {

using namespace cuda_detail;

// meta_'s four words.
struct Meta {
  int pos;           // the ring index of slot 0
  int calibrated;    // an update has computed the scale from a finite, nonzero amax
  int has_smoothed;  // the EMA has a value
  float smoothed;
};
static_assert(sizeof(Meta) == 16);

struct DelayedSpec {
  float fp8_max = 0.0f;
  int margin = 0;
  int length = 1;
  bool most_recent = false;
  bool ema = false;
  float decay = 0.0f;
};

DelayedSpec spec_of(const DelayedScalingConfig& c) {
  return {static_cast<float>(max_finite(c.format)),
          c.margin,
          c.history_length,
          c.algorithm == AmaxCompute::kMostRecent,
          c.ema_decay.has_value(),
          c.ema_decay.value_or(0.0f)};
}

// This step's scale (the state's once calibrated; else this step's own amax's, or the previous scale when x is not
// finite), 1 / it, and the record of x's amax into slot 0 (NaN sticks).
__global__ void delayed_scale_kernel(const unsigned* amax_bits, const unsigned* nonfinite, DelayedSpec spec,
                                     const float* state_scale, Meta* meta, float* history, float* multiplier,
                                     float* scale_inv) {
  const float amax = __uint_as_float(*amax_bits);
  const bool bad = *nonfinite != 0;
  const float previous = *state_scale;
  const float scale = (meta->calibrated != 0 || bad)
                          ? previous
                          : scale_detail::scale_from_amax(amax, spec.fp8_max, ScaleOptions{spec.margin}, previous);
  float* slot0 = history + meta->pos;
  *slot0 = (bad || isnan(*slot0)) ? __uint_as_float(0x7FC00000u) : fmaxf(*slot0, amax);
  *multiplier = scale;
  *scale_inv = 1.0f / scale;
}

// The amax pass of a step, which once the state is calibrated also encodes x: this step's scale is then the state's
// whatever x holds (delayed_scale_kernel keeps it), so x is read once, and the encode after delayed_scale_kernel
// returns at once (its skip is meta->calibrated). Before that the pass only records the amax, and the encode waits
// for the scale computed from it.
template <Format F, typename T>
__global__ void delayed_amax_kernel(const T* x, std::int64_t n, bool vectors, unsigned* amax_bits, unsigned* nonfinite,
                                    const Meta* meta, const float* state_scale, EncodeSpec encode,
                                    std::uint8_t* codes) {
  const bool calibrated = meta->calibrated != 0;
  const float scale = *state_scale;
  amax_bits_pass(x, n, vectors, amax_bits, nonfinite, [&](std::int64_t i, const auto& v) {
    if (calibrated) encode_at<F, T>(i, v, scale, encode, codes);
  });
}

// DelayedScaling::update(): one CUDA block (the window's fmax split over its threads).
__global__ void update_kernel(DelayedSpec spec, float* state_scale, float* state_scale_inv, Meta* meta,
                              float* history) {
  __shared__ float partial[kThreads];
  const int pos = meta->pos;
  if (history[pos] == 0.0f) return;  // nothing recorded this step: no roll, no new scale
  float amax = history[pos];
  if (!spec.most_recent) {
    float m = 0.0f;  // fmaxf ignores NaN, as the CPU's std::fmax and Transformer Engine's reduction do
    for (int i = static_cast<int>(threadIdx.x); i < spec.length; i += kThreads) m = fmaxf(m, history[i]);
    partial[threadIdx.x] = m;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (static_cast<int>(threadIdx.x) < half)
        partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + half]);
      __syncthreads();
    }
    amax = partial[0];
  }
  if (threadIdx.x != 0) return;
  if (spec.ema && isfinite(amax)) {
    meta->smoothed = meta->has_smoothed != 0 ? spec.decay * meta->smoothed + (1.0f - spec.decay) * amax : amax;
    meta->has_smoothed = 1;
    amax = meta->smoothed;
  }
  const float scale = scale_detail::scale_from_amax(amax, spec.fp8_max, ScaleOptions{spec.margin}, *state_scale);
  *state_scale = scale;
  *state_scale_inv = 1.0f / scale;
  if (isfinite(amax) && amax > 0.0f) meta->calibrated = 1;
  // The roll: slot i takes slot i + 1 and the last slot this step's amax (the ring moves by one), slot 0 cleared.
  const int next = spec.length > 1 ? (pos + 1) % spec.length : pos;
  history[next] = 0.0f;
  meta->pos = next;
}

Tensor scalar_on(float value, const Device& device) {
  return full({}, value, DType::float32, device);
}

}  // namespace

namespace cuda {

DelayedScalingState::DelayedScalingState(const DelayedScalingConfig& config, int device)
    : DelayedScalingState(DelayedScaling(config), device) {}

DelayedScalingState::DelayedScalingState(const DelayedScaling& host, int device)
    : config_(host.config()), device_(device) {
  const Device gpu = Device::cuda(device);
  check_available(gpu);
  scale_ = scalar_on(host.scale(), gpu);
  scale_inv_ = scalar_on(host.scale_inv(), gpu);
  Tensor history = empty({config_.history_length}, DType::float32);
  std::memcpy(history.data_ptr(), host.history().data(), host.history().size_bytes());
  history_ = history.to(gpu);
  Tensor meta = zeros({4}, DType::int32);
  Meta m{0, host.calibrated() ? 1 : 0, host.smoothed_amax() ? 1 : 0, host.smoothed_amax().value_or(0.0f)};
  std::memcpy(meta.data_ptr(), &m, sizeof(m));
  meta_ = meta.to(gpu);
}

DelayedScaling DelayedScalingState::to_host() const {
  const Tensor history = history_.to(Device::cpu()), meta = meta_.to(Device::cpu());
  Meta m{};
  std::memcpy(&m, meta.data_ptr(), sizeof(m));
  const std::span<const float> ring = history.span<float>();
  std::vector<float> slots(ring.size());
  for (std::size_t i = 0; i < ring.size(); ++i) slots[i] = ring[(static_cast<std::size_t>(m.pos) + i) % ring.size()];
  const float scale = static_cast<float>(scale_.to(Device::cpu()).item_as_double(0));
  return DelayedScaling::from_parts(config_, scale, m.has_smoothed != 0 ? std::optional(m.smoothed) : std::nullopt,
                                    m.calibrated != 0, slots);
}

QuantizedTensor quantize_delayed(const Tensor& x, DelayedScalingState& state, Overflow overflow) {
  const Device gpu = Device::cuda(state.device_);
  FP8KIT_CHECK(x.device() == gpu, "cuda::quantize_delayed: x is on ", to_string(x.device()), " and the state on ",
               to_string(gpu), ": move x with .to(Device::cuda(", state.device_, "))");
  use_device(state.device_);
  const MatrixRef shape = x.matrix();
  const std::int64_t n = shape.rows * shape.cols;
  const Format format = state.config_.format;
  QuantizedTensor q;
  q.format = format;
  q.overflow = overflow;
  q.granularity = Granularity::tensor();
  q.original_dtype = x.dtype();
  q.codes = empty({shape.rows, shape.cols}, dtype_of(format), gpu);
  q.scale_inv = empty({1, 1}, DType::float32, gpu);
  const Tensor work = zeros({2}, DType::int32, gpu);  // the amax's float bits, and whether x is not finite
  const Tensor multiplier = empty({}, DType::float32, gpu);
  auto* amax_bits = static_cast<unsigned*>(work.data_ptr());
  auto* m = static_cast<float*>(multiplier.data_ptr());
  const EncodeSpec encode{format, overflow, Rounding::kNearestEven};
  const cudaStream_t stream = stream_of(state.device_);
  auto* meta = static_cast<Meta*>(state.meta_.data_ptr());
  const auto* state_scale = static_cast<const float*>(state.scale_.data_ptr());
  auto* codes = static_cast<std::uint8_t*>(q.codes.data_ptr());
  with_float_type(x.dtype(), "cuda::quantize_delayed: x", [&]<typename T>() {
    const auto* in = static_cast<const T*>(x.data_ptr());
    with_element_format(format, "cuda::quantize_delayed", [&]<Format F>() {
      const bool vectors = tensor_vectors(in, codes);
      if (n != 0) {
        delayed_amax_kernel<F><<<blocks_for_vectors<Vec16<T>::kElems>(n, vectors, 4096), kThreads, 0, stream>>>(
            in, n, vectors, amax_bits, amax_bits + 1, meta, state_scale, encode, codes);
      }
      delayed_scale_kernel<<<1, 1, 0, stream>>>(amax_bits, amax_bits + 1, spec_of(state.config_), state_scale, meta,
                                                static_cast<float*>(state.history_.data_ptr()), m,
                                                static_cast<float*>(q.scale_inv.data_ptr()));
      if (n != 0) launch_encode_tensor<F>(in, n, m, encode, codes, stream, &meta->calibrated);
    });
  });
  check_launch("cuda::quantize_delayed", state.device_);
  return q;
}

void update(DelayedScalingState& state) {
  use_device(state.device_);
  update_kernel<<<1, kThreads, 0, stream_of(state.device_)>>>(
      spec_of(state.config_), static_cast<float*>(state.scale_.data_ptr()),
      static_cast<float*>(state.scale_inv_.data_ptr()), static_cast<Meta*>(state.meta_.data_ptr()),
      static_cast<float*>(state.history_.data_ptr()));
  check_launch("cuda::update (delayed scaling)", state.device_);
}

}  // namespace cuda
}  // namespace fp8kit
