"""Scores of Boolean reconstructions, computed without densifying (the F1 and RMSD
of the Felb paper, Section 4 and Appendix E.1).

A reconstruction is given either as a matrix (dense or sparse, 0/1) or as Boolean factors
``(U, V)``, meaning ``U o V = min(1, U V)`` (the OR of ANDs). With factors, the true positives
are counted at the stored ones of the data only, and ``|U o V|`` is counted per distinct row
pattern of ``U`` and column pattern of ``V``, so no ``n x m`` matrix is formed.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from numba import njit

from .._docstrings import Substitution

__all__ = [
    "boolean_counts",
    "check_binary",
    "f1_boolean",
    "integrality_gap",
    "rmsd",
    "rmsd_sum_clients",
]

_CHUNK = 1 << 16  # entries (or patterns) per chunk: bounds the temporary memory


# the data and the reconstruction the Boolean metrics compare, described once
_INPUTS = Substitution(inputs=(
    "X : {array-like, sparse matrix} of shape (n, m)\n"
    "    The binary data (every entry 0 or 1; absent entries of a sparse matrix are 0).\n"
    "pred : {array-like, sparse matrix} of shape (n, m), or tuple (U, V)\n"
    "    A 0/1 reconstruction, or Boolean factors (entries > 1/2 count as 1) whose Boolean\n"
    "    product ``min(1, U V)`` is the reconstruction (counted without forming it)."))


def check_binary(X, name="X"):
    """Return ``X`` as a CSR float64 matrix that stores exactly its ones.

    Dense and sparse inputs are accepted; every entry (stored entry, for sparse) must be 0 or
    1, NaN included in the rejects: in a binary matrix every entry is observed, absent = 0.
    """
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64, copy=True)
        X.sum_duplicates()
        values = X.data
    else:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"{name} must be 2-dimensional, got shape {X.shape}.")
        values = X.ravel()
    bad = (values != 0) & (values != 1)
    if bad.any():
        example = values[bad][0]
        raise ValueError(
            f"{name} must be binary (every entry 0 or 1; absent entries of a sparse matrix are 0), "
            f"found the value {example!r}."
        )
    X = sp.csr_matrix(X)
    X.eliminate_zeros()
    X.sort_indices()
    return X


def _factors(pred):
    U, V = (np.asarray(F) for F in pred)
    U = U if U.dtype == bool else U > 0.5
    V = V if V.dtype == bool else V > 0.5
    if U.ndim != 2 or V.ndim != 2 or U.shape[1] != V.shape[0]:
        raise ValueError(f"Factors of incompatible shapes {U.shape} and {V.shape}.")
    return U, V


def _predicted_ones(U, V):
    """``|U o V|`` grouped by the distinct Boolean rows of ``U`` and columns of ``V``.

    A row of pattern ``p`` misses exactly the columns whose pattern ``c`` has ``c & p == 0``.
    With ``P`` row and ``C`` column patterns that is ``P C`` bit tests, or, for large ``P C``
    (a fitted model of many users), one subset-sum table over the ``2^k`` patterns: ``k 2^k``
    additions however many patterns there are.
    """
    k, m = V.shape
    if U.shape[0] == 0:
        return 0
    if k > _MAX_CODE_BITS:  # patterns as bytes, their products chunk by chunk
        patterns, counts = np.unique(np.packbits(U, axis=1), axis=0, return_counts=True)
        P = np.unpackbits(patterns, axis=1, count=k).astype(np.float64)
        Vf = V.astype(np.float64)
        total = 0
        step = max(1, _CHUNK // max(m, 1))
        for a in range(0, len(P), step):
            covered = np.count_nonzero(P[a : a + step] @ Vf > 0, axis=1)
            total += int(covered @ counts[a : a + step])
        return total
    bits = np.uint64(1) << np.arange(k, dtype=np.uint64)
    rows, row_counts = np.unique(U.astype(np.uint64) @ bits, return_counts=True)
    cols, col_counts = np.unique(bits @ V.astype(np.uint64), return_counts=True)
    if k <= _MAX_TABLE_BITS and len(rows) * len(cols) > _table_cost(k):
        missed = _subset_sums(cols, col_counts, k)[~rows & np.uint64((1 << k) - 1)]
    else:
        missed = _disjoint_counts(rows, cols, col_counts)
    return int(row_counts @ (m - missed))


_MAX_CODE_BITS = 63  # a pattern of k <= 63 bits is one uint64
_MAX_TABLE_BITS = 22  # the subset-sum table holds 2^k int64 (32 MB at k = 22)


def _table_cost(k):
    """Operations of the subset-sum table, against ``P C`` for the pairs of patterns."""
    return (k + 1) << k


@njit(cache=True, nogil=True)
def _disjoint_counts(rows, cols, col_counts):
    """Per row pattern, the columns (``col_counts`` per pattern) that share no bit with it."""
    out = np.zeros(rows.shape[0], np.int64)
    for i in range(rows.shape[0]):
        for j in range(cols.shape[0]):
            if rows[i] & cols[j] == 0:
                out[i] += col_counts[j]
    return out


@njit(cache=True, nogil=True)
def _subset_sums(cols, col_counts, k):
    """``f[mask]``: the columns whose pattern is a subset of ``mask`` (sum over subsets)."""
    f = np.zeros(1 << k, np.int64)
    for j in range(cols.shape[0]):
        f[cols[j]] += col_counts[j]
    for b in range(k):
        bit = 1 << b
        for mask in range(1 << k):
            if mask & bit:
                f[mask] += f[mask ^ bit]
    return f


def factor_counts(X, U, V):
    """:func:`boolean_counts` of Boolean factors ``U``, ``V`` against a binary CSR ``X`` that
    :func:`check_binary` already returned (the federated fits call it every round)."""
    U, V = _factors((U, V))
    # each row of U and column of V as bytes of bits: a stored one is a true positive iff
    # its row's and column's bytes share a bit
    tp = _shared_bit_count(X.indptr, X.indices, np.packbits(U, axis=1),
                           np.packbits(V.T, axis=1))
    return int(tp), X.nnz, _predicted_ones(U, V)


@njit(cache=True, nogil=True)
def _shared_bit_count(indptr, indices, row_bits, col_bits):
    """Stored entries ``(i, j)`` whose packed bits ``row_bits[i]`` and ``col_bits[j]`` meet."""
    count = 0
    for i in range(indptr.shape[0] - 1):
        for p in range(indptr[i], indptr[i + 1]):
            j = indices[p]
            for w in range(row_bits.shape[1]):
                if row_bits[i, w] & col_bits[j, w]:
                    count += 1
                    break
    return count


@_INPUTS
def boolean_counts(X, pred):
    """``(tp, n_true, n_pred)``: ones in common, ones in ``X``, ones in the reconstruction.

    Parameters
    ----------
    %(inputs)s

    Returns
    -------
    tp, n_true, n_pred : int
        Ones in common, ones in ``X`` and ones in the reconstruction.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.metrics import boolean_counts
    >>> X = np.array([[1, 1, 0], [0, 1, 1]])
    >>> boolean_counts(X, (np.array([[1], [1]]), np.array([[1, 1, 0]])))
    (3, 4, 4)
    """
    X = check_binary(X)
    if isinstance(pred, tuple):
        U, V = _factors(pred)
        if (U.shape[0], V.shape[1]) != X.shape:
            raise ValueError(f"The factors reconstruct {(U.shape[0], V.shape[1])}, X is {X.shape}.")
        return factor_counts(X, U, V)
    P = check_binary(pred, name="the reconstruction")
    if P.shape != X.shape:
        raise ValueError(f"The reconstruction has shape {P.shape}, X has {X.shape}.")
    return int(X.multiply(P).sum()), X.nnz, P.nnz


@_INPUTS
def f1_boolean(X, pred):
    """F1 of a Boolean reconstruction: ``2 |X and Xhat| / (|X| + |Xhat|)`` (1.0 if both empty).

    Parameters
    ----------
    %(inputs)s

    Returns
    -------
    f1 : float
        In [0, 1], greater is better.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.metrics import f1_boolean
    >>> X = np.array([[1, 1, 0], [0, 1, 1]])
    >>> U, V = np.array([[1], [1]]), np.array([[1, 1, 0]])
    >>> f1_boolean(X, (U, V))  # reconstruction [[1,1,0],[1,1,0]]: tp = 3
    0.75
    """
    tp, n_true, n_pred = boolean_counts(X, pred)
    return 1.0 if n_true + n_pred == 0 else 2.0 * tp / (n_true + n_pred)


@_INPUTS
def rmsd(X, pred):
    """Root mean squared deviation ``sqrt(Hamming(X, Xhat) / (n m))`` of a 0/1 reconstruction.

    Parameters
    ----------
    %(inputs)s

    Returns
    -------
    rmsd : float
        In [0, 1], smaller is better.

    Examples
    --------
    >>> from sklearn_fedmf.metrics import rmsd
    >>> rmsd([[1, 0], [0, 0]], [[0, 0], [0, 0]])  # sqrt(density) for an empty reconstruction
    0.5
    """
    X = check_binary(X)
    tp, n_true, n_pred = boolean_counts(X, pred)
    n, m = X.shape
    return float(np.sqrt((n_true + n_pred - 2 * tp) / (n * m)))


@_INPUTS
def rmsd_sum_clients(X, pred, clients):
    """Sum over clients of the per-client RMSD: the scale of the Felb paper's Table 3.

    About ``C * rmsd`` for equal-sized clients (``C * sqrt(density)`` for an empty
    reconstruction).

    Parameters
    ----------
    %(inputs)s
    clients : array-like of shape (n,)
        The client label of each row.

    Returns
    -------
    total : float
        The sum of :func:`rmsd` over the clients' rows.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.metrics import rmsd_sum_clients
    >>> X = np.array([[1, 0], [0, 0], [1, 1], [0, 0]])
    >>> rmsd_sum_clients(X, np.zeros((4, 2)), clients=[0, 0, 1, 1])  # sqrt(1/4) + sqrt(2/4)
    1.2071067811865475
    """
    X = check_binary(X)
    clients = np.asarray(clients)
    if clients.shape != (X.shape[0],):
        raise ValueError(f"clients must hold one label per row ({X.shape[0]}).")
    total = 0.0
    for label in np.unique(clients):
        rows = np.flatnonzero(clients == label)
        if isinstance(pred, tuple):
            part = (np.asarray(pred[0])[rows], pred[1])
        else:
            part = pred[rows] if sp.issparse(pred) else np.asarray(pred)[rows]
        total += rmsd(X[rows], part)
    return total


def integrality_gap(X, reduce="mean"):
    """Distance of relaxed values to {0, 1}: ``min(|x|, |1 - x|)``, averaged or maximized.

    Parameters
    ----------
    X : array-like
        Relaxed factor values, e.g. a Felb factor before rounding.
    reduce : {"mean", "max"}, default="mean"
        Average the distances or take the largest.

    Returns
    -------
    gap : float
        0 when every value is 0 or 1 (0 as well for an empty ``X``).

    Examples
    --------
    >>> from sklearn_fedmf.metrics import integrality_gap
    >>> integrality_gap([[0.0, 0.25], [0.9, 1.0]]), integrality_gap([[0.0, 0.25]], "max")
    (0.0875, 0.25)
    """
    X = np.asarray(X, dtype=float)
    if X.size == 0:
        return 0.0
    gap = np.minimum(np.abs(X), np.abs(1.0 - X))
    if reduce == "mean":
        return float(gap.mean())
    if reduce == "max":
        return float(gap.max())
    raise ValueError(f"reduce must be 'mean' or 'max', got {reduce!r}.")
