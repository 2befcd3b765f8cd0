// Internal: a validated scaled_mm (or weight-only product): shapes, the K block and where each scale lives.
// The reference and the fast paths share it, so they check the same things and read the same scales.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>

#include "cpu/mm_kernels.hpp"
#include "fp8kit/ops/scaled_mm.hpp"

namespace fp8kit::mm_detail {

struct MmPlan {
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t kstep = 1;  // the K block the scales change at (K itself when neither side is blocked)
  bool blocked = false;    // more than one K block can exist: scales are applied per block
  ScaleIndex sa, sb;       // sa(i, kb), sb(j, kb)
};

// The shapes every product checks the same way: out (M x N) = A (M x K) times B (N x K when nk, else K x N), with K
// equal on both sides and a bias of N values or none. `op` names the product in the errors ("scaled_mm: ...").
// The plan's scales start as 1 (no scale); products with scales set their own.
MmPlan plan_shapes(const char* op, std::int64_t a_rows, std::int64_t a_cols, std::int64_t b_rows, std::int64_t b_cols,
                   bool nk, std::span<const float> bias);
// An output buffer must hold exactly M x N floats.
void check_output(const char* op, const MmPlan& p, std::size_t out_size);

// An input's memory: its name in errors, its first byte and how many bytes from there it reads.
struct InputBytes {
  const char* what;
  const void* data;
  std::size_t bytes;
};
InputBytes input_bytes(const char* what, const MatrixRef& x);  // first row's start to last row's end
template <typename T>
InputBytes input_bytes(const char* what, std::span<const T> x) {
  return {what, x.data(), x.size_bytes()};
}
// An output must not share memory with an input: the kernels read the inputs while they write the output (a
// panel or a row at a time), so the result would depend on the order of the writes.
void check_apart(const char* op, std::span<const float> out, std::initializer_list<InputBytes> inputs);

// Validates scaled_mm operands and options; throws fp8kit::Error (kInvalidArgument) naming what does not fit.
MmPlan plan_scaled_mm(const ScaledTensorRef& a, const ScaledTensorRef& b, const ScaledMmOptions& options);
// Validates a weight-only product (x M x K float32/bfloat16, w N x K, bias, out of M x N floats).
MmPlan plan_weight_mm(const MatrixRef& x, const ScaledTensorRef& w, std::span<const float> bias, std::size_t out_size);

// The scale every plan without A scales uses (weight-only products).
inline constexpr float kUnitScale = 1.0f;

}  // namespace fp8kit::mm_detail
