// Max pooling and global average pooling on the CPU: OpenMP over (n, c) planes, each plane computed by one thread
// in a fixed order (overlapping max-pool windows add their gradients in the same order whatever the threads).
#include "fp8kit/nn/pooling.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "fp8kit/common/error.hpp"
#include "nn_util.hpp"

namespace fp8kit::nn {
namespace {

using detail::kParallelWork;
using detail::shape_string;

}  // namespace

// x (N, C, H, W) -> y (N, C, OH, OW); saved.argmax (N, C, OH, OW).
Tensor MaxPool2d::forward(const Context& ctx, const Tensor& x, Saved& saved) const {
  ScopedEvent event(ctx.profiler, "maxpool2d.forward");
  FP8KIT_CHECK(x.dtype() == DType::float32, "maxpool2d: x must be float32, got ", name(x.dtype()));
  const ConvGeometry g = ConvGeometry::make(x.shape(), window);
  FP8KIT_CHECK(2 * window.pad_h <= window.kernel_h && 2 * window.pad_w <= window.kernel_w, "maxpool2d: padding ",
               window.pad_h, "x", window.pad_w, " must be at most half the kernel ", window.kernel_h, "x",
               window.kernel_w);
  event.arg("shape", shape_string(x.shape()));
  const std::int64_t H = g.height, W = g.width, OH = g.out_h, OW = g.out_w;
  Tensor y = empty(g.output_shape(g.channels), DType::float32);
  Tensor argmax = empty(g.output_shape(g.channels), DType::int64);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  std::int64_t* arg = argmax.data<std::int64_t>();
  const double work = static_cast<double>(y.numel()) * static_cast<double>(window.kernel_h * window.kernel_w);

#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (work >= kParallelWork)
  for (std::int64_t nc = 0; nc < g.batch * g.channels; ++nc) {
    const float* plane = in + nc * H * W;
    for (std::int64_t oy = 0; oy < OH; ++oy) {
      const std::int64_t y0 = oy * window.stride_h - window.pad_h;
      const std::int64_t ya = std::max<std::int64_t>(y0, 0), yb = std::min(y0 + window.kernel_h, H);
      for (std::int64_t ox = 0; ox < OW; ++ox) {
        const std::int64_t x0 = ox * window.stride_w - window.pad_w;
        const std::int64_t xa = std::max<std::int64_t>(x0, 0), xb = std::min(x0 + window.kernel_w, W);
        // pad <= kernel / 2 puts at least one pixel in every window: (ya, xa) is in the plane.
        std::int64_t best_i = ya * W + xa;
        float best = plane[best_i];
        for (std::int64_t iy = ya; iy < yb; ++iy) {
          for (std::int64_t ix = xa; ix < xb; ++ix) {
            const float v = plane[iy * W + ix];
            if (v > best || (std::isnan(v) && !std::isnan(best))) {
              best = v;
              best_i = iy * W + ix;
            }
          }
        }
        out[(nc * OH + oy) * OW + ox] = best;
        arg[(nc * OH + oy) * OW + ox] = best_i;
      }
    }
  }
  saved.input_shape = x.shape();
  saved.argmax = std::move(argmax);
  return y;
}

// dy (N, C, OH, OW) -> dx (N, C, H, W).
Tensor MaxPool2d::backward(const Context& ctx, const Tensor& dy, const Saved& saved) const {
  ScopedEvent event(ctx.profiler, "maxpool2d.backward");
  FP8KIT_CHECK(saved.input_shape.size() == 4 && saved.argmax.dtype() == DType::int64,
               "maxpool2d.backward: no saved state (call forward first)");
  FP8KIT_CHECK(dy.dtype() == DType::float32, "maxpool2d.backward: dy must be float32, got ", name(dy.dtype()));
  FP8KIT_CHECK(dy.shape() == saved.argmax.shape(), "maxpool2d.backward: dy ", shape_string(dy.shape()),
               " must be the output shape ", shape_string(saved.argmax.shape()));
  event.arg("shape", shape_string(saved.input_shape));
  const std::int64_t planes = saved.input_shape[0] * saved.input_shape[1];
  const std::int64_t hw = saved.input_shape[2] * saved.input_shape[3];
  const std::int64_t ohw = dy.size(2) * dy.size(3);
  Tensor dx = zeros(saved.input_shape, DType::float32);
  const float* g = dy.data<float>();
  const std::int64_t* arg = saved.argmax.data<std::int64_t>();
  float* out = dx.data<float>();
  // Each index within its own plane (as Embedding checks its saved ids), checked in the same pass: a Saved of
  // another layer, or one changed since, wrote outside dx or into the next channel's gradient.
  bool outside = false;
#pragma omp parallel for num_threads(::fp8kit::num_threads()) reduction(||         \
                                                                        : outside) \
    schedule(static) if (static_cast <double>(dx.numel() + dy.numel()) >= kParallelWork)
  for (std::int64_t nc = 0; nc < planes; ++nc) {
    float* plane = out + nc * hw;
    for (std::int64_t p = 0; p < ohw; ++p) {
      const std::int64_t at = arg[nc * ohw + p];
      if (at < 0 || at >= hw) {
        outside = true;
        continue;
      }
      plane[at] += g[nc * ohw + p];
    }
  }
  FP8KIT_CHECK(!outside, "maxpool2d.backward: a saved argmax is outside its ", saved.input_shape[2], "x",
               saved.input_shape[3], " plane (a Saved of another layer?)");
  return dx;
}

// x (N, C, H, W) -> y (N, C).
Tensor GlobalAvgPool2d::forward(const Context& ctx, const Tensor& x, Saved& saved) const {
  ScopedEvent event(ctx.profiler, "global_avg_pool2d.forward");
  FP8KIT_CHECK(x.dtype() == DType::float32, "global_avg_pool2d: x must be float32, got ", name(x.dtype()));
  FP8KIT_CHECK(x.dim() == 4 && x.size(2) * x.size(3) > 0,
               "global_avg_pool2d: x must be (N, C, H, W) with H, W >= 1, got ", shape_string(x.shape()));
  event.arg("shape", shape_string(x.shape()));
  const std::int64_t planes = x.size(0) * x.size(1), hw = x.size(2) * x.size(3);
  Tensor y = empty({x.size(0), x.size(1)}, DType::float32);
  const float* in = x.data<float>();
  float* out = y.data<float>();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) \
    schedule(static) if (static_cast <double>(x.numel()) >= kParallelWork)
  for (std::int64_t nc = 0; nc < planes; ++nc) {
    double sum = 0.0;
    for (std::int64_t p = 0; p < hw; ++p) sum += in[nc * hw + p];
    out[nc] = static_cast<float>(sum / static_cast<double>(hw));
  }
  saved.input_shape = x.shape();
  return y;
}

// dy (N, C) -> dx (N, C, H, W).
Tensor GlobalAvgPool2d::backward(const Context& ctx, const Tensor& dy, const Saved& saved) const {
  ScopedEvent event(ctx.profiler, "global_avg_pool2d.backward");
  FP8KIT_CHECK(saved.input_shape.size() == 4, "global_avg_pool2d.backward: no saved state (call forward first)");
  FP8KIT_CHECK(dy.dtype() == DType::float32, "global_avg_pool2d.backward: dy must be float32, got ", name(dy.dtype()));
  const Shape want{saved.input_shape[0], saved.input_shape[1]};
  FP8KIT_CHECK(dy.shape() == want, "global_avg_pool2d.backward: dy ", shape_string(dy.shape()),
               " must be the output shape ", shape_string(want));
  event.arg("shape", shape_string(saved.input_shape));
  const std::int64_t planes = want[0] * want[1], hw = saved.input_shape[2] * saved.input_shape[3];
  const float inv = static_cast<float>(1.0 / static_cast<double>(hw));
  Tensor dx = empty(saved.input_shape, DType::float32);
  const float* g = dy.data<float>();
  float* out = dx.data<float>();
#pragma omp parallel for num_threads(::fp8kit::num_threads()) \
    schedule(static) if (static_cast <double>(dx.numel()) >= kParallelWork)
  for (std::int64_t nc = 0; nc < planes; ++nc) {
    const float v = g[nc] * inv;
    for (std::int64_t p = 0; p < hw; ++p) out[nc * hw + p] = v;
  }
  return dx;
}

}  // namespace fp8kit::nn
