"""FedMAvg: federated model averaging for matrix completion (Wang & Chang, Algorithm 1).

The estimator and :func:`make_protocol`, which binds the completion family's steps
(:mod:`._fedmavg_protocol`) into FedMAvg's round
(:mod:`sklearn_fedmf.completion._fedmavg._fedmavg_round`) and, for many small clients, the batched
phases (:mod:`._fedmavg_batched`). The binding sits here, above both, so that the batched phases can
build on the per-client functions without an import cycle.
"""

from __future__ import annotations

from functools import partial
from numbers import Integral, Real

from sklearn.utils._param_validation import Interval, StrOptions

from ..._docstrings import Substitution, toy_example
from ...engine._federation import FederatedProtocol
from ...privacy._distributed_dp import (
    DISTRIBUTED_DOCS,
    DistributedDP,
    DistributedDPMixin,
    psd_project,
)
from .._auto_strengths import BIAS_START_PASSES, AutoStrengthsMixin, variant_bias_settings
from .._base import (
    COMPLETION_DOCS,
    FACTOR_SETTINGS,
    IMPLICIT_SETTINGS,
    FederatedMFBase,
    moved_to_solver_params,
)
from .._fed_baseline._fed_baseline import FedBaseline
from .._implicit import IMPLICIT_SOLVER_SETTINGS, check_implicit_settings, implicit_cg_steps
from ._fedmavg_batched import make_batched
from ._fedmavg_implicit import make_implicit_protocol
from ._fedmavg_protocol import (
    client_metrics,
    combine_metrics,
    init_client,
    init_server,
    kept_state,
    palm_state,
    palm_u_step,
    palm_w_step,
    secure_server_prepare,
    server_from_mean,
    server_init_uploads,
    server_prepare,
    server_update,
    state_gram,
    u_phase,
    w_phase,
)
from ._fedmavg_round import (
    RoundRule,
    check_aggregation,
    q2_schedule,
    round_phases,
    sampled_prepare,
)

__all__ = ["FedMAvg"]


def make_protocol(*, n_items, n_clients, n_components, rule, client_weights, alpha_u, alpha_v,
                  l1_ratio, positive, init_scale, biased=False, weighted=False, item_bias=None,
                  user_shrinkage=None, bias_shrinkages=None):
    """Bind the hyperparameters to the pure functions (``rule``: the rounds'
    :class:`~sklearn_fedmf.completion._fedmavg._fedmavg_round.RoundRule`; ``biased``: rank
    ``n_components + 2`` with the augmented factors of ``_biases``; ``weighted``: each row's
    penalty scaled by its number of ratings; ``item_bias``, ``user_shrinkage``: the biases'
    start of the ``"auto"`` strengths, :mod:`._auto_strengths`; ``bias_shrinkages``:
    ``(lambda_u, lambda_i)``, the ridges of ``b_u`` and ``b_i`` when they are not the
    factors' strengths, ``variant="fedmc_admm"`` under ``"auto"``)."""
    (local_iter_u, local_iter_v, q_hat, participation, aggregation, c_factor, d_factor, w_step,
     variant) = rule
    prepared = variant == "wang_chang" and w_step in ("global", "guarded")
    u_params = dict(variant=variant, c_factor=c_factor, alpha_u=alpha_u, l1_ratio=l1_ratio,
                    positive=positive, local_iter_u=local_iter_u, client_weights=client_weights,
                    biased=biased, weighted=weighted)
    w_params = dict(variant=variant, n_clients=n_clients, d_factor=d_factor, w_step=w_step,
                    alpha_v=alpha_v, l1_ratio=l1_ratio, positive=positive, biased=biased,
                    weighted=weighted)
    if bias_shrinkages is not None:  # (the batched kernels hold one ridge: run per client)
        u_params["user_shrinkage"], w_params["item_shrinkage"] = bias_shrinkages
    q2_first = q2_schedule(1, local_iter_v, q_hat)
    palm = None
    if variant == "fedpalm":
        if weighted:
            raise ValueError('variant="fedpalm" is the paper\'s Remark 1 baseline; set '
                             'regularization="plain".')
        if biased:
            raise ValueError('variant="fedpalm" is the paper\'s Remark 1 baseline on plain '
                             "factors; set biased=False.")
        palm = dict(n_pairs=local_iter_u, factor="U", shared="Vt", finish=palm_state,
                    local_step=partial(palm_u_step, c_factor=c_factor, alpha_u=alpha_u,
                                       l1_ratio=l1_ratio, positive=positive),
                    proximal_step=partial(palm_w_step, d_factor=d_factor, alpha_v=alpha_v,
                                          l1_ratio=l1_ratio, positive=positive,
                                          client_weights=client_weights))
    batched = None  # FedPALM's pairs and the weighted ridges (one per item) run per client
    if variant != "fedpalm" and not weighted and bias_shrinkages is None:
        batched = make_batched(prepared=prepared, u_params=u_params, w_params=w_params,
                               init_params=dict(init_scale=init_scale, positive=positive,
                                                client_weights=client_weights,
                                                send_gram=prepared,
                                                user_shrinkage=user_shrinkage),
                               alpha_u=alpha_u, l1_ratio=l1_ratio, biased=biased)
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items, n_components=n_components,
                            init_scale=init_scale, biased=biased, item_bias=item_bias),
        init_client=partial(init_client, init_scale=init_scale, positive=positive,
                            client_weights=client_weights, send_gram=prepared, biased=biased,
                            weighted=weighted, user_shrinkage=user_shrinkage),
        server_init_uploads=partial(server_init_uploads, n_clients=n_clients,
                                    q2_first=q2_first),
        **round_phases(
            participation=participation, prepared=prepared,
            local_phase=partial(u_phase, **u_params), w_phase=partial(w_phase, **w_params),
            keep=kept_state, gram=partial(state_gram, biased=biased),
            server_prepare=partial(server_prepare, d_factor=d_factor,
                                   alpha_v=0.0 if weighted else alpha_v,  # (a prox's share)
                                   l1_ratio=l1_ratio, biased=biased),
            server_update=partial(server_update, aggregation=aggregation,
                                  local_iter_v=local_iter_v, q_hat=q_hat, biased=biased),
            palm=palm, aggregation=aggregation,
            # (the weighted regularization's item counts are sent once per client: refused)
            secure_update=None if weighted else partial(
                server_from_mean, local_iter_v=local_iter_v, q_hat=q_hat, biased=biased),
            secure_prepare=partial(secure_server_prepare, d_factor=d_factor,
                                   alpha_v=0.0 if weighted else alpha_v,
                                   l1_ratio=l1_ratio, biased=biased)),
        client_metrics=partial(client_metrics, alpha_u=alpha_u, l1_ratio=l1_ratio,
                               biased=biased, alpha_v=alpha_v, weighted=weighted,
                               **_only_set(user_shrinkage=u_params.get("user_shrinkage"))),
        combine_metrics=partial(combine_metrics, alpha_v=alpha_v, l1_ratio=l1_ratio,
                                biased=biased, weighted=weighted,
                                **_only_set(item_shrinkage=w_params.get("item_shrinkage")),
                                loss_scale=1.0 / n_clients if variant == "fedmc_admm" else 1.0),
        batched=batched,
    )


def _only_set(**kwargs):
    """The keyword arguments that are not None (a rule's extra settings, absent otherwise)."""
    return {key: value for key, value in kwargs.items() if value is not None}


# ---- estimator ----------------------------------------------------------------------------
@Substitution(**COMPLETION_DOCS, **DISTRIBUTED_DOCS,
              example=toy_example("FedMAvg", max_iter=300, alpha=0.01, bound=0.1))
class FedMAvg(DistributedDPMixin, AutoStrengthsMixin, FederatedMFBase):
    """Federated matrix completion by model averaging (FedMAvg, Wang & Chang).

    Each client owns a block of rows (users). In a round every client (partial client
    *communication*, the default) or only the sampled ones take ``local_iter_u``
    proximal-gradient steps on their private user factors ``U_p`` against the broadcast item
    factor ``V``; each of the ``clients_per_round`` sampled clients then takes ``Q2`` gradient
    steps on its own copy of ``V`` and uploads it; the server averages the copies. ``U_p``
    and the ratings never leave a client. (The paper writes ``W`` for ``V`` and ``H^T`` for
    ``U``.)

    Parameters
    ----------
    n_components : int or None, default=None
        %(n_components_by_loss)s
    local_iter_u : int, default=10
        Local steps ``Q1`` on the user factors per round (``"fedpalm"``: U/W step pairs).
    local_iter_v : int or None, default=None
        Local steps ``Q2`` on the item-factor copy. None means the variant's schedule: the
        diminishing ``Q2^s = floor(q_hat / s) + 1`` (``"wang_chang"``, under either loss) or
        10. (Under ``loss="implicit"`` a constant ``Q2 > 1`` lets the clients' copies drift
        towards their own minimizers: the objective rose after about 12 rounds at ``Q2 =
        5`` on the embedded MovieLens; with the schedule it decreases every round.)
    n_clients : int, default=10
        %(n_clients)s
    clients_per_round : int, float or None, default=None
        %(clients_per_round)s
        (The paper's ``m``; see ``solver_params["sampling"]``.)
    max_iter : int or None, default=None
        %(max_iter)s
        None: 100 with ``loss="squared"``, 30 with ``loss="implicit"``.
    %(validation_parameters)s
    alpha_u, alpha_v : float or "auto", default="auto"
        Regularization strengths of the user and item factors.
        %(elastic_net)s
        The l2 part is smooth (in the gradient), the l1 part and ``positive`` act as a prox
        at every local step. ``"auto"`` (either): the fit runs on the centred ratings divided
        by their root mean square ``s`` and scales the model back; ``alpha_u = alpha_v =
        0.5 (sqrt(sum_u n_u^2 / n) + sqrt(sum_j n_j^2 / n))`` there (``n_u``, ``n_j``: the
        ratings of user ``u`` and item ``j``; ``n`` their total), a threshold on the
        singular values of the factor part that grows with the rating pattern's noise,
        heavy users and items included; with ``biased=True`` (and both ``"auto"``, plain)
        the biases start at the biases-only model of their empirical-Bayes shrinkages
        (``"fedmc_admm"``: and keep those shrinkages as their ridges)
        (:mod:`sklearn_fedmf.completion._auto_strengths`; each client sends a few aggregates
        once, listed in the privacy guide). ``variant="fedmc_admm"`` keeps the
        ratings-per-row rule ``alpha_u = 2 sqrt(n_ratings / n_users)``, ``alpha_v = 2
        n_ratings / n_items``, divided by ``p`` as its objective divides the data term. A
        fixed value of the other strength is used as given (on the scaled ratings). The
        values used are
        ``alpha_u_`` and ``alpha_v_``. Measured across data sets (user guide, "Defaults");
        the papers' ``1e-6`` is in ``PAPER_SETTINGS``.
    regularization : {"plain", "weighted"}, default="plain"
        %(regularization)s
        The server broadcasts the counts' sum ``n_j`` with ``V`` (one more float per item in
        ``bytes_downloaded``).
    biased : bool, default=True
        %(biased)s
    loss : {"squared", "implicit"}, default="squared"
        %(loss)s
        FedMAvg under ``"implicit"`` (``_fedmavg_implicit``): each client solves its users
        against ``V`` and ``V^T V`` (``implicit_solver``); each sampled client takes ``Q2``
        gradient steps on its copy ``W_p`` of ``V`` (its own part of the weighted objective,
        the all-items term through its Gram ``U_p^T U_p``, one step ``1/(d_factor L_j)`` per
        item row) and uploads it; the server averages. ``variant="wang_chang"`` only;
        ``w_step`` does not apply; the groups of one client per user are not used.
    %(run_parameters)s

        - ``variant`` : {"wang_chang", "fedpalm", "fedmc_admm"}, default="wang_chang"
          ``"wang_chang"``: the paper's algorithm on the sum of squared errors, steps as
          factors of Lipschitz bounds (Algorithm 1). ``"fedpalm"``: the paper's Remark 1
          baseline (Fig. 2b): each client interleaves ``local_iter_u`` pairs of one U step at
          its current copy ``W_p`` and one proximal W step at the new ``U_p`` (``Q = 2
          local_iter_u``; steps ``1/(c_factor L_U(W_p))`` and ``1/(d_factor L_Wp(U_p))``);
          ``local_iter_v``, ``q_hat`` and ``w_step`` do not apply. ``"fedmc_admm"``: the
          baseline as restated in the FedMC-ADMM paper (objective ``(1/p) sum_i [f_i + R_i]
          + R(V)``, W gradient divided by ``p``, ``d_i = d_factor lambda_max(U_i^T U_i)``,
          ``c = c_factor lambda_max(V V^T)``, plain mean of the uploads, ``Q1 = Q2 = 10``).
        - ``q_hat`` : int, default=5
          ``Q_hat`` of the diminishing schedule (only when ``local_iter_v`` is None).
        - ``participation`` : {"pcc", "pcp"}, default="pcc"
          ``"pcc"``: every client updates ``U_p`` every round and only the sampled ones
          upload (partial client communication; the broadcast reaches all; under secure
          aggregation and uniform sampling the global step reads the sampled clients'
          Grams only: the latest of each client that has sent one, scaled to all). ``"pcp"``: only
          the sampled clients compute (partial participation, the paper's Fig. 2a baseline).
        - ``aggregation`` : {"weighted", "sampled_mean"} or None, default=None
          ``"weighted"``: ``sum omega_p W_p / sum omega_p`` over the received copies (eq. (8)
          at full participation); ``"sampled_mean"``: their plain mean, a client counted once
          per draw. None: ``"weighted"`` for ``"wang_chang"`` with uniform sampling,
          ``"sampled_mean"`` otherwise. ``"weighted"`` with ``sampling="weighted"`` is
          refused (it would weigh by ``omega`` twice).
        - ``c_factor`` : float or None, default=None
          The U step is ``1 / (c_factor * L_U)`` with ``L_U = lambda_max(V V^T) + ridge``
          (``"wang_chang"``, default 0.51) or ``lambda_max(V V^T)`` (``"fedmc_admm"``, 0.5).
        - ``d_factor`` : float or None, default=None
          The W step is ``1 / (d_factor * L_W)`` (see ``w_step``). None: 5.0, or 0.6 under
          ``loss="implicit"`` (its per-item bounds are tight; measured).
        - ``w_step`` : {"global", "local", "guarded"} or None, default=None
          ``L_W`` of the W step (``"wang_chang"``): ``"global"`` uses ``lambda_max(sum_p
          U_p^T U_p) + ridge`` of this round (clients send their ``r x r`` Gram in a first
          exchange), ``"local"`` the client's own ``lambda_max(U_p^T U_p) / omega_p +
          ridge``, ``"guarded"`` the global step but never above ``1/(0.51 L_Wp)`` (a
          stability guard; the paper's theory assumes the global constant). None:
          ``"guarded"``, which equals ``"global"`` while no client's local curvature exceeds
          the global one (100 clients of MovieLens: the same model) and keeps small, unlike
          clients stable (one client per user on the ML-1M shape: ``"global"`` ends 20
          rounds at train RMSE 17.5, ``"guarded"`` at 0.92). The ``"fedmc_admm"`` variant
          always uses its local ``d_i``.
        - ``client_weights`` : {"entries", "rows"}, default="entries"
          ``omega_p`` proportional to the client's observed ratings or to its rows (the
          paper's ``N_p / N``).
        - ``sampling`` : {"uniform", "weighted"}, default="uniform"
          ``"uniform"``: distinct clients without replacement. ``"weighted"``: the paper's
          i.i.d. draws with replacement, probabilities ``omega_p`` (``client_weights``); a
          client drawn twice uploads once and counts twice in the mean (``history_`` then
          also has ``bytes_uploaded_draws``, the paper's count of one upload per draw).
        - ``implicit_solver`` : {"cg", "cholesky"}, default="cholesky"
          The users' solves under ``loss="implicit"``: ``"cg"``, ``cg_steps``
          conjugate-gradient steps per user from its current factor, the matrix never formed
          (Takacs, Pilaszy & Tikk 2011, as ``implicit``'s ALS); ``"cholesky"``, the exact
          solve.
        - ``cg_steps`` : int, default=3
          Conjugate-gradient steps per user with ``implicit_solver="cg"``.
        %(solver_factor_shared)s
    %(secure_parameter)s
    %(distributed_privacy)s

    Attributes
    ----------
    %(distributed_attributes)s
    %(factor_attributes)s
    history_ : list of dict
        One record per round: ``objective``, ``train_rmse``, ``eval_rmse``, bytes (the
        one-time sizes and, for the global step, Grams are in round 1), ``seconds``...
    %(outcome_attributes)s
    %(validation_attributes)s
    alpha_u_, alpha_v_ : float
        The strengths used (``"auto"`` resolved, on the scaled ratings).

    See Also
    --------
    sklearn_fedmf.FedMGS : Gradient sharing, the paper's second algorithm.
    sklearn_fedmf.FedMCADMM : Linearized ADMM, which the FedMC-ADMM paper compares with this.

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
        "init_scale": (1.0, FACTOR_SETTINGS["init_scale"][1]),
        "variant": ("wang_chang", [StrOptions({"wang_chang", "fedpalm", "fedmc_admm"})]),
        "q_hat": (5, [Interval(Integral, 0, None, closed="left")]),
        "participation": ("pcc", [StrOptions({"pcc", "pcp"})]),
        "aggregation": (None, [StrOptions({"weighted", "sampled_mean"}), None]),
        "c_factor": (None, [Interval(Real, 0, None, closed="neither"), None]),
        "d_factor": (None, [Interval(Real, 0, None, closed="neither"), None]),
        "w_step": (None, [StrOptions({"global", "local", "guarded"}), None]),
        "client_weights": ("entries", [StrOptions({"entries", "rows"})]),
        "sampling": ("uniform", [StrOptions({"uniform", "weighted"})]),
    }
    _moved_params = moved_to_solver_params(_solver_params)
    _floor_class = FedBaseline  # the biases-only floor of a validated fit
    # what None means under each loss (FederatedMFBase._loss_default); d_factor and
    # local_iter_v: the W steps of "implicit" (_fedmavg_implicit)
    _loss_defaults: dict = {"n_components": (5, 32), "max_iter": (100, 30),
                            "d_factor": (5.0, 0.6), "local_iter_v": (None, None)}

    _parameter_constraints: dict = {
        **FederatedMFBase._parameter_constraints,
        "local_iter_u": [Interval(Integral, 1, None, closed="left")],
        "local_iter_v": [Interval(Integral, 1, None, closed="left"), None],
        "regularization": [StrOptions({"plain", "weighted"})],
        **AutoStrengthsMixin._parameter_constraints,
        "privacy": [DistributedDP, None],
    }

    def __init__(
        self,
        n_components=None,
        *,
        local_iter_u=10,
        local_iter_v=None,
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

    def _checked_settings(self, ctx):
        """The fit's settings, the variant's and the aggregation's checked, with the
        ``d_factor`` of the loss when None."""
        settings = ctx.settings
        variant, w_step = settings["variant"], settings["w_step"]
        if variant != "wang_chang" and w_step not in (None, "local"):
            raise ValueError(
                f'variant="{variant}" uses its own local step d_i; w_step={w_step!r} '
                'needs variant="wang_chang".'
            )
        check_aggregation(settings["aggregation"], settings["sampling"])
        return {**settings, "d_factor": settings["d_factor"]
                or self._loss.pick(self._loss_defaults["d_factor"])}

    def _implicit_protocol(self, ctx):
        """FedMAvg under ``loss="implicit"`` (:mod:`._fedmavg_implicit`)."""
        settings = self._checked_settings(ctx)
        variant, sampling = settings["variant"], settings["sampling"]
        alpha_u, alpha_v = self._strengths(ctx)
        check_implicit_settings(self, ctx)
        q2 = self._loss_default("local_iter_v")
        if variant != "wang_chang":
            raise ValueError(f'loss="implicit" runs variant="wang_chang"; variant='
                             f'"{variant}" is a baseline of the ratings\' papers.')
        return make_implicit_protocol(
            n_items=ctx.n_features, n_clients=ctx.n_clients,
            n_components=ctx.info.rank, local_iter_v=q2,
            q_hat=settings["q_hat"], q2_first=q2_schedule(1, q2, settings["q_hat"]),
            participation=settings["participation"],
            aggregation=settings["aggregation"]
            or ("sampled_mean" if sampling == "weighted" else "weighted"),
            d_factor=settings["d_factor"], client_weights=settings["client_weights"],
            alpha_u=alpha_u, alpha_v=alpha_v,
            confidence=ctx.info.confidence, init_scale=settings["init_scale"],
            cg_steps=implicit_cg_steps(settings))

    def _squared_protocol(self, ctx):
        """FedMAvg on ratings (:mod:`._fedmavg_protocol`)."""
        settings = self._checked_settings(ctx)
        variant, w_step, sampling = settings["variant"], settings["w_step"], settings["sampling"]
        paper = variant == "fedmc_admm"
        d_factor = settings["d_factor"]
        alpha_u, alpha_v = self._strengths(ctx)
        item_bias, user_shrinkage = self._bias_start(ctx)
        shrinkages = None
        if self._bias_start_passes(settings):  # (biased, plain, "auto": the biases-only start)
            shrinkages, item_bias = variant_bias_settings(self._auto(ctx), ctx.X, item_bias)
            if not paper:  # the factors' strengths on the biases: the batched kernels hold
                shrinkages = None  # one ridge (with their own, 11 to 14x slower at one
                # client per user on MovieLens 100K; test RMSE within 0.004 either way)
        return make_protocol(
            n_items=ctx.n_features, n_clients=ctx.n_clients, n_components=ctx.info.rank,
            rule=RoundRule(
                variant=variant, local_iter_u=self.local_iter_u,
                local_iter_v=self.local_iter_v if self.local_iter_v or not paper else 10,
                q_hat=settings["q_hat"], participation=settings["participation"],
                aggregation=settings["aggregation"]
                or ("sampled_mean" if paper or sampling == "weighted" else "weighted"),
                c_factor=settings["c_factor"] or (0.5 if paper else 0.51),
                d_factor=d_factor,
                w_step=w_step or ("guarded" if variant == "wang_chang" else "local")),
            client_weights=settings["client_weights"], alpha_u=alpha_u,
            alpha_v=alpha_v, l1_ratio=settings["l1_ratio"], positive=settings["positive"],
            init_scale=settings["init_scale"],
            biased=self._biased, weighted=self.regularization == "weighted",
            item_bias=item_bias, user_shrinkage=user_shrinkage, bias_shrinkages=shrinkages,
        )

    _protocols = {"squared": _squared_protocol, "implicit": _implicit_protocol}

    def _bias_start_passes(self, settings):
        """``BIAS_START_PASSES`` of :func:`variant_bias_settings` when :meth:`_make_protocol`
        runs them (biased, plain, both strengths ``"auto"``; not ``"fedpalm"``, which has no
        biases), else 0."""
        if (settings["variant"] != "fedpalm" and self._biased  # (implicit: unbiased)
                and self.regularization == "plain" and self.alpha_u == self.alpha_v == "auto"):
            return BIAS_START_PASSES
        return 0

    def _auto_rule(self, settings):
        """``"degrees"`` (:func:`~._auto_strengths.degree_strengths`), except the paper-variant
        ``"fedmc_admm"``, which keeps the ratings-per-row rule it was measured with."""
        return "rows" if settings["variant"] == "fedmc_admm" else "degrees"

    def _strengths(self, ctx):
        """``(alpha_u, alpha_v)`` of the protocol (``"auto"``: :mod:`._auto_strengths`; the
        weighted regularization's strength is per rating, so its rule divides by the mean
        row's ratings)."""
        alpha_u = self._strength("alpha_u", ctx, self.alpha_u)
        alpha_v = self._strength("alpha_v", ctx, self.alpha_v)
        auto = self._auto(ctx)
        if self.regularization == "weighted" and auto is not None:
            n = ctx.info.n_ratings
            alpha_u = alpha_u * auto["n_users"] / n if self.alpha_u == "auto" else alpha_u
            alpha_v = alpha_v * auto["n_items"] / n if self.alpha_v == "auto" else alpha_v
        elif self.alpha_v == "auto" and ctx.settings["variant"] == "fedmc_admm":
            alpha_v /= ctx.n_clients  # (its objective divides the data term, not h(V), by p)
        return alpha_u, alpha_v

    _ddp_uniform_weights = True  # DistributedDP: the plain mean of the updates (clip: units of V)

    @staticmethod
    def _ddp_denoise(sums):
        """A noisy Gram sum (``privacy=DistributedDP``) made positive semidefinite: the step
        bound ``d`` of a round comes from its largest eigenvalue."""
        return {**sums, "gram": psd_project(sums["gram"])} if "gram" in sums else sums

    def _collect(self, state, blocks, ctx):
        super()._collect(state, blocks, ctx)
        self.alpha_u_, self.alpha_v_ = self._strengths(ctx)

    def _secure_protocol(self, protocol, settings):
        """Under secure aggregation, ``"pcc"`` and uniform sampling, the prepare phase's Grams
        come from the sampled clients only
        (:func:`~sklearn_fedmf.completion._fedmavg._fedmavg_round.sampled_prepare`); ``"pcp"``'s
        running sum is already over the sampled clients."""
        protocol = super()._secure_protocol(protocol, settings)
        if protocol.secure is None or settings["participation"] != "pcc" or (
                settings["sampling"] != "uniform"):
            return protocol
        return sampled_prepare(protocol)

    def _client_weights(self, nnz, n_rows, settings):
        return nnz if settings["client_weights"] == "entries" else n_rows
