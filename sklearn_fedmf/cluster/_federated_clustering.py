"""Federated clustering by orthogonal NMF with FedMAvg or FedMGS (Wang & Chang, II-B and V).

Orientation (spec fedmavg_fedmgs.md, 1.3): rows of ``X`` are samples, held by the clients;
the paper's ``X`` is ``X.T``. The global factor ``W`` (``n_features x K``) is
``cluster_centers_.T``; client ``p`` keeps ``A_p = H_p^T`` (``n_p x K``), its samples'
memberships. The model of all the paper's experiments (35)-(36)::

    F(W, H) = (1/N) ||X - W H||^2 + sum_j [rho/2 ((1^T h_j)^2 - ||h_j||^2) + nu/2 ||h_j||^2]
    W in [min X, max X] entrywise,  H >= 0

The penalty vanishes iff every ``h_j`` has at most one nonzero, so growing ``rho`` (SNCP,
2.4) drives each sample into one cluster; as samples keep their own scale, samples are
clustered by direction. ``h_constraint="onehot"`` is the exact K-means formulation (2.1):
no penalty, one-hot ``h_j`` (the H phase is the assignment step), ``W`` unconstrained.

Steps are factors of Lipschitz constants (G3). As ``(1/c_p) grad_{H_p} F_p`` does not
depend on ``p`` (2.3), :func:`h_steps` is one matrix operation on the stacked rows of any
set of clients (8.2): a client runs it on its rows, a simulator may batch clients.
"""

from __future__ import annotations

import sys
import warnings
from functools import partial
from numbers import Integral, Real
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, ClusterMixin, _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_array, check_is_fitted, validate_data
from threadpoolctl import threadpool_limits

from .._base import FEDERATION_CONSTRAINTS
from .._data import resolve_clients
from .._engine import (
    FederatedProtocol,
    evaluate,
    initialize_federation,
    make_entropy,
    partition_rng,
    resident_blocks,
    run_federation,
)

__all__ = ["FederatedClustering"]

EPS = 1e-300  # floor of a Lipschitz constant (an all-zero factor)


class SampleBlock(NamedTuple):
    """One client's samples (dense array or CSR) and their global row indices."""

    rows: np.ndarray
    X: np.ndarray | sp.csr_matrix

    @property
    def n_rows(self):
        return self.X.shape[0]

    @property
    def nnz(self):  # work weight for the engine's load balancing
        return self.X.nnz if sp.issparse(self.X) else self.X.size


# ---- pure solver functions ------------------------------------------------------------------
def spectral_norm(S):
    """Largest absolute eigenvalue of a symmetric matrix."""
    return float(np.abs(np.linalg.eigvalsh(S)).max()) if S.size else 0.0


def penalty_matrix(n_clusters, rho, nu):
    """``B = rho 1 1^T + (nu - rho) I``: ``grad_h R_H = B h`` for the penalty (35)."""
    return rho * np.ones((n_clusters, n_clusters)) + (nu - rho) * np.eye(n_clusters)


def h_steps(A, X, W, *, n_total, rho, nu, c_factor, n_steps):
    """``n_steps`` projected-gradient steps (11) on the memberships ``A`` (rows = samples).

    ``A <- max(0, A - (A Hc - (2/N) X W) / c)`` with ``Hc = (2/N) W^T W + B`` and
    ``c = c_factor * ||Hc||_2``: the ``omega_p`` of client ``p`` cancels between its gradient
    and its constant ``c_p = c_factor * L_Hp``, so any stack of clients' rows is updated at once.
    """
    Hc = (2.0 / n_total) * (W.T @ W) + penalty_matrix(W.shape[1], rho, nu)
    c = c_factor * max(spectral_norm(Hc), EPS)
    Y = (2.0 / n_total) * np.asarray(X @ W)
    for _ in range(n_steps):
        A = np.maximum(A - (A @ Hc - Y) / c, 0.0)
    return A


def one_sparse_fit(X, W):
    """Best single cluster and scale per sample: ``max_k max(0, x.w_k)^2 / ||w_k||^2`` (2.5).

    Returns ``(labels, scale, gain)``; ``||x - scale w_label||^2 = ||x||^2 - gain``.
    """
    norms = (W * W).sum(axis=0)
    dots = np.maximum(np.asarray(X @ W), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        gains = np.where(norms > 0, dots**2 / norms, -np.inf)
    labels = np.argmax(gains, axis=1)
    best = gains[np.arange(len(labels)), labels]
    scale = np.where(np.isfinite(best), dots[np.arange(len(labels)), labels], 0.0)
    scale = scale / np.where(norms[labels] > 0, norms[labels], 1.0)
    return labels, scale, np.where(np.isfinite(best), best, 0.0)


def nearest_center(X, W):
    """K-means assignment: ``argmin_k ||x - w_k||^2``, and that squared distance."""
    sq = np.asarray(X.multiply(X).sum(axis=1)).ravel() if sp.issparse(X) else (X * X).sum(1)
    dist = sq[:, None] - 2.0 * np.asarray(X @ W) + (W * W).sum(axis=0)
    labels = np.argmin(dist, axis=1)
    return labels, np.maximum(dist[np.arange(len(labels)), labels], 0.0)


def clustering_cost(X, W, onehot):
    """Each sample's cluster and cost: ``min_{k, t >= 0} ||x - t w_k||^2`` (one-sparse ONMF), or
    ``min_k ||x - w_k||^2`` (K-means)."""
    if onehot:
        return nearest_center(X, W)
    labels, _, gain = one_sparse_fit(X, W)
    sq = np.asarray(X.multiply(X).sum(axis=1)).ravel() if sp.issparse(X) else (X * X).sum(1)
    return labels, np.maximum(sq - gain, 0.0)


def one_hot(labels, n_clusters):
    A = np.zeros((len(labels), n_clusters))
    A[np.arange(len(labels)), labels] = 1.0
    return A


def local_w_steps(W, AtA, XtA, n_rows, d, n_steps):
    """FedMAvg's ``n_steps`` unprojected steps ``W <- W - (W A_p - B_p) / d`` in closed form.

    ``A_p = (2/n_p) A^T A``, ``B_p = (2/n_p) X^T A``. With ``A_p = V diag(lam) V^T`` and
    ``r = 1 - lam/d``: ``W_Q = W V diag(r^Q) V^T + (B_p/d) V diag(sum_{i<Q} r^i) V^T`` (8.2).
    """
    lam, V = np.linalg.eigh((2.0 / n_rows) * AtA)
    x = lam / d
    power = (1.0 - x) ** n_steps
    with np.errstate(divide="ignore", invalid="ignore"):
        small = np.abs(x) < 0.5  # 1 - r^Q loses digits there: use expm1/log1p
        geo = np.where(small, -np.expm1(n_steps * np.log1p(-np.where(small, x, 0.0))) / x,
                       (1.0 - power) / x)
    geo = np.where(x == 0, float(n_steps), geo)
    Bp = (2.0 / n_rows) * XtA
    return (W @ V) * power @ V.T + (Bp @ V) * (geo / d) @ V.T


def project_w(W, box):
    """``P_W``: the box ``[min X, max X]`` (None: unconstrained)."""
    return W if box is None else np.clip(W, box[0], box[1])


def q2_schedule(round_number, local_iter_v, q_hat):
    """``Q2^s``: constant, or ``floor(q_hat / s) + 1`` when ``local_iter_v`` is None (3.2)."""
    return int(local_iter_v) if local_iter_v is not None else q_hat // round_number + 1


def _with_stats(A, X, sq):
    """Client state: memberships plus the two Grams every later step needs."""
    return {"A": A, "AtA": A.T @ A, "XtA": np.asarray(X.T @ A), "sq": sq}


def init_server(rng, *, n_features, n_clusters, amplitude, centers, box, rho, q2_first):
    """``W^1 = P_W(W^0)`` (G1), ``W^0`` i.i.d. ``U[0, a)`` or the given centers."""
    W0 = centers.T.copy() if centers is not None else amplitude * rng.random((n_features,
                                                                              n_clusters))
    W = project_w(W0, box)
    return {"W": W, "rho": rho}, {"W": W, "rho": rho, "q2": q2_first}


def init_client(block, broadcast, rng, *, amplitude, from_centers, onehot, upload):
    """``H_p^0``: i.i.d. ``U[0, a)``, or the best one-sparse fit to the given centers."""
    X, W = block.X, broadcast["W"]
    K = W.shape[1]
    if from_centers and onehot:
        A = one_hot(nearest_center(X, W)[0], K)
    elif from_centers:
        labels, scale, _ = one_sparse_fit(X, W)
        A = one_hot(labels, K) * scale[:, None]
    else:
        A = amplitude * rng.random((block.n_rows, K))
        if onehot:
            A = one_hot(np.argmax(A, axis=1), K)
    sq = float(X.multiply(X).sum()) if sp.issparse(X) else float(np.vdot(X, X))
    state = _with_stats(A, X, sq)
    if upload == "grams":  # FedMGS: G7's one-time upload of H_p H_p^T and X_p H_p^T
        return state, {"AtA": state["AtA"], "XtA": state["XtA"]}
    if upload == "gram":  # FedMAvg with the global step: H_p H_p^T for the server's cache
        return state, {"gram": state["AtA"]}
    return state, None


def h_phase(state, block, broadcast, *, n_total, nu, c_factor, local_iter_u, onehot):
    """The H phase of a round with ``W^s`` fixed: ``Q1`` PGD steps, or the assignment."""
    if onehot:
        A = one_hot(nearest_center(block.X, broadcast["W"])[0], broadcast["W"].shape[1])
    else:
        A = h_steps(state["A"], block.X, broadcast["W"], n_total=n_total,
                    rho=broadcast["rho"], nu=nu, c_factor=c_factor, n_steps=local_iter_u)
    return _with_stats(A, block.X, state["sq"])


def init_uploads(server_state, uploads, *, n_clients, q2):
    """The server caches every client's one-time Grams (FedMGS's G1/G2, FedMAvg's step)."""
    cache = {key: np.stack([uploads[p][key] for p in range(n_clients)]) for key in uploads[0]}
    state = {**server_state, **cache}
    return state, {"W": state["W"], "rho": state["rho"], "q2": q2}


# -- FedMGS (Algorithm 2) --


def mgs_client_update(state, block, broadcast, rng, selected, *, h_params):
    """Sampled client: H phase, then send ``H_p H_p^T`` and ``X_p H_p^T`` (full values)."""
    new = h_phase(state, block, broadcast, **h_params)
    return new, {"AtA": new["AtA"], "XtA": new["XtA"]}


def mgs_server_update(server_state, uploads, round_index, *, n_total, d_factor, q2, box):
    """Rebuild ``G1 = (2/N) H H^T``, ``G2 = (2/N) X H^T`` and take ``Q2`` projected steps (32).

    The caches are updated in place (the server owns them); the sums are recomputed in client
    order, so no rounding drift accumulates.
    """
    for p, upload in uploads.items():
        server_state["AtA"][p] = upload["AtA"]
        server_state["XtA"][p] = upload["XtA"]
    G1 = (2.0 / n_total) * server_state["AtA"].sum(axis=0)
    G2 = (2.0 / n_total) * server_state["XtA"].sum(axis=0)
    d = d_factor * max(spectral_norm(G1), EPS)
    W = server_state["W"]
    for _ in range(q2):
        W = project_w(W - (W @ G1 - G2) / d, box)
    rho = server_state["rho"]
    return {**server_state, "W": W}, {"W": W, "rho": rho, "q2": q2}


# -- FedMAvg (Algorithm 1) --
def mavg_prepare(state, block, broadcast, rng, selected, *, h_params):
    """Prepare phase (global step): H phase, keep ``W^s``, send ``H_p H_p^T``."""
    new = h_phase(state, block, broadcast, **h_params)
    return {**new, "round": broadcast}, {"gram": new["AtA"]}


def mavg_server_prepare(server_state, stats, round_index, *, n_total, d_factor):
    """``d^s = d_factor (2/N) lambda_max(H^s H^s^T)`` over all clients (3.4)."""
    grams = server_state["gram"].copy()
    for p, stat in stats.items():
        grams[p] = stat["gram"]
    d = d_factor * (2.0 / n_total) * spectral_norm(grams.sum(axis=0))
    return {**server_state, "gram": grams}, {"d": max(d, EPS)}


def mavg_client_update(state, block, message, rng, selected, *, h_params, d_factor, w_step):
    """H phase (unless prepared), then, if sampled, Q2 local W steps and the upload of W_p."""
    if w_step == "local":
        state = {**h_phase(state, block, message, **h_params), "round": message}
    broadcast = state.pop("round")
    if not selected:
        return state, None
    n_p = block.n_rows
    d_local = d_factor * (2.0 / n_p) * spectral_norm(state["AtA"])
    if w_step == "local":
        d = d_local
    elif w_step == "guarded":  # G5: never longer than 1/(0.51 L_Wp) on this client
        d = max(message["d"], 0.51 * d_local / d_factor)
    else:
        d = message["d"]
    W = local_w_steps(broadcast["W"], state["AtA"], state["XtA"], n_p, max(d, EPS),
                      broadcast["q2"])
    return state, {"W": W}


def mavg_server_update(server_state, uploads, round_index, *, weights, aggregation,
                       local_iter_v, q_hat, box):
    """``W^{s+1} = P_W(average of the uploaded W_p)`` ((8)-(10))."""
    clients = list(uploads)
    w = weights[clients] if aggregation == "weighted" else np.ones(len(clients))
    w = w / w.sum()
    W = project_w(sum(wi * uploads[p]["W"] for wi, p in zip(w, clients)), box)
    q2 = q2_schedule(round_index + 2, local_iter_v, q_hat)
    return {**server_state, "W": W}, {"W": W, "rho": server_state["rho"], "q2": q2}


# -- diagnostics --
def client_metrics(state, block, broadcast):
    """``||X_p - A_p W^T||^2`` from the Grams, the penalty sum and ``||A_p||^2``."""
    W, AtA = broadcast["W"], state["AtA"]
    fit = state["sq"] - 2.0 * np.vdot(W, state["XtA"]) + np.vdot(W.T @ W, AtA)
    trace = float(np.trace(AtA))
    return {"fit": max(fit, 0.0), "penalty": float(AtA.sum()) - trace, "h_sq": trace}


def combine_metrics(server_state, sums, *, n_total, nu):
    """The penalized objective (2) at ``(W^{s+1}, H^s)`` (G9) and its parts."""
    rho = server_state["rho"]
    fit = sums["fit"] / n_total
    return {
        "objective": fit + 0.5 * rho * sums["penalty"] + 0.5 * nu * sums["h_sq"],
        "fit": fit, "penalty": sums["penalty"], "h_sq": sums["h_sq"], "rho": rho,
    }


def make_protocol(*, algorithm, n_features, n_clusters, n_clients, weights, n_total, amplitude,
                  centers, box, rho, nu, onehot, local_iter_u, local_iter_v, q_hat,
                  participation, aggregation, c_factor, d_factor, w_step):
    """Bind the hyperparameters to the pure functions above."""
    h_params = dict(n_total=n_total, nu=nu, c_factor=c_factor, local_iter_u=local_iter_u,
                    onehot=onehot)
    mgs = algorithm == "fedmgs"
    prepared = not mgs and w_step != "local"
    q2_first = q2_schedule(1, local_iter_v, q_hat)
    common = dict(
        init_server=partial(init_server, n_features=n_features, n_clusters=n_clusters,
                            amplitude=amplitude, centers=centers, box=box, rho=rho,
                            q2_first=q2_first),
        init_client=partial(init_client, amplitude=amplitude, from_centers=centers is not None,
                            onehot=onehot,
                            upload="grams" if mgs else ("gram" if prepared else None)),
        client_metrics=client_metrics,
        combine_metrics=partial(combine_metrics, n_total=n_total, nu=nu),
    )
    if mgs:
        return FederatedProtocol(
            **common,
            server_init_uploads=partial(init_uploads, n_clients=n_clients, q2=q2_first),
            client_update=partial(mgs_client_update, h_params=h_params),
            server_update=partial(mgs_server_update, n_total=n_total, d_factor=d_factor,
                                  q2=q2_first, box=box),
        )
    return FederatedProtocol(
        **common,
        server_init_uploads=(partial(init_uploads, n_clients=n_clients, q2=q2_first)
                             if prepared else None),
        client_prepare=partial(mavg_prepare, h_params=h_params) if prepared else None,
        server_prepare=partial(mavg_server_prepare, n_total=n_total,
                               d_factor=d_factor) if prepared else None,
        client_update=partial(mavg_client_update, h_params=h_params, d_factor=d_factor,
                              w_step=w_step),
        server_update=partial(mavg_server_update, weights=weights, aggregation=aggregation,
                              local_iter_v=local_iter_v, q_hat=q_hat, box=box),
        update_all=participation == "pcc",
        broadcast_to_all=participation == "pcc",
    )


# ---- SNCP: rounds one at a time, the penalty schedule between them (2.4) -------------------
def sncp_rho(rho, rel_change, round_number, *, rho_tol, growth, force_every, rho_max):
    """Next ``rho``: times ``growth`` when the objective stalls (``rel_change < rho_tol``) or
    every ``force_every`` rounds (the reference code's forced increase), capped at ``rho_max``."""
    forced = bool(force_every) and round_number % force_every == 0
    return min(rho * growth, rho_max) if rel_change < rho_tol or forced else rho


def run_rounds(protocol, blocks, state, *, max_iter, tol, schedule, nu, callback, verbose,
               label, **engine):
    """Run the federation round by round; between rounds the server may raise ``rho``.

    ``epsilon_s = |F_s - F_{s-1}| / F_{s-1}`` with ``F_s = F(W^{s+1}, H^s)`` evaluated centrally
    (G9); after a raise of ``rho`` the previous value is re-based on the new ``rho``. Stops
    when ``epsilon_s < tol``, after ``max_iter`` rounds, or when ``callback`` returns True.
    """
    F_prev = evaluate(protocol, state, blocks, engine.get("n_jobs"))["objective"]
    init_bytes = engine.pop("init_bytes")
    stop = []  # what the user's callback returned, round by round
    hook = None if callback is None else (lambda k, info: stop.append(bool(callback(k, info))))
    for s in range(max_iter):
        state = run_federation(protocol, blocks, max_iter=1, tol=0.0, eval_every=1,
                               callback=hook, state=state, label=label,
                               init_bytes=init_bytes if s == 0 else (0, 0), **engine)
        record = state.history[-1]
        F = record["objective"]
        record["rel_change"] = eps = abs(F - F_prev) / max(abs(F_prev), EPS)
        if verbose:
            print(f"[{label}] round {record['round']} objective={F:.6g} rho={record['rho']:.3g}"
                  f" rel_change={eps:.3g}", file=sys.stderr)
        if (stop and stop[-1]) or eps < tol:
            break
        if schedule is not None:
            rho = sncp_rho(record["rho"], eps, state.n_rounds, **schedule)
            if rho != record["rho"]:
                state.server_state = {**state.server_state, "rho": rho}
                state.broadcast = {**state.broadcast, "rho": rho}
                F = record["fit"] + 0.5 * rho * record["penalty"] + 0.5 * nu * record["h_sq"]
        F_prev = F
    return state


# ---- estimator ----------------------------------------------------------------------------
class FederatedClustering(ClusterMixin, BaseEstimator):
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
        ``Q2``. None: 100 for FedMGS (G8), the diminishing ``floor(q_hat / s) + 1`` for FedMAvg.
    q_hat : int, default=5
        ``Q_hat`` of FedMAvg's diminishing schedule.
    n_clients : int, default=10
        Number of clients when ``clients`` is not given to fit.
    partition : {"random", "contiguous"}, default="random"
    clients_per_round : int, float or None, default=None
        Clients sampled (uniformly, without replacement) each round; None means all.
    participation : {"pcc", "pcp"}, default="pcc"
        FedMAvg only: every client (``"pcc"``) or only the sampled ones (``"pcp"``) update
        their memberships. FedMGS always uses the sampled clients only.
    aggregation : {"weighted", "sampled_mean"} or None, default=None
        FedMAvg's server average: weights ``N_p`` (eq. (8) at full participation, renormalized
        over the senders otherwise) or the plain mean. None means ``"weighted"``.
    c_factor : float, default=0.51
        Membership step ``1 / (c_factor L_Hp)``.
    d_factor : float or None, default=None
        Center step ``1 / (d_factor L_W)``; None: 0.501 (FedMGS) or 5 (FedMAvg).
    w_step : {"global", "local", "guarded"}, default="global"
        FedMAvg's ``L_W``: of all clients' memberships this round (clients send ``H_p H_p^T``
        first), of the client's own, or the global one bounded by the local (G5).
    h_constraint : {"nonnegative", "onehot"}, default="nonnegative"
        ``"onehot"``: the exact K-means formulation (assignment step, unconstrained centers,
        no penalty).
    sncp : bool, default=True
        Grow ``rho`` (SNCP); False keeps ``rho = rho0 ||X||^2 / N``.
    rho0, nu : float, default=1e-8, 1e-10
        Initial penalty and ridge weights, relative to ``||X||^2 / N``.
    rho_growth : float, default=1.5
    rho_tol : float or None, default=None
        Raise ``rho`` when the relative change of the objective is below it; None: 5e-5
        (FedMGS) or 1e-5 (FedMAvg).
    rho_force_every : int, default=200
        Also raise ``rho`` every that many rounds (0 never).
    rho_max : float or None, default=None
        Cap of ``rho`` relative to ``||X||^2 / N``; None: 1 (FedMGS) or 100 (FedMAvg).
    max_iter : int, default=1000
        Communication rounds.
    tol : float, default=1e-8
        Stop when the relative change of the objective is below ``tol``.
    init : {"random"} or array-like of shape (n_clusters, n_features), default="random"
        ``"random"``: centers and memberships i.i.d. ``U[0, a)``, ``a = sqrt(mean|X| / K)``.
        An array: initial centers; each sample starts from its best one-sparse fit to them.
    n_init : int, default=1
        Federations run from different random starts (as in ``KMeans``); the one with the
        lowest final clustering cost (``-score`` on the training samples: one scalar per
        client) is kept. Communication grows ``n_init``-fold; ``history_`` is the kept run's.
        With an array ``init`` a single run is made.
    dropout : float, default=0.0
        Probability that a sampled client fails in a round.
    callback : callable, default=None
        ``callback(round, info)`` after each round (of each of the ``n_init`` federations);
        returning True stops that federation.
    random_state : int, RandomState instance or None, default=None
    n_jobs : int, default=None
    verbose : int, default=0

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
    n_features_in_ : int

    References
    ----------
    S. Wang and T.-H. Chang. Federated Matrix Factorization: Algorithm Design and Application
    to Data Clustering. IEEE Trans. Signal Process., 2022.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf import FederatedClustering
    >>> X = np.array([[1.0, 0.1], [2.0, 0.1], [3.0, 0.3], [0.1, 1.0], [0.2, 2.0], [0.1, 3.0]])
    >>> model = FederatedClustering(n_clusters=2, n_clients=3, random_state=0).fit(X)
    >>> bool(len(set(model.labels_[:3])) == 1 and model.labels_[0] != model.labels_[3])
    True
    >>> model.predict([[5.0, 0.0]])[0] == model.labels_[0]
    np.True_
    """

    _parameter_constraints: dict = {
        **FEDERATION_CONSTRAINTS,
        "n_clusters": [Interval(Integral, 1, None, closed="left")],
        "algorithm": [StrOptions({"fedmgs", "fedmavg"})],
        "local_iter_u": [Interval(Integral, 1, None, closed="left")],
        "local_iter_v": [Interval(Integral, 1, None, closed="left"), None],
        "q_hat": [Interval(Integral, 0, None, closed="left")],
        "clients_per_round": [Interval(Integral, 1, None, closed="left"),
                              Interval(Real, 0, 1, closed="right"), None],
        "participation": [StrOptions({"pcc", "pcp"})],
        "aggregation": [StrOptions({"weighted", "sampled_mean"}), None],
        "c_factor": [Interval(Real, 0, None, closed="neither")],
        "d_factor": [Interval(Real, 0, None, closed="neither"), None],
        "w_step": [StrOptions({"global", "local", "guarded"})],
        "h_constraint": [StrOptions({"nonnegative", "onehot"})],
        "sncp": ["boolean"],
        "rho0": [Interval(Real, 0, None, closed="left")],
        "nu": [Interval(Real, 0, None, closed="left")],
        "rho_growth": [Interval(Real, 1, None, closed="left")],
        "rho_tol": [Interval(Real, 0, None, closed="left"), None],
        "rho_force_every": [Interval(Integral, 0, None, closed="left")],
        "rho_max": [Interval(Real, 0, None, closed="left"), None],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "init": [StrOptions({"random"}), "array-like"],
        "n_init": [Interval(Integral, 1, None, closed="left")],
        "dropout": [Interval(Real, 0, 1, closed="left")],
    }

    def __init__(
        self,
        n_clusters=8,
        *,
        algorithm="fedmgs",
        local_iter_u=10,
        local_iter_v=None,
        q_hat=5,
        n_clients=10,
        partition="random",
        clients_per_round=None,
        participation="pcc",
        aggregation=None,
        c_factor=0.51,
        d_factor=None,
        w_step="global",
        h_constraint="nonnegative",
        sncp=True,
        rho0=1e-8,
        nu=1e-10,
        rho_growth=1.5,
        rho_tol=None,
        rho_force_every=200,
        rho_max=None,
        max_iter=1000,
        tol=1e-8,
        init="random",
        n_init=1,
        dropout=0.0,
        callback=None,
        random_state=None,
        n_jobs=None,
        verbose=0,
    ):
        self.n_clusters = n_clusters
        self.algorithm = algorithm
        self.local_iter_u = local_iter_u
        self.local_iter_v = local_iter_v
        self.q_hat = q_hat
        self.n_clients = n_clients
        self.partition = partition
        self.clients_per_round = clients_per_round
        self.participation = participation
        self.aggregation = aggregation
        self.c_factor = c_factor
        self.d_factor = d_factor
        self.w_step = w_step
        self.h_constraint = h_constraint
        self.sncp = sncp
        self.rho0 = rho0
        self.nu = nu
        self.rho_growth = rho_growth
        self.rho_tol = rho_tol
        self.rho_force_every = rho_force_every
        self.rho_max = rho_max
        self.max_iter = max_iter
        self.tol = tol
        self.init = init
        self.n_init = n_init
        self.dropout = dropout
        self.callback = callback
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, *, clients=None):
        """Cluster the samples of ``X`` held by the clients.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
            The samples (the paper's clustering data are nonnegative; with negative entries
            the nonnegative-membership model is questionable and a warning is raised).
        y : Ignored
        clients : array-like of shape (n_samples,), default=None
            Client label of each sample; when None samples are split into ``n_clients``.

        Returns
        -------
        self : FederatedClustering
        """
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64)
        n_samples, n_features = X.shape
        K = self.n_clusters
        if n_samples < K:
            raise ValueError(f"n_samples={n_samples} should be >= n_clusters={K}.")
        if clients is None and self.n_clients > n_samples:
            raise ValueError(f"n_clients={self.n_clients} is larger than n_samples={n_samples}: "
                             "every client needs at least one sample.")
        mgs, onehot = self.algorithm == "fedmgs", self.h_constraint == "onehot"
        centers = None
        if not isinstance(self.init, str):
            centers = check_array(self.init, dtype=np.float64)
            if centers.shape != (K, n_features):
                raise ValueError(f"init must have shape (n_clusters, n_features) = "
                                 f"{(K, n_features)}, got {centers.shape}.")
        entropy = make_entropy(self.random_state)
        labels, codes, n_clients = resolve_clients(
            n_samples, clients, self.n_clients, self.partition, partition_rng(entropy)
        )
        if isinstance(self.clients_per_round, Integral) and self.clients_per_round > n_clients:
            raise ValueError(f"clients_per_round={self.clients_per_round} is larger than the "
                             f"number of clients ({n_clients}).")
        blocks = [SampleBlock(np.flatnonzero(codes == p), None) for p in range(n_clients)]
        blocks = [b._replace(X=X[b.rows]) for b in blocks]
        if any(b.n_rows == 0 for b in blocks):
            raise ValueError("Every client needs at least one sample.")

        # Each client sends ||X_p||^2, N_p, sum |X_p|, min and max once (five scalars).
        x_min, x_max = float(X.min()), float(X.max())
        sq = float(X.multiply(X).sum()) if sp.issparse(X) else float(np.vdot(X, X))
        scale = max(sq / n_samples, EPS)  # ||X||^2 / N
        abs_mean = float(abs(X).sum()) / (n_samples * n_features)
        if x_min < 0 and not onehot:
            warnings.warn("X has negative entries: orthogonal NMF with nonnegative memberships "
                          "is a questionable clustering model there (h_constraint='onehot' is "
                          "K-means).", UserWarning, stacklevel=2)
        rho = 0.0 if onehot else self.rho0 * scale
        nu = 0.0 if onehot else self.nu * scale
        local_iter_v = self.local_iter_v if self.local_iter_v or not mgs else 100
        protocol = make_protocol(
            algorithm=self.algorithm, n_features=n_features, n_clusters=K, n_clients=n_clients,
            weights=np.array([b.n_rows for b in blocks], dtype=float) / n_samples,
            n_total=n_samples, amplitude=np.sqrt(abs_mean / K), centers=centers,
            box=None if onehot else (x_min, x_max), rho=rho, nu=nu, onehot=onehot,
            local_iter_u=self.local_iter_u, local_iter_v=local_iter_v, q_hat=self.q_hat,
            participation=self.participation, aggregation=self.aggregation or "weighted",
            c_factor=self.c_factor, d_factor=self.d_factor or (0.501 if mgs else 5.0),
            w_step=self.w_step,
        )
        schedule = None
        if self.sncp and not onehot:
            schedule = dict(
                rho_tol=self.rho_tol if self.rho_tol is not None else (5e-5 if mgs else 1e-5),
                growth=self.rho_growth, force_every=self.rho_force_every,
                rho_max=(self.rho_max if self.rho_max is not None else (1.0 if mgs else 100.0))
                * scale,
            )
        starts = [entropy]
        if centers is None and self.n_init > 1:  # further starts: spawned, reproducible seeds
            starts += [int(c.generate_state(1, np.uint64)[0])
                       for c in np.random.SeedSequence(entropy).spawn(self.n_init - 1)]
        best = None
        # Parallelism is across clients: BLAS threads on the small per-client products only
        # fight over the cores (as in FederatedMFBase).
        with threadpool_limits(limits=1, user_api="blas"), resident_blocks(blocks):
            for start in starts:
                state, init_bytes = initialize_federation(protocol, blocks, entropy=start,
                                                          n_jobs=self.n_jobs)
                state = run_rounds(
                    protocol, blocks, state, max_iter=self.max_iter, tol=self.tol,
                    schedule=schedule, nu=nu, callback=self.callback, verbose=self.verbose,
                    label=type(self).__name__, init_bytes=init_bytes,
                    clients_per_round=self.clients_per_round, entropy=start,
                    n_jobs=self.n_jobs, dropout=self.dropout,
                )
                cost = 0.0
                if len(starts) > 1:  # one scalar per client: its samples' clustering cost
                    cost = sum(clustering_cost(b.X, state.server_state["W"], onehot)[1].sum()
                               for b in blocks)
                if best is None or cost < best[0]:
                    best = (cost, state)
        state = best[1]
        W = state.server_state["W"]
        A = np.zeros((n_samples, K))
        for block, client_state in zip(blocks, state.client_states):
            A[block.rows] = client_state["A"]
        self.cluster_centers_ = np.ascontiguousarray(W.T)
        self.sample_factors_ = A
        self.labels_ = np.argmax(A, axis=1)
        empty = ~(A > 0).any(axis=1)
        if empty.any():
            self.labels_[empty] = self._assign(X[empty])[0]
        self.rho_ = float(state.server_state["rho"])
        self.n_iter_ = state.n_rounds
        self.history_ = list(state.history)
        self.clients_ = labels
        self.n_clients_ = n_clients
        return self

    def _assign(self, X):
        return clustering_cost(X, self.cluster_centers_.T, self.h_constraint == "onehot")

    def predict(self, X):
        """The cluster of each sample: ``argmax_k max(0, w_k.x)^2 / ||w_k||^2``, the exact
        minimizer of ``min_{t >= 0} ||x - t w_k||^2`` (the nearest center in the K-means mode).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        return self._assign(X)[0]

    def score(self, X, y=None):
        """Opposite of the clustering cost of ``X`` under the fitted centers (as
        ``KMeans.score``): ``-sum_j min_{k, t >= 0} ||x_j - t w_k||^2``, or
        ``-sum_j min_k ||x_j - w_k||^2`` in the K-means mode. Greater is better.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_samples, n_features)
        y : Ignored

        Returns
        -------
        score : float
        """
        check_is_fitted(self)
        X = validate_data(self, X, accept_sparse="csr", dtype=np.float64, reset=False)
        return -float(self._assign(X)[1].sum())

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        return tags
