"""FedMGS: federated matrix completion by gradient sharing (Wang & Chang, Algorithm 2).

The estimator; the algorithm, its messages and what they disclose are described in
:mod:`._fedmgs_protocol`.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from ._base import FederatedMFBase
from ._fedmgs_protocol import AUTO_WEIGHTED, make_protocol

__all__ = ["FedMGS"]


# ---- estimator ----------------------------------------------------------------------------
class FedMGS(FederatedMFBase):
    """Federated matrix completion by gradient sharing (FedMGS, Wang & Chang).

    Each round, the ``clients_per_round`` sampled clients take ``local_iter_u``
    proximal-gradient steps on their private user factors ``U_p`` against the broadcast item
    factor ``V``, then send their data aggregates: for each item ``j`` their users rated,
    ``G1_j = sum_t u_t u_t^T`` and ``G2_j = sum_t x_tj u_t`` (the paper's ``H H^T`` and ``X
    H^T`` (29), one per item as the loss is masked), and ``U_p^T U_p``. From every client's
    latest aggregates the server rebuilds the exact gradient in ``V`` at any ``V`` and takes
    ``local_iter_v`` proximal-gradient steps alone. Clients that are not sampled neither
    compute nor send; their aggregates stay exact, as their factors did not move.

    With every client sampled the result does not depend on the partition of the rows. The
    aggregates disclose which items a client's users rated, and more (a one-user client's
    ratings minus its bias; see the module documentation): this is the price of sharing
    data statistics instead of models.

    Parameters
    ----------
    n_components : int, default=5
        Rank ``r`` of the factorization.
    local_iter_u : int, default=10
        Local steps ``Q1`` on the user factors per round.
    local_iter_v : int, default=1
        The server's steps ``Q2`` on ``V`` per round, each with the exact gradient rebuilt
        from the clients' aggregates (no client takes part in them).
    c_factor : float, default=0.51
        The U step is ``1 / (c_factor * (lambda_max(V V^T) + ridge))`` (Algorithm 2's steps).
    d_factor : float, default=0.501
        The V step is ``1 / (d_factor * (lambda_max(sum_p U_p^T U_p) + ridge))`` (Algorithm 2's
        steps).
    n_clients : int, default=10
        Number of clients ``p`` when ``clients`` is not given to fit.
    partition : {"random", "contiguous"}, default="random"
        How rows are assigned to ``n_clients`` clients when ``clients`` is not given to fit
        (``"random"`` is seeded by ``random_state``).
    clients_per_round : int, float or None, default=None
        Clients drawn each round; None means all.
    sampling : {"uniform", "weighted"}, default="uniform"
        ``"uniform"``: distinct clients without replacement (Theorem 2's scheme).
        ``"weighted"``: i.i.d. draws with replacement, probabilities proportional to the
        clients' ratings (the paper's footnote); a client drawn twice sends its aggregates once
        and it is applied once.
    max_iter : int, default=100
        Communication rounds (one server step each).
    tol : float, default=0.0
        Stop when the relative change of the objective falls below ``tol``.
    alpha_u, alpha_v : float or "auto", default="auto"
        Elastic-net regularization of the user and item factors (as in
        :class:`~sklearn_fedmf.FedMAvg`). ``"auto"`` (plain penalties): the server sets the
        strength each round to ``AUTO_C * sigma^2 / s^2`` at its current model, the noise
        variance (training residual per rating) over a factor entry's prior variance ``s^2 =
        sqrt(q / r)``, ``q`` the variance of the rank-``r`` part ``u.v`` on the ratings: the
        ratio of the MAP objective of a Gaussian model (Salakhutdinov & Mnih's PMF), with
        ``AUTO_C = 3.5``. It starts at, and never exceeds, ``10`` times the root mean square
        of the (centred) ratings (the former constant 10 on ratings of deviation about 1):
        low-noise data get weaker penalties, data whose rank-``r`` signal is weak against the
        noise (MovieLens) keep about 10. It follows the ratings' scale (ratings times ``c``:
        strength times ``c``). Each client adds one number to its message (see the module
        documentation). With ``regularization="weighted"``, ``"auto"`` is 0.1 per rating.
        The values used are ``alpha_u_`` and ``alpha_v_``. Measured across data sets
        (``benchmarks/bench_defaults.py``); the papers' ``1e-6`` is in ``PAPER_SETTINGS``.
    l1_ratio : float, default=0.0
        Mix of the elastic net: 0 is squared l2, 1 is l1 (soft-thresholding).
    regularization : {"plain", "weighted"}, default="plain"
        ``"plain"``: the papers' penalties, one strength for every row. ``"weighted"``:
        ALS-WR's weighted lambda, each user's row scaled by its number of ratings and each
        item's by its number of ratings (``alpha`` is then a strength per rating). The
        server learns the item counts once: every client sends its ratings per item in
        round 1 (counted in its bytes; the shared aggregates already show which items a
        client rated).
    positive : bool, default=False
        Constrain both factors to be nonnegative.
    init_scale : float, default=1.0
        Factors start i.i.d. ``init_scale * Uniform[0, 1)`` (0: at the zero saddle, where
        they stay; with ``biased=True`` only the biases are then fitted).
    center : bool, default=True
        Subtract the global training mean before factorizing.
    biased : bool, default=True
        Fit a bias per user and per item: the prediction is ``mean_ + b_u + b_i + u . v``.
        The factors become ``[U, b_u, 1]`` and ``[V; 1; b_i]`` with the fixed entries held
        by indicator functions in the regularizers (their prox is the projection onto 1), so
        the algorithm runs unchanged on rank ``n_components + 2``. ``b_u`` stays on its
        client like ``U_p``; ``b_i`` travels and is aggregated as ``V`` (its bytes counted).
    clip : bool, default=True
        Clip predictions (``predict``, ``score``, and through
        :class:`~sklearn_fedmf.RatingRegressor` its pairs and ``recommend`` scores) to the
        training rating range ``rating_range_``, as Surprise does; False gives the raw model.
    dropout : float, default=0.0
        Probability that a sampled client fails in a round (it then sends nothing);
        failures are counted in ``history_``.
    eval_every : int, default=1
        Record the objective and RMSEs every ``eval_every`` rounds (0 never).
    callback : callable, default=None
        ``callback(round, info)`` after each round; returning True stops the fit.
    warm_start : bool, default=False
        Continue from the previous fit's state for ``max_iter`` more rounds.
    missing_values : float, default=np.nan
        As in :class:`~sklearn_fedmf.FedMCADMM`.
    random_state : int, RandomState instance or None, default=None
        Seeds the partition, the initialization and every round's sampling.
    n_jobs : int, default=None
        Parallel local updates (joblib; threads unless a backend is configured).
    verbose : int, default=0
        1 shows a progress bar, 2 a line per round.
    on_client_error : {"raise", "skip"}, default="raise"
        An exception in a client's code raises a
        :class:`~sklearn_fedmf.exceptions.ClientError` naming the client and the round.
        ``"skip"``, for deployments that must tolerate failing clients: the client keeps its
        previous state for that round and counts in ``history_``'s ``n_failed``, a
        :class:`~sklearn_fedmf.exceptions.ClientFailureWarning` is raised once per fit, and a
        round in which every sampled client failed raises
        :class:`~sklearn_fedmf.exceptions.FederationError`. Simulated failures
        (``dropout``) are counted either way.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_items)
        The global item factor ``V``.
    user_factors_ : ndarray of shape (n_users, n_components)
        The client-local factors, kept for analysis only.
    item_bias_ : ndarray of shape (n_items,)
        ``b_i`` (``biased=True`` only).
    user_bias_ : ndarray of shape (n_users,)
        ``b_u``, private to each client (``biased=True`` only).
    mean_ : float
    n_iter_ : int
    n_clients_ : int
    clients_ : ndarray of shape (n_users,)
    history_ : list of dict
        One record per round (round 1's bytes include every client's initial aggregates).
    converged_, degenerate_
        As in :class:`~sklearn_fedmf.FedMCADMM`.
    n_features_in_ : int
    alpha_u_, alpha_v_ : float
        The strengths of the last round (``"auto"``: the server's last value; fold-in uses
        ``alpha_u_``).

    See Also
    --------
    sklearn_fedmf.FedMAvg : Model averaging, the paper's first algorithm.

    References
    ----------
    S. Wang and T.-H. Chang. Federated Matrix Factorization: Algorithm Design and Application
    to Data Clustering. IEEE Trans. Signal Process., 2022.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf import FedMGS
    >>> rng = np.random.default_rng(0)
    >>> M = rng.normal(size=(60, 2)) @ rng.normal(size=(2, 30))
    >>> X = np.where(rng.random(M.shape) < 0.6, M, np.nan)
    >>> # a noise-free low-rank toy needs little regularization (the defaults suit ratings)
    >>> model = FedMGS(n_components=2, n_clients=4, max_iter=300, alpha_u=0.01, alpha_v=0.01,
    ...               random_state=0).fit(X)
    >>> bool(model.score(X) > -0.1)
    True
    """

    _parameter_constraints: dict = {
        **FederatedMFBase._parameter_constraints,
        "local_iter_u": [Interval(Integral, 1, None, closed="left")],
        "local_iter_v": [Interval(Integral, 1, None, closed="left")],
        "c_factor": [Interval(Real, 0, None, closed="neither")],
        "d_factor": [Interval(Real, 0, None, closed="neither")],
        "init_scale": [Interval(Real, 0, None, closed="left")],
        "sampling": [StrOptions({"uniform", "weighted"})],
        "regularization": [StrOptions({"plain", "weighted"})],
        "alpha_u": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "alpha_v": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
    }

    def __init__(
        self,
        n_components=5,
        *,
        local_iter_u=10,
        local_iter_v=1,
        c_factor=0.51,
        d_factor=0.501,
        n_clients=10,
        partition="random",
        clients_per_round=None,
        sampling="uniform",
        max_iter=100,
        tol=0.0,
        alpha_u="auto",
        alpha_v="auto",
        l1_ratio=0.0,
        regularization="plain",
        positive=False,
        init_scale=1.0,
        center=True,
        biased=True,
        clip=True,
        dropout=0.0,
        eval_every=1,
        callback=None,
        warm_start=False,
        missing_values=np.nan,
        random_state=None,
        n_jobs=None,
        verbose=0,
        on_client_error="raise",
    ):
        super().__init__(
            n_components,
            n_clients=n_clients, partition=partition, clients_per_round=clients_per_round,
            max_iter=max_iter, tol=tol, alpha_u=alpha_u, alpha_v=alpha_v, center=center,
            biased=biased,
            clip=clip, dropout=dropout, eval_every=eval_every, callback=callback,
            warm_start=warm_start, missing_values=missing_values, random_state=random_state,
            n_jobs=n_jobs, verbose=verbose, on_client_error=on_client_error,
        )
        self.local_iter_u = local_iter_u
        self.local_iter_v = local_iter_v
        self.c_factor = c_factor
        self.d_factor = d_factor
        self.sampling = sampling
        self.l1_ratio = l1_ratio
        self.regularization = regularization
        self.positive = positive
        self.init_scale = init_scale

    def _strengths(self):
        """``(alpha_u, alpha_v)`` for the protocol: ``"auto"`` is the server's rule with the
        plain penalties, ``AUTO_WEIGHTED`` per rating with the weighted ones."""
        if self.regularization == "plain":
            return self.alpha_u, self.alpha_v
        return tuple(AUTO_WEIGHTED if a == "auto" else a for a in (self.alpha_u, self.alpha_v))

    def _make_protocol(self, ctx):
        alpha_u, alpha_v = self._strengths()
        auto = "auto" in (alpha_u, alpha_v)
        if ctx.warm and auto != ("ss" in self._federation.server_state):
            raise ValueError("warm_start cannot switch alpha_u or alpha_v between 'auto' and a "
                             "fixed strength; fit again without warm_start.")
        return make_protocol(
            n_items=ctx.n_features, n_clients=ctx.n_clients, n_components=self.n_components,
            local_iter_u=self.local_iter_u, local_iter_v=self.local_iter_v,
            c_factor=self.c_factor, d_factor=self.d_factor,
            alpha_u=alpha_u, alpha_v=alpha_v, l1_ratio=self.l1_ratio,
            positive=self.positive, init_scale=self.init_scale, biased=self.biased,
            weighted=self.regularization == "weighted", n_ratings=ctx.info["n_ratings"],
        )

    def _collect(self, state, blocks, ctx):
        super()._collect(state, blocks, ctx)
        alpha = state.server_state.get("alpha")
        self.alpha_u_, self.alpha_v_ = (alpha if a == "auto" else a for a in self._strengths())

    def _read_components(self, server_state, broadcast):
        return np.ascontiguousarray(server_state["Vt"].T)

    def _read_user_factors(self, client_state):
        return client_state["U"]
