"""FedBaseline: the federated biases-only model ``mean + b_u + b_i`` (Surprise's
``BaselineOnly`` with ``method="als"``), the yardstick of the factor models.

The protocol is in :mod:`._fed_baseline_protocol`; the scikit-learn contract (validation,
centring, fold-in, predict, score, the pair API) is the completion base's, read at rank 0.
"""

from __future__ import annotations

from numbers import Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_array, check_is_fitted

from ..._docstrings import Substitution
from ...engine._client_data import check_dense_size
from ...privacy._distributed_dp import DISTRIBUTED_DOCS, DistributedDP, DistributedDPMixin
from .._base import (
    COMPLETION_DOCS,
    FOLD_IN_DATA,
    FederatedMFBase,
    moved_to_solver_params,
)
from ._fed_baseline_protocol import given_start, make_protocol, moment_strengths

__all__ = ["FedBaseline"]



@Substitution(**COMPLETION_DOCS, **DISTRIBUTED_DOCS)
class FedBaseline(DistributedDPMixin, FederatedMFBase):
    """Federated biases-only model: ``mean + b_u + b_i``, fitted by alternating least squares.

    The federated counterpart of Surprise's ``BaselineOnly`` (``bsl_options={"method":
    "als"}``) and the floor every factor model should beat. The global mean comes from each
    client's sum and count of ratings. Then, each round, every sampled client solves its users'
    biases in closed form against the broadcast item biases, ``b_u = sum_i (r_ui - mean - b_i)
    / (alpha_u + n_u)`` (they never leave it), and sends, for the items its users rated, the
    change of its sums of ``r_ui - mean - b_u``; the server keeps the running sums of every
    client's latest contribution and sets ``b_i = sum / (alpha_v + n_i)``, with the item counts
    ``n_i`` each client sent once at the start. The objective is::

        1/2 sum_(u,i) (r_ui - mean - b_u - b_i)^2 + alpha_u/2 ||b_u||^2 + alpha_v/2 ||b_i||^2

    and every round is an exact block minimization of it, items first as in Surprise. With
    every client in every round the result does not depend on the partition into clients:
    after ``K`` rounds ``user_bias_`` is ``BaselineOnly``'s ``bu`` after ``K`` epochs and
    ``item_bias_`` its ``bi`` after ``K + 1`` (with its strengths, ``alpha_u=15,
    alpha_v=10``; the default ``"auto"`` adapts them to the data). A client that is not
    sampled keeps its biases, so its part of the server's sums stays exact: partial
    participation is randomized block coordinate descent on the same objective.

    Parameters
    ----------
    alpha_u : float or "auto", default="auto"
        Shrinkage of the user biases (Surprise's ``reg_u``): ``b_u`` is the mean of the user's
        deviations over ``n_u`` ratings plus ``alpha_u`` zeros. Also used by fold-in.
        ``"auto"``: empirical Bayes, the noise variance over the user biases' variance,
        estimated from three sums each client sends once (its sum of squared centred
        ratings, the sum over its users of ``(sum of the row)^2 / n_u``, its number of users
        with a rating) and the per-item counts and sums of the start
        (``moment_strengths`` of :mod:`._fed_baseline_protocol`); a ratio of variances, so
        free of the ratings' unit. Measured on seven real sets (``benchmarks/results/
        bench_biases_auto-2026-12.md``): test RMSE 0.0045 (MovieLens 100K) to 0.057
        (Jester) below Surprise's strengths (15 and 10, the default before), on every
        set. A
        deployment whose sites report only counts (``flower``) uses 15 and 10. A warm start
        keeps the first fit's strengths.
    alpha_v : float or "auto", default="auto"
        Shrinkage of the item biases (Surprise's ``reg_i``); ``"auto"``: as ``alpha_u``, with
        the item biases' variance.
    n_clients : int, default=10
        %(n_clients)s
    clients_per_round : int, float or None, default=None
        %(clients_per_round)s
        The server's sums keep every client's latest contribution, so a sampled round still
        moves toward the same model; it needs more rounds
        (``benchmarks/bench_fed_baseline.py``, one client per user of ml-latest-small, 10 %
        per round, Surprise's strengths: test RMSE 0.8810, 0.8676, 0.8663 after 20, 40, 60
        rounds against 0.8661 with every client; a server using only the round's uploads
        stays at 0.905).
    max_iter : int, default=20
        Communication rounds (one user step and one item step each). With every client each
        round the test RMSE on ml-latest-small is within 1.3e-5 of the converged model's
        after 10 rounds (Surprise's 10 epochs) and 1e-7 after 20.
    tol : float, default=0.0
        %(tol)s
    %(control_parameters)s
    random_state : int, RandomState instance or None, default=None
        Seeds the partition and every round's sampling (the fit has no other randomness).
    %(compute_parameters)s

        %(solver_simulation)s
    %(secure_parameter)s
    %(distributed_privacy)s

    Attributes
    ----------
    %(distributed_attributes)s
    item_bias_ : ndarray of shape (n_items,)
        ``b_i``, the server's.
    alpha_u_, alpha_v_ : float
        The strengths the fit used (``"auto"``'s values, or the numbers given).
    user_bias_ : ndarray of shape (n_users,)
        ``b_u``, private to each client, kept for analysis only.
    components_ : ndarray of shape (0, n_items)
        The (empty) item factor: the model has rank 0.
    user_factors_ : ndarray of shape (n_users, 0)
        The (empty) user factors.
    mean_ : float
        The training mean.
    rating_range_ : tuple of float
        The training ratings' minimum and maximum (the bounds of ``clip``).
    n_iter_ : int
    n_clients_ : int
    clients_ : ndarray of shape (n_users,)
    history_ : list of dict
        One record per round: ``objective``, ``train_rmse``, ``eval_rmse`` (with
        ``eval_set``), ``bytes_uploaded`` (round 1's include the clients' counts and initial
        sums), ``bytes_downloaded``, ``seconds``.
    %(outcome_attributes)s

    See Also
    --------
    sklearn_fedmf.FedMGS : A factor model with biases (``biased=True``) beside this floor.

    References
    ----------
    Y. Koren. Factor in the Neighbors: Scalable and Accurate Collaborative Filtering. ACM
    Trans. Knowl. Discov. Data, 2010 (section 2.1, the baseline predictors).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf import FedBaseline
    >>> rng = np.random.default_rng(0)
    >>> R = 3 + rng.normal(size=(60, 1)) + rng.normal(size=(1, 30))  # biases only
    >>> X = np.where(rng.random(R.shape) < 0.5, R, np.nan)
    >>> model = FedBaseline(alpha_u=0.1, alpha_v=0.1, n_clients=4, random_state=0).fit(X)
    >>> bool(model.score(X) > -0.05)
    True
    >>> model.transform(X).shape  # each row's b_u, folded in
    (60, 1)
    >>> auto = FedBaseline(n_clients=4, random_state=0).fit(X)  # "auto": almost noise-free
    >>> bool(auto.alpha_u_ < 0.5 and auto.alpha_v_ < 0.5)  # so little shrinkage
    True
    """

    # The completion base read at rank 0: biases, centred, squared-l2 fold-in (what
    # BaselineOnly is; these are not parameters).
    n_components = 0
    biased = True
    _default_settings: dict = {**FederatedMFBase._default_settings, "center": True}

    # (no centring switch, and no loss="implicit": no confidence scale)
    _solver_params: dict = {key: spec for key, spec in FederatedMFBase._solver_params.items()
                            if key not in ("center", "confidence")}
    _moved_params = moved_to_solver_params(_solver_params)

    _parameter_constraints: dict = {
        # the base's parameters but the rank and the biases (fixed: class attributes above)
        **{name: constraint for name, constraint in FederatedMFBase._parameter_constraints.items()
           if name not in ("n_components", "biased")},
        "alpha_u": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "alpha_v": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "privacy": [DistributedDP, None],
    }

    def __init__(
        self,
        *,
        alpha_u="auto",
        alpha_v="auto",
        n_clients=10,
        clients_per_round=None,
        max_iter=20,
        tol=0.0,
        clip=True,
        callback=None,
        warm_start=False,
        random_state=None,
        n_jobs=None,
        verbose=0,
        solver_params=None,
        secure_aggregation=False,
        privacy=None,
    ):
        # (not the base's __init__, which would store the fixed class attributes above)
        self.alpha_u = alpha_u
        self.alpha_v = alpha_v
        self.n_clients = n_clients
        self.clients_per_round = clients_per_round
        self.max_iter = max_iter
        self.tol = tol
        self.clip = clip
        self.callback = callback
        self.warm_start = warm_start
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.solver_params = solver_params
        self.secure_aggregation = secure_aggregation
        self.privacy = privacy

    # Set by the biases floor of a secure sampled fit (completion._validation.floor_start)
    # for the next fit only: the start's per-item counts and rating sums, already summed in
    # sums of a round's clients, and their bytes; the fit's clients send no start.
    _given_start = None

    def _make_protocol(self, ctx):
        alpha_u, alpha_v = self._strengths(ctx)
        start = None
        if self._given_start is not None and not ctx.warm:
            counts, sums, _ = self._given_start
            start = given_start(counts, sums, ctx.info.offset)
        return make_protocol(n_items=ctx.n_features, alpha_u=alpha_u, alpha_v=alpha_v,
                             start=start)

    def _uses_auto(self):
        return "auto" in (self.alpha_u, self.alpha_v)

    def _strengths(self, ctx):
        """``(alpha_u, alpha_v)`` of the fit: the numbers given as they are (so a fit with
        numbers is the fit it always was), ``"auto"``'s from the training ratings' sums; a
        warm start keeps the first fit's; without the ratings (a deployment whose sites
        report only counts) Surprise's 15 and 10."""
        if not self._uses_auto():
            return self.alpha_u, self.alpha_v
        if ctx.warm and hasattr(self, "alpha_u_"):
            auto = (self.alpha_u_, self.alpha_v_)
        elif ctx.X.nnz == 0:
            auto = (15.0, 10.0)
        else:
            auto = moment_strengths(ctx.X)
        return (auto[0] if self.alpha_u == "auto" else self.alpha_u,
                auto[1] if self.alpha_v == "auto" else self.alpha_v)

    def _start_bytes(self, ctx):
        """``"auto"``: each client's three sums up and ``alpha_u`` down (8-byte numbers),
        before the start (whose per-item counts and sums the rule reuses)."""
        given = (0, 0) if self._given_start is None or ctx.warm else self._given_start[2]
        if not self._uses_auto() or ctx.warm or ctx.X.nnz == 0:
            return tuple(a + b for a, b in zip(super()._start_bytes(ctx), given))
        return 24 * ctx.n_clients + given[0], 8 * ctx.n_clients + given[1]

    def _collect(self, state, blocks, ctx):
        strengths = self._strengths(ctx)  # (before the fitted attributes change)
        super()._collect(state, blocks, ctx)
        self.alpha_u_, self.alpha_v_ = (float(a) for a in strengths)

    def _fold_in_alpha_u(self):
        return self.alpha_u_

    def _degenerate(self, state, blocks, ctx, history):
        # Only all-zero biases are trivial. Each round is an exact block minimization, so the
        # objective never increases, and a fully observed matrix reaches the fixed point in
        # round 1: an unchanged objective means converged, not frozen.
        if not (self.item_bias_.any() or self.user_bias_.any()):
            return "the biases are all zero, so every prediction is the training mean"
        return None

    @FOLD_IN_DATA
    def transform(self, X):
        """Fold-in: each row's ``b_u`` against the fitted ``item_bias_``, from its ratings.

        What a new client computes on its own: ``b_u = sum_i (r_ui - mean_ - b_i) / (alpha_u +
        n_u)``; a row with no observation gets 0.

        Parameters
        ----------
        %(fold_in_data)s

        Returns
        -------
        user_bias : ndarray of shape (n_rows, 1)
            The rows' biases.
        """
        U_aug = self._augmented(self._check_X(X))[0]  # [b_u, 1]
        return np.ascontiguousarray(U_aug[:, :1])

    def inverse_transform(self, X):
        """Ratings from user biases: ``mean_ + b_u + item_bias_`` (unclipped).

        Parameters
        ----------
        X : array-like of shape (n_samples, 1)
            User biases, e.g. the output of :meth:`transform`.

        Returns
        -------
        ratings : ndarray of shape (n_samples, n_items)
            Dense ratings; refused above ``MAX_DENSE_ENTRIES`` entries (see :meth:`predict`).
        """
        check_is_fitted(self)
        B = check_array(X)
        if B.shape[1] != 1:
            raise ValueError(f"X has {B.shape[1]} columns but FedBaseline.inverse_transform "
                             "takes one: the user biases that transform returns.")
        check_dense_size(B.shape[0], self.item_bias_.shape[0], "inverse_transform(X)")
        return self.mean_ + B + self.item_bias_

    @property
    def _n_features_out(self):
        return 1
