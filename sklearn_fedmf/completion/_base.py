"""The scikit-learn contract shared by the matrix-completion estimators.

A subclass supplies the algorithm (``_make_protocol``) and its extra parameter constraints (and
where its states keep the factors when not under the shared names ``"Vt"`` and ``"U"``).
Everything a user touches (validation, client partition, centring, warm start, fold-in,
predict, score) lives here once; the fit itself is the skeleton of
:class:`~sklearn_fedmf.engine._fit.FederatedEstimator`.
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from sklearn.base import _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted, validate_data

from .._biases import free_item, free_user, init_item, user_step_view, with_user
from .._docstrings import SHARED_PARAMETERS, Substitution, parameter_entries, solver_key
from .._kernels import grad_rows, ridge_fold_in, squared_error
from .._pairs import FactorModel, predict_pairs, score_block, top_n
from .._prox import elastic_net_value, item_counts, prox_elastic_net, row_alpha
from ..engine._client_data import (
    center_and_scale,
    check_dense_size,
    check_like,
    check_ratings,
    reject_duplicates,
    warn_if_zero_filled,
)
from ..engine._fit import (
    FEDERATION_CONSTRAINTS,
    SIMULATION_SETTINGS,
    FactorTransformerMixin,
    FederatedEstimator,
    objective_not_decreasing,
)
from ..engine._groups import GroupStates
from ..engine._page_out import paged_out
from ..exceptions import UnobservedItemsWarning
from ._implicit import IMPLICIT_CONFIDENCE
from ._losses import LOSSES
from ._validation import FLOOR_Z, biases_floor, floor_on_all_ratings

__all__ = ["COMPLETION_DOCS", "FACTOR_SETTINGS", "FederatedMFBase", "FEDERATION_CONSTRAINTS",
            "FOLD_IN_DATA", "IMPLICIT_SETTINGS", "moved_to_solver_params"]

# The ``solver_params`` keys of the factor models' regularizer and start (FedMC-ADMM, FedMAvg,
# FedMGS; ``init_scale``'s default is each class's own).
FACTOR_SETTINGS: dict = {
    "l1_ratio": (0.0, [Interval(Real, 0, 1, closed="both")]),
    "positive": (False, ["boolean"]),
    "init_scale": (1.0, [Interval(Real, 0, None, closed="left")]),
}

# The completion estimators' docstring parts (``%(name)s`` lines, see ``_docstrings``): the
# shared parameters and the shared ``solver_params`` keys as sub-list items.
COMPLETION_DOCS: dict = {
    **SHARED_PARAMETERS,
    "solver_l1_ratio": solver_key("l1_ratio", "float, default=0.0"),
    "solver_positive": solver_key("positive", "bool, default=False"),
    "solver_init_scale_1": solver_key("init_scale", "float, default=1.0"),
    "solver_simulation": "\n".join([
        solver_key("partition", '{"random", "contiguous"}, default="random"'),
        solver_key("dropout", "float, default=0.0"),
        solver_key("eval_every", "int, default=1"),
        solver_key("validation_panel", '"auto", int or None, default=None'),
        solver_key("missing_values", "float, default=np.nan"),
        solver_key("on_client_error", '{"raise", "skip"}, default="raise"'),
    ]),
    "solver_center": solver_key("center", "bool, default=True"),
    # (the classes that train loss="implicit" list it; see IMPLICIT_SETTINGS)
    "solver_confidence": solver_key("confidence", 'float or "auto", default="auto"'),
}
# n_components=None: the rank of ``_loss_defaults`` for the loss (FedMAvg, FedMGS)
COMPLETION_DOCS["n_components_by_loss"] = SHARED_PARAMETERS["n_components"] + """
None: 5 with ``loss="squared"``; with ``loss="implicit"``, 32 at 100,000 interactions,
growing as the fifth root of their count in steps of 8 (48 at 1M; see the ranking guide)."""
COMPLETION_DOCS["solver_shared"] = "\n".join(
    [COMPLETION_DOCS["solver_center"], COMPLETION_DOCS["solver_simulation"]])
# FedMAvg's and FedMGS's tail of keys: the implicit confidence, the regularizer, the start
# at 1.0, the shared ones.
COMPLETION_DOCS["solver_factor_shared"] = "\n".join([
    COMPLETION_DOCS[key] for key in ("solver_confidence", "solver_l1_ratio", "solver_positive",
                                     "solver_init_scale_1", "solver_shared")])
# The fitted attributes every factor model has, under the same names.
COMPLETION_DOCS["fit_attributes"] = """\
item_bias_ : ndarray of shape (n_items,)
    ``b_i`` (``biased=True`` only).
user_bias_ : ndarray of shape (n_users,)
    ``b_u``, private to each client like its user factors (``biased=True`` only).
mean_ : float
    Mean training rating: subtracted before factorizing when ``center=True``, and the
    prediction for rows without any observed rating (cold start).
rating_range_ : tuple of float
    The training ratings' minimum and maximum (the bounds of ``clip``).
confidence_ : float
    The confidence scale used (``loss="implicit"`` only; ``solver_params["confidence"]``).
n_iter_ : int
    Rounds run.
n_users_ : int
    Rows (users) of the training matrix.
n_clients_ : int
clients_ : ndarray of shape (n_users,)
    Client label of each row."""
# The two factors of the factor models whose server holds one global V (not RFRec's average),
# then the attributes every factor model has.
COMPLETION_DOCS["factor_attributes"] = """\
components_ : ndarray of shape (n_components, n_items)
    The global item factor ``V``.
user_factors_ : ndarray of shape (n_users, n_components)
    The client-local factors ``U`` in row order (kept for analysis only).
""" + COMPLETION_DOCS["fit_attributes"]
COMPLETION_DOCS["outcome_attributes"] = """\
converged_ : bool
    False when ``tol`` > 0 was not met within ``max_iter`` rounds.
degenerate_ : str or None
    Why the fitted model is trivial (all-zero factors, a frozen model, an objective
    that did not decrease), or None. A fit that ends with ``converged_`` False or a
    ``degenerate_`` reason raises one
    :class:`~sklearn_fedmf.exceptions.DegenerateFitWarning`.
n_features_in_ : int"""
# The constructor's last parameters, headers included (the same in every class).
COMPLETION_DOCS["control_parameters"] = parameter_entries("clip", "callback", "warm_start")
COMPLETION_DOCS["compute_parameters"] = parameter_entries("n_jobs", "verbose", "solver_params")
# tol, the validation parameters and secure_aggregation, headers included (the same in every
# class that has them).
COMPLETION_DOCS["validation_parameters"] = "\n".join([
    "tol : float, default=0.0",
    *("    " + line for line in SHARED_PARAMETERS["tol"].splitlines()),
    parameter_entries("early_stopping", "validation_fraction", "n_iter_no_change")])
COMPLETION_DOCS["secure_parameter"] = parameter_entries("secure_aggregation")
COMPLETION_DOCS["run_parameters"] = "\n".join([
    COMPLETION_DOCS["control_parameters"], parameter_entries("random_state"),
    COMPLETION_DOCS["compute_parameters"]])


# The ``X`` entry of a fold-in (``transform``): ``%(fold_in_data)s``.
FOLD_IN_DATA = Substitution(fold_in_data="""\
X : {array-like, sparse matrix} of shape (n_rows, n_items)
    Observed ratings of the rows (sparse: stored entries; dense: NaN is missing).""")

# The ``solver_params`` key of ``loss="implicit"``, declared by each class that trains it
# (documented by ``%(solver_confidence)s``).
IMPLICIT_SETTINGS: dict = {
    "confidence": (IMPLICIT_CONFIDENCE, [Interval(Real, 0, None, closed="left"),
                                         StrOptions({"auto"})]),
}


def moved_to_solver_params(solver_params):
    """``_moved_params`` of a class whose former parameters are now the keys of its
    ``solver_params`` (a key that is still a parameter is left out by the class)."""
    return {key: f"solver_params['{key}']" for key in solver_params}


class FederatedMFBase(FactorTransformerMixin, FederatedEstimator):
    """Base class of the federated matrix-completion estimators (not for direct use)."""

    # Dtypes the solver runs in; other input is converted to float64.
    _fit_dtypes = (np.float64,)

    # The constructor's shared parameters (each class lists them in its own signature).
    _parameter_constraints: dict = {
        **{name: FEDERATION_CONSTRAINTS[name]
           for name in ("n_clients", "callback", "random_state", "n_jobs", "verbose")},
        "n_components": [Interval(Integral, 1, None, closed="left"), None],
        "clients_per_round": [
            Interval(Integral, 1, None, closed="left"),
            Interval(Real, 0, 1, closed="right"),
            None,
        ],
        "max_iter": [Interval(Integral, 1, None, closed="left"), None],
        "tol": [Interval(Real, 0, None, closed="left")],
        "early_stopping": [StrOptions({"auto"}), "boolean"],
        "validation_fraction": [Interval(Real, 0, 1, closed="neither"), None],
        "n_iter_no_change": [Interval(Integral, 1, None, closed="left")],
        "alpha_u": [Interval(Real, 0, None, closed="left")],
        "alpha_v": [Interval(Real, 0, None, closed="left")],
        "biased": ["boolean"],
        "loss": [StrOptions({"squared", "implicit"})],
        "clip": ["boolean"],
        "warm_start": ["boolean"],
        "solver_params": [dict, None],
    }
    # The shared keys of ``solver_params``: the simulation's settings and the data's
    # conventions (each class adds its papers' constants).
    _solver_params: dict = {
        **SIMULATION_SETTINGS,
        "missing_values": (np.nan, [Real]),
        "center": (True, ["boolean"]),
        # who reports the validation when a round samples its clients (EarlyStopping.panel)
        "validation_panel": (None, [StrOptions({"auto"}), Interval(Integral, 1, None,
                                                                   closed="left"), None]),
    }
    _default_settings: dict = {
        **FederatedEstimator._default_settings,
        "l1_ratio": 0.0, "positive": False, "regularization": "plain",
        # (a class without the validation parameters fits without validation)
        "early_stopping": False, "validation_fraction": None, "n_iter_no_change": 10,
    }
    # The key of the validation RMSE in a round's record and the two keys of a client's
    # ``client_metrics`` that are its validation report (squared-error sum, count).
    _validation_keys = ("eval_rmse", ("sse_eval", "n_eval"))
    # The biases-only floor of a validated fit (FedBaseline, set by each validated class: it
    # is a subclass of this base)
    _floor_class = None

    def __init__(self, n_components, *, alpha_u, alpha_v, biased, n_clients, clients_per_round,
                 max_iter, tol, early_stopping, validation_fraction, n_iter_no_change, clip,
                 warm_start, callback, random_state, n_jobs, verbose, solver_params,
                 loss="squared", secure_aggregation=False):
        # (not the skeleton's __init__: partition and on_client_error are solver_params keys)
        self.n_components = n_components
        self.alpha_u = alpha_u
        self.alpha_v = alpha_v
        self.biased = biased
        self.loss = loss
        self.n_clients = n_clients
        self.clients_per_round = clients_per_round
        self.max_iter = max_iter
        self.tol = tol
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.clip = clip
        self.warm_start = warm_start
        self.callback = callback
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose
        self.solver_params = solver_params
        self.secure_aggregation = secure_aggregation

    def _secure_refusal_reason(self):
        # (a parameter of the classes that have it; their default otherwise)
        if getattr(self, "regularization", "plain") == "weighted":
            return ('regularization="weighted" sends each client\'s ratings per item once, '
                    'which are not summed; use regularization="plain"')
        return super()._secure_refusal_reason()

    @property
    def _biased(self):
        """Whether the model has biases: ``biased``, except under ``loss="implicit"`` (whose
        preference scores have neither biases nor a mean)."""
        return self._loss.biased(self.biased)

    @property
    def _loss(self):
        """The fit's loss (:mod:`._losses`; a class without ``loss`` fits ratings)."""
        return LOSSES[getattr(self, "loss", "squared")]

    # {loss: the protocol of a fit under that loss, ``function(estimator, ctx)``}: each class
    # declares the losses it trains (read by ``_make_protocol``).
    _protocols: dict = {}

    def _make_protocol(self, ctx):
        return self._protocols[self._loss.name](self, ctx)

    # What None means for a parameter whose default depends on ``loss``: ``{name: (under
    # "squared", under "implicit")}`` (each class its own; see _loss_default).
    _loss_defaults: dict = {"n_components": (5, 32), "max_iter": (100, 15)}

    def _loss_default(self, name):
        """The value of parameter ``name`` for this fit: its own, or when None the class's
        default for the loss (``_loss_defaults``)."""
        value = getattr(self, name)
        if value is None:
            return self._loss.pick(self._loss_defaults[name])
        return value

    def _rank(self, n_interactions=100_000):
        """The rank of a fit on ``n_interactions`` ratings: ``n_components``, or None's default
        for the loss (under ``loss="implicit"``, :func:`implicit_rank`), at most ``n_items``."""
        if self.n_components is not None:
            return self.n_components
        default = self._loss_default("n_components")
        n_items = getattr(self, "n_features_in_", default)
        return self._loss.rank(default, n_interactions, n_items)

    def _engine_params(self, settings):
        params = super()._engine_params(settings)
        if params["max_iter"] is None:
            params["max_iter"] = self._loss_default("max_iter")
        return params

    # ---- where the factors are in the engine's states (every algorithm: "Vt" and "U") ----
    def _read_components(self, server_state, broadcast):
        """The global item factor ``(n_components, n_items)`` from the server's state (its
        ``"Vt"``, transposed, unless the algorithm keeps it under another name)."""
        return np.ascontiguousarray(server_state["Vt"].T)

    def _read_user_factors(self, client_state):
        """A client's user factors ``(m_i, n_components)`` from its state (its ``"U"``)."""
        return client_state["U"]

    # ---- fit ----------------------------------------------------------------------------
    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, *, clients=None, eval_set=None):
        """Run the federation on the rating matrix ``X``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_users, n_items)
            Training ratings: sparse (every stored entry observed) or dense, where entries
            equal to ``missing_values`` (NaN by default) are missing.
        y : Ignored
            Not used, present for API consistency by convention.
        clients : array-like of shape (n_users,), default=None
            Client label of each row; when None rows are split into ``n_clients`` clients.
        eval_set : {array-like, sparse matrix} of shape (n_users, n_items), default=None
            Held-out ratings of the same rows, scored every round with the current federated
            factors (``history_[k]["eval_rmse"]``). With early stopping and
            ``validation_fraction=None``, it is the validation set (the rounds are selected
            on it, nothing is held out of ``X``).

        Returns
        -------
        self : object
            The fitted estimator.
        """
        return self._fit(X, clients, eval_set=eval_set)

    def _validate_ratings(self, X, missing_values, name="X", reset=False, fitting=False):
        """``X`` as canonical CSR ratings (``missing_values`` applied), not yet centred."""
        reject_duplicates(X, name)
        X = validate_data(
            self, X, accept_sparse=True, dtype=[np.float64, np.float32], reset=reset,
            ensure_all_finite="allow-nan" if np.isnan(missing_values) else True,
        )
        # float32 input runs in float32 where the solver supports it (half the memory)
        dtype = X.dtype if fitting and X.dtype in self._fit_dtypes else np.float64
        return check_ratings(X, name=name, dtype=dtype, missing_values=missing_values)

    def _check_fit_data(self, X, *, reset, settings, eval_set=None):
        missing_values = settings["missing_values"]
        if self._biased and settings["positive"]:
            raise ValueError(
                "biased=True and positive=True cannot be combined: the biases are signed "
                "(leave solver_params['positive'] False, or set biased=False for a "
                "nonnegative factorization)."
            )
        warn_if_zero_filled(X, missing_values)
        X = self._validate_ratings(X, missing_values, reset=reset, fitting=True)
        self._loss.check_data(X, settings)
        n_items = X.shape[1]
        if self._rank() > n_items:
            raise ValueError(
                f"n_components={self._rank()} is larger than the number of items "
                f"({n_items}); the rank cannot exceed the number of columns."
            )
        eval_X = None
        if eval_set is not None:
            eval_X = check_like(eval_set, X, name="eval_set", missing_values=missing_values)
            if eval_X.nnz == 0:
                raise ValueError("eval_set has no rating to score; pass held-out ratings or "
                                 "eval_set=None.")
        if X.nnz == 0:
            raise ValueError("X has no observed entry; there is nothing to fit.")
        # (centred by _validation_plan, once the validation ratings are set apart)
        return X, dict(eval_X=eval_X)

    def _validation_plan(self, ctx):
        """Early stopping's rule, and the context with each client's validation ratings
        (``info.eval_X``) split off its training ratings (``X``), both centred by the
        training ratings' mean."""
        settings = ctx.settings
        X, eval_X, report_X, rule = self._loss.split_validation(ctx, settings,
                                                                self._validation_keys)
        mean, rating_range = self._loss.summary(X, ctx, self)
        offset = self._loss.offset(mean, settings["center"])
        center_and_scale(offset, 1.0, X, eval_X, report_X)
        _warn_unobserved(X)
        # n_ratings: the sum of the clients' rating counts (FedMC-ADMM and FedMGS "auto")
        info = replace(
            ctx.info, eval_X=eval_X, report_X=report_X, mean=mean, rating_range=rating_range,
            offset=offset, n_ratings=X.nnz, validated=rule is not None,
            # the validation ratings were held out of X (not the caller's eval_set)
            held_out=rule is not None and rule.rename,
            # (warm start: the confidence scale and the rank of the first fit)
            **self._loss.fit_info(self, ctx, settings, X),
            rank=self.components_.shape[0] if ctx.warm else self._rank(X.nnz))
        return replace(ctx, X=X, info=info), rule

    def _collect(self, state, blocks, ctx):
        self.mean_, self.rating_range_ = ctx.info.mean, ctx.info.rating_range
        self._loss.collect(self, ctx)
        self.n_users_ = ctx.n_rows
        V = self._read_components(state.server_state, state.broadcast)
        U = np.zeros((ctx.n_rows, V.shape[0]), dtype=ctx.X.dtype)
        if isinstance(state.client_states, GroupStates):  # stacked rows (_groups)
            for group, group_state in zip(blocks, state.client_states.group_states):
                U[group.rows] = group_state["U"]
        else:
            for block, client_state in zip(blocks, state.client_states):
                U[block.rows] = self._read_user_factors(client_state)
        if self._biased:  # the augmented factors [U, b_u, 1] and [V; 1; b_i] (_biases.py)
            self.components_, self.item_bias_ = np.ascontiguousarray(V[:-2]), V[-1].copy()
            self.user_factors_, self.user_bias_ = np.ascontiguousarray(U[:, :-2]), U[:, -2]
        else:
            self.components_, self.user_factors_ = V, U
        self._collect_validation(state, ctx)

    def _collect_validation(self, state, ctx):
        """The validation's fitted attributes; with biases, the floor: when the federated
        biases-only model beats the kept model on the validation ratings, the fit keeps it."""
        scores = [-r["validation_rmse"] for r in state.history if "validation_rmse" in r]
        self.validation_score_ = np.array(scores)
        validated = ctx.info.validated  # (a warm fit without: its last round)
        self.best_iteration_ = state.best_round if validated else state.n_rounds
        self.best_validation_score_ = -state.best_score if validated else None
        self.factors_used_, self._fallback = True, None
        if not validated or not self._biased or self._floor_class is None:
            return
        best = state.best_score * self._score_scale(ctx)  # (in rating units)
        floor_params = {"n_jobs": ctx.n_jobs, **{key: ctx.settings[key] for key in (
            "clients_per_round", "secure_aggregation")}}  # (a secure floor samples as the fit)
        known = None  # (a validation panel: the server knows its count, scaled to everyone)
        if state.panel is not None and state.panel_count is not None:
            known = state.panel_count * ctx.n_clients / len(state.panel)
        # (the floor's fits read the data and the fitted attributes, not the federation's
        # state: it leaves memory meanwhile, issue 38)
        fitted = {k: v for k, v in vars(self).items() if k.endswith("_") and k[0] != "_"}
        with paged_out((state.server_state, state.broadcast, state.client_states),
                       keep=(ctx, fitted)):
            floor, floor_rmse, (up, down), self._floor_evidence = biases_floor(
                ctx, self, **floor_params, known_count=known)
            gain, noise = self._floor_evidence  # (the gain in validation MSE, its std error)
            if gain <= FLOOR_Z * noise and ctx.info.held_out:  # biases on every rating
                floor, more = floor_on_all_ratings(ctx, self._floor_class, **floor_params)
                up, down = up + more[0], down + more[1]
        self.history_[-1]["bytes_uploaded"] += up
        self.history_[-1]["bytes_downloaded"] += down
        if gain > FLOOR_Z * noise:  # the factor part's gain is larger than its noise
            return
        self.factors_used_ = False
        self._fallback = (
            f"the factor part's validation gain over the biases was within {FLOOR_Z:g} standard "
            f"error(s) (RMSE {best:.4g} at round {self.best_iteration_}, biases {floor_rmse:.4g}; "
            f"MSE gain {gain:.3g}, standard error {noise:.3g}), so the fit keeps the biases alone "
            "(factors_used_ = False); lower alpha_u and alpha_v, or the data lacks such structure")
        self.components_ = np.zeros_like(self.components_)
        self.user_factors_ = np.zeros_like(self.user_factors_)
        # (on the fit's scale: a class that divided the ratings multiplies its biases back)
        dtype, scale = self.item_bias_.dtype, ctx.info.rating_scale
        self.user_bias_ = (floor.user_bias_ / scale).astype(dtype)
        self.item_bias_ = ((floor.item_bias_ + (floor.mean_ - self._offset)) / scale).astype(dtype)

    def _score_scale(self, ctx):
        """What the fit's validation scores are multiplied by in rating units (1: the
        records are in rating units)."""
        return 1.0

    def _degenerate(self, state, blocks, ctx, history):
        if self._fallback is not None:
            return self._fallback
        biases = self._biased and (self.item_bias_.any() or self.user_bias_.any())
        if (not self.components_.any() or not self.user_factors_.any()) and not biases:
            return "the factors are all zero, so every prediction is the same constant"
        return self._collapsed(ctx.X) or objective_not_decreasing(history)

    def _collapsed(self, Xc):
        """Why the factor part ``U V`` is negligible on the training ratings, or None.

        Negligible means an RMS of ``u . v`` over the (centred) training ratings below
        ``COLLAPSE_RATIO`` times theirs: the model then predicts with its biases (or the
        mean) alone, whatever its rank. Measured on rows spread over the data, at most about
        ``COLLAPSE_SAMPLE`` ratings, so the check stays cheap on any size.
        """
        step = max(1, -(-Xc.nnz // COLLAPSE_SAMPLE))
        rows = np.arange(0, Xc.shape[0], step)
        sample = Xc[rows]
        if sample.nnz == 0:
            return None
        U = np.ascontiguousarray(self.user_factors_[rows], dtype=np.float64)
        Vt = np.ascontiguousarray(self.components_.T, dtype=np.float64)
        zeros = np.zeros(sample.nnz)
        rms_uv = np.sqrt(squared_error(sample.indptr, sample.indices, zeros, U, Vt) / sample.nnz)
        # (under loss="implicit" the fitted target at a stored entry is the preference 1)
        rms_data = self._loss.target_rms(sample)
        if rms_uv >= COLLAPSE_RATIO * rms_data:
            return None
        if self._biased:
            users = np.repeat(rows, np.diff(sample.indptr))
            bias = self.user_bias_[users] + self.item_bias_[sample.indices]
            alone = (f"against {np.sqrt(np.mean(np.square(bias))):.3g} for the biases: the "
                     "model is its biases alone")
        else:
            alone = "so every prediction is about the training mean"
        return (f"the factor part is negligible (on the training ratings U V has an RMS of "
                f"{rms_uv:.3g}, {alone}); lower alpha_u and alpha_v, run more rounds, or "
                "check that the data has structure beyond the biases")

    # ---- fold-in, prediction, scoring ---------------------------------------------------
    def _check_X(self, X, name="X"):
        check_is_fitted(self)
        missing_values = self._settings()["missing_values"]  # (read live, as the parameters)
        return _shift(self._validate_ratings(X, missing_values, name), -self._offset)

    @FOLD_IN_DATA
    def transform(self, X):
        """Fold-in: each row's factors with ``components_`` fixed, from its observed entries.

        This is what a new client computes on its own. With squared-l2 regularization
        (``l1_ratio=0``, ``positive=False``) it is one exact ridge solve per row; otherwise
        proximal-gradient iterations. Rows with no observation get zero factors.

        Parameters
        ----------
        %(fold_in_data)s

        Returns
        -------
        U : ndarray of shape (n_rows, n_components)
            The rows' factors.
        """
        # (computed in float64; returned in the dtype the model was fitted in)
        return self._fold_in(self._check_X(X)).astype(self.components_.dtype, copy=False)

    def _augmented(self, Xc):
        """Fold-in on the augmented factors: ``(U_aug, Vt_aug)`` whose products are the
        predictions minus the offset (``[U, b_u, 1]`` and ``[Vt, 1, b_i]`` when biased).

        With biases the fold-in solves ``[u, b_u]`` against ``[v; 1]`` on the ratings minus
        ``b_i``; a row without ratings gets ``u = 0, b_u = 0``: it predicts ``b_i``.
        """
        Vt = np.ascontiguousarray(self.components_.T, dtype=np.float64)
        if not self._biased:
            return self._fold_in(Xc), Vt
        Vt_aug = init_item(np.hstack([Vt, np.empty((Vt.shape[0], 2))]))
        Vt_aug[:, -1] = self.item_bias_
        X_view, Vt_free = user_step_view(Xc, Vt_aug)
        U_free = self._fold_in_rows(X_view, Vt_free)
        return with_user(U_free), Vt_aug

    def _fold_in(self, Xc):
        """The rows' factors (without the bias columns)."""
        if self._biased:
            return self._augmented(Xc)[0][:, :-2]
        Vt = np.ascontiguousarray(self.components_.T, dtype=np.float64)
        return self._fold_in_rows(Xc, Vt)

    def _fold_in_rows(self, Xc, Vt):
        """The rows' factors against ``Vt``, as the loss solves them."""
        return self._loss.fold_in(self, Xc, Vt)

    def _fold_in_ratings(self, Xc, Vt):
        """:meth:`_fold_in_rows` on ratings (squared loss)."""
        settings = self._settings()
        U = np.zeros((Xc.shape[0], Vt.shape[1]))
        l1_ratio, positive = settings["l1_ratio"], settings["positive"]
        alpha_u = self._fold_in_alpha_u()
        if settings["regularization"] == "weighted":  # per rating, as in fit
            alpha_u = alpha_u * np.diff(Xc.indptr).astype(np.float64)[:, None]
        ridge_fold_in(Xc.indptr, Xc.indices, Xc.data, Vt, np.ravel(alpha_u * (1 - l1_ratio)), U)
        if l1_ratio == 0 and not positive:
            return U
        # Proximal gradient with the global step 1/lambda_max(V V^T), which bounds every row's
        # Lipschitz constant; started from the ridge solution.
        step = 1.0 / max(np.linalg.eigvalsh(Vt.T @ Vt)[-1], 1e-12)
        U = prox_elastic_net(U, step, alpha_u, l1_ratio, positive)
        G = np.empty_like(U)
        for _ in range(500):
            grad_rows(Xc.indptr, Xc.indices, Xc.data, U, Vt, G)
            U_new = prox_elastic_net(U - step * G, step, alpha_u, l1_ratio, positive)
            if np.abs(U_new - U).max() <= 1e-10 * max(1.0, np.abs(U).max()):
                return U_new
            U = U_new
        return U

    def _fold_in_alpha_u(self):
        """The user factors' strength that fold-in uses: the fit's (a class with an "auto"
        strength returns the value it resolved)."""
        return self.alpha_u

    def inverse_transform(self, X):
        """Ratings reconstructed from user factors: ``X @ components_``, plus ``item_bias_``
        when ``biased=True`` (the user biases are not part of ``X``), on the rating scale
        (plus ``mean_`` when ``center=True``; through the link of a model that has one).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_components)
            User factors, e.g. the output of :meth:`transform`.

        Returns
        -------
        ratings : ndarray of shape (n_samples, n_items)
            Dense reconstructed ratings; refused above ``MAX_DENSE_ENTRIES`` entries (see
            :meth:`predict`).
        """
        U = self._check_factors(X)
        check_dense_size(U.shape[0], self.components_.shape[1], "inverse_transform(X)")
        Z = U @ self.components_
        return self._to_ratings(Z + self.item_bias_ if self._biased else Z)

    def _to_ratings(self, Z):
        """Scores ``u . v`` (plus biases) to ratings: plus the offset."""
        return Z + self._offset

    def predict(self, X, at=None):
        """Predicted ratings for the rows of ``X`` by fold-in.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_rows, n_items)
            Observed ratings of the rows; each row's factors are folded in from them.
        at : {array-like, sparse matrix} of shape (n_rows, n_items), default=None
            Where to predict: the stored entries of a sparse matrix (its values are ignored;
            dense: the non-NaN entries). Then the result is a CSR matrix with exactly that
            pattern, computed in O(nnz x rank) memory.

        Returns
        -------
        ratings : ndarray of shape (n_rows, n_items) or csr_matrix
            Dense (every entry) when ``at`` is None. A dense result is refused above
            ``MAX_DENSE_ENTRIES`` = 50 million entries (400 MB) with an error, raised before
            anything is allocated, that names the alternatives: ``predict(X, at=pattern)`` or
            :class:`~sklearn_fedmf.RatingRegressor` for (user, item) pairs and top-N lists.

        Notes
        -----
        Rows with no observed entry (cold start) predict the model's fallback: the training
        mean ``mean_`` (plus the item's bias in a model with biases). With ``clip=True``
        predictions are clipped to the training rating range.
        """
        Xc = self._check_X(X)
        if at is not None:
            pattern = check_like(at, Xc, name="at")
            values = self._predict_entries(Xc, pattern)
            return sp.csr_matrix((values, pattern.indices, pattern.indptr), shape=pattern.shape)
        n_rows, n_items = Xc.shape
        check_dense_size(n_rows, n_items, "predict(X)")
        model = self._factor_model(Xc)
        P = score_block(model, np.arange(n_rows))
        P += model.offset
        if model.link is not None:
            P = model.link(P)
        cold = np.diff(Xc.indptr) == 0
        if cold.any():
            P[cold] = predict_pairs(model, np.full(n_items, -1), np.arange(n_items), self.mean_)
        return self._clip(P)

    def _factor_model(self, Xc=None):
        """The model as :class:`~sklearn_fedmf._pairs.FactorModel`: the fitted users' factors,
        or, given the centred CSR ``Xc``, its rows' factors by fold-in."""
        Vt = np.ascontiguousarray(self.components_.T, dtype=np.float64)
        item_bias = self.item_bias_ if self._biased else None
        if Xc is None:
            U, user_bias = self.user_factors_, self.user_bias_ if self._biased else None
        elif self._biased:  # fold-in solves [u, b_u] (see _augmented)
            U_aug = self._augmented(Xc)[0]
            U, user_bias = np.ascontiguousarray(U_aug[:, :-2]), U_aug[:, -2].copy()
        else:
            U, user_bias = self._fold_in(Xc), None
        return FactorModel(U, Vt, user_bias, item_bias, self._offset)

    def _predict_entries(self, Xc, pattern):
        """Predicted ratings at the stored entries of ``pattern``, fold-in on ``Xc``."""
        model = self._factor_model(Xc)
        rows = np.repeat(np.arange(pattern.shape[0]), np.diff(pattern.indptr))
        cold = np.diff(Xc.indptr) == 0
        users = np.where(cold[rows], -1, rows)
        return self._clip(predict_pairs(model, users, pattern.indices, self.mean_))

    @property
    def _offset(self):
        """What was subtracted from the ratings before factorizing."""
        return self._loss.offset(self.mean_, self._settings()["center"])

    def _clip(self, values):
        return self._loss.clip(self, values)

    def score(self, X, y=None):
        """Negative RMSE (greater is better); under ``loss="implicit"`` NDCG at 10.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_rows, n_items)
            Observed ratings of the rows, used for fold-in.
        y : {array-like, sparse matrix} of shape (n_rows, n_items), default=None
            Held-out ratings of the same rows; the error is measured at its stored entries.
            When None, the error is measured at ``X``'s own entries. A 1-D ``y`` (the
            target vector that pipelines and generic scikit-learn tools pass through) carries
            no held-out rating and is ignored, as ``KMeans.score`` ignores ``y``.

        Returns
        -------
        score : float
            ``-sqrt(mean squared error)`` over the evaluated entries (computed there only:
            no dense matrix). Under ``loss="implicit"`` the model's output is a preference
            score, not a rating, so an error in rating units means nothing: the score is then
            the mean NDCG at 10 (:func:`~sklearn_fedmf.metrics.ndcg_at_k`, binary relevance)
            of each row's list, ranked over every item the row has no entry of in ``X``
            (full ranking) against ``y``'s stored entries; with ``y=None``, ranked over every
            item against ``X``'s own entries (a training score). Rows without a relevant
            item are left out. Greater is better in both cases.
        """
        Xc = self._check_X(X)
        if y is not None and not sp.issparse(y) and np.ndim(y) == 1:
            y = None
        return self._loss.score(self, Xc, y)

    def _rmse_score(self, Xc, y):
        """``score`` under ``loss="squared"``: the negative RMSE at ``y``'s entries."""
        if y is None:
            target = Xc.copy()
            target.data += self._offset  # back to the rating scale
        else:
            target = check_like(y, Xc, name="y",
                                missing_values=self._settings()["missing_values"])
        if target.nnz == 0:
            raise ValueError("There is no rating to score: the evaluated matrix is empty.")
        pred = self._predict_entries(Xc, target)
        return -float(np.sqrt(np.mean((pred - target.data) ** 2)))

    def _ranking_score(self, Xc, y, k=10):
        """``score`` under ``loss="implicit"``: mean NDCG@k of the fold-in rows' lists."""
        from ..metrics import ndcg_at_k

        if y is None:
            relevant, seen = Xc, None
        else:
            relevant = check_like(y, Xc, name="y",
                                  missing_values=self._settings()["missing_values"])
            seen = Xc
        relevant = sp.csr_matrix((np.ones(relevant.nnz), relevant.indices, relevant.indptr),
                                 shape=relevant.shape)
        rows = np.flatnonzero(np.diff(relevant.indptr))
        if rows.size == 0:
            raise ValueError("There is no interaction to rank: the evaluated matrix is empty.")
        lists = top_n(self._factor_model(Xc), rows, min(k, Xc.shape[1]), seen=seen)[0]
        return ndcg_at_k(relevant[rows], lists, k=k)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = [np.dtype(d).name for d in self._fit_dtypes]
        tags.input_tags.allow_nan = True
        tags.target_tags.required = False
        return tags


# A factor part whose RMS on the training ratings is below COLLAPSE_RATIO times the ratings'
# (centred) RMS has collapsed; the check reads about COLLAPSE_SAMPLE ratings.
COLLAPSE_RATIO = 1e-2
COLLAPSE_SAMPLE = 200_000

def _shift(X, delta):
    """Add ``delta`` to every stored value of the CSR ``X``, in place, and return ``X``.

    Only for matrices made by ``check_ratings`` (always a fresh copy): a second copy of a
    Netflix-sized matrix costs over a gigabyte and seconds of setup.
    """
    if delta:
        X.data += delta
    return X


def _warn_unobserved(X):
    empty_cols = int(np.count_nonzero(np.bincount(X.indices, minlength=X.shape[1]) == 0))
    if empty_cols:
        warnings.warn(
            f"{empty_cols} item column(s) have no training rating; their factors only follow "
            "the regularization, so predictions for them are arbitrary.",
            UnobservedItemsWarning,
            stacklevel=6,  # the caller of fit (through _fit_context, fit, _fit, _validation_plan)
        )


def squared_error_of(block_X, U, Vt):
    """Sum of squared residuals of ``U Vt^T`` at the stored entries of ``block_X``."""
    if block_X is None:  # (an empty block needs no test: the kernel then sums nothing)
        return 0.0
    return squared_error(block_X.indptr, block_X.indices, block_X.data, U, Vt)


def factor_metrics(U, Vt, block, *, alpha_u, l1_ratio, biased=False, alpha_v=0.0,
                   weighted=False):
    """Additive diagnostics of one client's factors ``U`` at the global ``V``: its loss (half
    its squared error plus its penalties; weighted regularization: with its share
    ``alpha_v/2 sum_j n_jp ||v_j||^2`` of the item penalty, the shares sum to it), its
    squared errors and counts on ``X`` and on the held-out ``X_eval``."""
    sse = squared_error_of(block.X, U, Vt)
    item_penalty = 0.0
    if weighted:
        item_penalty = elastic_net_value(free_item(Vt) if biased else Vt,
                                         alpha_v * item_counts(block.X), l1_ratio)
    return {
        "loss": 0.5 * sse + item_penalty + elastic_net_value(
            free_user(U) if biased else U, row_alpha(alpha_u, block.X, weighted), l1_ratio),
        "sse": sse,
        "n": block.nnz,
        "sse_eval": squared_error_of(block.X_eval, U, Vt),
        "n_eval": 0 if block.X_eval is None else block.X_eval.nnz,
    }
