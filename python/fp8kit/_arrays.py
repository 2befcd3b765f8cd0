"""How fp8kit sees the arrays it is given: NumPy (FP8 and bfloat16 as ml_dtypes dtypes), PyTorch tensors, and
anything else with __dlpack__ or that NumPy turns into an array. Every array is handed to the C++ library as a
contiguous NumPy array or a contiguous CPU torch tensor (which the library reads through its data_ptr()), without a
copy when it is contiguous, with its dtype's name; the library reads the elements' bits. Where a caller computes on a
tensor's bits in NumPy, it takes a NumPy view of its memory (uint8 for FP8, uint16 for bfloat16 and float16).
Outputs are allocated here in the input's kind. No numerics here: only views and allocation."""
from __future__ import annotations

import math
import struct
import sys
from typing import Any, Optional

import ml_dtypes
import numpy as np

from . import _fp8kit

_MAX_THREADS = _fp8kit.max_threads  # the library's kMaxThreads
_FLOAT32 = struct.Struct("<f")

# The dtypes fp8kit knows, by their canonical (PyTorch) names, and their NumPy dtypes.
_FP8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
_NUMPY = {
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    **{name: np.dtype(getattr(ml_dtypes, name)) for name in _FP8},
}
# fp8kit's short names of the FP8 formats and the wide types.
_ALIASES = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2", "e4m3fnuz": "float8_e4m3fnuz",
            "e5m2fnuz": "float8_e5m2fnuz", "e8m0fnu": "float8_e8m0fnu", "f32": "float32", "f64": "float64",
            "f16": "float16", "bf16": "bfloat16", "float": "float32", "half": "float16", "double": "float64"}
# Lookups on the hot path (a cast of 16 elements should cost about a microsecond here): names and NumPy dtypes.
_NAME_OF_STRING = {**{name: name for name in _NUMPY}, **_ALIASES}
_NAME_OF_STRING.update({"torch." + name: name for name in _NUMPY})
_NAME_OF_NUMPY = {dtype: name for name, dtype in _NUMPY.items()}
WIDE = ("float32", "float64", "float16", "bfloat16")
FP8 = _FP8
_KNOWN = ", ".join(["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e8m0fnu", "float32", "bfloat16", "float16", "float64"])


def resolve_dtype(dtype: Any) -> str:
    """The canonical name of a dtype given as a name ("e4m3fn", "float8_e4m3fn", "bfloat16"), a NumPy / ml_dtypes
    dtype or scalar type, or a torch dtype. ValueError for a name fp8kit does not know, TypeError for other
    objects."""
    if dtype is None:  # np.dtype(None) would be float64
        raise TypeError(f"dtype must be given: a name ({_KNOWN}), a NumPy/ml_dtypes dtype or a torch dtype")
    if isinstance(dtype, str):
        name = _NAME_OF_STRING.get(dtype)
        if name is not None:
            return name
        raise ValueError(f"unknown dtype {dtype!r} (use {_KNOWN})")
    if isinstance(dtype, np.dtype):
        name = _NAME_OF_NUMPY.get(dtype)
        if name is not None:
            return name
    if type(dtype).__module__.startswith("torch"):  # torch.dtype, without importing torch
        return _torch_dtype_name(dtype) or resolve_dtype(str(dtype))
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a name, a NumPy/ml_dtypes dtype or a torch dtype, not {dtype!r}") from None
    for name, known in _NUMPY.items():
        if np_dtype == known:
            return name
    if np_dtype.byteorder == ">" and np_dtype.newbyteorder("=") in _NAME_OF_NUMPY:
        native = np_dtype.newbyteorder("=").type  # numpy.float32, ml_dtypes.bfloat16, ...: what astype takes
        module = "np" if native.__module__ == "numpy" else native.__module__
        raise ValueError(f"fp8kit reads native (little-endian) byte order, not big-endian {native.__name__}: "
                         f"convert first with .astype({module}.{native.__name__})")
    raise ValueError(f"fp8kit does not cast {np_dtype} (use {_KNOWN})")


def check_int(name: str, value: Any, lo: int, hi: int) -> int:
    """An integer argument, checked: TypeError for anything but an int (bool included), ValueError outside
    [lo, hi]; what the library would otherwise get from nanobind's multi-line signature error."""
    if type(value) is not int and not isinstance(value, np.integer):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be between {lo} and {hi}, got {value}")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    """A flag: True or False (NumPy's bool too); anything else, a truthy string included, is a TypeError."""
    if type(value) is bool or isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"{name} must be True or False, not {type(value).__name__}")


def check_real(name: str, value: Any) -> float:
    """A real number as a float: an int, a float, NumPy's, or the one value of a one-element array or tensor of a
    real dtype (torch.Tensor.max() included; NumPy and torch alike); a string, bytes, a bool (a bool array or tensor
    included), a complex number, or an array of several values is a TypeError."""
    if type(value) is float:
        return value
    dtype = getattr(value, "dtype", None)
    if dtype is not None and not isinstance(value, np.generic):  # an array or a tensor: one value of a real dtype
        kind = getattr(dtype, "kind", None)  # NumPy's; torch dtypes say is_complex / is_floating_point
        if kind in ("b", "c") or str(dtype) == "torch.bool" or getattr(dtype, "is_complex", False):
            raise TypeError(f"{name} must be a number, not a {str(dtype).replace('torch.', '')} "
                            f"{type(value).__name__}")
        if isinstance(value, np.ndarray) and value.size == 1:
            value = value.reshape(())  # (NumPy 2 refuses float() of a 1-element array of 1 or more dimensions)
    if not isinstance(value, (str, bytes, bool, np.bool_, complex, np.complexfloating)):
        try:
            return float(value)
        except OverflowError:  # an int past float64's range
            raise ValueError(f"{name} must be a number within float64's range, got an int of "
                             f"{len(str(abs(value)))} digits") from None
        except (TypeError, ValueError, RuntimeError):
            pass
    raise TypeError(f"{name} must be a number, not {type(value).__name__}")


def _int_as_float32(v: int) -> float:
    """An int rounded once to float32 (to nearest, ties to even), as a float; +-inf past float32's range. (float(v)
    first would round twice: 2**62 + 2**38 + 1 becomes the float64 2**62 + 2**38, a float32 tie, which goes to even,
    2**62, where the int itself rounds up to 2**62 + 2**39.)"""
    m = abs(v)
    shift = m.bit_length() - 24  # float32 keeps 24 significant bits
    if shift > 0:
        q, r, half = m >> shift, m & ((1 << shift) - 1), 1 << (shift - 1)
        m = (q + (r > half or (r == half and q & 1))) << shift
    rounded = math.inf if m >= 2**128 else float(m)
    return -rounded if v < 0 else rounded


def check_float32(name: str, value: Any) -> float:
    """check_real, then finite and, unless 0, nonzero once rounded to float32 (what the library computes with): 1e300
    and 1e-46 are ValueErrors, not a silent infinity or zero. An int is rounded to float32 once, from its exact
    value (the one value of an integer array or tensor too)."""
    if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "iu":
        value = int(value.reshape(()))
    elif _is_torch(value) and value.numel() == 1 and not (
            value.dtype.is_floating_point or value.dtype.is_complex or str(value.dtype) == "torch.bool"):
        value = int(value.item())
    if (type(value) is int or isinstance(value, np.integer)) and not -2**53 <= value <= 2**53:
        rounded = _int_as_float32(int(value))
        if not math.isfinite(rounded):
            digits = len(str(abs(int(value))))
            shown = repr(value) if digits <= 40 else f"an int of {digits} digits"
            raise ValueError(f"{name} must be a finite float32 value, got {shown}")
        return rounded
    v = check_real(name, value)
    try:
        # float32 rounding (to nearest even); OverflowError when a finite value rounds past float32's range
        rounded = _FLOAT32.unpack(_FLOAT32.pack(v))[0]
    except OverflowError:
        rounded = math.inf
    if not math.isfinite(rounded):
        raise ValueError(f"{name} must be a finite float32 value, got {value!r}")
    if rounded == 0 and v != 0:  # a scale that underflows: every result would be 0 (or every code NaN), unseen
        raise ValueError(f"{name} = {value!r} is below float32's smallest subnormal (about 1.4e-45) and would round "
                         f"to 0: give a scale float32 holds")
    return rounded


def check_threads(threads: Optional[int]) -> Optional[int]:
    """threads: None (all cores) or 1 .. the library's kMaxThreads (more only oversubscribes the cores)."""
    if threads is None:
        return None
    if type(threads) is int and threads < 1:  # the library's own wording
        raise ValueError(f"threads must be at least 1, got {threads}")
    return check_int("threads", threads, 1, _MAX_THREADS)


class Source:
    """An input as the library takes it: `bits` a contiguous NumPy array holding the elements of `dtype_name` (the
    input itself, or a view of its memory, when it could), or a torch input's contiguous CPU tensor itself (which the
    library's array arguments also take; array() views its bits in NumPy); `shape` the input's."""
    __slots__ = ("bits", "dtype_name", "shape")

    def __init__(self, bits: np.ndarray, dtype_name: str, shape: tuple):
        self.bits, self.dtype_name, self.shape = bits, dtype_name, shape

    @property
    def size(self) -> int:
        bits = self.bits
        return bits.size if isinstance(bits, np.ndarray) else bits.numel()

    def array(self) -> np.ndarray:
        """The bits as a NumPy array of the input's shape (a view of a torch tensor's memory), for the few callers
        that compute on them in NumPy; float32 and float64 keep their dtype, the 16-bit types are uint16, FP8 uint8."""
        bits = self.bits
        return bits if isinstance(bits, np.ndarray) else _torch_bits_view(bits, self.dtype_name)


def _is_torch(x: Any) -> bool:
    # Any torch.Tensor, subclasses (nn.Parameter, tensor subclasses) included; without torch imported there is none.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _strided() -> Any:
    """torch.strided (torch is imported by the caller's tensor already)."""
    return sys.modules["torch"].strided


def _check_torch_layout(t: Any, what: str) -> None:
    """A ValueError in one line for a tensor whose memory is not one dense strided block (sparse, MKL-DNN, nested):
    the bits a NumPy view would read are not its elements."""
    if t.is_nested or t.layout is not _strided():
        layout = "nested" if t.is_nested else str(t.layout).replace("torch.", "")
        raise ValueError(f"{what} is a {layout} tensor: fp8kit reads dense (strided) tensors; convert it with "
                         f"{'torch.nested.to_padded_tensor' if t.is_nested else '.to_dense()'} first")


def _check_torch_memory(t: Any, what: str) -> None:
    """A ValueError in one line for a tensor with elements but no memory of its own (data_ptr() 0): a wrapper
    subclass (DTensor, torchao's tensor subclasses, made with _make_wrapper_subclass) or a FakeTensor, whose values
    live elsewhere or nowhere. The library reads a tensor's memory at data_ptr(): it must not be handed address 0."""
    if t.data_ptr() == 0 and t.numel() != 0:
        raise ValueError(f"{what} is a {type(t).__name__} without memory of its own (a wrapper tensor subclass or a "
                         f"fake tensor): fp8kit reads a tensor's memory; pass the plain tensor that holds the values")


def kind_of(x: Any) -> str:
    """"torch" for a torch.Tensor, "numpy" for everything else (the output is then a NumPy array)."""
    return "numpy" if type(x) is np.ndarray else ("torch" if _is_torch(x) else "numpy")


# torch dtypes and their canonical names, both ways, filled as they are met (torch is imported only by its users).
_NAME_OF_TORCH: dict = {}
_TORCH_OF_NAME: dict = {}


def _torch_dtype_name(dtype: Any) -> Optional[str]:
    """The canonical name of a torch dtype fp8kit reads, None for any other (a dict lookup once seen)."""
    name = _NAME_OF_TORCH.get(dtype)
    if name is None:
        name = _NAME_OF_STRING.get(str(dtype))
        if name is not None:
            _NAME_OF_TORCH[dtype] = name
    return name


def _torch_dtype(name: str) -> Any:
    """The torch dtype of a canonical name."""
    dtype = _TORCH_OF_NAME.get(name)
    if dtype is None:
        import torch
        dtype = _TORCH_OF_NAME[name] = getattr(torch, name)
    return dtype


def _torch_bits_view(t: Any, name: str) -> np.ndarray:
    """A CPU, contiguous torch tensor's bits as a NumPy array sharing its memory."""
    if name == "float32" or name == "float64":
        return t.numpy()
    import torch
    if name in _FP8:
        return t.view(torch.uint8).numpy()
    return t.view(torch.int16).numpy().view(np.uint16)  # bfloat16, float16


class ElementTypeError(ValueError):
    """An input whose element type fp8kit does not read (a ValueError, told apart from the other refusals of an
    input: a device, a layout, no memory of its own)."""


def _element_name(dtype: Any, kind: str, what: str, fix: Optional[str] = None) -> str:
    """The canonical name of an input's element type; ElementTypeError naming the input (not a target) when fp8kit
    does not read it (ints of a torch tensor or NumPy array, bool, complex), and what to do (`fix`, else a float
    cast)."""
    try:
        return resolve_dtype(dtype)
    except (ValueError, TypeError) as e:
        if "big-endian" in str(e):  # a type fp8kit reads, in the other byte order: that message says what to do
            raise
        shown = str(dtype).replace("torch.", "")
        if fix is None:
            fix = ("fp8kit reads float32, bfloat16, float16, float64 and FP8 (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz, "
                   f"e8m0fnu): convert it first, e.g. with {'.float()' if kind == 'torch' else '.astype(np.float32)'}")
        raise ElementTypeError(f"{what} holds {shown} elements; {fix}") from None


def as_bits(x: Any, kind: str, what: str = "x", fix: Optional[str] = None) -> Source:
    """x as a contiguous array for the library (copied once when it is not contiguous, or not aligned to its element
    size): a NumPy array, or a torch input as a contiguous CPU tensor (a NumPy view of it costs microseconds per
    call; Source.array() makes one where NumPy must compute on the bits). `what` names x in an error about its
    element type, `fix` says what to do (_element_name)."""
    if type(x) is np.ndarray:  # the common case first, without the general path's calls
        name = _NAME_OF_NUMPY.get(x.dtype)
        flags = x.flags
        if name is not None and flags.c_contiguous and flags.aligned:
            return Source(x, name, x.shape)
    if kind == "torch":  # (each call here costs a fraction of a microsecond: the cheap ones, in the common order)
        if not x.is_cpu:
            raise ValueError(f"the tensor is on {x.device}: the Python package runs fp8kit's CPU kernels (its CUDA "
                             f"backend is C++, docs/cuda.md); move it with .cpu()")
        _check_torch_layout(x, what)
        name = _torch_dtype_name(x.dtype) or _element_name(x.dtype, kind, what, fix)
        t = x.detach() if x.requires_grad else x  # (.numpy() refuses a tensor that requires grad)
        if t.is_neg():  # a lazily negated view: its memory holds the values before the negation
            t = t.resolve_neg()
        if not t.is_contiguous():
            t = t.contiguous()
        _check_torch_memory(t, what)
        return Source(t, name, tuple(t.shape))
    if not isinstance(x, np.ndarray):
        if hasattr(x, "__dlpack__"):
            x = np.from_dlpack(x)
        else:
            # Lists, scalars, buffers: as NumPy types them (Python floats are doubles: rounded once from there);
            # Python ints and bools as float64.
            original = x
            x = np.asarray(x)
            if x.dtype.kind == "O" and x.size and all(isinstance(e, (int, float, np.number, np.bool_)) for e in x.flat):
                # Python ints past int64 (2**70) are objects to NumPy: read them as float64 too, as smaller ones
                try:
                    x = np.asarray(original, dtype=np.float64)
                except OverflowError:
                    raise ValueError("an int past float64's range (about 1.8e308) has no float value to cast; "
                                     "give a float such as math.inf or -math.inf") from None
            if x.dtype.kind in "biu":
                x = x.astype(np.float64)
            elif x.dtype.kind in "OUS" or (x.dtype.kind == "V" and x.dtype not in _NAME_OF_NUMPY):
                # object(), a dict, a string: not numbers at all (ml_dtypes' scalars are kind "V": they are)
                raise TypeError(f"fp8kit takes an array, a tensor or numbers; NumPy reads this "
                                f"{type(original).__name__} as {x.dtype} elements, not numbers it can cast")
    name = _element_name(x.dtype, kind, what, fix)
    if not x.flags.c_contiguous or not x.flags.aligned:  # (a view at an odd offset, as in a safetensors file)
        x = np.array(x, order="C", copy=True)
    return Source(x, name, x.shape)


def may_share_memory(a: Any, b: Any) -> bool:
    """Whether two arrays as the library takes them (both NumPy, or both contiguous torch tensors) overlap."""
    if isinstance(a, np.ndarray):
        return np.may_share_memory(a, b)
    start_a, start_b = a.data_ptr(), b.data_ptr()
    end_a, end_b = start_a + a.numel() * a.element_size(), start_b + b.numel() * b.element_size()
    return start_a < end_b and start_b < end_a


def check_not_tracked(x: Any, what: str) -> None:
    """A torch tensor that requires grad, while grad mode is on, is refused as an input whose result would carry a
    gradient: fp8kit runs outside autograd, so no gradient would reach it and training through the call would
    silently not update it (torch's own .numpy() refuses such tensors too)."""
    if x.requires_grad:
        import torch
        if torch.is_grad_enabled():
            raise ValueError(f"{what} requires grad: fp8kit runs outside autograd, so its result would carry no "
                             f"gradient back to it; pass {what}.detach(), or call under torch.no_grad()")


def about_to_write(out: Any) -> None:
    """Before writing into an out= torch tensor (every check passed): autograd must see the write, as it sees torch's
    own in-place writes, so that a backward which saved the tensor refuses to run instead of using the new values."""
    if kind_of(out) == "torch":
        import torch
        bump = getattr(torch.autograd.graph, "increment_version", None)  # torch >= 2.2; before: the C call
        (bump or torch._C._increment_version)(out)


def empty_like_of(x: Any, kind: str, shape: tuple, name: str, out: Optional[Any]) -> tuple[Any, Any]:
    """The result array (x's kind, `shape`, dtype `name`), or `out` checked, and what the library writes: the result
    itself (a NumPy array, or a contiguous CPU tensor, as as_bits hands over)."""
    if out is not None:
        if type(out) is np.ndarray and kind == "numpy":  # the common case first
            flags = out.flags
            if (out.dtype == _NUMPY[name] and out.shape == shape and flags.c_contiguous and flags.writeable
                    and flags.aligned):
                return out, out
        if kind_of(out) != kind or (kind == "numpy" and not isinstance(out, np.ndarray)):
            raise TypeError(f"out must be a {'torch.Tensor' if kind == 'torch' else 'NumPy array'} like the input, "
                            f"not {type(out).__name__}")
        if kind == "torch":
            _check_torch_layout(out, "out")  # first: a nested tensor has no shape to compare
        try:
            out_name = resolve_dtype(out.dtype)
        except ValueError:
            raise ValueError(f"out is {out.dtype} {tuple(out.shape)}; the result is {name} {tuple(shape)}") from None
        if out_name != name or tuple(out.shape) != tuple(shape):
            raise ValueError(f"out is {out_name} {tuple(out.shape)}; the result is {name} {tuple(shape)}")
        if kind == "torch":
            import torch
            if out.device.type != "cpu" or not out.is_contiguous():
                raise ValueError("out must be a contiguous CPU tensor")
            if out.is_neg():
                raise ValueError("out is a negated view, whose memory holds the values before the negation; pass "
                                 "out.resolve_neg() and negate after")
            _check_torch_memory(out, "out")
            if out.is_inference() and not torch.is_inference_mode_enabled():
                raise ValueError("out is an inference tensor, which torch refuses to write in place outside "
                                 "torch.inference_mode(): write it inside one, or pass a tensor made outside it")
            if out.requires_grad and torch.is_grad_enabled():
                # written outside autograd: torch refuses such out= tensors too while grad mode is on
                raise ValueError("out requires grad: fp8kit writes it outside autograd; write it under "
                                 "torch.no_grad(), or pass a tensor that does not")
            return out, out
        if not out.flags.c_contiguous or not out.flags.writeable or not out.flags.aligned:
            raise ValueError("out must be a contiguous, writeable array aligned to its element size")
        return out, out
    if kind == "torch":
        import torch
        result = torch.empty(shape, dtype=_torch_dtype(name))
        return result, result
    result = np.empty(shape, _NUMPY[name])
    return result, result
