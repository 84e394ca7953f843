"""The pure functions of :class:`~sklearn_fedmf.FederatedClustering`: the H and W steps of
orthogonal NMF, the clustering family's parts of the FedMGS and FedMAvg client and server
updates, ``make_protocol``, which binds them into the rounds written once for every family
(:mod:`sklearn_fedmf.completion._fedmgs._fedmgs_round`,
:mod:`sklearn_fedmf.completion._fedmavg._fedmavg_round`), and the SNCP schedule that raises ``rho``
between rounds (the protocol's ``after_round``)."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from .._threads import one_thread
from ..completion._fedmavg._fedmavg_round import (
    average_uploads,
    check_aggregation,
    q2_schedule,
    round_phases,
    store_grams,
    w_step_size,
)
from ..completion._fedmgs import _fedmgs_round as mgs_round
from ..engine._federation import FederatedProtocol, SummableUploads, evaluate

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
    """Best single cluster and scale per sample: ``max_k max(0, x.w_k)^2 / ||w_k||^2``.

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


def center_distances(X, W, onehot):
    """Each sample's distance to each cluster: ``min_{t >= 0} ||x - t w_k||`` (to the ray of
    ``w_k``; ``||x||`` for a zero center), or ``||x - w_k||`` in the K-means mode.

    The cost :func:`clustering_cost` takes is the square of the row minimum.
    """
    sq = np.asarray(X.multiply(X).sum(axis=1)).ravel() if sp.issparse(X) else (X * X).sum(1)
    dots = np.asarray(X @ W)
    norms = (W * W).sum(axis=0)
    if onehot:
        d2 = sq[:, None] - 2.0 * dots + norms
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            d2 = sq[:, None] - np.where(norms > 0, np.maximum(dots, 0.0) ** 2 / norms, 0.0)
    return np.sqrt(np.maximum(d2, 0.0))


def one_hot(labels, n_clusters):
    A = np.zeros((len(labels), n_clusters))
    A[np.arange(len(labels)), labels] = 1.0
    return A


def local_w_steps(W, AtA, XtA, n_rows, d, n_steps):
    """FedMAvg's ``n_steps`` unprojected steps ``W <- W - (W A_p - B_p) / d`` in closed form.

    ``A_p = (2/n_p) A^T A``, ``B_p = (2/n_p) X^T A``. With ``A_p = V diag(lam) V^T`` and
    ``r = 1 - lam/d``: ``W_Q = W V diag(r^Q) V^T + (B_p/d) V diag(sum_{i<Q} r^i) V^T``.
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


def _with_stats(A, X, sq):
    """Client state: memberships plus the two Grams every later step needs."""
    return {"A": A, "AtA": A.T @ A, "XtA": np.asarray(X.T @ A), "sq": sq}


def init_server(rng, *, n_features, n_clusters, amplitude, centers, box, rho, q2_first,
                weights=None):
    """``W^1 = P_W(W^0)`` (Algorithm 1's first average, over all clients), ``W^0`` i.i.d.
    ``U[0, a)`` or the given centers (``weights``: the clients' ``omega_p``, which the
    secure FedMAvg server sends each client as its weight)."""
    W0 = centers.T.copy() if centers is not None else amplitude * rng.random((n_features,
                                                                              n_clusters))
    W = project_w(W0, box)
    return {"W": W, "rho": rho, "weights": weights}, {"W": W, "rho": rho, "q2": q2_first}


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
    if upload == "grams":  # FedMGS: the one-time upload of H_p H_p^T and X_p H_p^T (G1^0, G2^0)
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
def aggregates(state, block, broadcast):
    """What a sampled client sends: ``H_p H_p^T`` and ``X_p H_p^T`` (full values)."""
    return {"AtA": state["AtA"], "XtA": state["XtA"]}


def mgs_server_update(server_state, uploads, round_index, *, n_total, d_factor, q2, box):
    """Rebuild ``G1 = (2/N) H H^T``, ``G2 = (2/N) X H^T`` and take ``Q2`` projected steps (32):
    FedMGS's server step (:func:`sklearn_fedmf.completion._fedmgs._fedmgs_round.server_step`)."""
    return mgs_round.server_step(server_state, uploads, round_index,
                                 fold=partial(_mgs_fold, n_total=n_total),
                                 step=partial(_mgs_steps, d_factor=d_factor, q2=q2, box=box))


def _mgs_fold(server_state, uploads, round_index, *, n_total):
    """``(state, G1, G2)``: the caches with the uploads, then their sums.

    The caches are updated in place (the server owns them); the sums are recomputed in client
    order, so no rounding drift accumulates.
    """
    for p, upload in uploads.items():
        server_state["AtA"][p] = upload["AtA"]
        server_state["XtA"][p] = upload["XtA"]
    G1 = (2.0 / n_total) * server_state["AtA"].sum(axis=0)
    G2 = (2.0 / n_total) * server_state["XtA"].sum(axis=0)
    return server_state, G1, G2


def _mgs_steps(server_state, G1, G2, *, d_factor, q2, box):
    """The server's ``Q2`` projected steps (32) at ``G1``, ``G2``."""
    d = d_factor * max(spectral_norm(G1), EPS)
    W = mgs_round.server_steps(server_state["W"], q2, d, lambda W: W @ G1 - G2,
                               lambda Z, d: project_w(Z, box))
    rho = server_state["rho"]
    return {**server_state, "W": W}, {"W": W, "rho": rho, "q2": q2}


# FedMGS under secure aggregation: the server needs the sums of every client's latest
# H_p H_p^T and X_p^T H_p, a cumulative exchange (sklearn_fedmf.secure._rounds) whose summands
# a client scales by 2/N itself: G1 and G2 are then the sums (and its entries stay small
# beside the encoding's clip however many samples it holds).
def mgs_summands(upload, weight=None, *, n_total):
    """A client's ``(2/N) H_p H_p^T`` and ``(2/N) X_p^T H_p`` (its round or initial upload)."""
    return {"G1": (2.0 / n_total) * np.asarray(upload["AtA"], dtype=np.float64),
            "G2": (2.0 / n_total) * np.asarray(upload["XtA"], dtype=np.float64)}


def mgs_secure_init(server_state, sums, n_summed, *, n_clients, q2):
    """:func:`init_uploads` from the secure sum of every client's initial aggregates."""
    if n_summed != n_clients:
        raise ValueError(f"FedMGS needs the aggregates of all {n_clients} clients, got "
                         f"{n_summed}.")
    return server_state, {"W": server_state["W"], "rho": server_state["rho"], "q2": q2}


def mgs_secure_update(server_state, sums, n_summed, round_index, *, d_factor, q2, box):
    """:func:`mgs_server_update` at the running sums ``G1``, ``G2`` of the latest
    aggregates."""
    return mgs_round.server_step(
        server_state, sums, n_summed, round_index,
        fold=lambda state, sums, n_summed, round_index: (state, sums["G1"], sums["G2"]),
        step=partial(_mgs_steps, d_factor=d_factor, q2=q2, box=box))


# -- FedMAvg (Algorithm 1) --
def h_round(state, block, broadcast, *, h_params):
    """The H phase, keeping the round's broadcast ``W^s`` for the W phase."""
    return {**h_phase(state, block, broadcast, **h_params), "round": broadcast}


def without_round(state):
    """What a client keeps between rounds (the broadcast it held goes)."""
    return {key: value for key, value in state.items() if key != "round"}


def membership_gram(state):
    """The Gram a client sends in the prepare phase (global step): ``H_p H_p^T``."""
    return state["AtA"]


def mavg_server_prepare(server_state, stats, round_index, *, n_total, d_factor):
    """``d^s = d_factor (2/N) lambda_max(H^s H^s^T)`` over all clients (Section V-A's step)."""
    grams = store_grams(server_state["gram"].copy(), stats)
    d = d_factor * (2.0 / n_total) * spectral_norm(grams.sum(axis=0))
    return {**server_state, "gram": grams}, {"d": max(d, EPS)}


def mavg_w_phase(state, block, d_global, *, d_factor, w_step):
    """``Q2`` local W steps from the kept ``W^s`` (:func:`local_w_steps`); the upload."""
    n_p, broadcast = block.n_rows, state["round"]
    d_local = d_factor * (2.0 / n_p) * spectral_norm(state["AtA"])
    d = w_step_size(d_local, d_global, w_step, d_factor)
    W = local_w_steps(broadcast["W"], state["AtA"], state["XtA"], n_p, max(d, EPS),
                      broadcast["q2"])
    return {"W": W}


def palm_h_step(A, W, block, broadcast, *, n_total, nu, c_factor):
    """FedPALM's projected H step at the current ``W_p`` (Remark 1, (15))."""
    return h_steps(A, block.X, W, n_total=n_total, rho=broadcast["rho"], nu=nu,
                   c_factor=c_factor, n_steps=1)


def palm_w_step(W, A, block, broadcast, *, d_factor, box):
    """FedPALM's projected W step at the new ``H_p`` (Remark 1, (16)); its size is a factor
    of the Lipschitz constant at that iterate, as in PALM."""
    AtA, XtA = A.T @ A, np.asarray(block.X.T @ A)
    d = max(d_factor * (2.0 / block.n_rows) * spectral_norm(AtA), EPS)
    return project_w(local_w_steps(W, AtA, XtA, block.n_rows, d, 1), box)


def palm_state(state, block, A):
    """The client's state after its FedPALM pairs."""
    return _with_stats(A, block.X, state["sq"])


def mavg_server_update(server_state, uploads, round_index, counts=None, *, weights,
                       aggregation, local_iter_v, q_hat, box):
    """``W^{s+1} = P_W(average of the uploaded W_p)`` ((8)-(10);
    :func:`~sklearn_fedmf.completion._fedmavg._fedmavg_round.average_uploads`, ``counts``: client ->
    draws)."""
    return mavg_from_mean(server_state, average_uploads(uploads, counts, weights, aggregation),
                          round_index, local_iter_v=local_iter_v, q_hat=q_hat, box=box)


def mavg_from_mean(server_state, W, round_index, *, local_iter_v, q_hat, box):
    """The FedMAvg server's step from the mean ``W`` of the uploads (plain, or the ratio of
    two secure sums, :func:`~sklearn_fedmf.completion._fedmavg._fedmavg_round.mean_of_sums`)."""
    W = project_w(W, box)
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
    """The penalized objective (2) at ``(W^{s+1}, H^s)`` (after aggregation) and its parts."""
    rho = server_state["rho"]
    fit = sums["fit"] / n_total
    return {
        "objective": fit + 0.5 * rho * sums["penalty"] + 0.5 * nu * sums["h_sq"],
        "fit": fit, "penalty": sums["penalty"], "h_sq": sums["h_sq"], "rho": rho,
    }


def make_protocol(*, algorithm, n_features, n_clusters, n_clients, weights, n_total, amplitude,
                  centers, box, rho, nu, onehot, rule, tol, schedule, sampling="uniform"):
    """Bind the hyperparameters to the pure functions above (``rule``: the rounds'
    :class:`~sklearn_fedmf.completion._fedmavg._fedmavg_round.RoundRule`; ``variant="fedpalm"``:
    FedMAvg's rounds with Remark 1's local steps, ``local_iter_u`` pairs).

    Between rounds the server runs :func:`sncp_after_round` (``rel_change``, the ``tol`` stop
    and, with a ``schedule``, the raise of ``rho``); the server state then needs ``F_prev``,
    the objective at the initial state, before round 1 (:func:`start_rounds`).
    """
    (local_iter_u, local_iter_v, q_hat, participation, aggregation, c_factor, d_factor, w_step,
     variant) = rule
    if algorithm == "fedmavg":
        check_aggregation(aggregation, sampling)
    h_params = dict(n_total=n_total, nu=nu, c_factor=c_factor, local_iter_u=local_iter_u,
                    onehot=onehot)
    mgs = algorithm == "fedmgs"
    palm = variant == "fedpalm"
    if palm and (mgs or onehot):
        raise ValueError('variant="fedpalm" is a variant of algorithm="fedmavg" with '
                         'nonnegative memberships.')
    prepared = not mgs and w_step != "local" and not palm
    q2_first = q2_schedule(1, local_iter_v, q_hat)
    common = dict(
        init_server=partial(init_server, n_features=n_features, n_clusters=n_clusters,
                            amplitude=amplitude, centers=centers, box=box, rho=rho,
                            q2_first=q2_first, weights=weights),
        init_client=partial(init_client, amplitude=amplitude, from_centers=centers is not None,
                            onehot=onehot,
                            upload="grams" if mgs else ("gram" if prepared else None)),
        client_metrics=client_metrics,
        combine_metrics=partial(combine_metrics, n_total=n_total, nu=nu),
        after_round=partial(sncp_after_round, tol=tol, schedule=schedule, nu=nu),
        progress_keys=("objective", "rho", "rel_change"),
    )
    if mgs:
        return FederatedProtocol(
            **common,
            server_init_uploads=partial(init_uploads, n_clients=n_clients, q2=q2_first),
            client_update=partial(mgs_round.client_update,
                                  local_phase=partial(h_phase, **h_params), share=aggregates),
            server_update=partial(mgs_server_update, n_total=n_total, d_factor=d_factor,
                                  q2=q2_first, box=box),
            summable=SummableUploads(
                client=partial(mgs_summands, n_total=n_total),
                server_update=partial(mgs_secure_update, d_factor=d_factor, q2=q2_first,
                                      box=box),
                cumulative=True,
                init_client=partial(_init_summands, n_total=n_total),
                server_init=partial(mgs_secure_init, n_clients=n_clients, q2=q2_first)),
        )
    return FederatedProtocol(
        **common,
        server_init_uploads=(partial(init_uploads, n_clients=n_clients, q2=q2_first)
                             if prepared else None),
        **round_phases(
            participation=participation, prepared=prepared,
            local_phase=partial(h_round, h_params=h_params),
            w_phase=partial(mavg_w_phase, d_factor=d_factor, w_step=w_step),
            keep=without_round, gram=membership_gram,
            server_prepare=partial(mavg_server_prepare, n_total=n_total, d_factor=d_factor),
            server_update=partial(mavg_server_update, weights=weights, aggregation=aggregation,
                                  local_iter_v=local_iter_v, q_hat=q_hat, box=box),
            palm=dict(n_pairs=local_iter_u, factor="A", shared="W", finish=palm_state,
                      local_step=partial(palm_h_step, n_total=n_total, nu=nu,
                                         c_factor=c_factor),
                      proximal_step=partial(palm_w_step, d_factor=d_factor, box=box))
            if palm else None,
            # secure aggregation: the mean as a ratio of two sums (w_p W_p and w_p); the
            # prepare phase's Grams (w_step "global", "guarded") are not summed securely
            aggregation=aggregation,
            secure_update=partial(mavg_from_mean, local_iter_v=local_iter_v, q_hat=q_hat,
                                  box=box)),
    )


def _init_summands(upload, broadcast, *, n_total):
    return mgs_summands(upload, n_total=n_total)


# ---- SNCP: the penalty schedule between rounds (Section V-F) -------------------------------
def sncp_rho(rho, rel_change, round_number, *, rho_tol, growth, force_every, rho_max):
    """Next ``rho``: times ``growth`` when the objective stalls (``rel_change < rho_tol``) or
    every ``force_every`` rounds (the reference code's forced increase), capped at ``rho_max``."""
    forced = bool(force_every) and round_number % force_every == 0
    return min(rho * growth, rho_max) if rel_change < rho_tol or forced else rho


def sncp_after_round(server_state, broadcast, record, *, tol, schedule, nu):
    """The engine's ``after_round``: ``epsilon_s``, the stop test, and the raise of ``rho``.

    ``epsilon_s = |F_s - F_{s-1}| / F_{s-1}`` with ``F_s = F(W^{s+1}, H^s)`` evaluated centrally
    (after aggregation), recorded as ``rel_change``; after a raise of ``rho`` the previous value
    is re-based on the new ``rho`` (kept in the server state as ``F_prev``). Stops when
    ``epsilon_s < tol``.
    """
    F, F_prev = record["objective"], server_state["F_prev"]
    record["rel_change"] = eps = abs(F - F_prev) / max(abs(F_prev), EPS)
    if eps < tol:
        return server_state, broadcast, True
    if schedule is not None:
        rho = sncp_rho(record["rho"], eps, record["round"], **schedule)
        if rho != record["rho"]:
            server_state = {**server_state, "rho": rho}
            broadcast = {**broadcast, "rho": rho}
            F = record["fit"] + 0.5 * rho * record["penalty"] + 0.5 * nu * record["h_sq"]
    return {**server_state, "F_prev": F}, broadcast, False


def start_rounds(protocol, state, blocks, n_jobs=None):
    """Record ``F_prev``, the objective at the initial state, in the server state: the first
    round's ``rel_change`` is measured from it."""
    F0 = evaluate(protocol, state, blocks, n_jobs)["objective"]
    state.server_state = {**state.server_state, "F_prev": F0}
    return state


# ---- federated seeding (k-FED) ----------------------------------------------------------------
# scikit-learn's Lloyd iterations split the samples into chunks of this many over its OpenMP
# threads: on one chunk one thread does the work, and the others only wait at the barriers of
# its other loops (measured on small data, 2 threads on a busy two-core machine: 20x the wall
# time and the CPU time of one thread).
_KMEANS_CHUNK = 256


def _fit_kmeans(model, X, sample_weight=None):
    """``model.fit(X)``, on one OpenMP thread when ``X`` is one chunk (``_KMEANS_CHUNK``)."""
    if X.shape[0] > _KMEANS_CHUNK:
        return model.fit(X, sample_weight=sample_weight)
    with one_thread("openmp"):
        return model.fit(X, sample_weight=sample_weight)


def local_centers(X, n_centers, seed):
    """k-FED's client step: k-means on the client's own samples (at most ``n_centers``
    centers). Sends the centers and their sizes: aggregates, never a sample."""
    from sklearn.cluster import KMeans  # (a local, centralized computation on own data)

    k = min(n_centers, X.shape[0])
    model = _fit_kmeans(KMeans(k, n_init=1, random_state=seed), X)
    return model.cluster_centers_, np.bincount(model.labels_, minlength=k).astype(float)


def kfed_centers(blocks, n_clusters, seed):
    """One-shot federated seeding (k-FED; Dennis, Li and Smith, "Heterogeneity for the win:
    one-shot federated clustering", ICML 2021).

    Every client runs k-means on its own samples and sends its ``K`` centers with their
    sizes; the server clusters the union of the centers (weighted by size) with k-means++
    and Lloyd's iterations. Under label skew each client holds few clusters, so its local
    centers sit on the true ones and the union separates well. Returns the initial centers
    ``(K, n_features)`` and the bytes uploaded.
    """
    from sklearn.cluster import KMeans

    seeds = np.random.SeedSequence(seed).generate_state(len(blocks) + 1)
    local = [local_centers(b.X, n_clusters, int(s)) for b, s in zip(blocks, seeds)]
    centers = np.vstack([c for c, _ in local])
    sizes = np.concatenate([w for _, w in local])
    server = KMeans(n_clusters, n_init=10, random_state=int(seeds[-1]))
    _fit_kmeans(server, centers, sample_weight=sizes)
    return server.cluster_centers_, int(centers.nbytes + sizes.nbytes)
