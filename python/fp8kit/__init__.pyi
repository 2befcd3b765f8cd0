# Type stubs of the fp8kit package (python/fp8kit/__init__.py documents each function).
from typing import Any, Optional

__version__: str

def formats() -> list[dict[str, Any]]: ...
def conversion_kernel() -> str: ...
def cast(
    x: Any,
    dtype: Any,
    *,
    saturate: bool = False,
    scale: Optional[float] = None,
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
def scaled_mm(
    a: Any,
    b: Any,
    scale_a: Any,
    scale_b: Any,
    *,
    bias: Any = None,
    out_dtype: Any = "float32",
    threads: Optional[int] = None,
) -> Any: ...
