"""FedMGS: federated matrix completion by gradient sharing (Wang & Chang, Algorithm 2).

Orientation and objective as in :mod:`._fedmavg` (``variant="wang_chang"``): the global item
factor ``V`` (the paper's ``W``) lives on the server, client ``p`` keeps ``U_p`` (``H_p^T``)::

    F(U, V) = sum_p [1/2 ||P_Omega_p(M_p - U_p V)||^2 + h(U_p)] + h(V)

Why this is not the paper's FedMGS verbatim (its Remark 2 restricts it to the full-observation
Frobenius loss). For the full-observation loss
the gradient in ``W`` is linear with two data aggregates, ``grad = W G1 - G2`` (29), so from
``H_p H_p^T`` and ``X_p H_p^T`` the server rebuilds the exact gradient at any ``W`` and runs
``Q2`` projected steps alone. With missing entries every item has its own Gram
``sum_{users who rated j} u u^T``, which no fixed-size aggregate carries. This class keeps the
gradient-sharing principle with fresh client gradients per server step: in a round the
sampled clients take ``local_iter_u`` steps on ``U_p`` against ``V^s`` and send the gradient
``grad_V 1/2||P_Omega_p(M_p - U_p V^s)||^2`` (``n_items x r``) and ``U_p^T U_p`` (``r x r``,
for the step size); the server sums the latest gradient of every client (fresh for the
sampled ones; a client that was not sampled has not moved ``U_p``, only ``V`` moved since
its gradient) and takes one proximal-gradient step ``V <- prox(V - grad / d)``,
``d = d_factor (lambda_max(sum_p U_p^T U_p) + ridge)``. One round is thus the paper's
``Q2 = 1``; with every client sampled it is exactly centralized alternating proximal gradient
(``Q1`` steps on ``U``, one on ``V``) and does not depend on the partition. Every client
sends its gradient at the initial point once (Algorithm 2's ``G1^0``, ``G2^0``, which the paper's
cost leaves out; counted in round 1's bytes).

Privacy consequence: a gradient reveals more than a model. Row ``j`` of the uploaded
gradient is ``sum_t e_tj u_t`` over the client's users ``t`` who rated item ``j``: its nonzero
rows disclose exactly which items the client's users rated, and for a one-user client two
gradients at known ``V`` give that user's ratings in closed form (the attack on gradient
sharing of Chai et al., 2020). FedMAvg's averaged models are not immune (with ``alpha_v=0``
the rows of unrated items come back unchanged) but mix ``Q2`` steps started from ``V``.

Many small clients (one per user). A client's gradient is zero outside the items it rated,
so the server caches each client's rated rows and keeps their running sum, updated by the
uploaded clients' changes (memory proportional to the ratings instead of ``p n r``, which is
1.25 GB at 6,040 clients of the ML-1M shape). A one-user client with biases sends its
gradient as ``e a^T`` (:class:`OuterRows`): ``k + r`` numbers for ``k`` rated items, the
Netflix shape's 100M ratings then cost 0.8 GB of cache instead of 11 GB. Client groups
(``_groups``) run their clients' phases in one compiled call (``_fedmgs_kernels``); the
messages and bytes are those of the per-client functions.
"""

from __future__ import annotations

from functools import partial
from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from .. import _biases
from .._base import FederatedMFBase
from .._engine import FederatedProtocol
from .._groups import BatchedPhases, ImplicitRows
from .._kernels import grad_cols
from .._prox import item_counts, prox_elastic_net, row_alpha
from ._fedmavg import (
    EPS_LIPSCHITZ,
    client_metrics,
    combine_metrics,
    init_user_factors,
    lambda_max,
    prox_nonsmooth,
    user_steps,
)
from ._fedmgs_batched import (
    OuterRows,
    batched_client_update,
    batched_init_client,
    client_state,
    with_client_states,
)
from ._fedmgs_kernels import add_outer, add_rows, outer_sum, replace_outer, replace_rows

__all__ = ["FedMGS"]

RESUM_EVERY = 20  # rounds between exact sums of the server's cached gradients


# ---- pure solver functions ------------------------------------------------------------------
def init_server(rng, *, n_items, n_components, init_scale, biased=False):
    """``V^0``: i.i.d. ``init_scale * Uniform[0, 1)`` (``[V^0; 1; 0]`` with biases)."""
    Vt = init_scale * rng.random((n_items, n_components))
    if biased:
        _biases.init_item(Vt)
    return {"Vt": Vt}, Vt


def share(U, Vt, X, biased=False):
    """What a client sends: the data gradient at ``(U_p, V)`` and ``U_p^T U_p``.

    With biases: the gradient in the free entries ``[V; b_i]`` (at ``[U_p, 1]`` against the
    ratings minus ``b_u``, exact) and the Gram of ``[U_p, 1]``; nothing in ``b_u``'s
    direction, and the fixed row has no gradient to send."""
    if biased:
        X, U = _biases.item_step_view(X, U)
        Vt = _biases.free_item(Vt)
    G = np.empty_like(Vt)
    grad_cols(X.indptr, X.indices, X.data, U, Vt, G)
    return {"grad": G, "gram": U.T @ U}


def init_client(block, Vt, rng, *, init_scale, positive, biased=False, weighted=False):
    """Private ``U_p^0`` and the one-time upload of its gradient and Gram (for ``G1^0``,
    ``G2^0``); weighted regularization: also its ratings per item, once (their sum over the
    clients is the item weights ``n_j``)."""
    U = init_user_factors(block, Vt.shape[1], rng, init_scale, positive, biased)
    upload = share(U, Vt, block.X, biased)
    if weighted:
        upload["counts"] = item_counts(block.X)
    return {"U": U}, upload


def client_update(state, block, Vt, rng, selected, *, local_iter_u, c_factor, alpha_u,
                  l1_ratio, positive, biased=False, weighted=False):
    """Q1 proximal-gradient steps on ``U_p`` at ``V^s`` (step ``1/(c_factor L_U)``), then share."""
    alpha_u = row_alpha(alpha_u, block.X, weighted)
    U = user_steps(state["U"], Vt, block.X, local_iter_u, c_factor, alpha_u * (1.0 - l1_ratio),
                   alpha_u, l1_ratio, positive, biased)
    return {"U": U}, (share(U, Vt, block.X, biased) if selected else None)


# ---- the server's cache of every client's latest gradient -----------------------------------
# A client's gradient is zero outside the items it rated, so the server keeps each client's
# rated rows only (memory proportional to the ratings, not p n r) and the running sum of all
# of them. Consecutive clients are stored together in segments: dicts with the segment's
# first client ``lo``, ``ptr`` (client ``lo + i`` owns rows ``ptr[i]:ptr[i + 1]``) and
# ``items``, and either (``kind="rows"``) ``values``, the rows, and ``grams``, one Gram per
# client, or (``kind="outer"``, :class:`OuterRows`) ``e`` and ``a``, one row per client.
# A client's piece is ``(kind, rows, values or e, gram or a)``, the last with a leading axis.
def sparse_rows(message, cached_rows=None):
    """``(rows, values)`` of an uploaded gradient: an :class:`ImplicitRows` with ``scale`` 0
    as sent; any other on its nonzero rows and the client's ``cached_rows`` (a cached row
    that became zero must be replaced)."""
    if isinstance(message, ImplicitRows) and not message.scale:
        return message.rows, message.values
    G = np.asarray(message)
    nonzero = G.any(axis=1)
    if cached_rows is not None:
        nonzero[cached_rows] = True
    rows = np.flatnonzero(nonzero)
    return rows, G[rows]


def _piece(upload, cached_rows=None, kind=None):
    """What the cache keeps of one upload, as ``kind`` (None: ``"outer"`` when the message
    is ``e a^T``, else ``"rows"``); None when an ``"outer"`` piece is asked of a gradient
    that is not ``e a^T`` exactly."""
    grad, gram = upload["grad"], upload["gram"]
    if isinstance(grad, OuterRows):
        piece = ("outer", grad.rows, grad.e, grad.a[None])
        return _as_rows(piece) if kind == "rows" else piece
    rows, values = sparse_rows(grad, cached_rows)
    piece = ("rows", rows, values, np.asarray(gram)[None])
    if kind == "rows":
        return piece
    outer = _as_outer(piece)
    return piece if kind is None and outer is None else outer


def _as_rows(piece):
    kind, rows, x, y = piece
    if kind == "rows":
        return piece
    return "rows", rows, np.multiply.outer(x, y[0]), np.multiply.outer(y, y[0])


def _as_outer(piece):
    """An ``"outer"`` piece with the same message, or None (module docstring of
    :class:`OuterRows`: ``e`` and ``a`` are a column and a row of the message)."""
    kind, rows, x, y = piece
    if kind == "outer":
        return piece
    a = y[0, -1]
    e = x[:, -1]
    if a[-1] != 1.0 or not (np.array_equal(np.multiply.outer(e, a), x)
                            and np.array_equal(np.multiply.outer(a, a), y[0])):
        return None
    return "outer", rows, e.copy(), a[None].copy()


def _span(a):
    """Where a C-contiguous view lies in its buffer: ``(buffer, start, end, dtype, row
    shape)``; None for an array that owns its data or is not C-contiguous."""
    if a.base is None or not a.flags.c_contiguous:
        return None
    start = a.__array_interface__["data"][0]
    return a.base, start, start + a.nbytes, a.dtype, a.shape[1:]


def _follows(previous, current):
    """Whether the view of span ``current`` continues the view of span ``previous``."""
    return (previous is not None and current is not None and current[0] is previous[0]
            and current[1] == previous[2] and current[3:] == previous[3:])


def _joined(arrays, chained):
    """The arrays end to end: the span of their buffer when ``chained`` (no copy), else a
    concatenation."""
    if not chained:
        return np.concatenate(arrays)
    first = arrays[0]
    row = first.itemsize * int(np.prod(first.shape[1:], dtype=np.int64))
    return np.lib.stride_tricks.as_strided(first, shape=(sum(len(a) for a in arrays),
                                                         *first.shape[1:]),
                                           strides=(row, *first.strides[1:]))


_FIELDS = {"rows": ("values", "grams"), "outer": ("e", "a")}


def _segment(lo, pieces, chained=False):
    kind = pieces[0][0]
    _, rows, x, y = zip(*pieces)
    ptr = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=ptr[1:])
    first, second = _FIELDS[kind]
    return {"kind": kind, "lo": lo, "ptr": ptr, "items": _joined(rows, chained),
            first: _joined(x, chained), second: _joined(y, chained)}


def _client_piece(seg, i):
    a, b = seg["ptr"][i], seg["ptr"][i + 1]
    first, second = _FIELDS[seg["kind"]]
    return seg["kind"], seg["items"][a:b], seg[first][a:b], seg[second][i:i + 1]


def cache_segments(pieces):
    """The cache of the clients' pieces (client order). A batched group uploads its clients'
    messages as consecutive views of its arrays: such runs are kept as they are (a second
    copy of every client's gradient would double the server's memory); other clients'
    pieces are concatenated."""
    spans = [tuple(_span(x) for x in piece[1:]) for piece in pieces]
    chained = [False] + [a[0] == b[0] and all(_follows(x, y) for x, y in zip(sa, sb))
                         for a, b, sa, sb in zip(pieces, pieces[1:], spans, spans[1:])]
    starts = [c for c in range(len(pieces)) if not chained[c]] + [len(pieces)]
    segments, loose = [], []
    for a, b in zip(starts, starts[1:]):
        if loose and (b - a > 1 or pieces[a][0] != pieces[loose[0]][0]):
            segments.append(_segment(loose[0], pieces[loose[0]:a]))
            loose = []
        if b - a == 1:  # not a view run: joins its loose neighbours of its kind
            loose.append(a)
            continue
        segments.append(_segment(a, pieces[a:b], chained=True))
    if loose:
        segments.append(_segment(loose[0], pieces[loose[0]:]))
    return segments


def _add(total, seg, sign=1.0):
    """``total += sign *`` the segment's cached gradients, in client order."""
    if seg["kind"] == "rows":
        add_rows(total, seg["items"], seg["values"], sign)
    else:
        add_outer(total, seg["items"], seg["ptr"], seg["e"], seg["a"], sign)


def cache_sum(segments, shape):
    """The exact sum of the cached gradients, in client order (independent of ``n_jobs``)."""
    total = np.zeros(shape)
    for seg in segments:
        _add(total, seg)
    return total


def gram_sum(segments):
    """``sum_p U_p^T U_p`` over the cached Grams."""
    return sum(seg["grams"].sum(axis=0) if seg["kind"] == "rows" else outer_sum(seg["a"])
               for seg in segments)


def cached_gradient(segments, client, shape):
    """Client ``client``'s cached gradient as the dense ``shape`` matrix it sent."""
    seg = segments[max(i for i, s in enumerate(segments) if s["lo"] <= client)]
    _, rows, x, y = _as_rows(_client_piece(seg, client - seg["lo"]))
    out = np.zeros(shape)
    out[rows] = x
    return out


def update_cache(segments, total, uploads):
    """Replace the cached gradients and Grams of the clients of ``uploads`` (sorted) and
    update ``total`` by their gradients' changes, in place, in client order. Returns the
    segments (a segment is rebuilt when a client's rows or message form changed)."""
    if not uploads:
        return segments
    clients = np.fromiter(uploads, dtype=np.int64, count=len(uploads))
    where = np.searchsorted([s["lo"] for s in segments], clients, side="right") - 1
    segments = list(segments)
    for g in np.unique(where).tolist():
        seg, local = segments[g], clients[where == g] - segments[g]["lo"]
        ptr, items = seg["ptr"], seg["items"]
        pieces = [_piece(uploads[c], items[ptr[i]:ptr[i + 1]], seg["kind"])
                  for c, i in zip((local + seg["lo"]).tolist(), local.tolist())]
        if any(p is None for p in pieces):  # not all e a^T: the segment keeps rows
            seg = segments[g] = _segment(seg["lo"], [
                _as_rows(_client_piece(seg, i)) for i in range(len(ptr) - 1)])
            pieces = [_piece(uploads[c], items[ptr[i]:ptr[i + 1]], "rows")
                      for c, i in zip((local + seg["lo"]).tolist(), local.tolist())]
        new = _segment(0, pieces)
        mismatch = np.zeros(len(local), dtype=bool)
        if seg["kind"] == "rows":
            seg["grams"][local] = new["grams"]
            replace_rows(total, items, ptr, seg["values"], local, new["items"], new["ptr"],
                         new["values"], mismatch)
        else:
            replace_outer(total, items, ptr, seg["e"], seg["a"], local, new["items"],
                          new["ptr"], new["e"], new["a"], mismatch)
        if mismatch.any():  # rows that changed (a dense upload's zero rows): rebuild
            changed = dict(zip(local[mismatch].tolist(),
                               (pieces[q] for q in np.flatnonzero(mismatch))))
            for i, piece in changed.items():
                _add(total, _segment(0, [_client_piece(seg, i)]), -1.0)
                _add(total, _segment(0, [piece]))
            segments[g] = _segment(seg["lo"], [changed.get(i, _client_piece(seg, i))
                                               for i in range(len(ptr) - 1)])
    return segments


def server_init_uploads(server_state, uploads, *, n_clients):
    """Cache every client's gradient (rated rows) and Gram (the server's ``G1``/``G2``
    analogue) and the gradients' sum."""
    segments = cache_segments([_piece(uploads[p]) for p in range(n_clients)])
    total = cache_sum(segments, uploads[0]["grad"].shape)
    state = {"Vt": server_state["Vt"], "segments": segments, "grad_sum": total}
    if "counts" in uploads[0]:
        state["counts"] = counts = np.zeros(total.shape[0])
        for p in range(n_clients):  # (grouped clients send theirs on their rated items)
            sent = uploads[p]["counts"]
            if isinstance(sent, ImplicitRows):
                sent.add_to(counts)
            else:
                counts += sent
    return state, server_state["Vt"]


def server_update(server_state, uploads, round_index, *, d_factor, alpha_v, l1_ratio,
                  positive, biased=False):
    """One proximal-gradient step on ``V`` with the sum of the clients' latest gradients.

    The cache is updated in place: the server owns it and it is large. The sum takes the
    uploaded clients' changes (their rated rows) and is recomputed exactly every
    ``RESUM_EVERY`` rounds, which bounds the rounding drift; both in client order.
    Weighted regularization (``server_state`` holds the item counts ``n_j``): the penalty
    ``alpha_v/2 sum_j n_j ||v_j||^2`` is taken whole in the prox, an exact per-row shrink,
    and ``d`` holds the data's Lipschitz bound only.
    """
    Vt, total = server_state["Vt"], server_state["grad_sum"]
    segments = update_cache(server_state["segments"], total, uploads)
    if round_index % RESUM_EVERY == 0:
        total = cache_sum(segments, total.shape)
    counts = server_state.get("counts")
    ridge = alpha_v * (1.0 - l1_ratio) if counts is None else 0.0
    grams = gram_sum(segments)
    if biased:  # one bound per column block: the ones column must not slow the factors
        d = d_factor * np.maximum(_biases.item_step_bounds(grams, ridge), EPS_LIPSCHITZ)
    else:
        d = d_factor * max(lambda_max(grams) + ridge, EPS_LIPSCHITZ)
    free = _biases.free_item(Vt) if biased else Vt  # (the fixed row does not move)
    if counts is None:
        free = prox_nonsmooth(free - (total + ridge * free) / d, 1.0 / d, alpha_v, l1_ratio,
                              positive)
    else:
        free = prox_elastic_net(free - total / d, 1.0 / d, alpha_v * counts[:, None],
                                l1_ratio, positive)
    Vt = _biases.with_item(free) if biased else free
    return {**server_state, "Vt": Vt, "segments": segments, "grad_sum": total}, Vt


def _metrics(state, block, Vt, **params):
    """:func:`._fedmavg.client_metrics` at ``V``; also the sums over a client group's stacked
    rows (a :class:`~sklearn_fedmf._groups.ClientGroup` has the block's fields)."""
    return client_metrics(state, block, {"Vt": Vt}, **params)



def make_protocol(*, n_items, n_clients, n_components, local_iter_u, c_factor, d_factor,
                  alpha_u, alpha_v, l1_ratio, positive, init_scale, biased=False,
                  weighted=False):
    """Bind the hyperparameters to the pure functions above."""
    update = dict(local_iter_u=local_iter_u, c_factor=c_factor, alpha_u=alpha_u,
                  l1_ratio=l1_ratio, positive=positive, biased=biased, weighted=weighted)
    init = dict(init_scale=init_scale, positive=positive, biased=biased, weighted=weighted)
    metrics = dict(alpha_u=alpha_u, l1_ratio=l1_ratio, biased=biased, alpha_v=alpha_v,
                   weighted=weighted)
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items,
                            n_components=_biases.n_factors(n_components, biased),
                            init_scale=init_scale, biased=biased),
        init_client=partial(init_client, **init),
        server_init_uploads=partial(server_init_uploads, n_clients=n_clients),
        client_update=partial(client_update, **update),
        server_update=partial(server_update, d_factor=d_factor, alpha_v=alpha_v,
                              l1_ratio=l1_ratio, positive=positive, biased=biased),
        client_metrics=partial(_metrics, **metrics),
        combine_metrics=partial(combine_metrics, loss_scale=1.0, alpha_v=alpha_v,
                                l1_ratio=l1_ratio, biased=biased, weighted=weighted),
        batched=BatchedPhases(
            init_client=partial(batched_init_client, **init),
            client_update=partial(batched_client_update, **update),
            client_metrics=partial(_metrics, **metrics),
            client_state=client_state, with_client_states=with_client_states),
    )


# ---- estimator ----------------------------------------------------------------------------
class FedMGS(FederatedMFBase):
    """Federated matrix completion by gradient sharing (FedMGS, Wang & Chang).

    Each round, the ``clients_per_round`` sampled clients take ``local_iter_u``
    proximal-gradient steps on their private user factors ``U_p`` against the broadcast item
    factor ``V``, then send the gradient of their squared error in ``V`` and their ``U_p^T
    U_p``; the server takes a proximal-gradient step on ``V`` with the sum of every client's
    latest gradient. Clients that are not sampled neither compute nor send.

    The paper's server-side ``Q2`` steps need the full-observation loss (its gradient in ``V``
    is rebuilt from two aggregates); with missing ratings a new server step needs fresh
    client gradients, so one round is one server step (the paper's ``Q2 = 1``). With every
    client sampled the result does not depend on the partition of the rows. A shared
    gradient discloses which items a client's users rated, and more (see the module
    documentation): this is the price of gradient sharing.

    Parameters
    ----------
    n_components : int, default=5
        Rank ``r`` of the factorization.
    local_iter_u : int, default=10
        Local steps ``Q1`` on the user factors per round.
    c_factor : float, default=0.51
        The U step is ``1 / (c_factor * (lambda_max(V V^T) + ridge))`` (Algorithm 2's steps).
    d_factor : float, default=0.501
        The V step is ``1 / (d_factor * (lambda_max(sum_p U_p^T U_p) + ridge))`` (Algorithm 2's
        steps).
    n_clients : int, default=10
        Number of clients ``p`` when ``clients`` is not given to fit.
    partition : {"random", "contiguous"}, default="random"
        How rows are assigned to ``n_clients`` clients when ``clients`` is not given to fit
        (``"random"`` is seeded by ``random_state``).
    clients_per_round : int, float or None, default=None
        Clients drawn each round; None means all.
    sampling : {"uniform", "weighted"}, default="uniform"
        ``"uniform"``: distinct clients without replacement (Theorem 2's scheme).
        ``"weighted"``: i.i.d. draws with replacement, probabilities proportional to the
        clients' ratings (the paper's footnote); a client drawn twice sends its gradient once
        and it is applied once.
    max_iter : int, default=100
        Communication rounds (one server step each).
    tol : float, default=0.0
        Stop when the relative change of the objective falls below ``tol``.
    alpha_u, alpha_v : float, default=10.0
        Elastic-net regularization of the user and item factors (as in
        :class:`~sklearn_fedmf.FedMAvg`).
        Defaults measured across data sets (``benchmarks/bench_defaults.py``); the papers'
        ``1e-6`` is in ``PAPER_SETTINGS``.
    l1_ratio : float, default=0.0
        Mix of the elastic net: 0 is squared l2, 1 is l1 (soft-thresholding).
    regularization : {"plain", "weighted"}, default="plain"
        ``"plain"``: the papers' penalties, one strength for every row. ``"weighted"``:
        ALS-WR's weighted lambda, each user's row scaled by its number of ratings and each
        item's by its number of ratings (``alpha`` is then a strength per rating). The
        server learns the item counts once: every client sends its ratings per item in
        round 1 (counted in its bytes; the shared gradients already show which items a
        client rated).
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
    clip : bool, default=False
        Clip predictions to the training rating range.
    dropout : float, default=0.0
        Probability that a sampled client fails in a round (it then sends nothing);
        failures are counted in ``history_``.
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
        The global item factor ``V``.
    user_factors_ : ndarray of shape (n_users, n_components)
        The client-local factors, kept for analysis only.
    item_bias_ : ndarray of shape (n_items,)
        ``b_i`` (``biased=True`` only).
    user_bias_ : ndarray of shape (n_users,)
        ``b_u``, private to each client (``biased=True`` only).
    mean_ : float
    n_iter_ : int
    n_clients_ : int
    clients_ : ndarray of shape (n_users,)
    history_ : list of dict
        One record per round (round 1's bytes include every client's initial gradient).
    converged_, degenerate_
        As in :class:`~sklearn_fedmf.FedMCADMM`.
    n_features_in_ : int

    See Also
    --------
    sklearn_fedmf.FedMAvg : Model averaging, the paper's first algorithm.

    References
    ----------
    S. Wang and T.-H. Chang. Federated Matrix Factorization: Algorithm Design and Application
    to Data Clustering. IEEE Trans. Signal Process., 2022.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf import FedMGS
    >>> rng = np.random.default_rng(0)
    >>> M = rng.normal(size=(60, 2)) @ rng.normal(size=(2, 30))
    >>> X = np.where(rng.random(M.shape) < 0.6, M, np.nan)
    >>> # a noise-free low-rank toy needs little regularization (the defaults suit ratings)
    >>> model = FedMGS(n_components=2, n_clients=4, max_iter=300, alpha_u=0.01, alpha_v=0.01,
    ...               random_state=0).fit(X)
    >>> bool(model.score(X) > -0.1)
    True
    """

    _parameter_constraints: dict = {
        **FederatedMFBase._parameter_constraints,
        "local_iter_u": [Interval(Integral, 1, None, closed="left")],
        "c_factor": [Interval(Real, 0, None, closed="neither")],
        "d_factor": [Interval(Real, 0, None, closed="neither")],
        "init_scale": [Interval(Real, 0, None, closed="left")],
        "sampling": [StrOptions({"uniform", "weighted"})],
        "regularization": [StrOptions({"plain", "weighted"})],
    }

    def __init__(
        self,
        n_components=5,
        *,
        local_iter_u=10,
        c_factor=0.51,
        d_factor=0.501,
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
        clip=False,
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
        self.local_iter_u = local_iter_u
        self.c_factor = c_factor
        self.d_factor = d_factor
        self.sampling = sampling
        self.l1_ratio = l1_ratio
        self.regularization = regularization
        self.positive = positive
        self.init_scale = init_scale

    def _make_protocol(self, ctx):
        return make_protocol(
            n_items=ctx.n_features, n_clients=ctx.n_clients, n_components=self.n_components,
            local_iter_u=self.local_iter_u, c_factor=self.c_factor, d_factor=self.d_factor,
            alpha_u=self.alpha_u, alpha_v=self.alpha_v, l1_ratio=self.l1_ratio,
            positive=self.positive, init_scale=self.init_scale, biased=self.biased,
            weighted=self.regularization == "weighted",
        )

    def _read_components(self, server_state, broadcast):
        return np.ascontiguousarray(server_state["Vt"].T)

    def _read_user_factors(self, client_state):
        return client_state["U"]
