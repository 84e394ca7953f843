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
    kind = _KINDS.get(type(obj))
    if kind is None:  # (the first message of its type: a round counts thousands)
        kind = _kind(obj)
    if kind is _OWN:  # (first: a batched phase's per-client messages, thousands a round)
        size = getattr(obj, "nbytes", None)
        if type(size) is int:
            return size
        return _own_size(obj, size)
    if kind is _ARRAY:
        return obj.nbytes
    if kind is _DICT:  # (one message per client, thousands a round)
        total = 0
        for v in obj.values():
            total += v.nbytes if type(v) is np.ndarray else nbytes(v)
        return total
    if kind is _BROADCAST:
        return nbytes(obj.message)
    if kind is _SPARSE:
        return obj.data.nbytes + obj.indices.nbytes + obj.indptr.nbytes
    if kind is _SEQUENCE:
        total = 0
        for v in obj:
            total += nbytes(v)
        return total
    return 8  # (_SCALAR)


def _own_size(obj, size):
    """The size a self-sized message reports, checked (``size``: its ``nbytes``)."""
    if isinstance(size, (int, np.integer)):
        return int(size)
    raise TypeError(f"Cannot count the bytes of a message part of type {type(obj).__name__}.")


_ARRAY, _DICT, _BROADCAST, _SPARSE, _SEQUENCE, _SCALAR, _OWN = range(7)
_KINDS = {}  # type -> how nbytes counts it (the checks below depend on the type alone)


def _kind(obj):
    """How :func:`nbytes` counts a message of ``type(obj)``, in the order of its checks;
    remembered for the type (a type that reports no size of its own is not)."""
    if isinstance(obj, np.ndarray):
        kind = _ARRAY
    elif isinstance(obj, dict):  # (before issparse)
        kind = _DICT
    elif isinstance(obj, Broadcast):
        kind = _BROADCAST
    elif sp.issparse(obj):
        kind = _SPARSE
    elif isinstance(obj, (list, tuple)):
        kind = _SEQUENCE
    elif isinstance(obj, (int, float, np.number, bool)):
        kind = _SCALAR
    elif isinstance(getattr(obj, "nbytes", None), (int, np.integer)):
        kind = _OWN  # (its size is still read and checked per message)
    else:
        raise TypeError(
            f"Cannot count the bytes of a message part of type {type(obj).__name__}.")
    _KINDS[type(obj)] = kind
    return kind
