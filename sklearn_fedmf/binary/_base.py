"""The scikit-learn contract shared by the federated Boolean factorizations.

Unlike ratings, every entry of a binary matrix is observed (absent = 0). Rows are partitioned
over clients exactly as in :class:`~sklearn_fedmf.completion._base.FederatedMFBase`;
``components_`` is the Boolean ``k x m`` factor, ``transform`` gives Boolean row factors by
fold-in (U-only Elb steps against the fixed ``components_``), ``predict`` the Boolean
reconstruction and ``score`` its F1 against the input.
"""

from __future__ import annotations

from abc import abstractmethod
from numbers import Integral, Real

import numpy as np
from sklearn.base import _fit_context
from sklearn.preprocessing import binarize
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _num_samples, check_is_fitted, validate_data

from .._docstrings import Substitution
from .._threads import one_thread
from ..engine._client_data import check_dense_size
from ..engine._fit import FactorTransformerMixin, FederatedEstimator
from ..metrics._binary import check_binary, f1_boolean
from ..privacy._local_dp import LocalDPMixin
from ._elb import PROX_MODES, local_steps

__all__ = ["BooleanFactorizationBase", "check_binary_data", "elb_solver_params", "fold_in",
           "single_threaded_blas"]

# The constraints of the Elb steps' constants, keys of Felb's and AggregatedBMF's
# ``solver_params`` (each class declares its own defaults: the paper's, Felb's or Elbmf's)
ELB_CONSTRAINTS = {
    "kappa": [Interval(Real, 0, None, closed="left")],
    "lam": [Interval(Real, 0, None, closed="left")],
    "growth": [Interval(Real, 1, None, closed="left")],
    "lam_max": [Interval(Real, 0, None, closed="neither")],
    "inertia": [Interval(Real, 0, 1, closed="left")],
    "update": [StrOptions({"palm", "mu"})],
    "prox_mode": [StrOptions(set(PROX_MODES))],
}


def elb_solver_params(**defaults):
    """``_solver_params`` declarations ``{key: (default, constraints)}`` of the Elb constants
    given as ``key=default``."""
    return {key: (default, ELB_CONSTRAINTS[key]) for key, default in defaults.items()}


def single_threaded_blas():
    """One BLAS thread while the clients run: their products are small (k x k by k x m) and
    the parallelism is across clients; a multi-threaded BLAS on such shapes is up to 40x
    slower on a busy machine (as ``KMeans`` does for its Lloyd iterations)."""
    return one_thread("blas")


def fold_in(A, V, *, n_steps, **schedule):
    """Boolean row factors of the binary CSR ``A`` with the Boolean ``V`` fixed.

    ``U`` starts at the share of each component's columns that the row contains (a
    deterministic, row-wise start, so each row is solved independently of the others) and
    takes ``n_steps`` U-only Elb steps on the training schedule; the result is rounded at 1/2.
    """
    V = np.asarray(V, dtype=np.float64)
    sizes = np.maximum(V.sum(axis=1), 1.0)
    U = np.asarray(A @ V.T) / sizes
    U, _, _, _ = local_steps(U, U, V, V, A, None, None, t0=0, n_steps=n_steps,
                             update_v=False, gamma=0.0, proximity="sequential", **schedule)
    return U > 0.5


# The ``X`` and ``y`` entries of a Boolean factorization's ``fit`` (``%(fit_data)s``).
FIT_DATA = Substitution(fit_data="""\
X : {array-like, sparse matrix} of shape (n_samples, n_features)
    Binary data (0/1); in a sparse matrix absent entries are 0.
y : Ignored
    Not used, present for API consistency by convention.""")

def check_binary_data(estimator, X, *, reset):
    """``X`` as the Boolean ``estimator`` fits or reads it (``binarize`` applied; a Flower
    site's block too): binary, sparse accepted."""
    X = validate_data(estimator, X, accept_sparse=True, dtype=[np.float64, np.float32],
                      reset=reset)
    if estimator.binarize is not None:  # as in BernoulliNB: x -> 1[x > threshold]
        X = binarize(X, threshold=estimator.binarize)
    return check_binary(X)


class BooleanTransformerMixin:
    """What every Boolean factorization shares, federated or not: binary input (``binarize``
    maps it first), sparse input accepted, ``components_`` rows as output features and
    Boolean factors whatever the input dtype."""

    def _check_binary(self, X, reset):
        return check_binary_data(self, X, reset=reset)

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.required = False
        tags.transformer_tags.preserves_dtype = []  # Boolean factors, whatever the input dtype
        return tags


class BooleanFactorizationBase(
    BooleanTransformerMixin, LocalDPMixin, FactorTransformerMixin, FederatedEstimator,
):
    """Base class of the federated Boolean factorizations (not for direct use).

    Every Boolean factorization uploads item factors and takes ``privacy`` (a
    :class:`~sklearn_fedmf.privacy.LocalDP`, declared by :class:`LocalDPMixin`).
    """

    _parameter_constraints: dict = {
        **FederatedEstimator._parameter_constraints,
        **LocalDPMixin._parameter_constraints,
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "binarize": [Real, None],
    }

    def __init__(self, n_components, *, binarize, n_clients, callback, random_state, n_jobs,
                 verbose, secure_aggregation=False):
        super().__init__(n_clients=n_clients, callback=callback, random_state=random_state,
                         n_jobs=n_jobs, verbose=verbose, secure_aggregation=secure_aggregation)
        self.n_components = n_components
        self.binarize = binarize

    @abstractmethod
    def _fold_in_params(self):
        """``n_steps`` and the step/schedule keywords of :func:`fold_in`."""

    @FIT_DATA
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, *, clients=None):
        """Run the federation on the binary matrix ``X``.

        Parameters
        ----------
        %(fit_data)s
        clients : array-like of shape (n_samples,), default=None
            Client label of each row; when None rows are split into ``n_clients`` clients.

        Returns
        -------
        self : object
            The fitted estimator.
        """
        return self._fit(X, clients)

    def _check_fit_data(self, X, *, reset, settings):
        X = self._check_binary(X, reset=reset)
        if self.n_components > X.shape[1]:
            raise ValueError(
                f"n_components={self.n_components} is larger than the number of columns "
                f"({X.shape[1]})."
            )
        return X, {"privacy": self._privacy_settings(X.shape[1])}

    def _stack_rows(self, blocks, parts, width, dtype):
        out = np.zeros((sum(b.n_rows for b in blocks), width), dtype=dtype)
        for block, part in zip(blocks, parts):
            out[block.rows] = part
        return out

    def _degenerate(self, state, blocks, ctx, history):
        U, V = self.user_factors_, self.components_
        if not (U.any(axis=0) & V.any(axis=1)).any():
            return ("the Boolean reconstruction is all zero (no component is used by both "
                    "factors), so every entry is predicted 0")
        return None

    def transform(self, X):
        """Boolean row factors of new rows with ``components_`` fixed (fold-in).

        Each row is solved on its own (what a new client computes locally): U-only Elb
        proximal steps against the Boolean ``components_`` on the training regularization
        schedule, rounded at 1/2.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Binary rows (0/1; in a sparse matrix absent entries are 0).

        Returns
        -------
        U : ndarray of bool, shape (n_samples, n_components)
            The rows' Boolean factors.
        """
        check_is_fitted(self)
        A = self._check_binary(X, reset=False)
        with single_threaded_blas():
            return fold_in(A, self.components_, **self._fold_in_params())

    def inverse_transform(self, X):
        """Boolean product ``U o components_`` (``min(1, U V)``), a dense bool array.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_components)
            Row factors ``U`` (entries above 1/2 count as 1), e.g. from :meth:`transform`.

        Returns
        -------
        X_hat : ndarray of bool, shape (n_samples, n_features)
            The Boolean reconstruction; refused above ``MAX_DENSE_ENTRIES`` entries
            (see :meth:`predict`).
        """
        U = self._check_factors(X).astype(np.float64) > 0.5
        _check_dense(self, U.shape[0], "inverse_transform(X)")
        return (U.astype(np.float64) @ self.components_.astype(np.float64)) > 0

    def predict(self, X):
        """Boolean reconstruction of the rows of ``X``: ``transform(X) o components_``.

        Returns a dense bool array of shape (n_samples, n_features); above
        ``sklearn_fedmf.engine._client_data.MAX_DENSE_ENTRIES`` (50 million) entries it raises
        before any work: use :meth:`transform` and the factors for large inputs
        (:mod:`sklearn_fedmf.metrics` scores them without densifying).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Binary rows, folded in (see :meth:`transform`).

        Returns
        -------
        X_hat : ndarray of bool, shape (n_samples, n_features)
            The Boolean reconstruction of the rows.
        """
        check_is_fitted(self)
        _check_dense(self, _num_samples(X), "predict(X)")
        return self.inverse_transform(self.transform(X))

    def score(self, X, y=None):
        """F1 of the Boolean reconstruction of ``X`` against ``X`` itself (greater is better).

        ``2 |X and Xhat| / (|X| + |Xhat|)`` with ``Xhat = transform(X) o components_``,
        computed from the factors without densifying (1.0 when both are empty).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Binary rows, folded in and reconstructed.
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        score : float
            F1 in [0, 1].
        """
        check_is_fitted(self)
        A = self._check_binary(X, reset=False)
        with single_threaded_blas():
            U = fold_in(A, self.components_, **self._fold_in_params())
        return f1_boolean(A, (U, self.components_))


def _check_dense(estimator, n_rows, what):
    check_dense_size(n_rows, estimator.components_.shape[1], what,
                     hint="Use transform(X) and components_ instead: the factors are the "
                          "compact result (sklearn_fedmf.metrics scores them without "
                          "densifying).")
