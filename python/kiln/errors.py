"""kiln's status codes and the exception that carries them."""
from __future__ import annotations

import enum

from . import _capi


class Status(enum.IntEnum):
    """``kiln_status`` of include/kiln.h; the values are the C values.

    tests/test_errors.py checks each name against ``kiln_strerror``.
    """

    OK = 0
    ERR_INVALID_ARG = 1
    ERR_NOMEM = 2
    ERR_IO = 3
    ERR_MALFORMED = 4
    ERR_UNSUPPORTED = 5
    ERR_SHAPE = 6
    ERR_NOT_FOUND = 7
    ERR_STATE = 8
    ERR_NO_KERNEL = 9
    ERR_COMPILE = 10
    ERR_CACHE = 11
    ERR_OFFLINE_MISS = 12
    ERR_CUDA = 13
    ERR_NO_DEVICE = 14


class Error(Exception):
    """A kiln call failed.

    Attributes:
        status: the :class:`Status` the call returned (an ``int`` for a value
            this package does not know).
        name: the status's C name, e.g. ``"KILN_ERR_SHAPE"``.
        message: ``kiln_last_error()``: what went wrong and where.
    """

    def __init__(self, status: int, message: str):
        self.status = Status(status) if status in Status._value2member_map_ else status
        self.name = status_name(status)
        self.message = message
        super().__init__(f"{self.name}: {message}" if message else self.name)


def status_name(status: int) -> str:
    """The C name of a status ("KILN_ERR_SHAPE"), as ``kiln_strerror`` gives it."""
    return _capi.text(_capi.lib().kiln_strerror(status)).split(":", 1)[0]


def check(status: int) -> None:
    """Raise :class:`Error` with the thread's ``kiln_last_error()`` unless
    status is ``KILN_OK``. Called right after the failing call, on its thread."""
    if status != 0:
        raise Error(status, _capi.text(_capi.lib().kiln_last_error()))
