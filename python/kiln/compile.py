"""Targets, plans, and ahead-of-time compiles into a kernel cache."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

from . import _capi
from ._handle import Handle
from ._options import PathLike, cache_options, plan_options
from .errors import check
from .graph import Graph, format_name


class Target:
    """A GPU architecture (``kiln_target``): named ones need no GPU."""

    def __init__(self, c: _capi.Target):
        self._c = c

    @classmethod
    def from_name(cls, name: str) -> "Target":
        """sm_75, sm_80, sm_86, sm_89, sm_90, sm_90a, or a product alias (t4,
        a100, a10, l40s, h100, h200). kiln.Error ``KILN_ERR_NOT_FOUND``
        listing the names otherwise."""
        c = _capi.Target()
        check(_capi.lib().kiln_target_from_name(_capi.encode(name), ctypes.byref(c)))
        return cls(c)

    @classmethod
    def live(cls, device: int = 0) -> "Target":
        """The target of CUDA device ordinal device. kiln.Error
        ``KILN_ERR_NO_DEVICE`` when there is no GPU or driver."""
        c = _capi.Target()
        check(_capi.lib().kiln_target_live(device, ctypes.byref(c)))
        return cls(c)

    @staticmethod
    def names() -> List[str]:
        """The names :meth:`from_name` accepts."""
        return _capi.strings(_capi.lib().kiln_target_names())

    name = property(lambda self: _capi.text(self._c.name), doc='NVRTC -arch: "sm_90a"')
    sm = property(lambda self: self._c.sm, doc="compute capability x 10")
    alias_of = property(lambda self: _capi.text(self._c.alias_of),
                        doc='the product name it was asked by ("h200"), or ""')
    sm_count = property(lambda self: self._c.sm_count,
                        doc="multiprocessors where the name fixes it, else 0")
    wgmma = property(lambda self: bool(self._c.wgmma))
    tma = property(lambda self: bool(self._c.tma))

    def __repr__(self) -> str:
        return f"kiln.Target({self.name!r})"


TargetLike = Union[Target, str]


def _target(t: TargetLike) -> Target:
    return t if isinstance(t, Target) else Target.from_name(t)


@dataclass(frozen=True)
class PlannedLinear:
    """What a plan does with one linear node in one bucket."""

    node: str
    format: str
    n: int
    k: int
    backend: str
    act: str
    epilogue: str
    signature: int
    refused: str
    fell_back: bool
    input_scale: float = 0.0  # the linear's static activation scale; 0: none
    input_scale_use: str = ""  # "fp8-static", "bf16-qdq" or "ignored" with one


class Plan(Handle):
    """A graph bound to a target (``kiln_plan``): per linear node and token
    bucket the backend that runs it, and the de-duplicated kernel
    signatures. Make one with :func:`plan`; it keeps its graph open."""

    _destroy = "kiln_plan_destroy"
    _what = "plan"

    def __init__(self, graph: Graph):
        super().__init__([graph])
        self.graph = graph

    @property
    def buckets(self) -> List[int]:
        """Token buckets, ascending."""
        lib, h = _capi.lib(), self._live()
        return [lib.kiln_plan_bucket(h, i) for i in range(lib.kiln_plan_n_buckets(h))]

    def bucket_for(self, m: int) -> Optional[int]:
        """The index of the smallest bucket >= m, or None past the largest."""
        i = _capi.lib().kiln_plan_bucket_for(self._live(), m)
        return i if i >= 0 else None

    @property
    def signatures(self) -> List[str]:
        """The distinct kernel signatures of all nodes and buckets."""
        lib, h = _capi.lib(), self._live()
        return [_capi.text(lib.kiln_plan_signature(h, i))
                for i in range(lib.kiln_plan_n_signatures(h))]

    @property
    def warnings(self) -> List[str]:
        return _capi.strings(_capi.lib().kiln_plan_warnings(self._live()))

    def linears(self, bucket: int = 0) -> List[PlannedLinear]:
        """Every linear node in bucket index bucket."""
        lib, h = _capi.lib(), self._live()
        out = []
        for i in range(lib.kiln_plan_n_linears(h)):
            c = _capi.PlanLinear()
            check(lib.kiln_plan_linear_at(h, i, bucket, ctypes.byref(c)))
            t = _capi.text
            out.append(PlannedLinear(t(c.node), format_name(c.format), c.n, c.k, t(c.backend),
                                     t(c.act), t(c.epilogue), c.signature, t(c.refused),
                                     bool(c.fell_back), c.input_scale, t(c.input_scale_use)))
        return out

    def arena_bytes(self, bucket: int) -> int:
        """Activation memory of bucket index bucket."""
        return _capi.lib().kiln_plan_arena_bytes(self._live(), bucket)

    def __repr__(self) -> str:
        if self.closed:
            return "kiln.Plan(closed)"
        return f"kiln.Plan({len(self.signatures)} signatures, buckets={self.buckets})"


def plan(graph: Graph, target: TargetLike, *, backend: Optional[str] = None,
         strict_backend: bool = False, capture: Optional[Sequence[int]] = None,
         max_tokens: int = 0, no_fuse: bool = False) -> Plan:
    """Plan graph for target (``kiln_plan_create``); needs no GPU and no NVRTC.

    Args:
        target: a :class:`Target` or a name ("sm_90a", "h200").
        backend: only this backend where it can (``--backend``).
        strict_backend: a node the backend cannot take is an error.
        capture: token-count capture sizes (default 1, 2, 4, ..., 512).
        max_tokens: the largest M to serve (0: the largest capture size).
        no_fuse: keep epilogues as separate nodes.

    Raises:
        kiln.Error: ``KILN_ERR_NO_KERNEL`` listing every backend's reason,
            ``KILN_ERR_NOT_FOUND`` for an unknown backend.
    """
    t = _target(target)
    po, _keep = plan_options(backend, strict_backend, capture, max_tokens, no_fuse)
    p = Plan(graph)
    check(_capi.lib().kiln_plan_create(graph._live(), ctypes.byref(t._c), ctypes.byref(po),
                                       ctypes.byref(p._h)))
    return p


@dataclass(frozen=True)
class CompileResult:
    """What a compile did (``kiln_compile_result``)."""

    signatures: int
    cached: int
    compiled: int
    seconds: float
    writable: bool


def compile(graph: Union[Graph, Plan], target: Optional[TargetLike] = None, *,
            cache: Optional[PathLike] = None, shipped: Sequence[PathLike] = (),
            offline: bool = False, no_writable: bool = False, strict_cache: bool = False,
            map_size: int = 0, jobs: int = 0, keep_source: Optional[PathLike] = None,
            quiet: bool = True, backend: Optional[str] = None, strict_backend: bool = False,
            capture: Optional[Sequence[int]] = None, max_tokens: int = 0,
            no_fuse: bool = False, compile_timeout_s: float = 0.0) -> CompileResult:
    """Compile ahead of time: plan graph for target, then make sure every
    kernel the plan needs is in a cache (looked up in the shipped caches,
    then the writable one, compiled with NVRTC on a miss and stored). No GPU
    is needed. Given a :class:`Plan`, compiles it (target and the plan
    options must then be left out).

    Args:
        cache: the writable cache file (default ``$KILN_CACHE``, else
            ``$XDG_CACHE_HOME/kiln/kernels.kiln``).
        shipped: read-only caches searched first, in order.
        offline: a kernel missing from every cache is an error
            (``KILN_ERR_OFFLINE_MISS``), nothing is compiled.
        no_writable: open no writable cache.
        strict_cache: a damaged cache file is an error, not left out.
        map_size: initial map of the writable cache in bytes (0: 64 MiB).
        jobs: compiles at once (0: one per core).
        keep_source: write sources, NVRTC logs and PTX into this directory.
        quiet: no progress line on a terminal.
        backend, strict_backend, capture, max_tokens, no_fuse: as for :func:`plan`.
        compile_timeout_s: seconds one kernel's compile may take (0:
            ``$KILN_COMPILE_TIMEOUT``, else 600).

    Raises:
        kiln.Error: ``KILN_ERR_COMPILE`` with NVRTC's log,
            ``KILN_ERR_NOT_FOUND`` when NVRTC cannot be loaded,
            ``KILN_ERR_NO_KERNEL``, ``KILN_ERR_OFFLINE_MISS``,
            ``KILN_ERR_CACHE``, ``KILN_ERR_IO``.
    """
    co = _capi.CompileOptions()
    co.cache, _keep = cache_options(cache, shipped, offline, no_writable, strict_cache, map_size)
    co.jobs = jobs
    ks = _capi.encode(keep_source)
    co.keep_source = ks
    co.quiet = int(quiet)
    co.compile_timeout_s = compile_timeout_s
    res = _capi.CompileResult()
    lib = _capi.lib()
    if isinstance(graph, Plan):
        if target is not None or backend or strict_backend or capture is not None or \
                max_tokens or no_fuse:
            raise TypeError("compile(plan): the plan fixes the target and plan options")
        check(lib.kiln_compile_plan(graph._live(), ctypes.byref(co), ctypes.byref(res)))
    else:
        if target is None:
            raise TypeError("compile(graph, target): a target is needed ('sm_90a', 'h200')")
        t = _target(target)
        co.plan, _keep_plan = plan_options(backend, strict_backend, capture, max_tokens, no_fuse)
        check(lib.kiln_compile(graph._live(), ctypes.byref(t._c), ctypes.byref(co),
                               ctypes.byref(res)))
    return CompileResult(res.signatures, res.cached, res.compiled, res.seconds,
                         bool(res.writable))


def export(plan: Plan, path: PathLike, *, cache: Optional[PathLike] = None,
           shipped: Sequence[PathLike] = (), overwrite: bool = False) -> None:
    """Write a cache file at path holding exactly the kernels plan needs,
    taken from the caches named (compile the plan into them first): the file
    to ship with the deployment. Nothing is compiled.

    Raises:
        kiln.Error: ``KILN_ERR_OFFLINE_MISS`` naming a kernel no cache holds;
            ``KILN_ERR_IO`` when path exists and overwrite is False.
    """
    co, _keep = cache_options(cache, shipped, False, False, False, 0)
    c = ctypes.c_void_p()
    lib = _capi.lib()
    check(lib.kiln_cache_open(ctypes.byref(co), ctypes.byref(c)))
    try:
        check(lib.kiln_cache_export(c, plan._live(), _capi.encode(path), int(overwrite)))
    finally:
        lib.kiln_cache_close(c)
