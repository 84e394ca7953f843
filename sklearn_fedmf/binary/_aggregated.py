"""One-shot federation of centralized Boolean factorizations (Felb paper, Algorithm 2).

Each client factorizes its own rows once, with the continuous Elbmf relaxation (the same
iPALM / MU steps as Felb, without proximity; ``U_i`` and ``V_i`` rounded at 1/2) or with one
of the paper's cover-based baselines (Asso, GreConD, MEBF), and uploads the Boolean ``V_i``
(randomized response under DP). The server combines the ``V_i`` elementwise
by rounded average, majority vote or logical or. Faithful to the paper, the ``U_i`` are not
refitted to the aggregate and components are not aligned across clients. The protocol
functions are in :mod:`._aggregated_protocol`.
"""

from __future__ import annotations

from functools import partial
from numbers import Integral

from sklearn.utils._param_validation import Interval, StrOptions

from .._docstrings import SHARED_PARAMETERS, Substitution, federation_keys
from ..engine._federation import FederatedProtocol, Participation, SummableUploads
from ..engine._fit import FEDERATION_KEYS, resolve_solver_params
from ._aggregated_protocol import (
    aggregate_boolean,
    client_metrics,
    client_update,
    combine_metrics,
    init_client,
    init_server,
    secure_server_update,
    secure_summands,
    server_update,
)
from ._base import BooleanFactorizationBase, elb_solver_params
from ._cover import MEBF, Asso
from ._cover_solvers import COVER_SOLVERS

__all__ = ["AggregatedBMF", "aggregate_boolean"]

_COVER_OPTIONS = {"threshold", "gain", "loss", "cover"}


@Substitution(**SHARED_PARAMETERS, federation_keys=federation_keys())
class AggregatedBMF(BooleanFactorizationBase):
    """One-shot federated Boolean factorization: a local BMF, then aggregation of the ``V_i``.

    The paper's baseline federation of centralized BMF (Algorithm 2): every client factorizes
    its own rows (by default the continuous Elbmf relaxation for ``local_iter`` steps, its
    factors rounded at 1/2; or Asso, GreConD or MEBF, ``solver``) and uploads the Boolean
    ``V_i`` once; the server combines them. The clients keep their
    ``U_i`` (not refitted to the aggregate). Components are not aligned across clients, so the
    aggregate mixes unrelated components unless the clients happen to agree; this is the
    weakness Felb addresses.

    Parameters
    ----------
    n_components : int, default=10
        Number of Boolean components ``k``.
    aggregation : {"majority", "round", "or"}, default="majority"
        Majority vote (ties to 1), rounded average (ties to 0), or logical or.
    solver : {"elbmf", "asso", "grecond", "mebf"}, default="elbmf"
        The local factorization: Elbmf (its constants are ``solver_params``), or the
        cover-based :class:`~sklearn_fedmf.binary.Asso`, :class:`~sklearn_fedmf.binary.GreConD`,
        :class:`~sklearn_fedmf.binary.MEBF` with the paper's Appendix D settings.
    local_iter : int, default=1000
        Local Elbmf steps (the paper's iteration limit).
    %(privacy)s
        AggregatedBMF's upload is one Boolean ``V_i``, once: randomized response
        (``"auto"``, flip probability ``1 / (1 + e^epsilon)``), epsilon-DP per bit; the
        aggregate is post-processing and stays Boolean.
    n_clients : int, default=10
        %(n_clients)s
    binarize : float or None, default=None
        %(binarize)s
    solver_params : dict or None, default=None
        The local solver's constants, the paper's Appendix D settings by default; a key left
        out keeps its default. Elbmf's keys (they also set the fold-in of :meth:`transform`,
        whatever ``solver``):

        %(federation_keys)s
        - ``kappa`` : float, default=0.01
          L1 weight of the Elb regularizer.
        - ``lam`` : float, default=0.01
          Initial quadratic weight of the Elb regularizer.
        - ``growth`` : float, default=1.02
          Growth of the quadratic weight per step.
        - ``lam_max`` : float, default=1e12
          Cap of the quadratic weight.
        - ``inertia`` : float in [0, 1), default=0.01
          iPALM inertia ``beta``.
        - ``update`` : {"palm", "mu"}, default="palm"
          Lipschitz steps (Elbmf) or multiplicative-update steps.
        - ``prox_mode`` : {"exact_nonneg", "exact", "paper", "paper_nonneg"}, default="exact_nonneg"
          The Elb prox (see :class:`Felb`).

        The options of ``solver="asso"`` (see :class:`~sklearn_fedmf.binary.Asso`) and
        ``"mebf"`` (see :class:`~sklearn_fedmf.binary.MEBF`), an error with another solver;
        GreConD has none:

        - ``threshold`` : float in (0, 1] or None, default=None
          Asso's minimum confidence or MEBF's expansion share; None: the paper's 1.0 (Asso) or 0.5
          (MEBF).
        - ``gain``, ``loss`` : float, default=1.0
          Asso's weights of a newly covered one and zero.
        - ``cover`` : float in (0, 1], default=0.95
          MEBF stops once this share of the ones is covered.
    callback : callable, default=None
        ``callback(round, info)`` after the single round.
    random_state : int, RandomState instance or None, default=None
        Seeds the partition, the local initializations and the randomized response.
    n_jobs : int, default=None
        %(n_jobs)s
    verbose : int, default=0
        1 shows a progress bar of the single round, 2 a line.
    secure_aggregation : bool or SecureAggregation, default=False
        %(secure_aggregation)s

    Attributes
    ----------
    components_ : ndarray of bool, shape (n_components, n_features)
        The aggregate ``Vh``.
    user_factors_ : ndarray of bool, shape (n_samples, n_components)
        The clients' local Boolean ``U_i`` in row order (analysis only).
    %(privacy_attributes)s
    n_clients_, clients_, n_iter_, history_, n_features_in_
        As in :class:`Felb` (one round: ``n_iter_ == 1``).
    converged_ : bool
        Always True (a single round, no ``tol``).
    degenerate_ : str or None
        Why the fitted model is trivial (an all-zero Boolean reconstruction), or None. A
        fit with a ``degenerate_`` reason raises a
        :class:`~sklearn_fedmf.exceptions.DegenerateFitWarning`.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.binary import AggregatedBMF
    >>> X = np.zeros((40, 12), dtype=int)
    >>> X[:, :6] = 1
    >>> model = AggregatedBMF(n_components=1, n_clients=4, random_state=0).fit(X)
    >>> model.components_.astype(int).tolist()
    [[1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]]
    """

    _parameter_constraints: dict = {
        **BooleanFactorizationBase._parameter_constraints,
        "aggregation": [StrOptions({"majority", "round", "or"})],
        "solver": [StrOptions({"elbmf", *COVER_SOLVERS})],
        "local_iter": [Interval(Integral, 1, None, closed="left")],
        "solver_params": [dict, None],
    }
    _solver_params: dict = {
        **FEDERATION_KEYS,
        **elb_solver_params(kappa=0.01, lam=0.01, growth=1.02, lam_max=1e12, inertia=0.01,
                            update="palm", prox_mode="exact_nonneg"),
        # the cover solvers' options, constrained as in their own estimators
        "threshold": (None, [*Asso._parameter_constraints["threshold"], None]),
        "gain": (1.0, Asso._parameter_constraints["gain"]),
        "loss": (1.0, Asso._parameter_constraints["loss"]),
        "cover": (0.95, MEBF._parameter_constraints["cover"]),
    }
    # the options each cover solver reads (the other keys are Elbmf's)
    _cover_keys = {"elbmf": (), "asso": ("threshold", "gain", "loss"), "grecond": (),
                   "mebf": ("threshold", "cover")}
    _moved_params = {key: f"solver_params['{key}']" for key in _solver_params
                     if key not in _COVER_OPTIONS}

    def __init__(
        self,
        n_components=10,
        *,
        aggregation="majority",
        solver="elbmf",
        local_iter=1000,
        privacy=None,
        n_clients=10,
        binarize=None,
        solver_params=None,
        callback=None,
        random_state=None,
        n_jobs=None,
        verbose=0,
        secure_aggregation=False,
    ):
        super().__init__(
            n_components, binarize=binarize, n_clients=n_clients, callback=callback,
            random_state=random_state, n_jobs=n_jobs, verbose=verbose,
            secure_aggregation=secure_aggregation,
        )
        self.aggregation = aggregation
        self.solver = solver
        self.local_iter = local_iter
        self.privacy = privacy
        self.solver_params = solver_params

    _privacy_mechanisms = ("bernoulli",)  # the upload is Boolean

    def _privacy_upload(self, n_items):
        return (self.n_components, n_items), 1  # one-shot

    def _engine_params(self, settings):
        return dict(max_iter=1)  # one-shot: a single upload of every V_i

    def _make_protocol(self, ctx):
        solver, cover = self._solver()
        return FederatedProtocol(
            init_server=init_server,
            init_client=init_client,
            client_update=partial(client_update, n_components=self.n_components,
                                  local_iter=self.local_iter, solver=solver,
                                  privacy=ctx.info.privacy, cover=cover),
            server_update=partial(server_update, aggregation=self.aggregation),
            client_metrics=client_metrics,
            combine_metrics=combine_metrics,
            participation=Participation(receives="all"),
            summable=SummableUploads(
                client=secure_summands,
                server_update=partial(secure_server_update, aggregation=self.aggregation)),
        )

    def _collect(self, state, blocks, ctx):
        self.components_ = state.server_state["Vh"]
        self.user_factors_ = self._stack_rows(
            blocks, [s["U"] for s in state.client_states], self.n_components, bool)
        self._read_privacy_spent(ctx.info.privacy, state.n_uploads)

    def _solver(self):
        """``(Elbmf's step keywords, (cover solver, its options) or None)`` of this fit, read
        from ``solver_params``; a cover solver's option given for another solver is refused."""
        params = resolve_solver_params(self)
        own = self._cover_keys[self.solver]
        foreign = sorted(set(self.solver_params or {}) & (_COVER_OPTIONS - set(own)))
        if foreign:
            raise ValueError(
                f"AggregatedBMF: solver_params {', '.join(map(repr, foreign))} do not apply to "
                f"solver={self.solver!r}; its own keys are {', '.join(own) or 'none'} (and "
                "Elbmf's, which also set the fold-in)."
            )
        elbmf = dict(kappa=params["kappa"], lam=params["lam"], growth=params["growth"],
                     lam_max=params["lam_max"], beta=params["inertia"], update=params["update"],
                     prox_mode=params["prox_mode"], step_scale=1.0)
        if self.solver == "elbmf":
            return elbmf, None
        options = {key: params[key] for key in own}
        if options.get("threshold", 0.0) is None:  # the paper's setting of this solver
            options["threshold"] = {"asso": 1.0, "mebf": 0.5}[self.solver]
        return elbmf, (COVER_SOLVERS[self.solver], options)

    def _fold_in_params(self):
        return dict(n_steps=self.local_iter, sync_every=1, rate_unit="local",
                    **self._solver()[0])
