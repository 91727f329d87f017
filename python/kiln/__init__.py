"""kiln for Python: ctypes bindings of libkiln's public C API (include/kiln.h).

    import kiln
    model = kiln.Model.open("model.gguf")
    y = kiln.Session(model.graph("ffn")).run(x)   # x: float32 [M, d_model]

libkiln is found through ``$KILN_LIBRARY``, next to the package, in a kiln
build tree, then by the system loader (see :mod:`kiln._library`); it is
loaded on first use. ``kiln.Linear`` (a ``torch.nn.Module``) exists when
torch is importable.
"""
from __future__ import annotations

from . import _capi, _library
from .compile import CompileResult, Plan, PlannedLinear, Target, compile, export, plan
from .errors import Error, Status
from .graph import FormatInfo, Graph, QTensor, Tensor, format_info, formats, quantize
from .model import Model, ModelInfo, TensorInfo
from .session import Session, SessionStats

__version__ = "0.1.0"

__all__ = [
    "CompileResult", "Error", "FormatInfo", "Graph", "LibraryNotFoundError", "Model",
    "ModelInfo", "Plan", "PlannedLinear", "QTensor", "Session", "SessionStats", "Status",
    "Target", "Tensor", "TensorInfo", "compile", "export", "format_info", "formats",
    "library_path", "library_version", "plan", "quantize",
]

LibraryNotFoundError = _library.LibraryNotFoundError


def library_path() -> str:
    """Where the libkiln in use was loaded from (loading it if needed)."""
    return _library.load()[1]


def library_version() -> str:
    """``kiln_version()`` of the libkiln in use: "MAJOR.MINOR.PATCH"."""
    return _capi.text(_capi.lib().kiln_version())


try:
    from .nn import Linear  # noqa: F401
except ModuleNotFoundError as _e:
    if _e.name != "torch":
        raise
else:
    __all__.append("Linear")
