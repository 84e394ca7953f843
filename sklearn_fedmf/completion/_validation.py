"""Federated validation of the completion estimators: which ratings validate, when to stop,
and the biases-only floor a factor model must beat.

Each client holds out ``validation_fraction`` of its own ratings (``_fit.validation_split``);
per evaluated round it reports its squared-error sum and count on them (two numbers), and the
engine keeps the best round (:class:`~sklearn_fedmf.engine._federation.EarlyStopping`). At the end
the federated biases-only model (:class:`~sklearn_fedmf.FedBaseline`, Surprise's ``BaselineOnly``
model, with its default ``"auto"`` strengths: empirical Bayes from the clients' sums) is
fitted on the same clients' training ratings, and the kept factor model is compared with it
on the validation ratings **with evidence**: the fit keeps the factor part only when its gain
in validation mean squared error is larger than ``FLOOR_Z`` standard errors of that gain
(:func:`floor_evidence`); otherwise it keeps the biases-only model, refitted on all the
training ratings (the validation part included).

Why a standard error: the validation ratings are a sample, and the best round is chosen on
them, so a gain smaller than the sample's noise does not carry to new ratings (issue 37: 10 of
25 (estimator, set) pairs kept a factor part on such a gain and lost to ``BaselineOnly`` on
test by 0.0007 to 0.005). The errors of one user's ratings are correlated (one user factor
serves them all), so the sample's units are the users: with ``d`` the difference of the
squared errors (factor model minus biases) of a validation rating, ``D_u`` its sum over user
``u``'s ``n_u`` validation ratings and ``N`` their total, the gain is ``g = -sum_u D_u / N``
and its (cluster-robust) variance ``sum_u (D_u + g n_u)^2 / N^2`` times ``m / (m - 1)`` for
``m`` users with validation ratings. Each client sends five sums over its users, ``sum D_u``,
``sum D_u^2``, ``sum n_u D_u``, ``sum n_u^2`` and its count of such users (summable, so
secure aggregation covers them), beside the floor's squared-error sum.

Under secure aggregation a fit that samples ``m`` of its ``n`` clients per round reaches no
more than ``m`` clients in any exchange of its floor (issue 39: a secure sum over every
client costs each of them its key agreements, ``2 n k`` in all): the floor samples as the fit
(:func:`floor_rounds`), its start (per-item counts and rating sums) is summed in secure sums
of ``m`` clients each before it (:func:`floor_start`), and so are the clients' evidence sums
(:func:`evidence_clients`). Together they hold every client once: the same floor and the
same decision as one sum over every client, for ``2 n k_m`` agreements (``k_m``, the SecAgg+
degree at ``m`` clients) instead of ``2 n k_n``.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp

from ..engine._exchange import sum_securely
from ..engine._federation import EarlyStopping, _n_sampled
from ..engine._fit import validation_split
from ..exceptions import FedMFWarning

__all__ = ["EARLY_STOPPING_MIN_RATINGS", "FLOOR_EPOCHS", "FLOOR_EVIDENCE_ROUNDS", "FLOOR_Z",
           "aggregate_info", "biases_floor", "client_paired_sums", "evidence_clients",
           "floor_evidence", "floor_on_all_ratings", "floor_rounds", "floor_start", "rating_scales",
           "split_validation", "validation_residual"]

# "auto" early stopping needs this many ratings (HistGradientBoosting's 10,000 samples)
EARLY_STOPPING_MIN_RATINGS = 10_000
# the factor part is kept when its validation gain exceeds this many standard errors: "larger
# than its noise" (2 was measured beside it: on synthetic site-like sets it dropped factor
# parts whose test gain was 0.0005 to 0.003)
FLOOR_Z = 1.0
# Under secure aggregation a fit that samples its clients fits the floor with the same clients
# per round, for this many expected rounds per client (issue 39: a secure exchange over every
# client costs its X25519 agreements for each of them; 20 such rounds were 97 % of a secure
# RFRec fit). Measured (80/20 splits, one client per user, 10 % per round, three seeds): the
# floor's test RMSE above the floor with every client in 20 rounds by 0.0015, 0.0005,
# 0.00015, 0.0001 on MovieLens 100K and 0.0014, 0.0001, 0.00004, 0.00002 on ml-latest-small
# after 4, 6, 8 and 10 expected rounds per client (at 5 % per round alike).
FLOOR_EPOCHS = 8
# Under secure aggregation a fit that samples m of its n clients sums the evidence of the
# floor (floor_evidence) in secure sums of at most m clients each (issue 39): of every client
# (None), or of this many sums' clients, a uniform sample. Every client, because a sample of
# users has the same expected gain but a larger standard error: on ml-latest-small (FedMGS's gain
# 2.0 standard errors with every client, 0.0056 test RMSE over the floor; one client per
# user, 10 % a round) samples of 1, 2, 4, 6 rounds' clients kept the factor part in 45 %,
# 51 %, 64 %, 83 % of 1,000 draws; every client in sums of m costs ~70 % of the agreements of
# one sum over every client at 2,000 clients (SecAgg+ degree 24 at 200 against 34 at 2,000),
# a sample of 4 rounds 28 % (benchmarks/results/bench_secure-floorsum-2026-12.md).
FLOOR_EVIDENCE_ROUNDS = None


def split_validation(ctx, settings, *, implicit, validation_keys):
    """``(X, eval_X, report_X, rule)``: the training ratings, the validation ratings, the
    ``eval_set`` kept as a report beside them, and early stopping's rule (None: no
    validation). ``validation_keys`` is the class's ``(score key, report keys)``."""
    on, fraction = settings["early_stopping"], settings["validation_fraction"]
    X, eval_X = ctx.X, ctx.info.eval_X
    if on == "auto":  # (eval_every=0: the caller asked for no evaluation)
        on = (not implicit and fraction is not None
              and X.nnz >= EARLY_STOPPING_MIN_RATINGS and settings["eval_every"] > 0)
    if not on:
        return X, eval_X, None, None
    if implicit:
        raise ValueError(
            'early_stopping=True validates the rating error, which loss="implicit" does not '
            "predict (its scores rank items); set early_stopping=False and choose max_iter "
            "with a ranking scorer (sklearn_fedmf.model_selection).")
    if eval_X is None and fraction is None:
        raise ValueError(
            "early_stopping=True needs validation ratings: set validation_fraction (each "
            "client holds out that fraction of its ratings) or pass fit(eval_set=...).")
    report_X = None
    held_out = fraction is not None  # (else the eval set is the validation set)
    if held_out:  # the eval set, if any, stays a report beside the validation
        report_X = eval_X
        X, eval_X = validation_split(X, ctx.codes, ctx.n_clients, fraction, ctx.entropy)
    score_key, report_keys = validation_keys
    rule = EarlyStopping(n_iter_no_change=settings["n_iter_no_change"], tol=settings["tol"],
                         score_key=score_key, report_keys=report_keys, rename=held_out,
                         panel=settings["validation_panel"])
    return X, eval_X, report_X, rule


def biases_floor(ctx, model, *, n_jobs, secure_aggregation=False, clients_per_round=None,
                 known_count=None):
    """The federated biases-only model on the fit's clients' training ratings, its
    validation RMSE in rating units, the bytes ``(up, down)`` it cost, and the evidence
    ``(gain, noise)`` of :func:`floor_evidence` for the kept model ``model`` (its
    :func:`validation_residual`).

    ``ctx.X`` and ``ctx.info.eval_X`` are the fit's (centred by ``offset``, divided by
    ``rating_scale`` where a class scales them). Each client sends six more numbers: the
    squared-error sum of the floor on its validation ratings and the five sums of the
    paired comparison (module docstring). The floor is ``model._floor_class``,
    :class:`~sklearn_fedmf.FedBaseline` (the class's: it is itself a completion estimator).
    With ``secure_aggregation`` (the fit's) the floor is fitted with it too, with the fit's
    ``clients_per_round`` (:func:`floor_rounds`), and the clients' sums (each over the
    validation count, which the server has from the reports' secure sums) reach the server
    as secure sums: one of every client at full participation, else those of
    :func:`evidence_clients` (the floor's RMSE and the evidence are a sample's when they
    do not cover every client). ``known_count``: what the server knows of the validation
    count when only a panel of clients reported it (early stopping's panel: its count
    scaled to every client), which the clients' sums are divided by; the count itself is
    then summed with them. None: the count of every client's reports.
    """
    offset, scale = ctx.info.offset, ctx.info.rating_scale
    factor_residual = validation_residual(model, ctx)
    floor, (up, down) = _fit_floor(ctx, ctx.X, model._floor_class, n_jobs, secure_aggregation,
                                   clients_per_round)
    X_valid = ctx.info.eval_X
    rows = np.repeat(np.arange(X_valid.shape[0]), np.diff(X_valid.indptr))
    residual = (X_valid.data * scale + offset
                - (floor.user_bias_[rows] + floor.item_bias_[X_valid.indices] + floor.mean_))
    n, count = ctx.n_clients, residual.size
    codes = ctx.codes[rows]
    sums = np.column_stack([
        np.bincount(codes, weights=np.square(residual), minlength=n),
        client_paired_sums(factor_residual, residual, rows, ctx.codes, n),
        np.bincount(codes, minlength=n)])  # (the validation count of each client)
    if secure_aggregation is False:
        total = sums.sum(axis=0)
        up += 8 * (sums.shape[1] - 1) * n  # (the count the server has from the reports)
    else:  # each over the validation count (the server has it from the reports)
        batches = evidence_clients(n, clients_per_round, ctx.entropy)
        # (a sample also sends its validation count: the sums are over its ratings; and so
        # does every client when the server knows only a panel's count)
        words = sums.shape[1] - (sum(b.size for b in batches) == n and known_count is None)
        divisor = count if known_count is None else known_count
        total = np.zeros(sums.shape[1])
        for j, batch in enumerate(batches):
            key = (_FLOOR_SUM,) if batch.size == n else (_FLOOR_SUM, 2 + j)
            result = sum_securely({int(p): sums[p, :words] / divisor for p in batch},
                                  secure_aggregation,
                                  seed=np.random.SeedSequence(ctx.entropy, spawn_key=key))
            sent, received = result.total_bytes()
            up, down = up + sent, down + received
            total[:words] += np.asarray(result.sum, dtype=np.float64) * divisor
        if words < sums.shape[1]:
            total[-1] = count
    sampled = float(np.rint(total[-1]))  # the validation ratings the sums are over
    floor_rmse = float(np.sqrt(max(total[0], 0.0) / sampled)) if sampled > 0 else np.nan
    return floor, floor_rmse, (up, down), floor_evidence(total[1:-1], sampled)


def evidence_clients(n_clients, clients_per_round, entropy):
    """The clients of the secure sums that make the floor's evidence under secure
    aggregation, a list of arrays: every client in one sum when a round holds every client;
    else sums of at most ``clients_per_round`` clients each, so that no exchange after the
    start reaches more clients than a round (issue 39): of every client
    (``FLOOR_EVIDENCE_ROUNDS=None``: the decision of one sum over every client), or of
    ``FLOOR_EVIDENCE_ROUNDS`` rounds' clients drawn uniformly without replacement from the
    fit's ``entropy``. A uniform sample of clients is a sample of the users, the units of
    :func:`floor_evidence`'s standard error: its gain is unbiased and its standard error
    that sample's, larger by about ``sqrt(n / sampled)``, so a gain of zero passes
    ``FLOOR_Z`` as often and a small true gain less often (``FLOOR_EVIDENCE_ROUNDS``)."""
    n_sampled = _n_sampled(clients_per_round, n_clients)
    if n_sampled >= n_clients:
        return [np.arange(n_clients)]
    order = np.arange(n_clients)
    if FLOOR_EVIDENCE_ROUNDS is not None and FLOOR_EVIDENCE_ROUNDS * n_sampled < n_clients:
        rng = np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(_FLOOR_SUM, 1)))
        order = rng.permutation(n_clients)[:FLOOR_EVIDENCE_ROUNDS * n_sampled]
    return _blocks(order, n_sampled)


def _blocks(clients, size):
    """``clients`` in consecutive blocks of at most ``size``, each sorted: the clients of
    one secure sum each."""
    return [np.sort(clients[i:i + size]) for i in range(0, clients.size, size)]


def validation_residual(model, ctx):
    """The kept model's residuals at the validation ratings (``ctx.info.eval_X``'s
    order) in rating units, from ``model``'s fitted attributes in the fit's units (before a
    class scales them back): what each client computes on its own ratings."""
    X_valid = ctx.info.eval_X
    rows = np.repeat(np.arange(X_valid.shape[0]), np.diff(X_valid.indptr))
    cols = X_valid.indices
    prediction = np.einsum("ij,ji->i", model.user_factors_[rows], model.components_[:, cols],
                           dtype=np.float64)
    if model._biased:
        prediction += model.user_bias_[rows] + model.item_bias_[cols]
    return (X_valid.data - prediction) * ctx.info.rating_scale


def client_paired_sums(factor_residual, floor_residual, rows, codes, n_clients):
    """Each client's five sums of the paired comparison (module docstring), an array of
    shape ``(n_clients, 5)``: over its users ``u`` with validation ratings, ``sum D_u``,
    ``sum D_u^2``, ``sum n_u D_u``, ``sum n_u^2`` and their count, for the residuals of the
    factor model and of the floor at the validation ratings of the rows ``rows``."""
    d = np.square(factor_residual) - np.square(floor_residual)
    n_rows = codes.size
    D = np.bincount(rows, weights=d, minlength=n_rows)
    n_u = np.bincount(rows, minlength=n_rows).astype(np.float64)
    columns = (D, D * D, n_u * D, n_u * n_u, (n_u > 0).astype(np.float64))
    return np.column_stack([np.bincount(codes, weights=c, minlength=n_clients)
                            for c in columns])


def floor_evidence(sums, count):
    """``(gain, noise)``: the factor model's gain in validation mean squared error over the
    biases-only model, ``-sum D_u / N``, and its standard error with the users as units,
    from the clients' summed :func:`client_paired_sums` (``sums``, five numbers) and the
    validation count ``N`` (module docstring). The fit keeps the factor part when ``gain >
    FLOOR_Z * noise``."""
    sum_d, sum_d2, sum_nd, sum_n2, users = (float(v) for v in sums)
    if count <= 0:
        return 0.0, 0.0
    delta = sum_d / count
    spread = max(sum_d2 - 2.0 * delta * sum_nd + delta * delta * sum_n2, 0.0)
    correction = users / (users - 1.0) if users > 1.5 else 1.0
    return -delta, float(np.sqrt(spread * correction) / count)


_FLOOR_SUM = 9  # the floor's secure sum: its seed kind (the engine's are 0 to 7)


def floor_on_all_ratings(ctx, floor_class, *, n_jobs, secure_aggregation=False,
                         clients_per_round=None):
    """The biases-only model refitted on every training rating, the validation ratings held
    out of them included, and its bytes: what a fit keeps when the floor wins. The choice is
    made; the held-out tenth only cost the floor accuracy (about 0.0015 RMSE on MovieLens;
    its ``"auto"`` strengths are estimated again on all the ratings)."""
    return _fit_floor(ctx, _stacked(ctx.X, ctx.info.eval_X), floor_class, n_jobs,
                      secure_aggregation, clients_per_round)


def _stacked(A, B):
    """The canonical CSR matrix of the entries of ``A`` and ``B`` (canonical, no entry in
    both): each row's entries of ``A`` then ``B``, sorted. Stacked, not added: a sum would
    drop a centred rating of exactly 0; and made in place of COO triplets (16 bytes a rating,
    and a duplicate check of the result, at the floor's peak)."""
    indptr = A.indptr.astype(np.int64) + B.indptr
    a_rows, b_rows = np.diff(A.indptr), np.diff(B.indptr)
    # entry s of row i goes to indptr[i] + (s - A.indptr[i]) (A) or after row i's A part (B)
    to_a = np.arange(A.nnz) + np.repeat(indptr[:-1] - A.indptr[:-1], a_rows)
    to_b = np.arange(B.nnz) + np.repeat(indptr[:-1] + a_rows - B.indptr[:-1], b_rows)
    data, indices = np.empty(indptr[-1], A.dtype), np.empty(indptr[-1], A.indices.dtype)
    data[to_a], indices[to_a] = A.data, A.indices
    del to_a
    data[to_b], indices[to_b] = B.data, B.indices
    del to_b
    X = sp.csr_matrix((data, indices, indptr), shape=A.shape)
    X.sort_indices()
    X.has_canonical_format = True
    return X


def floor_rounds(n_clients, clients_per_round, secure_aggregation):
    """The floor's ``{"clients_per_round", "max_iter"}``: with every client each round or
    without secure aggregation, the floor's own defaults (every client, 20 rounds); under
    secure aggregation a fit that samples ``m`` of its ``n`` clients samples as many in the
    floor's rounds, ``ceil(FLOOR_EPOCHS n / m)`` of them, so that no exchange of the floor
    reaches every client (its start: :func:`floor_start`). (Partial participation is
    randomized block coordinate descent on the same objective:
    :class:`~sklearn_fedmf.FedBaseline`.) The plain floor keeps every client: its rounds
    cost no agreements, and it is the better yardstick."""
    n_sampled = _n_sampled(clients_per_round, n_clients)
    if secure_aggregation is False or n_sampled >= n_clients:
        return {}
    return {"clients_per_round": n_sampled,
            "max_iter": -(-FLOOR_EPOCHS * n_clients // n_sampled)}


def _fit_floor(ctx, X, floor_class, n_jobs, secure_aggregation, clients_per_round=None):
    """``floor_class`` fitted on the fit's clients with the ratings ``X`` (on the fit's
    scale), with the fit's ``secure_aggregation`` (and then its ``clients_per_round``:
    :func:`floor_rounds`, its start summed by :func:`floor_start` when it samples), and
    the bytes ``(up, down)`` of its start and rounds."""
    offset, scale = ctx.info.offset, ctx.info.rating_scale
    # back to ratings (the floor centres them itself; the floor's fit copies the matrix, so
    # the layout is shared here, not copied)
    canonical = X.has_canonical_format
    X = sp.csr_matrix((X.data * scale + offset, X.indices, X.indptr), shape=X.shape)
    X.has_canonical_format = canonical
    rounds = floor_rounds(ctx.n_clients, clients_per_round, secure_aggregation)
    floor = floor_class(n_clients=ctx.n_clients, random_state=ctx.entropy, n_jobs=n_jobs,
                        solver_params={"eval_every": 0}, secure_aggregation=secure_aggregation,
                        **rounds)
    if rounds:  # a secure sampled floor: its start in sums of a round's clients
        floor._given_start = floor_start(X, ctx.codes, ctx.n_clients,
                                         rounds["clients_per_round"], secure_aggregation,
                                         ctx.entropy)
    try:
        with warnings.catch_warnings():  # (what it would say, this fit has said)
            warnings.simplefilter("ignore", FedMFWarning)
            floor.fit(X, clients=ctx.labels)
    finally:
        floor._given_start = None  # (for this fit only)
    up = sum(r["bytes_uploaded"] for r in floor.history_)
    down = sum(r["bytes_downloaded"] for r in floor.history_)
    # (its biases are what the fit reads: the federation's state, its clients' layout of
    # about 12 bytes a rating, would stay held through the next floor's fit)
    del floor._federation
    return floor, (up, down)


def floor_start(X, codes, n_clients, clients_per_round, secure_aggregation, entropy):
    """``(counts, sums, (up, down))``: the per-item counts and rating sums of the ratings
    ``X`` (rows: the fit's, ``codes`` their clients) that start a secure sampled floor
    (:class:`~sklearn_fedmf.FedBaseline`'s start), summed securely in sums of at most
    ``clients_per_round`` clients each (every client once, in consecutive blocks), instead
    of one sum over every client after the fit's start (issue 39), and their bytes. The
    same sums, so the same floor (within the encoding). Each client's
    summand is dense over the items, as in the floor's own secure start."""
    n_items = X.shape[1]
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    owner = codes[rows]
    order = np.argsort(owner, kind="stable")
    client_ptr = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n_clients))])
    items, values = X.indices[order], X.data[order]
    counts, sums = np.zeros(n_items), np.zeros(n_items)
    up = down = 0
    for j, batch in enumerate(_blocks(np.arange(n_clients), clients_per_round)):
        summands = {}
        for p in batch.tolist():
            a, b = client_ptr[p], client_ptr[p + 1]
            summand = np.zeros(2 * n_items)
            np.add.at(summand, items[a:b], 1.0)
            np.add.at(summand, n_items + items[a:b], values[a:b])
            summands[p] = summand
        result = sum_securely(summands, secure_aggregation, seed=np.random.SeedSequence(
            entropy, spawn_key=(_FLOOR_START, j)))
        total = np.asarray(result.sum, dtype=np.float64)
        counts += total[:n_items]
        sums += total[n_items:]
        sent, received = result.total_bytes()
        up, down = up + sent, down + received
    return counts, sums, (up, down)


_FLOOR_START = 10  # the sampled floor's start in sums: its seed kind


# ---- a fit's scales from the clients' aggregates (a Flower server and its sites) -----------
def aggregate_info(estimator, settings, *, n_users, mean, rating_range, n_ratings,
                   sum_squares=None):
    """What a completion estimator's fit learns from its clients' aggregates (rows, rating
    count, sum and range; RFRec: the sum of squares) instead of the data: the fields of its
    ``FitInfo`` (``settings``: the fit's, resolved once). Sets the attributes the protocol
    and the ratings' centring depend on (``mean_``, ``rating_range_``, ``n_users_``;
    ``confidence_``, ``rating_scale_``)."""
    estimator.n_users_ = int(n_users)
    estimator.mean_ = float(mean)
    estimator.rating_range_ = (float(rating_range[0]), float(rating_range[1]))
    info = dict(eval_X=None, mean=estimator.mean_, rating_range=estimator.rating_range_,
                offset=estimator._offset, n_ratings=int(n_ratings))
    # (implicit: the sites' mean strength sets "auto"'s confidence scale)
    info.update(estimator._loss.deployed_info(estimator, settings, mean))
    info["rank"] = estimator._rank(int(n_ratings))  # (implicit: grows with the count)
    if hasattr(estimator, "_scale_info"):  # RFRec: the scale the ratings are divided by
        offset = info["offset"]  # sum (r - offset)^2 from the sums of r^2 and r
        centred = (sum_squares or 0.0) - n_ratings * offset * (2 * float(mean) - offset)
        info.update(estimator._scale_info(max(centred, 0.0), int(n_ratings), settings))
        estimator.rating_scale_ = info["rating_scale"]
    return info


def rating_scales(estimator):
    """``(offset, scale)`` of the fitted (or :func:`aggregate_info`-set) ``estimator``: a
    fit's ratings are ``(r - offset) / scale``
    (:func:`~sklearn_fedmf.engine._client_data.center_and_scale`)."""
    return estimator._offset, getattr(estimator, "rating_scale_", 1.0)
