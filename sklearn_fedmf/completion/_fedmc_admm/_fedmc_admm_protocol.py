"""FedMC-ADMM's pure protocol functions (:class:`~sklearn_fedmf.FedMCADMM`, the model and the
objective in :mod:`._fedmc_admm`): the client and server steps, the metrics, the ``"auto"``
rules and ``make_protocol``, which binds them into the engine's
:class:`~sklearn_fedmf.engine._federation.FederatedProtocol`.

Item-side arrays are kept transposed (``Vt``, ``Wt``, ``Yt`` of shape ``(n_items, r)``) so that
the kernels read an item's factor contiguously; uploads and the broadcast use that layout.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import scipy.sparse as sp

from ... import _biases
from ..._kernels import grad_cols, prox_grad_rows
from ..._prox import elastic_net_value, item_counts, prox_elastic_net, row_alpha
from ...engine._federation import Broadcast, FederatedProtocol, SummableUploads
from .._auto_strengths import start_item_biases, start_user_biases
from .._base import factor_metrics
from ._fedmc_admm_batched import (
    FactorHistory,
    LazyFactor,
    make_batched,
    server_init_lazy,
    server_update_lazy,
    unpack_broadcast,
)
from ._fedmc_admm_implicit import (
    implicit_client_metrics,
    implicit_client_update,
    implicit_dual_start,
)
from ._fedmc_admm_kernels import linearized_cols, replace_and_accumulate, squared_distance

# floor of L_W and L_U (Algorithm 1's steps): avoids 0/0 once l1 zeroes a factor
EPS_LIPSCHITZ = 1e-8

AUTO_BETA = 1.0  # beta="auto" = AUTO_BETA * initial_curvature(...), measured (bench_beta.py)
# alpha_v="auto": its strength per rating at the mean item (_auto_strengths' rule), measured:
# the shared 2.0 leaves the factor part near the biases-only model on synthetic low-rank
# ratings (test_fedmc_admm_auto_beta: 1.045 against the biases' 1.067), 0.3 recovers it
# (0.916) while shrinking FedMAvg's site-like losses (docs/guide/defaults.rst)
AUTO_ITEM_ADMM = 0.3
RESUM_EVERY = 20  # rounds between exact sums of the server's aggregate


def initial_curvature(n_ratings, n_items, n_clients, n_components, init_scale, biased):
    """``b0``: the W step's curvature at a rated item column of a client, at the start.

    Column ``j`` of (P-15)'s ``(1/p) f_i`` has curvature ``(1/p) lambda_max(sum_t u_t u_t^T)
    <= (1/p) sum_t ||u_t||^2`` over the client's ``k`` raters of ``j``. With the ratings
    spread evenly, ``k`` is Poisson with mean ``lambda = ratings / (items p)``, so a rated
    column has ``E[k | k >= 1] = lambda / (1 - exp(-lambda))`` raters; a row of
    ``U_i^0 = init_scale * Uniform[0, 1)`` has ``E||u_t^0||^2 = r init_scale^2 / 3`` (plus 1
    for the fixed ones column with biases, whose ``b_u`` starts at 0).
    """
    lam = n_ratings / (n_items * n_clients)
    raters = lam / -np.expm1(-lam) if lam > 0 else 1.0
    row = n_components * init_scale**2 / 3 + (1.0 if biased else 0.0)
    return raters * row / n_clients


# ---- pure solver functions ------------------------------------------------------------------
def ratings_dual_start(X, U, Vt, n_clients):
    """``Y_i^0 = -(1/p) grad_V f_i(U_i^0, V^0)`` on the ratings (``dual_init="paper"``)."""
    Yt = np.empty_like(Vt)
    grad_cols(X.indptr, X.indices, X.data, U, Vt, Yt)
    Yt /= -n_clients
    return Yt


def init_server(rng, *, n_items, n_components, init_scale, biased=False, item_bias=None):
    """``V^0`` of rank ``n_components`` (:func:`~sklearn_fedmf._biases.random_item_factor`;
    ``item_bias``: ``[V^0; 1; b_i^0]``, the ``"auto"`` start of :mod:`._auto_strengths`)."""
    Vt = _biases.random_item_factor(rng, n_items, n_components, init_scale, biased)
    if biased:
        start_item_biases(Vt, item_bias)
    return {"Vt": Vt, "Z": None}, Vt


def init_client(block, Vt, rng, *, n_clients, init_scale, dual_init, positive, biased=False,
                weighted=False, confidence=None, user_shrinkage=None,
                dual_start=ratings_dual_start):
    """Private ``U_i^0``, ``W_i^0 = V^0`` and ``Y_i^0 = -(1/p) grad_V f_i(U_i^0, V^0)``
    (``dual_start``: the loss's; ``confidence``: :func:`implicit_dual_start` at it, the
    entry of the tests written against dense references).

    Returns the client state and its one-time upload ``Y_i^0`` (eq. (16) needs every client's
    ``(W_i, Y_i)``, never-sampled
    ones included, and Algorithm 1 describes no initial upload of ``Y_i^0``); with the
    weighted regularization also its ratings per item, once (``R(V)`` needs their sum).
    """
    dtype = block.X.dtype  # float32 data: the client computes in float32
    Vt = Vt.astype(dtype, copy=False)
    U = (init_scale * rng.random((block.n_rows, Vt.shape[1]))).astype(dtype, copy=False)
    if positive:
        U = np.maximum(U, 0.0)
    if biased:  # (user_shrinkage: b_u starts at its shrunk mean, the "auto" start)
        start_user_biases(_biases.init_user(U), block.X, Vt, user_shrinkage)
    if confidence is not None:  # (the tests' entry; a fit binds dual_start)
        dual_start = partial(implicit_dual_start, confidence=confidence)
    if dual_init == "paper":
        Yt = dual_start(block.X, U, Vt, n_clients)
    else:
        Yt = np.zeros_like(Vt)
    upload = {"Y": Yt}
    if weighted:
        upload["counts"] = item_counts(block.X)
    return {"U": U, "Wt": Vt.copy(), "Yt": Yt}, upload


def server_init_uploads(server_state, uploads, *, beta, n_clients):
    """Store ``Z_i = W_i^0 + Y_i^0 / beta`` for every client (``W_i^0 = V^0``).

    Uploads of the batched phases (:mod:`._fedmc_admm_batched`) keep their lazy form: the
    server then holds the same sum in ``O(ratings + rounds n r)`` instead of ``O(p n r)``.
    """
    first = next(iter(uploads.values()))["Y"]
    Vt = server_state["Vt"].astype(first.dtype, copy=False)
    if isinstance(first, LazyFactor):
        return server_init_lazy(Vt, uploads, beta=beta, n_clients=n_clients)
    Z = np.repeat(Vt[None], n_clients, axis=0)
    for i, upload in uploads.items():
        Z[i] += upload["Y"] / beta
    state = {"Vt": Vt, "Z": Z}
    if "counts" in uploads[0]:
        state["counts"] = sum(upload["counts"] for upload in uploads.values())
    return state, Vt


def _check_block(X, A, B):
    """The compiled kernels do not check bounds: ``X`` must be ``(len(A), len(B))``."""
    if X.shape != (A.shape[0], B.shape[0]):
        raise ValueError(f"Block of shape {X.shape} does not match factors {A.shape}, {B.shape}.")


def u_loop(U, Wt, X, n_steps, alpha_u, l1_ratio, positive):
    """``n_steps`` proximal-gradient steps (P-14) on ``U`` against the client's own ``W_i``.

    ``U <- prox_{R_i / L_W}(U - grad_U f_i(U, W_i) / L_W)`` with ``L_W = ||W_i W_i^T||_F``.
    """
    _check_block(X, U, Wt)
    L_W = max(np.linalg.norm(Wt.T @ Wt), EPS_LIPSCHITZ)
    step = 1.0 / L_W
    out = np.empty_like(U)
    prox_grad_rows(X.indptr, X.indices, X.data, U, Wt, L_W, n_steps,
                   step * alpha_u * l1_ratio, 1.0 + step * alpha_u * (1.0 - l1_ratio),
                   positive, 0.0, out)
    return out


def w_loop_linearized(U, Wt, Vt, Yt, Xt, n_steps, beta, n_clients):
    """``n_steps`` linearized W steps (P-15), started at the client's stored ``W_i``.

    ``W <- ((L_U/p) W + beta V - grad_V f_i(U, W)/p - Y) / (L_U/p + beta)``; ``Xt`` is the
    client's block transposed. Also returns the last step's starting point and ``L_U`` (for
    the Lemma 4.5 identity).
    """
    _check_block(Xt, Wt, U)
    L_U = max(np.linalg.norm(U.T @ U), EPS_LIPSCHITZ)
    Wt = np.ascontiguousarray(Wt)  # the kernel's flat passes need C order (a no-op here)
    out, out_prev = np.empty_like(Wt), np.empty_like(Wt)
    linearized_cols(Xt.indptr, Xt.indices, Xt.data, U, Wt,
                    np.ascontiguousarray(beta * Vt - Yt), L_U / n_clients, beta, n_clients,
                    n_steps, out, out_prev)
    return out, out_prev, L_U


def w_exact(U, Vt, Yt, X, beta, n_clients):
    """Remark 4.1: the exact W minimizer, one ``r x r`` solve per item column.

    ``(G_j / p + beta I) w_j = (U^T P(M) / p + beta V - Y)_j`` with
    ``G_j = sum_{t observed in column j} u_t u_t^T``; an unobserved column gives ``v_j - y_j/beta``.
    """
    r = U.shape[1]
    pattern = sp.csr_matrix((np.ones(X.nnz), X.indices, X.indptr), shape=X.shape)
    outer = (U[:, :, None] * U[:, None, :]).reshape(U.shape[0], r * r)
    gram = np.asarray(pattern.T @ outer).reshape(-1, r, r) / n_clients
    gram += beta * np.eye(r)
    rhs = np.asarray(X.T @ U) / n_clients + beta * Vt - Yt
    return np.linalg.solve(gram, rhs[:, :, None])[:, :, 0]


def u_loop_biased(U, Wt, X, n_steps, alpha_u, l1_ratio):
    """:func:`u_loop` on ``U_aug = [U, b_u, 1]``: ``R_i`` holds the indicator of the last
    column, whose prox sets it to 1; substituting it is exact (``_biases``), so the loop runs
    on the free columns ``[U, b_u]`` against ``[W, 1]`` with the ratings minus ``b_i``."""
    X_view, Wt_free = _biases.user_step_view(X, Wt)
    free = u_loop(_biases.free_user(U), Wt_free, X_view, n_steps, alpha_u, l1_ratio, False)
    return _biases.with_user(free)


def client_update(state, block, Vt, rng, selected, *, n_clients, beta, local_iter, alpha_u,
                  l1_ratio, positive, w_update, biased=False, weighted=False, confidence=None):
    """One active round of client ``i`` under either loss: :func:`ratings_client_update`, or
    with ``confidence`` :func:`~._fedmc_admm_implicit.implicit_client_update` (the entry of
    the tests written against dense references; a fit's protocol binds its loss's)."""
    if confidence is not None:
        return implicit_client_update(
            state, block, Vt, rng, selected, n_clients=n_clients, beta=beta,
            local_iter=local_iter, alpha_u=alpha_u, l1_ratio=l1_ratio, positive=positive,
            w_update=w_update, eps=EPS_LIPSCHITZ, weighted=weighted, confidence=confidence)
    return ratings_client_update(state, block, Vt, rng, selected, n_clients=n_clients,
                                 beta=beta, local_iter=local_iter, alpha_u=alpha_u,
                                 l1_ratio=l1_ratio, positive=positive, w_update=w_update,
                                 biased=biased, weighted=weighted)


def ratings_client_update(state, block, Vt, rng, selected, *, n_clients, beta, local_iter,
                          alpha_u, l1_ratio, positive, w_update, biased=False, weighted=False):
    """One active round of client ``i`` (Algorithm 1, step 3); uploads ``(W_i, Y_i)``.

    With biases ``W_i`` is the unconstrained copy of ``[V; 1; b_i]`` (only ``R(V)`` holds
    the indicator), so the W loop and the dual step are unchanged. Weighted regularization:
    ``R_i`` scales each row's strength by its ratings; its prox stays a per-row shrink."""
    Vt = unpack_broadcast(Vt)[0]
    X = block.X
    alpha_u = row_alpha(alpha_u, X, weighted)
    if biased:
        U = u_loop_biased(state["U"], state["Wt"], X, local_iter, alpha_u, l1_ratio)
    else:
        U = u_loop(state["U"], state["Wt"], X, local_iter, alpha_u, l1_ratio, positive)
    if w_update == "linearized":
        Wt = w_loop_linearized(U, state["Wt"], Vt, state["Yt"], block.Xt, local_iter, beta,
                               n_clients)[0]
    else:
        Wt = w_exact(U, Vt, state["Yt"], X, beta, n_clients)
    Yt = state["Yt"] + beta * (Wt - Vt)  # dual step with the OLD global V^k (Lemma 4.5)
    return {"U": U, "Wt": Wt, "Yt": Yt}, {"W": Wt, "Y": Yt}


def server_update(server_state, uploads, round_index, *, beta, n_clients, alpha_v, l1_ratio,
                  positive, biased=False):
    """(P-16): ``V = prox_{R/(p beta)}((1/p) sum_i (W_i + Y_i / beta))`` over ALL clients.

    Non-sampled clients enter with the ``Z_i`` they last sent. Weighted regularization
    (``server_state`` holds the item counts ``n_j``): ``R(V) = (1/p) sum_j alpha_v n_j/2
    ||v_j||^2``, inside the ``1/p`` like the data it weighs, so ``alpha_v`` is a per-rating
    strength as ``alpha_u`` is; its prox shrinks each row by its own factor. ``Z`` and its
    running sum are updated in place: the server owns them and they are far too large to copy
    every round. The sum takes the sampled clients' changes (``O(|S| n r)`` instead of
    re-reading all ``p`` copies) and is recomputed exactly every ``RESUM_EVERY`` rounds, which
    bounds the rounding drift. Both orders are fixed: the result does not depend on ``n_jobs``.
    """
    if server_state.get("history") is not None:  # lazy client copies (_fedmc_admm_batched)
        total = server_update_lazy(server_state, uploads, round_index, beta=beta,
                                       resum_every=RESUM_EVERY)
        Vt = _server_prox(total.astype(server_state["Vt"].dtype, copy=False), None, beta=beta,
                          n_clients=n_clients, alpha_v=alpha_v, l1_ratio=l1_ratio,
                          positive=positive, biased=biased)
        history = server_state["history"]
        index = history.append(Vt)
        return dict(server_state, Vt=Vt), Broadcast(Vt, (history, index))
    Z, total = server_state["Z"], server_state.get("Z_sum")
    exact = total is None or round_index % RESUM_EVERY == 0
    for i, upload in uploads.items():
        W, Y = np.ascontiguousarray(upload["W"]), np.ascontiguousarray(upload["Y"])
        if exact:
            np.add(W, Y / beta, out=Z[i])
        else:
            replace_and_accumulate(Z[i], total, W, Y, beta)
    if exact:
        total = Z.sum(axis=0)
    Vt = _server_prox(total, server_state.get("counts"), beta=beta, n_clients=n_clients,
                      alpha_v=alpha_v, l1_ratio=l1_ratio, positive=positive, biased=biased)
    return {**server_state, "Vt": Vt, "Z": Z, "Z_sum": total}, Vt


# ---- secure aggregation: (P-16) from the running sum of Z_i ------------------------------------
# The server needs sum_i Z_i over ALL clients, Z_i = W_i + Y_i / beta as each client last sent
# it: a cumulative exchange (sklearn_fedmf.secure._rounds), whose clients send the change of
# their encoded Z_i and whose server keeps the running sum. Z is beta W_i + Y_i over beta.
def secure_init_summands(upload, broadcast, *, beta):
    """A client's ``Z_i^0 = V^0 + Y_i^0 / beta`` (``W_i^0 = V^0``, the broadcast)."""
    Vt = np.asarray(unpack_broadcast(broadcast)[0], dtype=np.float64)
    return {"Z": Vt + np.asarray(upload["Y"], dtype=np.float64) / beta}


def secure_summands(upload, weight, *, beta):
    """A client's ``Z_i = W_i + Y_i / beta`` after its round (the exchange sends its change)."""
    return {"Z": np.asarray(upload["W"], dtype=np.float64)
            + np.asarray(upload["Y"], dtype=np.float64) / beta}


def secure_server_init(server_state, sums, n_summed, *, n_clients):
    """``sum_i Z_i^0`` from the secure sum; the broadcast ``V^0`` with the history of
    broadcasts the batched phases read (public: the server's own messages)."""
    if n_summed != n_clients:
        raise ValueError(f"FedMC-ADMM needs Z_i^0 of all {n_clients} clients, got {n_summed}.")
    Vt = server_state["Vt"]
    history = FactorHistory(Vt)
    return {"Vt": Vt, "Z_sum": sums["Z"], "history_only": history}, Broadcast(Vt, (history, 0))


def secure_server_update(server_state, sums, n_summed, round_index, *, beta, n_clients,
                         alpha_v, l1_ratio, positive, biased=False):
    """(P-16) at the running ``sum_i Z_i`` (all clients, stale ones included)."""
    total = sums["Z"].astype(server_state["Vt"].dtype, copy=False)
    Vt = _server_prox(total, None, beta=beta, n_clients=n_clients, alpha_v=alpha_v,
                      l1_ratio=l1_ratio, positive=positive, biased=biased)
    history = server_state["history_only"]
    index = history.append(Vt)
    return {**server_state, "Vt": Vt, "Z_sum": sums["Z"]}, Broadcast(Vt, (history, index))


def _server_prox(total, counts, *, beta, n_clients, alpha_v, l1_ratio, positive, biased):
    """(P-16)'s prox at ``A = total / p`` (``counts``: the items' ratings, weighted
    regularization)."""
    if counts is not None:
        alpha_v = (alpha_v * counts / n_clients).astype(total.dtype)[:, None]
    Vt = prox_elastic_net(total / n_clients, 1.0 / (n_clients * beta), alpha_v, l1_ratio,
                          positive)
    if biased:  # R(V) is separable: the fixed row's prox is the projection onto 1
        _biases.fix_item(Vt)
    return Vt


def client_metrics(state, block, Vt, *, alpha_u, l1_ratio, biased=False, alpha_v=0.0,
                   weighted=False):
    """Additive diagnostics of one client at the global ``V`` (not its local copy; weighted
    regularization: with its share ``alpha_v/2 sum_j n_ji ||v_j||^2`` of ``p R(V)``)."""
    Vt = unpack_broadcast(Vt)[0]
    return {**factor_metrics(state["U"], Vt, block, alpha_u=alpha_u, l1_ratio=l1_ratio,
                             biased=biased, alpha_v=alpha_v, weighted=weighted),
            "consensus": squared_distance(state["Wt"], Vt)}


def combine_metrics(server_state, sums, *, n_clients, alpha_v, l1_ratio, biased=False,
                    weighted=False):
    """The objective ``F(U^k, V^k)`` (the objective (1)-(2) the paper reports), train/eval RMSE
    and the consensus gap. (The indicators are 0 at the iterates; the fixed entries are not
    penalized.)"""
    Vt = _biases.free_item(server_state["Vt"]) if biased else server_state["Vt"]
    record = {
        "objective": sums["loss"] / n_clients
        + (0.0 if weighted else elastic_net_value(Vt, alpha_v, l1_ratio)),
        "train_rmse": float(np.sqrt(sums["sse"] / max(sums["n"], 1))),
        "consensus_gap": sums["consensus"],
    }
    if sums["n_eval"]:
        record["eval_rmse"] = float(np.sqrt(sums["sse_eval"] / sums["n_eval"]))
    return record


def _bind(*, n_items, n_clients, n_components, beta, local_iter, alpha_u, alpha_v, l1_ratio,
          positive, w_update, init_scale, dual_init, biased, weighted, item_bias,
          user_shrinkage):
    """The hyperparameters as Python floats (a numpy float64 scalar, e.g. from a GridSearchCV
    grid, would promote float32 arrays to float64 in every product) and the phases both
    losses share."""
    beta, alpha_u, alpha_v, l1_ratio, init_scale = (
        float(v) for v in (beta, alpha_u, alpha_v, l1_ratio, init_scale))
    reg_v = dict(alpha_v=alpha_v, l1_ratio=l1_ratio, biased=biased)
    shared = dict(
        init_server=partial(init_server, n_items=n_items, n_components=n_components,
                            init_scale=init_scale, biased=biased, item_bias=item_bias),
        server_init_uploads=partial(server_init_uploads, beta=beta, n_clients=n_clients),
        server_update=partial(server_update, beta=beta, n_clients=n_clients, positive=positive,
                              **reg_v),
        combine_metrics=partial(combine_metrics, n_clients=n_clients, weighted=weighted,
                                **reg_v))
    init = dict(n_clients=n_clients, init_scale=init_scale, dual_init=dual_init,
                positive=positive, biased=biased, weighted=weighted,
                user_shrinkage=user_shrinkage)
    update = dict(n_clients=n_clients, beta=beta, local_iter=local_iter, alpha_u=alpha_u,
                  l1_ratio=l1_ratio, positive=positive, w_update=w_update, weighted=weighted)
    return shared, init, update, dict(alpha_u=alpha_u, l1_ratio=l1_ratio, alpha_v=alpha_v,
                                      weighted=weighted), reg_v


def make_implicit_protocol(*, n_items, n_clients, n_components, beta, local_iter, alpha_u,
                           alpha_v, l1_ratio, positive, w_update, init_scale, dual_init,
                           confidence, weighted=False):
    """FedMC-ADMM's protocol under ``loss="implicit"`` with confidence scale ``confidence``
    (the client phases of :mod:`._fedmc_admm_implicit`; no biases, one block per client, not
    summable: its steps are not written as sums yet)."""
    confidence = float(confidence)
    shared, init, update, metrics, _ = _bind(
        n_items=n_items, n_clients=n_clients, n_components=n_components, beta=beta,
        local_iter=local_iter, alpha_u=alpha_u, alpha_v=alpha_v, l1_ratio=l1_ratio,
        positive=positive, w_update=w_update, init_scale=init_scale, dual_init=dual_init,
        biased=False, weighted=weighted, item_bias=None, user_shrinkage=None)
    return FederatedProtocol(
        **shared,
        init_client=partial(init_client, **init,
                            dual_start=partial(implicit_dual_start, confidence=confidence)),
        client_update=partial(implicit_client_update, **update, eps=EPS_LIPSCHITZ,
                              confidence=confidence),
        client_metrics=partial(implicit_client_metrics, **metrics, confidence=confidence),
        summable=None, batched=None)


def make_protocol(*, n_items, n_clients, n_components, beta, local_iter, alpha_u, alpha_v,
                  l1_ratio, positive, w_update, init_scale, dual_init, biased=False,
                  weighted=False, item_bias=None, user_shrinkage=None, cache_rows=True):
    """Bind the hyperparameters to the pure functions above (``biased``: the factors are
    the augmented ``[U, b_u, 1]`` and ``[V; 1; b_i]`` of rank ``n_components + 2``;
    ``item_bias``, ``user_shrinkage``: the biases' ``"auto"`` start, :mod:`._auto_strengths`;
    ``cache_rows``: the batched phases' states hold their combinations' values on the rated
    rows, :mod:`._fedmc_admm_batched`)."""
    shared, init, update, metrics, reg_v = _bind(
        n_items=n_items, n_clients=n_clients, n_components=n_components, beta=beta,
        local_iter=local_iter, alpha_u=alpha_u, alpha_v=alpha_v, l1_ratio=l1_ratio,
        positive=positive, w_update=w_update, init_scale=init_scale, dual_init=dual_init,
        biased=biased, weighted=weighted, item_bias=item_bias, user_shrinkage=user_shrinkage)
    beta = update["beta"]  # (as a Python float)
    return FederatedProtocol(
        **shared,
        init_client=partial(init_client, **init),
        client_update=partial(ratings_client_update, **update, biased=biased),
        client_metrics=partial(client_metrics, **metrics, biased=biased),
        # (the weighted regularization's item counts are sent once per client: not summable)
        summable=None if weighted else SummableUploads(
            client=partial(secure_summands, beta=beta),
            server_update=partial(secure_server_update, beta=beta, n_clients=n_clients,
                                  positive=positive, **reg_v),
            cumulative=True,
            init_client=partial(secure_init_summands, beta=beta),
            server_init=partial(secure_server_init, n_clients=n_clients)),
        # the batched phases run the plain regularization (weighted: one block per client;
        # _fedmc_admm_batched says why)
        batched=None if weighted else make_batched(
            n_clients=n_clients, init_scale=init["init_scale"], dual_init=dual_init,
            positive=positive, biased=biased, beta=beta, local_iter=local_iter,
            alpha_u=update["alpha_u"], l1_ratio=update["l1_ratio"], w_update=w_update,
            eps=EPS_LIPSCHITZ, user_shrinkage=user_shrinkage, cache_rows=cache_rows),
    )
