// im2col, col2im and the NCHW <-> rows reshuffles on the CPU: OpenMP over rows or planes, each output element
// written by one thread in a fixed order (results do not depend on the thread count).
#include "fp8kit/nn/conv_utils.hpp"

#include <algorithm>
#include <string>

#include "fp8kit/common/error.hpp"
#include "nn_util.hpp"

namespace fp8kit::nn {
namespace {

using detail::kParallelWork;
using detail::shape_string;

constexpr std::int64_t kMaxWindow = std::int64_t{1} << 31;  // keeps H + 2 * pad far from overflow

std::int64_t output_size(const char* dim, std::int64_t in, std::int64_t kernel, std::int64_t stride, std::int64_t pad) {
  FP8KIT_CHECK(kernel >= 1 && kernel <= kMaxWindow, "conv geometry: kernel ", dim, " must be in [1, 2^31], got ",
               kernel);
  FP8KIT_CHECK(stride >= 1 && stride <= kMaxWindow, "conv geometry: stride ", dim, " must be in [1, 2^31], got ",
               stride);
  FP8KIT_CHECK(pad >= 0 && pad <= kMaxWindow, "conv geometry: padding ", dim, " must be in [0, 2^31], got ", pad);
  const std::int64_t padded = in + 2 * pad;
  FP8KIT_CHECK(kernel <= padded, "conv geometry: kernel ", dim, " ", kernel, " is larger than the padded input ",
               padded, " (input ", in, " + 2 * padding ", pad, ")");
  return (padded - kernel) / stride + 1;
}

std::string describe(const ConvGeometry& g) {
  const Window2d& w = g.window;
  return shape_string(g.input_shape()) + " k" + std::to_string(w.kernel_h) + "x" + std::to_string(w.kernel_w) + " s" +
         std::to_string(w.stride_h) + "x" + std::to_string(w.stride_w) + " p" + std::to_string(w.pad_h) + "x" +
         std::to_string(w.pad_w);
}

}  // namespace

ConvGeometry ConvGeometry::make(const Shape& input, const Window2d& window) {
  FP8KIT_CHECK(input.size() == 4, "conv geometry: input must be (N, C, H, W), got ", shape_string(input));
  FP8KIT_CHECK(input[0] >= 0 && input[1] >= 1 && input[2] >= 1 && input[3] >= 1,
               "conv geometry: input (N, C, H, W) needs N >= 0 and C, H, W >= 1, got ", shape_string(input));
  ConvGeometry g;
  g.batch = input[0];
  g.channels = input[1];
  g.height = input[2];
  g.width = input[3];
  g.window = window;
  g.out_h = output_size("height", g.height, window.kernel_h, window.stride_h, window.pad_h);
  g.out_w = output_size("width", g.width, window.kernel_w, window.stride_w, window.pad_w);
  // rows(), cols() and the im2col matrix they span stay countable in int64 (kernel 2^31 x 2^31 alone is 2^62).
  std::int64_t rows = 0, cols = 0, elements = 0;
  FP8KIT_CHECK(!__builtin_mul_overflow(g.batch, g.out_h, &rows) && !__builtin_mul_overflow(rows, g.out_w, &rows) &&
                   !__builtin_mul_overflow(g.channels, window.kernel_h, &cols) &&
                   !__builtin_mul_overflow(cols, window.kernel_w, &cols) &&
                   !__builtin_mul_overflow(rows, cols, &elements),
               "conv geometry: ", describe(g), " has an im2col matrix (N*OH*OW x C*kh*kw) past 2^63 elements");
  return g;
}

// x (N, C, H, W) -> cols (N*OH*OW, C*kh*kw).
Tensor im2col(const Context& ctx, const Tensor& x, const ConvGeometry& g) {
  ScopedEvent event(ctx.profiler, "im2col");
  FP8KIT_CHECK(x.dtype() == DType::float32, "im2col: x must be float32, got ", name(x.dtype()));
  FP8KIT_CHECK(x.shape() == g.input_shape(), "im2col: x ", shape_string(x.shape()),
               " does not match the geometry's input ", shape_string(g.input_shape()));
  event.arg("shape", describe(g));
  const Window2d& w = g.window;
  const std::int64_t H = g.height, W = g.width, C = g.channels, OH = g.out_h, OW = g.out_w;
  const std::int64_t kh = w.kernel_h, kw = w.kernel_w, ncols = g.cols();
  Tensor cols = empty({g.rows(), ncols}, DType::float32);
  const float* in = x.data<float>();
  float* out = cols.data<float>();
  const bool parallel = static_cast<double>(g.rows()) * static_cast<double>(ncols) >= kParallelWork;

#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (parallel)
  for (std::int64_t noy = 0; noy < g.batch * OH; ++noy) {
    const std::int64_t n = noy / OH, oy = noy % OH;
    const float* img = in + n * C * H * W;
    for (std::int64_t ox = 0; ox < OW; ++ox) {
      float* row = out + (noy * OW + ox) * ncols;
      const std::int64_t y0 = oy * w.stride_h - w.pad_h, x0 = ox * w.stride_w - w.pad_w;
      for (std::int64_t c = 0; c < C; ++c) {
        for (std::int64_t ky = 0; ky < kh; ++ky) {
          float* dst = row + (c * kh + ky) * kw;
          const std::int64_t iy = y0 + ky;
          if (iy < 0 || iy >= H) {
            std::fill(dst, dst + kw, 0.0f);
            continue;
          }
          const float* src = img + (c * H + iy) * W;
          for (std::int64_t kx = 0; kx < kw; ++kx) {
            const std::int64_t ix = x0 + kx;
            dst[kx] = (ix >= 0 && ix < W) ? src[ix] : 0.0f;
          }
        }
      }
    }
  }
  return cols;
}

// cols (N*OH*OW, C*kh*kw) -> dx (N, C, H, W).
Tensor col2im(const Context& ctx, const Tensor& cols, const ConvGeometry& g) {
  ScopedEvent event(ctx.profiler, "col2im");
  FP8KIT_CHECK(cols.dtype() == DType::float32, "col2im: cols must be float32, got ", name(cols.dtype()));
  const Shape want{g.rows(), g.cols()};
  FP8KIT_CHECK(cols.shape() == want, "col2im: cols ", shape_string(cols.shape()),
               " must be (N*OH*OW, C*kh*kw) = ", shape_string(want), " for the geometry ", describe(g));
  event.arg("shape", describe(g));
  const Window2d& w = g.window;
  const std::int64_t H = g.height, W = g.width, C = g.channels, OH = g.out_h, OW = g.out_w;
  const std::int64_t kh = w.kernel_h, kw = w.kernel_w, ncols = g.cols();
  Tensor dx = zeros(g.input_shape(), DType::float32);
  const float* in = cols.data<float>();
  float* out = dx.data<float>();
  const bool parallel = static_cast<double>(g.rows()) * static_cast<double>(ncols) >= kParallelWork;

  // One (n, c) plane per iteration: its sums run over (oy, ox, ky, kx) in order, whatever the thread count.
#pragma omp parallel for num_threads(::fp8kit::num_threads()) schedule(static) if (parallel)
  for (std::int64_t nc = 0; nc < g.batch * C; ++nc) {
    const std::int64_t n = nc / C, c = nc % C;
    float* plane = out + nc * H * W;
    for (std::int64_t oy = 0; oy < OH; ++oy) {
      for (std::int64_t ox = 0; ox < OW; ++ox) {
        const float* row = in + ((n * OH + oy) * OW + ox) * ncols + c * kh * kw;
        const std::int64_t y0 = oy * w.stride_h - w.pad_h, x0 = ox * w.stride_w - w.pad_w;
        for (std::int64_t ky = 0; ky < kh; ++ky) {
          const std::int64_t iy = y0 + ky;
          if (iy < 0 || iy >= H) continue;
          float* dst = plane + iy * W;
          for (std::int64_t kx = 0; kx < kw; ++kx) {
            const std::int64_t ix = x0 + kx;
            if (ix >= 0 && ix < W) dst[ix] += row[ky * kw + kx];
          }
        }
      }
    }
  }
  return dx;
}

// rows (N*H*W, C) -> y (N, C, H, W).
Tensor rows_to_nchw(const Context& ctx, const Tensor& rows, std::int64_t n, std::int64_t h, std::int64_t w) {
  ScopedEvent event(ctx.profiler, "rows_to_nchw");
  FP8KIT_CHECK(rows.dtype() == DType::float32, "rows_to_nchw: rows must be float32, got ", name(rows.dtype()));
  std::int64_t nh = 0, nhw = 0;
  FP8KIT_CHECK(n >= 0 && h >= 0 && w >= 0 && !__builtin_mul_overflow(n, h, &nh) && !__builtin_mul_overflow(nh, w, &nhw),
               "rows_to_nchw: sizes must be >= 0 with N*H*W within int64, got N=", n, " H=", h, " W=", w);
  FP8KIT_CHECK(rows.dim() == 2 && rows.size(0) == n * h * w, "rows_to_nchw: rows ", shape_string(rows.shape()),
               " must be (N*H*W, C) with N*H*W = ", n * h * w);
  const std::int64_t C = rows.size(1), hw = h * w;
  event.arg("shape", shape_string(rows.shape()));
  Tensor y = empty({n, C, h, w}, DType::float32);
  const float* in = rows.data<float>();
  float* out = y.data<float>();
  for (std::int64_t b = 0; b < n; ++b) detail::transpose_into(in + b * hw * C, C, out + b * C * hw, hw, C);
  return y;
}

Tensor rows_to_nchw(const Context& ctx, const Tensor& rows, const ConvGeometry& g) {
  return rows_to_nchw(ctx, rows, g.batch, g.out_h, g.out_w);
}

// y (N, C, H, W) -> rows (N*H*W, C).
Tensor nchw_to_rows(const Context& ctx, const Tensor& y) {
  ScopedEvent event(ctx.profiler, "nchw_to_rows");
  FP8KIT_CHECK(y.dtype() == DType::float32, "nchw_to_rows: y must be float32, got ", name(y.dtype()));
  FP8KIT_CHECK(y.dim() == 4, "nchw_to_rows: y must be (N, C, H, W), got ", shape_string(y.shape()));
  const std::int64_t n = y.size(0), C = y.size(1), hw = y.size(2) * y.size(3);
  event.arg("shape", shape_string(y.shape()));
  Tensor rows = empty({n * hw, C}, DType::float32);
  const float* in = y.data<float>();
  float* out = rows.data<float>();
  for (std::int64_t b = 0; b < n; ++b) detail::transpose_into(in + b * C * hw, hw, out + b * hw * C, C, hw);
  return rows;
}

}  // namespace fp8kit::nn
