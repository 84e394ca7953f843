"""FedMC-ADMM: linearized ADMM for federated matrix completion (Hytla et al., Algorithm 1).

Objective (the paper's (1); ``p`` clients, ``f_i = 1/2 ||P_Omega_i(M_i - U_i V)||^2``)::

    F(U, V) = (1/p) sum_i [f_i(U_i, V) + R_i(U_i)] + R(V)

The 1/p multiplies the data term and ``R_i`` but not ``R(V)``: against a plain sum of squared
errors, ``alpha_v`` acts ``p`` times stronger than in centralized MF. The protocol's pure
functions are in :mod:`._fedmc_admm_protocol`.
"""

from __future__ import annotations

import os
from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from ... import _biases
from ..._docstrings import Substitution, toy_example
from ...engine._federation import _n_sampled
from ...engine._groups import ClientGroup
from .._auto_strengths import AutoStrengthsMixin
from .._base import (
    COMPLETION_DOCS,
    FACTOR_SETTINGS,
    IMPLICIT_SETTINGS,
    FederatedMFBase,
    moved_to_solver_params,
)
from .._fed_baseline._fed_baseline import FedBaseline
from ._fedmc_admm_implicit import AUTO_BETA_IMPLICIT, implicit_initial_curvature
from ._fedmc_admm_protocol import (
    AUTO_BETA,
    AUTO_ITEM_ADMM,
    initial_curvature,
    make_implicit_protocol,
    make_protocol,
)

__all__ = ["FedMCADMM"]


def _available_memory():
    """Bytes of memory available to this process now: psutil's estimate when installed, else
    the kernel's ``MemAvailable``, else the physical memory (``os.sysconf``)."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def state_nbytes(*, n_clients, n_items, n_factors, itemsize, grouped, nnz=0, max_iter=0,
                 exact=False, round_fraction=1.0, cache_rows=False):
    """Bytes of FedMC-ADMM's item-side state, estimated before a fit.

    One block per client: every client's dense ``W_i`` and ``Y_i`` and the server's ``Z_i``,
    ``3 p n r`` numbers. Grouped clients (:mod:`._fedmc_admm_batched`): ``W_i``, ``Y_i`` on
    the rated rows, the server's ``Z_i`` there (with their item indices, and the clients'
    positions) and a round's deviations (``round_fraction`` of the ratings: the sampled
    clients'), where the linearized round writes them in place
    (the ``exact`` one appends them to arrays of up to twice their size), and the broadcast
    history with its Gram blocks (allocated by doubling: up to twice ``max_iter + 1``
    broadcasts of ``n r`` numbers and their square of ``r x r`` float64 blocks);
    ``cache_rows``: with the combinations' values on the rated rows (two float64 a factor,
    as ``W_i``, ``Y_i`` are appended).
    """
    if grouped:
        per_factor = (4 if exact else 2) * (itemsize + 8 * cache_rows) + 8 + 8 * round_fraction
        rated = int(nnz * (n_factors * per_factor + 12))
        capacity = 2 * (max_iter + 1)
        return (rated + capacity * n_items * n_factors * itemsize
                + capacity**2 * n_factors**2 * 8)
    return 3 * n_clients * n_items * n_factors * itemsize


def _protocol_caches_rows(protocol):
    """Whether ``protocol``'s batched phases start states that hold the combinations'
    values on the rated rows (``make_batched``'s ``cache_rows``)."""
    batched = getattr(protocol, "batched", None)
    init = getattr(batched, "init_client", None)
    return bool(getattr(init, "keywords", {}).get("cache_rows", False))


# ---- estimator ----------------------------------------------------------------------------
@Substitution(**COMPLETION_DOCS,
              example=toy_example("FedMCADMM", max_iter=200, alpha=0.1, bound=0.05))
class FedMCADMM(AutoStrengthsMixin, FederatedMFBase):
    """Federated matrix completion by linearized ADMM (FedMC-ADMM).

    Each client owns a block of rows (users). In a round, ``clients_per_round`` sampled
    clients run ``local_iter`` proximal-gradient steps on their private user factors ``U_i``,
    ``local_iter`` linearized steps on their copy ``W_i`` of the item factor, and a dual step,
    then upload ``(W_i, Y_i)``; the server sets ``V`` to the proximal point of the average of
    ``W_i + Y_i / beta`` over all clients. ``U_i`` and the ratings never leave a client.

    Parameters
    ----------
    n_components : int, default=5
        %(n_components)s
    beta : float or "auto", default="auto"
        ADMM penalty. Large values slow the global factor down (each round moves ``V`` by about
        a gradient step of size ``1/(p*beta)``); small values slow consensus. ``"auto"`` is
        ``b0``, the W step's curvature at a client's rated item column at the start: ``(1/p)``
        times the raters of the column (``lambda / (1 - exp(-lambda))`` with ``lambda`` the
        training ratings per client and item) times a row's ``E||u_t^0||^2`` (``r
        init_scale^2 / 3``, plus 1 for the ones column with biases). It depends on the data's
        shape, not on the number of users per client. Measured under the paper protocol on
        MovieLens latest-small and on synthetic ratings at the ML-1M shape, ``b0`` is the best
        multiple (0.3 and 3 times lose up to 0.09 RMSE), and the paper's low-rank recovery holds
        from 0.3 to 3 times (``benchmarks/bench_beta.py``). The value used is ``beta_``.
    local_iter : int, default=100
        Local steps ``N`` of the U loop and of the W loop in each round. The paper uses up to
        30 (``PAPER_SETTINGS``: 10). With ``beta`` near the curvature of a rated column, a W
        step keeps a fraction ``L_U / (L_U + p beta)`` of the distance to its solution, and the
        U loop's step ``1/||W_i W_i^T||_F`` counts every item: 10 steps leave both far from
        their solutions at 10 % participation, and the fits stall near the biases-only model
        (``benchmarks/bench_defaults.py``; the steps' cost is small next to a round's messages).
    n_clients : int, default=10
        %(n_clients)s
    clients_per_round : int, float or None, default=None
        %(clients_per_round)s
        (Sampled uniformly, without replacement.)
    max_iter : int, default=100
        %(max_iter)s
    %(validation_parameters)s
    alpha_u, alpha_v : float or "auto", default="auto"
        Regularization strengths of the user factors (``lambda``) and of the item factor
        (``gamma``).
        %(elastic_net)s
        ``R(V)`` is not divided by ``p``: against a centralized ridge, ``alpha_v`` weighs
        ``p`` times more (0.1 at ``p = 100`` is a centralized 10). ``"auto"`` (either): the
        fit runs on the centred ratings divided by their root mean square ``s`` and scales
        the model back; there ``alpha_u = 2 sqrt(n_ratings / n_users)`` and ``alpha_v = 0.3
        n_ratings / (n_items p)`` (the strengths per rating follow the rows' ratings; the
        ``1/p`` undoes the weight above; FedMAvg's 2 per rating stalls the factor part of
        ADMM on low-rank data); with ``biased=True`` the biases start at their
        empirical-Bayes shrunk means (:mod:`sklearn_fedmf.completion._auto_strengths`; each
        client sends a few aggregates once, listed in the privacy guide). A fixed value of the other
        strength is used as given (on the scaled ratings). The values used are ``alpha_u_``
        and ``alpha_v_``. Measured across data sets (user guide, "Defaults"); the papers'
        ``1e-6`` is in ``PAPER_SETTINGS``.
    regularization : {"plain", "weighted"}, default="plain"
        %(regularization)s
        With ``"weighted"``, ``R(V)`` sits inside the ``1/p`` like the data it weighs (so
        both strengths are on the same scale as in the other estimators).
    biased : bool, default=True
        %(biased)s
        Inside Algorithm 1 unchanged (derivation in the user guide, "Biases"); the biases
        are regularized by ``alpha_u`` and ``alpha_v``.
    loss : {"squared", "implicit"}, default="squared"
        %(loss)s
        Algorithm 1 keeps its steps on the weighted objective (derivation in
        ``_fedmc_admm_implicit``); ``beta="auto"`` is then 10 times the weighted
        curvature at the start (measured on MovieLens latest-small). The
        simulation holds every client's dense ``W_i``, ``Y_i`` (no grouped phases).
        ``history_``'s ``train_rmse`` and ``eval_rmse`` are then the errors of the
        preference 1 at the stored entries.
    %(run_parameters)s

        - ``w_update`` : {"linearized", "exact"}, default="linearized"
          The paper's linearized W loop, or the exact per-column solve of Remark 4.1.
        - ``init_scale`` : float, default=0.1
          Factors start i.i.d. ``init_scale * Uniform[0, 1)`` (0 starts them at the zero
          saddle, where they stay: with ``biased=True`` only the biases are then fitted). The
          paper's ``Uniform[0, 1)`` (1.0, in ``PAPER_SETTINGS``) starts ``U V`` at a mean of
          ``r / 4``, which partial participation takes many rounds to unlearn on centred ratings.
        - ``dual_init`` : {"paper", "zeros"}, default="paper"
          ``Y_i^0 = -(1/p) grad_V f_i(U_i^0, V^0)`` (uploaded once by every client) or zero.
        - ``cache_rows`` : "auto" or bool, default="auto"
          Clients run in groups (many clients): hold each client's combinations' values on
          its rated rows (``2 r`` float64 numbers a rating) or make them when a round reads
          them (the same model, bit for bit; each evaluated round's metric then costs more).
          ``"auto"`` holds them while that state takes at most half of the available memory.
        %(solver_confidence)s
        %(solver_l1_ratio)s
        %(solver_positive)s
        %(solver_shared)s
    %(secure_parameter)s

    Attributes
    ----------
    alpha_u_, alpha_v_ : float
        The strengths used (``"auto"`` resolved, on the scaled ratings).
    beta_ : float
        The ADMM penalty used.
    %(factor_attributes)s
    history_ : list of dict
        One record per round: ``round``, ``objective``, ``train_rmse``, ``eval_rmse`` (with
        ``eval_set``), ``consensus_gap``, ``bytes_uploaded``, ``bytes_downloaded``,
        ``n_sampled``, ``n_failed``, ``seconds``.
    %(outcome_attributes)s
    %(validation_attributes)s

    See Also
    --------
    sklearn_fedmf.FedMAvg : Federated model averaging, the paper's baseline.

    Notes
    -----
    A float32 ``X`` is fitted in float32: the factors, the client states, the server's copies
    and the messages (half the bytes in ``history_``) are float32, and so are
    ``components_``, ``user_factors_`` and ``transform``'s output. Sums (objective, residuals)
    are still accumulated in float64. Any other input is fitted in float64.

    Memory: Algorithm 1 keeps dense ``n_items x r`` copies ``W_i`` and ``Y_i`` on each client
    and ``Z_i = W_i + Y_i / beta`` for every client on the server, ``3 p n r`` numbers
    (``r = n_components + 2`` with biases): 1.25 GB per array family at the ML-1M shape with
    one client per user. With many clients (``fit(X, clients=...)`` with at least 500 distinct
    labels, not on Dask) the simulation holds the same iterates implicitly: the rated rows
    explicitly and every other row as a combination of the broadcasts the client received,
    ``O(ratings + rounds n r)``; the messages and their bytes are still the paper's dense
    ``(W_i, Y_i)`` (``regularization="weighted"``: always one block per client). A fit whose
    state would not fit in the available memory raises a
    ``MemoryError`` naming the bytes before its first round (see the user guide, "Scaling
    out").

    References
    ----------
    P. Hytla, T. T. A. Nghia, D. N. Phan, A. Rice. A Linearized Alternating Direction
    Multiplier Method for Federated Matrix Completion Problems.

    %(example)s
    """

    _fit_dtypes = (np.float64, np.float32)  # float32 X: factors, messages, states in float32
    _auto_item = AUTO_ITEM_ADMM  # (measured: the shared AUTO_ITEM stalls its factor part)

    _solver_params: dict = {
        **FederatedMFBase._solver_params,
        **IMPLICIT_SETTINGS,
        **FACTOR_SETTINGS,
        "init_scale": (0.1, FACTOR_SETTINGS["init_scale"][1]),
        "w_update": ("linearized", [StrOptions({"linearized", "exact"})]),
        "dual_init": ("paper", [StrOptions({"paper", "zeros"})]),
        # one client per user: hold the combinations' values on the rated rows (True) or
        # make them from the rounds' maps when read (False); "auto": _cache_rows' rule
        "cache_rows": ("auto", [StrOptions({"auto"}), "boolean"]),
    }
    _moved_params = moved_to_solver_params(_solver_params)
    _floor_class = FedBaseline  # the biases-only floor of a validated fit

    _parameter_constraints: dict = {
        **FederatedMFBase._parameter_constraints,
        "beta": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
        "local_iter": [Interval(Integral, 1, None, closed="left")],
        "regularization": [StrOptions({"plain", "weighted"})],
        **AutoStrengthsMixin._parameter_constraints,
    }

    def __init__(
        self,
        n_components=5,
        *,
        beta="auto",
        local_iter=100,
        n_clients=10,
        clients_per_round=None,
        max_iter=100,
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
        self.beta = beta
        self.local_iter = local_iter
        self.regularization = regularization

    def _beta(self, ctx):
        """``beta``: as given, or ``"auto"``: the loss's rule (``_auto_betas``)."""
        if self.beta == "auto":
            init_scale = ctx.settings["init_scale"]
            if init_scale == 0 and not self._biased:
                raise ValueError("beta='auto' scales with init_scale; init_scale=0 without "
                                 "biases needs an explicit beta.")
            return self._auto_betas[self._loss.name](self, ctx, init_scale)
        return float(self.beta)

    def _ratings_beta(self, ctx, init_scale):
        """``beta="auto"`` on ratings: ``AUTO_BETA`` times :func:`initial_curvature`."""
        return AUTO_BETA * initial_curvature(
            ctx.info.n_ratings, ctx.n_features, ctx.n_clients, self.n_components,
            init_scale, self._biased,
        )

    def _implicit_beta(self, ctx, init_scale):
        """``beta="auto"`` under ``loss="implicit"``: ``AUTO_BETA_IMPLICIT`` times
        :func:`~._fedmc_admm_implicit.implicit_initial_curvature`."""
        return AUTO_BETA_IMPLICIT * implicit_initial_curvature(
            ctx.X, ctx.n_clients, self.n_components, init_scale, ctx.info.confidence)

    _auto_betas = {"squared": _ratings_beta, "implicit": _implicit_beta}

    def _strengths(self, ctx):
        """``(alpha_u, alpha_v)`` of the protocol: ``"auto"`` is :mod:`._auto_strengths`'
        rule (``alpha_v`` over ``p``, as ``R(V)`` is not; per rating with the weighted
        regularization)."""
        alpha_u = self._strength("alpha_u", ctx, self.alpha_u)
        alpha_v = self._strength("alpha_v", ctx, self.alpha_v)
        auto = self._auto(ctx)
        if auto is None:
            return alpha_u, alpha_v
        weighted = self.regularization == "weighted"
        if self.alpha_u == "auto" and weighted:
            alpha_u *= auto["n_users"] / ctx.info.n_ratings
        if self.alpha_v == "auto":
            alpha_v *= auto["n_items"] / ctx.info.n_ratings if weighted else (
                1.0 / ctx.n_clients)
        return alpha_u, alpha_v

    def _squared_protocol(self, ctx):
        """FedMC-ADMM on ratings (:mod:`._fedmc_admm_protocol`)."""
        settings = ctx.settings
        alpha_u, alpha_v = self._strengths(ctx)
        item_bias, user_shrinkage = self._bias_start(ctx)
        return make_protocol(
            n_items=ctx.n_features, n_clients=ctx.n_clients, n_components=self.n_components,
            beta=self._beta(ctx), local_iter=self.local_iter, alpha_u=alpha_u,
            alpha_v=alpha_v, l1_ratio=settings["l1_ratio"], positive=settings["positive"],
            w_update=settings["w_update"], init_scale=settings["init_scale"],
            dual_init=settings["dual_init"],
            biased=self._biased, weighted=self.regularization == "weighted",
            item_bias=item_bias, user_shrinkage=user_shrinkage,
            cache_rows=self._cache_rows(ctx),
        )

    def _cache_rows(self, ctx):
        """``solver_params["cache_rows"]``, or with ``"auto"``: hold the combinations' values
        on the rated rows when the grouped state with them takes at most half of the
        available memory (the other half for early stopping's copy of the best round, the
        data and the biases floor). They cost ``2 r`` float64 numbers a rating (at the
        Netflix shape 37 GiB of state instead of 12); made instead, the consensus metric of
        every round reads a random broadcast row per rating and round a client took part
        in: several times the metric's time (measured in
        benchmarks/results/bench_scale_per_user-2026-12.md)."""
        setting = ctx.settings["cache_rows"]
        if setting != "auto":
            return bool(setting)
        return self._state_nbytes(ctx, grouped=True, cache_rows=True) <= _available_memory() / 2

    def _state_nbytes(self, ctx, *, grouped, cache_rows):
        """:func:`state_nbytes` of this fit's data and settings."""
        return state_nbytes(
            n_clients=ctx.n_clients, n_items=ctx.n_features,
            n_factors=_biases.n_factors(self.n_components, self._biased),
            itemsize=ctx.X.dtype.itemsize, grouped=grouped, nnz=ctx.X.nnz,
            max_iter=self.max_iter, exact=ctx.settings["w_update"] == "exact",
            round_fraction=_n_sampled(ctx.settings["clients_per_round"], ctx.n_clients)
            / ctx.n_clients, cache_rows=cache_rows)

    def _implicit_protocol(self, ctx):
        """FedMC-ADMM under ``loss="implicit"`` (:mod:`._fedmc_admm_implicit`)."""
        settings = ctx.settings
        alpha_u, alpha_v = self._strengths(ctx)
        return make_implicit_protocol(
            n_items=ctx.n_features, n_clients=ctx.n_clients, n_components=self.n_components,
            beta=self._beta(ctx), local_iter=self.local_iter, alpha_u=alpha_u,
            alpha_v=alpha_v, l1_ratio=settings["l1_ratio"], positive=settings["positive"],
            w_update=settings["w_update"], init_scale=settings["init_scale"],
            dual_init=settings["dual_init"], confidence=ctx.info.confidence,
            weighted=self.regularization == "weighted",
        )

    _protocols = {"squared": _squared_protocol, "implicit": _implicit_protocol}

    def _run(self, protocol, blocks, ctx, early_stopping=None):
        if not ctx.warm:
            self._check_memory(protocol, blocks, ctx)
        return super()._run(protocol, blocks, ctx, early_stopping)

    def _check_memory(self, protocol, blocks, ctx):
        """Raise before the first round when the clients' and the server's item-side state
        would not fit in the available memory (Algorithm 1 keeps ``O(p n r)`` of it)."""
        local = isinstance(blocks, list)  # else a transport: the clients hold W_i, Y_i
        grouped = local and bool(blocks) and isinstance(blocks[0], ClientGroup)
        r = _biases.n_factors(self.n_components, self._biased)
        itemsize = ctx.X.dtype.itemsize
        need = self._state_nbytes(ctx, grouped=grouped,
                                  cache_rows=_protocol_caches_rows(protocol))
        if not local:  # only the server's Z_i in this process
            need //= 3
        available = _available_memory()
        if need <= available:
            return
        what = (f"the rated rows of each client's W_i, Y_i and the server's sum ({ctx.X.nnz} "
                f"ratings x {r} factors) and {self.max_iter + 1} broadcasts of {ctx.n_features}"
                f" x {r}" if grouped else
                f"the server's Z_i and every client's W_i and Y_i: 3 x {ctx.n_clients} "
                f"clients x {ctx.n_features} items x {r} factors x {itemsize} bytes")
        raise MemoryError(
            f"FedMCADMM needs about {need / 2**30:.2f} GiB ({need} bytes) for {what}, but "
            f"{available / 2**30:.2f} GiB are available. Use fewer clients (n_clients or "
            "fewer distinct labels in clients), a lower n_components, float32 X (half the "
            "bytes), or fewer rounds; a fit with many clients runs them in groups that hold "
            "this state implicitly (see the user guide, Scaling out)."
        )

    def _collect(self, state, blocks, ctx):
        super()._collect(state, blocks, ctx)
        (self.alpha_u_, self.alpha_v_), self.beta_ = self._strengths(ctx), self._beta(ctx)
