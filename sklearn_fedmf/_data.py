"""Data contract: rating matrices, client partitions and per-client blocks.

A rating matrix has users as rows and items as columns. In a scipy.sparse matrix every
*stored* entry is an observation (an explicit zero included); in a dense array NaN marks
a missing entry. Everything downstream works on canonical CSR float64 matrices.
"""

from __future__ import annotations

import numbers
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from joblib import effective_n_jobs
from sklearn.utils import check_array

__all__ = [
    "ClientBlock",
    "check_ratings",
    "reject_duplicates",
    "check_like",
    "resolve_clients",
    "split_clients",
]


def check_ratings(X, *, name="X", dtype=np.float64):
    """Return ``X`` as a canonical CSR matrix whose stored entries are the observations.

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_rows, n_items)
        Sparse: every stored entry is observed. Dense: NaN marks a missing entry.
    name : str
        Name used in error messages.
    dtype : numpy dtype
        Floating dtype of the result.

    Returns
    -------
    X_csr : scipy.sparse.csr_matrix
        Sorted indices, no duplicates, explicit zeros kept.
    """
    if sp.issparse(X):
        if X.ndim != 2:
            raise ValueError(f"{name} must be 2-dimensional, got {X.ndim} dimensions.")
        reject_duplicates(X, name)
        X = sp.csr_matrix(X, dtype=dtype, copy=True)
        X.sort_indices()
    else:
        if hasattr(X, "to_numpy"):
            X = X.to_numpy(dtype=dtype, na_value=np.nan)
        try:
            X = np.asarray(X, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"{name} must contain numbers (NaN marks a missing entry): {exc}"
            ) from exc
        if X.ndim != 2:
            raise ValueError(
                f"{name} must be a 2-dimensional rating matrix (users x items), got an array "
                f"with {X.ndim} dimension(s) and shape {X.shape}."
            )
        if np.isinf(X).any():
            raise ValueError(f"{name} contains infinite values.")
        observed = ~np.isnan(X)
        X = sp.csr_matrix((X[observed], np.nonzero(observed)), shape=X.shape, dtype=dtype)
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"{name} must have at least one row and one column, got shape {X.shape}.")
    if not np.isfinite(X.data).all():
        raise ValueError(
            f"{name} stores NaN or infinite values; in a sparse matrix every stored entry is an "
            "observation, so drop missing entries instead of storing NaN."
        )
    return X


def reject_duplicates(X, name="X"):
    """Raise if a sparse ``X`` stores the same (row, column) twice.

    scipy sums duplicates when converting formats; a rating observed twice is ambiguous, so
    this runs on the caller's matrix before any conversion.
    """
    if not sp.issparse(X) or getattr(X, "has_canonical_format", False):
        return
    coo = X.tocoo()
    keys = coo.row.astype(np.int64) * X.shape[1] + coo.col
    if np.unique(keys).size != keys.size:
        raise ValueError(
            f"{name} has duplicate entries (the same row and column stored twice); aggregate "
            "them before fitting."
        )


def check_like(Y, X, *, name="y"):
    """Validate a held-out rating matrix: the shape of ``X``, at least one observed rating."""
    Y = check_ratings(Y, name=name, dtype=X.dtype)
    if Y.shape != X.shape:
        raise ValueError(
            f"{name} must have the same shape as X {X.shape} (held-out ratings of the same rows), "
            f"got {Y.shape}."
        )
    if Y.nnz == 0:  # scoring on nothing would give NaN (or, per round, a silently missing key)
        raise ValueError(
            f"{name} has no observed rating (every entry is missing), so there is nothing to "
            "evaluate" + ("; pass eval_set=None to fit without held-out ratings." if
                          name == "eval_set" else ".")
        )
    return Y


def resolve_clients(n_rows, clients, n_clients, partition, random_state):
    """Return ``(labels, codes, n_clients)`` for the rows of a matrix.

    ``labels`` is each row's client label, ``codes`` its integer code ``0 .. n_clients - 1``
    (in sorted label order). ``random_state`` is a numpy Generator (random partition only).
    """
    if clients is not None:
        labels = np.asarray(clients)
        if labels.ndim != 1 or labels.shape[0] != n_rows:
            raise ValueError(
                f"clients must hold one label per row of X: expected shape ({n_rows},), "
                f"got {labels.shape}."
            )
        if labels.dtype.kind == "f" and np.isnan(labels).any():
            raise ValueError("clients contains NaN labels.")
        uniques, codes = np.unique(labels, return_inverse=True)
        return labels, codes.astype(np.intp), len(uniques)
    if n_clients > n_rows:
        raise ValueError(
            f"n_clients={n_clients} is larger than the number of rows ({n_rows}): every client "
            "needs at least one row."
        )
    if partition == "contiguous":
        codes = np.repeat(np.arange(n_clients), _block_sizes(n_rows, n_clients))
    else:
        perm = random_state.permutation(n_rows)
        codes = np.empty(n_rows, dtype=np.intp)
        codes[perm] = np.repeat(np.arange(n_clients), _block_sizes(n_rows, n_clients))
    codes = codes.astype(np.intp)
    return codes.copy(), codes, n_clients


def _block_sizes(n, k):
    base, extra = divmod(n, k)
    return np.array([base + 1] * extra + [base] * (k - extra))


class ClientBlock(NamedTuple):
    """One client's training data, built once per fit.

    Attributes
    ----------
    rows : ndarray of shape (m_i,)
        Global row indices owned by the client (ascending).
    X : csr_matrix of shape (m_i, n_items)
        The client's observed ratings.
    X_eval : csr_matrix or None
        Held-out ratings of the same rows (``eval_set``), never used for training.
    Xt : csr_matrix of shape (n_items, m_i)
        ``X`` transposed (items as rows), for kernels that sweep item columns.
    """

    rows: np.ndarray
    X: sp.csr_matrix
    X_eval: sp.csr_matrix | None
    Xt: sp.csr_matrix | None = None

    @property
    def row_of_entry(self):
        """Local row of each stored entry (the COO row array of ``X``), built on demand."""
        return np.repeat(np.arange(self.X.shape[0]), np.diff(self.X.indptr))

    @property
    def n_rows(self):
        return self.X.shape[0]

    @property
    def nnz(self):
        return int(self.X.indptr[-1])  # canonical CSR; scipy's nnz property costs 10x more


PARALLEL_SPLIT_NNZ = 10_000_000  # below, threads cost more than they save (ML-1M: +14 ms)


def split_clients(X, codes, n_clients, X_eval=None, n_jobs=None):
    """Cut ``X`` (and ``X_eval``) into per-client CSR blocks, raising on empty clients.

    With ``n_jobs`` > 1 the blocks of a large ``X`` are cut on threads (scipy's sparse kernels
    release the GIL; 1.5x on the Netflix shape); they are the same blocks, in client order.
    """
    counts = np.bincount(codes, minlength=n_clients)
    if (counts == 0).any():
        empty = np.flatnonzero(counts == 0)[:5].tolist()
        raise ValueError(f"Clients {empty} own no rows; every client needs at least one row.")
    order = np.argsort(codes, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(counts)])

    def block(c):
        rows = order[bounds[c] : bounds[c + 1]]
        Xi = X[rows]
        Xi.has_canonical_format = True
        Ei = X_eval[rows] if X_eval is not None else None
        Xt = Xi.T.tocsr()
        Xt.sort_indices()
        return ClientBlock(rows, Xi, Ei, Xt)

    workers = min(effective_n_jobs(n_jobs), n_clients) if X.nnz >= PARALLEL_SPLIT_NNZ else 1
    if workers <= 1:
        return [block(c) for c in range(n_clients)]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(block, range(n_clients)))


def check_factors(X, n_components, owner):
    """Validate user factors given to ``inverse_transform``: 2-D, finite, one column per
    component of the fitted ``owner`` (named in the error)."""
    X = check_array(X, dtype=[np.float64, np.float32], input_name="X")
    if X.shape[1] != n_components:
        raise ValueError(
            f"X has {X.shape[1]} columns, but {owner} has {n_components} components: "
            "inverse_transform takes user factors of shape (n_samples, n_components), such as "
            "the output of transform."
        )
    return X


def check_int(value, name, low=1):
    """``value`` as an int; a clear error unless it is an integer >= ``low`` (bool excluded).

    The package's one integer check for plain functions (the estimators validate their
    parameters through ``_parameter_constraints``).
    """
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
    return int(value)
