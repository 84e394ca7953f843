"""Centralized cover-based Boolean factorizations: Asso, GreConD and MEBF (the Felb paper's
baselines; solvers in :mod:`._cover_solvers`)."""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from numbers import Integral, Real

import numpy as np
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from .._docstrings import Substitution, parameter_entries
from ..metrics._binary import f1_boolean
from ._base import FIT_DATA, BooleanTransformerMixin
from ._cover_solvers import asso, cover_fold_in, grecond, mebf

__all__ = ["Asso", "GreConD", "MEBF"]


# The last parameter and the attributes, the same in every cover factorization.
_COVER_DOCS = Substitution(binarize_and_attributes=parameter_entries("binarize") + """

Attributes
----------
components_ : ndarray of bool, shape (n_components, n_features)
user_factors_ : ndarray of bool, shape (n_samples, n_components)
n_components_found_ : int
    Non-empty components (the cover may stop before ``n_components``).
n_features_in_ : int""")

class _CoverBMF(BooleanTransformerMixin, ClassNamePrefixFeaturesOutMixin, TransformerMixin,
                BaseEstimator, metaclass=ABCMeta):
    """Shared contract: ``components_`` is the Boolean ``V``, ``transform`` the greedy usage
    of the components (:func:`cover_fold_in`), ``predict`` the Boolean reconstruction and
    ``score`` its F1 against the input."""

    _parameter_constraints: dict = {
        "n_components": [Interval(Integral, 1, None, closed="left")],
        "binarize": [Real, None],
    }
    _fold_in_loss = 1.0

    @abstractmethod
    def _solve(self, A):
        """Boolean ``(U, V)`` of the binary CSR ``A``."""

    @FIT_DATA
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Factorize the binary ``X``.

        Parameters
        ----------
        %(fit_data)s

        Returns
        -------
        self : object
        """
        A = self._check_binary(X, reset=True)
        if self.n_components > A.shape[1]:
            raise ValueError(f"n_components={self.n_components} is larger than the number of "
                             f"columns ({A.shape[1]}).")
        self.user_factors_, self.components_ = self._solve(A)
        self.n_components_found_ = int(self.components_.any(axis=1).sum())
        return self

    def fit_transform(self, X, y=None):
        """Fit and return the fitted usage ``user_factors_``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features), binary
            Training data.
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        U : ndarray of bool, shape (n_samples, n_components)
        """
        return self.fit(X, y).user_factors_

    def transform(self, X):
        """Boolean usage of the components for the rows of ``X``, greedily in component order:
        a row uses a component when it covers more new ones than (``loss``-weighted) zeros.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features), binary
            Rows to express with the fitted components.

        Returns
        -------
        U : ndarray of bool, shape (n_samples, n_components)
        """
        check_is_fitted(self)
        A = self._check_binary(X, reset=False)
        return cover_fold_in(A, self.components_, **self._fold_in_weights())

    def _fold_in_weights(self):
        return {"gain": 1.0, "loss": self._fold_in_loss}

    def inverse_transform(self, X):
        """Boolean product ``U o components_``, a dense bool array.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_components)
            Boolean usage (entries above 1/2 count as one).

        Returns
        -------
        X_hat : ndarray of bool, shape (n_samples, n_features)
        """
        check_is_fitted(self)
        U = np.asarray(X, dtype=np.float64) > 0.5
        return (U.astype(np.float64) @ self.components_.astype(np.float64)) > 0

    def predict(self, X):
        """Boolean reconstruction ``transform(X) o components_`` (dense bool).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features), binary
            Rows to reconstruct.

        Returns
        -------
        X_hat : ndarray of bool, shape (n_samples, n_features)
        """
        return self.inverse_transform(self.transform(X))

    def score(self, X, y=None):
        """F1 of the reconstruction of ``X`` against ``X`` (greater is better).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features), binary
            Rows to reconstruct and score.
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        score : float
        """
        check_is_fitted(self)
        A = self._check_binary(X, reset=False)
        return f1_boolean(A, (cover_fold_in(A, self.components_, **self._fold_in_weights()),
                              self.components_))


@_COVER_DOCS
class Asso(_CoverBMF):
    """Asso: Boolean matrix factorization by association-rule candidates (Miettinen et al.).

    Candidate components are the rows of the association matrix ``conf(i -> j) = |a_i and
    a_j| / |a_i| >= threshold`` (``a_i`` column ``i``); ``n_components`` times, the candidate
    and its row usage that maximize ``gain * (newly covered ones) - loss * (newly covered
    zeros)`` are added. Raising ``loss`` trades covered ones for fewer over-covered zeros.
    The defaults are the Felb paper's Appendix D settings. Dense ``O(n m)`` memory.

    Parameters
    ----------
    n_components : int, default=10
        Number of Boolean components ``k`` (at most; the cover may stop earlier).
    threshold : float in (0, 1], default=1.0
        Minimum confidence of an association (1: only exact implications).
    gain : float, default=1.0
        Weight of a newly covered one.
    loss : float, default=1.0
        Weight of a newly covered zero (over-cover penalty).
    %(binarize_and_attributes)s

    References
    ----------
    P. Miettinen, T. Mielikainen, A. Gionis, G. Das, H. Mannila. The Discrete Basis Problem.
    IEEE TKDE 20(10), 2008.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.binary import Asso
    >>> X = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]])
    >>> model = Asso(n_components=2).fit(X)
    >>> bool((model.predict(X) == X).all())
    True
    """

    _parameter_constraints: dict = {
        **_CoverBMF._parameter_constraints,
        "threshold": [Interval(Real, 0, 1, closed="right")],
        "gain": [Interval(Real, 0, None, closed="neither")],
        "loss": [Interval(Real, 0, None, closed="left")],
    }

    def __init__(self, n_components=10, *, threshold=1.0, gain=1.0, loss=1.0, binarize=None):
        self.n_components = n_components
        self.threshold = threshold
        self.gain = gain
        self.loss = loss
        self.binarize = binarize

    def _solve(self, A):
        return asso(A, self.n_components, threshold=self.threshold, gain=self.gain,
                    loss=self.loss)

    def _fold_in_weights(self):
        return {"gain": self.gain, "loss": self.loss}


@_COVER_DOCS
class GreConD(_CoverBMF):
    """GreConD: greedy Boolean factorization by formal concepts (Belohlavek & Vychodil).

    Each component is a formal concept of ``X`` (a maximal all-ones rectangle), grown one
    column at a time while it covers more of the still uncovered ones. The reconstruction
    never has a one where ``X`` has a zero (a cover "from below"); with enough components it
    is exact; ``user_factors_`` are the concepts' extents. The Felb paper gives no settings.
    Dense ``O(n m)`` memory.

    Parameters
    ----------
    n_components : int, default=10
        Number of Boolean components ``k`` (at most; the cover may stop earlier).
    %(binarize_and_attributes)s

    References
    ----------
    R. Belohlavek, V. Vychodil. Discovery of optimal factors in binary data via a novel method
    of matrix decomposition. J. Comput. Syst. Sci. 76(1), 2010.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.binary import GreConD
    >>> X = np.array([[1, 1, 0], [1, 1, 1], [0, 1, 1]])
    >>> model = GreConD(n_components=2).fit(X)
    >>> bool((model.predict(X) == X).all())
    True
    """

    _fold_in_loss = np.inf  # a row uses a concept only if it contains it: no over-cover

    def __init__(self, n_components=10, *, binarize=None):
        self.n_components = n_components
        self.binarize = binarize

    def _solve(self, A):
        return grecond(A, self.n_components)


@_COVER_DOCS
class MEBF(_CoverBMF):
    """MEBF: median expansion for Boolean factorization (Wan et al.).

    Each component grows from a seed column (the median of the residual column sums) into
    its rows and the columns that at least ``threshold`` of them contain, or symmetrically
    from a seed row, or from the two densest columns or rows (weak signal); the pattern that
    lowers the reconstruction error most is kept. Stops after ``n_components`` patterns, when
    ``cover`` of the ones are covered, or when nothing lowers the error. The defaults are the
    Felb paper's Appendix D settings. Dense ``O(n m)`` memory.

    Parameters
    ----------
    n_components : int, default=10
        Number of Boolean components ``k`` (at most; the cover may stop earlier).
    threshold : float in (0, 1], default=0.5
        Share of a seed's rows (columns) that must contain a column (row) to join the pattern.
    cover : float in (0, 1], default=0.95
        Stop once this share of the ones is covered.
    %(binarize_and_attributes)s

    References
    ----------
    C. Wan, W. Chang, T. Zhao, M. Li, S. Cao, C. Zhang. Fast and Efficient Boolean Matrix
    Factorization by Geometric Segmentation. AAAI 2020.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.binary import MEBF
    >>> X = np.kron(np.eye(2, dtype=int), np.ones((3, 3), dtype=int))
    >>> model = MEBF(n_components=2).fit(X)
    >>> bool((model.predict(X) == X).all())
    True
    """

    _parameter_constraints: dict = {
        **_CoverBMF._parameter_constraints,
        "threshold": [Interval(Real, 0, 1, closed="right")],
        "cover": [Interval(Real, 0, 1, closed="right")],
    }

    def __init__(self, n_components=10, *, threshold=0.5, cover=0.95, binarize=None):
        self.n_components = n_components
        self.threshold = threshold
        self.cover = cover
        self.binarize = binarize

    def _solve(self, A):
        return mebf(A, self.n_components, threshold=self.threshold, cover=self.cover)
