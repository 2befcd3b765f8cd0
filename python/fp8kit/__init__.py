"""fp8kit for Python: exact FP8 formats and fast conversions on NumPy arrays (FP8 as ml_dtypes dtypes) and
PyTorch tensors, over the fp8kit C++ library.

    import numpy as np, fp8kit
    q = fp8kit.cast(np.array([448.0, 449.0, 465.0], np.float32), "e4m3fn")   # ml_dtypes float8_e4m3fn array
    fp8kit.cast(q, "float32")              # back: [448, 448, nan] (465 overflows; saturate=True gives 448)

Outputs follow the input: NumPy in, NumPy out; torch in, torch out. Contiguous inputs are read in place (no copy);
non-contiguous ones are copied once into a contiguous array first. Errors are ValueError (a bad value: an unknown
format or a dtype fp8kit does not cast, a thread count below 1), TypeError (an argument of the wrong type: not an
array, a dtype or an int where one is expected) and OSError (files; FileNotFoundError for a path that is not
there), with fp8kit's one-line message.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import re
import sys
import warnings
from typing import Any, Optional, Sequence, Union

import numpy as np

from . import _fp8kit
from ._arrays import _NUMPY as _NUMPY_DTYPES
from ._arrays import _NAME_OF_STRING, FP8, WIDE, ElementTypeError, Source, _check_torch_layout, _check_torch_memory, about_to_write, as_bits, check_bool, check_not_tracked, check_float32, check_int, check_threads, empty_like_of, kind_of, may_share_memory, resolve_dtype, _torch_dtype

__version__ = _fp8kit.__version__
DelayedScaling = _fp8kit.DelayedScaling

__all__ = ["formats", "cast", "quantize", "dequantize", "amax", "analyze", "scaled_mm", "ScaledTensor",
           "DelayedScaling", "inspect", "quantize_checkpoint", "dequantize_checkpoint", "convert_checkpoint", "load",
           "save", "conversion_kernel", "__version__"]


def __dir__() -> list:
    """The package's API (what tab completion offers), not the modules and helpers it imports (np, os, check_bool)."""
    return sorted(__all__)


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
_KERNEL_WIDE = frozenset(("float32", "bfloat16", "float16"))
_FP8_SET = frozenset(FP8)


def cast(x: Any, dtype: Any, *, saturate: bool = False, scale: Optional[float] = None,
         scale_inv: Optional[float] = None, rounding: str = "nearest", seed: Optional[int] = None,
         threads: Optional[int] = None, out: Any = None) -> Any:
    """Casts x to `dtype`, exactly as fp8kit's C++ library does (bit-identical to the scalar codec).

    x: a NumPy array (float32, float64, float16, ml_dtypes.bfloat16, or an ml_dtypes FP8 dtype), a torch.Tensor
       of those, anything else with __dlpack__, or what NumPy turns into an array (lists and scalars of Python
       floats as float64, each value rounded once from its exact double; ints as float64; with `scale` or
       stochastic rounding, whose kernels read float32, as float32).
    dtype: "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e8m0fnu" (or "float8_e4m3fn" ...), "float32", "bfloat16",
       "float16", "float64"; or the ml_dtypes / NumPy / torch dtype object.
    To FP8 from float32, bfloat16, float16: q = encode(x * scale), rounded once (the bulk SIMD kernels).
      saturate: False (the default, as ml_dtypes and PyTorch <= 2.11 .to()): overflow gives Inf (e5m2) or NaN;
        True (CUDA's satfinite, Transformer Engine, torchao): the largest finite value.
      scale: the quantization scale, multiplied in float32 before the cast (None: 1).
      rounding: "nearest" (ties to even) or "stochastic" (seeded: `seed`, 0 .. 2^64 - 1, default 0; the same seed
        gives the same bits on every run and thread count, and the same draw at each position of every call: casting
        the same values every step with one seed rounds them the same way each time, so pass a new seed per step,
        e.g. the step number). Without saturate, a value between the largest finite one and the next step past
        it is rounded up into NaN (e4m3fn) or Inf (e5m2) with the probability of rounding up: stochastic rounding
        of values near the top of the range wants saturate=True.
    From FP8 to float32, bfloat16, float16: x = decode(q) * scale_inv, the dequantization scale (1 / the scale the
      encode multiplied by; exact when scale_inv is None). The two are kept apart, as everywhere in fp8kit:
      scale_inv= on an encode is refused; scale= on a decode (its name before scale_inv=, the same multiplier) gives
      a FutureWarning and will be refused, so that one value passed both ways cannot square it.
    Every other pair (float64, FP8 to FP8, float to float): each element rounded once from its exact value, under
    `saturate` for an FP8 target.
    threads: OpenMP threads for this call, on this thread (None: the library's count, OMP_NUM_THREADS else the
    cores). out: an array of the result's kind, shape and dtype to write into (returned).
    Returns an array of x's kind (NumPy or torch) and shape.
    """
    # (The checks are ordered for the common case: a 16-element cast costs about 2 us in all.)
    kind = kind_of(x)
    if kind == "torch":
        check_not_tracked(x, "x")
    if out is None and rounding != "stochastic" and (kind == "torch" or (type(x) is np.ndarray and x.ndim > 1
                                                                          and not x.flags.c_contiguous)):
        order = _storage_order(x, kind)
        if order is not None:
            # A dense input in another order (a transpose, Fortran order, channels_last): cast in memory order, in
            # place, and return the result in x's layout, as torch's .to() and NumPy's astype do. (Stochastic
            # rounding's draw follows the element's index, so it takes the C-order copy below.)
            inverse = [0] * len(order)
            for i, d in enumerate(order):
                inverse[d] = i
            result = cast(_permuted(x, kind, order), dtype, saturate=saturate, scale=scale, scale_inv=scale_inv,
                          rounding=rounding, seed=seed, threads=threads)
            return _permuted(result, kind, inverse)
    src = as_bits(x, kind)
    target = _NAME_OF_STRING.get(dtype) if type(dtype) is str else None
    if target is None:
        target = resolve_dtype(dtype)
    if rounding == "nearest":
        stochastic = False
        if seed is not None:
            raise ValueError("seed is for rounding='stochastic'")
    elif rounding == "stochastic":
        stochastic = True
    else:
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', not {rounding!r}")
    if threads is not None:
        threads = check_threads(threads)
    if seed is not None:
        seed = check_int("seed", seed, 0, 2**64 - 1)
    if type(saturate) is not bool:
        saturate = check_bool("saturate", saturate)
    if scale is not None:
        scale = check_float32("scale", scale)
    if scale_inv is not None:
        scale_inv = check_float32("scale_inv", scale_inv)
    if ((stochastic or scale is not None) and src.dtype_name == "float64" and kind == "numpy"
            and not isinstance(x, np.ndarray) and not hasattr(x, "__dlpack__")):
        # A list or scalar with a scale or stochastic rounding: the kernels that do those read float32.
        src = Source(src.bits.astype(np.float32), "float32", src.shape)
    to_fp8 = src.dtype_name in _KERNEL_WIDE and target in _FP8_SET
    from_fp8 = src.dtype_name in _FP8_SET and target in _KERNEL_WIDE
    hint = ""
    if src.dtype_name == "float64":
        hint = f" (x is float64: cast x.{'float()' if kind == 'torch' else 'astype(np.float32)'})"
    if stochastic and not to_fp8:
        raise ValueError(f"rounding='stochastic' is for casts from float32, bfloat16 or float16 to FP8{hint}")
    if scale is not None and from_fp8:
        if scale_inv is not None:
            raise ValueError("give a decode its dequantization scale once, as scale_inv=")
        # Before scale_inv= existed a decode took its multiplier as scale=: the same value, now named for what it is.
        warnings.warn("scale= on a cast from FP8 is the multiplier decode(q) * scale; name it scale_inv= (the same "
                      "value: the dequantization scale, 1 / the encode's scale). scale= on a decode will be refused",
                      FutureWarning, stacklevel=_caller_stacklevel())
        scale_inv, scale = scale, None
    if scale is not None and not to_fp8:
        raise ValueError(f"scale is for casts from float32, bfloat16 or float16 to FP8{hint}")
    if scale_inv is not None and not from_fp8:
        if to_fp8:
            raise ValueError("scale_inv is the dequantization scale of a cast from FP8 (x = decode(q) * scale_inv); "
                             "an encode multiplies by the quantization scale: pass scale= (1 / scale_inv)")
        raise ValueError("scale_inv is for casts from FP8 to float32, bfloat16 or float16")
    result, result_bits = empty_like_of(x, kind, src.shape, target, out)
    flat_in, flat_out = src.bits, result_bits  # the library reads and writes them as flat, contiguous arrays
    if out is not None and may_share_memory(flat_in, flat_out):
        # The kernels read a block while they write another: x would be overwritten before it is read.
        raise ValueError("out shares memory with x; cast into a separate array")
    if src.size == 0:
        return result
    if out is not None:
        about_to_write(out)
    if to_fp8:
        _fp8kit.cast_to_fp8(flat_in, src.dtype_name, flat_out, target, bool(saturate),
                            1.0 if scale is None else float(scale), stochastic, 0 if seed is None else int(seed),
                            threads)
    elif from_fp8:
        _fp8kit.cast_from_fp8(flat_in, src.dtype_name, flat_out, target,
                              1.0 if scale_inv is None else float(scale_inv), threads)
    else:  # wide <-> wide, FP8 <-> FP8, float64: each element rounded once from its exact value
        _fp8kit.convert(flat_in, src.dtype_name, flat_out, target, bool(saturate), threads)
    return result


def _caller_stacklevel() -> int:
    """warnings.warn's stacklevel of the first frame outside this module (cast calls itself for a transposed x)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    return level


def _matrix_shape(shape: tuple) -> tuple[int, int]:
    """The matrix quantize sees: the last dimension is the row (a 0-d or 1-d array is one row)."""
    cols = int(shape[-1]) if len(shape) >= 1 else 1
    rows = math.prod(shape[:-1])  # Python ints: exact (an empty product is 1)
    if cols == 0:
        rows = 0
    return rows, cols


def _float64_as_float32(x: np.ndarray, what: str, threads: Optional[int]) -> np.ndarray:
    """A float64 array rounded to float32 (a copy) for the kernels that compute in float32; a finite value past
    float32's range is a ValueError (it would become an infinity, which amax and the scales skip: a silent loss)."""
    bits = np.empty(x.shape, np.float32)
    _fp8kit.convert(x, "float64", bits, "float32", False, threads)
    infinite = np.isinf(bits)
    if infinite.any():
        past = infinite & np.isfinite(x)
        if past.any():
            raise ValueError(f"{what}: x holds finite float64 values past float32's range (such as "
                             f"{x[past].flat[0]:g}), which fp8kit computes in: scale x down first")
    return bits


def _wide_matrix_input(x: Any, kind: str, what: str, threads: Optional[int], keep_float64: bool = False) -> tuple:
    """x for the matrix kernels (quantize, analyze): (its Source, the dtype they read, the array they read: a NumPy
    array or a contiguous torch tensor, which the library takes as it is), float32, bfloat16 and float16 as they are,
    float64 rounded to float32 first (a copy) unless keep_float64 (analyze rounds it itself and counts what the
    rounding loses); anything else a ValueError."""
    src = as_bits(x, kind)
    name, bits = src.dtype_name, src.bits
    if name == "float64" and keep_float64:
        return src, name, bits
    if name == "float64":
        bits = _float64_as_float32(src.array(), what, threads)
        name = "float32"
    if name not in _KERNEL_WIDE:
        raise ValueError(f"{what} takes float32, bfloat16, float16 or float64, not {name}")
    return src, name, bits


def _scale_grid(scales: Any, shape: tuple, granularity: str) -> Any:
    """Scales (a NumPy array of the block grid: grid rows x grid cols of the matrix whose rows are the last
    dimension) laid out for an array of `shape`: where each block lies in one row (row, block:1xC, mx32), the
    array's leading dimensions and the grid's columns, shape[:-1] + (grid cols,), as PyTorch's and torchao's per-row
    and MX scales are (a view, no copy; for a 2-D array the grid itself, but (rows, 0) for rows of no element);
    otherwise the grid as it is."""
    if len(shape) == 0 or not _fp8kit.one_row_blocks(granularity):
        return scales
    return scales.reshape(tuple(shape[:-1]) + (scales.shape[1],))


class ScaledTensor:
    """FP8 codes and their dequantization scales: x ~= decode(data) * scale_inv of each element's block.

    data: the codes as an FP8 array of the quantized array's kind (NumPy with the ml_dtypes dtype, or torch) and
      shape, a view of the codes fp8kit wrote (no copy).
    scale_inv: the dequantization scales, float32, one per block of the matrix whose rows are the last dimension:
      per tensor (1, 1), per column (1, cols), block:RxC (ceil(rows / R), ceil(cols / C)); where each block lies in
      one row (row, block:1xC, mx32) the leading dimensions are kept: shape[:-1] + (1,) per row, shape[:-1] +
      (ceil(cols / 128),) for block:1x128 (a (B, T, H) array: (B, T, H / 128)), as PyTorch's and torchao's scales.
    granularity ("tensor", "row", "col", "block:RxC", "mx32", "mx32-rceil"), format ("e4m3fn", ...), shape,
    original_dtype (what dequantize() returns by default). MX scales are powers of two (E8M0 codes' values).
    Made by quantize() and load(); it pickles and deep-copies (codes and scales with it).
    """

    def __init__(self, q: Any, kind: str, shape: tuple, original_dtype: str):
        if not isinstance(q, _fp8kit.ScaledTensor):
            raise TypeError(f"ScaledTensor wraps what fp8kit.quantize() or fp8kit.load() made, not "
                            f"{type(q).__name__}; use fp8kit.quantize(x, ...)")
        if kind not in ("numpy", "torch"):
            raise ValueError(f"kind must be 'numpy' or 'torch', not {kind!r}")
        shape = tuple(check_int("shape", d, 0, 2**63 - 1) for d in shape)
        if math.prod(shape) != q.rows * q.cols or (q.rows * q.cols and _matrix_shape(shape) != (q.rows, q.cols)):
            # (the matrix is the shape's last dimension as rows: save() sizes the scale tensors by it)
            raise ValueError(f"shape {shape} is not the {q.rows} x {q.cols} matrix of the codes (its last dimension "
                             f"is the row)")
        self._q = q
        self._kind = kind
        self.shape = shape
        self.original_dtype = resolve_dtype(original_dtype)

    @property
    def format(self) -> str:
        return self._q.format

    def __setstate__(self, state: Any) -> None:
        # A pickle is data: its Python fields are checked as __init__ checks them (the C++ part checks its own).
        if not isinstance(state, dict) or set(state) != {"_q", "_kind", "shape", "original_dtype"}:
            raise ValueError("not a ScaledTensor state (the fields _q, _kind, shape and original_dtype are expected); "
                             "it comes from pickling a ScaledTensor")
        self.__init__(state["_q"], state["_kind"], state["shape"], state["original_dtype"])

    @property
    def granularity(self) -> str:
        return self._q.granularity

    def _as_kind(self, a: np.ndarray) -> Any:
        if self._kind == "torch":
            import torch
            return torch.from_numpy(a)
        return a

    @property
    def data(self) -> Any:
        name = resolve_dtype(self.format)
        codes = self._q.codes.reshape(self.shape)
        if self._kind == "torch":
            import torch
            return torch.from_numpy(codes).view(_torch_dtype(name))
        return codes.view(_NUMPY_DTYPES[name])

    @property
    def scale_inv(self) -> Any:
        return self._as_kind(_scale_grid(self._q.scale_inv, self.shape, self.granularity))

    def dequantize(self, dtype: Any = None, *, threads: Optional[int] = None) -> Any:
        """decode(data) * scale_inv, as `dtype` (float32, bfloat16, float16; default: what was quantized)."""
        return dequantize(self, self.original_dtype if dtype is None else dtype, threads=threads)

    def __repr__(self) -> str:
        return (f"ScaledTensor(format={self.format!r}, granularity={self.granularity!r}, shape={self.shape}, "
                f"scales={tuple(_scale_grid(self._q.scale_inv, self.shape, self.granularity).shape)})")

_GRANULARITIES = "tensor, row, col, block:RxC (block:1x128, block:128x128), mx32"


def _storage_order(x: Any, kind: str) -> Optional[list]:
    """For a dense array that is not C-contiguous, the order of its dimensions by stride (outermost first) in which
    it is C-contiguous: a view in that order reads its memory in place. None for a C-contiguous one, or one whose
    elements do not tile a block of memory (a slice with a step, an expanded or negatively strided view)."""
    if kind == "torch":
        import torch
        if x.is_nested or x.layout != torch.strided or x.dim() < 2 or x.is_contiguous():
            return None  # (a nested tensor has no strides: as_bits refuses it in one line)
        strides, ndim = x.stride(), x.dim()
    else:
        if type(x) is not np.ndarray or x.ndim < 2 or x.flags.c_contiguous:
            return None
        strides, ndim = x.strides, x.ndim
    if any(st < 0 for st in strides):
        return None
    order = sorted(range(ndim), key=lambda d: -strides[d])
    view = _permuted(x, kind, order)
    dense = view.is_contiguous() if kind == "torch" else view.flags.c_contiguous
    return order if dense else None


def _permuted(x: Any, kind: str, order: list) -> Any:
    """x with its dimensions in `order` (a view)."""
    return x.permute(*order) if kind == "torch" else np.transpose(x, order)


def quantize(x: Any, format: Any = "e4m3fn", granularity: str = "tensor", *, saturate: bool = True, margin: int = 0,
             scale_rounding: Optional[str] = None, threads: Optional[int] = None) -> ScaledTensor:
    """Scaled quantization: per block of `granularity`, scale = fp8_max / amax / 2^margin (the one formula, with
    Transformer Engine's guards), codes = encode(x * scale), scale_inv = 1 / scale — in one fused pass.

    x: float32, bfloat16 or float16 (NumPy or torch; float64 is rounded to float32 first), any shape: the matrix is
      its last dimension as rows. granularity: "tensor", "row", "col", "block:RxC" ("block:1x128", "block:128x128"),
      "mx32" (MX: E8M0 power-of-two scales per 32 along the row). saturate: overflow policy of the encode (True:
      Transformer Engine's; nothing overflows with the computed scales unless margin < 0).
    scale_rounding: None (exact), "pow2" (rounded down to a power of two: DeepSeek-V3.1's ue8m0, torchao row-wise);
      for mx32: "floor" (OCP MX's default) or "rceil" (NVIDIA's).
    Returns a ScaledTensor (its scale_inv keeps an N-D x's leading dimensions where each block is in one row:
    (B, T, H) per 1x128 block gives (B, T, ceil(H/128))); fp8kit.dequantize(q) or q.dequantize() brings it back.
    """
    target = resolve_dtype(format)
    if target not in FP8:
        raise ValueError(f"format must be an FP8 format, not {format!r}")
    if not isinstance(granularity, str):
        raise TypeError(f"granularity must be a string ({_GRANULARITIES}), not {type(granularity).__name__}")
    is_mx = granularity.startswith("mx")
    if scale_rounding not in (None, "exact", "pow2", "floor", "rceil"):
        raise ValueError(f"scale_rounding must be None, 'pow2' or (mx32) 'floor' or 'rceil', not {scale_rounding!r}")
    if is_mx and scale_rounding in ("pow2", "exact"):
        raise ValueError("MX scales are powers of two: scale_rounding is 'floor' or 'rceil' for mx32")
    if not is_mx and scale_rounding in ("floor", "rceil"):
        raise ValueError(f"scale_rounding {scale_rounding!r} is for mx32")
    if granularity.endswith("-rceil") and scale_rounding == "floor":
        raise ValueError(f"granularity {granularity!r} takes RCEIL scales, scale_rounding 'floor' contradicts it")
    if scale_rounding == "rceil":
        granularity = granularity + "-rceil" if not granularity.endswith("-rceil") else granularity
    margin = check_int("margin", margin, -(2**31), 2**31 - 1)
    if is_mx and margin != 0:
        raise ValueError("margin does not apply to mx32: its E8M0 scales come from each block's amax by OCP's rule")
    threads = check_threads(threads)
    kind = kind_of(x)
    src, name, bits = _wide_matrix_input(x, kind, "quantize", threads)
    rows, cols = _matrix_shape(src.shape)
    saturate = check_bool("saturate", saturate)
    q = _fp8kit.quantize(bits, name, rows, cols, target, granularity, saturate, margin,
                         scale_rounding == "pow2", threads)
    return ScaledTensor(q, kind, src.shape, name)


def dequantize(q: ScaledTensor, dtype: Any = "float32", *, threads: Optional[int] = None) -> Any:
    """decode(q.data) * q.scale_inv of each block, as float32, bfloat16 or float16, in q's kind and shape."""
    if not isinstance(q, ScaledTensor):
        raise TypeError(f"dequantize takes a ScaledTensor (from fp8kit.quantize), not {type(q).__name__}")
    target = resolve_dtype(dtype)
    if target not in _KERNEL_WIDE:
        raise ValueError(f"dequantize gives float32, bfloat16 or float16, not {target}")
    threads = check_threads(threads)
    result, bits = empty_like_of(None, q._kind, q.shape, target, None)
    if q._q.rows * q._q.cols:
        _fp8kit.dequantize(q._q, bits, target, threads)
    return result


def amax(x: Any, granularity: str = "tensor", *, threads: Optional[int] = None) -> Any:
    """max |x| over the finite elements: a float for granularity "tensor", else a float32 array with one value per
    block of the granularity (as quantize's scale_inv is laid out). x is read as float32 (other float types are
    converted first: a copy)."""
    if not isinstance(granularity, str):
        raise TypeError(f"granularity must be a string ({_GRANULARITIES}), not {type(granularity).__name__}")
    threads = check_threads(threads)
    kind = kind_of(x)
    src = as_bits(x, kind)
    bits = src.bits
    if src.dtype_name == "float64":
        bits = _float64_as_float32(src.array(), "amax", threads)
    elif src.dtype_name != "float32":
        bits = np.empty(src.shape, np.float32)
        _fp8kit.convert(src.bits, src.dtype_name, bits, "float32", False, threads)
    rows, cols = _matrix_shape(src.shape)
    blocks, _, _ = _fp8kit.amax(bits, rows, cols, granularity, threads)
    if granularity == "tensor":
        return float(blocks.max()) if blocks.size else 0.0
    blocks = _scale_grid(blocks, src.shape, granularity)
    if kind == "torch":
        import torch
        return torch.from_numpy(blocks)
    return blocks


def _scales_of(s: Any, what: str) -> Source:
    """A scale argument (a number, or a float32 NumPy array / torch tensor) as float32 elements the library reads: a
    contiguous NumPy array or torch tensor (Source.bits) and the argument's shape."""
    if s is None or isinstance(s, (str, bytes, bool, np.bool_)):
        raise TypeError(f"{what} must be a number or a float32 array, not {type(s).__name__}")
    if isinstance(s, (int, float, np.integer, np.floating)):
        return Source(np.array([check_float32(what, s)], np.float32), "float32", (1,))
    try:
        src = as_bits(s, kind_of(s), what)
    except ElementTypeError:  # ints, bools: named as the other refused types are (a device or a layout: as it is)
        raise TypeError(f"{what} must be a number or a float32 array{', bfloat16 or float16' if what == 'bias' else ''}"
                        f", not {getattr(s, 'dtype', type(s).__name__)}") from None
    if src.dtype_name != "float32":
        if what == "bias" and src.dtype_name in ("bfloat16", "float16"):  # torch takes these too: widened exactly
            wide = np.empty(src.shape, np.float32)
            if wide.size:
                _fp8kit.convert(src.bits, src.dtype_name, wide, "float32", False, None)
            return Source(wide, "float32", src.shape)
        if what == "bias":
            raise TypeError(f"bias must be float32, bfloat16 or float16 (convert it with .float() or "
                            f".astype(np.float32)), not {src.dtype_name}")
        raise TypeError(f"{what} must be float32 (as torch._scaled_mm's), not {src.dtype_name}")
    return src


def scaled_mm(a: Any, b: Any, scale_a: Any, scale_b: Any, bias: Any = None, scale_result: Any = None,
              out_dtype: Any = "float32", use_fast_accum: bool = False, *, threads: Optional[int] = None) -> Any:
    """torch._scaled_mm on the CPU: out = (a @ b) * scale_a * scale_b + bias, FP8 products accumulated in FP32.

    a: FP8 (M, K); b: FP8 (K, N), column-major as torch._scaled_mm wants it (b.T contiguous: N x K weights, taken
      without a transpose) or row-major (K x N); e5m2 x e5m2 is refused, as cuBLASLt (and so torch._scaled_mm on
      CUDA) refuses it. The codes are read where they are, not copied (a contiguous array, or the contiguous
      b.T); the GIL is released while the product runs, so another thread must not write them meanwhile.
    scale_a, scale_b: dequantization scales, float32, in torch._scaled_mm's shapes: one value each (per tensor: a
      number or a 1-element array); per row of a, (M, 1), and per column of b, (1, N) (row-wise scaling); or blocks
      along K of 128 (DeepSeek-V3's recipe): scale_a (M, ceil(K/128)) per 1x128 block or (ceil(M/128),
      ceil(K/128)) per 128x128 block, scale_b (ceil(K/128), ceil(N/128)) per 128x128 block or (ceil(K/128), N)
      per 128x1 block of b. Blocked products scale each K block's FP32 sum, as the library's blocked GEMMs do.
    The arguments in torch._scaled_mm's order, so that a positional call to it with out_dtype given runs here
    unchanged; out_dtype defaults to float32 (torch's default is a's FP8 type, an output fp8kit does not make:
    quantize the result instead), and e5m2 x e5m2, which torch's CPU kernel takes, is refused. bias: N values or
    None, float32, or bfloat16 / float16 (widened exactly). scale_result: a number or None, with no effect (torch
    applies it to FP8 outputs only). out_dtype: "float32", "bfloat16" or "float16" (the FP32 result rounded once).
    use_fast_accum: accepted and ignored: every kernel here accumulates in FP32 (as torch's CPU kernel does). A torch
    argument that requires grad is refused while grad mode is on (the result carries no gradient).
    Returns an (M, N) array of a's kind. The kernel is the level's (fp8kit.conversion_kernel() for the casts;
    docs/gemm.md for the GEMMs and their results contract)."""
    threads = check_threads(threads)
    if out_dtype is None:
        raise ValueError("out_dtype=None is torch._scaled_mm's FP8 output, which fp8kit.scaled_mm does not make: give "
                         "float32, bfloat16 or float16 (and quantize the result for FP8)")
    if scale_result is not None:
        # torch applies it to FP8 outputs only; for the outputs made here it has no effect there either
        check_float32("scale_result", scale_result)
    check_bool("use_fast_accum", use_fast_accum)
    kind = kind_of(a)
    for value, what in ((a, "a"), (b, "b"), (scale_a, "scale_a"), (scale_b, "scale_b"), (bias, "bias")):
        if value is not None and kind_of(value) == "torch":
            check_not_tracked(value, what)
    operand_fix = "scaled_mm multiplies FP8 operands: quantize it first (fp8kit.quantize or fp8kit.cast)"
    sa = as_bits(a, kind, "a", operand_fix)
    if kind_of(b) != kind:
        raise TypeError("a and b must be of the same kind (NumPy arrays or torch tensors)")
    if len(sa.shape) != 2:
        raise ValueError(f"a must be 2-D (M, K), not {sa.shape}")
    if sa.dtype_name not in FP8:
        raise ValueError(f"a must be FP8, not {sa.dtype_name}")
    m, k = sa.shape
    if not hasattr(b, "shape"):
        raise TypeError(f"b must be an FP8 array (NumPy with an ml_dtypes dtype, or torch), not {type(b).__name__}")
    b_shape = tuple(b.shape)
    if len(b_shape) != 2 or b_shape[0] != k:
        raise ValueError(f"b must be (K, N) = ({k}, N), not {b_shape}")
    n = b_shape[1]
    bt = b.t() if kind == "torch" else b.T
    b_is_nk = bool(bt.is_contiguous()) if kind == "torch" else bool(bt.flags.c_contiguous)
    sb = as_bits(bt if b_is_nk else b, kind, "b", operand_fix)
    if sb.dtype_name not in FP8:
        raise ValueError(f"b must be FP8, not {sb.dtype_name}")
    source_a, source_b = _scales_of(scale_a, "scale_a"), _scales_of(scale_b, "scale_b")
    scales_a, scales_b = source_a.bits, source_b.bits  # NumPy arrays or torch tensors, handed over as they are
    shape_a, shape_b = tuple(source_a.shape), tuple(source_b.shape)
    kb = -(-k // 128)  # K blocks of 128
    if source_a.size == 1:
        a_granularity = "tensor"
    elif shape_a == (m, 1):
        a_granularity = "row"
    elif shape_a == (m, kb):
        a_granularity = "block:1x128"
    elif shape_a == (-(-m // 128), kb):  # 128 x 128 blocks of A: each row takes its block's scales
        scales_a = np.ascontiguousarray(np.repeat(source_a.array().reshape(shape_a), 128, axis=0)[:m])
        a_granularity = "block:1x128"
    else:
        raise ValueError(f"scale_a must be one value, (M, 1) = ({m}, 1) per row, (M, ceil(K/128)) = ({m}, {kb}) per "
                         f"1x128 block or (ceil(M/128), ceil(K/128)) = ({-(-m // 128)}, {kb}) per 128x128 block, "
                         f"not {shape_a}")
    if source_b.size == 1:
        b_granularity = "tensor"
    elif shape_b == (1, n):
        b_granularity = "row" if b_is_nk else "col"
    elif shape_b == (kb, -(-n // 128)):  # 128 x 128 blocks of b (K x N)
        b_granularity = "block:128x128"
        if b_is_nk:  # the library indexes the blocks of the N x K weights
            scales_b = np.ascontiguousarray(source_b.array().reshape(shape_b).T)
    elif shape_b == (kb, n):  # 128 x 1 blocks of b (K x N): 1 x 128 of the N x K weights
        b_granularity = "block:1x128" if b_is_nk else "block:128x1"
        if b_is_nk:
            scales_b = np.ascontiguousarray(source_b.array().reshape(shape_b).T)
    else:
        raise ValueError(f"scale_b must be one value, (1, N) = (1, {n}) per column, (ceil(K/128), ceil(N/128)) = "
                         f"({kb}, {-(-n // 128)}) per 128x128 block or (ceil(K/128), N) = ({kb}, {n}) per 128x1 "
                         f"block, not {shape_b}")
    target = resolve_dtype(out_dtype)
    if target not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"out_dtype must be float32, bfloat16 or float16, not {target}")
    bias_bits = None
    if bias is not None:
        source_bias = _scales_of(bias, "bias")
        if len(source_bias.shape) != 1 or source_bias.shape[0] != n:  # (a number is one value: (1,))
            raise ValueError(f"bias must be 1-D (N,) = ({n},), as torch._scaled_mm's, not {tuple(source_bias.shape)}")
        bias_bits = source_bias.bits
    result, bits = empty_like_of(a, kind, (m, n), target, None)
    b_rows, b_cols = (n, k) if b_is_nk else (k, n)
    # float16: the FP32 result, rounded once (the library's outputs are float32 or bfloat16)
    wide = np.empty((m, n), np.float32) if target == "float16" else bits
    _fp8kit.scaled_mm(sa.bits, sa.dtype_name, m, k, scales_a, a_granularity, sb.bits, sb.dtype_name, b_rows, b_cols,
                      scales_b, b_granularity, b_is_nk, bias_bits, wide, "float32" if target == "float16" else target,
                      threads)
    if target == "float16" and m * n:
        _fp8kit.convert(wide, "float32", bits, "float16", False, threads)
    return result


def analyze(x: Any, format: Union[str, Sequence[str]] = "e4m3fn",
            granularity: Union[str, Sequence[str]] = ("tensor", "row", "block:1x128", "mx32"), *,
            saturate: bool = True, threads: Optional[int] = None) -> Any:
    """Does FP8 hold x, and at which granularity? x is quantized per format x granularity (scales as quantize
    computes them) and what each loses is measured: `fp8kit analyze --json`'s keys, one dict per combination:
    format, granularity, overflow, rows, cols, amax, scale (None per block), scales (how many the granularity takes
    for this shape), sqnr_db, exact, underflow_fraction,
    underflow_count, saturated_count, nonfinite_count, max_abs_error, max_rel_error, holds (SQNR >= 25 dB or exact,
    nothing saturated, <= 0.1% of the nonzeros flushed to zero).

    format and granularity: one name each (then one dict is returned) or sequences of them (then a list of dicts,
    formats outer, as the CLI prints them). x: float32, bfloat16, float16 or float64 (rounded to float32 first:
    values past its range count as non-finite, nonzero values it reads as 0 as underflow), any shape, its last
    dimension the row."""
    def names(v: Any) -> Optional[list]:  # several names (any iterable), or None for one (a name or a dtype object)
        if isinstance(v, (bytes, bytearray)):  # would iterate into integers
            raise TypeError(f"format and granularity take str names, not {type(v).__name__}")
        if isinstance(v, (str, type, np.dtype)) or type(v).__name__ == "dtype" or not hasattr(v, "__iter__"):
            return None
        return list(v)

    format_names, granularity_names = names(format), names(granularity)
    single = format_names is None and granularity_names is None
    format_names = [format] if format_names is None else format_names
    granularity_names = [granularity] if granularity_names is None else granularity_names
    saturate = check_bool("saturate", saturate)
    formats_ = []
    for f in format_names:
        name = resolve_dtype(f)
        if name not in FP8:
            raise ValueError(f"format must be an FP8 format, not {f!r}")
        formats_.append(name[len("float8_"):])
    for g in granularity_names:
        if not isinstance(g, str):
            raise TypeError(f"granularity must be a string ({_GRANULARITIES}), not {type(g).__name__}")
    threads = check_threads(threads)
    src, name, bits = _wide_matrix_input(x, kind_of(x), "analyze", threads, keep_float64=True)
    rows, cols = _matrix_shape(src.shape)
    result = _fp8kit.analyze(bits, name, rows, cols, formats_, granularity_names, saturate, threads)
    return result[0] if single else result


# ------------------------------------------------------------------------------------------------- checkpoints
# The checkpoint functions run the CLI's commands in this process (the same code as `fp8kit quantize ...`), with
# --json: what they return is the command's JSON report as a dict, and an error is the command's one-line message.

def _path(p: Any, what: str) -> str:
    """A path argument as text: str, bytes (decoded as the file system encodes names) or os.PathLike; a NUL byte is a
    ValueError, as open() gives (the C++ side would stop at it and read or write another file)."""
    try:
        path = os.fsdecode(os.fspath(p))
    except TypeError:
        raise TypeError(f"{what} must be a path (str, bytes or os.PathLike), not {type(p).__name__}") from None
    if "\0" in path:
        raise ValueError(f"{what} holds a NUL byte ({path!r}); a path cannot contain one")
    _check_utf8(path, what, "fp8kit opens paths by their UTF-8 names: rename it")
    return path


def _check_utf8(text: str, what: str, fix: str) -> None:
    """A ValueError naming `what` where text is not UTF-8 (a lone surrogate: bytes os.fsdecode could not decode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} {text!r} is not valid UTF-8 text ({e.reason} at {e.start}); {fix}") from None


def _names(what: str, values: Any) -> list:
    """One name or several (a str, or an iterable of str): anything else is a TypeError naming `what`."""
    if isinstance(values, str):
        return [values]
    if isinstance(values, (bytes, bytearray)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{what} must be a string or a sequence of strings, not {type(values).__name__}")
    out = list(values)
    for v in out:
        if not isinstance(v, str):
            raise TypeError(f"{what} must hold strings, not {type(v).__name__}")
    return out


# The CLI's options in the commands' messages, as the Python functions spell them.
_PYTHON_SPELLING = {"--force": "force=True", "--scheme": "scheme", "--layout": "layout", "--format": "format",
                    "--ignore": "ignore", "--scale-fmt": "scale_fmt", "--max-shard-size": "max_shard_size",
                    "--to": "to", "--saturate": "saturate=True", "--no-saturate": "saturate=False"}
# An option as a word of its own (a path holding "--force" is left as it is).
_CLI_OPTION = re.compile(r"(?<![\w./-])--[a-z][a-z0-9-]*(?![\w./-])")


def _command(args: list) -> Any:
    try:
        return json.loads(_fp8kit.command(args))
    except (ValueError, OSError, RuntimeError) as e:
        message = _CLI_OPTION.sub(lambda m: _PYTHON_SPELLING.get(m.group(0), m.group(0)), str(e))
        if message == str(e):
            raise
        raise type(e)(message) from None


_CLI_DTYPE = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
              **{name: name[len("float8_"):] for name in FP8}}


def _option(flag: str, value: Any) -> list:
    return [] if value is None else [flag, str(value)]


def inspect(path: Any, *, analysis: bool = True) -> dict:
    """What a .safetensors file or checkpoint directory holds (`fp8kit inspect --json`): path, shards, layout (the
    FP8 layout detected, or None) and evidence, total_bytes, tensors (name, dtype, shape, bytes, shard, role, and
    for high-precision tensors e4m3fn_holds_at / e4m3fn_sqnr_db unless analysis=False), quantized (weight, scale,
    input_scale, granularity)."""
    args = ["inspect", "--quiet"] + ([] if check_bool("analysis", analysis) else ["--no-analysis"])
    return _command(args + ["--json", "--", _path(path, "path")])


def quantize_checkpoint(src: Any, dst: Any, scheme: Optional[str] = None, layout: Optional[str] = None, *,
                        format: str = "e4m3fn", ignore: Sequence[str] = (), scale_fmt: str = "float",
                        max_shard_size: Optional[str] = None, force: bool = False) -> dict:
    """`fp8kit quantize SRC DST`: a bf16/f16/f32 checkpoint (file or directory) to FP8 weights in a layout serving
    stacks load. scheme: "fp8-tensor", "fp8-channel", "fp8-block" (128x128), "mxfp8"; layout: "deepseek",
    "compressed-tensors", "autofp8", "fbgemm", "mxfp8", "native" (either may be implied by the other, as in the
    CLI). ignore: regexes of tensors to leave as they are. scale_fmt: "float" or "ue8m0". The output is written
    crash-safely; an existing one is replaced only with force=True. Returns the command's JSON report (quantized,
    copied, bytes_in, bytes_out, seconds, scheme, format, layout, ...)."""
    format_name = resolve_dtype(format)
    if format_name not in ("float8_e4m3fn", "float8_e5m2"):
        raise ValueError(f"format must be e4m3fn or e5m2, not {format!r}")
    args = ["quantize", "--quiet", "--json"] + _option("--scheme", scheme) + _option("--layout", layout)
    args += ["--format", format_name[len("float8_"):], "--scale-fmt", str(scale_fmt)]
    args += _option("--max-shard-size", max_shard_size)
    for regex in _names("ignore", ignore):
        args += ["--ignore", regex]
    if check_bool("force", force):
        args.append("--force")
    return _command(args + ["--", _path(src, "src"), _path(dst, "dst")])


def dequantize_checkpoint(src: Any, dst: Any, to: Any = "bf16", *, max_shard_size: Optional[str] = None,
                          force: bool = False) -> dict:
    """`fp8kit dequantize SRC DST --to TO`: an FP8 checkpoint in any layout fp8kit detects back to bf16, f16 or
    f32 (scales dropped, quantization_config removed). Returns the command's JSON report."""
    name = resolve_dtype(to)
    if name not in ("bfloat16", "float16", "float32"):  # (the CLI's message would name its own spelling)
        raise ValueError(f"to must be bfloat16, float16 or float32 ('bf16', 'f16', 'f32'), not {to!r}")
    args = ["dequantize", "--quiet", "--json", "--to", _CLI_DTYPE[name]]
    args += _option("--max-shard-size", max_shard_size) + (["--force"] if check_bool("force", force) else [])
    return _command(args + ["--", _path(src, "src"), _path(dst, "dst")])


def convert_checkpoint(src: Any, dst: Any, to: Any, *, saturate: Optional[bool] = None,
                       max_shard_size: Optional[str] = None, force: bool = False) -> dict:
    """`fp8kit convert SRC DST --to TO`: every floating tensor cast to `to` (f32, f64, f16, bf16 or an FP8 format,
    unscaled), each element rounded once. saturate (FP8 targets only): True (the CLI's default) or False (overflow
    to Inf/NaN). Returns the command's JSON report."""
    args = ["convert", "--quiet", "--json", "--to", _CLI_DTYPE[resolve_dtype(to)]]
    if saturate is not None:
        args.append("--saturate" if check_bool("saturate", saturate) else "--no-saturate")
    args += _option("--max-shard-size", max_shard_size) + (["--force"] if check_bool("force", force) else [])
    return _command(args + ["--", _path(src, "src"), _path(dst, "dst")])


# safetensors dtypes as NumPy dtypes (F4 and F6 are packed below a byte: no NumPy dtype holds them).
_SAFETENSORS_NUMPY = {
    "BOOL": np.dtype(np.bool_), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8), "I16": np.dtype(np.int16),
    "U16": np.dtype(np.uint16), "I32": np.dtype(np.int32), "U32": np.dtype(np.uint32), "I64": np.dtype(np.int64),
    "U64": np.dtype(np.uint64), "F16": np.dtype(np.float16), "BF16": _NUMPY_DTYPES["bfloat16"],
    "F32": np.dtype(np.float32), "F64": np.dtype(np.float64), "C64": np.dtype(np.complex64),
    "F8_E4M3": _NUMPY_DTYPES["float8_e4m3fn"], "F8_E5M2": _NUMPY_DTYPES["float8_e5m2"],
    "F8_E8M0": _NUMPY_DTYPES["float8_e8m0fnu"], "F8_E4M3FNUZ": _NUMPY_DTYPES["float8_e4m3fnuz"],
    "F8_E5M2FNUZ": _NUMPY_DTYPES["float8_e5m2fnuz"],
}


def _tensor_bytes(name: str, value: Any) -> tuple:
    """(safetensors dtype, shape, contiguous little-endian bytes as a uint8 NumPy array) of a NumPy array or CPU
    torch tensor, viewing its memory where it is contiguous."""
    if kind_of(value) == "torch":
        import torch
        if value.device.type != "cpu":
            raise ValueError(f"tensor '{name}' is on {value.device}; move it to the CPU first (.cpu())")
        dtype = _TORCH_SAFETENSORS.get(str(value.dtype).removeprefix("torch."))
        if dtype is None:
            raise ValueError(f"tensor '{name}' is {value.dtype}, which safetensors does not store")
        _check_torch_layout(value, f"tensor '{name}'")
        t = value.detach()
        if t.is_conj():  # lazily conjugated or negated views: their memory holds the values before the operation
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        t = t.contiguous()
        _check_torch_memory(t, f"tensor '{name}'")
        shape = tuple(t.shape)
        flat = t.reshape(-1)  # (bool views as uint8 like every other dtype: one byte per element)
        return dtype, shape, flat.view(torch.uint8).numpy() if flat.numel() else np.zeros(0, np.uint8)
    if not isinstance(value, np.ndarray):
        raise TypeError(f"tensor '{name}' must be a NumPy array, a torch tensor or a ScaledTensor, not "
                        f"{type(value).__name__}")
    dtype = _NUMPY_SAFETENSORS.get(value.dtype)
    if dtype is None:
        if value.dtype.byteorder == ">":
            raise ValueError(f"tensor '{name}' is big-endian {value.dtype}; safetensors stores little-endian: "
                             f"convert it with .astype(a.dtype.newbyteorder('<'))")
        raise ValueError(f"tensor '{name}' is {value.dtype}, which safetensors does not store")
    a = np.ascontiguousarray(value)  # (at least 1-D: a 0-d array keeps its shape, ())
    return dtype, value.shape, a.reshape(-1).view(np.uint8)


def save(path: Any, tensors: Any, *, layout: Optional[str] = None, metadata: Optional[dict] = None,
         force: bool = False) -> None:
    """Writes {name: array} to a .safetensors file, crash-safely (a temporary file in the same directory, fsynced,
    renamed over `path`: a failure leaves an existing file as it was; it is replaced only with force=True).
    Arrays (NumPy, ml_dtypes FP8/bfloat16, CPU torch tensors) are written with their dtype and shape, from their
    memory. A ScaledTensor is written as its FP8 codes under its name and its scales under the name and in the
    dtype and shape `layout` gives them ("deepseek", "compressed-tensors", "autofp8", "fbgemm", "mxfp8", "native";
    None: the serving layout that stores its granularity's scales exactly: autofp8 per tensor, fbgemm per row,
    deepseek per 128x128 block, mxfp8 for mx32), with the __metadata__ that layout needs, so that load() and
    serving stacks read it back as the same codes and scales. Scales are stored as they are, never rounded
    (compressed-tensors keeps them in the weight's dtype: a scale that is not exactly one is a ValueError naming
    the native layout). All ScaledTensors of a file share one layout. `metadata`: more {str: str} __metadata__
    entries."""
    p = _path(path, "path")
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of name -> array, not {type(tensors).__name__}")
    plain, scaled = [], []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__} ({name!r})")
        _check_utf8(name, "the tensor name", "safetensors headers are UTF-8 JSON")
        if isinstance(value, ScaledTensor):
            scaled.append((name, value._q, tuple(value.shape)))
        else:
            dtype, shape, data = _tensor_bytes(name, value)
            plain.append((name, dtype, shape, data))
    entries = {} if metadata is None else metadata
    if not isinstance(entries, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in entries.items()):
        raise TypeError("metadata must be a dict of str -> str (safetensors' __metadata__)")
    for key, value in entries.items():
        _check_utf8(key, "the metadata key", "safetensors headers are UTF-8 JSON")
        _check_utf8(value, f"metadata['{key}']", "safetensors headers are UTF-8 JSON")
    if layout is not None and not isinstance(layout, str):
        raise TypeError(f"layout must be a layout name or None, not {type(layout).__name__}")
    try:
        _fp8kit.save(p, plain, scaled, layout, entries, check_bool("force", force))
    except ValueError as e:  # the library's refusals name the CLI's option
        raise ValueError(str(e).replace("--layout native", "layout='native'")) from None


# safetensors dtypes as torch dtype names (unsigned 16/32/64-bit need torch 2.3 or later).
_SAFETENSORS_TORCH = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32",
    "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "C64": "complex64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}
_TORCH_SAFETENSORS = {name: dtype for dtype, name in _SAFETENSORS_TORCH.items()}
_NUMPY_SAFETENSORS = {np_dtype: name for name, np_dtype in _SAFETENSORS_NUMPY.items()}


class _CopyOnWriteShards:
    """Each shard mapped once more, privately and writable (mmap ACCESS_COPY: pages are shared with the page cache
    until written; a write goes to the process's own copy, never to the file), after checking that the mapping
    shows the file the library parsed (its header bytes)."""

    def __init__(self, headers: dict):
        self._headers, self._maps = headers, {}

    def tensor(self, torch: Any, dtype: Any, shape: tuple, nbytes: int, path: str, offset: int) -> Any:
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        mm = self._maps.get(path)
        if mm is None:
            with open(path, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
            header = self._headers[path]
            if len(mm) < len(header) or mm[:len(header)] != header:
                raise OSError(f"'{path}' changed while it was being loaded; load it again")
            self._maps[path] = mm
        if offset + nbytes > len(mm):
            raise OSError(f"'{path}' changed while it was being loaded; load it again")
        data = torch.frombuffer(mm, dtype=torch.uint8, count=nbytes, offset=offset)
        if offset % dtype.itemsize != 0:
            data = data.clone()  # the element type's alignment, as torch's kernels assume it
        return data.view(dtype).reshape(shape)


def load(path: Any, *, framework: str = "numpy") -> dict:
    """A .safetensors file or checkpoint directory as {name: array}. framework="numpy" (the default): every tensor
    is a read-only NumPy view of the memory-mapped file (no copy; the file stays mapped while a view lives),
    little-endian as safetensors stores it. framework="torch" (or "pt", safetensors' spelling): torch tensors over
    a private copy-on-write mapping of the file (no copy until written; in-place writes change the process's copy,
    never the file; torch has no read-only tensors); a tensor whose offset in the file is not a multiple of its
    element size is copied. A quantized FP8 weight with its scales (any layout fp8kit detects: DeepSeek,
    compressed-tensors, AutoFP8, FBGEMM, MXFP8, native) is a ScaledTensor instead (the codes copied into it; torch
    codes and scales under "torch"), with the granularity its scales say; its scale tensors are not listed on their
    own (input scales are). ValueError for a tensor the framework cannot hold (F4, F6) or an unknown framework,
    OSError for a file that cannot be read (FileNotFoundError for a path that is not there)."""
    if framework not in ("numpy", "np", "torch", "pt"):
        raise ValueError(f"framework must be 'numpy' or 'torch' (safetensors' 'np' and 'pt' too), not {framework!r}")
    kind = "torch" if framework in ("torch", "pt") else "numpy"
    torch = None
    if kind == "torch":
        try:
            import torch
        except ImportError:
            raise ImportError("framework='torch' needs PyTorch: pip install torch") from None
    p = _path(path, "path")
    if not os.path.exists(p):  # as the checkpoint functions say it (the CLI's check), and open() raises it
        raise FileNotFoundError(f"'{p}' does not exist")
    config = ""
    if os.path.isdir(p) and os.path.isfile(os.path.join(p, "config.json")):
        try:
            with open(os.path.join(p, "config.json"), encoding="utf-8") as f:
                config = f.read()
        except UnicodeDecodeError as e:
            raise ValueError(f"'{os.path.join(p, 'config.json')}' is not UTF-8 text ({e.reason} at byte "
                             f"{e.start}); repair or remove it") from None
    plain, quantized, _layout, headers = _fp8kit.load(p, config)
    out: dict = {}
    shards = _CopyOnWriteShards(headers) if kind == "torch" else None
    for name, (dtype, shape, data, shard, offset) in plain.items():
        if kind == "numpy":
            np_dtype = _SAFETENSORS_NUMPY.get(dtype)
            if np_dtype is None:
                raise ValueError(f"tensor '{name}' is {dtype}, which NumPy cannot hold (packed below a byte); "
                                 f"read it with fp8kit's C++ API or convert the checkpoint")
            out[name] = data.view(np_dtype).reshape(shape)
            continue
        torch_dtype = getattr(torch, _SAFETENSORS_TORCH.get(dtype, ""), None)
        if torch_dtype is None:
            raise ValueError(f"tensor '{name}' is {dtype}, which torch {torch.__version__} cannot hold; read it "
                             f"with framework='numpy' or fp8kit's C++ API, or convert the checkpoint")
        out[name] = shards.tensor(torch, torch_dtype, tuple(shape), data.nbytes, shard, offset)
    for name, q in quantized.items():
        out[name] = ScaledTensor(q, kind, q.shape, q.original_dtype)  # (the codes' shape as the file stores it)
    return dict(sorted(out.items()))
