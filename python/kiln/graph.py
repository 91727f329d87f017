"""Formats, quantized tensors and graphs."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _capi
from ._handle import Handle
from .errors import check


@dataclass(frozen=True)
class FormatInfo:
    """One row of kiln's format table (``kiln_format_info``)."""

    name: str
    desc: str
    block: int
    block_bytes: int
    k_multiple: int
    bits_per_weight: float
    scale_desc: str


def _format_table() -> Dict[str, int]:
    lib = _capi.lib()
    out = {}
    i = 0
    while True:
        row = lib.kiln_format_get(i)
        if not row:
            return out
        out[_capi.text(row.contents.name)] = i
        i += 1


def formats() -> List[str]:
    """The short names of every weight format ("f32", "bf16", "q4_k", ...)."""
    return list(_format_table())


def format_id(name: str) -> int:
    """The ``kiln_format`` value of a format name; :class:`kiln.Error`
    (``KILN_ERR_NOT_FOUND``) for a name kiln does not know."""
    out = ctypes.c_int()
    check(_capi.lib().kiln_format_from_name(_capi.encode(name), ctypes.byref(out)))
    return out.value


def format_name(fmt: int) -> str:
    """The short name of a ``kiln_format`` value."""
    row = _capi.lib().kiln_format_get(fmt)
    if not row:
        raise ValueError(f"kiln_format {fmt} is out of range")
    return _capi.text(row.contents.name)


def format_info(name: str) -> FormatInfo:
    """The table row of a format."""
    r = _capi.lib().kiln_format_get(format_id(name)).contents
    return FormatInfo(_capi.text(r.name), _capi.text(r.desc), r.block, r.block_bytes,
                      r.k_multiple, r.bits_per_weight, _capi.text(r.scale_desc))


def _bytes_of(fn, fmt: int, n: int, k: int) -> int:
    out = ctypes.c_size_t()
    check(fn(fmt, n, k, ctypes.byref(out)))
    return out.value


def _scale_bytes(fmt: int, n: int, k: int, group: int) -> int:
    out = ctypes.c_size_t()
    q = _capi.QTensor(fmt, n, k, None, None, 0.0, group)
    check(_capi.lib().kiln_qtensor_scale_bytes(ctypes.byref(q), ctypes.byref(out)))
    return out.value


class QTensor:
    """A weight ``W[n, k]`` in one of kiln's storage formats.

    ``data`` and ``scale`` are uint8 arrays in the layout FORMATS.md gives
    (``scale`` is None for formats without a separate scale array);
    ``global_scale`` is used by NVFP4 only, ``group`` (values along K per
    scale, 0 for one per row) by the integer group formats only. A QTensor
    read from a model views the model's mapping and keeps the model open.
    """

    def __init__(self, format: str, n: int, k: int, data: np.ndarray,
                 scale: Optional[np.ndarray] = None, global_scale: float = 0.0,
                 owner: object = None, group: int = 0):
        self.format = format
        self.n, self.k = int(n), int(k)
        self.group = int(group)
        fmt = format_id(format)
        lib = _capi.lib()
        want = _bytes_of(lib.kiln_format_data_bytes, fmt, self.n, self.k)
        want_scale = _scale_bytes(fmt, self.n, self.k, self.group)
        data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if data.size != want:
            raise ValueError(f"{format} [{n}, {k}]: data is {data.size} bytes, want {want}")
        if want_scale:
            if scale is None:
                raise ValueError(f"{format} [{n}, {k}]: needs a scale array of {want_scale} bytes")
            scale = np.ascontiguousarray(scale).view(np.uint8).reshape(-1)
            if scale.size != want_scale:
                raise ValueError(f"{format} [{n}, {k}]: scale is {scale.size} bytes, "
                                 f"want {want_scale}")
        else:
            scale = None
        self.data, self.scale = data, scale
        self.global_scale = float(global_scale)
        self._owner = owner

    def _c(self) -> _capi.QTensor:
        return _capi.QTensor(format_id(self.format), self.n, self.k, self.data.ctypes.data,
                             self.scale.ctypes.data if self.scale is not None else None,
                             self.global_scale, self.group)

    @classmethod
    def _from_c(cls, q: _capi.QTensor, owner: object) -> "QTensor":
        """A view of a C descriptor's arrays, which must outlive owner."""
        lib = _capi.lib()
        nd = _bytes_of(lib.kiln_format_data_bytes, q.format, q.n, q.k)
        ns = _scale_bytes(q.format, q.n, q.k, q.group)
        data = np.ctypeslib.as_array((ctypes.c_uint8 * nd).from_address(q.data)) if nd else \
            np.zeros(0, np.uint8)
        scale = np.ctypeslib.as_array((ctypes.c_uint8 * ns).from_address(q.scale)) \
            if ns and q.scale else None
        return cls(format_name(q.format), q.n, q.k, data, scale, q.global_scale, owner, q.group)

    @property
    def shape(self) -> Tuple[int, int]:
        """(n, k)."""
        return (self.n, self.k)

    def dequantize(self) -> np.ndarray:
        """The values as float32 ``[n, k]`` (kiln's CPU reference)."""
        out = np.empty((self.n, self.k), np.float32)
        q = self._c()
        check(_capi.lib().kiln_dequantize(ctypes.byref(q), out.ctypes.data))
        return out

    def __repr__(self) -> str:
        return f"kiln.QTensor({self.format}, n={self.n}, k={self.k})"


def quantize(w: np.ndarray, format: str, group: int = 0) -> QTensor:
    """Quantize a float ``[n, k]`` array into format with kiln's CPU reference
    (the global scale of NVFP4 is computed; an integer group format takes
    ``group`` values along K per scale, 0 for one per row).
    :class:`kiln.Error` (``KILN_ERR_SHAPE``) when k breaks the format's block
    rule or the group does not fit it."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize: want a 2-D [n, k] array, got shape {w.shape}")
    n, k = w.shape
    fmt = format_id(format)
    lib = _capi.lib()
    data = np.zeros(_bytes_of(lib.kiln_format_data_bytes, fmt, n, k), np.uint8)
    scale = np.zeros(_scale_bytes(fmt, n, k, group), np.uint8)
    q = _capi.QTensor(fmt, n, k, data.ctypes.data, scale.ctypes.data if scale.size else None, 0,
                      group)
    check(lib.kiln_quantize(w.ctypes.data, ctypes.byref(q)))
    return QTensor(format, n, k, data, scale if scale.size else None, q.global_scale,
                   group=group)


class Tensor:
    """A tensor of a :class:`Graph`: an input, weight, param or op result.

    Valid while its graph is open.
    """

    def __init__(self, graph: "Graph", h: int):
        self.graph = graph
        self._t = ctypes.c_void_p(h)

    @property
    def name(self) -> str:
        self.graph._live()
        return _capi.text(_capi.lib().kiln_tensor_name(self._t))

    @property
    def op(self) -> str:
        """"input", "weight", "param", "linear", "add", ... (``kiln_op_name``)."""
        self.graph._live()
        lib = _capi.lib()
        return _capi.text(lib.kiln_op_name(lib.kiln_tensor_op(self._t)))

    @property
    def shape(self) -> Tuple[Optional[int], ...]:
        """Activations ``(None, features)`` (M is dynamic), weights ``(n, k)``,
        params ``(n,)``."""
        self.graph._live()
        lib = _capi.lib()
        ne0, ne1 = lib.kiln_tensor_ne(self._t, 0), lib.kiln_tensor_ne(self._t, 1)
        if ne1 == -1:
            return (None, ne0)
        if self.op == "param":
            return (ne0,)
        return (ne1, ne0)

    @property
    def input_scale(self) -> float:
        """A linear's static activation scale, 0.0 for none
        (``kiln_tensor_input_scale``)."""
        self.graph._live()
        return float(_capi.lib().kiln_tensor_input_scale(self._t))

    def src(self, i: int) -> Optional["Tensor"]:
        """The i-th source of an op (a linear's are x, w, bias), or None."""
        self.graph._live()
        h = _capi.lib().kiln_tensor_src(self._t, i)
        return Tensor(self.graph, h) if h else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tensor) and self._t.value == other._t.value

    def __hash__(self) -> int:
        return hash(self._t.value)

    def __repr__(self) -> str:
        return f"kiln.Tensor({self.name!r}, {self.op}, shape={self.shape})"


ArrayLike = Union[np.ndarray, Sequence[float]]


class Graph(Handle):
    """A kiln graph (``kiln_graph``): build it here, or take one from
    :meth:`kiln.Model.graph`.

    Weights and params are kept alive by the graph: the arrays given are
    copied (quantized) once and held until the graph closes.
    """

    _destroy = "kiln_graph_destroy"
    _what = "graph"

    def __init__(self, _owner: Optional[Handle] = None):
        super().__init__([_owner] if _owner is not None else [])
        self._keep: list = []
        check(_capi.lib().kiln_graph_create(ctypes.byref(self._h)))

    def _add(self, fn_name: str, *args) -> Tensor:
        out = ctypes.c_void_p()
        check(getattr(_capi.lib(), fn_name)(self._live(), *args, ctypes.byref(out)))
        return Tensor(self, out.value)

    def input(self, name: str, k: int) -> Tensor:
        """An activation input ``[M, k]``."""
        return self._add("kiln_graph_input", _capi.encode(name), k)

    def weight(self, name: str, w: Union[QTensor, ArrayLike], format: str = "f32") -> Tensor:
        """A weight ``[n, k]``: a :class:`QTensor`, or a float array quantized
        into format here."""
        q = w if isinstance(w, QTensor) else quantize(np.asarray(w), format)
        self._keep.append(q)
        c = q._c()
        return self._add("kiln_graph_weight", _capi.encode(name), ctypes.byref(c))

    def param(self, name: str, v: ArrayLike) -> Tensor:
        """An f32 vector (bias, norm weight)."""
        a = np.ascontiguousarray(v, dtype=np.float32).reshape(-1)
        self._keep.append(a)
        return self._add("kiln_graph_param", _capi.encode(name), a.size, a.ctypes.data)

    def linear(self, name: str, x: Tensor, w: Tensor, bias: Optional[Tensor] = None,
               input_scale: Optional[float] = None) -> Tensor:
        """``x · wᵀ (+ bias)``: ``[M, k]`` by ``[n, k]`` gives ``[M, n]``. With
        a static ``input_scale`` s, x is read as ``e4m3(clamp(x / s, ±448)) · s``
        (``kiln_graph_linear_input_scale``)."""
        y = self._add("kiln_graph_linear", _capi.encode(name), x._t, w._t,
                      bias._t if bias is not None else None)
        if input_scale is not None:
            check(_capi.lib().kiln_graph_linear_input_scale(self._live(), y._t, input_scale))
        return y

    def add(self, name: str, a: Tensor, b: Tensor) -> Tensor:
        return self._add("kiln_graph_add", _capi.encode(name), a._t, b._t)

    def mul(self, name: str, a: Tensor, b: Tensor) -> Tensor:
        return self._add("kiln_graph_mul", _capi.encode(name), a._t, b._t)

    def silu(self, name: str, x: Tensor) -> Tensor:
        return self._add("kiln_graph_silu", _capi.encode(name), x._t)

    def gelu(self, name: str, x: Tensor) -> Tensor:
        """GELU, tanh approximation."""
        return self._add("kiln_graph_gelu", _capi.encode(name), x._t)

    def rms_norm(self, name: str, x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
        return self._add("kiln_graph_rms_norm", _capi.encode(name), x._t, weight._t, eps)

    def output(self, *ts: Tensor) -> None:
        """Mark activations as graph outputs, in order."""
        for t in ts:
            check(_capi.lib().kiln_graph_output(self._live(), t._t))

    def _list(self, n_fn: str, at_fn: str) -> List[Tensor]:
        lib = _capi.lib()
        h = self._live()
        return [Tensor(self, getattr(lib, at_fn)(h, i)) for i in range(getattr(lib, n_fn)(h))]

    @property
    def tensors(self) -> List[Tensor]:
        """Every tensor, in creation order."""
        return self._list("kiln_graph_n_tensors", "kiln_graph_tensor")

    @property
    def inputs(self) -> List[Tensor]:
        return self._list("kiln_graph_n_inputs", "kiln_graph_input_at")

    @property
    def outputs(self) -> List[Tensor]:
        return self._list("kiln_graph_n_outputs", "kiln_graph_output_at")

    def entry_inputs(self, output: str) -> List[Tensor]:
        """The graph inputs that the output named ``output`` depends on, in
        the graph's input order: what :meth:`kiln.Session.run_entry` takes.

        Raises:
            KeyError: the graph has no output of that name.
        """
        outs = [t for t in self.outputs if t.name == output]
        if not outs:
            raise KeyError(f"no output {output!r}: the outputs are "
                           f"{[t.name for t in self.outputs]}")
        seen = {outs[0]}
        todo = [outs[0]]
        while todo:
            t = todo.pop()
            for i in range(3):
                s = t.src(i)
                if s is not None and s not in seen:
                    seen.add(s)
                    todo.append(s)
        return [t for t in self.inputs if t in seen]

    def find(self, name: str) -> Optional[Tensor]:
        """The tensor named name, or None."""
        h = _capi.lib().kiln_graph_find(self._live(), _capi.encode(name))
        return Tensor(self, h) if h else None

    def __repr__(self) -> str:
        if self.closed:
            return "kiln.Graph(closed)"
        return (f"kiln.Graph({len(self.tensors)} tensors, {len(self.inputs)} inputs, "
                f"{len(self.outputs)} outputs)")
