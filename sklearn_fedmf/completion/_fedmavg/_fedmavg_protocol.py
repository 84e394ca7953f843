"""FedMAvg's pure functions for matrix completion (Wang & Chang, Algorithm 1): the local
steps, the phases' family parts and the server's average; the round that runs them is
:mod:`sklearn_fedmf.completion._fedmavg._fedmavg_round` (shared with clustering), the binding of
both into a protocol is :func:`~sklearn_fedmf.completion._fedmavg._fedmavg.make_protocol`.

Orientation: the paper's (its model (1)-(3) splits the data by columns) global ``W`` is our
item factor
(``components_ = V``, kept transposed as ``Vt`` of shape ``(n_items, r)``); the paper's local
``H_p`` is client ``p``'s user factors ``U_p^T``.

``variant="wang_chang"`` (the paper's Algorithm 1 on a masked loss) minimizes the plain sum of
squared errors::

    F(U, V) = sum_p [1/2 ||P_Omega_p(M_p - U_p V)||^2 + h(U_p)] + h(V) = sum_p omega_p F_p
    F_p = (1/omega_p) [1/2 ||P_Omega_p(M_p - U_p V)||^2 + h(U_p)] + h(V)

with ``omega_p = |Omega_p| / |Omega|`` (``client_weights="entries"``: the paper's ``N_p / N``
assumes dense data) or ``n_p / n``. Every step is a factor times a Lipschitz bound (Section
V-A's factors, with the true constants), so the loss scaling only weighs the regularizers.
``variant="fedpalm"`` is Remark 1's FedPALM (15)-(16), the baseline of the paper's Fig. 2b:
from ``W_p = V^s`` each client interleaves ``local_iter_u`` pairs of one step on ``U_p`` at its
current ``W_p`` and one proximal (projected) step on ``W_p`` at the new ``U_p``, then FedMAvg's
averaging. ``variant="fedmc_admm"`` is the baseline exactly as restated in the FedMC-ADMM paper (its
Section 5.2): no 1/p in the U step, the data gradient of the W step divided by
``p``, ``d_i = 5 lambda_max(U_i^T U_i)``, ``c = 1/2 lambda_max(V V^T)``, ``Q1 = Q2 = 10``.

Rounds (Algorithm 1): every client (``participation="pcc"``) or only the sampled ones (``"pcp"``)
take ``Q1`` proximal-gradient steps on ``U_p`` against the broadcast ``V``; each sampled
client then takes ``Q2`` gradient steps on its own copy ``W_p`` of ``V``, started at ``V``,
and uploads ``W_p``; the server averages the uploads. With ``w_step="global"`` the W step
size needs every client's ``U_p^T U_p`` of this round: clients send that ``r x r`` Gram in a
first exchange (the engine's prepare phase) and the server answers with the step.

Sampling: ``sampling="weighted"`` is the paper's (Algorithm 1): ``clients_per_round`` draws
with replacement, proportionally to ``omega``, and the plain mean of the multiset,
``W = sum_p (n_p / m) W_p`` with ``n_p`` the draws of client ``p`` (9)-(10), unbiased for
``sum_p omega_p W_p``; a client drawn twice computes and uploads once. ``"uniform"`` draws
distinct clients without replacement; then ``aggregation="weighted"`` averages the uploads
with weights ``omega_p`` (renormalized over the senders: eq. (8) at full participation, a
ratio estimate otherwise) and ``"sampled_mean"`` takes the plain mean (the FedMC-ADMM
restatement). On balanced clients the schemes coincide.

Many small clients (one per user): ``_fedmavg_batched`` gives the protocol batched phases
(``FederatedProtocol.batched``) that run a whole group of clients per compiled call and send
``W_p`` as its rated rows plus the ridge-shrunk broadcast (FedPALM and the weighted
regularization run client by client).
"""

from __future__ import annotations

import numpy as np

from ... import _biases
from ..._kernels import grad_cols, prox_grad_rows
from ..._prox import elastic_net_value, item_counts, prox_elastic_net, row_alpha
from .._auto_strengths import start_item_biases, start_user_biases
from .._base import factor_metrics
from ._fedmavg_round import average_uploads, q2_schedule, store_grams, w_step_size

EPS_LIPSCHITZ = 1e-12  # floor of every Lipschitz bound: a zero factor must not give 0/0
# floor of a bias strength relative to the factors' (a zero shrinkage would scale b_u's
# column without bound)
MIN_BIAS_ALPHA = 1e-6


# ---- pure solver functions ------------------------------------------------------------------
def lambda_max(S):
    """Largest eigenvalue of a symmetric matrix (0 for an empty one)."""
    return float(np.linalg.eigvalsh(S)[-1]) if S.size else 0.0


def prox_nonsmooth(Z, t, alpha, l1_ratio, positive):
    """Prox of the l1 part of the elastic net and of the sign constraint (the l2 part is
    smooth and taken in the gradient)."""
    if not np.any(alpha * l1_ratio) and not positive:
        return Z
    return prox_elastic_net(Z, t, alpha * l1_ratio, 1.0, positive)


def _per_row(a):
    """A per-row array as a column (it then broadcasts against per-entry steps)."""
    return a[:, None] if np.ndim(a) == 1 else a


def u_steps(U, Vt, X, n_steps, c, alpha, l1_ratio, positive):
    """``n_steps`` proximal-gradient steps of size ``1/c`` on ``U`` with ``V`` fixed (11).

    The ridge part of the regularizer is in the gradient, the l1 part and the sign constraint
    in the prox (:func:`prox_nonsmooth`); the fused kernel runs each row's steps at once.
    """
    out = np.empty(U.shape)
    prox_grad_rows(X.indptr, X.indices, X.data, np.ascontiguousarray(U),
                   np.ascontiguousarray(Vt), c, n_steps,
                   _per_row(alpha) * l1_ratio / _per_row(c), 1.0, positive,
                   alpha * (1.0 - l1_ratio), out)
    return out


def w_steps(Wt, U, X, n_steps, d, scale, alpha, l1_ratio, positive):
    """``n_steps`` gradient steps (13) on a local copy of ``V``: gradient
    ``scale * grad_V 1/2||P(M - U W)||^2 + ridge * W``. Unprojected unless the regularizer has a
    nonsmooth part, which is then applied as a prox at every step. ``alpha`` may be a column,
    one strength per item row (weighted regularization)."""
    G = np.empty_like(Wt)
    ridge = alpha * (1.0 - l1_ratio)
    for _ in range(n_steps):
        grad_cols(X.indptr, X.indices, X.data, U, Wt, G)
        Wt = prox_nonsmooth(Wt - (scale * G + ridge * Wt) / d, 1.0 / d, alpha, l1_ratio, positive)
    return Wt


def client_weight(block, client_weights):
    return block.nnz if client_weights == "entries" else block.n_rows


def init_server(rng, *, n_items, n_components, init_scale, biased=False, item_bias=None):
    """``V^0`` of rank ``n_components`` (:func:`~sklearn_fedmf._biases.random_item_factor`;
    ``item_bias``: ``[V^0; 1; b_i^0]``, the ``"auto"`` start of :mod:`._auto_strengths`)."""
    Vt = _biases.random_item_factor(rng, n_items, n_components, init_scale, biased)
    if biased:
        start_item_biases(Vt, item_bias)
    return {"Vt": Vt}, {"Vt": Vt}


def init_user_factors(block, n_factors, rng, init_scale, positive, biased):
    """Private ``U_p^0`` (``[U_p^0, 0, 1]`` with biases)."""
    return random_user_factors(block.n_rows, n_factors, rng, init_scale, positive, biased)


def random_user_factors(n_rows, n_factors, rng, init_scale, positive, biased):
    """``n_rows`` rows of i.i.d. ``init_scale * Uniform[0, 1)`` factors (biases as above)."""
    U = init_scale * rng.random((n_rows, n_factors))
    if positive:
        U = np.maximum(U, 0.0)
    return _biases.init_user(U) if biased else U


def item_gram(U, biased):
    """``U_p^T U_p`` of the user columns the item side sees (``[U_p, 1]``: never ``b_u``)."""
    A = _biases.item_partner(U) if biased else U
    return A.T @ A


def init_client(block, broadcast, rng, *, init_scale, positive, client_weights, send_gram,
                biased=False, weighted=False, user_shrinkage=None):
    """Private ``U_p^0`` (``user_shrinkage``: its biases start at their shrunk means against
    the broadcast ``b_i``, the ``"auto"`` start); uploads its size (for ``omega``), for the
    global step its Gram and, for the weighted regularization, its ratings per item."""
    U = init_user_factors(block, broadcast["Vt"].shape[1], rng, init_scale, positive, biased)
    if biased:
        start_user_biases(U, block.X, broadcast["Vt"], user_shrinkage)
    upload = {"size": float(client_weight(block, client_weights))}
    if send_gram:
        upload["gram"] = item_gram(U, biased)
    if weighted:
        upload["counts"] = item_counts(block.X)
    return {"U": U}, upload


def server_init_uploads(server_state, uploads, *, n_clients, q2_first):
    """``omega_p`` from the clients' sizes; the Grams start the cache of the global step."""
    sizes = np.array([uploads[p]["size"] for p in range(n_clients)])
    total = float(max(sizes.sum(), 1.0))
    grams = None
    if "gram" in uploads[0]:
        grams = np.concatenate([uploads[p]["gram"] for p in range(n_clients)]).reshape(
            n_clients, *uploads[0]["gram"].shape)
    Vt = server_state["Vt"]
    state = {"Vt": Vt, "weights": sizes / total, "total": total, "grams": grams}
    if "counts" in uploads[0]:  # the item weights n_j of the weighted regularization
        state["counts"] = sum(uploads[p]["counts"] for p in range(n_clients))
    # the broadcast carries the total size so that each client can form its own omega_p
    return state, {"Vt": Vt, "q2": q2_first, **_shared(state)}


def _shared(server_state):
    """What every broadcast carries besides ``V``: the total size and, for the weighted
    regularization, the item counts (``h(V)`` is in every client's local objective)."""
    return {key: server_state[key] for key in ("total", "counts") if key in server_state}


def w_bound(gram, ridge, biased):
    """``L_W = lambda_max(gram) + ridge`` from the Gram of the user columns the item step
    multiplies; with biases one bound per column block of ``[V; b_i]``
    (``_biases.item_step_bounds``: the ones column must not shorten the factor steps)."""
    if biased:
        return np.maximum(_biases.item_step_bounds(gram, ridge), EPS_LIPSCHITZ)
    return max(lambda_max(gram) + ridge, EPS_LIPSCHITZ)


def user_steps(U, Vt, X, n_steps, c_factor, ridge_in_L, alpha, l1_ratio, positive, biased,
               bias_alpha=None):
    """(11) with step ``1/(c_factor (lambda_max(V V^T) + ridge_in_L))``. With biases the
    fixed column of ``[U, b_u, 1]`` is substituted (exact, ``_biases``): the steps run on
    ``[U, b_u]`` against ``[V; 1]`` with the ratings minus ``b_i``, each row and column block
    with its own Lipschitz bound (``_biases.user_step_bounds``: the global one would count
    the ones column over every item). ``alpha`` and ``ridge_in_L`` may be one value per row
    (weighted regularization): each row's bound then holds its own ridge. ``bias_alpha``: the
    ridge of ``b_u`` when it is not ``alpha`` (:func:`scaled_bias_view`)."""
    if not biased:
        c = c_factor * np.maximum(lambda_max(Vt.T @ Vt) + ridge_in_L, EPS_LIPSCHITZ)
        return u_steps(U, Vt, X, n_steps, c, alpha, l1_ratio, positive)
    # (a row's bound is tight: it must hold the ridge the gradient holds, whatever the
    # variant's ridge_in_L; the global bound's slack forgave that)
    X, Vt, bounds = _biases.user_step_view_and_bounds(X, Vt, alpha * (1.0 - l1_ratio))
    U, root = _biases.free_user(U), 1.0
    if bias_alpha is not None:
        U, Vt, root = scaled_bias_view(U, Vt, bounds, np.diff(X.indptr), alpha, bias_alpha)
    c = c_factor * np.maximum(bounds, EPS_LIPSCHITZ)
    U = u_steps(U, Vt, X, n_steps, c, alpha, l1_ratio, positive)
    U[:, -1] *= root
    return _biases.with_user(U)


def scaled_bias_view(U, Vt, bounds, counts, alpha, bias_alpha):
    """The user step's free columns ``[U, b_u]`` and partners ``[V; 1]`` with ``b_u = s c_u``
    against a column of ``s = sqrt(alpha / bias_alpha)``: the rows' ridge ``alpha`` on
    ``c_u`` is ``bias_alpha`` on ``b_u`` (one kernel ridge per row, two strengths). The
    bias block's bounds (in place) grow by ``s^2`` with its column. Returns ``(U, Vt, s)``;
    the caller multiplies the stepped ``c_u`` by ``s``."""
    root = float(np.sqrt(alpha / max(bias_alpha, MIN_BIAS_ALPHA * alpha)))
    U, Vt = U.copy(), Vt.copy()
    U[:, -1] /= root
    Vt[:, -1] = root
    bounds[:, -1] += (1.0 + _biases.TAU) * counts * (root * root - 1.0)
    return U, Vt, root


def u_phase(state, block, broadcast, *, variant, c_factor, alpha_u, l1_ratio, positive,
            local_iter_u, client_weights, biased=False, weighted=False, user_shrinkage=None):
    """Q1 steps on ``U_p`` against the broadcast ``V^s``; keeps the broadcast for the W phase."""
    Vt = broadcast["Vt"]
    alpha_u = row_alpha(alpha_u, block.X, weighted)
    ridge = alpha_u * (1.0 - l1_ratio) if variant == "wang_chang" else 0.0
    U = user_steps(state["U"], Vt, block.X, local_iter_u, c_factor, ridge, alpha_u, l1_ratio,
                   positive, biased, bias_alpha=user_shrinkage)
    # a client without ratings has a zero gradient: any omega > 0 gives it the same steps
    omega = max(client_weight(block, client_weights), 1.0) / broadcast["total"]
    return {"U": U, "Vt": Vt, "q2": broadcast["q2"], "omega": omega,
            "counts": broadcast.get("counts")}


def w_phase(state, block, d_global, *, variant, n_clients, d_factor, w_step, alpha_v, l1_ratio,
            positive, biased=False, weighted=False, item_shrinkage=None):
    """Q2 local steps from ``V^s``; returns the upload ``{"W": W_p}``.

    With biases ``h(V)`` holds the indicator of the fixed row of ``[V; 1; b_i]``: the steps
    run on ``[V; b_i]`` against ``[U_p, 1]`` with the ratings minus ``b_u`` (exact), and
    ``W_p`` goes up whole, ``b_i`` with it.

    Weighted regularization: ``h(V) = alpha_v/2 sum_j n_j ||v_j||^2`` (``1/p`` of it in the
    ``"fedmc_admm"`` variant, whose ``R(V)`` then sits inside the ``1/p`` like the data), with
    the item counts ``n_j`` summed by the server from the clients' one-time uploads and
    broadcast with ``V``. ``h(V)`` stays whole in every ``F_p``, as the plain one: one ridge
    per item row in the gradient, and each row's bound adds its own ridge where the plain
    ones add ``ridge`` (the server's global bound is then the data's alone). The steps stay
    linear and equal in every client, so their average keeps the exact stationary points.
    (Splitting ``h(V)``
    into the clients' shares ``n_jp`` needs no broadcast but, measured, its ``1/omega_p``
    scaling makes the local steps drift on the items the few sampled clients rated.)"""
    U, omega, X, W0 = state["U"], state["omega"], block.X, state["Vt"]
    scale = 1.0 / n_clients if variant == "fedmc_admm" else 1.0 / omega
    if weighted:
        alpha_v = alpha_v * state["counts"][:, None] / (
            n_clients if variant == "fedmc_admm" else 1.0)
    if biased:
        X, U = _biases.item_step_view(X, U)
        W0 = _biases.free_item(W0)
        if item_shrinkage is not None:
            # (each client steps on (1/p) f_p + h(V) and the server averages: the mean
            # minimizes (1/p^2) sum_p f_p + h(V), so lambda_i over p^2 shrinks b_i by lambda_i)
            alpha_v = bias_column_strength(alpha_v, item_shrinkage / n_clients**2,
                                           W0.shape[1])
    ridge = alpha_v * (1.0 - l1_ratio)  # weighted: one per item row, and so are the bounds
    if weighted and d_global is not None:
        d_global = d_global + d_factor * ridge
    if variant == "fedmc_admm":
        # d_i = 5 lambda_max(U_i^T U_i), plus the ridge where the bound is per row (weighted)
        # or per column block (biased: tight, its slack no longer covers the ridge)
        d = d_factor * (w_bound(U.T @ U, 0.0, biased) + (ridge if weighted or biased else 0.0))
    else:
        d_local = d_factor * (w_bound(U.T @ U / omega, 0.0, biased) + ridge)
        d = w_step_size(d_local, d_global, w_step, d_factor)
    Wt = w_steps(W0, U, X, state["q2"], d, scale, alpha_v, l1_ratio, positive)
    return {"W": _biases.with_item(Wt) if biased else Wt}


def bias_column_strength(alpha, bias_alpha, n_columns):
    """One strength per free column of ``[V, b_i]`` (or ``[U, b_u]``): ``alpha`` for the
    factors, ``bias_alpha`` for the bias (a row, broadcast over the rows)."""
    strengths = np.full((1, n_columns), float(alpha))
    strengths[0, -1] = bias_alpha
    return strengths


def palm_u_step(U, Wt, block, broadcast, *, c_factor, alpha_u, l1_ratio, positive):
    """FedPALM's step on ``U_p`` at the current local ``W_p`` (Remark 1, (15)); as in PALM
    (the paper's [40]) its size is a factor times the Lipschitz constant at that iterate."""
    c = c_factor * max(lambda_max(Wt.T @ Wt) + alpha_u * (1.0 - l1_ratio), EPS_LIPSCHITZ)
    return u_steps(U, Wt, block.X, 1, c, alpha_u, l1_ratio, positive)


def palm_w_step(Wt, U, block, broadcast, *, d_factor, alpha_v, l1_ratio, positive,
                client_weights):
    """FedPALM's proximal step on ``W_p`` at the new ``U_p`` (Remark 1, (16))."""
    omega = max(client_weight(block, client_weights), 1.0) / broadcast["total"]
    d = d_factor * max(lambda_max(U.T @ U) / omega + alpha_v * (1.0 - l1_ratio), EPS_LIPSCHITZ)
    return w_steps(Wt, U, block.X, 1, d, 1.0 / omega, alpha_v, l1_ratio, positive)


def palm_state(state, block, U):
    """The client's state after its FedPALM pairs."""
    return {"U": U}


def kept_state(state):
    """What a client keeps between rounds: ``U_p`` (the broadcast it held goes)."""
    return {"U": state["U"]}


def state_gram(state, *, biased=False):
    """The Gram a client sends in the prepare phase (global step): :func:`item_gram`."""
    return item_gram(state["U"], biased)


def server_prepare(server_state, stats, round_index, *, d_factor, alpha_v, l1_ratio,
                   biased=False):
    """The global step ``d = d_factor (lambda_max(sum_p U_p^T U_p) + ridge)`` (3.4, 8.3),
    from the server's cache of the clients' Grams, updated in place."""
    grams = store_grams(server_state["grams"], stats)
    L = w_bound(grams.sum(axis=0), alpha_v * (1.0 - l1_ratio), biased)
    return server_state, {"d": d_factor * L}


def secure_server_prepare(server_state, sums, clients, round_index, *, d_factor, alpha_v,
                          l1_ratio, biased=False):
    """:func:`server_prepare` under secure aggregation: ``sums["gram"]`` is the running sum
    of the latest Grams of the clients that have sent one (a cumulative exchange); a client
    that has not counts with the Gram of its ``U_p^0`` from the start (random, sent in the
    clear with its size), as the plain server's cache holds it."""
    unsent = server_state.get("unsent")
    unsent = np.ones(len(server_state["grams"]), dtype=bool) if unsent is None else unsent.copy()
    unsent[list(clients)] = False
    total = sums["gram"] + server_state["grams"][unsent].sum(axis=0)
    L = w_bound(total, alpha_v * (1.0 - l1_ratio), biased)
    return {**server_state, "unsent": unsent}, {"d": d_factor * L}


def server_update(server_state, uploads, round_index, counts=None, *, aggregation,
                  local_iter_v, q_hat, biased=False):
    """``V^{s+1}``: the (weighted) mean of the uploaded local copies (8)-(10)
    (:func:`~sklearn_fedmf.completion._fedmavg._fedmavg_round.average_uploads`; ``counts``: client
    -> draws)."""
    Vt = average_uploads(uploads, counts, server_state["weights"], aggregation)
    return server_from_mean(server_state, Vt, round_index, local_iter_v=local_iter_v,
                            q_hat=q_hat, biased=biased)


def server_from_mean(server_state, Vt, round_index, *, local_iter_v, q_hat, biased=False):
    """The server step from the uploads' mean ``Vt`` (also what secure aggregation's sums
    give: :func:`~sklearn_fedmf.completion._fedmavg._fedmavg_round.mean_of_sums`)."""
    if biased:  # (a weighted mean of ones can round off 1)
        _biases.fix_item(Vt)
    q2 = q2_schedule(round_index + 2, local_iter_v, q_hat)
    return {**server_state, "Vt": Vt}, {"Vt": Vt, "q2": q2, **_shared(server_state)}


def client_metrics(state, block, broadcast, *, alpha_u, l1_ratio, biased=False, alpha_v=0.0,
                   weighted=False, user_shrinkage=None):
    """Additive diagnostics of one client at the global ``V`` (weighted regularization: with
    the client's share ``alpha_v/2 sum_j n_jp ||v_j||^2`` of ``h(V)``; the shares sum to it;
    ``user_shrinkage``: ``b_u``'s own ridge)."""
    metrics = factor_metrics(state["U"], broadcast["Vt"], block, alpha_u=alpha_u,
                             l1_ratio=l1_ratio, biased=biased, alpha_v=alpha_v,
                             weighted=weighted)
    if user_shrinkage is not None:
        metrics["loss"] += _bias_penalty_change(state["U"][:, _biases.B_U], alpha_u,
                                                user_shrinkage, l1_ratio)
    return metrics


def _bias_penalty_change(bias, alpha, bias_alpha, l1_ratio):
    """The penalty of a bias column at its own strength minus at the factors'."""
    return (elastic_net_value(bias, bias_alpha, l1_ratio)
            - elastic_net_value(bias, alpha, l1_ratio))


def combine_metrics(server_state, sums, *, loss_scale, alpha_v, l1_ratio, biased=False,
                    weighted=False, item_shrinkage=None):
    """The objective (``sum`` of client losses, ``1/p`` of it for the FedMC-ADMM variant;
    weighted regularization: the item penalty is in the client losses; ``item_shrinkage``:
    ``b_i``'s own ridge, over ``p`` like the data)."""
    Vt = _biases.free_item(server_state["Vt"]) if biased else server_state["Vt"]
    item_penalty = 0.0 if weighted else elastic_net_value(Vt, alpha_v, l1_ratio)
    if item_shrinkage is not None:
        item_penalty += _bias_penalty_change(Vt[:, -1], alpha_v, loss_scale * item_shrinkage,
                                             l1_ratio)
    record = {
        "objective": loss_scale * sums["loss"] + item_penalty,
        "train_rmse": float(np.sqrt(sums["sse"] / max(sums["n"], 1))),
    }
    if sums["n_eval"]:
        record["eval_rmse"] = float(np.sqrt(sums["sse_eval"] / sums["n_eval"]))
    return record


