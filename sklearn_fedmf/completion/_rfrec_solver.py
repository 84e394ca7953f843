"""The pure functions of RFRec / RFRecF (:class:`~sklearn_fedmf.RFRec`): the messages, the
shared coin, the client and server steps, the metrics and ``make_protocol``, which binds them
into the engine's :class:`~sklearn_fedmf._engine.FederatedProtocol`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from .. import _biases
from .._engine import Broadcast, FederatedProtocol, Participation
from .._groups import BatchedPhases
from .._transport import client_generator
from ..privacy import clip_entries, laplace_noise, mean_laplace_noise
from ._rfrec_kernels import (
    _NOTHING,
    _PULL,
    _STEP,
    _client_grads,
    _client_sums,
    _errors_at,
    _group_sums,
    _group_update,
    _scatter_delta,
)

_B1, _B2, _EPS = 0.9, 0.999, 1e-8  # Adam, as in torch (the authors' code)
_COIN, _NOISE = 0, 1  # spawn keys of the server's streams
_EXPLODE = 1e4  # objective above this many times sum(r^2) + nnz: the step size is too large
# learning_rate="auto" (plain GD): each block steps AUTO_SAFETY / L with L its curvature bound
# at the current iterate, L a Gershgorin bound of the Hessian (see auto_steps), so that
# the preconditioned Hessian has its eigenvalues in (0, 1]: below the limit 2.
AUTO_SAFETY = 1.0
# Curvature of (sigmoid(z) - y)^2 over that of (z - y)^2: (2 s'^2 + 2 |s''|) / 2 <= 0.16.
_SIGMOID_CURVATURE = 0.16


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


def _shared_op(W, W_opt, Vbar, action, *, lr, reg, reg_v, p, eta, optimizer, biased=False):
    """What every client does to the columns it has not rated (only psi and the ridge act)."""
    if action in ("pull", "upload_pull"):
        return W - eta * (W - Vbar), W_opt
    if action == "step":
        g = reg * (W - Vbar) + 2 * reg_v * W
        curvature = reg + 2 * reg_v
    elif action == "main":
        g = (2 * reg_v / (1 - p)) * W
        curvature = 2 * reg_v / (1 - p)
    else:
        return W, W_opt
    if lr is None:  # "auto": these columns' Hessian is curvature * I
        lr = AUTO_SAFETY / max(curvature, 1e-12)
    opt = None if W_opt is None else {**W_opt, "t": W_opt["t"] + 1}
    W = _optimize(W, g, opt, "W", lr, optimizer)
    return (_biases.fix_item(W) if biased else W), opt


def init_server(rng, *, n_items, n_components, init_std, p, optimizer, biased=False):
    """``Vbar^0`` i.i.d. ``N(0, init_std^2)``; every client copy starts equal to it. With
    biases ``[Vbar^0; 1; 0]``: every step below is followed by the projection of the fixed
    entries onto 1 (the prox of their indicator), so the steps are projected gradient steps."""
    Vbar = init_std * rng.standard_normal((n_items, n_components))
    if biased:
        _biases.init_item(Vbar)
    seed = int(rng.integers(np.iinfo(np.int64).max))
    W_opt = None
    if optimizer == "adam":
        W_opt = {"t": 0, "mW": np.zeros_like(Vbar), "vW": np.zeros_like(Vbar)}
    coin = (0, _coin(seed, 0, p))  # zeta_{-1} = 0
    state = {"Vbar": Vbar, "Vbar_prev": Vbar, "W": Vbar.copy(), "W_opt": W_opt, "seed": seed,
             "coin": coin, "comm_rounds": 0}
    return state, _broadcast(Vbar, state["W"], W_opt, coin, True)


def init_client(block, broadcast, rng, *, init_std, optimizer, biased=False):
    """``u_i^0 ~ N(0, init_std^2)``; the rated columns ``P`` start at ``Vbar^0``."""
    bc = broadcast.simulation
    X = block.X
    cols, pair = np.unique(X.indices, return_inverse=True)
    U = init_std * rng.standard_normal((X.shape[0], bc.Vbar.shape[1]))
    if biased:
        _biases.init_user(U)
    P = bc.Vbar[cols].copy()
    opt = None
    if optimizer == "adam":
        opt = {"t": 0, "mU": np.zeros_like(U), "vU": np.zeros_like(U), "mP": np.zeros_like(P),
               "vP": np.zeros_like(P)}
    state = {"U": U, "P": P, "opt": opt, "cols": cols, "pair": pair.astype(np.intp),
             "pending": False}
    return state, None


def auto_steps(X, pair, U, P, *, alpha_u, reg_v, reg, scale, sigmoid):
    """``learning_rate="auto"``: per-user and per-rated-column steps ``AUTO_SAFETY / L``.

    ``L`` is a Gershgorin bound on the rows of the Hessian of the client's objective at the
    current iterate that belong to the block, cross terms included, since ``u_i`` and
    ``v_(c)j`` move together. A rating ``(i, j)`` with residual ``e`` adds
    ``||v_j||^2 + ||u_i|| ||v_j|| + |e|`` to the bound of ``u_i`` (times 2, and times 0.16
    through the sigmoid link) and ``||u_i||^2 + ||u_i|| ||v_j|| + |e|`` to that of
    ``v_(c)j``; the ridges add ``2 alpha_u``, ``2 reg_v`` and the consensus ``reg``. A user
    with many ratings gets a short step and a user with few a long one, so no single step has
    to fit both (a scalar step below ``1 / max L`` barely moves the light users in 100
    rounds), and the residual term keeps the first steps from small factors short. Returns the
    steps as columns that broadcast against ``U`` and ``P``.
    """
    rows = np.repeat(np.arange(U.shape[0]), np.diff(X.indptr))
    data_curv = 2.0 * scale * (_SIGMOID_CURVATURE if sigmoid else 1.0)
    u_norm = np.sqrt(np.einsum("ij,ij->i", U, U))[rows]
    v_norm = np.sqrt(np.einsum("ij,ij->i", P, P))[pair]
    z = np.einsum("ij,ij->i", U[rows], P[pair])
    if sigmoid:  # (the fitted target is on the [0, 1] scale there; |e| <= 1)
        residual = np.ones_like(z)
    else:
        residual = np.abs(z - X.data)
    cross = u_norm * v_norm + residual
    L_u = data_curv * np.bincount(rows, weights=v_norm**2 + cross, minlength=U.shape[0])
    L_u += 2.0 * scale * alpha_u
    L_p = data_curv * np.bincount(pair, weights=u_norm**2 + cross, minlength=P.shape[0])
    L_p += 2.0 * scale * reg_v + reg
    return (AUTO_SAFETY / np.maximum(L_u, 1e-12))[:, None], \
        (AUTO_SAFETY / np.maximum(L_p, 1e-12))[:, None]


def pull_strength(learning_rate, reg_consensus, reg_v, p, pull_eta):
    """RFRecF's ``eta``: ``pull_eta``, else ``learning_rate * reg_consensus / p``; with the
    "auto" step (``learning_rate=None``) the shared columns' step ``AUTO_SAFETY / (reg +
    2 reg_v)`` stands for ``learning_rate``, capped so that a pull never overshoots ``Vbar``."""
    if pull_eta is not None:
        return pull_eta
    if learning_rate is None:
        return min(1.0, AUTO_SAFETY * reg_consensus / max(reg_consensus + 2 * reg_v, 1e-12) / p)
    return learning_rate * reg_consensus / p


def _pulled(state, bc, eta):
    """The rated columns after the pull that an upload round of ``l2gd`` left pending."""
    P = state["P"]
    if state["pending"]:
        P = P - eta * (P - bc.Vbar[state["cols"]])
    return P


def _pulled_group(gs, bc, eta):
    """A group's rated columns after the pulls left pending (:func:`_pulled` per client);
    the group's own array when none is."""
    if not gs["pending"].any():
        return gs["P"]
    pend = np.repeat(gs["pending"], np.diff(gs["pair_ptr"]))
    P = gs["P"].copy()
    P[pend] = P[pend] - eta * (P[pend] - bc.Vbar[gs["cols"][pend]])
    return P


def client_update(state, block, broadcast, rng, selected, *, variant, schedule, lr, reg,
                  alpha_u, reg_v, p, eta, optimizer, link, shift, span, clip_delta, noise_scale,
                  simulate, biased=False):
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
        lr_u = lr_p = lr
        if lr is None:
            lr_u, lr_p = auto_steps(X, state["pair"], U, P, alpha_u=alpha_u, reg_v=reg_v,
                                    reg=reg if step else 0.0,
                                    scale=1.0 if step else 1 / (1 - p),
                                    sigmoid=link == "sigmoid")
        U = _optimize(U, gU, opt, "U", lr_u, optimizer)
        P = _optimize(P, gP, opt, "P", lr_p, optimizer)
        if biased:  # (a pull keeps the ones: it mixes P with Vbar, both 1 there)
            _biases.fix_user(U), _biases.fix_item(P)
    elif action == "pull":
        P = P - eta * (P - bc.Vbar[cols])
    new_state = {**state, "U": U, "P": P, "opt": opt, "pending": action == "upload_pull"}
    if not selected or action not in ("step", "upload", "upload_pull"):
        return new_state, None
    return new_state, _upload(bc, cols, P, rng, action, simulate=simulate, lr=lr, reg=reg,
                              reg_v=reg_v, p=p, eta=eta, optimizer=optimizer, biased=biased,
                              clip_delta=clip_delta, noise_scale=noise_scale)


def _upload(bc, cols, P, rng, action, *, simulate, lr, reg, reg_v, p, eta, optimizer, biased,
            clip_delta, noise_scale):
    """A client's upload ``V_(c)``: its rated columns ``P`` over the shared ones (clipped),
    or with ``simulate`` the dense matrix, clipped and noised with the client's generator."""
    if simulate:
        W = bc.W
        if action == "step":
            W = _shared_op(W, bc.W_opt, bc.Vbar, "step", lr=lr, reg=reg, reg_v=reg_v, p=p,
                           eta=eta, optimizer=optimizer, biased=biased)[0]
        V = W.copy()
        V[cols] = P
        V = clip_entries(V, clip_delta) if clip_delta else V
        return laplace_noise(V, noise_scale, rng) if noise_scale else V
    values = clip_entries(P, clip_delta) if clip_delta else P
    return ItemMatrixUpload(cols, values, bc.Vbar.shape[0], noise_scale)


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
        Vbar += mean_laplace_noise(n, noise_scale, W.shape, rng)
    return Vbar


def server_update(server_state, uploads, k, *, variant, schedule, lr, reg, reg_v, p, eta,
                  optimizer, clip_delta, noise_scale, biased=False):
    """Replay the shared columns' step of round ``k``, average the uploads, draw the next coin.

    Called every round (``Participation(server_update="every_round")``), with or without
    uploads.
    """
    s = server_state
    coin = s["coin"]
    action = _action(variant, schedule, coin)
    common = dict(lr=lr, reg=reg, reg_v=reg_v, p=p, eta=eta, optimizer=optimizer,
                  biased=biased)
    W, W_opt = s["W"], s["W_opt"]
    if action != "upload_pull":  # l2gd pulls after the fresh average, below
        W, W_opt = _shared_op(W, W_opt, s["Vbar"], action, **common)
    Vbar = s["Vbar"]
    if uploads and action in ("step", "upload", "upload_pull"):
        rng = np.random.default_rng(np.random.SeedSequence(s["seed"], spawn_key=(_NOISE, k)))
        Vbar = _aggregate(uploads, W, rng, clip_delta=clip_delta, noise_scale=noise_scale)
        if biased:  # (noise or clipping may have moved the public ones)
            _biases.fix_item(Vbar)
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


def client_metrics(state, block, broadcast, *, alpha_u, eta, link, shift, span, biased=False):
    """Additive pieces of ``F`` (rated columns; the shared ones are added on the server),
    and the errors of the federated model ``u_i . vbar_j`` on the training and eval entries."""
    bc = broadcast.simulation
    X, U, sigmoid = block.X, state["U"], link == "sigmoid"
    P = _pulled(state, bc, eta)
    fit, psi, sq, sse, ae = _client_sums(X.indptr, state["pair"], X.data, U, P, bc.W, bc.Vbar,
                                         state["cols"], sigmoid, shift, span)
    return _metrics(fit, psi, sq, sse, ae, U, X, block.X_eval, bc.Vbar, alpha_u=alpha_u,
                    sigmoid=sigmoid, shift=shift, span=span, biased=biased)


def _metrics(fit, psi, sq, sse, ae, U, X, Y, Vbar, *, alpha_u, sigmoid, shift, span, biased):
    """The metric record of the rows ``U`` (ratings ``X``, held-out ``Y``) from the sums of
    their rated columns."""
    U_reg = _biases.free_user(U) if biased else U  # (the fixed ones carry no penalty)
    out = {"fit": fit, "reg_u": alpha_u * float(np.vdot(U_reg, U_reg)), "psi_rated": psi,
           "sq_rated": sq, "scale": float(np.vdot(X.data, X.data)) + X.nnz,
           "sse": sse, "ae": ae, "n": X.nnz, "eval_sse": 0.0, "eval_ae": 0.0, "eval_n": 0}
    if Y is not None and Y.nnz:
        out["eval_sse"], out["eval_ae"] = _errors_at(Y.indptr, Y.indices, Y.data, U, Vbar,
                                                     sigmoid, shift, span)
        out["eval_n"] = Y.nnz
    return out


# ---- batched clients: a whole ClientGroup per call (_groups.BatchedPhases) ---------------
# A group state stacks its clients' per-client states: ``U`` (rows in ``group.rows`` order),
# ``P`` (the rated columns, client after client, each client's ascending as ``np.unique``
# gives them), ``cols`` (their items), ``pair`` (each stored entry's row of ``P``; empty when
# every client has one row, so that entry ``s`` is pair ``s``), ``pair_ptr`` (client ``i``'s
# pairs are ``pair_ptr[i]:pair_ptr[i + 1]``), ``pending`` and ``opt`` (Adam's ``t`` per
# client and the moments stacked like ``U`` and ``P``). Memory is ``O((n_rows + nnz) d)``
# for the group, with no object per client.
#
# client_update changes the group's arrays in place: RFRec's state is the clients' rated
# columns, ``nnz * d`` numbers, and a fresh copy per round would double the memory of the
# fit. The contract's guarantee holds as far as the state update goes: its allocations precede
# the one compiled call that writes, which cannot raise, so only a failure while the uploads
# are built afterwards (out of memory) could leave a group stepped. An upload's ``values``
# are a read-only view of the client's rows of ``P`` (a copy per round would hold the whole
# ``P`` twice more while the engine keeps the previous round's uploads):
# they are the upload during its round, server update and callback; a callback that keeps
# uploads across rounds copies them.
_ACTION_CODE = {"step": _STEP, "main": _STEP, "pull": _PULL}


def _group_layout(group):
    """``(cols, pair, pair_ptr)`` of a group's stacked rated columns (see above)."""
    X = group.X
    owner = np.repeat(np.arange(group.n_clients, dtype=np.int64), np.diff(group.entry_ptr))
    keys = owner * X.shape[1] + X.indices
    if np.all(keys[1:] > keys[:-1]):  # one row per client: a pair per entry
        return X.indices, np.empty(0, dtype=np.intp), group.entry_ptr.astype(np.intp)
    uniq, inverse = np.unique(keys, return_inverse=True)
    pair_ptr = np.searchsorted(uniq, np.arange(group.n_clients + 1) * X.shape[1])
    return ((uniq % X.shape[1]).astype(X.indices.dtype), inverse.astype(np.intp).ravel(),
            pair_ptr.astype(np.intp))


def init_client_batched(group, broadcast, stream, *, init_std, optimizer, biased=False):
    """:func:`init_client` for every client of ``group``; each client draws its ``u_i`` from
    its own generator, as alone."""
    bc = broadcast.simulation
    d = bc.Vbar.shape[1]
    U = np.empty((group.n_rows, d))
    row_ptr = group.row_ptr
    for i in range(group.n_clients):  # (the per-client streams: a generator each)
        rng = client_generator(stream, group.start + i)
        U[row_ptr[i]:row_ptr[i + 1]] = init_std * rng.standard_normal(
            (row_ptr[i + 1] - row_ptr[i], d))
    if biased:
        _biases.init_user(U)
    cols, pair, pair_ptr = _group_layout(group)
    P = bc.Vbar[cols]
    opt = None
    if optimizer == "adam":
        opt = {"t": np.zeros(group.n_clients, dtype=np.int64), "mU": np.zeros_like(U),
               "vU": np.zeros_like(U), "mP": np.zeros_like(P), "vP": np.zeros_like(P)}
    state = {"U": U, "P": P, "opt": opt, "cols": cols, "pair": pair, "pair_ptr": pair_ptr,
             "pending": np.zeros(group.n_clients, dtype=bool)}
    return state, {}


def client_update_batched(gs, group, broadcast, stream, active, selected, *, variant,
                          schedule, lr, reg, alpha_u, reg_v, p, eta, optimizer, link, shift,
                          span, clip_delta, noise_scale, simulate, biased=False):
    """:func:`client_update` for the ``active`` clients of ``group`` in one compiled call;
    the uploads of the ``selected`` ones (a Python step per upload only)."""
    bc = broadcast.simulation
    X, opt = group.X, gs["opt"]
    action = _action(variant, schedule, bc.coin)
    step = action == "step"  # else RFRecF's main update: grad f / (1 - p), no psi
    none_u, none_p = (np.empty((0, gs["U"].shape[1])),) * 2
    _group_update(X.indptr, X.data, group.row_ptr, gs["pair_ptr"], gs["pair"], gs["cols"],
                  gs["U"], gs["P"], bc.Vbar, np.ascontiguousarray(active), gs["pending"],
                  _ACTION_CODE.get(action, _NOTHING), action == "upload_pull",
                  0.0 if eta is None else eta, link == "sigmoid", shift, span, alpha_u, reg_v,
                  reg if step else 0.0, 1.0 if step or p is None else 1 / (1 - p),
                  AUTO_SAFETY if lr is None else lr, lr is None, opt is not None,
                  np.zeros(0, dtype=np.int64) if opt is None else opt["t"],
                  none_u if opt is None else opt["mU"], none_u if opt is None else opt["vU"],
                  none_p if opt is None else opt["mP"], none_p if opt is None else opt["vP"],
                  biased)
    if action not in ("step", "upload", "upload_pull"):
        return gs, {}
    uploads = {}
    ptr = gs["pair_ptr"]
    for i in np.flatnonzero(active & selected).tolist():
        cols, P = gs["cols"][ptr[i]:ptr[i + 1]], gs["P"][ptr[i]:ptr[i + 1]]
        if not (clip_delta or simulate):  # (those make new arrays)
            P = P.view()
            P.flags.writeable = False
        uploads[group.start + i] = _upload(
            bc, cols, P,
            client_generator(stream, group.start + i), action, simulate=simulate, lr=lr,
            reg=reg, reg_v=reg_v, p=p, eta=eta, optimizer=optimizer, biased=biased,
            clip_delta=clip_delta, noise_scale=noise_scale)
    return gs, uploads


def client_metrics_batched(gs, group, broadcast, *, alpha_u, eta, link, shift, span,
                           biased=False):
    """:func:`client_metrics` summed over the clients of ``group``."""
    bc = broadcast.simulation
    X, U, sigmoid = group.X, gs["U"], link == "sigmoid"
    fit, psi, sq, sse, ae = _group_sums(X.indptr, X.data, group.row_ptr, gs["pair_ptr"],
                                        gs["pair"], gs["cols"], U, gs["P"], bc.W, bc.Vbar,
                                        gs["pending"], 0.0 if eta is None else eta, sigmoid,
                                        shift, span)
    return _metrics(fit, psi, sq, sse, ae, U, X, group.X_eval, bc.Vbar, alpha_u=alpha_u,
                    sigmoid=sigmoid, shift=shift, span=span, biased=biased)


def _slices(gs, group, i):
    ptr = gs["pair_ptr"]
    return (slice(group.row_ptr[i], group.row_ptr[i + 1]), slice(ptr[i], ptr[i + 1]),
            slice(group.entry_ptr[i], group.entry_ptr[i + 1]))


def client_state_batched(gs, group, i):
    """Client ``i``'s state as :func:`init_client` and :func:`client_update` hold it."""
    rows, pairs, entries = _slices(gs, group, i)
    opt = gs["opt"]
    if opt is not None:
        opt = {"t": int(opt["t"][i]), "mU": opt["mU"][rows].copy(),
               "vU": opt["vU"][rows].copy(), "mP": opt["mP"][pairs].copy(),
               "vP": opt["vP"][pairs].copy()}
    pair = (np.arange(pairs.stop - pairs.start, dtype=np.intp) if not len(gs["pair"])
            else gs["pair"][entries] - pairs.start)
    return {"U": gs["U"][rows].copy(), "P": gs["P"][pairs].copy(), "opt": opt,
            "cols": gs["cols"][pairs].copy(), "pair": pair, "pending": bool(gs["pending"][i])}


def with_client_states_batched(gs, group, states):
    """The group state with the clients of ``states`` (``{i: state}``) written in (in place,
    as :func:`client_update_batched`)."""
    opt = gs["opt"]
    for i, state in states.items():
        rows, pairs, _ = _slices(gs, group, i)
        gs["U"][rows], gs["P"][pairs] = state["U"], state["P"]
        gs["pending"][i] = state["pending"]
        if opt is not None:
            opt["t"][i] = state["opt"]["t"]
            for key, where in (("mU", rows), ("vU", rows), ("mP", pairs), ("vP", pairs)):
                opt[key][where] = state["opt"][key]
    return gs


def _diverged(what, lr, optimizer):
    return (
        f"{what[0].upper()}{what[1:]}; the iterates diverged. Lower learning_rate (now {lr}; "
        f"solver_params['optimizer']={optimizer!r}). Plain gradient descent needs "
        "learning_rate below about 1 / L, the Lipschitz constant of the gradient, which grows "
        "with the number of ratings per user and per item: the paper's 0.05 / 0.025 are "
        "settings of the authors' Adam code, not safe gradient steps "
        "(solver_params={'optimizer': 'adam'} is scale-free)."
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
                  init_std, clip_delta, noise_scale, simulate_uploads, biased=False):
    """Bind the hyperparameters to the pure functions above (``alpha_v`` is split 1/N;
    ``biased``: rank ``n_components + 2`` with the augmented factors of ``_biases``)."""
    p = None if variant == "rfrec" else p
    eta = None if p is None else pull_strength(learning_rate, reg_consensus,
                                               alpha_v / n_clients, p, pull_eta)
    step = dict(lr=learning_rate, reg=reg_consensus, reg_v=alpha_v / n_clients, p=p, eta=eta,
                optimizer=optimizer, biased=biased)
    privacy = dict(clip_delta=clip_delta, noise_scale=noise_scale)
    link_ = dict(link=link, shift=shift, span=span)
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items,
                            n_components=_biases.n_factors(n_components, biased),
                            init_std=init_std, p=p, optimizer=optimizer, biased=biased),
        init_client=partial(init_client, init_std=init_std, optimizer=optimizer,
                            biased=biased),
        client_update=partial(client_update, variant=variant, schedule=schedule,
                              alpha_u=alpha_u, simulate=simulate_uploads, **step, **privacy,
                              **link_),
        server_update=partial(server_update, variant=variant, schedule=schedule, **step,
                              **privacy),
        client_metrics=partial(client_metrics, alpha_u=alpha_u, eta=eta, biased=biased,
                               **link_),
        combine_metrics=partial(combine_metrics, n_clients=n_clients, reg=reg_consensus,
                                alpha_v=alpha_v, lr=learning_rate,
                                optimizer=optimizer, variant=variant),
        # every client steps each round; only uploads are sampled or lost (Section 3.3)
        participation=Participation(computes="all", receives="all", dropped="upload_lost",
                                    server_update="every_round"),
        batched=BatchedPhases(
            init_client=partial(init_client_batched, init_std=init_std, optimizer=optimizer,
                                biased=biased),
            client_update=partial(client_update_batched, variant=variant, schedule=schedule,
                                  alpha_u=alpha_u, simulate=simulate_uploads, **step,
                                  **privacy, **link_),
            client_metrics=partial(client_metrics_batched, alpha_u=alpha_u, eta=eta,
                                   biased=biased, **link_),
            client_state=client_state_batched,
            with_client_states=with_client_states_batched,
        ),
    )
