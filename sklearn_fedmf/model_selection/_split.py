"""Hold-out splits of the observed entries of a rating matrix."""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp

from ..datasets._synthetic import _check_generator
from ..engine._client_data import check_int, check_ratings

__all__ = ["train_test_split_ratings"]


def train_test_split_ratings(X, test_size=0.2, *, random_state=None, min_train_per_row=1):
    """Split the observed entries of each row into training and held-out ratings.

    Every row (user, hence every client) keeps about ``1 - test_size`` of its observed
    entries for training and holds out the rest: the papers' 80/20 protocol. A row with
    ``n`` entries holds out ``floor(test_size * n + u)`` of them, ``u ~ Uniform(0, 1)``
    (unbiased rounding, so the overall fraction is close to ``test_size`` even for short
    rows), chosen at random, but never so many that fewer than ``min_train_per_row``
    remain; a row with at most ``min_train_per_row`` entries stays entirely in training.

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_rows, n_items)
        Ratings: every stored entry of a sparse matrix is observed (explicit zeros
        included); NaN marks a missing entry of a dense array.
    test_size : float in (0, 1), default=0.2
        Fraction of each row's observed entries to hold out.
    random_state : int, RandomState, Generator or None
        Seed; the split is deterministic for a fixed seed.
    min_train_per_row : int, default=1
        Minimum number of training entries left in a row that has more than that many.

    Returns
    -------
    X_train, X_test : scipy.sparse.csr_matrix of shape (n_rows, n_items), dtype float64
        Disjoint stored entries whose union is exactly the observed entries of ``X``.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.model_selection import train_test_split_ratings
    >>> X = np.array([[5, 3, np.nan, 1, 0], [np.nan, 4, 4, 2, 1]])
    >>> X_train, X_test = train_test_split_ratings(X, test_size=0.25, random_state=0)
    >>> X_train.nnz + X_test.nnz, X_test.getnnz(axis=1).tolist()
    (8, [1, 1])
    """
    if not isinstance(test_size, numbers.Real) or not 0 < test_size < 1:
        raise ValueError(f"test_size must be a float in (0, 1), got {test_size!r}.")
    min_train_per_row = check_int(min_train_per_row, "min_train_per_row", 0)
    X = check_ratings(X)
    rng = _check_generator(random_state)
    n_rows = X.shape[0]
    counts = np.diff(X.indptr)
    n_test = holdout_counts(counts, test_size, min_train_per_row, rng)
    row = np.repeat(np.arange(n_rows), counts)
    test = first_in_group(row, n_test, rng.random(X.nnz))
    return _select(X, ~test, row), _select(X, test, row)


def holdout_counts(counts, test_size, min_train, rng):
    """Held-out entries of groups of ``counts`` entries: ``floor(test_size * n + u)``,
    ``u ~ Uniform(0, 1)`` (unbiased rounding), leaving at least ``min_train`` in a group
    that has more than that many."""
    n_test = np.floor(test_size * counts + rng.random(len(counts))).astype(np.int64)
    return np.minimum(n_test, np.maximum(counts - min_train, 0))


def first_in_group(group, n_first, key):
    """Mask of the ``n_first[g]`` entries of each group ``g`` (codes ``0 .. len(n_first) - 1``,
    in any order) with the smallest ``key``."""
    order = np.lexsort((key, group))
    starts = np.concatenate([[0], np.cumsum(np.bincount(group, minlength=len(n_first)))])
    g = group[order]
    rank = np.arange(len(group)) - starts[g]
    out = np.empty(len(group), dtype=bool)
    out[order] = rank < n_first[g]
    return out


def _select(X, keep, row):
    indptr = np.zeros(X.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(row[keep], minlength=X.shape[0]), out=indptr[1:])
    out = sp.csr_matrix((X.data[keep], X.indices[keep], indptr), shape=X.shape)
    out.has_canonical_format = True
    return out
