// cuda::quantize and cuda::dequantize (scaling/cuda_quantize.hpp). Blocked granularities (row, column, any block,
// MX): one group of threads per scaling block; the group takes the block's amax (the largest finite |x|, as float
// bits: non-negative floats order as their unsigned bits), turns it into the block's scales with the CPU's formula,
// and encodes the block with the CPU's codec. Where the shapes allow four-element vector loads: float32 1 x bc rows
// (bc <= 128: a lane holds its four elements, several blocks in flight a warp; longer rows: a warp a block) and
// blocks of at least 1024 elements (128 x 128: a CUDA block a scaling block); elsewhere element-wise, a warp for
// blocks of at most 1024 elements, the CUDA block for larger ones. Per tensor: an amax pass into one device word, a
// one-thread kernel for the scale, and the encode reading it from device memory: no host sync anywhere.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cuda/kernel_util.cuh"
#include "fp8kit/common/error.hpp"
#include "fp8kit/format/codec_inline.hpp"
#include "fp8kit/scaling/cuda_quantize.hpp"
#include "fp8kit/scaling/scale_inline.hpp"
#include "scaling/cuda/tensor_kernels.cuh"

namespace fp8kit {
namespace {

using namespace cuda_detail;

// What a block's scales are computed from (the options, and the element format's constants).
struct ScaleSpec {
  ScaleOptions scale;
  float fp8_max = 0.0f;         // the format's largest finite value
  int emax_elem = 0;            // MX: the exponent of its largest normal
  float max_reciprocal = 0.0f;  // MX RCEIL: 1 / fp8_max as a float
  bool mx = false, rceil = false;
};

ScaleSpec scale_spec(const QuantizeOptions& options) {
  ScaleSpec s;
  s.scale = options.scale;
  s.fp8_max = static_cast<float>(max_finite(options.format));
  const scale_detail::MxConstants mx = scale_detail::mx_constants(options.format);
  s.emax_elem = mx.emax_elem;
  s.max_reciprocal = mx.max_reciprocal;
  s.mx = options.granularity.kind == Granularity::Kind::kMx;
  s.rceil = options.granularity.mx_mode == MxScaleMode::kRceil;
  return s;
}

// The block's quantization multiplier from its amax; its dequantization scale (and E8M0 code) written out.
__device__ float block_scale(float amax, const ScaleSpec& s, float* scale_inv, std::uint8_t* e8m0) {
  if (s.mx) {
    const std::uint8_t code = scale_detail::mx_code(amax, s.emax_elem, s.max_reciprocal, s.rceil);
    *e8m0 = code;
    *scale_inv = scale_detail::mx_value(code);
    return code == 0xFF ? *scale_inv : scale_detail::pow2f(127 - code);
  }
  const float multiplier = scale_detail::scale_from_amax(amax, s.fp8_max, s.scale, 1.0f);
  *scale_inv = 1.0f / multiplier;
  return multiplier;
}

// The four codes of a quad, as one word.
template <Format F, typename T>
__device__ inline std::uint32_t encode_quad(const Quad<T>& q, float multiplier, const EncodeSpec& encode) {
  std::uint32_t word;
  encode_group<F>(q, multiplier, encode, 0, 0, &word);
  return word;
}

// 1 x bc blocks of more than 128 elements of a float32 matrix (rows; bc a multiple of 4, cols a multiple of bc): a
// warp a block over its quads, the amax reduced with shuffles, the block read again and its codes stored four at a
// time. The same values in the same formula as quantize_blocks.
template <Format F>
__global__ void quantize_rows4(const Quad<float>* x, std::int64_t cols4, std::int64_t bc4, std::int64_t grid_cols,
                               std::int64_t blocks, ScaleSpec spec, EncodeSpec encode, std::uint32_t* codes,
                               float* scale_inv, std::uint8_t* e8m0) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t b = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; b < blocks;
       b += warps) {
    const std::int64_t base = (b / grid_cols) * cols4 + (b % grid_cols) * bc4;
    unsigned m = 0;
#pragma unroll 4
    for (std::int64_t i = lane; i < bc4; i += 32) m = max(m, finite_magnitude(x[base + i]));
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    // Every lane computes the same scales from the same amax; the first one stores them.
    float si = 0.0f;
    std::uint8_t code = 0;
    const float multiplier = block_scale(__uint_as_float(m), spec, &si, &code);
    if (lane == 0) {
      scale_inv[b] = si;
      if (e8m0 != nullptr) e8m0[b] = code;
    }
    for (std::int64_t i = lane; i < bc4; i += 32) codes[base + i] = encode_quad<F>(x[base + i], multiplier, encode);
  }
}

constexpr int kShortRowSteps = 4;  // the warp steps of quantize_short_rows4 in flight

// 1 x bc blocks of at most 128 float32 elements (1 x 128, MX's 1 x 32; bc / 4 dividing 32, cols a multiple of bc):
// lanes = bc / 4 lanes a block, each holding one quad of it (so the block is read once), 32 / lanes blocks a warp,
// and kShortRowSteps of the warp's grid-stride steps loaded before the first is reduced: one float4 a lane in flight
// at a time left the H200 at 0.29x of memcpy's bandwidth for 1 x 128 and MX.
template <Format F>
__global__ void quantize_short_rows4(const Quad<float>* x, std::int64_t cols4, std::int64_t bc4, std::int64_t grid_cols,
                                     std::int64_t blocks, int lanes, ScaleSpec spec, EncodeSpec encode,
                                     std::uint32_t* codes, float* scale_inv, std::uint8_t* e8m0) {
  constexpr int kUnroll = kShortRowSteps;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int sub = lane % lanes;
  const std::int64_t per_warp = 32 / lanes;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t w0 = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       w0 * per_warp < blocks; w0 += kUnroll * warps) {
    std::int64_t b[kUnroll], at[kUnroll];
    Quad<float> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      b[u] = (w0 + u * warps) * per_warp + lane / lanes;
      at[u] = b[u] < blocks ? (b[u] / grid_cols) * cols4 + (b[u] % grid_cols) * bc4 + sub : -1;
      v[u] = at[u] >= 0 ? x[at[u]] : Quad<float>{};
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      unsigned m = finite_magnitude(v[u]);
      for (int offset = lanes / 2; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
      if (at[u] < 0) continue;  // (after the shuffles, which every lane of the warp takes)
      float si = 0.0f;
      std::uint8_t code = 0;
      const float multiplier = block_scale(__uint_as_float(m), spec, &si, &code);
      if (sub == 0) {
        scale_inv[b[u]] = si;
        if (e8m0 != nullptr) e8m0[b[u]] = code;
      }
      codes[at[u]] = encode_quad<F>(v[u], multiplier, encode);
    }
  }
}

constexpr std::int64_t kMaxTileQuads = (std::int64_t{1} << 31) - 1 - kThreads;  // quantize_tiles4's int indices

// Blocks of at least 4 x kThreads elements whose columns and the matrix's come in fours (128 x 128, ...): one CUDA
// block per scaling block, its threads over the block's quads with 32-bit index arithmetic inside the block, the
// amax reduced over the CUDA block, then the quads read again (from L1/L2) and encoded, four codes a store. (The
// element-wise kernel below divided 64-bit indices per element: 0.18x of memcpy's bandwidth for 128 x 128 on the
// H200.) A scaling block of kMaxTileQuads quads or more (2^33 elements) goes element-wise instead.
template <Format F, typename T>
__global__ void quantize_tiles4(const Quad<T>* x, std::int64_t rows, std::int64_t cols4, std::int64_t br,
                                std::int64_t bc4, std::int64_t grid_cols, std::int64_t blocks, ScaleSpec spec,
                                EncodeSpec encode, std::uint32_t* codes, float* scale_inv, std::uint8_t* e8m0) {
  __shared__ unsigned warp_max[kThreads / 32];
  __shared__ float shared_multiplier;
  std::uint8_t unused_code = 0;
  for (std::int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::int64_t r0 = (b / grid_cols) * br, c0 = (b % grid_cols) * bc4;
    const int h = static_cast<int>(min(br, rows - r0)), w = static_cast<int>(min(bc4, cols4 - c0));
    const int quads = h * w;
    const Quad<T>* in = x + r0 * cols4 + c0;
    const auto at = [&](int i) { return static_cast<std::int64_t>(i / w) * cols4 + i % w; };
    unsigned m = 0;
#pragma unroll 4
    for (int i = static_cast<int>(threadIdx.x); i < quads; i += kThreads) m = max(m, finite_magnitude(in[at(i)]));
    m = group_max<kThreads>(m, warp_max);
    if (threadIdx.x == 0) {
      shared_multiplier =
          block_scale(__uint_as_float(m), spec, scale_inv + b, e8m0 != nullptr ? e8m0 + b : &unused_code);
    }
    __syncthreads();
    const float multiplier = shared_multiplier;
    std::uint32_t* out = codes + r0 * cols4 + c0;
#pragma unroll 4
    for (int i = static_cast<int>(threadIdx.x); i < quads; i += kThreads)
      out[at(i)] = encode_quad<F>(in[at(i)], multiplier, encode);
    __syncthreads();  // the shared words are reused by the next block
  }
}

template <Format F, typename T, int GROUP>
__global__ void quantize_blocks(const T* x, std::int64_t rows, std::int64_t cols, std::int64_t br, std::int64_t bc,
                                std::int64_t grid_cols, std::int64_t blocks, ScaleSpec spec, EncodeSpec encode,
                                std::uint8_t* codes, float* scale_inv, std::uint8_t* e8m0) {
  constexpr FormatDescriptor d = descriptor(F);
  constexpr int kGroups = kThreads / GROUP;
  __shared__ unsigned warp_max[kThreads / 32];
  __shared__ float multipliers[kGroups];
  std::uint8_t unused_code = 0;
  const int group = static_cast<int>(threadIdx.x) / GROUP, lane = static_cast<int>(threadIdx.x) % GROUP;
  // Every thread runs the same iterations (the barriers below), a group past the last block idles through them.
  for (std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * kGroups; base < blocks;
       base += static_cast<std::int64_t>(gridDim.x) * kGroups) {
    const std::int64_t b = base + group;
    const bool active = b < blocks;
    const std::int64_t r0 = active ? (b / grid_cols) * br : 0, c0 = active ? (b % grid_cols) * bc : 0;
    const std::int64_t h = active ? min(br, rows - r0) : 0, w = active ? min(bc, cols - c0) : 1;
    unsigned m = 0;
    for (std::int64_t i = lane; i < h * w; i += GROUP)
      m = max(m, finite_magnitude(widen(x[(r0 + i / w) * cols + c0 + i % w])));
    m = group_max<GROUP>(m, warp_max);
    if (lane == 0 && active) {
      multipliers[group] =
          block_scale(__uint_as_float(m), spec, scale_inv + b, e8m0 != nullptr ? e8m0 + b : &unused_code);
    }
    __syncthreads();
    const float multiplier = multipliers[group];
    for (std::int64_t i = lane; i < h * w; i += GROUP) {
      const std::int64_t at = (r0 + i / w) * cols + c0 + i % w;
      codes[at] = encode_value<F>(scaled(widen(x[at]), multiplier), encode, 0u);
    }
    __syncthreads();  // the shared words are reused by the next iteration
  }
}

__global__ void tensor_scale_kernel(const unsigned* amax_bits, ScaleSpec spec, float* multiplier, float* scale_inv,
                                    std::uint8_t* e8m0) {
  std::uint8_t unused_code = 0;
  *multiplier = block_scale(__uint_as_float(*amax_bits), spec, scale_inv, e8m0 != nullptr ? e8m0 : &unused_code);
}

template <Format F, typename T>
__global__ void dequantize_kernel(const std::uint8_t* codes, std::int64_t rows, std::int64_t cols, std::int64_t br,
                                  std::int64_t bc, std::int64_t grid_cols, const float* scale_inv, T* out) {
  constexpr FormatDescriptor d = descriptor(F);
  const std::int64_t n = rows * cols;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t r = i / cols, c = i % cols;
    narrow(scaled(codec_detail::decode_code(d, codes[i]), scale_inv[(r / br) * grid_cols + c / bc]), out + i);
  }
}

}  // namespace

namespace cuda {

ScaledTensor QuantizedTensor::to_host() const {
  ScaledTensor q;
  q.format = format;
  q.overflow = overflow;
  q.granularity = granularity;
  q.rows = rows();
  q.cols = cols();
  q.original_dtype = original_dtype;
  const Tensor host_codes = codes.to(Device::cpu()), host_scales = scale_inv.to(Device::cpu());
  const auto* c = static_cast<const std::uint8_t*>(host_codes.data_ptr());
  q.data.assign(c, c + host_codes.numel());
  q.scale_inv.assign(host_scales.span<float>().begin(), host_scales.span<float>().end());
  if (scale_e8m0.numel() != 0) {
    const Tensor host_e8m0 = scale_e8m0.to(Device::cpu());
    q.scale_e8m0.assign(host_e8m0.span<std::uint8_t>().begin(), host_e8m0.span<std::uint8_t>().end());
  }
  return q;
}

QuantizedTensor quantize(const Tensor& x, const QuantizeOptions& options) {
  FP8KIT_CHECK(!x.device().is_cpu(), "cuda::quantize: x is on the CPU: call fp8kit::quantize, or move x with ",
               ".to(Device::cuda(i))");
  const int device = x.device().index;
  use_device(device);
  const MatrixRef shape = x.matrix();
  const std::int64_t rows = shape.rows, cols = shape.cols;
  const Granularity& g = options.granularity;
  if (g.kind == Granularity::Kind::kBlock || g.kind == Granularity::Kind::kMx) {
    FP8KIT_CHECK(g.block_rows >= 1 && g.block_cols >= 1, "cuda::quantize: block shape must be positive, got ",
                 g.block_rows, "x", g.block_cols);
  }
  QuantizedTensor q;
  q.format = options.format;
  q.overflow = options.overflow;
  q.granularity = g;
  q.original_dtype = x.dtype();
  const std::int64_t br = std::max<std::int64_t>(g.rows_per_block(rows), 1);
  const std::int64_t bc = std::max<std::int64_t>(g.cols_per_block(cols), 1);
  const std::int64_t grid_rows = (rows + br - 1) / br, grid_cols = (cols + bc - 1) / bc;
  q.codes = empty({rows, cols}, dtype_of(options.format), x.device());
  q.scale_inv = empty({grid_rows, grid_cols}, DType::float32, x.device());
  const bool mx = g.kind == Granularity::Kind::kMx;
  if (mx) q.scale_e8m0 = empty({grid_rows, grid_cols}, DType::uint8, x.device());
  const ScaleSpec spec = scale_spec(options);
  const EncodeSpec encode{options.format, options.overflow, Rounding::kNearestEven};
  auto* codes = static_cast<std::uint8_t*>(q.codes.data_ptr());
  auto* scale_inv = static_cast<float*>(q.scale_inv.data_ptr());
  auto* e8m0 = mx ? static_cast<std::uint8_t*>(q.scale_e8m0.data_ptr()) : nullptr;
  const std::int64_t n = rows * cols, blocks = grid_rows * grid_cols;
  if (n == 0) return q;  // no blocks either (an empty dimension leaves the block grid empty)
  const std::int64_t block_elems = std::min(br, rows) * std::min(bc, cols);  // the largest block's elements
  const cudaStream_t stream = stream_of(device);
  with_float_type(x.dtype(), "cuda::quantize: x", [&]<typename T>() {
    const auto* in = static_cast<const T*>(x.data_ptr());
    with_format(options.format, [&]<Format F>() {
      if (blocks == 1) {
        const Tensor amax_bits = zeros({}, DType::int32, x.device());  // float bits, 0 to start
        const Tensor multiplier = empty({}, DType::float32, x.device());
        auto* bits = static_cast<unsigned*>(amax_bits.data_ptr());
        auto* m = static_cast<float*>(multiplier.data_ptr());
        amax_bits_kernel<<<blocks_for_vectors<Vec16<T>::kElems>(n, 4096), kThreads, 0, stream>>>(in, n, bits, nullptr);
        tensor_scale_kernel<<<1, 1, 0, stream>>>(bits, spec, m, scale_inv, e8m0);
        encode_tensor_kernel<F>
            <<<blocks_for_vectors<Vec16<T>::kElems>(n), kThreads, 0, stream>>>(in, n, m, encode, codes);
      } else if (std::is_same_v<T, float> && br == 1 && bc % 4 == 0 && cols % bc == 0 &&
                 (bc > 128 || 32 % (bc / 4) == 0)) {
        const std::int64_t bc4 = bc / 4;
        const auto* quads = reinterpret_cast<const Quad<float>*>(in);
        auto* words = reinterpret_cast<std::uint32_t*>(codes);
        if (bc4 <= 32) {
          // kShortRowSteps warp steps a warp: the grid covers the blocks in that many passes.
          const auto lanes = static_cast<int>(bc4);
          const std::int64_t warps = ceil_div(ceil_div(blocks * lanes, 32), kShortRowSteps);
          const auto grid = static_cast<unsigned>(std::min<std::int64_t>(ceil_div(warps, kThreads / 32), 65536));
          quantize_short_rows4<F><<<grid, kThreads, 0, stream>>>(quads, cols / 4, bc4, grid_cols, blocks, lanes, spec,
                                                                 encode, words, scale_inv, e8m0);
        } else {
          const auto grid = static_cast<unsigned>(std::min<std::int64_t>(ceil_div(blocks, kThreads / 32), 65536));
          quantize_rows4<F><<<grid, kThreads, 0, stream>>>(quads, cols / 4, bc4, grid_cols, blocks, spec, encode, words,
                                                           scale_inv, e8m0);
        }
      } else if (bc % 4 == 0 && cols % 4 == 0 && block_elems >= 4 * kThreads && block_elems / 4 < kMaxTileQuads) {
        const auto grid = static_cast<unsigned>(std::min<std::int64_t>(blocks, 65536));
        quantize_tiles4<F, T><<<grid, kThreads, 0, stream>>>(reinterpret_cast<const Quad<T>*>(in), rows, cols / 4, br,
                                                             bc / 4, grid_cols, blocks, spec, encode,
                                                             reinterpret_cast<std::uint32_t*>(codes), scale_inv, e8m0);
      } else if (block_elems <= 1024) {
        constexpr int kGroups = kThreads / 32;
        const auto grid = static_cast<unsigned>(std::min<std::int64_t>((blocks + kGroups - 1) / kGroups, 65536));
        quantize_blocks<F, T, 32><<<grid, kThreads, 0, stream>>>(in, rows, cols, br, bc, grid_cols, blocks, spec,
                                                                 encode, codes, scale_inv, e8m0);
      } else {
        const auto grid = static_cast<unsigned>(std::min<std::int64_t>(blocks, 65536));
        quantize_blocks<F, T, kThreads><<<grid, kThreads, 0, stream>>>(in, rows, cols, br, bc, grid_cols, blocks, spec,
                                                                       encode, codes, scale_inv, e8m0);
      }
    });
  });
  check_launch("cuda::quantize", device);
  return q;
}

Tensor dequantize(const QuantizedTensor& q, DType dtype) {
  FP8KIT_CHECK(!q.codes.device().is_cpu(), "cuda::dequantize: the codes are on the CPU: call fp8kit::dequantize");
  FP8KIT_CHECK(dtype == DType::float32 || dtype == DType::bfloat16 || dtype == DType::float16,
               "cuda::dequantize: ", name(dtype), " is not a float dtype: use float32, bfloat16 or float16");
  FP8KIT_CHECK(q.codes.dim() == 2 && q.codes.dtype() == dtype_of(q.format), "cuda::dequantize: the codes are ",
               name(q.codes.dtype()), " ", shape_string(q.codes.shape()), ": a matrix of ", name(dtype_of(q.format)),
               " (the format's codes) is expected");
  const int device = q.codes.device().index;
  use_device(device);
  const std::int64_t rows = q.rows(), cols = q.cols();
  const std::int64_t block_rows = std::max<std::int64_t>(q.granularity.rows_per_block(rows), 1);
  const std::int64_t block_cols = std::max<std::int64_t>(q.granularity.cols_per_block(cols), 1);
  const std::int64_t grid_cols = (cols + block_cols - 1) / block_cols;
  const Shape grid{(rows + block_rows - 1) / block_rows, grid_cols};
  FP8KIT_CHECK(
      q.scale_inv.shape() == grid && q.scale_inv.dtype() == DType::float32 && q.scale_inv.device() == q.codes.device(),
      "cuda::dequantize: scale_inv is ", name(q.scale_inv.dtype()), " ", shape_string(q.scale_inv.shape()), " on ",
      to_string(q.scale_inv.device()), "; ", q.granularity.name(), " on ", rows, " x ", cols, " needs float32 ",
      shape_string(grid), " beside the codes");
  Tensor out = empty({rows, cols}, dtype, q.codes.device());
  if (rows * cols == 0) return out;
  const auto* codes = static_cast<const std::uint8_t*>(q.codes.data_ptr());
  const auto* scales = static_cast<const float*>(q.scale_inv.data_ptr());
  with_float_type(dtype, "cuda::dequantize: the output", [&]<typename T>() {
    with_format(q.format, [&]<Format F>() {
      dequantize_kernel<F, T><<<blocks_for(rows * cols), kThreads, 0, stream_of(device)>>>(
          codes, rows, cols, block_rows, block_cols, grid_cols, scales, static_cast<T*>(out.data_ptr()));
    });
  });
  check_launch("cuda::dequantize", device);
  return out;
}

}  // namespace cuda
}  // namespace fp8kit
