"""FedMGS: federated matrix completion by gradient sharing (Wang & Chang, Algorithm 2).

Orientation and objective as in :mod:`._fedmavg` (``variant="wang_chang"``): the global item
factor ``V`` (the paper's ``W``) lives on the server, client ``p`` keeps ``U_p`` (``H_p^T``)::

    F(U, V) = sum_p [1/2 ||P_Omega_p(M_p - U_p V)||^2 + h(U_p)] + h(V)

The paper's FedMGS needs the full-observation Frobenius loss (its Remark 2): there the gradient
in ``W`` is linear with two data aggregates, ``grad = W G1 - G2`` (29), so from ``H_p H_p^T``
and ``X_p H_p^T`` the server rebuilds the exact gradient at any ``W`` and runs ``Q2``
projected steps alone (32). With missing ratings the gradient is still linear, row by row:
for item ``j``, ``grad_j = G1_j v_j - G2_j`` with its own aggregates ``G1_j = sum_t a_t
a_t^T`` and ``G2_j = sum_t x_tj a_t`` over the users ``t`` who rated ``j``. This class is
Algorithm 2 with those per-item aggregates: in a round the sampled clients take
``local_iter_u`` steps on ``U_p`` against ``V^s`` and send, for each item their users rated,
their parts of ``G1_j`` and ``G2_j``, and ``U_p^T U_p`` (``r x r``, for the step size); the
server replaces their cached parts, and takes ``Q2 = local_iter_v`` proximal-gradient steps
``V <- prox(V - (grad + ridge V) / d)``, ``d = d_factor (lambda_max(sum_p U_p^T U_p) +
ridge)``. A client that was not sampled has not moved ``U_p``, so its cached parts are exact:
every server step uses the exact gradient at every client's current factors, and a round is
a descent step of block coordinate descent whatever the participation. With every client
sampled and ``Q2 = 1`` it is centralized alternating proximal gradient (``Q1`` steps on
``U``, one on ``V``) and does not depend on the partition. Every client sends its aggregates
at the initial point once (Algorithm 2's ``G1^0``, ``G2^0``, which the paper's cost leaves
out; counted in round 1's bytes). With biases ``a_t = [u_t, 1]`` (the columns the free item
entries ``[V; b_i]`` multiply) and ``x_tj`` is the rating minus ``b_u``; nothing goes up in
``b_u``'s direction.

(An earlier version shared each client's gradient at ``V^s`` and summed the latest one of
every client. A client not sampled then contributed a gradient computed at an old ``V``,
pushing ``V`` the same way every round until it was sampled again: at one client per user
of the ML-1M shape with 1 % of the clients per round it diverged, train RMSE 7.05, 12.3 and
14.9 after 20, 40 and 60 rounds; the aggregates give 1.11, 1.07 and 1.05, and at 10 % 0.96,
0.67 and 0.59 where the gradients gave 2.55, 1.19 and 0.77.)

What is sent and counted: the indices of the rated items and ``r + r^2`` numbers per rated
item (``[G2_j, vec(G1_j)]``, the paper's message item by item; the rows it leaves out are
zero) plus the Gram. A one-user client with biases sends ``a`` and its ``x_tj``: ``k + r``
numbers for ``k`` rated items, the same information as its aggregates (``G1_j = a a^T`` for
every ``j``, and ``G2_j = x_j a``, whose last entry is ``x_j`` as ``a`` ends with the fixed
1).

Strengths ``"auto"`` (the default): the server sets ``alpha_u = alpha_v`` each round from the
noise of its current model (:func:`auto_alpha`) and broadcasts it with ``V`` (8 bytes). For
that the rows form of a message holds one more number, the client's sum of squares ``S_p =
sum (x_tj - b_u)^2`` over its ratings: with it the aggregates give the server the client's
exact loss at any ``V`` (the paper's message is the loss's linear and quadratic terms in
``V``; ``S_p`` is its constant). It discloses the second moment of the client's ratings
around its users' biases; the compact form already holds every ``x_tj``. The papers' fixed
strengths (``PAPER_SETTINGS``) send neither.

Privacy consequence: the aggregates reveal more than a model. Their rows disclose which items
the client's users rated and how many (the ones entry of ``G1_j``) and the sum of their
ratings minus ``b_u`` (the last entry of ``G2_j``); a one-user client's message gives its
factor row and its ratings minus its bias in closed form (a gradient needed two at known
``V``: the attack on gradient sharing of Chai et al., 2020). FedMAvg's averaged models are
not immune (with ``alpha_v=0`` the rows of unrated items come back unchanged) but mix ``Q2``
steps started from ``V``.

Many small clients (one per user). The server caches each client's rows on its rated items
and keeps their running sums (``n_items x (r + r^2)``), updated by the uploaded clients'
changes; a client with several users costs ``r + r^2`` numbers per rated item, a one-user
client with biases ``k + r`` (12 bytes per rating with the item index: 1.2 GB for the
Netflix shape's 100M ratings).
Client groups (``_groups``) run their clients' phases in one compiled call
(``_fedmgs_kernels``); the messages and bytes are those of the per-client functions.
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
from .._prox import item_counts, prox_elastic_net, row_alpha
from ..exceptions import FederationError
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
    batched_client_update,
    batched_init_client,
    client_state,
    group_layout,
    group_share,
    unpack,
    with_client_states,
)
from ._fedmgs_kernels import add_outer, add_rows, outer_sum, replace_outer, replace_rows

__all__ = ["FedMGS"]

RESUM_EVERY = 20  # rounds between exact sums of the server's cached aggregates

# alpha_u = alpha_v = "auto": the strength MAP estimation gives a Gaussian model, noise
# variance over a factor entry's prior variance, estimated each round by the server at its
# current model (:func:`auto_alpha`), times AUTO_C, capped at AUTO_MAX times the ratings'
# standard deviation (the former constant 10 on ratings of deviation ~1). AUTO_C was chosen
# on bench_defaults' "chosen" sets (docs/guide/tuning.rst).
AUTO_C = 3.5
AUTO_MAX = 10.0
AUTO_WEIGHTED = 0.1  # "auto" with regularization="weighted" (per rating; the reference)


def auto_alpha(free, total, sum_squares, n_ratings, n_components, cap):
    """The ``"auto"`` strength at the server's model: ``min(cap, AUTO_C sigma^2 / s^2)``.

    ``sigma^2``, the noise variance, is the training residual per rating; ``s^2 = sqrt(q /
    r)`` is the prior variance of a factor entry for which the rank-``r`` part ``u.v`` has
    the variance ``q`` it has on the ratings (``r s^4 = q``); ``sigma^2 / s^2`` is then the
    ratio of the two terms of the MAP objective of a Gaussian model (Salakhutdinov & Mnih's
    PMF). The server needs no client for it: with ``a_t``, ``x_tj`` as in :func:`share`,
    ``sum (x_tj - a_t.f_j)^2 = S - 2 sum_j f_j.G2_j + sum_j f_j^T G1_j f_j`` over the free item
    rows ``f_j`` (``S``: the clients' sums of squares) and ``q`` is ``sum_j v_j^T G1_j v_j``
    (the factor block) over ``n_ratings``. Both scale with the ratings as the strength must
    (``alpha`` in rating units: scaling ``X`` by ``c`` scales the factors by ``sqrt(c)``).
    The cap: as ``alpha`` grows the factors shrink, ``q`` falls and ``sigma^2`` rises, so the
    zero factors are a fixed point of every such (empirical Bayes) rule; below the cap it
    only weakens the penalty where the data's noise is low against its low-rank signal."""
    r = free.shape[1]
    G2, G1 = total[:, :r], total[:, r:].reshape(-1, r, r)
    fitted = np.einsum("ja,jab,jb->", free, G1, free)
    rss = max(sum_squares - 2.0 * np.einsum("ja,ja->", free, G2) + fitted, 0.0)
    V = free[:, :n_components]
    signal = np.einsum("ja,jab,jb->", V, G1[:, :n_components, :n_components], V)
    if signal <= 0.0:
        return cap
    return min(cap, AUTO_C * rss / n_ratings * np.sqrt(n_components * n_ratings / signal))


def _sum_squares(upload):
    """A client's ``S``: sent in the rows form, the squares of the compact form's ``x``."""
    return float(upload["ss"]) if "ss" in upload else float(np.dot(upload["x"], upload["x"]))


# ---- pure solver functions ------------------------------------------------------------------
def init_server(rng, *, n_items, n_components, init_scale, biased=False):
    """``V^0``: i.i.d. ``init_scale * Uniform[0, 1)`` (``[V^0; 1; 0]`` with biases)."""
    Vt = init_scale * rng.random((n_items, n_components))
    if biased:
        _biases.init_item(Vt)
    return {"Vt": Vt}, Vt


def share(U, X, biased=False, sum_squares=False):
    """What a client sends: its data aggregates ``G1_j``, ``G2_j`` on the items it rated (the
    masked form of (29); module docstring) and its Gram; they do not depend on ``V``.

    ``{"items", "G", "gram"}``: row ``q`` of ``G`` is ``[G2_j, vec(G1_j)]`` for item ``j =
    items[q]``. A one-user client with biases sends the compact form ``{"items", "x", "a"}``
    (``G1_j = a a^T``, ``G2_j = x_j a``). With biases ``a_t = [u_t, 1]`` (the columns the free
    item entries ``[V; b_i]`` multiply) and ``x_tj`` is the rating minus ``b_u``.
    ``sum_squares`` (``alpha_u="auto"``): the rows form also holds ``"ss"``, ``sum_tj
    x_tj^2`` (the compact form holds every ``x_tj`` already)."""
    group = _OneClient(X)
    return group_share({"U": U, **group_layout(group)}, group, np.array([0]), biased,
                       sum_squares)[0]


class _OneClient:
    """A client's block seen as a group of one client (for :func:`group_share`)."""

    def __init__(self, X):
        self.X, self.start, self.n_rows, self.n_clients = X, 0, X.shape[0], 1
        self.row_ptr = np.array([0, X.shape[0]], dtype=np.int64)


def init_client(block, Vt, rng, *, init_scale, positive, biased=False, weighted=False,
                sum_squares=False):
    """Private ``U_p^0`` and the upload of its aggregates (Algorithm 2's ``G1^0``, ``G2^0``);
    weighted regularization: also its ratings per item, once (their sum over the clients is
    the item weights ``n_j``)."""
    U = init_user_factors(block, Vt.shape[1], rng, init_scale, positive, biased)
    upload = share(U, block.X, biased, sum_squares)
    if weighted:
        upload["counts"] = item_counts(block.X)
    return {"U": U}, upload


def client_update(state, block, broadcast, rng, selected, *, local_iter_u, c_factor, alpha_u,
                  l1_ratio, positive, biased=False, weighted=False):
    """Q1 proximal-gradient steps on ``U_p`` at ``V^s`` (step ``1/(c_factor L_U)``), then share
    (``alpha_u="auto"``: at the broadcast strength, with the sum of squares)."""
    Vt, alpha_u, _ = unpack(broadcast, alpha_u)
    alpha_u = row_alpha(alpha_u, block.X, weighted)
    U = user_steps(state["U"], Vt, block.X, local_iter_u, c_factor, alpha_u * (1.0 - l1_ratio),
                   alpha_u, l1_ratio, positive, biased)
    return {"U": U}, (share(U, block.X, biased, isinstance(broadcast, dict)) if selected
                      else None)


# ---- the server's cache of every client's latest aggregates ---------------------------------
# A client's aggregates are zero outside the items it rated, so the server keeps each
# client's rated rows only (memory proportional to the ratings, not p n r^2) and the running
# sums ``total`` (row j: [G2_j, vec(G1_j)]). Consecutive clients are stored together in
# segments: dicts with the segment's first client ``lo``, ``ptr`` (client ``lo + i`` owns rows
# ``ptr[i]:ptr[i + 1]``) and ``items``, and either (``kind="rows"``) ``G``, the rows, and
# ``grams``, one Gram per client, or (``kind="outer"``, one-user clients with biases) ``x``
# and ``a``, one ``a`` per client. A client's piece is ``(kind, items, G or x, gram or a)``,
# the last with a leading axis.
def _piece(upload):
    """What the cache keeps of one upload (views of the message's arrays)."""
    if "x" in upload:
        return "outer", upload["items"], upload["x"], upload["a"][None]
    return "rows", upload["items"], upload["G"], np.asarray(upload["gram"])[None]


def _as_rows(piece):
    kind, items, x, a = piece
    if kind == "rows":
        return piece
    gram = np.multiply.outer(a[0], a[0])
    G = np.hstack([np.multiply.outer(x, a[0]), np.tile(gram.ravel(), (len(x), 1))])
    return "rows", items, G, gram[None]


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


_FIELDS = {"rows": ("G", "grams"), "outer": ("x", "a")}


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
    copy of every client's aggregates would double the server's memory); other clients'
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
    """``total += sign *`` the segment's cached aggregates, in client order."""
    if seg["kind"] == "rows":
        add_rows(total, seg["items"], seg["G"], sign)
    else:
        add_outer(total, seg["items"], seg["ptr"], seg["x"], seg["a"], sign)


def cache_sum(segments, shape):
    """The exact sums of the cached aggregates, in client order (independent of ``n_jobs``)."""
    total = np.zeros(shape)
    for seg in segments:
        _add(total, seg)
    return total


def gram_sum(segments):
    """``sum_p A_p^T A_p`` over the cached Grams."""
    return sum(seg["grams"].sum(axis=0) if seg["kind"] == "rows" else outer_sum(seg["a"])
               for seg in segments)


def cached_aggregates(segments, client, n_items):
    """Client ``client``'s cached aggregates as the dense ``n_items x (r + r^2)`` matrix of
    rows ``[G2_j, vec(G1_j)]`` (zero on the items it did not rate)."""
    seg = segments[max(i for i, s in enumerate(segments) if s["lo"] <= client)]
    _, rows, G, _ = _as_rows(_client_piece(seg, client - seg["lo"]))
    out = np.zeros((n_items, G.shape[1]))
    out[rows] = G
    return out


def update_cache(segments, total, uploads):
    """Replace the cached aggregates and Grams of the clients of ``uploads`` (sorted) and
    update ``total`` by their changes, in place, in client order. A client's rated items
    are fixed by its data: a message on other items, or of the other form, is refused."""
    if not uploads:
        return segments
    clients = np.fromiter(uploads, dtype=np.int64, count=len(uploads))
    where = np.searchsorted([s["lo"] for s in segments], clients, side="right") - 1
    for g in np.unique(where).tolist():
        seg, local = segments[g], clients[where == g] - segments[g]["lo"]
        pieces = [_piece(uploads[c]) for c in (local + seg["lo"]).tolist()]
        mismatch = np.array([p[0] != seg["kind"] for p in pieces])
        if not mismatch.any():
            new = _segment(0, pieces)
            if seg["kind"] == "rows":
                seg["grams"][local] = new["grams"]
                replace_rows(total, seg["items"], seg["ptr"], seg["G"], local, new["items"],
                             new["ptr"], new["G"], mismatch)
            else:
                replace_outer(total, seg["items"], seg["ptr"], seg["x"], seg["a"], local,
                              new["items"], new["ptr"], new["x"], new["a"], mismatch)
        if mismatch.any():
            raise FederationError(
                f"Client {int(local[mismatch][0] + seg['lo'])} sent its aggregates on other "
                "items or in another form than before; its rated items are fixed.")
    return segments


def server_init_uploads(server_state, uploads, *, n_clients, auto=False, n_ratings=None):
    """Cache every client's aggregates (rated rows) and Gram, and their sums (Algorithm 2's
    ``G1^0``, ``G2^0``, item by item); ``auto``: also their sums of squares, and round 1's
    strength, the cap ``AUTO_MAX`` times the ratings' root mean square (what the sums of
    squares give before any bias is fitted), goes with ``V``."""
    pieces = [_piece(uploads[p]) for p in range(n_clients)]
    r = pieces[0][3].shape[-1]
    segments = cache_segments(pieces)
    total = cache_sum(segments, (server_state["Vt"].shape[0], r + r * r))
    state = {"Vt": server_state["Vt"], "segments": segments, "sums": total}
    if "counts" in uploads[0]:
        state["counts"] = counts = np.zeros(total.shape[0])
        for p in range(n_clients):  # (grouped clients send theirs on their rated items)
            sent = uploads[p]["counts"]
            if isinstance(sent, ImplicitRows):
                sent.add_to(counts)
            else:
                counts += sent
    if auto:
        state["ss"] = np.array([_sum_squares(uploads[p]) for p in range(n_clients)])
        state["alpha"] = state["alpha_max"] = AUTO_MAX * np.sqrt(state["ss"].sum() / n_ratings)
        return state, {"Vt": server_state["Vt"], "alpha": np.array([state["alpha"]])}
    return state, server_state["Vt"]


def server_update(server_state, uploads, round_index, *, d_factor, local_iter_v, alpha_v,
                  l1_ratio, positive, biased=False, n_ratings=None, n_components=None):
    """``Q2 = local_iter_v`` proximal-gradient steps on ``V`` with the exact gradient (32).

    The sums ``G1_j``, ``G2_j`` hold every client's latest aggregates, so the gradient of
    item ``j``'s row at any ``V`` is ``G1_j v_j - G2_j``: each step is exact for the clients'
    current factors (the sampled clients' new ones, the others' unchanged ones). The cache
    is updated in place (the server owns it and it is large): the sums take the uploaded
    clients' changes and are recomputed exactly every ``RESUM_EVERY`` rounds, which bounds
    the rounding drift; both in client order. Weighted regularization (``server_state``
    holds the item counts ``n_j``): the penalty ``alpha_v/2 sum_j n_j ||v_j||^2`` is taken
    whole in the prox, an exact per-row shrink, and ``d`` holds the data's Lipschitz bound
    only. ``alpha_v="auto"``: at the round's strength; then the next round's from the new
    ``V`` (:func:`auto_alpha`), broadcast with it.
    """
    Vt, total = server_state["Vt"], server_state["sums"]
    auto = "ss" in server_state
    if auto:
        if alpha_v == "auto":
            alpha_v = server_state["alpha"]
        for c, upload in uploads.items():
            server_state["ss"][c] = _sum_squares(upload)
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
    r = free.shape[1]
    G2, G1 = total[:, :r], total[:, r:].reshape(-1, r, r)
    for _ in range(local_iter_v):
        grad = np.matmul(G1, free[:, :, None])[:, :, 0] - G2
        if counts is None:
            free = prox_nonsmooth(free - (grad + ridge * free) / d, 1.0 / d, alpha_v,
                                  l1_ratio, positive)
        else:
            free = prox_elastic_net(free - grad / d, 1.0 / d, alpha_v * counts[:, None],
                                    l1_ratio, positive)
    Vt = _biases.with_item(free) if biased else free
    state = {**server_state, "Vt": Vt, "segments": segments, "sums": total}
    if not auto:
        return state, Vt
    state["alpha"] = auto_alpha(free, total, float(state["ss"].sum()), n_ratings, n_components,
                                state["alpha_max"])
    return state, {"Vt": Vt, "alpha": np.array([state["alpha"]])}


def _metrics(state, block, broadcast, *, alpha_u, alpha_v, **params):
    """:func:`._fedmavg.client_metrics` at ``V``; also the sums over a client group's stacked
    rows (a :class:`~sklearn_fedmf._groups.ClientGroup` has the block's fields)."""
    Vt, alpha_u, alpha_v = unpack(broadcast, alpha_u, alpha_v)
    return client_metrics(state, block, {"Vt": Vt}, alpha_u=alpha_u, alpha_v=alpha_v, **params)


def _combine(server_state, sums, *, alpha_v, **params):
    """:func:`._fedmavg.combine_metrics` at the round's strength; ``"auto"`` strengths also
    record ``alpha``, the strength the server sends with this round's ``V``."""
    if alpha_v == "auto":
        alpha_v = server_state["alpha"]
    record = combine_metrics(server_state, sums, alpha_v=alpha_v, **params)
    if "alpha" in server_state:
        record["alpha"] = float(server_state["alpha"])
    return record


def make_protocol(*, n_items, n_clients, n_components, local_iter_u, local_iter_v, c_factor,
                  d_factor, alpha_u, alpha_v, l1_ratio, positive, init_scale, biased=False,
                  weighted=False, n_ratings=None):
    """Bind the hyperparameters to the pure functions above (``"auto"`` strengths:
    ``n_ratings``, the sum of the clients' rating counts, is the rule's denominator)."""
    auto = "auto" in (alpha_u, alpha_v)
    update = dict(local_iter_u=local_iter_u, c_factor=c_factor, alpha_u=alpha_u,
                  l1_ratio=l1_ratio, positive=positive, biased=biased, weighted=weighted)
    init = dict(init_scale=init_scale, positive=positive, biased=biased, weighted=weighted,
                sum_squares=auto)
    metrics = dict(alpha_u=alpha_u, l1_ratio=l1_ratio, biased=biased, alpha_v=alpha_v,
                   weighted=weighted)
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items,
                            n_components=_biases.n_factors(n_components, biased),
                            init_scale=init_scale, biased=biased),
        init_client=partial(init_client, **init),
        server_init_uploads=partial(server_init_uploads, n_clients=n_clients, auto=auto,
                                    n_ratings=n_ratings),
        client_update=partial(client_update, **update),
        server_update=partial(server_update, d_factor=d_factor, local_iter_v=local_iter_v,
                              alpha_v=alpha_v, l1_ratio=l1_ratio, positive=positive,
                              biased=biased, n_ratings=n_ratings, n_components=n_components),
        client_metrics=partial(_metrics, **metrics),
        combine_metrics=partial(_combine, loss_scale=1.0, alpha_v=alpha_v,
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
    factor ``V``, then send their data aggregates: for each item ``j`` their users rated,
    ``G1_j = sum_t u_t u_t^T`` and ``G2_j = sum_t x_tj u_t`` (the paper's ``H H^T`` and ``X
    H^T`` (29), one per item as the loss is masked), and ``U_p^T U_p``. From every client's
    latest aggregates the server rebuilds the exact gradient in ``V`` at any ``V`` and takes
    ``local_iter_v`` proximal-gradient steps alone. Clients that are not sampled neither
    compute nor send; their aggregates stay exact, as their factors did not move.

    With every client sampled the result does not depend on the partition of the rows. The
    aggregates disclose which items a client's users rated, and more (a one-user client's
    ratings minus its bias; see the module documentation): this is the price of sharing
    data statistics instead of models.

    Parameters
    ----------
    n_components : int, default=5
        Rank ``r`` of the factorization.
    local_iter_u : int, default=10
        Local steps ``Q1`` on the user factors per round.
    local_iter_v : int, default=1
        The server's steps ``Q2`` on ``V`` per round, each with the exact gradient rebuilt
        from the clients' aggregates (no client takes part in them).
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
        clients' ratings (the paper's footnote); a client drawn twice sends its aggregates once
        and it is applied once.
    max_iter : int, default=100
        Communication rounds (one server step each).
    tol : float, default=0.0
        Stop when the relative change of the objective falls below ``tol``.
    alpha_u, alpha_v : float or "auto", default="auto"
        Elastic-net regularization of the user and item factors (as in
        :class:`~sklearn_fedmf.FedMAvg`). ``"auto"`` (plain penalties): the server sets the
        strength each round to ``AUTO_C * sigma^2 / s^2`` at its current model, the noise
        variance (training residual per rating) over a factor entry's prior variance ``s^2 =
        sqrt(q / r)``, ``q`` the variance of the rank-``r`` part ``u.v`` on the ratings: the
        ratio of the MAP objective of a Gaussian model (Salakhutdinov & Mnih's PMF), with
        ``AUTO_C = 3.5``. It starts at, and never exceeds, ``10`` times the root mean square
        of the (centred) ratings (the former constant 10 on ratings of deviation about 1):
        low-noise data get weaker penalties, data whose rank-``r`` signal is weak against the
        noise (MovieLens) keep about 10. It follows the ratings' scale (ratings times ``c``:
        strength times ``c``). Each client adds one number to its message (see the module
        documentation). With ``regularization="weighted"``, ``"auto"`` is 0.1 per rating.
        The values used are ``alpha_u_`` and ``alpha_v_``. Measured across data sets
        (``benchmarks/bench_defaults.py``); the papers' ``1e-6`` is in ``PAPER_SETTINGS``.
    l1_ratio : float, default=0.0
        Mix of the elastic net: 0 is squared l2, 1 is l1 (soft-thresholding).
    regularization : {"plain", "weighted"}, default="plain"
        ``"plain"``: the papers' penalties, one strength for every row. ``"weighted"``:
        ALS-WR's weighted lambda, each user's row scaled by its number of ratings and each
        item's by its number of ratings (``alpha`` is then a strength per rating). The
        server learns the item counts once: every client sends its ratings per item in
        round 1 (counted in its bytes; the shared aggregates already show which items a
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
    clip : bool, default=True
        Clip predictions (``predict``, ``score``, and through
        :class:`~sklearn_fedmf.RatingRegressor` its pairs and ``recommend`` scores) to the
        training rating range ``rating_range_``, as Surprise does; False gives the raw model.
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
        One record per round (round 1's bytes include every client's initial aggregates).
    converged_, degenerate_
        As in :class:`~sklearn_fedmf.FedMCADMM`.
    n_features_in_ : int
    alpha_u_, alpha_v_ : float
        The strengths of the last round (``"auto"``: the server's last value; fold-in uses
        ``alpha_u_``).

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
        "local_iter_v": [Interval(Integral, 1, None, closed="left")],
        "c_factor": [Interval(Real, 0, None, closed="neither")],
        "d_factor": [Interval(Real, 0, None, closed="neither")],
        "init_scale": [Interval(Real, 0, None, closed="left")],
        "sampling": [StrOptions({"uniform", "weighted"})],
        "regularization": [StrOptions({"plain", "weighted"})],
        "alpha_u": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "alpha_v": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
    }

    def __init__(
        self,
        n_components=5,
        *,
        local_iter_u=10,
        local_iter_v=1,
        c_factor=0.51,
        d_factor=0.501,
        n_clients=10,
        partition="random",
        clients_per_round=None,
        sampling="uniform",
        max_iter=100,
        tol=0.0,
        alpha_u="auto",
        alpha_v="auto",
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
        self.local_iter_u = local_iter_u
        self.local_iter_v = local_iter_v
        self.c_factor = c_factor
        self.d_factor = d_factor
        self.sampling = sampling
        self.l1_ratio = l1_ratio
        self.regularization = regularization
        self.positive = positive
        self.init_scale = init_scale

    def _strengths(self):
        """``(alpha_u, alpha_v)`` for the protocol: ``"auto"`` is the server's rule with the
        plain penalties, ``AUTO_WEIGHTED`` per rating with the weighted ones."""
        if self.regularization == "plain":
            return self.alpha_u, self.alpha_v
        return tuple(AUTO_WEIGHTED if a == "auto" else a for a in (self.alpha_u, self.alpha_v))

    def _make_protocol(self, ctx):
        alpha_u, alpha_v = self._strengths()
        auto = "auto" in (alpha_u, alpha_v)
        if ctx.warm and auto != ("ss" in self._federation.server_state):
            raise ValueError("warm_start cannot switch alpha_u or alpha_v between 'auto' and a "
                             "fixed strength; fit again without warm_start.")
        return make_protocol(
            n_items=ctx.n_features, n_clients=ctx.n_clients, n_components=self.n_components,
            local_iter_u=self.local_iter_u, local_iter_v=self.local_iter_v,
            c_factor=self.c_factor, d_factor=self.d_factor,
            alpha_u=alpha_u, alpha_v=alpha_v, l1_ratio=self.l1_ratio,
            positive=self.positive, init_scale=self.init_scale, biased=self.biased,
            weighted=self.regularization == "weighted", n_ratings=ctx.info["n_ratings"],
        )

    def _collect(self, state, blocks, ctx):
        super()._collect(state, blocks, ctx)
        alpha = state.server_state.get("alpha")
        self.alpha_u_, self.alpha_v_ = (alpha if a == "auto" else a for a in self._strengths())

    def _read_components(self, server_state, broadcast):
        return np.ascontiguousarray(server_state["Vt"].T)

    def _read_user_factors(self, client_state):
        return client_state["U"]
