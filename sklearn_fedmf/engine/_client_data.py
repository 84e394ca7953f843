"""Data contract: rating matrices, client partitions and per-client blocks.

A rating matrix has users as rows and items as columns. In a scipy.sparse matrix every
*stored* entry is an observation (an explicit zero included); in a dense array NaN (or the
estimator's ``missing_values``) marks a missing entry. Everything downstream works on canonical
CSR float64 matrices.
"""

from __future__ import annotations

import numbers
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ..exceptions import DataWarning

__all__ = [
    "ClientBlock",
    "factorize_ids",
    "check_ratings",
    "reject_duplicates",
    "check_like",
    "warn_if_zero_filled",
    "resolve_clients",
    "split_clients",
    "center_and_scale",
    "MAX_DENSE_ENTRIES",
    "check_dense_size",
]


def check_ratings(X, *, name="X", dtype=np.float64, missing_values=np.nan):
    """Return ``X`` as a canonical CSR matrix whose stored entries are the observations.

    The caller's ``X`` is never modified (the result is always a new matrix), and read-only
    input is accepted.

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_rows, n_items)
        Sparse: every stored entry is observed (an explicit zero included), whatever
        ``missing_values`` is. Dense: entries equal to ``missing_values`` are missing.
    name : str
        Name used in error messages.
    dtype : numpy dtype
        Floating dtype of the result.
    missing_values : float, default=np.nan
        The placeholder of a missing entry in dense input, as in
        :class:`~sklearn.impute.SimpleImputer` (``0`` for a matrix where 0 means "not rated").

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
        if np.isnan(missing_values):
            observed = ~np.isnan(X)
        elif np.isnan(X).any():
            raise ValueError(
                f"{name} contains NaN while missing_values={missing_values!r} marks the missing "
                "entries; use one placeholder (missing_values=np.nan for NaN)."
            )
        else:
            observed = X != missing_values
        X = sp.csr_matrix((X[observed], np.nonzero(observed)), shape=X.shape, dtype=dtype)
    if X.shape[0] < 1 or X.shape[1] < 1:
        raise ValueError(f"{name} must have at least one row and one column, got shape {X.shape}.")
    if not np.isfinite(X.data).all():
        raise ValueError(
            f"{name} stores NaN or infinite values; in a sparse matrix every stored entry is an "
            "observation, so drop missing entries instead of storing NaN."
        )
    return X


ZERO_FILLED_SHARE = 0.5  # above this share of zeros, a dense integer X is probably 0-filled


def warn_if_zero_filled(X, missing_values, name="X"):
    """Warn (``DataWarning``) when dense integer ``X`` is mostly 0 while NaN marks a missing
    entry: every 0 would then be fitted as a rating of 0, where 0 usually means "not rated".
    """
    if sp.issparse(X) or not np.isnan(missing_values):
        return
    dtype = getattr(X, "dtype", None)
    if not isinstance(dtype, np.dtype):  # lists, DataFrames: their array's dtype
        dtype = np.asarray(X).dtype
    if dtype.kind not in "iu":
        return
    values = np.asarray(X)
    share = np.count_nonzero(values == 0) / max(values.size, 1)
    if share > ZERO_FILLED_SHARE:
        warnings.warn(
            f"{name} is a dense integer matrix and {share:.0%} of its entries are 0; with "
            "missing_values=np.nan every 0 is fitted as a rating of 0. If 0 means 'not "
            "rated', pass solver_params={'missing_values': 0} (or a sparse matrix of the "
            "observed ratings).",
            DataWarning,
            stacklevel=6,  # the caller of fit (through _fit_context, fit, _fit, _check_fit_data)
        )


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


def check_like(Y, X, *, name="y", missing_values=np.nan):
    """Validate a held-out rating matrix that must have the shape of ``X``."""
    Y = check_ratings(Y, name=name, dtype=X.dtype, missing_values=missing_values)
    if Y.shape != X.shape:
        raise ValueError(
            f"{name} must have the same shape as X {X.shape} (held-out ratings of the same rows), "
            f"got {Y.shape}."
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


def center_and_scale(offset, scale, *matrices):
    """Put ratings on a fit's scale, in place: ``(r - offset) / scale`` on every stored entry
    of each CSR matrix given (None skipped).

    The one place a fit centres and scales its clients' ratings (the simulation's training,
    validation and held-out ratings, and a Flower site's block), so both see the same values.
    Only for matrices made by ``check_ratings`` (a fresh copy).
    """
    for X in matrices:
        if X is None:
            continue
        if offset:
            X.data -= offset
        if scale != 1.0:
            X.data /= scale


def split_clients(X, codes, n_clients, X_eval=None, workers=1):
    """Cut ``X`` (and ``X_eval``) into per-client CSR blocks, raising on empty clients.

    With ``workers`` > 1 (a fit's :attr:`~sklearn_fedmf.engine._fit.FitContext.workers`) the blocks
    of a large ``X`` are cut on threads (scipy's sparse kernels release the GIL; 1.5x on the
    Netflix shape); they are the same blocks, in client order.
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

    workers = min(workers, n_clients) if X.nnz >= PARALLEL_SPLIT_NNZ else 1
    if workers <= 1:
        return [block(c) for c in range(n_clients)]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(block, range(n_clients)))


def check_int(value, name, low=1):
    """``value`` as an int; a clear error unless it is an integer >= ``low`` (bool excluded).

    The package's one integer check for plain functions (the estimators validate their
    parameters through ``_parameter_constraints``).
    """
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
    return int(value)


# Above this many entries, a dense users x items result is refused (400 MB in float64).
MAX_DENSE_ENTRIES = 50_000_000


_PAIR_API = ("Predict where you need it: predict(X, at=pattern) with a sparse pattern of the "
             "same shape, or sklearn_fedmf.RatingRegressor for (user, item) pairs (predict) "
             "and top-N lists (recommend).")


def check_dense_size(n_rows, n_items, what, hint=_PAIR_API):
    """Raise, before anything is allocated, if a dense ``n_rows x n_items`` result is large."""
    if n_rows * n_items > MAX_DENSE_ENTRIES:
        raise ValueError(
            f"{what} would build a dense {n_rows} x {n_items} matrix "
            f"({n_rows * n_items * 8 / 1e9:.1f} GB), above MAX_DENSE_ENTRIES = "
            f"{MAX_DENSE_ENTRIES:_} entries. {hint}"
        )


def factorize_ids(values):
    """``(unique ids, code of each value)``: sorted when the ids compare, else in order of
    first appearance (mixed types)."""
    try:
        uniques, codes = np.unique(values, return_inverse=True)
    except TypeError:
        import pandas as pd  # (only for ids of mixed types)

        codes, uniques = pd.factorize(values)
        uniques = np.asarray(uniques, dtype=object)
    return uniques, codes.reshape(-1).astype(np.int64)
