"""Early stopping in the round loop: the rule, and the best validated round that the server
and every client keep (:func:`~sklearn_fedmf.engine._federation.run_federation`)."""

from __future__ import annotations

import copy
import os
import tempfile
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ._groups import GroupStates
from ._page_out import move_bytes

__all__ = ["EarlyStopping"]


@dataclass(frozen=True)
class EarlyStopping:
    """Federated validation in the round loop (``run_federation(early_stopping=...)``).

    Each evaluation, every client reports its squared-error sum and count on its held-out
    ratings (``report_keys`` of its ``client_metrics``: two numbers, counted in
    ``bytes_uploaded``); the server's validation RMSE is ``record[score_key]``, recorded as
    ``record["validation_rmse"]`` (with ``rename``, for a part held out of the training
    ratings, every ``eval_*`` key becomes ``validation_*``). The server keeps a
    copy of the federation's state (its own, and every client its own) at the best round;
    the fit stops when the RMSE has not gone below the best minus ``tol`` for
    ``n_iter_no_change`` evaluations (never while the best is still the first evaluated
    round: the start-up), and the best round's state is restored at the end. With
    ``scored_if``, only the rounds whose record holds a true value under that key are scored
    and counted (RFRecF's ``"coin"``: the rounds that average; between them the server's
    model does not change and the clients' vectors drift with their own copies).
    """

    n_iter_no_change: int = 10
    tol: float = 0.0
    score_key: str = "eval_rmse"
    report_keys: tuple = ("sse_eval", "n_eval")
    rename: bool = True
    scored_if: str | None = None
    spill_bytes: int | None = 2**32
    # who reports when a round samples its clients: None every client, an int that many,
    # "auto" a panel sized from the reports (engine._panel.panel_reports)
    panel: int | str | None = None


class _BestRound:
    """The best validated round's federation state, kept by the server (its state and
    broadcast) and by every client (its own state), and the patience count."""

    def __init__(self, rule, state):
        self.rule = rule
        self.best, self.round = state.best_score, state.best_round  # (warm start: continued)
        self.kept, self.waited, self.first = None, 0, None
        self.spill = None  # (the temporary file of a spilled copy)
        if self.best is not None:  # a warm start starts at its previous best: kept until beaten
            self._keep(state)

    def _keep(self, state):
        # copies: some protocols update their states in place (_groups.py); the previous
        # best's arrays are reused as buffers (it is replaced: no allocation per best round)
        states = state.client_states
        kept = states.group_states if isinstance(states, GroupStates) else states
        live = (state.server_state, state.broadcast, list(kept))
        limit = self.rule.spill_bytes
        if limit is not None and _copied_bytes(live, set()) >= limit:
            try:
                if self.spill is None:
                    self.spill = _Spill()
                self.spill.end = 0  # (the previous copy's place in the file is reused)
                self.kept = snapshot(live, spill=self.spill)
                return
            except OSError:  # (no room for the file: the copy stays in memory, as below)
                if self.spill is not None:
                    self.spill.close()
                self.spill, self.kept = None, None
        self.kept = snapshot(live, self.kept)

    def update(self, state, record, round_number):
        """Score the round's record; True when the fit should stop."""
        rule = self.rule
        score = record[rule.score_key]
        scored = rule.scored_if is None or bool(record.get(rule.scored_if))
        if rule.rename:  # the held-out part of the training ratings: not an eval set
            for key in [key for key in record if key.startswith("eval_")]:
                record["validation_" + key[len("eval_"):]] = record.pop(key)
        record["validation_rmse"] = score
        if not scored:  # (recorded, neither kept nor counted)
            return False
        if self.best is None:  # the first evaluated round: the start the fit must beat
            self.first = round_number
        if self.best is None or score < self.best - rule.tol:
            self.best, self.round, self.waited = score, round_number, 0
            self._keep(state)
            return False
        self.waited += 1
        # A fit whose best is still its first evaluated round is in its start-up (factors
        # growing from small initial values can raise the validation error for tens of
        # rounds before it falls below the start): it is not stopped then, only its best
        # round is kept.
        return self.waited >= rule.n_iter_no_change and self.round != self.first

    def restore(self, state):
        """Put the best round's states back, in the server and in every client."""
        state.best_round, state.best_score = self.round, self.best
        if self.kept is None:  # (no round was evaluated)
            return
        server_state, broadcast, kept = self.kept
        states = state.client_states
        target = states.group_states if isinstance(states, GroupStates) else states
        if self.spill is not None:  # read back into the live arrays: no second state at once
            live = (state.server_state, state.broadcast, list(target))
            server_state, broadcast, kept = _unspill(self.kept, live, self.spill, {}, set())
            self.kept = None
            self.spill.close()
            self.spill = None
        target[:] = kept  # in place: the transport holds the same list
        state.server_state, state.broadcast = server_state, broadcast


def _constant(a):
    """Whether an array's values cannot change: it and every array it views are read-only
    (a read-only view of a writeable array changes with it)."""
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return True


_ATOMS = (int, float, complex, bool, str, bytes, type(None), np.generic)


def snapshot(obj, previous=None, spill=None):
    """A copy of a federation state (dicts, lists, tuples, named tuples of numpy arrays and
    scalars) that no later in-place update of ``obj`` changes, as ``copy.deepcopy`` gives it,
    at a lower cost: constant arrays (read-only, see :func:`_constant`: e.g. a client's
    layout of its rated items) are shared, not copied, and the writeable arrays of
    ``previous`` (an earlier snapshot of the same structure, no longer used) are reused as
    buffers where the shape and dtype match (a copy into them allocates nothing). An array
    reached twice (the server's ``V`` in its state and in the broadcast) is copied once, as
    ``deepcopy``'s memo does; other objects are deep-copied with that memo.

    With ``spill`` (a :class:`_Spill`), the arrays of at least 1 MiB are written to its file
    and stand as :class:`_Spilled` in the copy (:func:`_unspill` reads them back); the
    other objects are deep-copied first, so that none of them holds a spilled array (an
    array they share with the rest keeps one copy, in memory)."""
    memo, used = {}, set()
    if spill is not None:
        _copy_opaque(obj, memo)
    return _snapshot(obj, previous, memo, used, spill)


_SPILL_MIN = 2**20  # (smaller arrays stay in memory: a file write each is not worth it)


class _Spilled(NamedTuple):
    """An array of a spilled copy: its bytes at ``offset`` of the spill file."""

    offset: int
    shape: tuple
    dtype: np.dtype
    fortran: bool


class _Spill:
    """An unnamed temporary file (removed when closed) holding a copy's large arrays."""

    def __init__(self):
        self.file = tempfile.TemporaryFile()
        self.end = 0

    def write(self, a):
        fortran = not a.flags.c_contiguous
        _transfer(os.pwrite, self.file.fileno(), a.T if fortran else a, self.end)
        out = _Spilled(self.end, a.shape, a.dtype, fortran)
        self.end += a.nbytes
        return out

    def read(self, spilled, out=None):
        if out is None:
            out = np.empty(spilled.shape, spilled.dtype, order="F" if spilled.fortran else "C")
        _transfer(os.preadv, self.file.fileno(), out.T if spilled.fortran else out,
                  spilled.offset)
        return out

    def close(self):
        self.file.close()


def _transfer(call, fd, a, offset):
    """Write (``os.pwrite``) or read (``os.preadv``) the C-contiguous ``a``'s bytes at
    ``offset`` (:func:`~._page_out.move_bytes`)."""
    move_bytes(call, fd, memoryview(a.reshape(-1).view(np.uint8)), offset,
               "early stopping's spill file")


def _spillable(a):
    return (a.nbytes >= _SPILL_MIN and a.dtype.kind in "biufc"
            and (a.flags.c_contiguous or a.flags.f_contiguous))


def _containers(obj):
    """The items of a container the copy walks (dict values, list and tuple items)."""
    if type(obj) is dict:
        return obj.values()
    if _sequence(obj):
        return obj
    return None


def _sequence(obj):
    """A list, tuple or named tuple (what :func:`_snapshot` walks into)."""
    return type(obj) is list or type(obj) is tuple or (isinstance(obj, tuple)
                                                       and hasattr(obj, "_fields"))


def _like(obj, items):
    """``items`` in the sequence type of ``obj`` (list, tuple or named tuple)."""
    return items if type(obj) is list else (
        tuple(items) if type(obj) is tuple else type(obj)(*items))


def _copied_bytes(obj, seen):
    """The bytes of the arrays a copy of ``obj`` holds (constant arrays shared, an array
    counted once; other objects not counted)."""
    if id(obj) in seen or isinstance(obj, _ATOMS):
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return 0 if obj.dtype == object or _constant(obj) else obj.nbytes
    items = _containers(obj)
    return 0 if items is None else sum(_copied_bytes(v, seen) for v in items)


def _copy_opaque(obj, memo):
    """Deep-copy, into ``memo``, the objects of ``obj`` that :func:`_snapshot` does not walk
    (and the object arrays)."""
    if isinstance(obj, _ATOMS) or id(obj) in memo:
        return
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            copy.deepcopy(obj, memo)
        return
    items = _containers(obj)
    if items is None:
        copy.deepcopy(obj, memo)
        return
    for v in items:
        _copy_opaque(v, memo)


def _unspill(kept, live, spill, memo, used):
    """``kept`` with its :class:`_Spilled` arrays read back, each into the array at the same
    place of ``live`` (the state it replaces, whose arrays are then dropped) where that one
    can hold it (writeable, owning its data, same shape, dtype and order, used once)."""
    key = id(kept)
    if key in memo:
        return memo[key]
    if isinstance(kept, _Spilled):
        buffer = None
        if (isinstance(live, np.ndarray) and live.flags.writeable and live.base is None
                and id(live) not in used and live.shape == kept.shape
                and live.dtype == kept.dtype
                and (live.flags.f_contiguous if kept.fortran else live.flags.c_contiguous)):
            used.add(id(live))
            buffer = live
        out = spill.read(kept, buffer)
    elif type(kept) is dict:
        before = live if type(live) is dict else {}
        out = {k: _unspill(v, before.get(k), spill, memo, used) for k, v in kept.items()}
    elif _sequence(kept):
        same = type(live) is type(kept) and len(live) == len(kept)
        out = _like(kept, [_unspill(v, live[i] if same else None, spill, memo, used)
                           for i, v in enumerate(kept)])
    else:
        return kept
    memo[key] = out
    return out


def _snapshot(obj, previous, memo, used, spill=None):
    if isinstance(obj, _ATOMS):
        return obj
    key = id(obj)
    if key in memo:
        return memo[key]
    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            out = copy.deepcopy(obj, memo)
        elif _constant(obj):
            out = obj
        elif spill is not None and _spillable(obj):
            out = spill.write(obj)
        elif (isinstance(previous, np.ndarray) and previous.flags.writeable
              and id(previous) not in used and previous.base is None
              and previous.dtype == obj.dtype and previous.shape == obj.shape
              and previous.strides == obj.strides
              and (obj.flags.c_contiguous or obj.flags.f_contiguous)):
            used.add(id(previous))  # (one buffer per array: aliases stay apart)
            np.copyto(previous, obj)
            out = previous
        else:  # (the memory order deepcopy keeps: some kernels hold Fortran-ordered arrays)
            out = obj.copy(order="K")
    elif type(obj) is dict:
        before = previous if type(previous) is dict else {}
        out = {k: _snapshot(v, before.get(k), memo, used, spill) for k, v in obj.items()}
    elif _sequence(obj):
        before = previous if type(previous) is type(obj) and len(previous) == len(obj) else ()
        out = _like(obj, [_snapshot(v, before[i] if before else None, memo, used, spill)
                          for i, v in enumerate(obj)])
    else:
        return copy.deepcopy(obj, memo)  # (deepcopy records it in the memo)
    memo[key] = out
    _keep_alive(memo, obj)
    return out


def _keep_alive(memo, obj):
    # (the memo is keyed by id: the originals must outlive it, as in copy.deepcopy)
    memo.setdefault(id(memo), []).append(obj)
