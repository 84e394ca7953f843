"""RFRec and RFRecF: regularized federated recommendation (Liu et al., CIKM 2024).

Every client ``c`` owns its users' vectors ``u_i`` and a personal copy ``V_(c)`` of the item
matrix; the server only averages the copies, ``Vbar = mean_c V_(c)``. The problem (the paper's
(5), spec 1.3; ``N`` clients, ``lambda = reg_consensus`` multiplies ``psi`` which carries 1/2)::

    F(x) = sum_c [ sum_{i in c} ( sum_{j in Omega_i} (r_ij - u_i . v_(c)j)^2 + alpha_u ||u_i||^2 )
                   + (alpha_v / N) ||V_(c)||^2 ]  +  lambda * sum_c 1/2 ||V_(c) - Vbar||^2

RFRec (Algorithm 1) is one gradient step on ``F`` per client and round, then averaging.
RFRecF (Algorithm 2) flips one shared coin per round: a local step on ``f`` alone with step
``alpha / (1 - p)``, or a pull ``V_(c) <- V_(c) - eta (V_(c) - Vbar)``; it communicates only
when the coin changes. ``F`` is **not** convex (spec 1.6: sign and rotation symmetries, no
minimizer when ``alpha_v = 0``): nothing here assumes a unique optimum.

Representation (spec 8): every copy starts at ``Vbar^0``, so a column that client ``c`` has not
rated evolves identically in every client. Those columns are simulated once (``W``, carried in
the broadcast as simulation plumbing, never counted as communication); a client stores only its
rated columns ``P`` (one row per (client, item) pair). An upload is the client's whole
``n_items x d`` matrix, sent as :class:`ItemMatrixUpload` (its rated columns over ``W``) whose
``nbytes`` is the dense matrix the paper sends. Item arrays are item-major, ``(n_items, d)``.

Engine mapping: one engine client is one paper client (one user by default), so sampling,
lost uploads (``dropout``), byte counts and the callback's ``uploads`` are per paper client.
Every client steps each round (``update_all``); a client that is not sampled, or whose upload
is lost, still receives ``Vbar`` (the upload-loss model of spec 4.1; the engine's
``dropout_mode="upload_loss"``). The "offline" model, where a dropped client freezes, would
break the shared-column representation and is not offered. The cost is Python overhead per
client and round (~0.1 ms; ``benchmarks/bench_rfrec.py --table cost``), not memory.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial
from numbers import Integral, Real

import numpy as np
import scipy.sparse as sp
from numba import njit
from sklearn.base import _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _num_samples, check_is_fitted

from .._base import FederatedMFBase, _shift
from .._data import check_like
from .._engine import FederatedProtocol
from .._kernels import ridge_fold_in
from ..privacy import PrivacyWarning, clip_entries, laplace_epsilon, laplace_noise

__all__ = ["RFRec", "ItemMatrixUpload"]

_B1, _B2, _EPS = 0.9, 0.999, 1e-8  # Adam, as in torch (the authors' code)
_COIN, _NOISE = 0, 1  # spawn keys of the server's streams
_EXPLODE = 1e4  # objective above this many times sum(r^2) + nnz: the step size is too large


# ---- messages -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ItemMatrixUpload:
    """One client's upload: its ``(n_items, d)`` item matrix ``V_(c)``, clipped if asked.

    Stored as the rated columns ``values`` at ``cols`` over the columns every client shares
    (``shared``, public: a function of the broadcasts), so the simulation never materializes
    ``N`` dense matrices. ``nbytes`` is the size of the dense matrix the paper sends. With
    ``noise_scale > 0`` the per-entry Laplace noise is drawn in aggregate by the server (spec
    8.5, exact in distribution); ``simulate_uploads=True`` sends dense noisy arrays instead.
    """

    cols: np.ndarray
    values: np.ndarray
    n_items: int
    noise_scale: float = 0.0

    @property
    def nbytes(self):
        return self.n_items * self.values.shape[1] * self.values.itemsize

    def toarray(self, shared):
        """The dense matrix, given the shared columns (``W``, clipped like the upload)."""
        dense = np.array(shared, dtype=float)
        dense[self.cols] = self.values
        return dense


@dataclass(frozen=True)
class _Broadcast:
    """What clients receive: ``Vbar`` (counted when sent) plus simulation plumbing.

    ``W``/``W_opt`` are the columns every client shares and their Adam moments (each client
    would compute them itself from the ``Vbar`` sequence); ``coin`` is ``(zeta_{k-1}, zeta_k)``
    for the coming round, common randomness from a shared seed. Neither is communication.
    """

    Vbar: np.ndarray
    W: np.ndarray
    W_opt: dict | None
    coin: tuple
    sent: bool

    @property
    def nbytes(self):
        return self.Vbar.nbytes if self.sent else 0


# ---- kernels --------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _fit_grads(indptr, pair, data, U, P, sigmoid, shift, span, gU, gP):
    """Gradients of ``sum (r - link(u_i . p_q))^2`` over the stored entries; returns the sum.

    Entry ``s`` of row ``t`` uses the client's column ``P[pair[s]]``. The sigmoid link fits
    ``(r + shift) / span`` (ratings min-max scaled to [0, 1]) with ``sigmoid(u . v)``.
    """
    d = U.shape[1]
    gU[:, :] = 0.0
    gP[:, :] = 0.0
    loss = 0.0
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            q = pair[s]
            z = 0.0
            for a in range(d):
                z += U[t, a] * P[q, a]
            if sigmoid:
                sg = 1.0 / (1.0 + np.exp(-z))
                e = sg - (data[s] + shift) / span
                g = 2.0 * e * sg * (1.0 - sg)
            else:
                e = z - data[s]
                g = 2.0 * e
            loss += e * e
            for a in range(d):
                gU[t, a] += g * P[q, a]
                gP[q, a] += g * U[t, a]
    return loss



@njit(cache=True, nogil=True)
def _client_grads(indptr, pair, data, U, P, Vbar, cols, sigmoid, shift, span, alpha_u, reg_v,
                  reg, scale, gU, gP):
    """``scale * grad (fit + ridges) + reg * (P - Vbar[cols])``: RFRec's step (``scale=1``)
    or RFRecF's main update (``reg=0``, ``scale = 1 / (1 - p)``)."""
    _fit_grads(indptr, pair, data, U, P, sigmoid, shift, span, gU, gP)
    for t in range(U.shape[0]):
        for a in range(U.shape[1]):
            gU[t, a] = scale * (gU[t, a] + 2.0 * alpha_u * U[t, a])
    for q in range(P.shape[0]):
        j = cols[q]
        for a in range(P.shape[1]):
            gP[q, a] = scale * (gP[q, a] + 2.0 * reg_v * P[q, a]) + reg * (P[q, a] - Vbar[j, a])


@njit(cache=True, nogil=True)
def _client_sums(indptr, pair, data, U, P, W, Vbar, cols, sigmoid, shift, span):
    """One client's additive pieces of ``F`` on its rated columns and the errors of the
    federated model ``u . vbar``: ``(fit, psi_rated, sq_rated, sse, sum |e|)``."""
    d = U.shape[1]
    fit = sse = ae = psi = sq = 0.0
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            q, j = pair[s], cols[pair[s]]
            z = 0.0
            zbar = 0.0
            for a in range(d):
                z += U[t, a] * P[q, a]
                zbar += U[t, a] * Vbar[j, a]
            if sigmoid:
                e = 1.0 / (1.0 + np.exp(-z)) - (data[s] + shift) / span
                ebar = span / (1.0 + np.exp(-zbar)) - shift - data[s]
            else:
                e = z - data[s]
                ebar = zbar - data[s]
            fit += e * e
            sse += ebar * ebar
            ae += abs(ebar)
    for q in range(P.shape[0]):
        j = cols[q]
        for a in range(d):
            psi += (P[q, a] - Vbar[j, a]) ** 2 - (W[j, a] - Vbar[j, a]) ** 2
            sq += P[q, a] ** 2 - W[j, a] ** 2
    return fit, psi, sq, sse, ae



@njit(cache=True, nogil=True)
def _errors_at(indptr, indices, data, U, Vbar, sigmoid, shift, span):
    """``(sum e^2, sum |e|)`` of the federated model ``u . vbar`` on the rating scale."""
    sse = ae = 0.0
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            z = 0.0
            for a in range(U.shape[1]):
                z += U[t, a] * Vbar[indices[s], a]
            if sigmoid:
                e = span / (1.0 + np.exp(-z)) - shift - data[s]
            else:
                e = z - data[s]
            sse += e * e
            ae += abs(e)
    return sse, ae

@njit(cache=True, nogil=True)
def _scatter_delta(acc, cols, values, base):
    """``acc[cols] += values - base[cols]`` (``cols`` unique)."""
    for q in range(cols.shape[0]):
        j = cols[q]
        for a in range(acc.shape[1]):
            acc[j, a] += values[q, a] - base[j, a]

@njit(cache=True, nogil=True)
def _sigmoid_fold_in(indptr, indices, data, Vt, alpha, shift, span, n_steps, out):
    """Row-wise ``argmin_u sum (y - sigmoid(u . v_j))^2 + alpha ||u||^2`` by damped
    Gauss-Newton from 0 (halving the step until the loss decreases)."""
    d = Vt.shape[1]
    H = np.empty((d, d))
    g = np.empty(d)
    for t in range(out.shape[0]):
        u = np.zeros(d)
        lo, hi = indptr[t], indptr[t + 1]
        for _ in range(n_steps):
            H[:, :] = 0.0
            g[:] = alpha * u
            loss = alpha * np.dot(u, u)
            for s in range(lo, hi):
                v = Vt[indices[s]]
                sg = 1.0 / (1.0 + np.exp(-np.dot(u, v)))
                e = sg - (data[s] + shift) / span
                loss += e * e
                w = sg * (1.0 - sg)
                for a in range(d):
                    g[a] += e * w * v[a]
                    for b in range(d):
                        H[a, b] += w * w * v[a] * v[b]
            for a in range(d):
                H[a, a] += alpha
            step = np.linalg.solve(H, g)
            rate = 1.0
            while rate > 1e-6:
                cand = u - rate * step
                new = alpha * np.dot(cand, cand)
                for s in range(lo, hi):
                    e = 1.0 / (1.0 + np.exp(-np.dot(cand, Vt[indices[s]])))
                    e -= (data[s] + shift) / span
                    new += e * e
                if new <= loss:
                    break
                rate *= 0.5
            if rate <= 1e-6:
                break
            u = cand
        out[t] = u


# ---- pure solver functions ------------------------------------------------------------------
def _coin(seed, k, p):
    """The shared coin ``zeta_k ~ Bernoulli(p)`` (1 = averaging branch); 0 for RFRec."""
    if p is None:
        return 0
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_COIN, k)))
    return int(rng.random() < p)


def _action(variant, schedule, coin):
    """What every client does in a round, from ``(zeta_{k-1}, zeta_k)`` (spec 3.2)."""
    if variant == "rfrec":
        return "step"
    prev, now = coin
    if schedule == "l2gd":  # (b): pull on every 1; a fresh Vbar first after a 0
        return "main" if now == 0 else ("pull" if prev == 1 else "upload_pull")
    # (a) Algorithm 2 literally: upload at 0->1, pull (instead of a step) at 1->0
    return {(0, 0): "main", (1, 0): "pull", (0, 1): "upload", (1, 1): "idle"}[(prev, now)]


def _optimize(x, g, opt, key, lr, optimizer):
    """One GD or Adam step on ``x``; Adam moments live in ``opt`` under ``key``."""
    if optimizer == "gd":
        return x - lr * g
    t = opt["t"]
    m = _B1 * opt["m" + key] + (1 - _B1) * g
    v = _B2 * opt["v" + key] + (1 - _B2) * g * g
    opt["m" + key], opt["v" + key] = m, v
    return x - (lr / (1 - _B1**t)) * m / (np.sqrt(v / (1 - _B2**t)) + _EPS)


def _shared_op(W, W_opt, Vbar, action, *, lr, reg, reg_v, p, eta, optimizer):
    """What every client does to the columns it has not rated (only psi and the ridge act)."""
    if action in ("pull", "upload_pull"):
        return W - eta * (W - Vbar), W_opt
    if action == "step":
        g = reg * (W - Vbar) + 2 * reg_v * W
    elif action == "main":
        g = (2 * reg_v / (1 - p)) * W
    else:
        return W, W_opt
    opt = None if W_opt is None else {**W_opt, "t": W_opt["t"] + 1}
    return _optimize(W, g, opt, "W", lr, optimizer), opt


def init_server(rng, *, n_items, n_components, init_std, p, optimizer):
    """``Vbar^0`` i.i.d. ``N(0, init_std^2)``; every client copy starts equal to it."""
    Vbar = init_std * rng.standard_normal((n_items, n_components))
    seed = int(rng.integers(np.iinfo(np.int64).max))
    W_opt = None
    if optimizer == "adam":
        W_opt = {"t": 0, "mW": np.zeros_like(Vbar), "vW": np.zeros_like(Vbar)}
    coin = (0, _coin(seed, 0, p))  # zeta_{-1} = 0
    state = {"Vbar": Vbar, "Vbar_prev": Vbar, "W": Vbar.copy(), "W_opt": W_opt, "seed": seed,
             "coin": coin, "comm_rounds": 0}
    return state, _Broadcast(Vbar, state["W"], W_opt, coin, True)


def init_client(block, bc, rng, *, init_std, optimizer):
    """``u_i^0 ~ N(0, init_std^2)``; the rated columns ``P`` start at ``Vbar^0``."""
    X = block.X
    cols, pair = np.unique(X.indices, return_inverse=True)
    U = init_std * rng.standard_normal((X.shape[0], bc.Vbar.shape[1]))
    P = bc.Vbar[cols].copy()
    opt = None
    if optimizer == "adam":
        opt = {"t": 0, "mU": np.zeros_like(U), "vU": np.zeros_like(U), "mP": np.zeros_like(P),
               "vP": np.zeros_like(P)}
    state = {"U": U, "P": P, "opt": opt, "cols": cols, "pair": pair.astype(np.intp),
             "pending": False}
    return state, None


def _pulled(state, bc, eta):
    """The rated columns after the pull that an upload round of ``l2gd`` left pending."""
    P = state["P"]
    if state["pending"]:
        P = P - eta * (P - bc.Vbar[state["cols"]])
    return P


def client_update(state, block, bc, rng, selected, *, variant, schedule, lr, reg, alpha_u,
                  reg_v, p, eta, optimizer, link, shift, span, clip_delta, noise_scale,
                  simulate):
    """One round of one client: local step or pull, and the upload of ``V_(c)`` if due."""
    X, cols = block.X, state["cols"]
    U, P = state["U"], _pulled(state, bc, eta)
    opt = None if state["opt"] is None else dict(state["opt"])
    action = _action(variant, schedule, bc.coin)
    if action in ("step", "main"):
        gU, gP = np.empty_like(U), np.empty_like(P)
        step = action == "step"  # else RFRecF's main update: grad f / (1 - p), no psi
        _client_grads(X.indptr, state["pair"], X.data, U, P, bc.Vbar, cols, link == "sigmoid",
                      shift, span, alpha_u, reg_v, reg if step else 0.0,
                      1.0 if step else 1 / (1 - p), gU, gP)
        if opt is not None:
            opt["t"] += 1
        U, P = _optimize(U, gU, opt, "U", lr, optimizer), _optimize(P, gP, opt, "P", lr, optimizer)
    elif action == "pull":
        P = P - eta * (P - bc.Vbar[cols])
    new_state = {**state, "U": U, "P": P, "opt": opt, "pending": action == "upload_pull"}
    if not selected or action not in ("step", "upload", "upload_pull"):
        return new_state, None
    if simulate:  # dense, clipped, noised per entry with this client's generator
        W = bc.W
        if action == "step":
            W = _shared_op(W, bc.W_opt, bc.Vbar, "step", lr=lr, reg=reg, reg_v=reg_v, p=p,
                           eta=eta, optimizer=optimizer)[0]
        V = W.copy()
        V[cols] = P
        V = clip_entries(V, clip_delta) if clip_delta else V
        return new_state, laplace_noise(V, noise_scale, rng) if noise_scale else V
    values = clip_entries(P, clip_delta) if clip_delta else P
    return new_state, ItemMatrixUpload(cols, values, bc.Vbar.shape[0], noise_scale)


def _aggregate(uploads, W, rng, *, clip_delta, noise_scale):
    """``Vbar = mean of the uploads`` (spec 8.4), noise summed exactly (spec 8.5)."""
    n = len(uploads)
    if isinstance(next(iter(uploads.values())), np.ndarray):
        total = np.zeros_like(W)
        for V in uploads.values():
            total += V
        return total / n
    base = clip_entries(W, clip_delta) if clip_delta else W
    acc = np.zeros_like(W)
    for up in uploads.values():
        _scatter_delta(acc, up.cols, up.values, base)
    Vbar = base + acc / n
    if noise_scale:
        Vbar += _laplace_mean(rng, n, noise_scale, W.shape)
    return Vbar


def _laplace_mean(rng, n, scale, shape):
    """The mean of ``n`` i.i.d. ``Laplace(0, scale)`` arrays, exactly, at O(size) cost.

    A Laplace variable is ``scale * (E1 - E2)`` with ``E1, E2 ~ Exp(1)``, so a sum of ``n`` is
    ``Gamma(n, scale) - Gamma(n, scale)``. (Belongs in ``sklearn_fedmf.privacy``.)
    """
    return (rng.gamma(n, scale, shape) - rng.gamma(n, scale, shape)) / n


def server_update(server_state, uploads, k, *, variant, schedule, lr, reg, reg_v, p, eta,
                  optimizer, clip_delta, noise_scale):
    """Replay the shared columns' step of round ``k``, average the uploads, draw the next coin.

    Called every round (``server_every_round``), with or without uploads.
    """
    s = server_state
    coin = s["coin"]
    action = _action(variant, schedule, coin)
    common = dict(lr=lr, reg=reg, reg_v=reg_v, p=p, eta=eta, optimizer=optimizer)
    W, W_opt = s["W"], s["W_opt"]
    if action != "upload_pull":  # l2gd pulls after the fresh average, below
        W, W_opt = _shared_op(W, W_opt, s["Vbar"], action, **common)
    Vbar = s["Vbar"]
    if uploads and action in ("step", "upload", "upload_pull"):
        rng = np.random.default_rng(np.random.SeedSequence(s["seed"], spawn_key=(_NOISE, k)))
        Vbar = _aggregate(uploads, W, rng, clip_delta=clip_delta, noise_scale=noise_scale)
    if action == "upload_pull":
        W, W_opt = _shared_op(W, W_opt, Vbar, action, **common)
    next_coin = (coin[1], _coin(s["seed"], k + 1, None if variant == "rfrec" else p))
    # Lemma 3.9's messages: RFRec sends Vbar every iteration; l2gd right after each upload
    # round; Algorithm 2 at each 1 -> 0 transition.
    if variant == "rfrec" or schedule == "l2gd":
        sent = action in ("step", "upload_pull")
        downloads = sent
    else:
        sent = next_coin == (1, 0)
        downloads = action == "pull"
    state = {**s, "Vbar": Vbar, "Vbar_prev": s["Vbar"], "W": W, "W_opt": W_opt,
             "coin": next_coin, "last_coin": coin[1],
             "comm_rounds": s["comm_rounds"] + bool(uploads) + downloads}
    return state, _Broadcast(Vbar, W, W_opt, next_coin, sent)


def client_metrics(state, block, bc, *, alpha_u, eta, link, shift, span):
    """Additive pieces of ``F`` (rated columns; the shared ones are added on the server),
    and the errors of the federated model ``u_i . vbar_j`` on the training and eval entries."""
    X, U, sigmoid = block.X, state["U"], link == "sigmoid"
    P = _pulled(state, bc, eta)
    fit, psi, sq, sse, ae = _client_sums(X.indptr, state["pair"], X.data, U, P, bc.W, bc.Vbar,
                                         state["cols"], sigmoid, shift, span)
    out = {"fit": fit, "reg_u": alpha_u * float(np.vdot(U, U)), "psi_rated": psi,
           "sq_rated": sq, "scale": float(np.vdot(X.data, X.data)) + X.nnz,
           "sse": sse, "ae": ae, "n": X.nnz, "eval_sse": 0.0, "eval_ae": 0.0, "eval_n": 0}
    Y = block.X_eval
    if Y is not None and Y.nnz:
        out["eval_sse"], out["eval_ae"] = _errors_at(Y.indptr, Y.indices, Y.data, U, bc.Vbar,
                                                     sigmoid, shift, span)
        out["eval_n"] = Y.nnz
    return out


def _diverged(what, lr, optimizer):
    return (
        f"{what[0].upper()}{what[1:]}; the iterates diverged. Lower learning_rate (now {lr}; "
        f"optimizer={optimizer!r}). Plain gradient descent needs learning_rate below about "
        "1 / L, the Lipschitz constant of the gradient, which grows with the number of ratings "
        "per user and per item: the paper's 0.05 / 0.025 are settings of the authors' Adam "
        "code, not safe gradient steps (optimizer='adam' is scale-free)."
    )


def combine_metrics(server_state, sums, *, n_clients, reg, alpha_v, lr, optimizer, variant):
    """``F`` at the current state (psi against the server's ``Vbar``), RMSEs, the gap."""
    s = server_state
    W, Vbar = s["W"], s["Vbar"]
    psi = 0.5 * (sums["psi_rated"] + n_clients * float(np.vdot(W - Vbar, W - Vbar)))
    ridge = alpha_v / n_clients * (sums["sq_rated"] + n_clients * float(np.vdot(W, W)))
    objective = sums["fit"] + sums["reg_u"] + ridge + reg * psi
    if not np.isfinite(objective) or objective > _EXPLODE * sums["scale"]:
        raise FloatingPointError(_diverged(
            f"the {variant} objective reached {objective:.4g} (ratings: sum r^2 + nnz = "
            f"{sums['scale']:.4g})", lr, optimizer))
    change = np.linalg.norm(Vbar - s["Vbar_prev"]) / max(np.linalg.norm(s["Vbar_prev"]), 1e-300)
    record = {
        "objective": objective,
        "train_rmse": float(np.sqrt(sums["sse"] / max(sums["n"], 1))),
        "consensus_gap": 2 * psi,
        "vbar_change": float(change),
        "comm_rounds": s["comm_rounds"],
    }
    if "last_coin" in s and variant == "rfrecf":
        record["coin"] = s["last_coin"]
    if sums["eval_n"]:
        record["eval_rmse"] = float(np.sqrt(sums["eval_sse"] / sums["eval_n"]))
        record["eval_mae"] = sums["eval_ae"] / sums["eval_n"]
    return record


def make_protocol(*, n_items, n_clients, n_components, variant, schedule, learning_rate,
                  reg_consensus, alpha_u, alpha_v, p, pull_eta, optimizer, link, shift, span,
                  init_std, clip_delta, noise_scale, simulate_uploads):
    """Bind the hyperparameters to the pure functions above (``alpha_v`` is split 1/N)."""
    p = None if variant == "rfrec" else p
    eta = None if p is None else (learning_rate * reg_consensus / p if pull_eta is None
                                  else pull_eta)
    step = dict(lr=learning_rate, reg=reg_consensus, reg_v=alpha_v / n_clients, p=p, eta=eta,
                optimizer=optimizer)
    privacy = dict(clip_delta=clip_delta, noise_scale=noise_scale)
    link_ = dict(link=link, shift=shift, span=span)
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items, n_components=n_components,
                            init_std=init_std, p=p, optimizer=optimizer),
        init_client=partial(init_client, init_std=init_std, optimizer=optimizer),
        client_update=partial(client_update, variant=variant, schedule=schedule,
                              alpha_u=alpha_u, simulate=simulate_uploads, **step, **privacy,
                              **link_),
        server_update=partial(server_update, variant=variant, schedule=schedule, **step,
                              **privacy),
        client_metrics=partial(client_metrics, alpha_u=alpha_u, eta=eta, **link_),
        combine_metrics=partial(combine_metrics, n_clients=n_clients, reg=reg_consensus,
                                alpha_v=alpha_v, lr=learning_rate,
                                optimizer=optimizer, variant=variant),
        update_all=True,  # every client steps each round; only uploads are sampled or lost
        broadcast_to_all=True,
        server_every_round=True,
        dropout_mode="upload_loss",
    )


# ---- estimator ----------------------------------------------------------------------------
class RFRec(FederatedMFBase):
    """Regularized federated recommendation: RFRec and RFRecF (Liu et al., CIKM 2024).

    Each client keeps its users' vectors and its own copy ``V_(c)`` of the item matrix, tied to
    the server's average ``Vbar`` by the consensus penalty ``reg_consensus``. ``"rfrec"`` takes
    one gradient step on the regularized problem per round and averages (Algorithm 1);
    ``"rfrecf"`` flips a shared coin each round between a local step on the fit and a pull
    towards ``Vbar`` (Algorithm 2), and communicates only when the coin changes. A client only
    ever sends its item matrix (``n_items x n_components``); predictions use the user vectors
    and ``Vbar`` (``components_``). By default every user is its own client, as in the paper.

    Parameters
    ----------
    n_components : int, default=20
        Latent dimension ``d``.
    variant : {"rfrec", "rfrecf"}, default="rfrec"
    reg_consensus : float, default=10.0
        The paper's ``lambda``, multiplying ``1/2 sum_c ||V_(c) - Vbar||^2``. The authors' code
        has no 1/2: its ``lam_L = 10`` is ``reg_consensus=20``. Large values tie every copy to
        ``Vbar`` (the gap shrinks like ``1 / lambda``); 0 gives independent local models.
    learning_rate : float, default=0.05
        Step ``alpha`` (the paper: 0.05 for RFRec, 0.025 for RFRecF). With ``optimizer="gd"``
        it must stay below about ``1 / L``, which grows with the ratings per user and item: on
        MovieLens use about 0.005 or ``optimizer="adam"``. A diverging run raises
        ``FloatingPointError`` naming this parameter instead of returning NaN factors.
    optimizer : {"gd", "adam"}, default="gd"
        Exact gradient steps (the paper's algorithms) or Adam with per-client moments
        (beta 0.9/0.999, eps 1e-8; the authors' code, with ``learning_rate=0.1``).
    link : {"identity", "sigmoid"}, default="identity"
        ``r = u . v`` (the paper), or the code's ``r = lo + (hi - lo) sigmoid(u . v)`` fitted
        on ratings min-max scaled with the training range (``center`` then has no effect).
    p : float, default=0.5
        RFRecF's probability of the averaging branch.
    schedule : {"l2gd", "algorithm2"}, default="l2gd"
        RFRecF's iteration: the unbiased form the theorems analyse (every coin 1 pulls; a fresh
        ``Vbar`` after a 0; 2 messages per 0 -> 1 transition), or the pseudo-code literally
        (upload at 0 -> 1, pull instead of a step at 1 -> 0).
    pull_eta : float or None, default=None
        Pull strength ``eta``; None is ``learning_rate * reg_consensus / p``. The code uses 1
        (copy := ``Vbar``). A value above 1 overshoots and warns.
    n_clients : int or None, default=None
        None: one client per user (the paper). An int groups the users into that many clients
        (``partition``); the code used 200 contiguous groups.
    partition : {"random", "contiguous"}, default="random"
    clients_per_round : int, float or None, default=None
        Clients whose upload is used each round (a fresh random subset). The others still step
        and receive ``Vbar``; their upload is lost (spec 4.1).
    max_iter : int, default=100
        Iterations ``K`` (for RFRecF, coin flips; messages happen on some of them only).
    tol : float, default=0.0
        Stop when the relative change of the objective falls below ``tol``.
    alpha_u : float, default=0.1
        ``lambda_u`` on ``sum_i ||u_i||^2``; also the fold-in ridge of ``transform``.
    alpha_v : float, default=0.0
        ``lambda_v``: ``(alpha_v / N) ||V_(c)||^2`` per client (``alpha_v ||V||^2`` at
        consensus). The paper uses 0; then ``F`` has no minimizer (the scales of ``U`` and
        ``V`` drift), which a positive value removes.
    init_std : float, default=0.01
        Standard deviation of the Gaussian initialization of ``u_i`` and ``Vbar^0``.
    clip_delta, noise_scale : float or None, default=None
        Privacy (spec 4.2): each upload is ``clip(V_(c), delta) + Laplace(noise_scale)`` per
        entry. ``epsilon_ = 2 delta / s`` is per entry and per upload: a whole upload costs
        ``n_items * d`` times that, and uploads compose over rounds. Without noise, uploads
        reveal which items a client rated (its copy differs from ``Vbar`` only there).
    simulate_uploads : bool, default=False
        Send dense per-client matrices with per-client noise (tiny problems, audits); by
        default uploads are sparse views and the noise is summed exactly on the server.
    center : bool, default=True
        Subtract the training mean before factorizing; ``False`` is the paper's objective.
    clip : bool, default=False
        Clip predictions to the training rating range.
    dropout : float, default=0.0
        Probability that a sampled client's upload is lost in a round (it still steps and
        receives ``Vbar``: the upload-loss model of Table 3).
    eval_every, callback, warm_start, random_state, n_jobs, verbose
        As in :class:`~sklearn_fedmf.FedMCADMM`.

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_items)
        The server's averaged item matrix ``Vbar``.
    user_factors_ : ndarray of shape (n_users, n_components)
        The federated user vectors (kept for analysis; they never leave a client).
    mean_ : float
    rating_range_ : tuple of float
    n_iter_ : int
    comm_rounds_ : int
        One-way communication rounds (Definition 3.8), counted as in Lemma 3.9.
    epsilon_ : float or None
        ``2 clip_delta / noise_scale``, per entry and per upload.
    n_clients_ : int
    clients_ : ndarray of shape (n_users,)
    history_ : list of dict
        Per round: ``objective`` (``F``, with ``psi`` against the server's ``Vbar``),
        ``train_rmse``, ``eval_rmse``/``eval_mae`` (``eval_set``, federated factors),
        ``consensus_gap`` (``sum_c ||V_(c) - Vbar||^2``), ``vbar_change``, ``comm_rounds``,
        ``coin`` (RFRecF), bytes, ``n_sampled``, ``n_failed``, ``seconds``.
    n_features_in_ : int

    Notes
    -----
    Every engine client is one paper client; its state is its users' vectors and its rated
    columns, so memory is ``O((n_users + nnz) d)`` instead of ``N n_items d`` (spec 8).

    References
    ----------
    L. Liu, W. Wang, X. Zhao et al. Efficient and Robust Regularized Federated
    Recommendation. CIKM 2024. doi:10.1145/3627673.3679682.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf import RFRec
    >>> rng = np.random.default_rng(0)
    >>> M = rng.normal(size=(40, 2)) @ rng.normal(size=(2, 15))
    >>> X = np.where(rng.random(M.shape) < 0.6, M, np.nan)
    >>> model = RFRec(n_components=2, learning_rate=0.01, max_iter=300, alpha_u=0.01,
    ...               random_state=0).fit(X)
    >>> bool(model.score(X) > -0.3)
    True
    """

    _parameter_constraints: dict = {
        **{k: FederatedMFBase._parameter_constraints[k] for k in (
            "n_components", "partition", "clients_per_round", "max_iter", "tol", "alpha_u",
            "alpha_v", "center", "clip", "dropout", "eval_every", "callback", "warm_start",
            "random_state", "n_jobs", "verbose")},
        "n_clients": [Interval(Integral, 1, None, closed="left"), None],
        "variant": [StrOptions({"rfrec", "rfrecf"})],
        "reg_consensus": [Interval(Real, 0, None, closed="left")],
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "optimizer": [StrOptions({"gd", "adam"})],
        "link": [StrOptions({"identity", "sigmoid"})],
        "p": [Interval(Real, 0, 1, closed="neither")],
        "schedule": [StrOptions({"l2gd", "algorithm2"})],
        "pull_eta": [Interval(Real, 0, None, closed="neither"), None],
        "init_std": [Interval(Real, 0, None, closed="neither")],
        "clip_delta": [Interval(Real, 0, None, closed="neither"), None],
        "noise_scale": [Interval(Real, 0, None, closed="left"), None],
        "simulate_uploads": ["boolean"],
    }

    def __init__(
        self,
        n_components=20,
        *,
        variant="rfrec",
        reg_consensus=10.0,
        learning_rate=0.05,
        optimizer="gd",
        link="identity",
        p=0.5,
        schedule="l2gd",
        pull_eta=None,
        n_clients=None,
        partition="random",
        clients_per_round=None,
        max_iter=100,
        tol=0.0,
        alpha_u=0.1,
        alpha_v=0.0,
        init_std=0.01,
        clip_delta=None,
        noise_scale=None,
        simulate_uploads=False,
        center=True,
        clip=False,
        dropout=0.0,
        eval_every=1,
        callback=None,
        warm_start=False,
        random_state=None,
        n_jobs=None,
        verbose=0,
    ):
        self.n_components = n_components
        self.variant = variant
        self.reg_consensus = reg_consensus
        self.learning_rate = learning_rate
        self.optimizer = optimizer
        self.link = link
        self.p = p
        self.schedule = schedule
        self.pull_eta = pull_eta
        self.n_clients = n_clients
        self.partition = partition
        self.clients_per_round = clients_per_round
        self.max_iter = max_iter
        self.tol = tol
        self.alpha_u = alpha_u
        self.alpha_v = alpha_v
        self.init_std = init_std
        self.clip_delta = clip_delta
        self.noise_scale = noise_scale
        self.simulate_uploads = simulate_uploads
        self.center = center
        self.clip = clip
        self.dropout = dropout
        self.eval_every = eval_every
        self.callback = callback
        self.warm_start = warm_start
        self.random_state = random_state
        self.n_jobs = n_jobs
        self.verbose = verbose

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, *, clients=None, eval_set=None):
        """Run the federation on the rating matrix ``X``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_users, n_items)
            Training ratings: sparse (every stored entry observed) or dense with NaN missing.
        y : Ignored
        clients : array-like of shape (n_users,), default=None
            Client label of each row; None means one client per user unless ``n_clients``.
        eval_set : {array-like, sparse matrix} of shape (n_users, n_items), default=None
            Held-out ratings of the same rows, scored every round with ``u_i . vbar_j``.

        Returns
        -------
        self : RFRec
        """
        if clients is None and self.n_clients is None:
            clients = np.arange(_num_samples(X))
        self._check_privacy()
        eta = self.pull_eta
        if self.variant == "rfrecf" and eta is None:
            eta = self.learning_rate * self.reg_consensus / self.p
        if self.variant == "rfrecf" and eta > 1:
            warnings.warn(
                f"The pull strength eta = {eta:.3g} exceeds 1 (learning_rate * reg_consensus "
                "/ p by default): each pull overshoots Vbar. Lower learning_rate or set "
                "pull_eta <= 1.", UserWarning, stacklevel=2,
            )
        self._fit(X, clients, eval_set)
        self._check_diverged(X)
        self.comm_rounds_ = self._federation.server_state["comm_rounds"]
        self.epsilon_ = (laplace_epsilon(self.noise_scale, 2 * self.clip_delta)
                         if self.clip_delta and self.noise_scale else None)
        return self

    def _check_diverged(self, X):
        """Raise unless the federated model's training error is finite and of the ratings'
        order (the objective is only checked on evaluated rounds, ``eval_every``)."""
        Xc = _shift(self._check_X(X), self.mean_ if self.center else 0.0)
        rows = np.repeat(np.arange(Xc.shape[0]), np.diff(Xc.indptr))
        z = np.einsum("ij,ji->i", self.user_factors_[rows], self.components_[:, Xc.indices])
        with np.errstate(all="ignore"):
            rmse = np.sqrt(np.mean((self._to_ratings(z) - Xc.data) ** 2))
        lo, hi = self.rating_range_
        if not rmse <= _EXPLODE * (hi - lo + 1):
            raise FloatingPointError(_diverged(
                f"the training RMSE of the federated model is {rmse:.4g} for ratings in "
                f"[{lo:g}, {hi:g}]", self.learning_rate, self.optimizer))

    def _check_privacy(self):
        if self.noise_scale and not self.clip_delta:
            warnings.warn(
                "noise_scale without clip_delta: nothing bounds an entry of the upload, so the "
                "Laplace noise gives no formal guarantee (epsilon_ is None).",
                PrivacyWarning, stacklevel=3,
            )

    def _make_protocol(self, n_items, n_clients):
        offset = self.mean_ if self.center else 0.0
        lo, hi = self.rating_range_
        return make_protocol(
            n_items=n_items, n_clients=n_clients, n_components=self.n_components,
            variant=self.variant, schedule=self.schedule, learning_rate=self.learning_rate,
            reg_consensus=self.reg_consensus, alpha_u=self.alpha_u, alpha_v=self.alpha_v,
            p=self.p, pull_eta=self.pull_eta, optimizer=self.optimizer, link=self.link,
            shift=offset - lo, span=(hi - lo) or 1.0, init_std=self.init_std,
            clip_delta=self.clip_delta, noise_scale=self.noise_scale or 0.0,
            simulate_uploads=self.simulate_uploads,
        )

    def _read_components(self, server_state, broadcast):
        return np.ascontiguousarray(server_state["Vbar"].T)

    def _read_user_factors(self, client_state):
        return client_state["U"]

    # ---- fold-in and prediction through the link ----------------------------------------
    def _link_params(self):
        lo, hi = self.rating_range_
        return (self.mean_ if self.center else 0.0) - lo, (hi - lo) or 1.0

    def _fold_in(self, Xc):
        """Each row's ``argmin_u sum_j (r_ij - link(u . vbar_j))^2 + alpha_u ||u||^2``."""
        Vt = np.ascontiguousarray(self.components_.T, dtype=np.float64)
        U = np.zeros((Xc.shape[0], Vt.shape[1]))
        if self.link == "identity":  # the ridge system, exact
            ridge_fold_in(Xc.indptr, Xc.indices, Xc.data, Vt, self.alpha_u, U)
        else:
            shift, span = self._link_params()
            _sigmoid_fold_in(Xc.indptr, Xc.indices, Xc.data, Vt, self.alpha_u, shift, span,
                             50, U)
        return U

    def _to_ratings(self, Z):
        """Scores ``u . v`` to ratings (the shifted scale plus the offset)."""
        offset = self.mean_ if self.center else 0.0
        if self.link == "identity":
            return Z + offset
        lo, hi = self.rating_range_
        return lo + (hi - lo) / (1 + np.exp(-Z))

    def inverse_transform(self, X):
        """Ratings from user factors: ``link(X @ components_)``."""
        check_is_fitted(self)
        return self._to_ratings(np.asarray(X) @ self.components_)

    def predict(self, X):
        """Predicted ratings for the rows of ``X`` (dense, ``(n_rows, n_items)``) by fold-in.

        Rows with no observed entry predict the training mean ``mean_``.
        """
        if self.link == "identity":
            return super().predict(X)
        Xc = self._check_X(X)
        P = self._to_ratings(self._fold_in(Xc) @ self.components_)
        P[np.diff(Xc.indptr) == 0] = self.mean_
        return self._clip(P)

    def score(self, X, y=None):
        """Negative RMSE of the fold-in predictions (see ``FederatedMFBase.score``)."""
        if self.link == "identity":
            return super().score(X, y)
        pred = self.predict(X)
        offset = self.mean_ if self.center else 0.0
        if y is None or (not sp.issparse(y) and np.ndim(y) == 1):
            target = _shift(self._check_X(X), offset)  # back to the rating scale
        else:
            target = check_like(y, self._check_X(X), name="y")
        if target.nnz == 0:
            raise ValueError("There is no rating to score: the evaluated matrix is empty.")
        rows = np.repeat(np.arange(target.shape[0]), np.diff(target.indptr))
        return -float(np.sqrt(np.mean((pred[rows, target.indices] - target.data) ** 2)))
