"""fp8kit for Python: exact FP8 formats and fast conversions on NumPy arrays (FP8 as ml_dtypes dtypes) and
PyTorch tensors, over the fp8kit C++ library.

    import numpy as np, fp8kit
    q = fp8kit.cast(np.array([448.0, 449.0, 465.0], np.float32), "e4m3fn")   # ml_dtypes float8_e4m3fn array
    fp8kit.cast(q, "float32")                                                  # back: [448, 448, 448] (saturated)

Outputs follow the input: NumPy in, NumPy out; torch in, torch out. Contiguous inputs are read in place (no copy);
non-contiguous ones are copied once into a contiguous array first. Errors are ValueError (a bad value: an unknown
format, a negative thread count), TypeError (an unsupported array or dtype) and OSError (files), with fp8kit's
one-line message.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import _fp8kit
from ._arrays import FP8, WIDE, as_bits, empty_like_of, kind_of, resolve_dtype

__version__ = _fp8kit.__version__

__all__ = ["formats", "cast", "conversion_kernel", "__version__"]


def formats() -> list[dict[str, Any]]:
    """Every FP8 format fp8kit knows (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, e8m0fnu), one dict each with the keys of
    `fp8kit formats --json`: name, torch_name, sign_bits, exponent_bits, mantissa_bits, bias, max, max_code,
    min_normal, min_subnormal, epsilon, has_zero, has_negative_zero, has_inf, inf_encoding, inf_codes,
    nan_encoding, nan_codes."""
    return _fp8kit.formats()


def conversion_kernel() -> str:
    """The conversion kernels this CPU runs (e.g. "avx512-vbmi", "avx2"; FP8KIT_ISA caps them)."""
    return _fp8kit.conversion_kernel()


# The wide types the bulk kernels take (float64 goes through the element-wise conversion).
_KERNEL_WIDE = ("float32", "bfloat16", "float16")


def cast(x: Any, dtype: Any, *, saturate: bool = False, scale: Optional[float] = None, rounding: str = "nearest",
         seed: Optional[int] = None, threads: Optional[int] = None, out: Any = None) -> Any:
    """Casts x to `dtype`, exactly as fp8kit's C++ library does (bit-identical to the scalar codec).

    x: a NumPy array (float32, float64, float16, ml_dtypes.bfloat16, or an ml_dtypes FP8 dtype), a torch.Tensor
       of those, anything else with __dlpack__, or what NumPy turns into an array (lists, scalars: as float32).
    dtype: "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e8m0fnu" (or "float8_e4m3fn" ...), "float32", "bfloat16",
       "float16", "float64"; or the ml_dtypes / NumPy / torch dtype object.
    To FP8 from float32, bfloat16, float16: q = encode(x * scale), rounded once (the bulk SIMD kernels).
      saturate: False (the default, as ml_dtypes and PyTorch <= 2.11 .to()): overflow gives Inf (e5m2) or NaN;
        True (CUDA's satfinite, Transformer Engine, torchao): the largest finite value.
      scale: the quantization scale, multiplied in float32 before the cast (None: 1).
      rounding: "nearest" (ties to even) or "stochastic" (seeded: `seed`, default 0; the same seed gives the same
        bits on every run and thread count).
    From FP8 to float32, bfloat16, float16: x = decode(q) * scale (exact when scale is None).
    Every other pair (float64, FP8 to FP8, float to float): each element rounded once from its exact value, under
    `saturate` for an FP8 target.
    threads: OpenMP threads for this call (None: all). out: an array of the result's kind, shape and dtype to write
    into (returned).
    Returns an array of x's kind (NumPy or torch) and shape.
    """
    kind = kind_of(x)
    src = as_bits(x, kind)
    target = resolve_dtype(dtype)
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', not {rounding!r}")
    stochastic = rounding == "stochastic"
    if seed is not None and not stochastic:
        raise ValueError("seed is for rounding='stochastic'")
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool)):
        raise TypeError(f"threads must be an int, not {type(threads).__name__}")
    to_fp8 = src.dtype_name in _KERNEL_WIDE and target in FP8
    from_fp8 = src.dtype_name in FP8 and target in _KERNEL_WIDE
    if stochastic and not to_fp8:
        raise ValueError("rounding='stochastic' is for casts from float32, bfloat16 or float16 to FP8")
    if scale is not None and not (to_fp8 or from_fp8):
        raise ValueError("scale is for casts between float32, bfloat16 or float16 and FP8")
    result, result_bits = empty_like_of(x, kind, src.shape, target, out)
    if src.size == 0:
        return result
    flat_in, flat_out = src.bits.reshape(-1), result_bits.reshape(-1)
    if to_fp8:
        _fp8kit.cast_to_fp8(flat_in, src.dtype_name, flat_out, target, bool(saturate),
                            1.0 if scale is None else float(scale), stochastic, 0 if seed is None else int(seed),
                            threads)
    elif from_fp8:
        _fp8kit.cast_from_fp8(flat_in, src.dtype_name, flat_out, target, 1.0 if scale is None else float(scale),
                              threads)
    else:  # wide <-> wide, FP8 <-> FP8, float64: each element rounded once from its exact value
        _fp8kit.convert(flat_in, src.dtype_name, flat_out, target, bool(saturate), threads)
    return result
