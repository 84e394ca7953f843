"""Federated clustering by orthogonal NMF with FedMAvg or FedMGS (Wang & Chang, II-B and V).

Orientation (the paper's model (1)-(3) holds samples as columns): rows of ``X`` are samples,
held by the clients;
the paper's ``X`` is ``X.T``. The global factor ``W`` (``n_features x K``) is
``cluster_centers_.T``; client ``p`` keeps ``A_p = H_p^T`` (``n_p x K``), its samples'
memberships. The model of all the paper's experiments (35)-(36)::

    F(W, H) = (1/N) ||X - W H||^2 + sum_j [rho/2 ((1^T h_j)^2 - ||h_j||^2) + nu/2 ||h_j||^2]
    W in [min X, max X] entrywise,  H >= 0

The penalty vanishes iff every ``h_j`` has at most one nonzero, so growing ``rho`` (SNCP,
Section V-F) drives each sample into one cluster; as samples keep their own scale, samples are
clustered by direction. ``solver_params["h_constraint"] = "onehot"`` is the exact K-means
formulation (Section II-B): no penalty, one-hot ``h_j`` (the H phase is the assignment step),
``W`` unconstrained.

Steps are factors of Lipschitz constants (Section V-A's factors, with the true constants). As
``(1/c_p) grad_{H_p} F_p`` does not depend on ``p`` (from (29), (35), (36)),
:func:`._federated_clustering_protocol.h_steps` is one matrix operation on the stacked rows of
any set of clients: a client runs it on its rows, a simulator may batch clients.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import (
    ClassNamePrefixFeaturesOutMixin,
    ClusterMixin,
    TransformerMixin,
    _fit_context,
)
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from .._docstrings import SHARED_PARAMETERS, Substitution, federation_keys, solver_key
from ..completion._fedmavg._fedmavg_round import RoundRule
from ..engine._exchange import sum_securely
from ..engine._fit import FEDERATION_KEYS, FederatedEstimator, resolve_solver_params
from ..exceptions import DataWarning
from ._federated_clustering_protocol import (
    EPS,
    SampleBlock,
    center_distances,
    clustering_cost,
    kfed_centers,
    make_protocol,
    start_rounds,
)

__all__ = ["FederatedClustering"]


def _value_range(X):
    """``(min, max)`` of the entries of ``X`` (absent entries of a sparse ``X`` are 0), read
    without touching ``X`` (scipy's ``X.min()`` sorts a CSR matrix's indices in place)."""
    values = X.data if sp.issparse(X) else X
    if values.size == 0:
        return 0.0, 0.0
    lo, hi = float(values.min()), float(values.max())
    if sp.issparse(X) and X.nnz < X.shape[0] * X.shape[1]:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    return lo, hi


# ---- estimator ----------------------------------------------------------------------------
@Substitution(**SHARED_PARAMETERS, federation_keys=federation_keys(),
              dropout_key=solver_key("dropout", "float in [0, 1), default=0.0"))
class FederatedClustering(
    ClassNamePrefixFeaturesOutMixin, TransformerMixin, ClusterMixin, FederatedEstimator
):
    """Federated clustering: orthogonal NMF solved by FedMAvg or FedMGS (Wang & Chang).

    The samples (rows of ``X``) are held by clients that never share them. The model is
    ``x_j ~ h_kj w_k`` with nonnegative memberships made one-sparse by a penalty whose weight
    ``rho`` grows over the rounds (successive non-convex penalty, SNCP): each sample ends in
    one cluster, clustered by direction. The cluster centers ``W`` are the global factor;
    each client keeps its samples' memberships.

    Parameters
    ----------
    n_clusters : int, default=8
        Number of clusters ``K``.
    algorithm : {"fedmgs", "fedmavg"}, default="fedmgs"
        ``"fedmgs"``: sampled clients send ``H_p H_p^T`` and ``X_p H_p^T`` and the server takes
        ``Q2`` projected gradient steps on the exact global gradient (Algorithm 2).
        ``"fedmavg"``: sampled clients take ``Q2`` local steps on a copy of the centers and
        the server averages the copies (Algorithm 1).
    local_iter_u : int, default=10
        Projected-gradient steps ``Q1`` on the memberships per round.
    local_iter_v : int or None, default=None
        ``Q2``. None: 100 for FedMGS (the reference code's value), the diminishing
        ``floor(q_hat / s) + 1`` for FedMAvg (``solver_params["q_hat"]``).
    n_clients : int, default=10
        %(n_clients)s
    clients_per_round : int, float or None, default=None
        Clients drawn each round (the paper's ``m``): a count, a fraction in (0, 1], or None
        for all.
    max_iter : int, default=1000
        %(max_iter)s
    tol : float, default=1e-8
        %(tol)s
    init : {"k-fed", "random"} or array-like of shape (n_clusters, n_features), \
            default="k-fed"
        ``"k-fed"``: one-shot federated seeding (Dennis et al., ICML 2021): each client runs
        k-means on its own samples and sends its ``n_clusters`` centers and their sizes (counted
        in the first round's ``bytes_uploaded``); the server clusters their union (k-means++,
        weighted by size) into the initial centers. ``"random"``: centers and memberships
        i.i.d. ``U[0, a)``, ``a = sqrt(mean|X| / K)`` (the paper). An array: initial centers.
        With centers, each sample starts from its best one-sparse fit to them.
    n_init : int, default=2
        Federations run from different random starts (as in ``KMeans``); the one with the
        lowest final clustering cost (``-score`` on the training samples: one scalar per
        client) is kept. Communication and time grow ``n_init``-fold; ``history_`` is the kept
        run's. With an array ``init`` a single run is made; with ``"k-fed"`` each start seeds
        anew. On label-skewed digits two starts lift the worst of five seeds from 0.86 to
        0.99 of ``KMeans(n_init=10)``; a third adds at most 0.003.
    solver_params : dict or None, default=None
        The paper's step constants, variant switches and simulation settings (Sections V-A
        and V-F, the reference code's values where the paper is silent); a key left out keeps
        its default. An unknown key or a bad value raises an error that lists the keys. The
        paper's own start is ``PAPER_SETTINGS`` (:mod:`sklearn_fedmf.cluster`).

        %(federation_keys)s
        - ``variant`` : {"wang_chang", "fedpalm"}, default="wang_chang"
          ``"fedpalm"`` (with ``algorithm="fedmavg"``): Remark 1's FedPALM, the baseline of the
          paper's Fig. 2b: each client interleaves ``local_iter_u`` pairs of one projected
          membership step at its current copy of the centers and one projected center step, then
          FedMAvg's averaging (``Q = 2 local_iter_u``; ``local_iter_v``, ``q_hat`` and ``w_step`` do
          not apply).
        - ``q_hat`` : int, default=5
          ``Q_hat`` of FedMAvg's diminishing schedule.
        - ``sampling`` : {"uniform", "weighted"}, default="uniform"
          ``"uniform"``: distinct clients without replacement. ``"weighted"``: the paper's i.i.d.
          draws with replacement, probabilities ``omega_p = N_p / N`` (Algorithm 1); a client drawn
          twice computes and uploads once and FedMAvg's mean counts it per draw.
        - ``participation`` : {"pcc", "pcp"}, default="pcc"
          FedMAvg only: every client (``"pcc"``) or only the sampled ones (``"pcp"``) update their
          memberships. FedMGS always uses the sampled clients only.
        - ``aggregation`` : {"weighted", "sampled_mean"} or None, default=None
          FedMAvg's server average: weights ``N_p`` (eq. (8) at full participation, renormalized
          over the senders otherwise) or the plain mean, a client counted once per draw. None means
          ``"weighted"``, or ``"sampled_mean"`` with ``sampling="weighted"``.
        - ``c_factor`` : float, default=0.51
          Membership step ``1 / (c_factor L_Hp)``.
        - ``d_factor`` : float or None, default=None
          Center step ``1 / (d_factor L_W)``; None: 0.501 (FedMGS) or 5 (FedMAvg).
        - ``w_step`` : {"global", "local", "guarded"}, default="global"
          FedMAvg's ``L_W``: of all clients' memberships this round (clients send ``H_p H_p^T``
          first), of the client's own, or the global one bounded by the local (a stability guard on
          non-iid clients).
        - ``h_constraint`` : {"nonnegative", "onehot"}, default="nonnegative"
          ``"onehot"``: the exact K-means formulation (assignment step, unconstrained centers, no
          penalty).
        - ``sncp`` : bool, default=True
          Grow ``rho`` (SNCP); False keeps ``rho = rho0 ||X||^2 / N``.
        - ``rho0`` : float, default=1e-5
          Initial penalty weight, relative to ``||X||^2 / N``. The paper's ``1e-8``
          (``PAPER_SETTINGS``) suits its random start; from the k-FED seeding's one-sparse
          memberships it lets the centers drift to an almost unpenalized NMF before SNCP makes the
          memberships one-sparse again, and FedMAvg's SNCP rarely raises ``rho`` within 1000 rounds.
          ``1e-5`` still lets a poor seeding be corrected (the samples can change cluster); ``1e-3``
          and above freeze the seeding's clusters (user guide, Clustering).
        - ``nu`` : float, default=1e-10
          Ridge weight on the memberships, relative to ``||X||^2 / N``.
        - ``rho_growth`` : float, default=1.5
          Factor by which SNCP multiplies ``rho`` each time it raises it.
        - ``rho_tol`` : float or None, default=None
          Raise ``rho`` when the relative change of the objective is below it; None: 5e-5 (FedMGS)
          or 1e-5 (FedMAvg).
        - ``rho_force_every`` : int, default=200
          Also raise ``rho`` every that many rounds (0 never).
        - ``rho_max`` : float or None, default=None
          Cap of ``rho`` relative to ``||X||^2 / N``; None: 1 (FedMGS) or 100 (FedMAvg).
        %(dropout_key)s
    callback : callable, default=None
        ``callback(round, info)`` after each round (of each of the ``n_init`` federations);
        returning True stops that federation.
    random_state : int, RandomState instance or None, default=None
        %(random_state)s
    n_jobs : int, default=None
        %(n_jobs)s
    verbose : int, default=0
        %(verbose)s
        Simulated failures (``solver_params["dropout"]``) are counted either way.
    secure_aggregation : bool or SecureAggregation, default=False
        %(secure_aggregation)s

    Attributes
    ----------
    cluster_centers_ : ndarray of shape (n_clusters, n_features)
        The global factor ``W^T`` (projected on ``[min X, max X]``).
    labels_ : ndarray of shape (n_samples,)
        ``argmax_k`` of each sample's memberships (first on ties; the rule of ``predict``
        for a sample whose memberships are all zero).
    sample_factors_ : ndarray of shape (n_samples, n_clusters)
        The memberships ``H^T``, kept for analysis only.
    rho_ : float
        Final penalty weight.
    n_iter_ : int
    n_clients_ : int
    clients_ : ndarray of shape (n_samples,)
    history_ : list of dict
        One record per round: ``objective``, ``fit``, ``penalty``, ``rho``, ``rel_change``,
        bytes, ``seconds``.
    converged_ : bool
        False when ``tol`` > 0 was not met within ``max_iter`` rounds.
    degenerate_ : str or None
        Why the fitted model is trivial (all-zero centers or memberships), or None. A fit
        that ends with ``converged_`` False or a ``degenerate_`` reason raises one
        :class:`~sklearn_fedmf.exceptions.DegenerateFitWarning`.
    n_features_in_ : int

    References
    ----------
    %(wang_chang_2022)s

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf import FederatedClustering
    >>> X = np.array([[1.0, 0.1], [2.0, 0.1], [3.0, 0.3], [0.1, 1.0], [0.2, 2.0], [0.1, 3.0]])
    >>> model = FederatedClustering(n_clusters=2, n_clients=3, max_iter=100, tol=0.0,
    ...                             random_state=0).fit(X)  # 100 rounds, no stopping rule
    >>> bool(len(set(model.labels_[:3])) == 1 and model.labels_[0] != model.labels_[3])
    True
    >>> bool(model.predict([[5.0, 0.0]])[0] == model.labels_[0])
    True
    """

    _parameter_constraints: dict = {
        **FederatedEstimator._parameter_constraints,
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        "algorithm": [StrOptions({"fedmgs", "fedmavg"})],
        "local_iter_u": [Interval(Integral, 1, None, closed="left")],
        "local_iter_v": [Interval(Integral, 1, None, closed="left"), None],
        "clients_per_round": [Interval(Integral, 1, None, closed="left"),
                              Interval(Real, 0, 1, closed="right"), None],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "init": [StrOptions({"random", "k-fed"}), "array-like"],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "solver_params": [dict, None],
    }
    _solver_params: dict = {
        **FEDERATION_KEYS,
        "variant": ("wang_chang", [StrOptions({"wang_chang", "fedpalm"})]),
        "q_hat": (5, [Interval(Integral, 0, None, closed="left")]),
        "sampling": ("uniform", [StrOptions({"uniform", "weighted"})]),
        "participation": ("pcc", [StrOptions({"pcc", "pcp"})]),
        "aggregation": (None, [StrOptions({"weighted", "sampled_mean"}), None]),
        "c_factor": (0.51, [Interval(Real, 0, None, closed="neither")]),
        "d_factor": (None, [Interval(Real, 0, None, closed="neither"), None]),
        "w_step": ("global", [StrOptions({"global", "local", "guarded"})]),
        "h_constraint": ("nonnegative", [StrOptions({"nonnegative", "onehot"})]),
        "sncp": (True, ["boolean"]),
        "rho0": (1e-5, [Interval(Real, 0, None, closed="left")]),
        "nu": (1e-10, [Interval(Real, 0, None, closed="left")]),
        "rho_growth": (1.5, [Interval(Real, 1, None, closed="left")]),
        "rho_tol": (None, [Interval(Real, 0, None, closed="left"), None]),
        "rho_force_every": (200, [Interval(Integral, 0, None, closed="left")]),
        "rho_max": (None, [Interval(Real, 0, None, closed="left"), None]),
        "dropout": (0.0, [Interval(Real, 0, 1, closed="left")]),
    }
    _moved_params = {key: f"solver_params['{key}']" for key in _solver_params}

    # Secure aggregation (secure_aggregation=True): the rounds' uploads are sums. FedMGS's
    # aggregates H_p H_p^T and X_p^T H_p go into running sums (a cumulative exchange, the
    # initial ones included); FedMAvg's copies W_p into the ratio of two sums (w_p W_p, w_p);
    # with n_init > 1 each client's clustering cost into one more secure sum. What is not a
    # sum is refused (_secure_protocol): init="k-fed" (each client's local centres, which the
    # server clusters) and FedMAvg's global step (w_step "global" or "guarded": its prepare
    # phase's Grams).

    def __init__(
        self,
        n_clusters=8,
        *,
        algorithm="fedmgs",
        local_iter_u=10,
        local_iter_v=None,
        n_clients=10,
        clients_per_round=None,
        max_iter=1000,
        tol=1e-8,
        init="k-fed",
        n_init=2,
        solver_params=None,
        callback=None,
        random_state=None,
        n_jobs=None,
        verbose=0,
        secure_aggregation=False,
    ):
        super().__init__(n_clients=n_clients, callback=callback, random_state=random_state,
                         n_jobs=n_jobs, verbose=verbose, secure_aggregation=secure_aggregation)
        self.n_clusters = n_clusters
        self.algorithm = algorithm
        self.local_iter_u = local_iter_u
        self.local_iter_v = local_iter_v
        self.clients_per_round = clients_per_round
        self.max_iter = max_iter
        self.tol = tol
        self.init = init
        self.n_init = n_init
        self.solver_params = solver_params

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, *, clients=None):
        """Cluster the samples of ``X`` held by the clients.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The samples (the paper's clustering data are nonnegative; with negative entries
            the nonnegative-membership model is questionable and a warning is raised).
        y : Ignored
            Not used, present for API consistency by convention.
        clients : array-like of shape (n_samples,), default=None
            Client label of each sample; when None samples are split into ``n_clients``.

        Returns
        -------
        self : FederatedClustering
        """
        return self._fit(X, clients)

    def _check_fit_data(self, X, *, reset, settings):
        # this fit's solver constants, kept for predict/transform/score (the K-means mode)
        self._solver = resolve_solver_params(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=reset)
        if sp.issparse(X) and not X.has_canonical_format:  # summed on a copy, never in place
            X = X.copy()
            X.sum_duplicates()
        n_samples, n_features = X.shape
        K = self.n_clusters
        if n_samples < K:
            raise ValueError(f"n_samples={n_samples} should be >= n_clusters={K}.")
        centers = None
        if not isinstance(self.init, str):
            centers = check_array(self.init, dtype=np.float64)
            if centers.shape != (K, n_features):
                raise ValueError(f"init must have shape (n_clusters, n_features) = "
                                 f"{(K, n_features)}, got {centers.shape}.")
        # Each client sends ||X_p||^2, N_p, sum |X_p|, min and max once (five scalars).
        x_min, x_max = _value_range(X)
        sq = float(X.multiply(X).sum()) if sp.issparse(X) else float(np.vdot(X, X))
        if x_min < 0 and not self._onehot:
            warnings.warn("X has negative entries: orthogonal NMF with nonnegative memberships "
                          "is a questionable clustering model there (solver_params="
                          "{'h_constraint': 'onehot'} is K-means).", DataWarning,
                          stacklevel=5)  # the caller of fit
        return X, dict(centers=centers, x_min=x_min, x_max=x_max,
                       scale=max(sq / n_samples, EPS),  # ||X||^2 / N
                       abs_mean=float(abs(X).sum()) / (n_samples * n_features))

    def _make_blocks(self, ctx):
        blocks = [SampleBlock(np.flatnonzero(ctx.codes == p), None)
                  for p in range(ctx.n_clients)]
        return [b._replace(X=ctx.X[b.rows]) for b in blocks]

    def _penalties(self, ctx):
        """``rho`` and ``nu`` in absolute units (the parameters are relative to ||X||^2/N)."""
        if self._onehot:
            return 0.0, 0.0
        return self._solver["rho0"] * ctx.info.scale, self._solver["nu"] * ctx.info.scale

    def _secure_protocol(self, protocol, settings):
        if (settings["secure_aggregation"] is not False
                and isinstance(self.init, str) and self.init == "k-fed"):
            raise ValueError(
                'FederatedClustering cannot sum init="k-fed" securely: each client sends its '
                "local centres, which the server clusters (not a sum); set init=\"random\" or "
                "give the initial centres as an array.")
        return super()._secure_protocol(protocol, settings)

    def _make_protocol(self, ctx):
        info, K, blocks_rows = ctx.info, self.n_clusters, np.bincount(ctx.codes)
        mgs, onehot, solver = self.algorithm == "fedmgs", self._onehot, self._solver
        rho, nu = self._penalties(ctx)
        return make_protocol(
            algorithm=self.algorithm, n_features=ctx.n_features, n_clusters=K,
            n_clients=ctx.n_clients, weights=blocks_rows.astype(float) / ctx.n_rows,
            n_total=ctx.n_rows, amplitude=np.sqrt(info.abs_mean / K),
            centers=info.centers, box=None if onehot else (info.x_min, info.x_max),
            rho=rho, nu=nu, onehot=onehot, rule=RoundRule(
                local_iter_u=self.local_iter_u,
                local_iter_v=self.local_iter_v if self.local_iter_v or not mgs else 100,
                q_hat=solver["q_hat"], participation=solver["participation"],
                aggregation=solver["aggregation"]
                or ("sampled_mean" if solver["sampling"] == "weighted" else "weighted"),
                c_factor=solver["c_factor"],
                d_factor=solver["d_factor"] or (0.501 if mgs else 5.0), w_step=solver["w_step"],
                variant=solver["variant"]),
            tol=self.tol, schedule=self._sncp_schedule(ctx), sampling=solver["sampling"],
        )

    def _sncp_schedule(self, ctx):
        """The SNCP rule's settings (2.4), or None when ``rho`` stays fixed."""
        solver = self._solver
        if not solver["sncp"] or self._onehot:
            return None
        mgs = self.algorithm == "fedmgs"
        rho_tol, rho_max = solver["rho_tol"], solver["rho_max"]
        return dict(
            rho_tol=rho_tol if rho_tol is not None else (5e-5 if mgs else 1e-5),
            growth=solver["rho_growth"], force_every=solver["rho_force_every"],
            rho_max=(rho_max if rho_max is not None else (1.0 if mgs else 100.0))
            * ctx.info.scale,
        )

    def _engine_params(self, settings):
        # every round is evaluated (SNCP needs F_s); tol is SNCP's own test (after_round)
        return dict(max_iter=self.max_iter, tol=0.0, eval_every=1,
                    clients_per_round=self.clients_per_round, dropout=self._solver["dropout"])

    def _before_rounds(self, protocol, state, blocks):
        return start_rounds(protocol, state, blocks, self.n_jobs)

    def _sampling_options(self, blocks, settings):
        """The paper's weighted sampling (``solver_params["sampling"]``): i.i.d. draws with
        probabilities ``omega_p = N_p / N``."""
        if self._solver["sampling"] == "uniform":
            return {}
        return {"sampling": "weighted",
                "sampling_weights": np.array([b.n_rows for b in blocks])}

    @property
    def _onehot(self):
        """Whether this fit is the K-means formulation (``h_constraint="onehot"``)."""
        return self._solver["h_constraint"] == "onehot"

    def _run(self, protocol, blocks, ctx):
        """``n_init`` federations from spawned seeds; keep the lowest clustering cost."""
        starts = [ctx.entropy]
        kfed = isinstance(self.init, str) and self.init == "k-fed"
        if (ctx.info.centers is None or kfed) and self.n_init > 1:  # spawned seeds
            starts += [int(c.generate_state(1, np.uint64)[0])
                       for c in np.random.SeedSequence(ctx.entropy).spawn(self.n_init - 1)]
        onehot = self._onehot
        best = None
        for start in starts:
            seed_bytes = 0
            if kfed:  # each start seeds anew; the seeding's uploads count in round 1
                centers, seed_bytes = kfed_centers(blocks, self.n_clusters, start)
                ctx = replace(ctx, info=replace(ctx.info, centers=centers))
                protocol = self._make_protocol(ctx)
            state = super()._run(protocol, blocks, replace(ctx, entropy=start))
            if state.history:
                state.history[0]["bytes_uploaded"] += seed_bytes
            cost = 0.0
            if len(starts) > 1:  # one scalar per client: its samples' clustering cost
                cost = _total_cost(blocks, state.server_state["W"], onehot, protocol.secure,
                                   start, ctx)
            if best is None or cost < best[0]:
                best = (cost, state)
        return best[1]

    def _tol_met(self, history, tol):
        return bool(history) and history[-1].get("rel_change", np.inf) < self.tol

    def _collect(self, state, blocks, ctx):
        W = state.server_state["W"]
        A = np.zeros((ctx.n_rows, self.n_clusters))
        for block, client_state in zip(blocks, state.client_states):
            A[block.rows] = client_state["A"]
        self.cluster_centers_ = np.ascontiguousarray(W.T)
        self.sample_factors_ = A
        self.labels_ = np.argmax(A, axis=1)
        empty = ~(A > 0).any(axis=1)
        if empty.any():
            self.labels_[empty] = self._assign(ctx.X[empty])[0]
        self.rho_ = float(state.server_state["rho"])

    def _degenerate(self, state, blocks, ctx, history):
        if not self.cluster_centers_.any():
            return "every cluster center is zero"
        if not self.sample_factors_.any():
            return ("every membership is zero: the factor model explains nothing of X (labels_ "
                    "come from the nearest center)")
        return None

    def _assign(self, X):
        return clustering_cost(X, self.cluster_centers_.T, self._onehot)

    def predict(self, X):
        """The cluster of each sample: ``argmax_k max(0, w_k.x)^2 / ||w_k||^2``, the exact
        minimizer of ``min_{t >= 0} ||x - t w_k||^2`` (the nearest center in the K-means mode).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The samples to assign (each one on its own: what a new client computes locally).

        Returns
        -------
        labels : ndarray of shape (n_samples,)
            Index of the cluster of each sample.
        """
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        return self._assign(X)[0]

    def transform(self, X):
        """Distances of the samples to the clusters (as ``KMeans.transform``).

        Column ``k`` is ``min_{t >= 0} ||x - t w_k||``, the distance of ``x`` to the ray of
        center ``k`` (the model fits each sample as a nonnegative multiple of one center), or
        ``||x - w_k||`` in the K-means mode; ``predict`` picks the nearest one.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The samples to measure (each one on its own).

        Returns
        -------
        distances : ndarray of shape (n_samples, n_clusters)
            Distance of each sample to each cluster.
        """
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        return center_distances(X, self.cluster_centers_.T, self._onehot)

    def score(self, X, y=None):
        """Opposite of the clustering cost of ``X`` under the fitted centers (as
        ``KMeans.score``): ``-sum_j min_{k, t >= 0} ||x_j - t w_k||^2``, or
        ``-sum_j min_k ||x_j - w_k||^2`` in the K-means mode. Greater is better.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The samples to score.
        y : Ignored
            Not used, present for API consistency by convention.

        Returns
        -------
        score : float
            The negated cost (0 is a perfect fit).
        """
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        return -float(self._assign(X)[1].sum())

    @property
    def _n_features_out(self):
        return self.cluster_centers_.shape[0]


def _total_cost(blocks, W, onehot, secure, seed, ctx):
    """The clustering cost of a start, summed over the clients' costs: in the clear, or by a
    secure sum (each client's cost relative to ``||X||^2``, so within the encoding's clip)."""
    costs = [clustering_cost(b.X, W, onehot)[1].sum() for b in blocks]
    if secure is None:
        return sum(costs)
    total = ctx.info.scale * ctx.n_rows  # ||X||^2
    result = sum_securely({p: np.array([c / total]) for p, c in enumerate(costs)}, secure,
                          seed=np.random.SeedSequence(seed, spawn_key=(_COST_SUM,)))
    return float(result.sum[0]) * total


_COST_SUM = 10  # the starts' secure cost sums: their seed kind (the engine's are 0 to 7)
