"""FedBlend: a federated linear blend of completion estimators, shaped like scikit-learn's
``StackingRegressor``.

The members fit over one federation: the blend draws the client partition and each client's
validation ratings once (the completion base's own
:func:`~sklearn_fedmf.engine._fit.validation_split` on the same seed, so these are exactly the
entries each member would hold out by itself with the blend's ``random_state``, clients and
``validation_fraction``) and fits every member on the training part, with the validation part as its
early-stopping set. The members keep their factor parts: the biases floor of a standalone fit
(:mod:`._validation`) is skipped, since the blend holds the biases model as a member and its weights
decide (a member that fell back to the biases would only be a copy of it). Each client then sends
the sums of the blend's ridge regression over its validation ratings
(:mod:`._fed_blend_stats`); the server adds them (a secure sum under
``secure_aggregation``) and solves for the weights. A weighted sum of factor models is one
factor model (the members' factors side by side), so prediction, fold-in, the pairs API and
top-N lists are the factor models' own.
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin, _fit_context, clone
from sklearn.utils import Bunch
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.metaestimators import _BaseComposition
from sklearn.utils.validation import check_is_fitted, validate_data

from ..._pairs import FactorModel, predict_pairs, score_block
from ...engine._client_data import (
    check_dense_size,
    check_like,
    check_ratings,
    reject_duplicates,
    resolve_clients,
)
from ...engine._exchange import sum_securely
from ...engine._federation import make_entropy, nbytes, partition_rng
from ...engine._fit import FEDERATION_CONSTRAINTS, validation_split
from ...exceptions import FedMFWarning
from .._validation import EARLY_STOPPING_MIN_RATINGS
from ._fed_blend_stats import (
    blend_sse,
    client_blend_stats,
    member_sse,
    solve_blend,
    stats_vector,
    unpack_stats,
)

__all__ = ["FedBlend", "default_members"]

_BLEND_SUM = 10  # the blend's secure sums: their seed kind (the engine's are 0 to 7, the floor's 9)
# refit=True refits a member only when it carries this share of the blend's weight
REFIT_MIN_SHARE = 0.2
# final_alpha="auto": the least strength generalized cross-validation may choose (the rule
# before "auto"); below it, on Coat's 548 validation ratings, GCV chose 0.12 and the blend
# lost 0.055 on test (bench_blend_rules-2026-12.md)
AUTO_MIN_ALPHA = 10.0


def default_members():
    """The library's rating estimators with their defaults, the biases model included:
    ``[(name, estimator), ...]`` as ``FedBlend(estimators=None)`` uses them."""
    from .._fed_baseline._fed_baseline import FedBaseline
    from .._fedmavg._fedmavg import FedMAvg
    from .._fedmc_admm._fedmc_admm import FedMCADMM
    from .._fedmgs._fedmgs import FedMGS
    from .._rfrec._rfrec import RFRec

    return [("fedbaseline", FedBaseline()), ("fedmcadmm", FedMCADMM()), ("fedmavg", FedMAvg()),
            ("fedmgs", FedMGS()), ("rfrec", RFRec())]


class FedBlend(TransformerMixin, _BaseComposition):
    """Federated blend of completion estimators: a ridge-weighted sum of their predictions.

    Like :class:`~sklearn.ensemble.StackingRegressor`, with a final linear model learned on
    the federation's validation ratings instead of cross-validated predictions. The members
    fit over one federation: the same clients, the same validation ratings held out by each
    client (``validation_fraction``; they are each member's early-stopping set) and the same
    ``random_state`` stream. Then each client sends, for its validation ratings, the sums the
    blend's ridge regression needs (``D^T D``, ``D^T r``, ``r^T r`` and the count, with ``D``
    the members' predictions and an intercept column): nothing else. The server adds them
    (one secure sum with ``secure_aggregation=True``) and solves::

        min_w  sum (r - c - sum_k w_k p_k)^2 + final_alpha sum_k (w_k - w0_k)^2

    with the prior weights ``w0`` the members' evidence weights (``final_alpha="auto"``) or
    the plain average ``1/K`` (a number). The blended model is
    itself a factor model (the members' factors side by side, each scaled by its weight), so
    :class:`~sklearn_fedmf.RatingRegressor`, ``recommend`` and fold-in take it as they take
    any member.

    Parameters
    ----------
    estimators : list of (str, estimator) or None, default=None
        The members: completion estimators of ``loss="squared"`` with the identity link. An
        estimator may be ``"drop"`` (left out). None: the library's rating estimators with
        their defaults (:func:`default_members`): ``fedbaseline`` (the biases model),
        ``fedmcadmm``, ``fedmavg``, ``fedmgs`` and ``rfrec``. Nested parameters are named as
        in ``StackingRegressor``: ``fedmgs__n_components`` (setting one on the default
        members first makes the default list explicit).
    final_alpha : "auto" or float, default="auto"
        Strength of the ridge on the members' weights, in
        :class:`~sklearn.linear_model.Ridge`'s units (the sum of squared errors over the
        validation ratings: it weighs like ``final_alpha`` validation ratings).

        - ``"auto"``: the weights shrink toward the members' evidence weights
          ``w0_k ~ exp(-(SSE_k - SSE_min) / (2 SSE_min / n))`` (their validation errors
          ``SSE``: about all on the best member when the validation set tells the members
          apart, spread when it does not), the intercept's activity slope too (toward 0),
          and the strength is chosen by generalized cross-validation from the same sums
          (:func:`._fed_blend_stats.solve_blend`), at least ``AUTO_MIN_ALPHA`` (10), up to
          the prior alone. Chosen on ciao, filmtrust, ML-100K, Jester and Coat's
          self-selected ratings (where the free slope and GCV below 10 over-fitted 548
          validation ratings), confirmed on Coat's random test, ciao-full, ml-latest-small
          and a second split of all (``benchmarks/results/bench_blend_rules-2026-12.md``):
          test RMSE -0.007 to +0.0006 against the old rule; the heavy weight on the best
          member also means fewer refits.
        - A number: toward the plain average ``1/K``, the intercept's slope free (the rule
          before ``"auto"``). Measured on ml-latest-small and ML-100K (about 8,000
          validation ratings each), from 0 to 10 the test RMSE moves by less than 0.0004;
          at 80 it is 0.001 to 0.002 worse.
    activity_weights : bool, default=True
        Let each member's weight (and the intercept) vary linearly with ``z``, the user's
        centred log number of ratings (the Netflix Prize blends' "support"); still learned
        from summed statistics (the design gets the columns ``z`` and ``z p_k``).
    refit : bool, default=True
        After the weights are chosen, refit the members on all their clients' training
        ratings (the validation ratings included), with early stopping off and the number of
        rounds their validation chose; the weights stay as learned. Only the members that
        carry at least a fifth of the blend's weight (``|w_k| / sum |w|``; one or two, the
        others kept as validated). Measured (``benchmarks/bench_blend.py``): test RMSE 0.003
        to 0.005 lower on ml-latest-small, MovieLens 100K and the ML-1M shape, within
        0.0003 of refitting every member, for a third to a half of that time.
    n_clients : int, default=10
        Clients the rows are split into when ``fit`` gets no ``clients``.
    clients_per_round : int, float or None, default=None
        Passed to every member that has it (None: every client each round).
    validation_fraction : float, default=0.1
        Share of each client's ratings held out for the members' early stopping and the
        blend's weights.
    callback : callable, default=None
        Passed to every member (``callback(round, info)`` after each of its rounds); the
        blend's own exchange calls it once more with ``info["member"] = "blend"`` and
        ``info["uploads"]`` (each client's statistics).
    random_state : int, RandomState instance or None, default=None
        Seeds the partition, the validation ratings and every member (all get the same
        integer seed, drawn once).
    n_jobs : int or None, default=None
        Passed to every member.
    verbose : int, default=0
        Passed to every member.
    secure_aggregation : bool or SecureAggregation, default=False
        Passed to every member; the blend's statistics then reach the server as secure sums
        (first the counts, then the statistics divided by the total count).

    Attributes
    ----------
    estimators_ : list of estimators
        The fitted members (``"drop"`` ones left out).
    named_estimators_ : :class:`~sklearn.utils.Bunch`
        The fitted members by name.
    weights_ : ndarray of shape (n_members,)
        Each member's weight (for a user of average activity with ``activity_weights``).
    intercept_ : float
        The blend's constant, added to ``mean_``.
    final_alpha_ : float
        The ridge's strength used (``inf``: the prior weights alone).
    activity_coef_ : ndarray of shape (n_members + 1,) or None
        With ``activity_weights``: the slopes in ``z`` of the intercept and of each weight.
    member_validation_rmse_ : dict
        Each member's RMSE on the validation ratings (from the summed statistics).
    validation_rmse_ : float
        The blend's RMSE on the validation ratings.
    member_eval_rmse_, eval_rmse_ : dict and float
        The same on ``fit``'s ``eval_set`` (when given).
    mean_ : float
        Mean training rating (of the training part the members saw).
    rating_range_ : tuple of float
    history_ : list of dict
        Every member's rounds (each record with its ``"member"``), then one record of the
        blend's exchange (its bytes, the members' validation RMSEs and the weights).
    n_iter_ : int
        Rounds of every member plus the blend's exchange.
    n_clients_ : int
    clients_ : ndarray of shape (n_users,)
    n_users_ : int
    n_features_in_ : int

    See Also
    --------
    sklearn.ensemble.StackingRegressor : The non-federated composition it follows.

    Examples
    --------
    >>> from sklearn_fedmf import FedBaseline, FedBlend, FedMGS
    >>> from sklearn_fedmf.datasets import make_ratings
    >>> X = make_ratings(200, 60, 4000, random_state=0).X
    >>> blend = FedBlend([("biases", FedBaseline()), ("mgs", FedMGS(max_iter=10))],
    ...                  n_clients=5, random_state=0).fit(X)
    >>> sorted(blend.named_estimators_)
    ['biases', 'mgs']
    >>> blend.validation_rmse_ <= min(blend.member_validation_rmse_.values()) + 1e-9
    True
    """

    _solver_params: dict = {}  # (no solver constants: the members have theirs)
    _parameter_constraints: dict = {
        "estimators": [list, None],
        "final_alpha": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "activity_weights": ["boolean"],
        "refit": ["boolean"],
        "n_clients": FEDERATION_CONSTRAINTS["n_clients"],
        "clients_per_round": [Interval(Integral, 1, None, closed="left"),
                              Interval(Real, 0, 1, closed="right"), None],
        "validation_fraction": [Interval(Real, 0, 1, closed="neither")],
        **{name: FEDERATION_CONSTRAINTS[name] for name in (
            "callback", "random_state", "n_jobs", "verbose", "secure_aggregation")},
    }

    def __init__(self, estimators=None, *, final_alpha="auto", activity_weights=True,
                 refit=True, n_clients=10, clients_per_round=None, validation_fraction=0.1,
                 callback=None, random_state=None, n_jobs=None, verbose=0,
                 secure_aggregation=False):
        self.estimators = estimators
        self.final_alpha = final_alpha
        self.activity_weights = activity_weights
        self.refit = refit
        self.n_clients = n_clients
        self.clients_per_round = clients_per_round
        self.validation_fraction = validation_fraction
        self.callback = callback
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.secure_aggregation = secure_aggregation

    # ---- parameters (StackingRegressor's naming: member__param) ------------------------------
    def _members(self):
        return default_members() if self.estimators is None else self.estimators

    def get_params(self, deep=True):
        """Parameters of the blend and, with ``deep``, of its members.

        Parameters
        ----------
        deep : bool, default=True
            Also return the members (by name) and their parameters (``name__param``; the
            default members' when ``estimators`` is None).

        Returns
        -------
        params : dict
            Parameter names mapped to their values.
        """
        out = BaseEstimator.get_params(self, deep=False)
        if not deep:
            return out
        members = self._members()
        try:
            out.update(members)
        except (TypeError, ValueError):
            return out
        for name, estimator in members:
            if hasattr(estimator, "get_params"):
                for key, value in estimator.get_params(deep=True).items():
                    out[f"{name}__{key}"] = value
        return out

    def set_params(self, **params):
        """Set the blend's parameters, a member (``name=estimator``) or a member's
        (``name__param``).

        With ``estimators`` None, naming a default member first makes the default list
        explicit (the members of :func:`default_members`).

        Parameters
        ----------
        **params : dict
            Parameters of the blend, members by name, or ``name__param`` of a member.

        Returns
        -------
        self : FedBlend
            The blend.
        """
        if self.estimators is None and "estimators" not in params:
            names = {name for name, _ in default_members()}
            if any(key.split("__", 1)[0] in names for key in params):
                self.estimators = default_members()
        return self._set_params("estimators", **params)

    def _checked_members(self):
        members = self._members()
        if not members:
            raise ValueError("FedBlend needs at least one member in estimators.")
        names, ests = zip(*members)
        self._validate_names(names)
        self._check_estimators_are_instances(ests)
        kept = [(n, e) for n, e in members if not (isinstance(e, str) and e == "drop")]
        if not kept:
            raise ValueError("Every member of FedBlend is 'drop'; keep at least one.")
        for name, est in kept:
            if not (hasattr(est, "fit") and hasattr(est, "_factor_model")):
                raise TypeError(f"FedBlend member {name!r} ({type(est).__name__}) is not a "
                                "completion estimator of sklearn_fedmf.")
            if est.get_params(deep=False).get("loss", "squared") != "squared":
                raise ValueError(f"FedBlend member {name!r} has loss={est.loss!r}: the blend "
                                 'fits ratings (loss="squared").')
        return kept

    # ---- fit ---------------------------------------------------------------------------------
    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y=None, *, clients=None, eval_set=None):
        """Fit the members over one federation, then the blend's weights.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_users, n_items)
            Training ratings: sparse (every stored entry observed) or dense with NaN missing.
        y : Ignored
            Not used, present for API consistency by convention.
        clients : array-like of shape (n_users,), default=None
            Client label of each row; when None rows are split into ``n_clients`` clients.
        eval_set : {array-like, sparse matrix} of shape (n_users, n_items), default=None
            Held-out ratings of the same rows, scored at the end for the blend and every
            member (``eval_rmse_``, ``member_eval_rmse_``); no choice reads them.

        Returns
        -------
        self : object
            The fitted blend.
        """
        members = self._checked_members()
        X = self._validate_ratings(X, reset=True)
        if X.nnz == 0:
            raise ValueError("X has no observed entry; there is nothing to fit.")
        eval_X = None if eval_set is None else check_like(eval_set, X, name="eval_set")
        if clients is None and self.n_clients > X.shape[0]:
            raise ValueError(
                f"n_clients={self.n_clients} is larger than the number of rows "
                f"(n_samples={X.shape[0]}); every client needs at least one row.")
        entropy = make_entropy(self.random_state)
        labels, codes, n_clients = resolve_clients(X.shape[0], clients, self.n_clients,
                                                   "random", partition_rng(entropy))
        X_train, X_valid = validation_split(X, codes, n_clients, self.validation_fraction,
                                            entropy)
        self.mean_ = float(X_train.data.mean())  # (each client: its sum and count)
        self.rating_range_ = (float(X_train.data.min()), float(X_train.data.max()))
        self.n_users_, self.clients_, self.n_clients_ = X.shape[0], labels, n_clients
        self._entropy = entropy
        history, fitted = [], []
        with _once_per_fit():
            for name, est in members:
                member = clone(est).set_params(**self._member_overrides(est, X.nnz, entropy))
                with _floor_skipped(member):
                    member.fit(X_train, clients=labels,
                               eval_set=X_valid if _validates(member) else None)
                fitted.append((name, member))
                history += [{**record, "member": name} for record in member.history_]
        self._set_members(fitted)
        # (each client: its users' rating counts; the server: their total)
        self._counts = np.diff(X.indptr)
        self._activity_center = np.log1p(X.nnz / max(X.shape[0], 1))
        record = self._fit_weights(X, X_valid, codes, n_clients)
        if self.refit:
            with _once_per_fit():
                self._refit_members(X, labels, history)
        record["train_rmse"] = self._rmse_at(X, X)
        if eval_X is not None:
            self._score_eval(X, eval_X, record)
        history.append(record)
        self.history_, self.n_iter_ = history, len(history)
        return self

    def _member_overrides(self, est, nnz, entropy):
        """The blend's federation settings on a member: its seed, sampling, compute and
        secure aggregation; the validation is the blend's (the held-out ratings come in as
        its ``eval_set``), early stopping ``"auto"`` resolved as the member would on ``X``."""
        params = est.get_params(deep=False)
        overrides = {"random_state": entropy, "n_jobs": self.n_jobs, "verbose": self.verbose,
                     "secure_aggregation": self.secure_aggregation,
                     "clients_per_round": self.clients_per_round}
        if self.callback is not None:
            overrides["callback"] = self.callback
        if "validation_fraction" in params:
            early = params["early_stopping"]
            if early == "auto":
                early = params["validation_fraction"] is not None and (
                    nnz >= EARLY_STOPPING_MIN_RATINGS)
            overrides.update(validation_fraction=None, early_stopping=bool(early))
        return {k: v for k, v in overrides.items() if k in params}

    def _set_members(self, fitted):
        self.estimators_ = [member for _, member in fitted]
        self.named_estimators_ = Bunch(**dict(fitted))
        self._names = [name for name, _ in fitted]
        for name, member in fitted:
            if member._factor_model().link is not None:
                raise ValueError(f"FedBlend member {name!r} predicts through a link (RFRec's "
                                 'link="sigmoid"); the blend adds members\' predictions '
                                 'linearly and needs link="identity".')

    def _activity(self, counts):
        return np.log1p(counts) - self._activity_center

    def _fit_weights(self, X, X_valid, codes, n_clients):
        """Each client's statistics over its validation ratings, their sum, the ridge."""
        start = time.perf_counter()
        rows = np.repeat(np.arange(X.shape[0]), np.diff(X_valid.indptr))
        cols = X_valid.indices
        P = np.column_stack([predict_pairs(m._factor_model(), rows, cols, m.mean_)
                             for m in self.estimators_]) - self.mean_
        r = X_valid.data - self.mean_
        z = self._activity(np.diff(X.indptr))[rows] if self.activity_weights else None
        client = codes[rows]
        order = np.argsort(client, kind="stable")
        bounds = np.searchsorted(client[order], np.arange(n_clients + 1))
        uploads = {}
        for c in range(n_clients):  # (each client over its own validation ratings)
            at = order[bounds[c]:bounds[c + 1]]
            uploads[c] = client_blend_stats(P[at], r[at], None if z is None else z[at])
        gram, cross, ss, count, up, down = self._exchange(uploads, n_clients)
        K = len(self.estimators_)
        if self.final_alpha == "auto":
            coef, chosen = solve_blend(gram, cross, count, alpha="gcv", n_members=K,
                                       activity=self.activity_weights, target="soft", ss=ss,
                                       free_slope=False, min_alpha=AUTO_MIN_ALPHA, info=True)
            self.final_alpha_ = float(chosen["alpha"])
        else:
            coef = solve_blend(gram, cross, count, alpha=self.final_alpha, n_members=K,
                               activity=self.activity_weights)
            self.final_alpha_ = float(self.final_alpha)
        down += coef.nbytes * n_clients  # (the weights reach every client)
        self._coef = coef
        self.intercept_, self.weights_ = float(coef[0]), coef[1:K + 1].copy()
        self.activity_coef_ = coef[K + 1:].copy() if self.activity_weights else None
        n = max(count, 1.0)
        sse = member_sse(gram, cross, ss, K)
        self.member_validation_rmse_ = {name: float(np.sqrt(max(s, 0.0) / n))
                                        for name, s in zip(self._names, sse)}
        self.validation_rmse_ = float(np.sqrt(max(blend_sse(gram, cross, ss, coef), 0.0) / n))
        if self.callback is not None:
            self.callback(1, {"member": "blend", "uploads": uploads})
        return {"member": "blend", "round": 1, "bytes_uploaded": up, "bytes_downloaded": down,
                "seconds": time.perf_counter() - start, "n_validation": int(count),
                "validation_rmse": self.validation_rmse_,
                "member_validation_rmse": dict(self.member_validation_rmse_),
                "weights": dict(zip(self._names, self.weights_.tolist())),
                "final_alpha": self.final_alpha_,
                "intercept": self.intercept_}

    def _exchange(self, uploads, n_clients):
        """The server's totals ``(gram, cross, ss, count)`` and the bytes ``(up, down)``."""
        if self.secure_aggregation is False:
            total = {key: sum(u[key] for u in uploads.values()) for key in uploads[0]}
            up = sum(nbytes(u) for u in uploads.values())
            return (total["gram"], total["cross"], float(total["ss"][0]),
                    float(total["count"][0]), up, 0)
        kw = dict(n_clients=n_clients)
        # the count first, then every statistic over it (kept within the encoding's range)
        # (a count in units of 1024 stays within the encoding's clip up to 67 million)
        counts = sum_securely({c: u["count"] / 1024 for c, u in uploads.items()},
                              self.secure_aggregation, **kw,
                              seed=np.random.SeedSequence(self._entropy, spawn_key=(_BLEND_SUM, 0)))
        count = float(np.rint(counts.sum[0] * 1024))
        n = max(count, 1.0)
        stats = sum_securely({c: stats_vector(u) / n for c, u in uploads.items()},
                             self.secure_aggregation, **kw,
                             seed=np.random.SeedSequence(self._entropy, spawn_key=(_BLEND_SUM, 1)))
        n_columns = uploads[0]["cross"].shape[0]
        gram, cross, ss = unpack_stats(stats.sum * n, n_columns)
        (up, down), (up_stats, down_stats) = counts.total_bytes(), stats.total_bytes()
        up, down = up + up_stats, down + down_stats + 8 * n_clients  # (the count, broadcast)
        return gram, cross, ss, count, up, down

    def _refit_members(self, X, labels, history):
        """The members that carry at least ``REFIT_MIN_SHARE`` of the blend's weight
        (``|w_k| / sum |w|``) again on all the training ratings, as many rounds as
        validated; the others are kept as validated. Measured on ml-latest-small, ML-100K
        and the ML-1M shape, refitting these (one or two members) gives the blend within
        0.0003 of refitting every member for a third to a half of the refits' time (the
        slowest member, RFRec, weighs 0.3% on the ML-1M shape)."""
        weights = np.abs(self.weights_)
        share = weights / max(weights.sum(), 1e-300)
        refitted = []
        for k, (name, member) in enumerate(zip(self._names, self.estimators_)):
            again = clone(member)
            params = again.get_params(deep=False)
            if "early_stopping" in params and getattr(member, "best_iteration_", None):
                again.set_params(early_stopping=False, max_iter=int(member.best_iteration_))
                if not member.factors_used_:  # (the validation chose the biases alone)
                    refitted.append((name, member))
                    continue
            if share[k] < REFIT_MIN_SHARE:
                refitted.append((name, member))
                continue
            again.fit(X, clients=labels)
            history += [{**record, "member": name, "refit": True}
                        for record in again.history_]
            refitted.append((name, again))
        self._set_members(refitted)

    def _rmse_at(self, X, ratings):
        """The blend's RMSE at the stored entries of ``ratings`` (rows of the fit)."""
        return -self._score_rows(X, ratings, self._factor_model())

    def _score_eval(self, X, eval_X, record):
        rows = np.repeat(np.arange(X.shape[0]), np.diff(eval_X.indptr))
        users = np.where(np.diff(X.indptr)[rows] > 0, rows, -1)
        truth = eval_X.data

        def rmse(model, fallback, clip):
            pred = clip(predict_pairs(model, users, eval_X.indices, fallback))
            return float(np.sqrt(np.mean((pred - truth) ** 2)))

        self.member_eval_rmse_ = {name: rmse(m._factor_model(), m.mean_, m._clip)
                                  for name, m in zip(self._names, self.estimators_)}
        self.eval_rmse_ = rmse(self._factor_model(), self.mean_, self._clip)
        record["eval_rmse"] = self.eval_rmse_
        record["member_eval_rmse"] = dict(self.member_eval_rmse_)

    # ---- the blended factor model --------------------------------------------------------
    def _validate_ratings(self, X, name="X", reset=False):
        reject_duplicates(X, name)
        X = validate_data(self, X, accept_sparse=True, dtype=[np.float64, np.float32],
                          reset=reset, ensure_all_finite="allow-nan")
        return check_ratings(X, name=name, dtype=np.float64, missing_values=np.nan)

    def _check_X(self, X, name="X"):
        """``X`` as the CSR ratings the blend's fold-in reads (on the rating scale)."""
        check_is_fitted(self)
        return self._validate_ratings(X, name)

    def _factor_model(self, Xc=None):
        """The blend as one :class:`~sklearn_fedmf._pairs.FactorModel`: each member's
        factors scaled by its (user's) weight, side by side; ``Xc`` (from ``_check_X``) folds
        new rows in through every member."""
        models = []
        for m in self.estimators_:
            if Xc is None:
                models.append(m._factor_model())
            else:
                Xm = Xc.copy()
                Xm.data -= m._offset
                models.append(m._factor_model(Xm))
        n_rows = models[0].user_factors.shape[0]
        n_items = models[0].item_factors.shape[0]
        counts = self._counts if Xc is None else np.diff(Xc.indptr)
        W, intercept, W_cold, c_cold = self._user_weights(counts)
        user_bias = intercept - c_cold
        item_bias = np.zeros(n_items)
        U_parts, V_parts, a_cols = [], [], []
        for k, fm in enumerate(models):
            if fm.user_bias is not None:
                user_bias = user_bias + W[:, k] * fm.user_bias
            a = (fm.offset - self.mean_) + (0.0 if fm.item_bias is None else fm.item_bias)
            a = np.broadcast_to(np.asarray(a, dtype=np.float64), (n_items,))
            item_bias = item_bias + W_cold[k] * a
            a_cols.append(a)
            if fm.user_factors.shape[1]:
                U_parts.append(W[:, k:k + 1] * fm.user_factors)
                V_parts.append(np.asarray(fm.item_factors, dtype=np.float64))
        if self.activity_weights:  # the user's weight minus the cold weight, on each a_k
            U_parts.append(W - W_cold)
            V_parts.append(np.column_stack(a_cols))
        U = np.ascontiguousarray(np.hstack(U_parts)) if U_parts else np.zeros((n_rows, 0))
        V = np.ascontiguousarray(np.hstack(V_parts)) if V_parts else np.zeros((n_items, 0))
        return FactorModel(U, V, user_bias, item_bias, self.mean_ + c_cold)

    def _user_weights(self, counts):
        """``(W, c, W_cold, c_cold)``: each row's weights of the members and intercept for
        its number of ratings ``counts``, and those of a row without any."""
        K, coef = len(self.estimators_), self._coef
        w0, c0 = coef[1:K + 1], coef[0]
        n_rows = counts.shape[0]
        if not self.activity_weights:
            return np.broadcast_to(w0, (n_rows, K)), np.full(n_rows, c0), w0, c0
        slopes = self.activity_coef_
        z, z_cold = self._activity(counts), self._activity(0)
        return (w0 + np.outer(z, slopes[1:]), c0 + slopes[0] * z,
                w0 + z_cold * slopes[1:], c0 + slopes[0] * z_cold)

    def _clip(self, values):
        return np.clip(values, *self.rating_range_)

    # ---- predict, score ------------------------------------------------------------------
    def predict(self, X, at=None):
        """Blended ratings for the rows of ``X`` (each member folds the rows in).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_rows, n_items)
            Observed ratings of the rows.
        at : {array-like, sparse matrix} of shape (n_rows, n_items), default=None
            Where to predict (the stored entries of a sparse matrix; dense: its non-NaN
            entries); the result is then a CSR matrix of that pattern.

        Returns
        -------
        ratings : ndarray of shape (n_rows, n_items) or csr_matrix
            Clipped to the training rating range; a row without ratings predicts the blend
            of the members' item biases.
        """
        Xc = self._check_X(X)
        model = self._factor_model(Xc)
        if at is not None:
            pattern = check_like(at, Xc, name="at")
            values = self._predict_entries(Xc, model, pattern)
            return sp.csr_matrix((values, pattern.indices, pattern.indptr), shape=pattern.shape)
        n_rows, n_items = Xc.shape
        check_dense_size(n_rows, n_items, "predict(X)")
        P = score_block(model, np.arange(n_rows)) + model.offset
        cold = np.diff(Xc.indptr) == 0
        if cold.any():
            P[cold] = predict_pairs(model, np.full(n_items, -1), np.arange(n_items), self.mean_)
        return self._clip(P)

    def transform(self, X):
        """The rows' factors in the blended model: each member's fold-in factors scaled by
        the row's weight for that member, side by side (with ``activity_weights``, then the
        row's weights minus a cold row's).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_rows, n_items)
            Observed ratings of the rows.

        Returns
        -------
        U : ndarray of shape (n_rows, n_factors)
            ``U @ V.T`` plus the biases is the blend's score; the members' ranks add up.
        """
        return self._factor_model(self._check_X(X)).user_factors

    def _predict_entries(self, Xc, model, pattern):
        rows = np.repeat(np.arange(pattern.shape[0]), np.diff(pattern.indptr))
        users = np.where((np.diff(Xc.indptr) == 0)[rows], -1, rows)
        return self._clip(predict_pairs(model, users, pattern.indices, self.mean_))

    def score(self, X, y=None):
        """Negative RMSE of the blend (greater is better).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_rows, n_items)
            Observed ratings of the rows, used for fold-in.
        y : {array-like, sparse matrix} of shape (n_rows, n_items), default=None
            Held-out ratings of the same rows, where the error is measured; None: at ``X``'s
            own entries. A 1-D ``y`` is ignored (as ``KMeans.score`` ignores ``y``).

        Returns
        -------
        score : float
            ``-sqrt(mean squared error)`` over the evaluated entries.
        """
        Xc = self._check_X(X)
        if y is not None and not sp.issparse(y) and np.ndim(y) == 1:
            y = None
        target = Xc if y is None else check_like(y, Xc, name="y")
        if target.nnz == 0:
            raise ValueError("There is no rating to score: the evaluated matrix is empty.")
        return self._score_rows(Xc, target, self._factor_model(Xc))

    def _score_rows(self, Xc, target, model):
        pred = self._predict_entries(Xc, model, target)
        return -float(np.sqrt(np.mean((pred - target.data) ** 2)))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.input_tags.allow_nan = True
        tags.target_tags.required = False
        return tags


@contextmanager
def _once_per_fit():
    """The members' package warnings, each category once per blend fit (the first message,
    with how many members raised it); other warnings pass through as raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    first, times = {}, {}
    for w in caught:
        if not issubclass(w.category, FedMFWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            continue
        first.setdefault(w.category, str(w.message))
        times[w.category] = times.get(w.category, 0) + 1
    for category, message in first.items():
        more = f" (and {times[category] - 1} more of this kind)" if times[category] > 1 else ""
        warnings.warn(f"FedBlend member: {message}{more}", category, stacklevel=4)


def _validates(member):
    """Whether ``member`` early-stops on the validation ratings (then they are its eval set)."""
    return bool(member.get_params(deep=False).get("early_stopping", False))


@contextmanager
def _floor_skipped(member):
    """``member``'s biases floor skipped for the fits inside (an instance attribute over its
    class's ``_floor_class``, removed after them: the fitted member, its clones and every
    standalone fit keep the floor). With the floor, the members whose factor part fell back
    to the biases were copies of the biases member and the blend lost their diversity
    (``benchmarks/results/bench_blendfloor-2026-12.md``: Jester 4.6310 -> 4.5969 test RMSE
    without it)."""
    if getattr(member, "_floor_class", None) is None:
        yield
        return
    member._floor_class = None
    try:
        yield
    finally:
        del member._floor_class
