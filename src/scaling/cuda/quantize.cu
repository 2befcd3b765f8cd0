// cuda::quantize and cuda::dequantize (scaling/cuda_quantize.hpp). Blocked granularities (row, column, any block,
// MX): one group of threads per scaling block; the group takes the block's amax (the largest finite |x|, as float
// bits: non-negative floats order as their unsigned bits), turns it into the block's scales with the CPU's formula,
// and encodes the block with the CPU's codec. Where the shapes allow four-element vector loads (quads): 1 x bc rows
// with bc <= 512 a few lanes a block, several blocks a warp, and blocks of up to 16384 elements (rows of 4096, 32 x
// 32, 128 x 128, ...) held in registers, a warp a block up to 1024 elements, the CUDA block above (of 1024 threads
// beyond 4096, the next block's loads in flight): each block read from memory once; larger blocks (256 x 128) a
// CUDA block each, read twice. Elsewhere element-wise, a warp for blocks of at
// most 1024 elements, the CUDA block for larger ones. Per tensor: an amax pass into one device word, a one-thread
// kernel for the scale, and the encode reading it from device memory: no host sync anywhere.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "common/cuda/decode.cuh"
#include "common/cuda/kernel_util.cuh"
#include "fp8kit/common/error.hpp"
#include "fp8kit/format/codec_inline.hpp"
#include "fp8kit/scaling/cuda_quantize.hpp"
#include "fp8kit/scaling/scale_inline.hpp"
#include "scaling/cuda/dequantize.hpp"
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

// The origin of scaling block b of a grid with grid_cols blocks a row: its first row and quad column; 32-bit
// division where the block count allows (a 64-bit division is a long software routine on the GPU).
__device__ inline void block_origin(std::int64_t b, std::int64_t blocks, std::int64_t grid_cols, std::int64_t br,
                                    std::int64_t bc4, std::int64_t* r0, std::int64_t* c0) {
  if (blocks <= 0xFFFFFFFFll) {
    const auto b32 = static_cast<std::uint32_t>(b), cols32 = static_cast<std::uint32_t>(grid_cols);
    *r0 = static_cast<std::int64_t>(b32 / cols32) * br;
    *c0 = static_cast<std::int64_t>(b32 % cols32) * bc4;
  } else {
    *r0 = (b / grid_cols) * br;
    *c0 = (b % grid_cols) * bc4;
  }
}

// The SM count of `device`, asked once per device and kept (0 where it cannot be known).
int multiprocessors(int device) {
  static std::mutex mutex;
  static std::map<int, int> known;
  std::lock_guard lock(mutex);
  auto found = known.find(device);
  if (found == known.end()) {
    int sms = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      sms = 0;
    }
    found = known.emplace(device, sms).first;
  }
  return found->second;
}

// The grid of a kernel that strides over its work: at most `wanted` CUDA blocks of `threads`, and where
// `persistent`, at most as many as the current device holds at once (each then takes several steps of the grid, its
// next one's loads issued before it works on this one: PREFETCH below). The occupancy and the SM count are asked
// once per kernel, shape and device, and kept (host calls of microseconds each, which every launch repeated).
template <typename Kernel>
unsigned grid_for(Kernel kernel, int threads, std::int64_t wanted, bool persistent) {
  std::int64_t cap = 65536;
  if (persistent) {
    // Per (kernel, device, threads): the CUDA blocks the device holds at once (0: not known).
    static std::mutex mutex;
    static std::map<std::tuple<const void*, int, int>, std::int64_t> resident;
    int device = 0;
    if (cudaGetDevice(&device) == cudaSuccess) {
      const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, threads);
      std::lock_guard lock(mutex);
      auto found = resident.find(key);
      if (found == resident.end()) {
        int per_sm = 0;
        const bool known = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0) == cudaSuccess;
        cudaGetLastError();  // a refusal above is the launch's to report (check_launch), not a later call's
        found = resident.emplace(key, known ? std::int64_t{per_sm} * multiprocessors(device) : 0).first;
      }
      if (found->second > 0) cap = std::min(cap, found->second);
    }
  }
  return static_cast<unsigned>(std::max<std::int64_t>(std::min(wanted, cap), 1));
}

// 1 x bc blocks of up to 32 * KQ quads whose quads spread over a power of two of lanes, KQ a lane (KQ = 4: 1 x 128
// on 8 lanes, 1 x 64 on 4; KQ = 2: MX's 1 x 32 on 4, 1 x 16 on 2; blocks of fewer quads on one lane holding all), cols
// a multiple of bc, so that block b's quads are b * bc4 ...: no division. 32 / lanes blocks a warp, the block read
// once; the amax shuffled between its lanes, its scales computed by each of them (the same value). With PREFETCH
// the grid is persistent and a warp loads its next step's quads before it works on this one's. Measured on the
// H200 (float32, 256 MiB, ratio to memcpy): 1 x 128 0.96x with four quads a lane (two: 0.74x, 0.87x prefetched;
// eight: 0.80x); MX 0.65x with four, 0.76x with two, 0.83x with two prefetched. (Before encode_group took products
// at 448 and beyond to the pair conversion, 1 x 128 measured 0.35x and MX 0.25x here.)
template <Format F, typename T, int KQ, bool PREFETCH>
__global__ void quantize_short_rows(const Quad<T>* x, std::int64_t bc4, std::int64_t blocks, int lanes, ScaleSpec spec,
                                    EncodeSpec encode, std::uint32_t* codes, float* scale_inv, std::uint8_t* e8m0) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int sub = lane % lanes;
  const int quads = static_cast<int>(bc4) / lanes;  // this lane's (bc4 = lanes * quads)
  const std::int64_t per_warp = 32 / lanes;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  // The quads of this lane at warp step w (quad k at first + k * lanes) into v, where its block exists.
  const auto load = [&](std::int64_t w, Quad<T>* v) {
    const std::int64_t b = w * per_warp + lane / lanes;
#pragma unroll
    for (int k = 0; k < KQ; ++k) {
      if (b < blocks && k < quads) v[k] = x[b * bc4 + sub + k * lanes];
    }
  };
  std::int64_t w = static_cast<std::int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  Quad<T> next[KQ];
  if constexpr (PREFETCH) load(w, next);
  for (; w * per_warp < blocks; w += warps) {
    const std::int64_t b = w * per_warp + lane / lanes;
    const bool active = b < blocks;
    const std::int64_t first = b * bc4 + sub;
    Quad<T> v[KQ];
    if constexpr (PREFETCH) {
#pragma unroll
      for (int k = 0; k < KQ; ++k) v[k] = next[k];
      load(w + warps, next);
    } else {
      load(w, v);
    }
    unsigned m = 0;
#pragma unroll
    for (int k = 0; k < KQ; ++k) {
      if (active && k < quads) m = max(m, finite_magnitude(v[k]));
    }
    for (int offset = lanes / 2; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
    if (!active) continue;  // (after the shuffles, which every lane of the warp takes)
    float si = 0.0f;
    std::uint8_t code = 0;
    const float multiplier = block_scale(__uint_as_float(m), spec, &si, &code);
    if (sub == 0) {
      scale_inv[b] = si;
      if (e8m0 != nullptr) e8m0[b] = code;
    }
#pragma unroll
    for (int k = 0; k < KQ; ++k) {
      if (k < quads) codes[first + k * lanes] = encode_quad<F>(v[k], multiplier, encode);
    }
  }
}

// The quads a lane of quantize_short_rows holds for 1 x bc blocks: two up to 1 x 32 (MX), four beyond.
inline int short_row_quads(std::int64_t bc) {
  return bc <= 32 ? 2 : 4;
}

// The lanes a block of quantize_short_rows takes for 1 x bc blocks (bc a multiple of 4), or 0 where it takes none.
inline int short_row_lanes(std::int64_t bc) {
  const std::int64_t bc4 = bc / 4, quads = short_row_quads(bc);
  if (bc4 < quads) return 1;
  const std::int64_t lanes = bc4 / quads;
  return bc4 % quads == 0 && lanes <= 32 && 32 % lanes == 0 ? static_cast<int>(lanes) : 0;
}

// The largest blocks quantize_held takes: GROUP threads holding K quads each.
template <int GROUP, int K>
constexpr std::int64_t kHeldElems = std::int64_t{4} * GROUP* K;

// Blocks of at most kHeldElems<GROUP, K> elements whose columns and the matrix's come in fours (rows of up to 4096,
// 32 x 32, 128 x 128, ...): CUDA blocks of THREADS, GROUP threads a scaling block (a warp, or the CUDA block) with
// its quads in registers, K a thread, so that the block is read from memory once: the amax reduced over the group,
// the block's scales, then the codes from the registers, four a store. With PREFETCH the grid is persistent and a
// group loads the next block's quads into registers before it works on this one. Measured on the H200 (float32,
// 256 MiB, ratio to memcpy): rows of 4096 0.89x with 256 threads of 4 quads (prefetched 0.77x; 512 x 2: 0.69x; read
// twice, the second time from L2: 0.52x); 128 x 128 0.74x with 1024 threads of 4 quads prefetched (not prefetched
// 0.62x; 512 x 8 prefetched 0.70x; quantize_tiles4's two reads 0.63x, 256 threads of 16 quads 0.44x). On the H100
// (2026-12-05, one run): 128 x 128 0.94x prefetched with 1024 x 4, 0.91x with 512 x 8; a ring of blocks in shared
// memory filled by cp.async instead of the register prefetch measured 0.84x three blocks deep and 0.87x two deep
// (0.82x with 512 x 8), and was dropped.
template <Format F, typename T, int THREADS, int GROUP, int K, bool PREFETCH>
__global__ void __launch_bounds__(THREADS)
    quantize_held(const Quad<T>* x, std::int64_t rows, std::int64_t cols4, std::int64_t br, std::int64_t bc4,
                  std::int64_t grid_cols, std::int64_t blocks, ScaleSpec spec, EncodeSpec encode, std::uint32_t* codes,
                  float* scale_inv, std::uint8_t* e8m0) {
  static_assert(GROUP == 32 || GROUP == THREADS, "a group is a warp or the CUDA block (group_max)");
  constexpr int kGroups = THREADS / GROUP;
  __shared__ unsigned warp_max[THREADS / 32];
  __shared__ float multipliers[kGroups];
  const int group = static_cast<int>(threadIdx.x) / GROUP, lane = static_cast<int>(threadIdx.x) % GROUP;
  struct Where {  // a scaling block's rows and quad columns (none past the last block), and its first quad
    int h = 0, w = 1;
    std::int64_t origin = 0;
  };
  const auto where = [&](std::int64_t b) {
    Where o;
    if (b < blocks) {
      std::int64_t r0 = 0, c0 = 0;
      block_origin(b, blocks, grid_cols, br, bc4, &r0, &c0);
      o.h = static_cast<int>(min(br, rows - r0));
      o.w = static_cast<int>(min(bc4, cols4 - c0));
      o.origin = r0 * cols4 + c0;
    }
    return o;
  };
  // Quad lane + k * GROUP of block o is at row i / w, column i % w: fn(k, its index) for each of this thread's,
  // stepped from the first without dividing (and recomputed for the stores rather than held in registers).
  const auto each_quad = [&](const Where& o, auto&& fn) {
    const int dr = GROUP / o.w, dc = GROUP % o.w;
    int r = lane / o.w, c = lane % o.w;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (r < o.h) fn(k, o.origin + static_cast<std::int64_t>(r) * cols4 + c);
      r += dr;
      c += dc;
      if (c >= o.w) {
        c -= o.w;
        ++r;
      }
    }
  };
  const std::int64_t step = static_cast<std::int64_t>(gridDim.x) * kGroups;
  std::int64_t base = static_cast<std::int64_t>(blockIdx.x) * kGroups;
  Quad<T> next[PREFETCH ? K : 1];
  Where next_at;
  if constexpr (PREFETCH) {
    next_at = where(base + group);
    each_quad(next_at, [&](int k, std::int64_t at) { next[k] = x[at]; });
  }
  // Every thread runs the same iterations (the barriers of a CUDA-block group); a group past the last block idles.
  for (; base < blocks; base += step) {
    const std::int64_t b = base + group;
    const bool active = b < blocks;
    Quad<T> v[K];
    Where o;
    if constexpr (PREFETCH) {
      o = next_at;
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = next[k];
      next_at = where(b + step);
      each_quad(next_at, [&](int k, std::int64_t at) { next[k] = x[at]; });
    } else {
      o = where(b);
      each_quad(o, [&](int k, std::int64_t at) { v[k] = x[at]; });
    }
    unsigned m = 0;
    each_quad(o, [&](int k, std::int64_t) { m = max(m, finite_magnitude(v[k])); });
    m = group_max<GROUP>(m, warp_max);
    float multiplier = 0.0f;
    if constexpr (GROUP == 32) {  // every lane computes the warp's scales; the first stores them
      float si = 0.0f;
      std::uint8_t code = 0;
      multiplier = block_scale(__uint_as_float(m), spec, &si, &code);
      if (lane == 0 && active) {
        scale_inv[b] = si;
        if (e8m0 != nullptr) e8m0[b] = code;
      }
    } else {
      std::uint8_t unused_code = 0;
      if (lane == 0 && active) {
        multipliers[group] =
            block_scale(__uint_as_float(m), spec, scale_inv + b, e8m0 != nullptr ? e8m0 + b : &unused_code);
      }
      __syncthreads();
      multiplier = multipliers[group];
    }
    // (No barrier before the next block: its first shared write, in group_max, follows a barrier that every thread
    // reaches only after reading this block's words.)
    each_quad(o, [&](int k, std::int64_t at) { codes[at] = encode_quad<F>(v[k], multiplier, encode); });
  }
}

constexpr std::int64_t kMaxTileQuads = (std::int64_t{1} << 31) - 1 - kThreads;  // quantize_tiles4's int indices

// Blocks larger than quantize_held takes whose columns and the matrix's come in fours (256 x 128): one CUDA block per
// scaling block, its threads over the block's quads with 32-bit index arithmetic inside the block, the amax reduced
// over the CUDA block, then the quads read again (from L2 where it still holds them) and encoded, four codes a store.
// (The element-wise kernel below divided 64-bit indices per element: 0.18x of memcpy's bandwidth for 128 x 128 on the
// H200.) A scaling block of kMaxTileQuads quads or more (2^33 elements) goes element-wise instead.
template <Format F, typename T>
__global__ void quantize_tiles4(const Quad<T>* x, std::int64_t rows, std::int64_t cols4, std::int64_t br,
                                std::int64_t bc4, std::int64_t grid_cols, std::int64_t blocks, ScaleSpec spec,
                                EncodeSpec encode, std::uint32_t* codes, float* scale_inv, std::uint8_t* e8m0) {
  __shared__ unsigned warp_max[kThreads / 32];
  __shared__ float shared_multiplier;
  std::uint8_t unused_code = 0;
  for (std::int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    std::int64_t r0 = 0, c0 = 0;
    block_origin(b, blocks, grid_cols, br, bc4, &r0, &c0);
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

// The dequantize: each CUDA block first fills a shared-memory table of the format's 256 decoded values, then
// out = narrow(table[code] * the code's block scale_inv), as the CPU computes it. Where the columns and the block's
// come in fours (a quad of codes lies in one row and one block) and the pointers allow, a thread takes four codes
// (one 32-bit load, issued with the load of its scale) and stores their four results at once; with `narrow32` (the
// matrix, the block and the grid within 32 bits) a quad's block is found with FastDiv by the columns and the block's
// shape (a 32-bit division there measured 0.60-0.64x of memcpy on the H200 with four per quad; the 64-bit one this
// kernel did at first, 0.18x; FastDiv 0.68x; the scale's load issued with the codes' 0.74x on the H100). It takes
// every matrix of several scales: dequantize_tiles below runs only when asked for (scaling/cuda/dequantize.hpp).
template <Format F, typename T>
__global__ void dequantize_kernel(const std::uint8_t* codes, std::int64_t rows, std::int64_t cols, std::int64_t br,
                                  std::int64_t bc, std::int64_t grid_cols, const float* scale_inv, T* out, bool vectors,
                                  bool narrow32, FastDiv by_cols, FastDiv by_br, FastDiv by_bc) {
  __shared__ float table[256];
  for (int c = static_cast<int>(threadIdx.x); c < 256; c += static_cast<int>(blockDim.x)) {
    constexpr FormatDescriptor d = descriptor(F);
    table[c] = codec_detail::decode_code(d, static_cast<std::uint8_t>(c));
  }
  __syncthreads();
  const auto scale_of = [&](std::int64_t i) {
    if (narrow32) {
      const auto i32 = static_cast<std::uint32_t>(i);
      const std::uint32_t r = by_cols.div(i32), c = i32 - r * by_cols.d;
      return scale_inv[by_br.div(r) * static_cast<std::uint32_t>(grid_cols) + by_bc.div(c)];
    }
    const std::int64_t r = i / cols, c = i % cols;
    return scale_inv[(r / br) * grid_cols + c / bc];
  };
  struct CodesScale {
    std::uint32_t word;
    float scale;
  };
  grid_stride<4>(
      rows * cols, vectors,
      [&](std::int64_t i) {
        return CodesScale{*reinterpret_cast<const std::uint32_t*>(codes + i), scale_of(i)};
      },
      [&](std::int64_t i, const CodesScale& c) {
        const float s = c.scale;
        Quad<T> q;
#pragma unroll
        for (int j = 0; j < 4; ++j) narrow(scaled(table[(c.word >> (8 * j)) & 0xFFu], s), &q.e[j]);
        *reinterpret_cast<Quad<T>*>(out + i) = q;
      },
      [&](std::int64_t i) { narrow(scaled(table[codes[i]], scale_of(i)), out + i); });
}

// The smallest blocks dequantize_tiles takes: kTileRows rows (of at least 128 columns).
constexpr std::int64_t kTileRows = 32;

// The dequantize with large blocks (128 x 128, 32 x 128, ...), whose columns and the matrix's come in fours: a CUDA
// block per scaling block (striding over them) fills a shared table of the block's 256 results, narrow(decode(code)
// * its scale_inv) (the values dequantize_kernel computes), and looks its codes up, as the cast from FP8 does: no
// division and no scale per element. A warp takes a row of the block at a time, a lane a quad of codes (one 32-bit
// load) and its four results (one store), kRows rows in flight.
template <Format F, typename T>
__global__ void dequantize_tiles(const std::uint32_t* codes, std::int64_t rows, std::int64_t cols4, std::int64_t br,
                                 std::int64_t bc4, std::int64_t grid_cols, std::int64_t blocks, const float* scale_inv,
                                 Quad<T>* out) {
  using Bits = BitsOf<T>;
  constexpr int kWarps = kThreads / 32, kRows = 4;
  __shared__ Bits table[256];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  for (std::int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    std::int64_t r0 = 0, c0 = 0;
    block_origin(b, blocks, grid_cols, br, bc4, &r0, &c0);
    const int h = static_cast<int>(min(br, rows - r0)), w = static_cast<int>(min(bc4, cols4 - c0));
    const float scale = scale_inv[b];
    __syncthreads();  // every look-up of the previous block is done
    fill_results<F, T>(table, scale);
    __syncthreads();
    const std::int64_t origin = r0 * cols4 + c0;
    for (int c = lane; c < w; c += 32) {
      for (int r = warp; r < h; r += kRows * kWarps) {
        std::uint32_t word[kRows];
#pragma unroll
        for (int k = 0; k < kRows; ++k) {
          if (r + k * kWarps < h) word[k] = codes[origin + static_cast<std::int64_t>(r + k * kWarps) * cols4 + c];
        }
#pragma unroll
        for (int k = 0; k < kRows; ++k) {
          if (r + k * kWarps >= h) continue;
          Quad<T> q;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const Bits bits = table[(word[k] >> (8 * j)) & 0xFFu];
            memcpy(&q.e[j], &bits, sizeof(Bits));
          }
          out[origin + static_cast<std::int64_t>(r + k * kWarps) * cols4 + c] = q;
        }
      }
    }
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
  check_element_format(options.format, "cuda::quantize");
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
    with_element_format(options.format, "cuda::quantize", [&]<Format F>() {
      if (blocks == 1) {
        const Tensor amax_bits = zeros({}, DType::int32, x.device());  // float bits, 0 to start
        const Tensor multiplier = empty({}, DType::float32, x.device());
        auto* bits = static_cast<unsigned*>(amax_bits.data_ptr());
        auto* m = static_cast<float*>(multiplier.data_ptr());
        launch_amax_bits(in, n, bits, nullptr, stream);
        tensor_scale_kernel<<<1, 1, 0, stream>>>(bits, spec, m, scale_inv, e8m0);
        launch_encode_tensor<F>(in, n, m, encode, codes, stream);
      } else if (br == 1 && bc % 4 == 0 && cols % bc == 0 && short_row_lanes(bc) != 0) {
        const int lanes = short_row_lanes(bc);
        const std::int64_t warps = ceil_div(blocks, 32 / lanes), wanted = ceil_div(warps, kThreads / 32);
        const auto short_rows = [&]<int KQ, bool PREFETCH>() {
          const auto kernel = quantize_short_rows<F, T, KQ, PREFETCH>;
          kernel<<<grid_for(kernel, kThreads, wanted, PREFETCH), kThreads, 0, stream>>>(
              reinterpret_cast<const Quad<T>*>(in), bc / 4, blocks, lanes, spec, encode,
              reinterpret_cast<std::uint32_t*>(codes), scale_inv, e8m0);
        };
        if (short_row_quads(bc) == 2) {
          short_rows.template operator()<2, true>();
        } else {
          short_rows.template operator()<4, false>();
        }
      } else if (bc % 4 == 0 && cols % 4 == 0 && block_elems <= kHeldElems<1024, 4>) {
        const auto held = [&]<int THREADS, int GROUP, int K, bool PREFETCH>() {
          const auto kernel = quantize_held<F, T, THREADS, GROUP, K, PREFETCH>;
          const unsigned grid = grid_for(kernel, THREADS, ceil_div(blocks, THREADS / GROUP), PREFETCH);
          kernel<<<grid, THREADS, 0, stream>>>(reinterpret_cast<const Quad<T>*>(in), rows, cols / 4, br, bc / 4,
                                               grid_cols, blocks, spec, encode, reinterpret_cast<std::uint32_t*>(codes),
                                               scale_inv, e8m0);
        };
        if (block_elems <= kHeldElems<32, 8>) {
          held.template operator()<kThreads, 32, 8, false>();
        } else if (block_elems <= kHeldElems<kThreads, 4>) {
          held.template operator()<kThreads, kThreads, 4, false>();
        } else {
          held.template operator()<1024, 1024, 4, true>();
        }
      } else if (bc % 4 == 0 && cols % 4 == 0 && block_elems / 4 < kMaxTileQuads) {
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
  return cuda_detail::dequantize_with(q, dtype, cuda_detail::DequantizeKernel::kBlocked);
}

}  // namespace cuda

namespace cuda_detail {

Tensor dequantize_with(const cuda::QuantizedTensor& q, DType dtype, DequantizeKernel kernel) {
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
  constexpr std::int64_t kMax32 = 0xFFFFFFFFll;
  const bool narrow32 = rows * cols < kMax32 && block_rows <= kMax32 && block_cols <= kMax32 && grid_cols <= kMax32;
  with_float_type(dtype, "cuda::dequantize: the output", [&]<typename T>() {
    auto* o = static_cast<T*>(out.data_ptr());
    if (grid[0] * grid[1] == 1) {  // one scale: each result depends on its code alone, as in the cast from FP8
      launch_decode(codes, q.format, o, rows * cols, ScaleAt{scales}, stream_of(device));
      return;
    }
    const bool vectors = cols % 4 == 0 && block_cols % 4 == 0 && reinterpret_cast<std::uintptr_t>(codes) % 4 == 0 &&
                         vector_aligned<4>(o);
    with_format(q.format, [&]<Format F>() {
      if (kernel == DequantizeKernel::kTiles) {
        // A CUDA block per scaling block: quads of codes, blocks of kTileRows x 128 or more, sides within the
        // kernel's int arithmetic.
        constexpr std::int64_t kMaxTileSide = std::int64_t{1} << 30;
        FP8KIT_CHECK_KIND(vectors && block_rows >= kTileRows && block_cols >= 128 &&
                              std::min(block_rows, rows) < kMaxTileSide &&
                              std::min(block_cols, cols) / 4 < kMaxTileSide,
                          ErrorKind::kUnsupported, "cuda::dequantize (tiles): ", q.granularity.name(), " on ", rows,
                          " x ", cols, " is not blocks of at least ", kTileRows,
                          " x 128 with columns in fours and 4-byte aligned codes and output; use the blocked kernel");
        const std::int64_t blocks = grid[0] * grid[1];
        const auto launch_grid = static_cast<unsigned>(std::min<std::int64_t>(blocks, 65536));
        dequantize_tiles<F, T><<<launch_grid, kThreads, 0, stream_of(device)>>>(
            reinterpret_cast<const std::uint32_t*>(codes), rows, cols / 4, block_rows, block_cols / 4, grid_cols,
            blocks, scales, reinterpret_cast<Quad<T>*>(o));
        return;
      }
      const auto divisor = [&](std::int64_t d) {
        return narrow32 ? FastDiv(static_cast<std::uint32_t>(d)) : FastDiv();
      };
      dequantize_kernel<F, T><<<blocks_for_vectors<4>(rows * cols, vectors), kThreads, 0, stream_of(device)>>>(
          codes, rows, cols, block_rows, block_cols, grid_cols, scales, o, vectors, narrow32, divisor(cols),
          divisor(block_rows), divisor(block_cols));
    });
  });
  check_launch("cuda::dequantize", device);
  return out;
}

}  // namespace cuda_detail
}  // namespace fp8kit
