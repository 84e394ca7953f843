"""The fit skeleton shared by every federated estimator.

Every family (matrix completion, Boolean factorization, clustering) fits the same way::

    validate X -> partition the rows into clients -> cut client blocks -> make the protocol
    -> initialize the federation -> run the rounds -> collect the fitted attributes
    -> warn once if the result is degenerate

:class:`FederatedEstimator` runs that sequence once; a family supplies a few hooks, each of
which receives the :class:`FitContext` explicitly (instead of reading fitted attributes set
just before):

``_check_fit_data(X, *, reset, settings, **fit_params) -> (X, info)``
    Validate the data (``settings``: the fit's, resolved once); ``info`` (the fields of
    :class:`FitInfo`) holds what the clients tell the server about it before round 1
    (aggregates such as the ratings' mean) and other validated fit inputs (``eval_set``).
``_make_blocks(ctx)``
    The per-client data blocks (default: CSR row blocks of ``ctx.X``).
``_make_protocol(ctx)``
    The algorithm's :class:`~sklearn_fedmf.engine._federation.FederatedProtocol`.
``_validation_plan(ctx) -> (ctx, early_stopping)``
    The validation of the fit: the context with each client's held-out ratings split off
    (:func:`validation_split`) and the engine's
    :class:`~sklearn_fedmf.engine._federation.EarlyStopping` rule, or ``(ctx, None)`` (default).
``_before_rounds(protocol, state, blocks)``
    The initialized federation state, adjusted before round 1 (default: unchanged).
``_collect(state, blocks, ctx)``
    Set the family's fitted attributes from the final engine state.
``_degenerate(state, blocks, ctx, history)``
    Why the result is trivial (all-zero factors, a frozen model, ...), or None.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
from abc import ABCMeta, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Integral, Real
from types import MappingProxyType

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils._param_validation import (
    HasMethods,
    Interval,
    StrOptions,
    validate_parameter_constraints,
)
from sklearn.utils.validation import check_array, check_is_fitted

from .._kernels import parallel_kernels, rank_in_rows
from .._threads import one_thread
from ..exceptions import ConvergenceWarning, DegenerateFitWarning
from ._client_data import resolve_clients, split_clients
from ._dispatch import workers_of
from ._exchange import secure_options
from ._federation import (
    LocalTransport,
    initialize_federation,
    make_entropy,
    partition_rng,
    resident_blocks,
    run_federation,
    validation_rng,
)
from ._groups import ClientGroup, GroupedTransport, GroupStates, make_groups, segments
from ._joblib_backend import dask_client, fit_workers

__all__ = [
    "FEDERATION_CONSTRAINTS", "FEDERATION_KEYS", "FactorTransformerMixin", "FederatedEstimator",
    "FitContext", "FitInfo",
    "SIMULATION_SETTINGS",
    "merge_params", "refuse_moved_params", "resolve_solver_params", "route_solver_params",
    "validation_split", "check_params", "solver_keys", "fit_protocol", "run_rounds",
    "collect_fit", "group_count",
]

# From this many clients on, a protocol with batched phases runs its clients in groups (one
# compiled call per group instead of a Python call per client); the model is the same either
# way (tests set it to 1 to run every fit grouped). A group's phase costs about 0.1 ms of
# Python a call besides its compiled work, so a group holds at least GROUP_RATINGS stored
# ratings, and there are at most N_GROUPS groups (the units the workers share); the count
# follows the data alone, never n_jobs. Measured at ML-1M's shape (one client per user, 10%
# a round, FedMC-ADMM, one thread): 12.9 ms a round in 16 groups, 11.7 in 8 (docs: Scaling
# out). The tests set GROUP_RATINGS to 1: as many groups as clients allow.
GROUP_MIN_CLIENTS = 500
GROUP_RATINGS = 125_000
N_GROUPS = 16
# From this many stored ratings a fit with n_jobs=None runs on every core. Below it, threads
# lose to the calling thread alone (Python work between the kernels holds the GIL); measured
# on two cores with FedMGS's defaults: 16% slower at 80,000 ratings, 4% at 200,000, 12%
# faster at 400,000 and 21% at 800,000 (docs: Scaling out).
THREADED_MIN_RATINGS = 300_000


def group_count(n_ratings):
    """How many groups a grouped fit of ``n_ratings`` stored ratings runs its clients in
    (``GROUP_RATINGS`` a group at least, at most ``N_GROUPS``)."""
    return int(min(max(n_ratings // GROUP_RATINGS, 1), N_GROUPS))


# Parameters every federated estimator shares (DESIGN section 4), validated the same way.
FEDERATION_CONSTRAINTS: dict = {
    "n_clients": [Interval(Integral, 1, None, closed="left")],
    "callback": [callable, None],
    "random_state": ["random_state"],
    "n_jobs": [Integral, None],
    "verbose": ["verbose"],
    # True, or a SecureAggregation of sklearn_fedmf.secure (encoding, neighbour degree)
    "secure_aggregation": ["boolean", HasMethods(["degree", "threshold"])],
}

# The simulation's settings, as ``{name: (default, constraints)}``: ``solver_params`` keys of
# every estimator (FEDERATION_KEYS) or of the completion estimators (all four), read by the
# skeleton through ``FederatedEstimator._settings``.
SIMULATION_SETTINGS: dict = {
    "partition": ("random", [StrOptions({"random", "contiguous"})]),
    "on_client_error": ("raise", [StrOptions({"raise", "skip"})]),
    "dropout": (0.0, [Interval(Real, 0, 1, closed="left")]),
    "eval_every": (1, [Interval(Integral, 0, None, closed="left")]),
}
# how rows become clients, and what a failing client does: keys of every estimator
FEDERATION_KEYS: dict = {name: SIMULATION_SETTINGS[name] for name in ("partition",
                                                                       "on_client_error")}


def merge_params(*params):
    """One estimator's keyword arguments from several sets (later ones win), with their
    ``solver_params`` dicts merged key by key (``PAPER_SETTINGS`` plus a caller's keys)."""
    merged, solver = {}, {}
    for part in params:
        merged.update(part)
        solver.update(part.get("solver_params") or {})
    if solver:
        merged["solver_params"] = solver
    return merged


def route_solver_params(cls, params):
    """``params`` with the keys that ``cls`` declares in ``_solver_params`` moved into its
    ``solver_params`` dict (merged with one given there): how a flat ``NAME=VALUE`` setting
    (the command line's ``--set``) reaches a solver constant."""
    solver = {key: value for key, value in params.items() if key in solver_keys(cls)}
    if not solver:
        return dict(params)
    kept = {key: value for key, value in params.items() if key not in solver}
    return merge_params(kept, {"solver_params": solver})


def solver_keys(cls):
    """The ``solver_params`` keys the estimator class ``cls`` declares."""
    return tuple(cls._solver_params)


def refuse_moved_params(init, moved):
    """``init`` that raises a TypeError naming the new place of each removed parameter.

    ``functools.wraps`` keeps ``init``'s signature visible to ``inspect.signature`` (which
    follows ``__wrapped__``), so ``get_params``, ``clone`` and ``set_params`` see the
    constructor's own parameters; ``**kwargs`` only receives what the caller passed.
    """
    own = set(inspect.signature(init).parameters)
    moved = {name: place for name, place in moved.items() if name not in own}

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        gone = [name for name in kwargs if name in moved]
        if gone:
            raise TypeError(f"{type(self).__name__}: " + "; ".join(
                f"`{name}` moved to `{moved[name]}`" for name in gone) + ".")
        init(self, *args, **kwargs)

    return __init__


def resolve_solver_params(estimator):
    """The solver constants of one fit: the class's declared defaults, updated by the
    estimator's ``solver_params`` dict, each key checked.

    A class declares its keys in ``_solver_params`` as ``{key: (default, constraints)}``
    (constraints in the form of ``_parameter_constraints``); an unknown key is a
    ``ValueError`` that lists the keys the class has.
    """
    declared = type(estimator)._solver_params
    given = dict(estimator.solver_params or {})
    name = type(estimator).__name__
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ValueError(
            f"{name}: solver_params has no key {', '.join(map(repr, unknown))}; its keys are "
            f"{', '.join(sorted(declared)) or 'none'} (see the solver_params entry of "
            f"{name}'s docstring)."
        )
    validate_parameter_constraints({key: declared[key][1] for key in given}, given,
                                   caller_name=f"{name}.solver_params")
    return {**{key: default for key, (default, _) in declared.items()}, **given}


def validation_split(X, codes, n_clients, fraction, entropy):
    """Each client's held-out validation ratings: ``(X_train, X_valid)``, CSR of ``X``'s shape
    whose stored entries split ``X``'s.

    Client ``c`` draws from its own generator
    (:func:`~sklearn_fedmf.engine._federation.validation_rng`), so the split does not depend on
    ``n_jobs``, the backend or the other clients. Each of its rows with ``n`` ratings holds out
    ``floor(fraction * n + u)`` of them (``u`` uniform: the expected count is ``fraction * n`` even
    for a row of one rating) chosen at random, but always keeps at least one for training.
    """
    n_rows = X.shape[0]
    lengths = np.diff(X.indptr)
    order = np.argsort(codes, kind="stable")  # each client's rows, ascending (split_clients)
    bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=n_clients))])
    entry_bounds = np.concatenate([[0], np.cumsum(lengths[order])])[bounds]
    keys, draws = np.empty(X.nnz), np.empty(n_rows)
    for c in range(n_clients):
        rng = validation_rng(entropy, c)
        keys[entry_bounds[c]:entry_bounds[c + 1]] = rng.random(entry_bounds[c + 1]
                                                               - entry_bounds[c])
        draws[bounds[c]:bounds[c + 1]] = rng.random(bounds[c + 1] - bounds[c])
    # back from client order to X's entry and row order
    entries, _ = segments(X.indptr[order].astype(np.int64), lengths[order])
    entry_key = np.empty(X.nnz)
    entry_key[entries] = keys
    row_draw = np.empty(n_rows)
    row_draw[order] = draws
    n_held = np.minimum(np.floor(fraction * lengths + row_draw), np.maximum(lengths - 1, 0))
    row_of = np.repeat(np.arange(n_rows), lengths)
    rank = rank_in_rows(X.indptr, entry_key)  # per row, entries by their key
    held = rank < n_held[row_of]
    return _entries(X, ~held, row_of), _entries(X, held, row_of)


def _entries(X, mask, row_of):
    """The canonical CSR of ``X``'s stored entries where ``mask`` holds."""
    counts = np.bincount(row_of[mask], minlength=X.shape[0])
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(X.indptr.dtype)
    out = sp.csr_matrix((X.data[mask], X.indices[mask], indptr), shape=X.shape)
    out.has_canonical_format = True
    return out


@dataclass(frozen=True)
class FitInfo:
    """What a fit learned about its data before round 1 (``FitContext.info``): the
    aggregates the clients send once and the validated fit inputs, by family. A hook makes a
    new one with :func:`dataclasses.replace`; an unknown name is an error.

    Attributes
    ----------
    eval_X, report_X : csr_matrix or None
        The held-out ratings scored each round (the validation ratings under early stopping),
        and the ``eval_set`` reported beside a validation split off ``X``.
    mean, rating_range, offset : float, tuple, float
        The training ratings' mean and range, and what was subtracted from them.
    n_ratings : int or None
        The sum of the clients' rating counts.
    validated, held_out : bool
        Whether the fit validates, and whether its validation ratings came out of ``X``.
    rank : int or None
        The factors' rank (``n_components``, or its default for the loss and the data).
    confidence : float or None
        The confidence scale under ``loss="implicit"``.
    auto : dict or None
        The ``"auto"`` strengths' settings (:mod:`~sklearn_fedmf.completion._auto_strengths`).
    rating_scale : float
        What the ratings were divided by (1: not scaled).
    alpha_u, alpha_v : float or None
        RFRec's strengths on the scaled ratings.
    privacy : dict or None
        The upload noise (:func:`~sklearn_fedmf.privacy._local_dp.privacy_settings`).
    deployed : bool
        A deployed federation's context (:mod:`sklearn_fedmf.flower`), built from the sites'
        aggregates: no data, no ``"auto"`` settings from it.
    centers, scale, abs_mean, x_min, x_max
        Clustering's start (``init`` centres), ``||X||^2 / N``, the mean absolute entry and the
        entries' range.
    """

    eval_X: object = None
    report_X: object = None
    mean: float = 0.0
    rating_range: tuple | None = None
    offset: float = 0.0
    n_ratings: int | None = None
    validated: bool = False
    held_out: bool = False
    rank: int | None = None
    confidence: float | None = None
    auto: dict | None = None
    rating_scale: float = 1.0
    alpha_u: float | None = None
    alpha_v: float | None = None
    privacy: dict | None = None
    deployed: bool = False
    centers: object = None
    scale: float | None = None
    abs_mean: float | None = None
    x_min: float | None = None
    x_max: float | None = None


@dataclass(frozen=True)
class FitContext:
    """What one fit knows before its first round, handed to every hook.

    Attributes
    ----------
    X : validated training data (a canonical CSR matrix, or the samples for clustering)
    n_rows, n_features : int
        Shape of ``X``.
    n_clients : int
    labels : ndarray of shape (n_rows,)
        Client label of each row (``clients_``).
    codes : ndarray of shape (n_rows,)
        Client index ``0 .. n_clients - 1`` of each row.
    entropy : int
        Root seed of the federation.
    warm : bool
        True when the fit continues the previous one (``warm_start``).
    info : FitInfo
        What ``_check_fit_data`` learned (aggregates the clients send once, ``eval_set``, ...),
        by name.
    settings : Mapping
        Every setting of the fit by name (:meth:`FederatedEstimator._settings`), resolved
        once at its start; the hooks read them here.
    n_jobs : int or None
        The fit's ``n_jobs`` (:meth:`FederatedEstimator._fit_n_jobs`), resolved once.
    workers : int
        How many workers that is under the joblib backend of the fit
        (:func:`~sklearn_fedmf.engine._dispatch.workers_of`, computed once: the transports and the
        data split use it).
    """

    X: object
    n_rows: int
    n_features: int
    n_clients: int
    labels: np.ndarray
    codes: np.ndarray
    entropy: int
    warm: bool = False
    info: FitInfo = field(default_factory=FitInfo)
    settings: Mapping = field(default_factory=dict)
    n_jobs: int | None = None
    workers: int = 1


class FactorTransformerMixin(ClassNamePrefixFeaturesOutMixin, TransformerMixin):
    """The transformer side of the federated factorizations (completion and Boolean):
    ``components_`` is the shared factor ``V`` and ``transform`` folds rows in."""

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def fit_transform(self, X, y=None, **fit_params):
        """Fit, then fold ``X`` in: the same as ``fit(X).transform(X)``.

        The clients' own factors of the last round, which each client computed against its
        own (possibly stale) copy of ``V`` rather than the final ``components_``, are
        ``user_factors_``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            Training data (see :meth:`fit`).
        y : Ignored
            Not used, present for API consistency by convention.
        **fit_params : dict
            ``clients`` (and ``eval_set`` where :meth:`fit` takes it), passed on to
            :meth:`fit`.

        Returns
        -------
        U : ndarray of shape (n_samples, n_components)
            The rows' factors (Boolean for a Boolean factorization) folded in against the
            fitted ``components_``.
        """
        return self.fit(X, y, **fit_params).transform(X)


class FederatedEstimator(BaseEstimator, metaclass=ABCMeta):
    """Base class of every federated estimator: the fit skeleton (not for direct use).

    Subclasses list their own parameters in ``__init__`` and pass the shared ones to
    ``super().__init__`` (as scikit-learn's ``_BaseNMF`` does).
    """

    _parameter_constraints: dict = dict(FEDERATION_CONSTRAINTS)
    # removed parameter -> its new place; passing one raises a TypeError saying where it
    # went (for one release). Merged over the class and its bases.
    _moved_params: dict = {}
    # solver constant -> (default, constraints): the keys of ``solver_params``, declared per
    # class, checked by ``resolve_solver_params`` and read through ``_settings``
    _solver_params: dict = {}
    # The value of each setting the skeleton reads that a class does not expose (neither a
    # parameter nor a ``solver_params`` key): what it runs with (see ``_settings``).
    _default_settings: dict = {
        "clients_per_round": None, "tol": 0.0, "warm_start": False, "sampling": "uniform",
        **{name: default for name, (default, _) in SIMULATION_SETTINGS.items()},
    }

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in cls.__dict__:
            moved = {}
            for klass in reversed(cls.__mro__):
                moved.update(vars(klass).get("_moved_params", {}))
            if moved:
                cls.__init__ = refuse_moved_params(cls.__init__, moved)

    # Why the class cannot sum its uploads securely (None: it can, when its protocol
    # declares ``summable``); the error of ``secure_aggregation=True`` says it.
    _secure_refusal: str | None = None

    def __init__(self, *, n_clients, callback, random_state, n_jobs, verbose,
                 secure_aggregation=False):
        self.n_clients = n_clients
        self.callback = callback
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.secure_aggregation = secure_aggregation

    def _secure_refusal_reason(self):
        """Why this estimator, with its settings, cannot sum its uploads securely."""
        return self._secure_refusal or "its server needs more than the sums of the uploads"

    def _secure_protocol(self, protocol, settings):
        """``protocol`` with secure aggregation switched on when ``secure_aggregation`` asks
        for it (:mod:`sklearn_fedmf.secure._rounds`); a clear error when the algorithm's
        server needs more than sums. ``settings``: the fit's, resolved once."""
        option = self.secure_aggregation  # (a parameter: no resolution of the settings)
        if option is False:
            return protocol
        name = type(self).__name__
        if self._secure_refusal is not None or protocol.summable is None:
            raise ValueError(f"{name} does not support secure_aggregation=True: "
                             f"{self._secure_refusal_reason()}.")
        if protocol.client_prepare is not None and protocol.summable.server_prepare is None:
            raise ValueError(f"{name}: secure_aggregation=True cannot sum the statistics of "
                             "this setting's prepare phase (e.g. FedMAvg's w_step=\"global\" "
                             "or \"guarded\"); choose a setting without one (w_step=\"local\").")
        return dataclasses.replace(protocol, secure=secure_options(option))

    def _settings(self):
        """Every setting of a fit by name: the class's declared defaults, its constructor
        parameters, and the keys of ``solver_params`` (resolved and checked by
        :func:`resolve_solver_params`). Read live, like the parameters themselves."""
        params = self.get_params(deep=False)
        solver = {}
        if self._solver_params:  # (a class that declares no key reads its dict itself)
            params.pop("solver_params")
            solver = resolve_solver_params(self)
        return {**self._default_settings, **params, **solver}

    # ---- hooks ----------------------------------------------------------------------------
    @abstractmethod
    def _check_fit_data(self, X, *, reset, settings, **fit_params):
        """Validate ``X`` (and fit inputs) under the fit's ``settings``; return
        ``(X, info)``."""

    def _make_blocks(self, ctx):
        """The clients' data blocks, in client order."""
        return split_clients(ctx.X, ctx.codes, ctx.n_clients, ctx.info.eval_X,
                             workers=ctx.workers)

    @abstractmethod
    def _make_protocol(self, ctx):
        """The algorithm's ``FederatedProtocol`` for this fit."""

    @abstractmethod
    def _collect(self, state, blocks, ctx):
        """Set the family's fitted attributes from the final ``FederationState``."""

    def _start_bytes(self, ctx):
        """``(up, down)``: bytes of the exchanges a fresh fit makes before the protocol's
        start (default: none); counted in the first round's record with the start's."""
        return 0, 0

    def _before_rounds(self, protocol, state, blocks):
        """The federation state the first round starts from (default: as initialized)."""
        return state

    def _validation_plan(self, ctx):
        """``(ctx, early_stopping)``: the fit's validation (default: none)."""
        return ctx, None

    def _degenerate(self, state, blocks, ctx, history):
        """Why the fitted model is trivial, or None (checked once, at the end of every fit;
        ``history`` holds this fit's rounds)."""
        return None

    def _engine_params(self, settings):
        """Round-loop settings passed to ``run_federation``, from the fit's ``settings``."""
        return {name: settings[name] for name in (
            "max_iter", "tol", "clients_per_round", "dropout", "eval_every")}

    # ---- the skeleton ---------------------------------------------------------------------
    def _fit(self, X, clients=None, **fit_params):
        # every setting resolved once (parameters, solver_params checked): the hooks read them
        # from the context
        settings = MappingProxyType(self._settings())
        warm = bool(settings["warm_start"]) and hasattr(self, "_federation")
        X, info = self._check_fit_data(X, reset=not warm, settings=settings, **fit_params)
        n_rows = X.shape[0]
        if clients is None and self.n_clients > n_rows:
            raise ValueError(
                f"n_clients={self.n_clients} is larger than the number of rows "
                f"(n_samples={n_rows}); every client needs at least one row."
            )
        entropy = self._entropy if warm else make_entropy(self.random_state)
        labels, codes, n_clients = resolve_clients(
            n_rows, clients, self.n_clients, settings["partition"], partition_rng(entropy)
        )
        per_round = settings["clients_per_round"]
        if isinstance(per_round, Integral) and per_round > n_clients:
            raise ValueError(
                f"clients_per_round={per_round} is larger than the number of clients "
                f"({n_clients})."
            )
        n_jobs = self._fit_n_jobs(X)
        ctx = FitContext(X, n_rows, X.shape[1], n_clients, labels, codes, entropy, warm,
                         FitInfo(**info), settings, n_jobs, workers_of(n_jobs))
        # (the context holds the ratings: the validation split replaces them by their
        # training part, and this name would keep the whole copy for the fit, 12 bytes a
        # rating)
        del X, info
        self._check_warm_partition(ctx)
        ctx, early_stopping = self._validation_plan(ctx)
        protocol = fit_protocol(self, ctx)
        blocks = self._make_groups(ctx) if self._grouped(protocol, ctx) else self._make_blocks(ctx)
        # The parallelism is across clients; BLAS threads on the small per-client products
        # only fight over the cores (measured: 100x slower dot products on a busy machine).
        # On a Dask backend the blocks go to the workers once for the whole fit. A round
        # whose clients this thread runs itself (one batch) splits their row kernels over the
        # n_jobs threads (_kernels.parallel_kernels; the engine's workers never do).
        start = self._federation.n_rounds if warm else 0
        threads = ctx.workers if dask_client() is None else 1
        with one_thread("blas"), resident_blocks(blocks), \
                parallel_kernels(threads):
            state = run_rounds(self, protocol, blocks, ctx, early_stopping)
        self._federation, self._entropy = state, entropy
        self.clients_ = labels
        collect_fit(self, state, blocks, ctx)
        self._check_result(state, blocks, ctx, state.history[start:])
        return self

    def _grouped(self, protocol, ctx):
        """Whether the clients run in groups (:mod:`~sklearn_fedmf.engine._groups`): when the
        protocol has batched phases and the clients are many, and not on Dask (which keeps one block
        per client on its workers). Either way the fit gives the same model."""
        if ctx.warm:
            return isinstance(self._federation.client_states, GroupStates)
        return (protocol.batched is not None and ctx.n_clients >= GROUP_MIN_CLIENTS
                and dask_client() is None)

    def _make_groups(self, ctx):
        """The clients' data stacked in groups
        (:func:`~sklearn_fedmf.engine._groups.make_groups`)."""
        return make_groups(ctx.X, ctx.codes, ctx.n_clients, ctx.info.eval_X,
                           n_groups=group_count(ctx.X.nnz))

    def _check_warm_partition(self, ctx):
        """A warm start continues the same clients: same rows, same partition."""
        if ctx.warm and (len(self._federation.client_states) != ctx.n_clients
                         or self.clients_.shape[0] != ctx.n_rows):
            raise ValueError(
                "warm_start=True needs the same rows and client partition as the previous "
                "fit; set warm_start=False to start over."
            )

    def _fit_n_jobs(self, X):
        """The fit's ``n_jobs``: as given; ``None`` on at least ``THREADED_MIN_RATINGS``
        stored entries: one thread per core
        (:func:`~sklearn_fedmf.engine._joblib_backend.fit_workers`), below: ``None`` (joblib's
        default, one worker)."""
        if self.n_jobs is None and (X.nnz if sp.issparse(X) else X.size) < THREADED_MIN_RATINGS:
            return None
        return fit_workers(self.n_jobs)

    def _run(self, protocol, blocks, ctx, early_stopping=None):
        """Initialize (or continue) the federation and run its rounds."""
        n_jobs = ctx.n_jobs
        clients = blocks
        grouped = isinstance(blocks, list) and blocks and isinstance(blocks[0], ClientGroup)
        # one transport for the whole fit, with the fit's workers: it holds the client states
        if isinstance(blocks, list):  # (else the caller's transport: a deployed federation)
            make = GroupedTransport if grouped else LocalTransport
            clients = make(blocks, n_jobs=n_jobs, workers=ctx.workers, client_states=(
                self._federation.client_states if ctx.warm else None))
        if ctx.warm:
            state, init_bytes = self._federation, (0, 0)
        else:
            state, init_bytes = initialize_federation(protocol, clients, entropy=ctx.entropy,
                                                      n_jobs=n_jobs)
            init_bytes = tuple(a + b for a, b in zip(init_bytes, self._start_bytes(ctx)))
            state = self._before_rounds(protocol, state, blocks)
        report = None
        if early_stopping is not None and ctx.info.report_X is not None:
            # the eval set beside the validation: the same clients and states, the eval set
            # as their held-out ratings
            report_X = ctx.info.report_X
            report_blocks = [b._replace(X_eval=report_X[b.rows]) for b in blocks]
            report = (GroupedTransport(report_blocks, n_jobs=n_jobs, workers=ctx.workers,
                                       client_states=state.client_states) if grouped
                      else LocalTransport(report_blocks, n_jobs=n_jobs, workers=ctx.workers,
                                          client_states=state.client_states))
        settings = ctx.settings
        return run_federation(
            protocol, clients, **self._engine_params(settings), entropy=ctx.entropy,
            n_jobs=n_jobs, callback=self.callback, verbose=self.verbose, state=state,
            init_bytes=init_bytes, label=type(self).__name__,
            on_client_error=settings["on_client_error"], early_stopping=early_stopping,
            report=report, **self._sampling_options(blocks, settings),
        )

    def _sampling_options(self, blocks, settings):
        """The engine's client sampling: with ``sampling="weighted"`` (the estimators that
        have it) i.i.d. draws with probabilities ``omega_p`` from :meth:`_client_weights`."""
        if settings["sampling"] == "uniform":
            return {}
        if blocks and isinstance(blocks[0], ClientGroup):
            nnz = np.concatenate([np.diff(g.entry_ptr) for g in blocks])
            rows = np.concatenate([np.diff(g.row_ptr) for g in blocks])
        else:
            nnz = np.array([getattr(b, "nnz", 0) for b in blocks])  # (samples: no entries)
            rows = np.array([b.n_rows for b in blocks])
        return {"sampling": "weighted",
                "sampling_weights": self._client_weights(nnz, rows, settings)}

    def _client_weights(self, nnz, n_rows, settings):
        """``omega_p`` of weighted sampling, up to a factor, from the clients' observed
        entries and rows: the entries."""
        return nnz

    def _check_factors(self, X):
        """Validate row factors for ``inverse_transform``: a 2-D array with one column per
        component (what ``transform`` returns)."""
        check_is_fitted(self)
        X = check_array(X, dtype=None)
        n_components = self.components_.shape[0]
        if X.shape[1] != n_components:
            raise ValueError(
                f"X has {X.shape[1]} columns but {type(self).__name__} has n_components="
                f"{n_components}: inverse_transform takes the row factors that transform "
                "returns."
            )
        return X

    # ---- degenerate results ---------------------------------------------------------------
    def _tol_met(self, history, tol):
        """Whether the last two evaluated objectives of ``history`` meet ``tol``."""
        objectives = [r["objective"] for r in history if "objective" in r][-2:]
        if len(objectives) < 2:
            return False
        previous, last = objectives
        return abs(previous - last) <= tol * max(abs(previous), 1e-300)

    def _check_result(self, state, blocks, ctx, history):
        """Set ``converged_`` and ``degenerate_`` from this fit's rounds (``history``); warn
        at most once per fit.

        ``converged_`` is False only when ``tol`` > 0 was never met although every round of
        ``max_iter`` ran (an early stop by ``callback`` counts as the caller's choice).
        """
        tol, rounds = ctx.settings["tol"], self._engine_params(ctx.settings)["max_iter"]
        self.converged_ = not (tol and len(history) >= rounds
                               and not self._tol_met(history, tol))
        self.degenerate_ = self._degenerate(state, blocks, ctx, history)
        # stacklevel 5: the caller of fit (through _fit_context, fit and _fit)
        name = type(self).__name__
        if self.degenerate_ is not None:
            warnings.warn(f"{name}: {self.degenerate_}.", DegenerateFitWarning, stacklevel=5)
        if not self.converged_:
            warnings.warn(f"{name}: tol={tol:g} was not met within max_iter={rounds} rounds; "
                          "raise max_iter or tol.", ConvergenceWarning, stacklevel=5)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True  # every federated estimator takes sparse X
        return tags


def objective_not_decreasing(history):
    """The reason a fit's objective never went down (None when it did): a frozen model when
    every evaluated objective is the same, else no decrease from the first to the last."""
    objectives = [r["objective"] for r in history if "objective" in r]
    if len(objectives) < 2:
        return None
    if all(o == objectives[0] for o in objectives):
        return "the model is frozen (the objective did not change over the fit)"
    if objectives[-1] >= objectives[0]:
        return (f"the objective did not decrease over the fit ({objectives[0]:.6g} after the "
                f"first round, {objectives[-1]:.6g} after the last)")
    return None


# ---- the steps of a fit as functions of the estimator: what the Flower server and sites run
# (sklearn_fedmf.flower), the same code as ``FederatedEstimator._fit`` --------------------------
def fit_settings(estimator):
    """Every setting of a fit of ``estimator`` by name, resolved once and read-only, as
    ``fit`` holds them in its ``FitContext``."""
    return MappingProxyType(estimator._settings())


def check_params(estimator):
    """Validate the estimator's parameters, as ``fit`` does first."""
    estimator._validate_params()


def fit_protocol(estimator, ctx):
    """The ``FederatedProtocol`` a fit of ``estimator`` runs for the context ``ctx`` (secure
    when ``secure_aggregation`` asks for it)."""
    return estimator._secure_protocol(estimator._make_protocol(ctx), ctx.settings)


def run_rounds(estimator, protocol, clients, ctx, early_stopping=None):
    """Run the fit's rounds on ``clients`` (its blocks, or a transport); the final
    ``FederationState``."""
    if early_stopping is None:  # (a family without validation keeps the three-argument _run)
        return estimator._run(protocol, clients, ctx)
    return estimator._run(protocol, clients, ctx, early_stopping)


def collect_fit(estimator, state, blocks, ctx):
    """Set the fitted attributes from the final ``state`` (``n_clients_``, ``n_iter_``,
    ``history_`` and the family's own)."""
    estimator.n_clients_ = ctx.n_clients
    estimator.n_iter_ = state.n_rounds
    estimator.history_ = list(state.history)
    estimator._collect(state, blocks, ctx)
