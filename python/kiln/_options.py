"""The C option structs built from keyword arguments named after their fields."""
from __future__ import annotations

import ctypes
import os
from typing import List, Optional, Sequence, Tuple, Union

from . import _capi

PathLike = Union[str, "os.PathLike[str]"]


def cache_options(cache: Optional[PathLike], shipped: Sequence[PathLike], offline: bool,
                  no_writable: bool, strict: bool, map_size: int
                  ) -> Tuple[_capi.CacheOptions, List[object]]:
    """A kiln_cache_options and the objects its pointers point into (keep
    them alive for as long as the struct is used)."""
    if isinstance(shipped, (str, bytes, os.PathLike)):
        shipped = [shipped]  # one file given bare, not its characters
    files = [_capi.encode(s) for s in shipped]
    arr = (ctypes.c_char_p * max(len(files), 1))(*files)
    path = _capi.encode(cache)
    c = _capi.CacheOptions(shipped=arr if files else None, n_shipped=len(files), path=path,
                           no_writable=int(no_writable), map_size=map_size, strict=int(strict),
                           offline=int(offline))
    return c, [arr, files, path]


def plan_options(backend: Optional[str], strict_backend: bool,
                 capture: Optional[Sequence[int]], max_tokens: int, no_fuse: bool
                 ) -> Tuple[_capi.PlanOptions, List[object]]:
    """A kiln_plan_options and the objects its pointers point into."""
    b = _capi.encode(backend)
    sizes = None
    if capture is not None:
        sizes = (ctypes.c_int64 * max(len(capture), 1))(*[int(v) for v in capture])
    c = _capi.PlanOptions(backend=b, strict_backend=int(strict_backend),
                          capture=ctypes.cast(sizes, ctypes.POINTER(ctypes.c_int64))
                          if sizes is not None else None,
                          n_capture=len(capture) if capture is not None else 0,
                          max_tokens=max_tokens, no_fuse=int(no_fuse))
    return c, [b, sizes]


def largest_bucket(capture: Optional[Sequence[int]], max_tokens: int) -> int:
    """The largest token count a plan of these options serves."""
    if max_tokens:
        return max_tokens
    return max(capture) if capture else 512
