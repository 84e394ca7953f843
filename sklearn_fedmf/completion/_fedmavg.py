"""FedMAvg: federated model averaging for matrix completion (Wang & Chang, Algorithm 1).

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

from functools import partial
from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from .. import _biases
from .._base import FederatedMFBase, squared_error_of
from .._engine import FederatedProtocol, Participation
from .._groups import ImplicitRows
from .._kernels import grad_cols, prox_grad_rows
from .._prox import elastic_net_value, item_counts, prox_elastic_net, row_alpha

__all__ = ["FedMAvg"]

EPS_LIPSCHITZ = 1e-12  # floor of every Lipschitz bound: a zero factor must not give 0/0


# ---- pure solver functions ------------------------------------------------------------------
def lambda_max(S):
    """Largest eigenvalue of a symmetric matrix (0 for an empty one)."""
    return float(np.linalg.eigvalsh(S)[-1]) if S.size else 0.0


def q2_schedule(round_number, local_iter_v, q_hat):
    """``Q2^s``: constant ``local_iter_v``, or ``floor(q_hat / s) + 1`` when it is None
    (Algorithm 1's diminishing schedule)."""
    if local_iter_v is not None:
        return int(local_iter_v)
    return int(q_hat) // int(round_number) + 1


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


def init_server(rng, *, n_items, n_components, init_scale, biased=False):
    """``V^0``: i.i.d. ``init_scale * Uniform[0, 1)`` (``[V^0; 1; 0]`` with biases)."""
    Vt = init_scale * rng.random((n_items, n_components))
    if biased:
        _biases.init_item(Vt)
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
                biased=False, weighted=False):
    """Private ``U_p^0``; uploads its size (for ``omega``), for the global step its Gram and,
    for the weighted regularization, its ratings per item."""
    U = init_user_factors(block, broadcast["Vt"].shape[1], rng, init_scale, positive, biased)
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


def user_steps(U, Vt, X, n_steps, c_factor, ridge_in_L, alpha, l1_ratio, positive, biased):
    """(11) with step ``1/(c_factor (lambda_max(V V^T) + ridge_in_L))``. With biases the
    fixed column of ``[U, b_u, 1]`` is substituted (exact, ``_biases``): the steps run on
    ``[U, b_u]`` against ``[V; 1]`` with the ratings minus ``b_i``, each row and column block
    with its own Lipschitz bound (``_biases.user_step_bounds``: the global one would count
    the ones column over every item). ``alpha`` and ``ridge_in_L`` may be one value per row
    (weighted regularization): each row's bound then holds its own ridge."""
    if not biased:
        c = c_factor * np.maximum(lambda_max(Vt.T @ Vt) + ridge_in_L, EPS_LIPSCHITZ)
        return u_steps(U, Vt, X, n_steps, c, alpha, l1_ratio, positive)
    X, Vt = _biases.user_step_view(X, Vt)
    # (a row's bound is tight: it must hold the ridge the gradient holds, whatever the
    # variant's ridge_in_L; the global bound's slack forgave that)
    c = c_factor * np.maximum(_biases.user_step_bounds(X, Vt, alpha * (1.0 - l1_ratio)),
                              EPS_LIPSCHITZ)
    U = u_steps(_biases.free_user(U), Vt, X, n_steps, c, alpha, l1_ratio, positive)
    return _biases.with_user(U)


def u_phase(state, block, broadcast, *, variant, c_factor, alpha_u, l1_ratio, positive,
            local_iter_u, client_weights, biased=False, weighted=False):
    """Q1 steps on ``U_p`` against the broadcast ``V^s``; keeps the broadcast for the W phase."""
    Vt = broadcast["Vt"]
    alpha_u = row_alpha(alpha_u, block.X, weighted)
    ridge = alpha_u * (1.0 - l1_ratio) if variant == "wang_chang" else 0.0
    U = user_steps(state["U"], Vt, block.X, local_iter_u, c_factor, ridge, alpha_u, l1_ratio,
                   positive, biased)
    # a client without ratings has a zero gradient: any omega > 0 gives it the same steps
    omega = max(client_weight(block, client_weights), 1.0) / broadcast["total"]
    return {"U": U, "Vt": Vt, "q2": broadcast["q2"], "omega": omega,
            "counts": broadcast.get("counts")}


def w_phase(state, block, d_global, *, variant, n_clients, d_factor, w_step, alpha_v, l1_ratio,
            positive, biased=False, weighted=False):
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
    ridge = alpha_v * (1.0 - l1_ratio)  # weighted: one per item row, and so are the bounds
    if weighted and d_global is not None:
        d_global = d_global + d_factor * ridge
    if variant == "fedmc_admm":
        # d_i = 5 lambda_max(U_i^T U_i), plus the ridge where the bound is per row (weighted)
        # or per column block (biased: tight, its slack no longer covers the ridge)
        d = d_factor * (w_bound(U.T @ U, 0.0, biased) + (ridge if weighted or biased else 0.0))
    else:
        d_local = d_factor * (w_bound(U.T @ U / omega, 0.0, biased) + ridge)
        if w_step == "local":
            d = d_local
        elif w_step == "guarded":  # never a step longer than 1/(0.51 L_Wp) locally: d is
            # unstable on non-iid clients
            d = np.maximum(d_global, 0.51 * d_local / d_factor)
        else:
            d = d_global
    Wt = w_steps(W0, U, X, state["q2"], d, scale, alpha_v, l1_ratio, positive)
    return {"W": _biases.with_item(Wt) if biased else Wt}


def palm_pairs(state, block, broadcast, *, n_pairs, c_factor, d_factor, alpha_u, alpha_v,
               l1_ratio, positive, client_weights):
    """FedPALM's local work (Remark 1, (15)-(16)): ``n_pairs`` times one step on ``U_p`` at the
    current local ``W_p``, then one proximal step on ``W_p`` at the new ``U_p``, from
    ``W_p = V^s``. As in PALM (the paper's [40]) each step size is a factor times the Lipschitz
    constant at the current iterate. Returns ``(U_p, W_p)``."""
    U, Wt = state["U"], broadcast["Vt"]
    omega = max(client_weight(block, client_weights), 1.0) / broadcast["total"]
    ridge_u, ridge_v = alpha_u * (1.0 - l1_ratio), alpha_v * (1.0 - l1_ratio)
    for _ in range(n_pairs):
        c = c_factor * max(lambda_max(Wt.T @ Wt) + ridge_u, EPS_LIPSCHITZ)
        U = u_steps(U, Wt, block.X, 1, c, alpha_u, l1_ratio, positive)
        d = d_factor * max(lambda_max(U.T @ U) / omega + ridge_v, EPS_LIPSCHITZ)
        Wt = w_steps(Wt, U, block.X, 1, d, 1.0 / omega, alpha_v, l1_ratio, positive)
    return U, Wt


def palm_client_update(state, block, broadcast, rng, selected, **params):
    """FedPALM round of a client: its pairs of steps, then (if sampled) the upload of ``W_p``."""
    U, Wt = palm_pairs(state, block, broadcast, **params)
    return {"U": U}, ({"W": Wt} if selected else None)


def client_prepare(state, block, broadcast, rng, selected, **params):
    """Prepare phase (global step only): the U phase, then send ``U_p^T U_p``."""
    new = u_phase(state, block, broadcast, **params)
    return new, {"gram": item_gram(new["U"], params.get("biased", False))}


_GRAM_CHUNK = 4096  # Grams per stacked assignment in server_prepare


def server_prepare(server_state, stats, round_index, *, d_factor, alpha_v, l1_ratio,
                   biased=False):
    """The global step ``d = d_factor (lambda_max(sum_p U_p^T U_p) + ridge)`` (3.4, 8.3).

    The server's cache of the clients' Grams is updated in place: at one client per user it
    is ``p x r x r`` (0.75 GB at the Netflix shape), too large to copy every round."""
    grams = server_state["grams"]
    clients = np.fromiter(stats, np.int64, len(stats))
    new = [stat["gram"] for stat in stats.values()]
    # stacked assignments (at one client per user there are 480,189 Grams a round), a chunk
    # at a time: one stack of them all is a 0.75 GB temporary, paged in afresh every round
    for a in range(0, len(new), _GRAM_CHUNK):
        grams[clients[a:a + _GRAM_CHUNK]] = np.concatenate(
            new[a:a + _GRAM_CHUNK]).reshape(-1, *grams.shape[1:])
    L = w_bound(grams.sum(axis=0), alpha_v * (1.0 - l1_ratio), biased)
    return server_state, {"d": d_factor * L}


def client_update(state, block, broadcast, rng, selected, *, prepared, u_params, w_params):
    """Main phase: (U phase unless prepared) then, if sampled, the W phase and the upload."""
    if not prepared:
        state = u_phase(state, block, broadcast, **u_params)
    keep = {"U": state["U"]}
    if not selected:
        return keep, None
    d_global = broadcast["d"] if prepared else None
    return keep, w_phase(state, block, d_global, **w_params)


def weighted_sum(messages, weights):
    """``sum_p w_p W_p`` of dense uploads and :class:`~sklearn_fedmf._groups.ImplicitRows`
    (``scale * base`` but for the rated rows): an implicit upload costs its rated rows, the
    base is added once with the summed coefficients (one per column when the scale is)."""
    total, bases = None, {}
    for message, weight in zip(messages, weights):
        if isinstance(message, ImplicitRows):
            if total is None:
                total = np.zeros(message.shape)
            coef = message.add_to(total, weight)
            if np.any(coef):
                base, summed = bases.get(id(message.base), (message.base, 0.0))
                bases[id(message.base)] = (base, summed + coef)
        elif total is None:
            total = weight * message
        else:
            total += weight * message
    for base, coef in bases.values():
        total += coef * base
    return total


def server_update(server_state, uploads, round_index, counts=None, *, aggregation,
                  local_iter_v, q_hat, biased=False):
    """``V^{s+1}``: the (weighted) mean of the uploaded local copies (8)-(10).

    ``counts`` (client -> draws) makes ``"sampled_mean"`` the mean over the multiset of draws,
    ``sum_p n_p W_p / sum_p n_p`` (eqs. (9)-(10); ``1/m`` when every drawn client arrived).
    """
    clients = list(uploads)
    if aggregation == "weighted":
        w = server_state["weights"][clients]
    else:
        w = np.array([1.0 if counts is None else counts[p] for p in clients])
    w = w / w.sum() if w.sum() > 0 else np.full(len(clients), 1.0 / len(clients))
    Vt = weighted_sum([uploads[p]["W"] for p in clients], w)
    if biased:  # (a weighted mean of ones can round off 1)
        _biases.fix_item(Vt)
    q2 = q2_schedule(round_index + 2, local_iter_v, q_hat)
    return {**server_state, "Vt": Vt}, {"Vt": Vt, "q2": q2, **_shared(server_state)}


def client_metrics(state, block, broadcast, *, alpha_u, l1_ratio, biased=False, alpha_v=0.0,
                   weighted=False):
    """Additive diagnostics of one client at the global ``V`` (weighted regularization: with
    the client's share ``alpha_v/2 sum_j n_jp ||v_j||^2`` of ``h(V)``; the shares sum to it)."""
    U, Vt = state["U"], broadcast["Vt"]
    sse = squared_error_of(block.X, U, Vt)
    item_penalty = 0.0
    if weighted:
        item_penalty = elastic_net_value(_biases.free_item(Vt) if biased else Vt,
                                         alpha_v * item_counts(block.X), l1_ratio)
    return {
        "loss": 0.5 * sse + item_penalty + elastic_net_value(
            _biases.free_user(U) if biased else U, row_alpha(alpha_u, block.X, weighted),
            l1_ratio),
        "sse": sse,
        "n": block.nnz,
        "sse_eval": squared_error_of(block.X_eval, U, Vt),
        "n_eval": 0 if block.X_eval is None else block.X_eval.nnz,
    }


def combine_metrics(server_state, sums, *, loss_scale, alpha_v, l1_ratio, biased=False,
                    weighted=False):
    """The objective (``sum`` of client losses, ``1/p`` of it for the FedMC-ADMM variant;
    weighted regularization: the item penalty is in the client losses)."""
    Vt = _biases.free_item(server_state["Vt"]) if biased else server_state["Vt"]
    record = {
        "objective": loss_scale * sums["loss"]
        + (0.0 if weighted else elastic_net_value(Vt, alpha_v, l1_ratio)),
        "train_rmse": float(np.sqrt(sums["sse"] / max(sums["n"], 1))),
    }
    if sums["n_eval"]:
        record["eval_rmse"] = float(np.sqrt(sums["sse_eval"] / sums["n_eval"]))
    return record


def make_protocol(*, n_items, n_clients, n_components, variant, local_iter_u, local_iter_v,
                  q_hat, participation, aggregation, c_factor, d_factor, w_step, client_weights,
                  alpha_u, alpha_v, l1_ratio, positive, init_scale, biased=False,
                  weighted=False):
    """Bind the hyperparameters to the pure functions above (``biased``: rank
    ``n_components + 2`` with the augmented factors of ``_biases``; ``weighted``: each row's
    penalty scaled by its number of ratings)."""
    prepared = variant == "wang_chang" and w_step in ("global", "guarded")
    u_params = dict(variant=variant, c_factor=c_factor, alpha_u=alpha_u, l1_ratio=l1_ratio,
                    positive=positive, local_iter_u=local_iter_u, client_weights=client_weights,
                    biased=biased, weighted=weighted)
    w_params = dict(variant=variant, n_clients=n_clients, d_factor=d_factor, w_step=w_step,
                    alpha_v=alpha_v, l1_ratio=l1_ratio, positive=positive, biased=biased,
                    weighted=weighted)
    q2_first = q2_schedule(1, local_iter_v, q_hat)
    update = partial(client_update, prepared=prepared, u_params=u_params, w_params=w_params)
    if variant == "fedpalm":
        if weighted:
            raise ValueError('variant="fedpalm" is the paper\'s Remark 1 baseline; set '
                             'regularization="plain".')
        if biased:
            raise ValueError('variant="fedpalm" is the paper\'s Remark 1 baseline on plain '
                             "factors; set biased=False.")
        update = partial(palm_client_update, n_pairs=local_iter_u, c_factor=c_factor,
                         d_factor=d_factor, alpha_u=alpha_u, alpha_v=alpha_v,
                         l1_ratio=l1_ratio, positive=positive, client_weights=client_weights)
    batched = None  # FedPALM's pairs and the weighted ridges (one per item) run per client
    if variant != "fedpalm" and not weighted:
        from ._fedmavg_batched import make_batched  # (it builds on this module's functions)

        batched = make_batched(prepared=prepared, u_params=u_params, w_params=w_params,
                               init_params=dict(init_scale=init_scale, positive=positive,
                                                client_weights=client_weights,
                                                send_gram=prepared),
                               alpha_u=alpha_u, l1_ratio=l1_ratio, biased=biased)
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items,
                            n_components=_biases.n_factors(n_components, biased),
                            init_scale=init_scale, biased=biased),
        init_client=partial(init_client, init_scale=init_scale, positive=positive,
                            client_weights=client_weights, send_gram=prepared, biased=biased,
                            weighted=weighted),
        server_init_uploads=partial(server_init_uploads, n_clients=n_clients,
                                    q2_first=q2_first),
        client_prepare=partial(client_prepare, **u_params) if prepared else None,
        server_prepare=partial(server_prepare, d_factor=d_factor,
                               alpha_v=0.0 if weighted else alpha_v,  # (its share is a prox)
                               l1_ratio=l1_ratio, biased=biased) if prepared else None,
        client_update=update,
        server_update=partial(server_update, aggregation=aggregation,
                              local_iter_v=local_iter_v, q_hat=q_hat, biased=biased),
        client_metrics=partial(client_metrics, alpha_u=alpha_u, l1_ratio=l1_ratio,
                               biased=biased, alpha_v=alpha_v, weighted=weighted),
        combine_metrics=partial(combine_metrics, alpha_v=alpha_v, l1_ratio=l1_ratio,
                                biased=biased, weighted=weighted,
                                loss_scale=1.0 / n_clients if variant == "fedmc_admm" else 1.0),
        participation=Participation(computes="all", receives="all") if participation == "pcc"
        else Participation(),
        server_counts=True,
        batched=batched,
    )


# ---- estimator ----------------------------------------------------------------------------
class FedMAvg(FederatedMFBase):
    """Federated matrix completion by model averaging (FedMAvg, Wang & Chang).

    Each client owns a block of rows (users). In a round every client (partial client
    *communication*, the default) or only the sampled ones take ``local_iter_u``
    proximal-gradient steps on their private user factors ``U_p`` against the broadcast item
    factor ``V``; each of the ``clients_per_round`` sampled clients then takes ``Q2`` gradient
    steps on its own copy of ``V`` and uploads it; the server averages the copies. ``U_p``
    and the ratings never leave a client.

    Parameters
    ----------
    n_components : int, default=5
        Rank ``r`` of the factorization.
    variant : {"wang_chang", "fedpalm", "fedmc_admm"}, default="wang_chang"
        ``"wang_chang"``: the paper's algorithm on the sum of squared errors, steps as factors
        of Lipschitz bounds (Algorithm 1). ``"fedpalm"``: the paper's Remark 1 baseline
        (Fig. 2b): each client interleaves ``local_iter_u`` pairs of one U step at its current
        copy ``W_p`` and one proximal W step at the new ``U_p`` (``Q = 2 local_iter_u``; steps
        ``1/(c_factor L_U(W_p))`` and ``1/(d_factor L_Wp(U_p))``); ``local_iter_v``, ``q_hat``
        and ``w_step`` do not apply. ``"fedmc_admm"``: the baseline as restated in the
        FedMC-ADMM paper (objective ``(1/p) sum_i [f_i + R_i] + R(V)``, W gradient divided by
        ``p``, ``d_i = d_factor lambda_max(U_i^T U_i)``, ``c = c_factor lambda_max(V V^T)``,
        plain mean of the uploads, ``Q1 = Q2 = 10``).
    local_iter_u : int, default=10
        Local steps ``Q1`` on the user factors per round.
    local_iter_v : int or None, default=None
        Local steps ``Q2`` on the item-factor copy. None means the variant's schedule: the
        diminishing ``Q2^s = floor(q_hat / s) + 1`` (``"wang_chang"``) or 10.
    q_hat : int, default=5
        ``Q_hat`` of the diminishing schedule (only when ``local_iter_v`` is None).
    participation : {"pcc", "pcp"}, default="pcc"
        ``"pcc"``: every client updates ``U_p`` every round and only the sampled ones upload
        (partial client communication; the broadcast reaches all). ``"pcp"``: only the sampled
        clients compute (partial participation, the paper's Fig. 2a baseline).
    aggregation : {"weighted", "sampled_mean"} or None, default=None
        ``"weighted"``: ``sum omega_p W_p / sum omega_p`` over the received copies (eq. (8) at
        full participation); ``"sampled_mean"``: their plain mean, a client counted once per
        draw. None: ``"weighted"`` for ``"wang_chang"`` with uniform sampling,
        ``"sampled_mean"`` otherwise. ``"weighted"`` with ``sampling="weighted"`` is refused
        (it would weigh by ``omega`` twice).
    c_factor : float or None, default=None
        The U step is ``1 / (c_factor * L_U)`` with ``L_U = lambda_max(V V^T) + ridge``
        (``"wang_chang"``, default 0.51) or ``lambda_max(V V^T)`` (``"fedmc_admm"``, 0.5).
    d_factor : float, default=5.0
        The W step is ``1 / (d_factor * L_W)`` (see ``w_step``).
    w_step : {"global", "local", "guarded"} or None, default=None
        ``L_W`` of the W step (``"wang_chang"``): ``"global"`` uses ``lambda_max(sum_p U_p^T
        U_p) + ridge`` of this round (clients send their ``r x r`` Gram in a first exchange),
        ``"local"`` the client's own ``lambda_max(U_p^T U_p) / omega_p + ridge``, ``"guarded"``
        the global step but never above ``1/(0.51 L_Wp)`` (a stability guard; the paper's
        theory assumes the global constant). None: ``"guarded"``, which equals ``"global"``
        while no client's local curvature exceeds the global one (100 clients of MovieLens:
        the same model) and keeps small, unlike clients stable (one client per user on the
        ML-1M shape: ``"global"`` ends 20 rounds at train RMSE 17.5, ``"guarded"`` at 0.92).
        The ``"fedmc_admm"`` variant always uses its local ``d_i``.
    client_weights : {"entries", "rows"}, default="entries"
        ``omega_p`` proportional to the client's observed ratings or to its rows (the paper's
        ``N_p / N``).
    n_clients : int, default=10
        Number of clients ``p`` when ``clients`` is not given to fit.
    partition : {"random", "contiguous"}, default="random"
        How rows are assigned to ``n_clients`` clients.
    clients_per_round : int, float or None, default=None
        Clients drawn each round (the paper's ``m``): a count, a fraction in (0, 1], or None
        for all.
    sampling : {"uniform", "weighted"}, default="uniform"
        ``"uniform"``: distinct clients without replacement. ``"weighted"``: the paper's i.i.d.
        draws with replacement, probabilities ``omega_p`` (``client_weights``); a client drawn
        twice uploads once and counts twice in the mean (``history_`` then also has
        ``bytes_uploaded_draws``, the paper's count of one upload per draw).
    max_iter : int, default=100
        Communication rounds.
    tol : float, default=0.0
        Stop when the relative change of the objective falls below ``tol``.
    alpha_u, alpha_v : float, default=10.0
        Regularization of the user and item factors: ``alpha * l1_ratio * ||.||_1 + 0.5 *
        alpha * (1 - l1_ratio) * ||.||_F^2``. The l2 part is smooth (in the gradient), the l1
        part and ``positive`` act as a prox at every local step.
        Defaults measured across data sets (``benchmarks/bench_defaults.py``); the papers'
        ``1e-6`` is in ``PAPER_SETTINGS``.
    l1_ratio : float, default=0.0
        Mix of the elastic net: 0 is squared l2, 1 is l1 (soft-thresholding).
    regularization : {"plain", "weighted"}, default="plain"
        ``"plain"``: the papers' penalties, one strength for every row. ``"weighted"``:
        ALS-WR's weighted lambda, each user's row scaled by its number of ratings and each
        item's by its number of ratings (``alpha`` is then a strength per rating). Every
        client sends its ratings per item once (round 1's bytes); the server broadcasts their
        sum ``n_j`` with ``V`` (one more float per item in ``bytes_downloaded``).
    positive : bool, default=False
        Constrain both factors to be nonnegative.
    init_scale : float, default=1.0
        Factors start i.i.d. ``init_scale * Uniform[0, 1)`` (0: at the zero saddle, where
        they stay; with ``biased=True`` only the biases are then fitted).
    center : bool, default=True
        Subtract the global training mean before factorizing.
    biased : bool, default=True
        Fit a bias per user and per item: the prediction is ``mean_ + b_u + b_i + u . v``.
        The factors become ``[U, b_u, 1]`` and ``[V; 1; b_i]`` with the fixed entries held
        by indicator functions in the regularizers (their prox is the projection onto 1), so
        the algorithm runs unchanged on rank ``n_components + 2``. ``b_u`` stays on its
        client like ``U_p``; ``b_i`` travels and is aggregated as ``V`` (its bytes counted).
    clip : bool, default=True
        Clip predictions (``predict``, ``score``, and through
        :class:`~sklearn_fedmf.RatingRegressor` its pairs and ``recommend`` scores) to the
        training rating range ``rating_range_``, as Surprise does; False gives the raw model.
    dropout : float, default=0.0
        Probability that a sampled client fails in a round.
    eval_every : int, default=1
        Record the objective and RMSEs every ``eval_every`` rounds (0 never).
    callback : callable, default=None
        ``callback(round, info)`` after each round; returning True stops the fit.
    warm_start : bool, default=False
        Continue from the previous fit's state for ``max_iter`` more rounds.
    missing_values : float, default=np.nan
        As in :class:`~sklearn_fedmf.FedMCADMM`.
    random_state : int, RandomState instance or None, default=None
        Seeds the partition, the initialization and every round's sampling.
    n_jobs : int, default=None
        Parallel local updates (joblib; threads unless a backend is configured).
    verbose : int, default=0
        1 shows a progress bar, 2 a line per round.
    on_client_error : {"raise", "skip"}, default="raise"
        An exception in a client's code raises a
        :class:`~sklearn_fedmf.exceptions.ClientError` naming the client and the round.
        ``"skip"``, for deployments that must tolerate failing clients: the client keeps its
        previous state for that round and counts in ``history_``'s ``n_failed``, a
        :class:`~sklearn_fedmf.exceptions.ClientFailureWarning` is raised once per fit, and a
        round in which every sampled client failed raises
        :class:`~sklearn_fedmf.exceptions.FederationError`. Simulated failures
        (``dropout``) are counted either way.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_items)
        The global item factor ``V`` (the paper's ``W``).
    user_factors_ : ndarray of shape (n_users, n_components)
        The client-local factors (the paper's ``H^T``), kept for analysis only.
    item_bias_ : ndarray of shape (n_items,)
        ``b_i`` (``biased=True`` only).
    user_bias_ : ndarray of shape (n_users,)
        ``b_u``, private to each client (``biased=True`` only).
    mean_ : float
    n_iter_ : int
    n_clients_ : int
    clients_ : ndarray of shape (n_users,)
    history_ : list of dict
        One record per round: ``objective``, ``train_rmse``, ``eval_rmse``, bytes (the
        one-time sizes and, for the global step, Grams are in round 1), ``seconds``...
    converged_, degenerate_
        As in :class:`~sklearn_fedmf.FedMCADMM`.
    n_features_in_ : int

    See Also
    --------
    sklearn_fedmf.FedMGS : Gradient sharing, the paper's second algorithm.
    sklearn_fedmf.FedMCADMM : Linearized ADMM, which the FedMC-ADMM paper compares with this.

    References
    ----------
    S. Wang and T.-H. Chang. Federated Matrix Factorization: Algorithm Design and Application
    to Data Clustering. IEEE Trans. Signal Process., 2022.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf import FedMAvg
    >>> rng = np.random.default_rng(0)
    >>> M = rng.normal(size=(60, 2)) @ rng.normal(size=(2, 30))
    >>> X = np.where(rng.random(M.shape) < 0.6, M, np.nan)
    >>> # a noise-free low-rank toy needs little regularization (the defaults suit ratings)
    >>> model = FedMAvg(n_components=2, n_clients=4, max_iter=300, alpha_u=0.01, alpha_v=0.01,
    ...               random_state=0).fit(X)
    >>> bool(model.score(X) > -0.1)
    True
    """

    _parameter_constraints: dict = {
        **FederatedMFBase._parameter_constraints,
        "variant": [StrOptions({"wang_chang", "fedpalm", "fedmc_admm"})],
        "local_iter_u": [Interval(Integral, 1, None, closed="left")],
        "local_iter_v": [Interval(Integral, 1, None, closed="left"), None],
        "q_hat": [Interval(Integral, 0, None, closed="left")],
        "participation": [StrOptions({"pcc", "pcp"})],
        "aggregation": [StrOptions({"weighted", "sampled_mean"}), None],
        "c_factor": [Interval(Real, 0, None, closed="neither"), None],
        "d_factor": [Interval(Real, 0, None, closed="neither")],
        "w_step": [StrOptions({"global", "local", "guarded"}), None],
        "client_weights": [StrOptions({"entries", "rows"})],
        "sampling": [StrOptions({"uniform", "weighted"})],
        "init_scale": [Interval(Real, 0, None, closed="left")],
        "regularization": [StrOptions({"plain", "weighted"})],
    }

    def __init__(
        self,
        n_components=5,
        *,
        variant="wang_chang",
        local_iter_u=10,
        local_iter_v=None,
        q_hat=5,
        participation="pcc",
        aggregation=None,
        c_factor=None,
        d_factor=5.0,
        w_step=None,
        client_weights="entries",
        n_clients=10,
        partition="random",
        clients_per_round=None,
        sampling="uniform",
        max_iter=100,
        tol=0.0,
        alpha_u=10.0,
        alpha_v=10.0,
        l1_ratio=0.0,
        regularization="plain",
        positive=False,
        init_scale=1.0,
        center=True,
        biased=True,
        clip=True,
        dropout=0.0,
        eval_every=1,
        callback=None,
        warm_start=False,
        missing_values=np.nan,
        random_state=None,
        n_jobs=None,
        verbose=0,
        on_client_error="raise",
    ):
        super().__init__(
            n_components,
            n_clients=n_clients, partition=partition, clients_per_round=clients_per_round,
            max_iter=max_iter, tol=tol, alpha_u=alpha_u, alpha_v=alpha_v, center=center,
            biased=biased,
            clip=clip, dropout=dropout, eval_every=eval_every, callback=callback,
            warm_start=warm_start, missing_values=missing_values, random_state=random_state,
            n_jobs=n_jobs, verbose=verbose, on_client_error=on_client_error,
        )
        self.variant = variant
        self.local_iter_u = local_iter_u
        self.local_iter_v = local_iter_v
        self.q_hat = q_hat
        self.participation = participation
        self.aggregation = aggregation
        self.c_factor = c_factor
        self.d_factor = d_factor
        self.w_step = w_step
        self.client_weights = client_weights
        self.sampling = sampling
        self.l1_ratio = l1_ratio
        self.regularization = regularization
        self.positive = positive
        self.init_scale = init_scale

    def _make_protocol(self, ctx):
        if self.variant != "wang_chang" and self.w_step not in (None, "local"):
            raise ValueError(
                f'variant="{self.variant}" uses its own local step d_i; w_step={self.w_step!r} '
                'needs variant="wang_chang".'
            )
        paper = self.variant == "fedmc_admm"
        weighted_draws = self.sampling == "weighted"
        if weighted_draws and self.aggregation == "weighted":
            raise ValueError(
                'aggregation="weighted" with sampling="weighted" would weigh the clients by '
                'omega twice; the paper averages weighted draws with "sampled_mean".'
            )
        return make_protocol(
            n_items=ctx.n_features, n_clients=ctx.n_clients, n_components=self.n_components,
            variant=self.variant, local_iter_u=self.local_iter_u,
            local_iter_v=self.local_iter_v if self.local_iter_v or not paper else 10,
            q_hat=self.q_hat, participation=self.participation,
            aggregation=self.aggregation
            or ("sampled_mean" if paper or weighted_draws else "weighted"),
            c_factor=self.c_factor or (0.5 if paper else 0.51), d_factor=self.d_factor,
            w_step=self.w_step or ("guarded" if self.variant == "wang_chang" else "local"),
            client_weights=self.client_weights, alpha_u=self.alpha_u, alpha_v=self.alpha_v,
            l1_ratio=self.l1_ratio, positive=self.positive, init_scale=self.init_scale,
            biased=self.biased, weighted=self.regularization == "weighted",
        )

    def _client_weights(self, nnz, n_rows):
        return nnz if self.client_weights == "entries" else n_rows

    def _read_components(self, server_state, broadcast):
        return np.ascontiguousarray(server_state["Vt"].T)

    def _read_user_factors(self, client_state):
        return client_state["U"]
