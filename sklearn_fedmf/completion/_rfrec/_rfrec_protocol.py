"""The pure functions of RFRec / RFRecF (:class:`~sklearn_fedmf.RFRec`): the messages, the
shared coin, the client and server steps and the metrics (:func:`._rfrec.make_protocol` binds
them into the engine's :class:`~sklearn_fedmf.engine._federation.FederatedProtocol`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ... import _biases
from ..._kernels import read_only
from ...engine._federation import Broadcast
from ...privacy import clip_entries, laplace_noise, mean_laplace_noise
from .._implicit import implicit_objective
from ._rfrec_implicit import implicit_auto_steps, implicit_client_grads, preference_errors
from ._rfrec_kernels import (
    _client_grads,
    _client_sums,
    _errors_at,
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
        if action == "main" and reg > 0:
            # L2GD (RFRecF) follows grad F in expectation only with the pull lr * reg / p,
            # and the "auto" pull is at most 1: so is this step at most p / reg. The step
            # 1 / curvature alone would set these columns to 0 (f has only the ridge there),
            # and each average would shrink an item towards 0, its bias included, by the
            # share of the clients that did not rate it.
            lr = min(lr, p / reg)
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


def init_client(block, broadcast, rng, *, init_std, optimizer, biased=False, implicit=False):
    """``u_i^0 ~ N(0, init_std^2)``; the rated columns ``P`` start at ``Vbar^0`` (every
    column under ``loss="implicit"``: each has a data gradient, see :mod:`._rfrec_implicit`)."""
    bc = broadcast.simulation
    X = block.X
    if implicit:  # (cols in the dtype of the data's indices, as np.unique gives them)
        cols, pair = np.arange(bc.Vbar.shape[0], dtype=X.indices.dtype), X.indices
    else:
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


@dataclass(frozen=True)
class RatingTerms:
    """The data term of a client's ratings (the squared error through ``link``): its
    gradients and its ``learning_rate="auto"`` steps, for :func:`client_update`."""

    link: str
    shift: float
    span: float

    def grads(self, X, pair, U, P, Vbar, cols, *, alpha_u, reg_v, reg, scale):
        """``scale * grad (f_c) + reg * (P - Vbar)`` (:func:`._rfrec_kernels._client_grads`)."""
        gU, gP = np.empty_like(U), np.empty_like(P)
        _client_grads(X.indptr, pair, X.data, U, P, Vbar, cols, self.link == "sigmoid",
                      self.shift, self.span, alpha_u, reg_v, reg, scale, gU, gP)
        return gU, gP

    def steps(self, X, pair, U, P, *, alpha_u, reg_v, reg, scale):
        """:func:`auto_steps`."""
        return auto_steps(X, pair, U, P, alpha_u=alpha_u, reg_v=reg_v, reg=reg, scale=scale,
                          sigmoid=self.link == "sigmoid")


@dataclass(frozen=True)
class PreferenceTerms:
    """The data term under ``loss="implicit"`` (the weighted fit over every column of
    :mod:`._rfrec_implicit`): its gradients and ``learning_rate="auto"`` steps."""

    confidence: float

    def grads(self, X, pair, U, P, Vbar, cols, *, alpha_u, reg_v, reg, scale):
        """:func:`~._rfrec_implicit.implicit_client_grads`."""
        return implicit_client_grads(X, pair, U, P, Vbar[cols], confidence=self.confidence,
                                     alpha_u=alpha_u, reg_v=reg_v, reg=reg, scale=scale)

    def steps(self, X, pair, U, P, *, alpha_u, reg_v, reg, scale):
        """:func:`~._rfrec_implicit.implicit_auto_steps`."""
        return implicit_auto_steps(X, pair, U, P, confidence=self.confidence,
                                   alpha_u=alpha_u, reg_v=reg_v, reg=reg, scale=scale,
                                   safety=AUTO_SAFETY)


def client_update(state, block, broadcast, rng, selected, *, variant, schedule, lr, reg,
                  alpha_u, reg_v, p, eta, optimizer, terms, clip_delta, noise_scale,
                  simulate, biased=False):
    """One round of one client: local step or pull, and the upload of ``V_(c)`` if due
    (``terms``: the loss's data term, :class:`RatingTerms` or, under ``loss="implicit"``,
    :class:`PreferenceTerms`)."""
    bc = broadcast.simulation
    X, cols = block.X, state["cols"]
    U, P = state["U"], _pulled(state, bc, eta)
    opt = None if state["opt"] is None else dict(state["opt"])
    action = _action(variant, schedule, bc.coin)
    if action in ("step", "main"):
        step = action == "step"  # else RFRecF's main update: grad f / (1 - p), no psi
        data = dict(alpha_u=alpha_u, reg_v=reg_v, reg=reg if step else 0.0,
                    scale=1.0 if step else 1 / (1 - p))
        gU, gP = terms.grads(X, state["pair"], U, P, bc.Vbar, cols, **data)
        if opt is not None:
            opt["t"] += 1
        lr_u = lr_p = lr
        if lr is None:
            lr_u, lr_p = terms.steps(X, state["pair"], U, P, **data)
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
    for up in uploads.values():  # (values read-only: a group's are views of its P)
        _scatter_delta(acc, up.cols, read_only(up.values), base)
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
    def average(W, rng):
        return _aggregate(uploads, W, rng, clip_delta=clip_delta, noise_scale=noise_scale)

    return _server_round(server_state, average if uploads else None, k, variant=variant,
                         schedule=schedule, lr=lr, reg=reg, reg_v=reg_v, p=p, eta=eta,
                         optimizer=optimizer, biased=biased)


def secure_summands(upload, weight):
    """A client's summand under secure aggregation: its dense, clipped and noised ``V_(c)``
    (the protocol runs with ``simulate``: each client adds its own noise)."""
    if not isinstance(upload, np.ndarray):
        raise TypeError("RFRec's secure sum needs dense uploads (simulate=True).")
    return {"V": upload}


def secure_reference(server_state, weight, *, variant, schedule, lr, reg, reg_v, p, eta,
                     optimizer, biased=False):
    """The round's upload of a client with no rated column, public (the shared columns ``W``
    after the round's step, from the broadcasts): with noise on the sum
    (``privacy=DistributedDP``) each client clips and noises its ``V_(c)`` minus this, which
    is zero outside its rated columns, instead of its whole ``V_(c)`` (whose norm is that of
    the model's), and the server adds the survivors' back."""
    s = server_state
    W = s["W"]
    if _action(variant, schedule, s["coin"]) == "step":  # (as _upload's shared columns)
        W = _shared_op(W, s["W_opt"], s["Vbar"], "step", lr=lr, reg=reg, reg_v=reg_v, p=p,
                       eta=eta, optimizer=optimizer, biased=biased)[0]
    return {"V": W}


def secure_server_update(server_state, sums, n_summed, k, *, variant, schedule, lr, reg, reg_v,
                         p, eta, optimizer, biased=False, **privacy):
    """:func:`server_update` with the average from the secure sum (None: no upload)."""
    def average(W, rng):
        return sums["V"] / n_summed

    return _server_round(server_state, average if sums else None, k, variant=variant,
                         schedule=schedule, lr=lr, reg=reg, reg_v=reg_v, p=p, eta=eta,
                         optimizer=optimizer, biased=biased)


def _server_round(server_state, average, k, *, variant, schedule, lr, reg, reg_v, p, eta,
                  optimizer, biased):
    """The server's round with ``average(W, rng)`` giving the uploads' mean (None: none)."""
    s = server_state
    coin = s["coin"]
    action = _action(variant, schedule, coin)
    common = dict(lr=lr, reg=reg, reg_v=reg_v, p=p, eta=eta, optimizer=optimizer,
                  biased=biased)
    W, W_opt = s["W"], s["W_opt"]
    if action != "upload_pull":  # l2gd pulls after the fresh average, below
        W, W_opt = _shared_op(W, W_opt, s["Vbar"], action, **common)
    Vbar = s["Vbar"]
    if average is not None and action in ("step", "upload", "upload_pull"):
        rng = np.random.default_rng(np.random.SeedSequence(s["seed"], spawn_key=(_NOISE, k)))
        Vbar = average(W, rng)
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
             "comm_rounds": s["comm_rounds"] + (average is not None) + downloads}
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


def preference_metrics(state, block, broadcast, *, alpha_u, eta, confidence):
    """:func:`client_metrics` under ``loss="implicit"``: the weighted fit over every column
    (every column is the client's own: ``P`` is its whole ``V_(c)``), errors of the
    preference 1."""
    bc = broadcast.simulation
    X, U = block.X, state["U"]
    P = _pulled(state, bc, eta)
    _, psi, sq, _, _ = _client_sums(X.indptr, state["pair"], X.data, U, P, bc.W, bc.Vbar,
                                    state["cols"], False, 0.0, 1.0)
    fit = 2.0 * implicit_objective(X, U, P, confidence=confidence, alpha_u=0.0, alpha_v=0.0)
    sse, ae = preference_errors(X, U, bc.Vbar)
    out = _metrics(fit, psi, sq, sse, ae, U, X, None, bc.Vbar, alpha_u=alpha_u,
                   sigmoid=False, shift=0.0, span=1.0, biased=False)
    if block.X_eval is not None and block.X_eval.nnz:
        out["eval_sse"], out["eval_ae"] = preference_errors(block.X_eval, U, bc.Vbar)
        out["eval_n"] = block.X_eval.nnz
    return out


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


def _diverged(what, lr, optimizer):
    return (
        f"{what[0].upper()}{what[1:]}; the iterates diverged. Lower learning_rate (now {lr}; "
        f"solver_params['optimizer']={optimizer!r}). Plain gradient descent needs "
        "learning_rate below about 1 / L, the Lipschitz constant of the gradient, which grows "
        "with the number of ratings per user and per item: the paper's 0.05 / 0.025 are "
        "settings of the authors' Adam code, not safe gradient steps "
        "(solver_params={'optimizer': 'adam'} is scale-free)."
    )


def combine_metrics(server_state, sums, *, n_clients, reg, alpha_v, lr, optimizer, variant,
                    rating_scale=1.0):
    """``F`` at the current state (psi against the server's ``Vbar``), RMSEs, the gap.

    ``rating_scale``: the solver runs on the ratings divided by it (``"auto"`` strengths);
    the errors are reported in rating units and ``F`` times its square."""
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
        "objective": objective * rating_scale**2,
        "train_rmse": rating_scale * float(np.sqrt(sums["sse"] / max(sums["n"], 1))),
        "consensus_gap": 2 * psi,
        "vbar_change": float(change),
        "comm_rounds": s["comm_rounds"],
    }
    if "last_coin" in s and variant == "rfrecf":
        record["coin"] = s["last_coin"]
    if sums["eval_n"]:
        record["eval_rmse"] = rating_scale * float(np.sqrt(sums["eval_sse"] / sums["eval_n"]))
        record["eval_mae"] = rating_scale * sums["eval_ae"] / sums["eval_n"]
    return record
