// FP8KIT_HD marks the inline functions that host code and CUDA device code share (the scalar codec: one definition
// of every format for the CPU and the GPU). Under nvcc it is __host__ __device__; in host-only builds it is empty.
// (constexpr functions need no mark: the CUDA build compiles device code with --expt-relaxed-constexpr.)
#pragma once

#if defined(__CUDACC__)
#define FP8KIT_HD __host__ __device__
#else
#define FP8KIT_HD
#endif
