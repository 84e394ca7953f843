"""FedMGS: federated matrix completion by gradient sharing (Wang & Chang, Algorithm 2).

The estimator; the algorithm, its messages and what they disclose are described in
:mod:`._fedmgs_protocol`.
"""

from __future__ import annotations

from numbers import Integral, Real

from sklearn.utils._param_validation import Interval, StrOptions

from ..._docstrings import Substitution, toy_example
from ...privacy._distributed_dp import DISTRIBUTED_DOCS, DistributedDP, DistributedDPMixin
from .._auto_strengths import AutoStrengthsMixin
from .._base import (
    COMPLETION_DOCS,
    FACTOR_SETTINGS,
    IMPLICIT_SETTINGS,
    FederatedMFBase,
    moved_to_solver_params,
)
from .._fed_baseline._fed_baseline import FedBaseline
from .._implicit import (
    IMPLICIT_SOLVER_SETTINGS,
    check_implicit_settings,
    implicit_cg_steps,
)
from ._fedmgs_implicit import make_implicit_protocol
from ._fedmgs_protocol import AUTO_WEIGHTED, denoise_aggregates, make_protocol

__all__ = ["FedMGS"]


# ---- estimator ----------------------------------------------------------------------------
@Substitution(**COMPLETION_DOCS, **DISTRIBUTED_DOCS,
              example=toy_example("FedMGS", max_iter=300, alpha=0.01, bound=0.1))
class FedMGS(DistributedDPMixin, AutoStrengthsMixin, FederatedMFBase):
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
    n_components : int or None, default=None
        %(n_components_by_loss)s
    local_iter_u : int, default=10
        Local steps ``Q1`` on the user factors per round.
    local_iter_v : int, default=1
        The server's steps ``Q2`` on ``V`` per round, each with the exact gradient rebuilt
        from the clients' aggregates (no client takes part in them).
    n_clients : int, default=10
        %(n_clients)s
    clients_per_round : int, float or None, default=None
        %(clients_per_round)s
    max_iter : int or None, default=None
        %(max_iter)s
        (One server step each.) None: 100 with ``loss="squared"``, 5 with
        ``loss="implicit"`` (each of its rounds an ALS sweep by ``cg_steps`` conjugate-gradient
        steps per row: ``implicit``'s ALS's HR@10 and NDCG@10, within 0.005 or better, on
        ml-latest-small, MovieLens 100K and the ML-1M shape, in about its fit time; the
        former 10 rounds of 3 steps gave -0.001 to +0.007 HR@10 on the two MovieLens sets,
        two held-out draws each, at twice the time).
    %(validation_parameters)s
    alpha_u, alpha_v : float or "auto", default="auto"
        Regularization strengths of the user and item factors.
        %(elastic_net)s
        ``"auto"`` (plain penalties): the server sets the
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
        Either way, with ``biased=True``, ``"auto"`` also starts the biases at their
        empirical-Bayes shrunk means, as FedMAvg's ``"auto"`` does
        (:mod:`sklearn_fedmf.completion._auto_strengths`; a few aggregates sent once).
        The values used are ``alpha_u_`` and ``alpha_v_``. Measured across data sets
        (``benchmarks/bench_defaults.py``); the papers' ``1e-6`` is in ``PAPER_SETTINGS``.
    regularization : {"plain", "weighted"}, default="plain"
        %(regularization)s
        (The shared aggregates already show which items a client rated.)
    biased : bool, default=True
        %(biased)s
    loss : {"squared", "implicit"}, default="squared"
        %(loss)s
        FedMGS under ``"implicit"`` (``_fedmgs_implicit``): each sampled client solves its
        users against ``V`` and ``V^T V`` and sends its per-item aggregates (now
        confidence-weighted) and its Gram, the paper's message; the server solves each
        item's system from the aggregates (its gradient preconditioned by its curvature).
        With the exact solves (``implicit_solver="cholesky"``) and every client sampled a
        round is one ALS sweep. ``"auto"`` strengths are ``IMPLICIT_ALPHA``; the groups of
        one client per user are not used.
    %(run_parameters)s

        - ``c_factor`` : float, default=0.51
          The U step is ``1 / (c_factor * (lambda_max(V V^T) + ridge))`` (Algorithm 2's
          steps).
        - ``d_factor`` : float, default=0.501
          The V step is ``1 / (d_factor * (lambda_max(sum_p U_p^T U_p) + ridge))``
          (Algorithm 2's steps).
        - ``sampling`` : {"uniform", "weighted"}, default="uniform"
          ``"uniform"``: distinct clients without replacement (Theorem 2's scheme).
          ``"weighted"``: i.i.d. draws with replacement, probabilities proportional to the
          clients' ratings (the paper's footnote); a client drawn twice sends its aggregates
          once and it is applied once.
        - ``implicit_solver`` : {"cg", "cholesky"}, default="cg"
          The users' and the items' solves under ``loss="implicit"``: ``"cg"``, ``cg_steps``
          conjugate-gradient steps per row from its current factor, the matrix never formed
          (Takacs, Pilaszy & Tikk 2011, as ``implicit``'s ALS); ``"cholesky"``, the exact
          solve (every round then an exact ALS sweep). The messages are the same.
        - ``cg_steps`` : int, default=4
          Conjugate-gradient steps per row with ``implicit_solver="cg"`` (4 in 5 rounds:
          with 3, ml-latest-small's NDCG@10 falls 0.004 below ALS's).
        %(solver_factor_shared)s
    %(secure_parameter)s
    %(distributed_privacy)s

    Attributes
    ----------
    %(distributed_attributes)s
    %(factor_attributes)s
    history_ : list of dict
        One record per round (round 1's bytes include every client's initial aggregates
        and, with ``"auto"`` strengths, the start's statistics).
    %(outcome_attributes)s
    %(validation_attributes)s
    alpha_u_, alpha_v_ : float
        The strengths of the last round (``"auto"``: the server's last value; fold-in uses
        ``alpha_u_``).

    See Also
    --------
    sklearn_fedmf.FedMAvg : Model averaging, the paper's first algorithm.

    References
    ----------
    %(wang_chang_2022)s

    %(example)s
    """

    _solver_params: dict = {
        **FederatedMFBase._solver_params,
        **FACTOR_SETTINGS,
        **IMPLICIT_SETTINGS,
        **IMPLICIT_SOLVER_SETTINGS,
        # CG by default here: the exact solves' HR@10 and NDCG@10 at 1.1 to 1.5 times less
        # fit time (docs/guide/implicit.rst); FedMAvg keeps "cholesky" (CG lost 0.009 HR@10)
        "implicit_solver": ("cg", IMPLICIT_SOLVER_SETTINGS["implicit_solver"][1]),
        # (and 4 steps in 5 rounds, max_iter below: ALS's fit time, issue 38)
        "cg_steps": (4, IMPLICIT_SOLVER_SETTINGS["cg_steps"][1]),
        "c_factor": (0.51, [Interval(Real, 0, None, closed="neither")]),
        "d_factor": (0.501, [Interval(Real, 0, None, closed="neither")]),
        "sampling": ("uniform", [StrOptions({"uniform", "weighted"})]),
    }
    _moved_params = moved_to_solver_params(_solver_params)
    _floor_class = FedBaseline  # the biases-only floor of a validated fit
    # what None means under each loss (FederatedMFBase._loss_default)
    _loss_defaults: dict = {"n_components": (5, 32), "max_iter": (100, 5)}
    _auto_scales = False  # (the server's rule follows the ratings' scale by itself)

    _parameter_constraints: dict = {
        **FederatedMFBase._parameter_constraints,
        "local_iter_u": [Interval(Integral, 1, None, closed="left")],
        "local_iter_v": [Interval(Integral, 1, None, closed="left")],
        "regularization": [StrOptions({"plain", "weighted"})],
        **AutoStrengthsMixin._parameter_constraints,
        "privacy": [DistributedDP, None],
    }

    def __init__(
        self,
        n_components=None,
        *,
        local_iter_u=10,
        local_iter_v=1,
        n_clients=10,
        clients_per_round=None,
        max_iter=None,
        tol=0.0,
        early_stopping="auto",
        validation_fraction=0.1,
        n_iter_no_change=10,
        alpha_u="auto",
        alpha_v="auto",
        regularization="plain",
        biased=True,
        loss="squared",
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
        super().__init__(
            n_components, alpha_u=alpha_u, alpha_v=alpha_v, biased=biased, n_clients=n_clients,
            clients_per_round=clients_per_round, max_iter=max_iter, tol=tol,
            early_stopping=early_stopping, validation_fraction=validation_fraction,
            n_iter_no_change=n_iter_no_change, clip=clip, warm_start=warm_start,
            callback=callback, random_state=random_state, n_jobs=n_jobs, verbose=verbose,
            solver_params=solver_params, loss=loss,
            secure_aggregation=secure_aggregation,
        )
        self.privacy = privacy
        self.local_iter_u = local_iter_u
        self.local_iter_v = local_iter_v
        self.regularization = regularization

    def _strengths(self):
        """``(alpha_u, alpha_v)`` for the protocol: ``"auto"`` is the server's rule with the
        plain penalties, ``AUTO_WEIGHTED`` per rating with the weighted ones (under
        ``loss="implicit"``, ``IMPLICIT_ALPHA``)."""
        auto = "auto" if self.regularization == "plain" else AUTO_WEIGHTED
        return tuple(self._loss.auto_strength(lambda: auto) if a == "auto" else a
                     for a in (self.alpha_u, self.alpha_v))

    def _implicit_protocol(self, ctx):
        """FedMGS under ``loss="implicit"`` (:mod:`._fedmgs_implicit`)."""
        alpha_u, alpha_v = self._strengths()
        settings = ctx.settings
        check_implicit_settings(self, ctx)
        return make_implicit_protocol(
            n_items=ctx.n_features, n_clients=ctx.n_clients,
            n_components=ctx.info.rank, alpha_u=alpha_u, alpha_v=alpha_v,
            confidence=ctx.info.confidence, init_scale=settings["init_scale"],
            cg_steps=implicit_cg_steps(settings))

    def _squared_protocol(self, ctx):
        """FedMGS on ratings (:mod:`._fedmgs_protocol`)."""
        alpha_u, alpha_v = self._strengths()
        auto = "auto" in (alpha_u, alpha_v)
        if ctx.warm and auto != ("ss" in self._federation.server_state):
            raise ValueError("warm_start cannot switch alpha_u or alpha_v between 'auto' and a "
                             "fixed strength; fit again without warm_start.")
        settings = ctx.settings
        item_bias, user_shrinkage = self._bias_start(ctx)
        return make_protocol(
            n_items=ctx.n_features, n_clients=ctx.n_clients, n_components=ctx.info.rank,
            local_iter_u=self.local_iter_u, local_iter_v=self.local_iter_v,
            c_factor=settings["c_factor"], d_factor=settings["d_factor"],
            alpha_u=alpha_u, alpha_v=alpha_v, l1_ratio=settings["l1_ratio"],
            positive=settings["positive"], init_scale=settings["init_scale"], biased=self._biased,
            weighted=self.regularization == "weighted", n_ratings=ctx.info.n_ratings,
            item_bias=item_bias, user_shrinkage=user_shrinkage,
            rating_rms=None if item_bias is None else self._auto(ctx)["rms"],
        )

    _protocols = {"squared": _squared_protocol, "implicit": _implicit_protocol}

    @staticmethod
    def _ddp_denoise(sums):
        """Noisy sums (``privacy=DistributedDP``) made usable: each item's Gram block and the
        Gram sum positive semidefinite, the sum of squares positive."""
        return denoise_aggregates(sums)

    def _collect(self, state, blocks, ctx):
        super()._collect(state, blocks, ctx)
        alpha = state.server_state.get("alpha")  # (implicit: none, and no "auto" strength)
        self.alpha_u_, self.alpha_v_ = (alpha if a == "auto" else a for a in self._strengths())

