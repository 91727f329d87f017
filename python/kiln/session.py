"""Running a graph: on the GPU through a kiln session, or on the CPU executor."""
from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import dataclass
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _capi
from ._handle import Handle
from ._options import PathLike, cache_options, largest_bucket, plan_options
from .compile import Target, TargetLike
from .errors import Error, Status, check
from .graph import Graph


@dataclass(frozen=True)
class SessionStats:
    """Where a GPU session's cold start went, and what it holds (seconds, bytes)."""

    device: str
    target: str
    kernels: int
    cached: int
    compiled: int
    plan_s: float
    cache_s: float
    module_s: float
    weights_s: float
    graphs_s: float
    weight_bytes: int
    arena_bytes: int
    compile_s: float = 0.0
    load_read_bytes: int = 0
    load_copied_bytes: int = 0
    load_packed_bytes: int = 0
    load_s: float = 0.0
    load_threads: int = 0
    load_pinned: bool = False
    load_device_packed_bytes: int = 0
    load_device_pack_s: float = 0.0


def _parse_device(device: Union[str, int, Any]) -> Tuple[str, int]:
    """("auto" | "cpu" | "cuda", ordinal) from "auto", "cpu", "cuda", "cuda:N",
    an int or a torch.device."""
    if isinstance(device, int):
        return "cuda", device
    d = str(device)
    if d in ("auto", "cpu", "cuda"):
        return d, 0
    if d.startswith("cuda:") and d[5:].isdigit():
        return "cuda", int(d[5:])
    raise ValueError(f"device {d!r}: want 'auto', 'cpu', 'cuda' or 'cuda:N'")


class _Port(NamedTuple):
    """A graph input or output as a run needs it: its name and width."""

    name: str
    width: int


def _ports(tensors: Sequence[Any]) -> List[_Port]:
    return [_Port(t.name, t.shape[1]) for t in tensors]


def _torch_tensor_type() -> Optional[type]:
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


class Session(Handle):
    """A graph ready to run.

    On a GPU this is a kiln session (``kiln_session``): the plan for the live
    device, every kernel from the caches (compiled first where they lack one,
    unless offline), weights uploaded once, one CUDA graph per token bucket.
    Without a GPU or driver (``device="auto"``) it is the CPU executor
    (``kiln_cpu``), as ``kiln run`` does; :attr:`device` says which.

    Args:
        graph: what to run; the session keeps it open.
        device: ``"auto"`` (the first GPU, else the CPU executor), ``"cpu"``,
            ``"cuda"`` / ``"cuda:N"`` / N (that GPU, or kiln.Error
            ``KILN_ERR_NO_DEVICE``), or a ``torch.device``.
        threads: CPU executor threads (0: one per online core).
        cache, shipped, offline, no_writable, strict_cache, map_size: the
            kernel caches, as for :func:`kiln.compile` (GPU only).
        eager: launch kernels one by one instead of replaying CUDA graphs.
        quiet: no progress line while compiling.
        target: plan for this target instead of the device's own.
        backend, strict_backend, capture, max_tokens, no_fuse: as for
            :func:`kiln.plan`. On the GPU, ``run`` serves 1 to the largest
            bucket tokens; the CPU executor takes any count.

    Raises:
        kiln.Error: ``KILN_ERR_OFFLINE_MISS`` naming a kernel no cache holds
            (offline), ``KILN_ERR_CUDA``, ``KILN_ERR_COMPILE``, ...
    """

    _what = "session"

    def __init__(self, graph: Graph, *, device: Union[str, int, Any] = "auto",
                 threads: int = 0, cache: Optional[PathLike] = None,
                 shipped: Sequence[PathLike] = (), offline: bool = False,
                 no_writable: bool = False, strict_cache: bool = False, map_size: int = 0,
                 eager: bool = False, quiet: bool = True, target: Optional[TargetLike] = None,
                 backend: Optional[str] = None, strict_backend: bool = False,
                 capture: Optional[Sequence[int]] = None, max_tokens: int = 0,
                 no_fuse: bool = False):
        super().__init__([graph])
        self.graph = graph
        self._lock = threading.Lock()
        #: Why ``device="auto"`` fell back to the CPU executor, or "".
        self.fallback_reason = ""
        #: The most tokens one run takes (None: any count, the CPU executor).
        self.max_tokens: Optional[int] = None
        kind, ordinal = _parse_device(device)
        lib = _capi.lib()
        g = graph._live()
        # What the session was made with, read once: a run does not ask the
        # graph again.
        self._inputs = _ports(graph.inputs)
        self._outputs = _ports(graph.outputs)
        self._ordinal = -1
        if kind != "cpu":
            so = _capi.SessionOptions(device=ordinal, eager=int(eager), quiet=int(quiet))
            so.cache, _keep = cache_options(cache, shipped, offline, no_writable, strict_cache,
                                            map_size)
            so.plan, _keep_plan = plan_options(backend, strict_backend, capture, max_tokens,
                                               no_fuse)
            t = (target if isinstance(target, Target) else Target.from_name(target)) \
                if target is not None else None
            if t is not None:
                so.target = ctypes.pointer(t._c)
            try:
                check(lib.kiln_session_create(g, ctypes.byref(so), ctypes.byref(self._h)))
                self._destroy = "kiln_session_destroy"
                self._run = lib.kiln_session_run
                self.device = f"cuda:{ordinal}"
                self._ordinal = ordinal
                self.max_tokens = largest_bucket(capture, max_tokens)
                return
            except Error as e:
                if kind == "cuda" or e.status != Status.ERR_NO_DEVICE:
                    raise
                self.fallback_reason = e.message
        co = _capi.CpuOptions(threads)
        check(lib.kiln_cpu_create(g, ctypes.byref(co), ctypes.byref(self._h)))
        self._destroy = "kiln_cpu_destroy"
        self._run = lib.kiln_cpu_run
        #: "cpu" (the CPU executor) or "cuda:N".
        self.device = "cpu"

    @property
    def threads(self) -> int:
        """The CPU executor's threads (0 on the GPU)."""
        if self.device != "cpu":
            return 0
        return _capi.lib().kiln_cpu_threads(self._live())

    @property
    def stats(self) -> Optional[SessionStats]:
        """A GPU session's cold-start breakdown; None on the CPU executor."""
        if self.device == "cpu":
            return None
        s = _capi.SessionStats()
        _capi.lib().kiln_session_get_stats(self._live(), ctypes.byref(s))
        return SessionStats(_capi.text(s.device), _capi.text(s.target), s.kernels, s.cached,
                            s.compiled, s.plan_s, s.cache_s, s.module_s, s.weights_s,
                            s.graphs_s, s.weight_bytes, s.arena_bytes, s.compile_s,
                            s.load_read_bytes, s.load_copied_bytes, s.load_packed_bytes,
                            s.load_s, s.load_threads, bool(s.load_pinned),
                            s.load_device_packed_bytes, s.load_device_pack_s)

    def reload(self, model: Any) -> None:
        """Read every weight again from ``model`` (a :class:`kiln.Model`:
        another checkpoint of the same architecture, with the same names,
        formats and shapes) into the session's device buffers, through the
        load and the device packers (``kiln_session_reload``). Everything is
        checked before anything is written: a missing weight, another shape
        or a value a layout cannot carry raises :class:`kiln.Error` and the
        session keeps its weights. A GPU session's only: the CPU executor
        reads the graph's own weights."""
        if self.device == "cpu":
            raise Error(Status.ERR_STATE,
                        "reload: the CPU executor reads the graph's weights where they are; "
                        "build a new graph from the model")
        check(_capi.lib().kiln_session_reload(self._live(), model._live()))

    def run(self, *inputs: Any) -> Any:
        """Run the graph on ``M`` tokens.

        Args:
            inputs: one ``[M, K_i]`` array per graph input, in order: numpy
                arrays (any float dtype; converted to float32), anything
                ``numpy.asarray`` takes, or torch tensors on any device.

        Returns:
            The output ``[M, N]`` (a tuple of them when the graph has
            several): float32 numpy arrays; torch tensors on the first
            input's device and in its dtype when it is a torch tensor.

        On a GPU session, torch tensors on the session's GPU stay there
        (``kiln_session_run_device``): they are cast to BF16 where they are
        not, the run is queued on the current torch stream without waiting
        for it, and a CUDA graph being captured on that stream takes kiln's
        kernels in. Rows may be strided (a slice of a larger tensor); the
        last dimension must be contiguous or the input is copied. Anything
        else (numpy arrays, the CPU executor, tensors on another device)
        goes through host float32 arrays (``kiln_session_run``,
        ``kiln_cpu_run``), synchronously.

        Raises:
            ValueError: wrong number of inputs or shapes that do not match
                the graph.
            kiln.Error: ``KILN_ERR_SHAPE`` when M exceeds the GPU session's
                largest bucket, and whatever the run reports.
        """
        if len(inputs) != len(self._inputs):
            raise ValueError(f"run: the graph has {len(self._inputs)} inputs, got {len(inputs)}")
        tensor_type = _torch_tensor_type()
        like = inputs[0] if tensor_type is not None and isinstance(inputs[0], tensor_type) \
            else None
        if like is not None and self._on_this_gpu(inputs, tensor_type):
            return self._run_device(inputs)
        xs, m = self._host_rows("run", self._inputs, inputs, tensor_type)
        ys = [np.empty((m, t.width), np.float32) for t in self._outputs]
        ins = (ctypes.c_void_p * len(xs))(*[a.ctypes.data for a in xs])
        outs = (ctypes.c_void_p * max(len(ys), 1))(*[y.ctypes.data for y in ys])
        with self._lock:
            check(self._run(self._live(), m, ins, outs))
        if like is not None:
            torch = sys.modules["torch"]
            dtype = like.dtype if like.is_floating_point() else torch.float32
            res: List[Any] = [torch.from_numpy(y).to(like.device, dtype) for y in ys]
        else:
            res = list(ys)
        return res[0] if len(res) == 1 else tuple(res)

    __call__ = run

    @property
    def entries(self) -> List[str]:
        """The entry points: the names of the graph's outputs, each of which
        :meth:`run_entry` runs alone."""
        return [t.name for t in self._outputs]

    def run_entry(self, name: str, *inputs: Any) -> Any:
        """Run one output of the graph alone: the steps its value depends on,
        no others (in a ``--graph linears`` model, one linear; in an
        ``engine`` one, also a layer's gate and up as one group).

        Args:
            name: the output's name (one of :attr:`entries`).
            inputs: ``[M, K]`` arrays or tensors for the graph inputs it
                reads, in the graph's input order
                (``graph.entry_inputs(name)``), taken as :meth:`run` takes
                them.

        Returns:
            The output ``[M, N]``, as :meth:`run` returns one.

        torch tensors on a GPU session's GPU run on the device
        (``kiln_session_run_entry``) on the current torch stream. The CPU
        executor computes the entry alone too (``kiln_cpu_run`` with the
        other outputs left out). Host arrays on a GPU session run the whole
        graph (``kiln_session_run``) with zeros for the inputs the entry
        does not read, and return its output.

        Raises:
            KeyError: no output of that name.
            ValueError: the wrong number of inputs, or shapes that do not
                match.
        """
        wanted = _ports(self.graph.entry_inputs(name))
        if len(inputs) != len(wanted):
            raise ValueError(f"run_entry: {name!r} reads {len(wanted)} inputs "
                             f"{[t.name for t in wanted]}, got {len(inputs)}")
        tensor_type = _torch_tensor_type()
        like = inputs[0] if inputs and tensor_type is not None and \
            isinstance(inputs[0], tensor_type) else None
        if like is not None and self._on_this_gpu(inputs, tensor_type):
            return self._run_entry_device(name, wanted, inputs)
        if not wanted:
            raise ValueError(f"run_entry: {name!r} reads no input, so M is unknown")
        xs, m = self._host_rows("run_entry", wanted, inputs, tensor_type)
        given = dict(zip(wanted, xs))
        cpu = self.device == "cpu"
        full = [given.get(t) if t in given or cpu else np.zeros((m, t.width), np.float32)
                for t in self._inputs]
        y = np.empty((m, [t.width for t in self._outputs if t.name == name][0]), np.float32)
        ys = [y if t.name == name else (None if cpu else np.empty((m, t.width), np.float32))
              for t in self._outputs]
        ins = (ctypes.c_void_p * max(len(full), 1))(
            *[a.ctypes.data if a is not None else None for a in full])
        outs = (ctypes.c_void_p * max(len(ys), 1))(
            *[a.ctypes.data if a is not None else None for a in ys])
        with self._lock:
            check(self._run(self._live(), m, ins, outs))
        if like is not None:
            torch = sys.modules["torch"]
            dtype = like.dtype if like.is_floating_point() else torch.float32
            return torch.from_numpy(y).to(like.device, dtype)
        return y

    @staticmethod
    def _host_rows(what: str, wanted: Sequence[_Port], inputs: Sequence[Any],
                   tensor_type: Optional[type]) -> Tuple[List[np.ndarray], int]:
        """Inputs as contiguous float32 host arrays of the graph inputs'
        widths, and their M."""
        xs: List[np.ndarray] = []
        for t, x in zip(wanted, inputs):
            if tensor_type is not None and isinstance(x, tensor_type):
                x = x.detach().to("cpu").float().numpy()
            a = np.ascontiguousarray(x, dtype=np.float32)
            k = t.width
            if a.ndim != 2 or a.shape[1] != k:
                raise ValueError(f"{what}: input {t.name!r} wants [M, {k}], got shape {a.shape}")
            xs.append(a)
        m = xs[0].shape[0]
        if any(a.shape[0] != m for a in xs):
            raise ValueError(f"{what}: inputs differ in M: {[a.shape[0] for a in xs]}")
        return xs, m

    @staticmethod
    def _bf16_rows(what: str, wanted: Sequence[_Port],
                   inputs: Sequence[Any]) -> Tuple[List[Any], int]:
        """torch CUDA inputs as BF16 rows kiln reads in place (the last
        dimension contiguous, strided rows kept), and their M."""
        torch = sys.modules["torch"]
        xs = []
        for t, x in zip(wanted, inputs):
            k = t.width
            if x.dim() != 2 or x.shape[1] != k:
                raise ValueError(f"{what}: input {t.name!r} wants [M, {k}], got shape "
                                 f"{tuple(x.shape)}")
            if x.dtype != torch.bfloat16:
                x = x.to(torch.bfloat16)
            if x.stride(1) != 1 or x.stride(0) < k:
                x = x.contiguous()
            xs.append(x)
        m = xs[0].shape[0]
        if any(x.shape[0] != m for x in xs):
            raise ValueError(f"{what}: inputs differ in M: {[x.shape[0] for x in xs]}")
        return xs, m

    def _run_entry_device(self, name: str, wanted: Sequence[_Port],
                          inputs: Sequence[Any]) -> Any:
        """run_entry() on torch CUDA tensors, on the current torch stream."""
        torch = sys.modules["torch"]
        like = inputs[0]
        xs, m = self._bf16_rows("run_entry", wanted, inputs)
        lib = _capi.lib()
        entry = ctypes.c_int(-1)
        check(lib.kiln_session_find_entry(self._live(), _capi.encode(name), ctypes.byref(entry)))
        width = [t.width for t in self._outputs if t.name == name][0]
        y = torch.empty((m, width), dtype=torch.bfloat16, device=like.device)
        ins = (_capi.DeviceMatrix * len(xs))(
            *[_capi.DeviceMatrix(x.data_ptr(), x.stride(0) if m > 1 else 0) for x in xs])
        out = _capi.DeviceMatrix(y.data_ptr(), 0)
        stream = torch.cuda.current_stream(like.device).cuda_stream
        with self._lock:
            check(lib.kiln_session_run_entry(self._live(), entry.value, m, ins,
                                             ctypes.byref(out), stream))
        dtype = like.dtype if like.is_floating_point() else torch.float32
        return y if dtype == torch.bfloat16 else y.to(dtype)

    def _on_this_gpu(self, inputs: Sequence[Any], tensor_type: type) -> bool:
        if self._ordinal < 0:
            return False
        return all(isinstance(x, tensor_type) and x.is_cuda and x.device.index == self._ordinal
                   for x in inputs)

    def _run_device(self, inputs: Sequence[Any]) -> Any:
        """run() on torch CUDA tensors, on the current torch stream."""
        torch = sys.modules["torch"]
        like = inputs[0]
        xs, m = self._bf16_rows("run", self._inputs, inputs)
        ys = [torch.empty((m, t.width), dtype=torch.bfloat16, device=like.device)
              for t in self._outputs]
        ins = (_capi.DeviceMatrix * len(xs))(
            *[_capi.DeviceMatrix(x.data_ptr(), x.stride(0) if m > 1 else 0) for x in xs])
        outs = (_capi.DeviceMatrix * max(len(ys), 1))(
            *[_capi.DeviceMatrix(y.data_ptr(), 0) for y in ys])
        stream = torch.cuda.current_stream(like.device).cuda_stream
        with self._lock:
            check(_capi.lib().kiln_session_run_device(self._live(), m, ins, outs, stream))
        dtype = like.dtype if like.is_floating_point() else torch.float32
        res = [y if dtype == torch.bfloat16 else y.to(dtype) for y in ys]
        return res[0] if len(res) == 1 else tuple(res)

    def __repr__(self) -> str:
        if self.closed:
            return "kiln.Session(closed)"
        return f"kiln.Session({self.device}, {self.graph!r})"
