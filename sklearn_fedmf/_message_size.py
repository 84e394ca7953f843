"""What a message is and what it weighs: a server's :class:`Broadcast` and :func:`nbytes`,
the size the engine counts for every upload and broadcast (here, below the engine, so that the
secure exchange counts the same way without importing the engine)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["Broadcast", "nbytes"]


@dataclass(frozen=True)
class Broadcast:
    """A broadcast with an uncounted part (module docstring).

    ``message`` is what the server sends (None: nothing this round); ``simulation`` is state
    that every client would hold or derive itself, carried for the simulation and never
    counted as communication.
    """

    message: Any
    simulation: Any = None


def nbytes(obj):
    """Size in bytes of what a message holds (arrays, sparse matrices, containers, scalars).

    Only the ``message`` of a :class:`Broadcast` counts.
    """
    if obj is None:
        return 0
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):  # (before issparse: one message per client, thousands a round)
        total = 0
        for v in obj.values():
            total += v.nbytes if type(v) is np.ndarray else nbytes(v)
        return total
    if isinstance(obj, Broadcast):
        return nbytes(obj.message)
    if sp.issparse(obj):
        return obj.data.nbytes + obj.indices.nbytes + obj.indptr.nbytes
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    if isinstance(obj, (int, float, np.number, bool)):
        return 8
    if isinstance(getattr(obj, "nbytes", None), (int, np.integer)):
        return int(obj.nbytes)  # a message type that reports its own size
    raise TypeError(f"Cannot count the bytes of a message part of type {type(obj).__name__}.")
