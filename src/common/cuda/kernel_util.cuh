// What the element-wise CUDA kernels of every layer share (device code, included by .cu files only): the launch
// shape, the FP8 format as a template constant, elements widened and narrowed, the quantization scale applied as
// the CPU applies it, and the one wording of a failed launch.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cfloat>
#include <cstdint>
#include <string>

#include "fp8kit/common/error.hpp"
#include "fp8kit/format/codec_inline.hpp"
#include "fp8kit/format/format.hpp"
#include "fp8kit/format/half.hpp"
#include "fp8kit/tensor/dtype.hpp"
#include "tensor/cuda/streams.hpp"

namespace fp8kit::cuda_detail {

constexpr int kThreads = 256;  // threads per block of the element-wise kernels

// Blocks for n elements, one per kThreads, at most `cap` (the kernels stride over the grid beyond it).
inline unsigned blocks_for(std::int64_t n, std::int64_t cap = 65536) {
  const std::int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks < cap ? blocks : cap);
}

// Calls fn.template operator()<F>() with the format as a template constant (so that its descriptor folds): every
// format, or (kScales false) the four that hold values. Anything else (e8m0fnu without kScales, a value outside
// the enum) is Error(kInvalidArgument) naming `who`.
template <bool kScales, typename Fn>
void dispatch_format(Format format, const char* who, Fn&& fn) {
  switch (format) {
    case Format::e4m3fn:
      return fn.template operator()<Format::e4m3fn>();
    case Format::e5m2:
      return fn.template operator()<Format::e5m2>();
    case Format::e4m3fnuz:
      return fn.template operator()<Format::e4m3fnuz>();
    case Format::e5m2fnuz:
      return fn.template operator()<Format::e5m2fnuz>();
    case Format::e8m0fnu:
      if constexpr (kScales) return fn.template operator()<Format::e8m0fnu>();
      break;
  }
  FP8KIT_THROW(ErrorKind::kInvalidArgument, who,
               format == Format::e8m0fnu ? ": e8m0fnu holds MX scales, not quantized values" : ": not an FP8 format");
}

template <typename Fn>
void with_format(Format format, Fn&& fn) {
  dispatch_format<true>(format, "CUDA format dispatch", fn);
}

// with_format for the formats that hold values: e8m0fnu holds MX scales only, and the quantizing entries refuse it
// (check_element_format) before they dispatch, so no kernel is compiled for e8m0fnu elements (a fifth of their
// instantiations, and of the build's time in them).
template <typename Fn>
void with_element_format(Format format, const char* who, Fn&& fn) {
  dispatch_format<false>(format, who, fn);
}

// Calls fn.template operator()<T>() with the element type of a float32, bfloat16 or float16 tensor; any other dtype
// is Error(kInvalidArgument) "<what> is <dtype>: quantize float32, bfloat16 or float16".
template <typename Fn>
void with_float_type(DType dtype, const char* what, Fn&& fn) {
  switch (dtype) {
    case DType::float32:
      return fn.template operator()<float>();
    case DType::bfloat16:
      return fn.template operator()<bfloat16>();
    case DType::float16:
      return fn.template operator()<float16>();
    default:
      FP8KIT_THROW(ErrorKind::kInvalidArgument, what, " is ", name(dtype), ": quantize float32, bfloat16 or float16");
  }
}

// N consecutive elements for one vector load (aligned to their size). Vec16: 16 bytes of them (four float32 or eight
// 16-bit floats), the unit of the element-wise kernels: device-to-device copies on an H200 reach ~0.9x of
// cudaMemcpy's bandwidth with 16-byte accesses; with one element a thread the casts and quantizations measured
// 0.2-0.6x. Quad: four, the unit of the blocked quantize kernels (a row of a block holds its columns in fours).
template <typename T, int N>
struct alignas(N * sizeof(T)) Elems {
  static constexpr int kElems = N;
  T e[N];
};
template <typename T>
using Vec16 = Elems<T, 16 / static_cast<int>(sizeof(T))>;
template <typename T>
using Quad = Elems<T, 4>;

// Whether a pointer allows kElems-element vector accesses of its element type starting at a multiple of kElems
// elements (aligned to kElems * sizeof(element)).
template <int kElems, typename P>
inline bool vector_aligned(const P* p) {
  return reinterpret_cast<std::uintptr_t>(p) % (kElems * sizeof(P)) == 0;
}

// The groups of kElems elements a thread loads before it works on the first (grid_stride): with one 16-byte load a
// thread in flight the H200's encodes measured 0.71x (bfloat16) and 0.85x (float32) of device memcpy, with four
// (and the pair conversion of encode_group) 0.85-0.92x and 0.99x.
constexpr int kBatch = 4;

// Blocks for `n` elements handled by grid_stride: kElems at a time, kBatch groups a thread where `vectors`, one
// element a thread otherwise (at most `cap` blocks).
template <int kElems>
inline unsigned blocks_for_vectors(std::int64_t n, bool vectors, std::int64_t cap = 65536) {
  return vectors ? blocks_for((n + kElems * kBatch - 1) / (kElems * kBatch), cap) : blocks_for(n, cap);
}

// This thread's share of the elements [0, n), grid-stride: where `vectors` (the pointers allow it, the same for
// every thread), each whole group of kElems elements starting at i as use(i, load(i)), kBatch groups a step, all
// their loads first (consecutive threads take consecutive groups: a warp's accesses stay contiguous); then one(i)
// for each element of the rest; otherwise one(i) for every element.
template <int kElems, typename Load, typename Use, typename One>
__device__ inline void grid_stride(std::int64_t n, bool vectors, Load&& load, Use&& use, One&& one) {
  const std::int64_t first = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t done = 0;
  if (vectors) {
    const std::int64_t groups = n / kElems;
    using Loaded = decltype(load(std::int64_t{0}));
    for (std::int64_t g = first; g < groups; g += kBatch * stride) {
      Loaded v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (g + b * stride < groups) v[b] = load((g + b * stride) * kElems);
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        if (g + b * stride < groups) use((g + b * stride) * kElems, v[b]);
      }
    }
    done = groups * kElems;
  }
  for (std::int64_t i = done + first; i < n; i += stride) one(i);
}

// x * scale as the CPU computes it, NaN included: a NaN operand comes through with its sign (x86 returns the NaN
// operand; the GPU would return its canonical positive NaN), scale 1 leaves x as it is, and the product is never
// fused into anything (__fmul_rn).
__device__ inline float scaled(float x, float scale) {
  if (scale == 1.0f || x != x) return x;
  if (scale != scale) return scale;
  return __fmul_rn(x, scale);
}

// An element as float32, exactly (16-bit floats widen without rounding).
__device__ inline float widen(float x) {
  return x;
}
__device__ inline float widen(bfloat16 x) {
  return x.to_float();
}
__device__ inline float widen(float16 x) {
  return x.to_float();
}

// A float32 stored as the element type, rounded once to nearest even.
__device__ inline void narrow(float v, float* out) {
  *out = v;
}
__device__ inline void narrow(float v, bfloat16* out) {
  *out = bfloat16::from_float(v);
}
__device__ inline void narrow(float v, float16* out) {
  *out = float16::from_float(v);
}

// One float to format F, as the CPU's codec encodes it (codec_inline.hpp). For e4m3fn and e5m2 with round to
// nearest even, a finite value below the format's largest finite magnitude goes through the hardware conversion of
// sm_89 and later (cvt.rn.satfinite: no overflow can happen there, so the saturation mode does not matter; the
// exhaustive device check compares all 2^32 inputs with the CPU); NaN, Inf, the overflow range, the other formats
// and stochastic rounding take the codec itself.
template <Format F>
__device__ inline std::uint8_t encode_value(float x, const EncodeSpec& spec, std::uint32_t random_bits) {
  constexpr FormatDescriptor d = descriptor(F);
  if constexpr (F == Format::e4m3fn || F == Format::e5m2) {
    constexpr float kMax = F == Format::e4m3fn ? 448.0f : 57344.0f;
    if (spec.rounding == Rounding::kNearestEven && fabsf(x) < kMax) {
      return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, F == Format::e4m3fn ? __NV_E4M3 : __NV_E5M2);
    }
  }
  return codec_detail::encode_unpacked(d, codec_detail::unpack(x), spec, random_bits);
}

// The codes of N consecutive elements (a multiple of four) packed little-endian into 32-bit words, each
// encode(x * scale) as encode_value gives it; stochastic rounding draws stochastic_bits(seed, first + j) for element
// j (seed and first are not read under round to nearest even). For e4m3fn and e5m2 under round to nearest even a
// pair whose products x * scale both fit takes one hardware conversion of both (cvt.rn.satfinite ... x2), the rest
// goes through scaled() and encode_value. A product fits when it is at most the largest finite magnitude, or, when
// saturating, when it is finite at all: .satfinite turns every finite value beyond that magnitude into it, and so
// does the codec (checked over all 2^31 such floats of both formats on the CPU; on the GPU the exhaustive check
// sends every finite float32 through here). (Requiring it below the largest finite magnitude sent each 1 x 128
// block's amax, which its scale maps to 448, and MX's largest elements, up to 511, through the software codec: one
// such lane holds its whole warp there, and the H200 measured 0.35x and 0.25x of memcpy for those two quantizations,
// 0.78x and 0.65x after. Clamping the products first cost bf16 -> e4m3fn a quarter of its speed: 0.92x -> 0.67x.)
// Where a product is finite, x * scale is scaled(x, scale): NaN operands and NaN products are left to the slow path.
template <Format F, typename T, int N>
__device__ inline void encode_group(const Elems<T, N>& v, float scale, const EncodeSpec& spec, std::uint64_t seed,
                                    std::uint64_t first, std::uint32_t* words) {
#pragma unroll
  for (int w = 0; w < N / 4; ++w) words[w] = 0u;
  // The largest |x * scale| the pair conversion takes: every finite one when saturating, the largest finite
  // magnitude otherwise (both NaN-free: a NaN compares false).
  constexpr float kMax = F == Format::e4m3fn ? 448.0f : 57344.0f;
  [[maybe_unused]] const float limit = spec.overflow == Overflow::kSaturate ? FLT_MAX : kMax;
#pragma unroll
  for (int j = 0; j < N; j += 2) {
    if constexpr (F == Format::e4m3fn || F == Format::e5m2) {
      if (spec.rounding == Rounding::kNearestEven) {
        const float a = __fmul_rn(widen(v.e[j]), scale), b = __fmul_rn(widen(v.e[j + 1]), scale);
        if (fabsf(a) <= limit && fabsf(b) <= limit) {
          words[j / 4] |= static_cast<std::uint32_t>(__nv_cvt_float2_to_fp8x2(
                              make_float2(a, b), __NV_SATFINITE, F == Format::e4m3fn ? __NV_E4M3 : __NV_E5M2))
                          << (8 * (j % 4));
          continue;
        }
      }
    }
    const auto code = [&](int e) {  // element e's code, with its random bits
      const std::uint32_t bits =
          spec.rounding == Rounding::kStochastic ? stochastic_bits(seed, first + static_cast<std::uint64_t>(e)) : 0u;
      return static_cast<std::uint32_t>(encode_value<F>(scaled(widen(v.e[e]), scale), spec, bits));
    };
    words[j / 4] |= (code(j) | code(j + 1) << 8) << (8 * (j % 4));
  }
}

// Stores the codes of encode_group at out (aligned to their size).
template <int kElems>
__device__ inline void store_codes(std::uint8_t* out, const std::uint32_t* words) {
  if constexpr (kElems == 4) {
    *reinterpret_cast<std::uint32_t*>(out) = words[0];
  } else {
    *reinterpret_cast<uint2*>(out) = make_uint2(words[0], words[1]);
  }
}

// Division of 32-bit unsigned integers by a divisor fixed at launch, as a multiply-high, an add and a shift (a
// 32-bit division is a dozen instructions or more on the GPU, a 64-bit one a long routine): n / d for every n and
// every d >= 1 below 2^32, with l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1 (the round-up method of
// Granlund and Montgomery, the sum taken in 64 bits so that no n overflows it; checked on the CPU for d from 1 to
// 5000, powers of two and their neighbours, 2^32 - 1 and random divisors, against n at the edges and at random).
struct FastDiv {
  std::uint32_t d = 1, m = 1;
  int l = 0;
  FastDiv() = default;
  explicit FastDiv(std::uint32_t divisor) : d(divisor) {
    while ((std::uint64_t{1} << l) < d) ++l;
    m = static_cast<std::uint32_t>(((std::uint64_t{1} << 32) * ((std::uint64_t{1} << l) - d)) / d + 1);
  }
  __device__ std::uint32_t div(std::uint32_t n) const {
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(__umulhi(m, n)) + n) >> l);
  }
};

// Makes `device` current for the launches that follow; a device the driver does not show (no driver, an index past
// the last) is Error(kUnsupported) naming it. Every entry point calls it first, also for an empty input.
inline void use_device(int device) {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess) {
    cudaGetLastError();  // cleared, so that later calls do not report it again
    count = 0;
  }
  FP8KIT_CHECK_KIND(device >= 0 && device < count, ErrorKind::kUnsupported, "CUDA: device cuda:", device,
                    " is not available: ",
                    counted != cudaSuccess ? cudaGetErrorString(counted)
                                           : "this machine shows " + std::to_string(count) + " CUDA device(s)");
  const cudaError_t status = cudaSetDevice(device);
  FP8KIT_CHECK_KIND(status == cudaSuccess, ErrorKind::kUnsupported, "CUDA: cudaSetDevice(cuda:", device,
                    "): ", cudaGetErrorString(status));
}

// Throws, in one line naming the launch and the device, if the last launch failed.
inline void check_launch(const char* what, int device) {
  const cudaError_t status = cudaGetLastError();
  FP8KIT_CHECK_KIND(status == cudaSuccess, ErrorKind::kUnsupported, "CUDA: ", what, " on cuda:", device, ": ",
                    cudaGetErrorString(status), " (", cudaGetErrorName(status), ")");
}

}  // namespace fp8kit::cuda_detail
