"""Model files: GGUF, safetensors, Hugging Face directories."""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

from . import _capi
from ._handle import Handle
from .errors import check
from .graph import Graph, QTensor, format_name


@dataclass(frozen=True)
class ModelInfo:
    """Llama-family hyper-parameters; 0 where the file does not say."""

    n_layers: int
    d_model: int
    d_ffn: int
    n_heads: int
    n_kv_heads: int
    vocab: int
    ctx: int
    rms_eps: float


@dataclass(frozen=True)
class TensorInfo:
    """A stored tensor.

    ``ne`` is in GGUF order (innermost first), ``shape`` in numpy order;
    ``format`` is kiln's format name, or None when kiln cannot use the type;
    ``group`` an integer group format's group along K (0: one a row);
    ``input_scale`` a linear weight's static activation scale (0: none).
    """

    name: str
    type_name: str
    supported: bool
    format: Optional[str]
    ne: Tuple[int, ...]
    bytes: int
    group: int = 0
    input_scale: float = 0.0

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(reversed(self.ne))


PathLike = Union[str, "os.PathLike[str]"]


class Model(Handle):
    """A model file opened read-only (``kiln_model``); tensors are mapped, not
    copied. Open it with :meth:`open`. Graphs built from it keep it open;
    closing it closes them first."""

    _destroy = "kiln_model_close"
    _what = "model"

    def __init__(self) -> None:
        raise TypeError("use kiln.Model.open(path)")

    @classmethod
    def open(cls, path: PathLike, *, allow_nonfinite: bool = False,
             allow_partial: bool = False) -> "Model":
        """Open a GGUF file, a .safetensors file, or a directory holding
        model.safetensors (or a sharded set) and config.json.

        Args:
            allow_nonfinite: skip the load-time check that scales, norm
                weights, biases and rms_norm_eps are finite.
            allow_partial: parts of the model the graphs leave out are
                warnings (:attr:`warnings`), not errors.

        Raises:
            kiln.Error: ``KILN_ERR_IO``, ``KILN_ERR_MALFORMED``, ... naming
                the file and what is wrong with it.
        """
        self = cls.__new__(cls)
        Handle.__init__(self)
        self.path = os.fspath(path)
        opts = _capi.ModelOptions(int(allow_nonfinite), int(allow_partial))
        check(_capi.lib().kiln_model_open_with(_capi.encode(self.path), ctypes.byref(opts),
                                               ctypes.byref(self._h)))
        return self

    @property
    def container(self) -> str:
        """"gguf v3", "safetensors", ..."""
        return _capi.text(_capi.lib().kiln_model_container(self._live()))

    @property
    def arch(self) -> str:
        """The architecture the file names ("llama"), or ""."""
        return _capi.text(_capi.lib().kiln_model_arch(self._live()))

    @property
    def info(self) -> ModelInfo:
        c = _capi.ModelInfo()
        _capi.lib().kiln_model_get_info(self._live(), ctypes.byref(c))
        return ModelInfo(c.n_layers, c.d_model, c.d_ffn, c.n_heads, c.n_kv_heads, c.vocab,
                         c.ctx, c.rms_eps)

    @property
    def warnings(self) -> List[str]:
        """Warnings raised while opening or building graphs (allow_partial)."""
        return _capi.strings(_capi.lib().kiln_model_warnings(self._live()))

    def tensors(self) -> List[TensorInfo]:
        """The stored tensors, in file order."""
        lib = _capi.lib()
        h = self._live()
        out = []
        for i in range(lib.kiln_model_n_tensors(h)):
            t = _capi.ModelTensorInfo()
            check(lib.kiln_model_tensor_at(h, i, ctypes.byref(t)))
            out.append(TensorInfo(_capi.text(t.name), _capi.text(t.type_name), bool(t.supported),
                                  format_name(t.format) if t.supported else None,
                                  tuple(t.ne[:t.n_dims]), t.bytes, t.group, t.input_scale))
        return out

    def metadata(self, max_items: int = 8) -> Dict[str, str]:
        """A GGUF file's key/value pairs, each value as one line of text
        (arrays show at most max_items items); {} for safetensors."""
        lib = _capi.lib()
        h = self._live()
        buf = ctypes.create_string_buffer(4096)
        out = {}
        for i in range(lib.kiln_model_n_metadata(h)):
            key = ctypes.c_char_p()
            check(lib.kiln_model_metadata_at(h, i, max_items, ctypes.byref(key), buf,
                                             len(buf)))
            out[_capi.text(key.value)] = _capi.text(buf.value)
        return out

    def weight(self, name: str) -> QTensor:
        """The weight named name, viewing the mapping (it keeps the model
        open). kiln.Error ``KILN_ERR_NOT_FOUND`` when absent,
        ``KILN_ERR_UNSUPPORTED`` for a type kiln cannot use."""
        q = _capi.QTensor()
        check(_capi.lib().kiln_model_weight(self._live(), _capi.encode(name), ctypes.byref(q)))
        return QTensor._from_c(q, self)

    def graph(self, kind: str = "ffn", layers: int = 0) -> Graph:
        """A graph built from the model.

        Args:
            kind: ``"ffn"``, the layers' feed-forward blocks chained with
                their norms and residuals (runnable: one input, one output,
                both ``[M, d_model]``); ``"linears"``, every linear of
                every layer and the output head as its own node with its own
                input (for compiling a whole model ahead of time); or
                ``"engine"``, the linears and each layer's gate and up as one
                group, the entry ``"blk.L.ffn_gate_up.out"`` giving
                ``act(gate(x)) * up(x)`` of its input ``"blk.L.ffn_gate_up.in"``.
            layers: use the first layers only (0: all).
        """
        builders = {"ffn": "kiln_model_build_ffn", "linears": "kiln_model_build_linears",
                    "engine": "kiln_model_build_engine"}
        if kind not in builders:
            raise ValueError(f"graph kind {kind!r}: want one of {sorted(builders)}")
        g = Graph(_owner=self)
        try:
            check(getattr(_capi.lib(), builders[kind])(self._live(), g._h, layers))
        except BaseException:
            g.close()
            raise
        return g

    def __repr__(self) -> str:
        if self.closed:
            return "kiln.Model(closed)"
        return f"kiln.Model({self.path!r}, {self.container}, arch={self.arch!r})"
