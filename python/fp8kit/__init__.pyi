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
