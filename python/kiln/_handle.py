"""Ownership of C handles.

A kiln object may point into another (a graph into a model's mapping, a
session into its graph), so the Python object of the one holds the other
alive, and closing the other first closes what depends on it: no C pointer
outlives what it points into, whatever order the caller closes things in.
"""
from __future__ import annotations

import ctypes
import weakref
from typing import Iterable, Optional

from . import _capi


class Handle:
    """An owned C handle, released by the C function named ``_destroy``."""

    _destroy = ""
    _what = "object"

    def __init__(self, parents: Iterable["Handle"] = ()):
        self._h = ctypes.c_void_p()
        self._parents = [p for p in parents if p is not None]
        self._children: "weakref.WeakSet[Handle]" = weakref.WeakSet()
        for p in self._parents:
            p._live()
            p._children.add(self)

    def _live(self) -> ctypes.c_void_p:
        if not self._h:
            raise ValueError(f"this kiln {self._what} is closed")
        return self._h

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran (or creation failed)."""
        return not self._h

    def close(self) -> None:
        """Release the C object, and first everything made from it. Idempotent."""
        for c in list(self._children):
            c.close()
        if self._h:
            getattr(_capi.lib(), self._destroy)(self._h)
            self._h = ctypes.c_void_p()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        h: Optional[ctypes.c_void_p] = getattr(self, "_h", None)
        if h:
            try:
                getattr(_capi.lib(), self._destroy)(h)
            except Exception:  # interpreter shutdown: the module may be gone
                pass
