"""The pure functions of RFRec / RFRecF (:class:`~sklearn_fedmf.RFRec`): the messages, the
shared coin, the client and server steps, the metrics and ``make_protocol``, which binds them
into the engine's :class:`~sklearn_fedmf._engine.FederatedProtocol`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from .._engine import Broadcast, FederatedProtocol, Participation
from ..privacy import clip_entries, laplace_noise
from ._rfrec_kernels import _client_grads, _client_sums, _errors_at, _scatter_delta

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
    ``noise_scale > 0`` the per-entry Laplace noise is drawn in aggregate by the server (exact in
    distribution: a sum of Laplace draws is drawn as one); ``simulate_uploads=True`` sends dense
    noisy arrays instead.
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
class _Replica:
    """What every client holds or derives itself: the simulation part of a broadcast.

    ``Vbar`` is the average the client last received (the broadcast's message, when one is
    sent); ``W``/``W_opt`` are the columns every client shares and their Adam moments (each
    client would compute them itself from the ``Vbar`` sequence); ``coin`` is
    ``(zeta_{k-1}, zeta_k)`` for the coming round, common randomness from a shared seed.
    """

    Vbar: np.ndarray
    W: np.ndarray
    W_opt: dict | None
    coin: tuple


def _broadcast(Vbar, W, W_opt, coin, sent):
    """``Vbar`` as the counted message when the server sends it; the rest uncounted."""
    return Broadcast(Vbar if sent else None, _Replica(Vbar, W, W_opt, coin))


# ---- pure solver functions ------------------------------------------------------------------
def _coin(seed, k, p):
    """The shared coin ``zeta_k ~ Bernoulli(p)`` (1 = averaging branch); 0 for RFRec."""
    if p is None:
        return 0
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_COIN, k)))
    return int(rng.random() < p)


def _action(variant, schedule, coin):
    """What every client does in a round, from ``(zeta_{k-1}, zeta_k)`` (Algorithm 2's coins)."""
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
    return state, _broadcast(Vbar, state["W"], W_opt, coin, True)


def init_client(block, broadcast, rng, *, init_std, optimizer):
    """``u_i^0 ~ N(0, init_std^2)``; the rated columns ``P`` start at ``Vbar^0``."""
    bc = broadcast.simulation
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


def client_update(state, block, broadcast, rng, selected, *, variant, schedule, lr, reg,
                  alpha_u, reg_v, p, eta, optimizer, link, shift, span, clip_delta, noise_scale,
                  simulate):
    """One round of one client: local step or pull, and the upload of ``V_(c)`` if due."""
    bc = broadcast.simulation
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
    """``Vbar = mean of the uploads`` (Algorithm 1's aggregation), noise summed exactly."""
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

    Called every round (``Participation(server_update="every_round")``), with or without
    uploads.
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
    return state, _broadcast(Vbar, W, W_opt, next_coin, sent)


def client_metrics(state, block, broadcast, *, alpha_u, eta, link, shift, span):
    """Additive pieces of ``F`` (rated columns; the shared ones are added on the server),
    and the errors of the federated model ``u_i . vbar_j`` on the training and eval entries."""
    bc = broadcast.simulation
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
        # every client steps each round; only uploads are sampled or lost (Section 3.3)
        participation=Participation(computes="all", receives="all", dropped="upload_lost",
                                    server_update="every_round"),
    )
