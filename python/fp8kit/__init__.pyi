# Type stubs of the fp8kit package (python/fp8kit/__init__.py documents each function).
import os
from typing import Any, Literal, Optional, Sequence, Union

_Path = Union[str, "os.PathLike[str]"]

__version__: str

def formats() -> list[dict[str, Any]]: ...
def conversion_kernel() -> str: ...
def cast(
    x: Any,
    dtype: Any,
    *,
    saturate: bool = False,
    scale: Optional[float] = None,
    scale_inv: Optional[float] = None,
    rounding: str = "nearest",
    seed: Optional[int] = None,
    threads: Optional[int] = None,
    out: Any = None,
) -> Any: ...

class ScaledTensor:
    shape: tuple
    original_dtype: str
    @property
    def format(self) -> str: ...
    @property
    def granularity(self) -> str: ...
    @property
    def data(self) -> Any: ...
    @property
    def scale_inv(self) -> Any: ...
    def dequantize(self, dtype: Any = None, *, threads: Optional[int] = None) -> Any: ...

def quantize(
    x: Any,
    format: Any = "e4m3fn",
    granularity: str = "tensor",
    *,
    saturate: bool = True,
    margin: int = 0,
    scale_rounding: Optional[str] = None,
    threads: Optional[int] = None,
) -> ScaledTensor: ...
def dequantize(q: ScaledTensor, dtype: Any = "float32", *, threads: Optional[int] = None) -> Any: ...
def amax(x: Any, granularity: str = "tensor", *, threads: Optional[int] = None) -> Any: ...
def analyze(
    x: Any,
    format: Union[str, Sequence[str]] = "e4m3fn",
    granularity: Union[str, Sequence[str]] = ("tensor", "row", "block:1x128", "mx32"),
    *,
    saturate: bool = True,
    threads: Optional[int] = None,
) -> Any: ...
def inspect(path: _Path, *, analysis: bool = True) -> dict[str, Any]: ...
def quantize_checkpoint(
    src: _Path,
    dst: _Path,
    scheme: Optional[str] = None,
    layout: Optional[str] = None,
    *,
    format: str = "e4m3fn",
    ignore: Sequence[str] = (),
    scale_fmt: str = "float",
    max_shard_size: Optional[str] = None,
    force: bool = False,
) -> dict[str, Any]: ...
def dequantize_checkpoint(
    src: _Path, dst: _Path, to: Any = "bf16", *, max_shard_size: Optional[str] = None, force: bool = False
) -> dict[str, Any]: ...
def convert_checkpoint(
    src: _Path,
    dst: _Path,
    to: Any,
    *,
    saturate: Optional[bool] = None,
    max_shard_size: Optional[str] = None,
    force: bool = False,
) -> dict[str, Any]: ...
def load(path: _Path, *, framework: Literal["numpy", "np", "torch", "pt"] = "numpy") -> dict[str, Any]: ...
def save(path: _Path, tensors: dict[str, Any], *, layout: Optional[str] = None,
         metadata: Optional[dict[str, str]] = None, force: bool = False) -> None: ...
def scaled_mm(
    a: Any,
    b: Any,
    scale_a: Any,
    scale_b: Any,
    bias: Any = None,
    scale_result: Any = None,
    out_dtype: Any = "float32",
    use_fast_accum: bool = False,
    *,
    threads: Optional[int] = None,
) -> Any: ...

class DelayedScaling:
    def __init__(
        self,
        format: Any = "e4m3fn",
        history_length: int = 1024,
        algorithm: str = "max",
        margin: int = 0,
        ema_decay: Optional[float] = None,
    ) -> None: ...
    @property
    def scale(self) -> float: ...
    @property
    def scale_inv(self) -> float: ...
    @property
    def amax_history(self) -> Any: ...
    @property
    def smoothed_amax(self) -> Optional[float]: ...
    @property
    def calibrated(self) -> bool: ...
    @property
    def format(self) -> str: ...
    def record(self, amax: float) -> None: ...
    def update(self, amax: Optional[float] = None) -> None: ...
    def discard_step(self) -> None: ...
    def state(self) -> bytes: ...
    @staticmethod
    def from_state(state: bytes) -> "DelayedScaling": ...
