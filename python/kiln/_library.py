"""Finding and loading libkiln.

The places are tried in this order, and the first library that loads wins:

1. ``$KILN_LIBRARY``: the path of a libkiln shared library. When it is set,
   nothing else is tried: a library asked for by name must be the one used.
2. Next to the package: a ``libkiln.so*`` installed inside it (``pip install
   ./python`` puts the built library there when it finds one).
3. The build tree, when the package is imported from a kiln checkout:
   ``$KILN_BUILD_DIR``, then ``build/`` at the checkout's root.
4. The system loader: ``libkiln.so.<major>`` and what ``ctypes.util.find_library``
   finds (``LD_LIBRARY_PATH``, the ldconfig cache, the default directories).

When none loads, :class:`LibraryNotFoundError` lists every place and why it
was passed over.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading
from typing import List, Optional, Tuple

#: The library's major version this package is written against (its soname).
ABI_MAJOR = 0

_lock = threading.Lock()
_loaded: Optional[Tuple[ctypes.CDLL, str]] = None


class LibraryNotFoundError(ImportError):
    """libkiln could not be loaded from any of the places searched.

    ``tried`` holds one ``(place, reason)`` pair per place, in search order.
    """

    def __init__(self, tried: List[Tuple[str, str]]):
        self.tried = tried
        lines = "\n".join(f"  {place}: {why}" for place, why in tried)
        super().__init__("libkiln could not be loaded; searched, in order:\n" + lines +
                         "\nBuild kiln (scripts/setup), then set KILN_LIBRARY to the path of "
                         "libkiln.so, or install it (cmake --install build).")


def _package_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def _candidates() -> List[Tuple[str, List[str]]]:
    """(place, [paths to try]) in search order, KILN_LIBRARY excluded."""
    here = _package_dir()
    out = [("next to the package (" + here + ")",
            sorted(glob.glob(os.path.join(here, "libkiln.so*")), key=len))]
    root = os.path.dirname(os.path.dirname(here))
    if os.path.isfile(os.path.join(root, "include", "kiln.h")):
        build = os.environ.get("KILN_BUILD_DIR")
        if build:
            out.append((f"$KILN_BUILD_DIR ({build})", [os.path.join(build, "libkiln.so")]))
        out.append(("the build tree (" + os.path.join(root, "build") + ")",
                    [os.path.join(root, "build", "libkiln.so")]))
    found = ctypes.util.find_library("kiln")
    out.append(("the system loader",
                [f"libkiln.so.{ABI_MAJOR}"] + ([found] if found else [])))
    return out


def _try(path: str) -> Tuple[Optional[ctypes.CDLL], str]:
    try:
        return ctypes.CDLL(path), ""
    except OSError as e:
        return None, str(e)


def load() -> Tuple[ctypes.CDLL, str]:
    """The loaded library and the path it was loaded from (loaded once)."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        tried: List[Tuple[str, str]] = []
        explicit = os.environ.get("KILN_LIBRARY")
        if explicit:
            lib, why = _try(explicit)
            if lib is None:
                raise LibraryNotFoundError([(f"$KILN_LIBRARY ({explicit})", why)])
            _loaded = (lib, explicit)
            return _loaded
        tried.append(("$KILN_LIBRARY", "not set"))
        for place, paths in _candidates():
            if not paths:
                tried.append((place, "no libkiln.so there"))
                continue
            for path in paths:
                if os.path.isabs(path) and not os.path.exists(path):
                    tried.append((place, f"{path} does not exist"))
                    continue
                lib, why = _try(path)
                if lib is not None:
                    _loaded = (lib, path)
                    return _loaded
                tried.append((place, why))
        raise LibraryNotFoundError(tried)
