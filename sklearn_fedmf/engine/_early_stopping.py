"""Early stopping in the round loop: the rule, and the best validated round that the server
and every client keep (:func:`~sklearn_fedmf.engine._federation.run_federation`)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from ._groups import GroupStates

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


class _BestRound:
    """The best validated round's federation state, kept by the server (its state and
    broadcast) and by every client (its own state), and the patience count."""

    def __init__(self, rule, state):
        self.rule = rule
        self.best, self.round = state.best_score, state.best_round  # (warm start: continued)
        self.kept, self.waited, self.first = None, 0, None
        if self.best is not None:  # a warm start starts at its previous best: kept until beaten
            self._keep(state)

    def _keep(self, state):
        # copies: some protocols update their states in place (_groups.py); the previous
        # best's arrays are reused as buffers (it is replaced: no allocation per best round)
        states = state.client_states
        kept = states.group_states if isinstance(states, GroupStates) else states
        self.kept = snapshot((state.server_state, state.broadcast, list(kept)), self.kept)

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


def snapshot(obj, previous=None):
    """A copy of a federation state (dicts, lists, tuples, named tuples of numpy arrays and
    scalars) that no later in-place update of ``obj`` changes, as ``copy.deepcopy`` gives it,
    at a lower cost: constant arrays (read-only, see :func:`_constant`: e.g. a client's
    layout of its rated items) are shared, not copied, and the writeable arrays of
    ``previous`` (an earlier snapshot of the same structure, no longer used) are reused as
    buffers where the shape and dtype match (a copy into them allocates nothing). An array
    reached twice (the server's ``V`` in its state and in the broadcast) is copied once, as
    ``deepcopy``'s memo does; other objects are deep-copied with that memo."""
    memo, used = {}, set()
    return _snapshot(obj, previous, memo, used)


def _snapshot(obj, previous, memo, used):
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
        out = {k: _snapshot(v, before.get(k), memo, used) for k, v in obj.items()}
    elif type(obj) is list or type(obj) is tuple or (isinstance(obj, tuple)
                                                      and hasattr(obj, "_fields")):
        before = previous if type(previous) is type(obj) and len(previous) == len(obj) else ()
        items = [_snapshot(v, before[i] if before else None, memo, used)
                 for i, v in enumerate(obj)]
        out = items if type(obj) is list else (
            tuple(items) if type(obj) is tuple else type(obj)(*items))
    else:
        return copy.deepcopy(obj, memo)  # (deepcopy records it in the memo)
    memo[key] = out
    _keep_alive(memo, obj)
    return out


def _keep_alive(memo, obj):
    # (the memo is keyed by id: the originals must outlive it, as in copy.deepcopy)
    memo.setdefault(id(memo), []).append(obj)
