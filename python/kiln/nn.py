"""kiln.Linear: a torch.nn.Module running one linear layer on kiln.

Imported by the package only when torch is importable.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from .graph import Graph, quantize
from .session import Session


def _host_f32(t: Any) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().to("cpu", torch.float32).numpy()
    return np.asarray(t, dtype=np.float32)


class Linear(torch.nn.Module):
    """``y = x · Wᵀ (+ b)`` with W quantized into a kiln format, run by a
    :class:`kiln.Session` (a GPU session, or the CPU executor without a GPU).
    A module a user swaps in for ``torch.nn.Linear`` (see :meth:`from_linear`);
    it holds no parameters and is not trainable.

    Inputs ``[..., in_features]`` of any float dtype and device come back as
    ``[..., out_features]`` in the input's dtype, on its device. On the
    session's GPU they stay there as BF16, on the current torch stream;
    elsewhere they travel through host memory as float32 (see
    :meth:`kiln.Session.run`). A batch larger than the session's largest
    bucket runs in chunks.

    Args:
        weight: ``[out_features, in_features]``, a torch tensor or an array.
        bias: ``[out_features]`` or None.
        format: kiln's format name for the weight ("bf16", "fp8",
            "q4_k", ... see :func:`kiln.formats`); the weight is quantized
            here with kiln's CPU reference.
        session_options: passed to :class:`kiln.Session` (device, cache,
            shipped, offline, capture, max_tokens, ...).
    """

    def __init__(self, weight: Any, bias: Optional[Any] = None, *, format: str = "bf16",
                 **session_options: Any):
        super().__init__()
        w = _host_f32(weight)
        if w.ndim != 2:
            raise ValueError(f"kiln.Linear: weight must be [out, in], got shape {w.shape}")
        self.out_features, self.in_features = (int(v) for v in w.shape)
        self.format = format
        g = Graph()
        x = g.input("x", self.in_features)
        wt = g.weight("weight", quantize(w, format))
        b = g.param("bias", _host_f32(bias)) if bias is not None else None
        g.output(g.linear("y", x, wt, b))
        self.session = Session(g, **session_options)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, *, format: str = "bf16",
                    **session_options: Any) -> "Linear":
        """A kiln.Linear computing what linear computes, its weight quantized
        into format."""
        return cls(linear.weight, linear.bias, format=format, **session_options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"kiln.Linear: input has {x.shape[-1]} features, "
                             f"want {self.in_features}")
        lead = x.shape[:-1]
        flat = x.reshape(-1, self.in_features)
        rows = flat.shape[0]
        step = self.session.max_tokens or max(rows, 1)
        if 0 < rows <= step:
            y = self.session.run(flat)
        else:
            parts = [self.session.run(flat[i:i + step]) for i in range(0, rows, step)]
            y = torch.cat(parts) if parts else flat.new_zeros((0, self.out_features))
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"format={self.format}, device={self.session.device}")
