"""Predictions from factors without a dense users x items matrix: pairs and top-N lists.

Pure functions on numpy arrays, shared by ``RatingRegressor`` and the matrix estimators'
``predict``. A model is read as a :class:`FactorModel` (what each estimator family's
``_factor_model`` returns): the rating of user ``u`` for item ``i`` is
``link(offset + b_u + b_i + U[u] . V[i])``, a bias that a model lacks counting as zero.

* :func:`predict_pairs` costs O(n_pairs x rank) time and O(n_pairs) memory (one compiled,
  parallel pass; each output is independent, so the result does not depend on the threads).
* :func:`top_n` scores users in batches of at most ``budget`` bytes (one BLAS product per
  batch) and keeps each user's best ``n`` items with a compiled selection that never sorts
  a whole row: memory is bounded by the batch, not by ``n_users x n_items``.

``benchmarks/bench_predict.py`` times both at the Netflix and ML-1M shapes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from ._kernels import read_only

__all__ = ["FactorModel", "predict_pairs", "score_block", "top_n", "BATCH_BYTES"]

# Scratch memory of one scoring batch of ``top_n`` (the dense block of scores).
BATCH_BYTES = 64 * 2**20


class FactorModel(NamedTuple):
    """A fitted factor model as the prediction code reads it.

    ``rating(u, i) = link(offset + user_bias[u] + item_bias[i] + user_factors[u] .
    item_factors[i])``; a bias that is None counts as zero, a ``link`` that is None is the
    identity.
    """

    user_factors: np.ndarray  # (n_users, r)
    item_factors: np.ndarray  # (n_items, r), C-contiguous
    user_bias: np.ndarray | None
    item_bias: np.ndarray | None
    offset: float
    link: Callable | None = None


@njit(cache=True, nogil=True, parallel=True)
def _pair_kernel(users, items, U, Vt, bu, has_bu, bi, has_bi, offset, fallback, out, modeled):
    r = U.shape[1]
    for s in prange(users.shape[0]):
        u, i = users[s], items[s]
        if u >= 0 and i >= 0:
            v = offset
            for a in range(r):
                v += U[u, a] * Vt[i, a]
            if has_bu:
                v += bu[u]
            if has_bi:
                v += bi[i]
            out[s] = v
            modeled[s] = True
        elif u < 0 and i >= 0 and has_bi:  # cold user: the item's bias
            out[s] = offset + bi[i]
            modeled[s] = True
        elif i < 0 and u >= 0 and has_bu:  # cold item: the user's bias
            out[s] = offset + bu[u]
            modeled[s] = True
        else:
            out[s] = fallback
            modeled[s] = False


def _bias(b):
    return read_only(np.zeros(1) if b is None else b, np.float64), b is not None


def predict_pairs(model, users, items, fallback):
    """Ratings of the (user, item) index pairs; a negative index is an unseen id.

    Parameters
    ----------
    model : FactorModel
    users, items : ndarray of int of shape (n_pairs,)
        Row of ``model.user_factors`` and of ``model.item_factors``, or -1 when unseen.
    fallback : float
        The rating of a pair that the model cannot score (an unseen user without item bias,
        an unseen item without user bias, or both unseen).

    Returns
    -------
    ratings : ndarray of shape (n_pairs,), float64
    """
    users = np.ascontiguousarray(users, dtype=np.int64)
    items = np.ascontiguousarray(items, dtype=np.int64)
    bu, has_bu = _bias(model.user_bias)
    bi, has_bi = _bias(model.item_bias)
    out = np.empty(users.shape[0])
    modeled = np.empty(users.shape[0], dtype=np.bool_)
    _pair_kernel(users, items, read_only(model.user_factors), read_only(model.item_factors),
                 bu, has_bu, bi, has_bi, float(model.offset), float(fallback), out, modeled)
    if model.link is not None:
        out[modeled] = model.link(out[modeled])
    return out


@njit(cache=True, nogil=True, parallel=True)
def _select_top(S, rows, seen_indptr, seen_indices, col_pos, n, out_idx, out_val):
    """Each row's ``n`` largest entries, ties to the smaller column, seen columns skipped."""
    for t in prange(S.shape[0]):
        row = S[t]
        u = rows[t]
        if u >= 0 and u + 1 < seen_indptr.shape[0]:
            for s in range(seen_indptr[u], seen_indptr[u + 1]):
                c = col_pos[seen_indices[s]]
                if c >= 0:
                    row[c] = -np.inf
        best_v = out_val[t]
        best_i = out_idx[t]
        best_v[:] = -np.inf
        best_i[:] = -1
        for j in range(row.shape[0]):
            v = row[j]
            if v > best_v[n - 1]:  # insertion into the sorted short list
                k = n - 1
                while k > 0 and best_v[k - 1] < v:
                    best_v[k] = best_v[k - 1]
                    best_i[k] = best_i[k - 1]
                    k -= 1
                best_v[k] = v
                best_i[k] = j


def score_block(model, users):
    """Dense scores ``b_u + b_i + U[users] . V`` of every item (without offset and link).

    The caller bounds the block's size (``len(users) x n_items`` float64).
    """
    V = np.asarray(model.item_factors, dtype=np.float64)
    S = np.asarray(model.user_factors[users], dtype=np.float64) @ V.T
    if model.item_bias is not None:
        S += model.item_bias
    if model.user_bias is not None:
        S += model.user_bias[users][:, None]
    return S


def top_n(model, users, n, *, seen=None, candidates=None, budget=BATCH_BYTES):
    """Each user's ``n`` best-scored items, in batches of bounded memory.

    Parameters
    ----------
    model : FactorModel
    users : ndarray of int of shape (n_users,)
        Rows of ``model.user_factors``.
    n : int
        Items per user, at least 1.
    seen : csr_matrix of shape (n_model_users, n_model_items), default=None
        Entries never recommended (row = user row of the model, column = item row).
    candidates : ndarray of int, default=None
        Item rows to rank (every item when None).
    budget : int
        Bytes of the dense score block of one batch (the only scratch that grows with the
        number of items).

    Returns
    -------
    index : ndarray of shape (n_users, n), int64
        Position in ``candidates`` (the item row when None), best first, ties to the smaller
        position; -1 where a user has fewer than ``n`` unseen candidates.
    scores : ndarray of shape (n_users, n), float64
        The predicted ratings (``-inf`` at the -1 positions).
    """
    n_items = model.item_factors.shape[0]
    cand = np.arange(n_items) if candidates is None else np.asarray(candidates, dtype=np.int64)
    col_pos = np.full(n_items, -1, dtype=np.int64)
    col_pos[cand] = np.arange(cand.shape[0])
    if seen is None:  # (int32 as a CSR's: one compiled signature)
        indptr, indices = np.zeros(1, dtype=np.int32), np.zeros(0, dtype=np.int32)
    else:
        indptr, indices = seen.indptr, seen.indices
    ranked = model if candidates is None else model._replace(
        item_factors=model.item_factors[cand],
        item_bias=None if model.item_bias is None else model.item_bias[cand])
    users = np.asarray(users, dtype=np.int64)
    out_idx = np.empty((users.shape[0], n), dtype=np.int64)
    out_val = np.empty((users.shape[0], n))
    batch = max(1, budget // (8 * max(1, cand.shape[0])))
    for start in range(0, users.shape[0], batch):
        rows = users[start : start + batch]
        S = score_block(ranked, rows)
        _select_top(S, rows, indptr, indices, col_pos, n, out_idx[start : start + batch],
                    out_val[start : start + batch])
        del S  # (else the next batch's block is allocated while this one is alive)
    # scores to ratings (the link is increasing, so it keeps the ranking)
    found = out_idx >= 0
    out_val[found] += model.offset
    if model.link is not None:
        out_val[found] = model.link(out_val[found])
    return out_idx, out_val
