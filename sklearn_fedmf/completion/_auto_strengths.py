"""Strengths that adapt to the data: the ``"auto"`` defaults of FedMC-ADMM and FedMAvg (and
the bias start of FedMGS's ``"auto"``, whose strengths are its server's own rule).

Three aggregates, each sent once by every client before round 1, set up the fit:

1. **The ratings' scale.** The sum of squares of the client's centred ratings (with the sum
   and the count that centre them): the server divides every rating by their root mean
   square ``s`` (the clients do the same) and the fit runs on ratings of unit variance. The
   fitted model is scaled back (``components_`` and ``user_factors_`` by ``sqrt(s)``, the
   biases by ``s``), so ratings times ``c`` give predictions times ``c``: the strengths below
   are numbers of ratings, free of units.
2. **The strengths, from the ratings per row.** ``alpha_v = AUTO_ITEM * n_ratings /
   n_items``, a strength per rating at the mean item (``n_items``: the columns with a
   rating), and ``alpha_u = AUTO_USER * sqrt(n_ratings / n_users)``. The plain penalty is
   one strength per row; scaled by the mean item's ratings it weighs the same against the
   data term's curvature (``n_j E[u u^T]``) whatever the density, like a per-rating
   (Surprise-like) strength. Duplicating every user doubles the ratings per item and
   ``alpha_v`` with them, and leaves the ratings per user and ``alpha_u`` as they are: the
   strengths per rating do not change. ``alpha_v`` is the strong one: an item factor is
   estimated from few raters, and on data whose structure is mostly biases the factor part
   must stay small. The user side grows with the square root of the ratings per user,
   measured: per rating (linear) it was too weak at 12-16 ratings per user (Epinions-like:
   0.992 against ``BaselineOnly``'s 0.983) when right at 165 (MovieLens latest-small), and
   too strong there when right at 16 (0.887 against 0.882); a constant per row has the same
   problem the other way (``docs/guide/defaults.rst``). FedMC-ADMM's ``R(V)`` is not divided
   by ``p``, so its ``alpha_v`` is this value over ``p``. FedMAvg (``"wang_chang"``) uses
   the ``"degrees"`` rule instead (:func:`degree_strengths`): on MovieLens 100K this rule's
   ``alpha_v`` was 88, which held its factor part under a threshold of 39 and shrank the
   item biases (which shared it) far past their own shrinkage, so its fits ended at the
   biases-only model (issue 37). FedMAvg's biases now start at the biases-only model of
   their empirical-Bayes shrinkages (:func:`variant_bias_settings`) and share the factors'
   (smaller) strengths.
3. **A start at the biases.** The biases share the factors' strengths and, from zero, take
   hundreds of rounds to settle (measured: FedMAvg's biases alone were 0.03 RMSE short of
   Surprise's ``BaselineOnly`` after 100 rounds and 0.02 after 300). Each client sends its
   count and sum of (scaled, centred) ratings per rated item, once; the server starts ``b_i``
   at their shrunk means, ``sum / (lambda_i + n_i)``, and broadcasts them with ``V^0``; each
   client starts its users' ``b_u = sum (x - b_i) / (lambda_u + n_u)`` on its own. The
   shrinkages are empirical Bayes, noise variance over the biases' variance, ``lambda =
   sigma^2 / tau^2``, from the one-way analyses of variance of the same aggregates: with
   ``S`` the sum of squares, ``B_u = sum_u (sum of row u)^2 / n_u`` and ``B_i`` likewise per
   item (all over ``n_ratings``), ``sigma^2 = (S - B_u) + (S - B_i) - S`` (the residual after
   both biases, additive model), ``tau_u^2 = B_u - sigma^2 n_users / n_ratings`` and
   ``tau_i^2`` likewise. They do not depend on the ratings' unit, and ``lambda_u`` not on
   duplicated users (``lambda_i`` counts twice the raters as more evidence, as empirical
   Bayes does).

What a client sends for them (privacy guide): its sum of squares (one number); the sum over
its users of ``(sum of the row)^2 / n_u`` (one number); under FedMAvg's ``"degrees"`` rule
(:func:`degree_strengths`), the sum over its users of ``n_u^2`` (one number); its count and
sum of ratings per rated item (the items it rated, as FedMGS's aggregates and the weighted
regularization's counts already show). A fixed strength sends none of them. These exchanges
are counted in the first round's ``bytes_uploaded`` and ``bytes_downloaded``
(:func:`start_bytes`).
"""

from __future__ import annotations

from dataclasses import replace
from numbers import Real

import numpy as np
import scipy.sparse as sp
from sklearn.utils._param_validation import Interval, StrOptions

from .. import _biases

__all__ = ["AUTO_DEGREE", "AUTO_ITEM", "AUTO_USER", "AutoStrengthsMixin", "auto_setup",
           "bias_shrinkages", "degree_strengths",
           "rating_moments", "start_bytes", "start_item_biases", "start_user_biases",
           "variant_bias_settings"]

# on ratings of unit mean square: alpha_u = AUTO_USER sqrt(ratings per user), alpha_v =
# AUTO_ITEM (ratings per item); chosen on filmtrust, douban, epinions and MovieLens
# latest-small (bench_accuracy.py --all-defaults; docs/guide/defaults.rst)
AUTO_USER = 2.0
AUTO_ITEM = 2.0
# the "degrees" rule (FedMAvg): sqrt(alpha_u alpha_v) = AUTO_DEGREE times the root mean
# square ratings per user and per item seen from a rating (degree_strengths); chosen on
# MovieLens 100K and latest-small (0.5; 0.6 and 1.0 measured beside it)
AUTO_DEGREE = 0.5
# alternating exact passes of the biases' start of FedMAvg's "fedmc_admm" variant (Surprise's
# BaselineOnly runs 10 epochs; FedBaseline is within 1.3e-5 RMSE of converged after 10)
BIAS_START_PASSES = 10
# floor of a bias variance: below it the data show no bias, and the shrinkage is capped
MIN_BIAS_VARIANCE = 1e-3


def rating_moments(X):
    """The aggregates of the rule from the centred CSR ``X``: what the clients' sums give.

    Returns a dict: ``n_ratings``, ``n_users`` and ``n_items`` (rows and columns with a
    rating), ``sum_squares``, ``between_users`` (``sum_u (sum of row u)^2 / n_u``),
    ``user_count_squares`` (``sum_u n_u^2``),
    ``item_sums`` and ``item_counts`` (per column).
    """
    row_counts = np.diff(X.indptr)
    rows = np.repeat(np.arange(X.shape[0]), row_counts)
    row_sums = np.bincount(rows, weights=X.data, minlength=X.shape[0])
    item_counts = np.bincount(X.indices, minlength=X.shape[1]).astype(np.float64)
    item_sums = np.bincount(X.indices, weights=X.data, minlength=X.shape[1])
    rated = row_counts > 0
    return {
        "n_ratings": float(X.nnz),
        "n_users": float(np.count_nonzero(rated)),
        "n_items": float(np.count_nonzero(item_counts)),
        "sum_squares": float(np.dot(X.data, X.data)),
        "between_users": float(np.sum(row_sums[rated] ** 2 / row_counts[rated])),
        "user_count_squares": float(np.sum(row_counts.astype(np.float64) ** 2)),
        "item_sums": item_sums,
        "item_counts": item_counts,
    }


def bias_shrinkages(moments):
    """``(lambda_u, lambda_i)``: the empirical-Bayes shrinkages of the biases (module
    docstring), on any scale of the ratings."""
    n = moments["n_ratings"]
    counts = moments["item_counts"]
    rated = counts > 0
    total = moments["sum_squares"] / n
    between_u = moments["between_users"] / n
    between_i = float(np.sum(moments["item_sums"][rated] ** 2 / counts[rated])) / n
    noise = max(total - between_u - between_i, 0.0)
    floor = MIN_BIAS_VARIANCE * total
    tau_u = max(between_u - noise * moments["n_users"] / n, floor)
    tau_i = max(between_i - noise * moments["n_items"] / n, floor)
    return noise / tau_u, noise / tau_i


def degree_strengths(n_ratings, user_count_squares, item_count_squares):
    """``(alpha_u, alpha_v)`` of the ``"degrees"`` rule on ratings of unit mean square: both
    ``AUTO_DEGREE (sqrt(sum_u n_u^2 / n) + sqrt(sum_j n_j^2 / n))``, with ``n_u`` and ``n_j``
    the ratings of user ``u`` and item ``j`` and ``n`` their total.

    ``sum_u n_u^2 / n`` is the number of ratings of a rating's user (the ratings per user
    seen from a rating), which a few heavy users raise far above the mean ``n / n_users``.
    Why these: the plain penalties ``(alpha_u/2) |U|^2 + (alpha_v/2) |V|^2`` at their best
    balance weigh ``sqrt(alpha_u alpha_v)`` times the nuclear norm of ``U V``, a threshold on
    its singular values, and the largest singular value of unit-variance noise on a rating
    pattern grows with its rows' and columns' ratings and with their heavy tails: on nine
    patterns of 28,000 to 110,000 ratings (MovieLens, FilmTrust and synthetic ones) it was
    1.1 to 2.2 times this sum, and 1.7 to 6.7 times the mean form ``sqrt(n / n_users) +
    sqrt(n / n_items)``, which heavy tails leave behind. With the mean form the best
    constant went from 0.7 (MovieLens 100K) to 2 (the real FilmTrust, heavy-tailed); with
    this sum 0.5 is within 0.002 RMSE of the best measured on both. The previous rule,
    ``alpha_v = 2 n / n_items`` (88 on MovieLens 100K), held the factor part under a
    threshold of 39 there.
    """
    n = max(float(n_ratings), 1.0)
    threshold = AUTO_DEGREE * (np.sqrt(user_count_squares / n) + np.sqrt(item_count_squares / n))
    return float(threshold), float(threshold)


def auto_setup(X, item_strength=AUTO_ITEM, scale=True, rule="rows"):
    """The ``"auto"`` settings of a fit on the centred CSR ``X`` (scaled in place), with
    ``item_strength`` per rating at the mean item (the class's; ``AUTO_ITEM`` by default);
    ``scale=False`` leaves ``X`` in rating units (``scale`` is then 1). ``rule="degrees"``:
    the strengths of :func:`degree_strengths` instead (``item_strength`` unused).

    Returns a dict: ``scale`` (the root mean square ``X`` was divided by), ``alpha_u`` and
    ``alpha_v`` (per row, on the scaled ratings), ``item_bias`` (the server's start) and
    ``user_shrinkage`` (``lambda_u`` of the clients' start), ``n_users``, ``n_items`` and
    ``rms``, the root mean square of the (scaled) ratings.
    """
    moments = rating_moments(X)
    n = max(moments["n_ratings"], 1.0)
    rms = float(np.sqrt(moments["sum_squares"] / n))
    scale = (rms or 1.0) if scale else 1.0
    lambda_u, lambda_i = bias_shrinkages(moments)
    X.data /= scale
    # the second exchange: per item, the sums of x - b_u at the users' shrunk means
    user_bias = _biases.user_biases(X, np.zeros(X.shape[1]), lambda_u)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    sums = np.bincount(X.indices, weights=X.data - user_bias[rows], minlength=X.shape[1])
    if rule == "degrees":
        alpha_u, alpha_v = degree_strengths(n, moments["user_count_squares"],
                                            float(np.sum(moments["item_counts"] ** 2)))
    else:
        alpha_u = AUTO_USER * np.sqrt(n / max(moments["n_users"], 1.0))
        alpha_v = item_strength * n / max(moments["n_items"], 1.0)
    return {
        "scale": scale,
        "alpha_u": alpha_u,
        "alpha_v": alpha_v,
        "item_bias": _biases.item_biases(sums, moments["item_counts"], lambda_i),
        "user_shrinkage": lambda_u,
        "item_shrinkage": lambda_i,
        "n_users": moments["n_users"],
        "n_items": moments["n_items"],
        "rms": rms / scale,
    }


def variant_bias_settings(auto, X, item_bias):
    """``((lambda_u, lambda_i), item_bias)`` of FedMAvg under ``"auto"`` (biased, plain;
    ``(None, item_bias)`` otherwise, and on a deployment that reported only counts; the
    ``"wang_chang"`` variant uses only the start): its biases' ridges are their
    empirical-Bayes shrinkages, and ``b_i`` starts at the biases-only model of those
    shrinkages (``BIAS_START_PASSES`` more alternating exact steps from the start above,
    on the scaled training ratings ``X``; None on a warm start, which keeps its model).

    Why: the variant's item step is the paper's (data gradient over ``p``, step ``1 /
    (5 lambda_max(U_i^T U_i))``), far too short to move ``b_i`` in the rounds a fit runs,
    while its user step settles ``b_u`` in a round. With the factors' strengths on the
    biases (``alpha_u`` about 20 ratings per user on MovieLens, against ``lambda_u`` about
    2.5) it shrank ``b_u`` far past the data's shrinkage against ``b_i`` still at a one-pass
    start: at its best round the model was biases alone and lost to ``BaselineOnly`` on
    test (0.8832 against 0.8815). With these ridges the start is the biases' optimum of the
    variant's own objective, and the rounds fit the factors on top of it.
    Each pass is one more exchange of the second one's aggregates (per item, the sum of
    ``x - b_u``; the server answers with ``b_i``).
    """
    if auto is None or auto.get("item_shrinkage") is None:
        return None, item_bias
    lambda_u, lambda_i = auto["user_shrinkage"], auto["item_shrinkage"]
    if item_bias is not None:
        counts = np.bincount(X.indices, minlength=X.shape[1]).astype(np.float64)
        rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
        for _ in range(BIAS_START_PASSES):
            user_bias = _biases.user_biases(X, item_bias, lambda_u)
            sums = np.bincount(X.indices, weights=X.data - user_bias[rows],
                               minlength=X.shape[1])
            item_bias = _biases.item_biases(sums, counts, lambda_i)
    return (lambda_u, lambda_i), item_bias


def start_bytes(X, codes, n_clients, bias_start=True, passes=0, degrees=False):
    """``(up, down)``: the bytes of the ``"auto"`` start's exchanges over every client, for
    the training ratings ``X`` (CSR) held by the clients ``codes`` (one per row), counted as
    the engine counts messages (8-byte numbers, item indices of ``X.indices``' type).

    With ``k_p`` the items client ``p`` rated: up, its two sums (sum of squares, between
    users), its number of users with a rating, and per rated item its index, count and sum
    (``24 + k_p (i + 16)`` bytes, ``i`` the index size), then (``bias_start``: the factors
    carry biases) its per-item sums of ``x - b_u`` (``8 k_p``); down, the scale and
    ``lambda_u`` (16 bytes). Each of the ``passes`` more (FedMAvg's ``"fedmc_admm"``
    variant, :func:`variant_bias_settings`) sends ``b_i`` on the client's rated items down
    and its per-item sums up (``8 k_p`` each way). ``degrees`` (the ``"degrees"`` rule): one
    more number up, the client's ``sum_u n_u^2`` (8 bytes)."""
    n_rows = X.shape[0]
    if np.bincount(codes, minlength=n_clients).max(initial=0) <= 1:
        rated = X.nnz  # one row per client: its items are its row's (the product below
        # costs about 20 bytes a rating at once: 1.3 GB at the Netflix shape)
    else:
        owner = sp.csr_matrix((np.ones(n_rows), (codes, np.arange(n_rows))),
                              shape=(n_clients, n_rows))
        pattern = sp.csr_matrix((np.ones(X.nnz), X.indices, X.indptr), shape=X.shape)
        rated = (owner @ pattern).nnz  # sum_p k_p (a sort of the pairs took 10x longer)
    index = X.indices.dtype.itemsize
    up = ((24 + 8 * bool(degrees)) * n_clients + rated * (index + 16)
          + 8 * rated * (bool(bias_start) + passes))
    down = 16 * n_clients + 8 * rated * passes
    return up, down


def start_user_biases(U, X, Vt, shrinkage):
    """Set the user-bias column of ``U`` (augmented, ``_biases``) to each row's shrunk mean
    deviation from the item biases in ``Vt``, in place (nothing when ``shrinkage`` is None:
    the papers' start at 0)."""
    if shrinkage is not None:
        item_bias = np.asarray(Vt[:, _biases.B_I], dtype=np.float64)
        U[:, _biases.B_U] = _biases.user_biases(X, item_bias, shrinkage)
    return U


def start_item_biases(Vt, item_bias):
    """Set the item-bias column of ``Vt`` (augmented) to ``item_bias``, in place (None: 0)."""
    if item_bias is not None:
        Vt[:, _biases.B_I] = item_bias
    return Vt


# history_ entries in rating units (the fit runs on scaled ratings): each with its power of
# the scale
_SCALED_RECORDS = {"objective": 2, "train_rmse": 1, "eval_rmse": 1, "eval_mae": 1,
                   "validation_rmse": 1, "validation_mae": 1}


class AutoStrengthsMixin:
    """The estimator side of the rule, for a :class:`~._base.FederatedMFBase` subclass whose
    ``alpha_u``/``alpha_v`` may be ``"auto"``: scales the ratings in ``_check_fit_data``,
    hands the strengths and the bias start to ``_make_protocol`` through ``ctx.info.auto``,
    and scales the fitted model back in ``_collect``."""

    # alpha_u and alpha_v may be "auto" (merged into each class's constraints)
    _parameter_constraints: dict = {
        name: [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})]
        for name in ("alpha_u", "alpha_v")
    }
    # the item side's strength per rating at the mean item (AUTO_ITEM unless a class measured
    # its own)
    _auto_item = AUTO_ITEM
    # whether "auto" runs the fit on scaled ratings (FedMGS: its server's rule is in rating
    # units already, and its messages stay the paper's)
    _auto_scales = True

    def _uses_auto(self):
        # (loss="implicit": preferences, not ratings: no scale and no biases to start)
        return self._loss.uses_auto("auto" in (self.alpha_u, self.alpha_v))

    def _validation_plan(self, ctx):
        """The base's plan (validation split, centring), then the ``"auto"`` settings from
        the training ratings, which the fit divides by their root mean square."""
        ctx, rule = super()._validation_plan(ctx)
        if not self._uses_auto():
            if ctx.warm and getattr(self, "_auto_settings", None) is not None:
                raise ValueError("warm_start cannot switch alpha_u or alpha_v between 'auto' "
                                 "and a fixed strength; fit again without warm_start.")
            return replace(ctx, info=replace(ctx.info, auto=None)), rule
        if not ctx.warm:
            auto = auto_setup(ctx.X, self._auto_item, self._auto_scales,
                              self._auto_rule(ctx.settings))
        else:  # warm start: the first fit's scale and strengths; the model holds the biases
            if getattr(self, "_auto_settings", None) is None:
                raise ValueError("warm_start cannot switch alpha_u or alpha_v between 'auto' "
                                 "and a fixed strength; fit again without warm_start.")
            auto = self._auto_settings
            ctx.X.data /= auto["scale"]
        for held in (ctx.info.eval_X, ctx.info.report_X):
            if held is not None:
                held.data /= auto["scale"]
        return replace(ctx, info=replace(ctx.info, auto=auto, rating_scale=auto["scale"])), rule

    def _start_bytes(self, ctx):
        """The ``"auto"`` start's exchanges (:func:`start_bytes`; none on a warm start,
        without the statistics (a deployment that reported only counts), or when the fit
        uses only the counts every deployment reports: no bias start and no scale)."""
        auto = ctx.info.auto
        if (ctx.warm or auto is None or auto.get("user_shrinkage") is None
                or not (self._biased or self._auto_scales)):
            return super()._start_bytes(ctx)
        return start_bytes(ctx.X, ctx.codes, ctx.n_clients, self._biased,
                           self._bias_start_passes(ctx.settings),
                           self._auto_rule(ctx.settings) == "degrees")

    def _bias_start_passes(self, settings):
        """More exchanges of the biases' start after the second (:func:`start_bytes`)."""
        return 0

    def _auto_rule(self, settings):
        """The strengths' rule of :func:`auto_setup`: ``"rows"`` (the ratings per row) or
        ``"degrees"`` (:func:`degree_strengths`)."""
        return "rows"

    def _score_scale(self, ctx):
        """The fit's records are on the scaled ratings: times this in rating units."""
        return ctx.info.rating_scale

    def _auto(self, ctx):
        """The fit's ``"auto"`` settings (None with fixed strengths). A protocol made for a
        deployed federation whose sites reported only their rating and user counts
        (``flower``) gets the same strengths per rating on unscaled ratings and the biases'
        start at 0."""
        if not ctx.info.deployed:
            return ctx.info.auto
        if not self._uses_auto():  # (loss="implicit" among them)
            return None
        n = float(ctx.info.n_ratings)
        # (only counts: every row and column at the mean)
        if self._auto_rule(ctx.settings) == "degrees":
            alpha_u, alpha_v = degree_strengths(n, n * n / ctx.n_rows, n * n / ctx.n_features)
        else:
            alpha_u = AUTO_USER * np.sqrt(n / ctx.n_rows)
            alpha_v = self._auto_item * n / ctx.n_features
        return {"scale": 1.0, "alpha_u": alpha_u, "alpha_v": alpha_v, "item_bias": None,
                "user_shrinkage": None, "item_shrinkage": None, "n_users": ctx.n_rows,
                "n_items": ctx.n_features, "rms": None}

    def _strength(self, name, ctx, value):
        """``alpha_u`` or ``alpha_v`` for the protocol: the rule's value when ``"auto"``
        (under ``loss="implicit"``, ``IMPLICIT_ALPHA``)."""
        if value != "auto":
            return float(value)
        return self._loss.auto_strength(lambda: self._auto(ctx)[name])

    def _bias_start(self, ctx):
        """``(item_bias, user_shrinkage)`` of the protocol's start (None, None: at 0)."""
        auto = self._auto(ctx)
        if auto is None or not self._biased or ctx.warm:
            return None, None
        return auto["item_bias"], auto["user_shrinkage"]

    def _collect(self, state, blocks, ctx):
        super()._collect(state, blocks, ctx)
        auto = self._auto(ctx)
        self._auto_settings = auto
        self._scale = 1.0 if auto is None else auto["scale"]
        if auto is None or self._scale == 1.0:
            return
        root = float(np.sqrt(self._scale))  # (a Python float keeps float32 float32)
        self.components_ = self.components_ * root
        self.user_factors_ = self.user_factors_ * root
        if self._biased:
            self.item_bias_ = self.item_bias_ * self._scale
            self.user_bias_ = self.user_bias_ * self._scale
        self.validation_score_ = self.validation_score_ * self._scale
        if self.best_validation_score_ is not None:
            self.best_validation_score_ *= self._scale
        self.history_ = [{key: value * self._scale ** _SCALED_RECORDS[key]
                          if key in _SCALED_RECORDS else value
                          for key, value in record.items()} for record in self.history_]

    def _fold_in_alpha_u(self):
        return self.alpha_u_

    def _fold_in_rows(self, Xc, Vt):
        """Fold-in on the scaled ratings, as the fit ran (the strengths are in its units)."""
        scale = getattr(self, "_scale", 1.0)
        if scale == 1.0:
            return super()._fold_in_rows(Xc, Vt)
        root = np.sqrt(scale)
        Xs = Xc.copy()
        Xs.data = Xs.data / scale
        Vs = Vt / root
        if self._biased:  # [Vt, 1]: the ones column stays 1, b_u is then in scaled units
            Vs[:, -1] = 1.0
        U = super()._fold_in_rows(Xs, Vs) * root
        if self._biased:
            U[:, -1] *= root
        return U

    def _collapsed(self, Xc):
        scale = getattr(self, "_scale", 1.0)
        if scale == 1.0:
            return super()._collapsed(Xc)
        X = Xc.copy()
        X.data = X.data * scale
        return super()._collapsed(X)
