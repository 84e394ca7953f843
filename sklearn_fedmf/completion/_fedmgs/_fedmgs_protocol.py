"""FedMGS's pure functions for matrix completion (Wang & Chang, Algorithm 2), and
:func:`make_protocol`, which binds them into FedMGS's round
(:mod:`sklearn_fedmf.completion._fedmgs._fedmgs_round`, shared with clustering).

Orientation and objective as in :mod:`._fedmavg_protocol` (``variant="wang_chang"``): the
global item factor ``V`` (the paper's ``W``) lives on the server, client ``p`` keeps ``U_p``
(``H_p^T``)::

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
Netflix shape's 100M ratings). With one-user clients only, the running sums hold each
``G1_j``'s upper triangle (``r + r (r + 1) / 2`` numbers per item), and the one-user
clients' changes are added by item ranges, which ``n_jobs`` threads share (each item's sum
in client order: the same bits for any ``n_jobs``). Client groups (``_groups``) run their
clients' phases in one compiled call (``_fedmgs_kernels``); the messages and bytes are
those of the per-client functions.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ... import _biases
from ..._kernels import read_only, split_rows
from ..._prox import item_counts, prox_elastic_net, row_alpha
from ...engine._federation import FederatedProtocol, SummableUploads
from ...engine._groups import LazyRows, offsets
from ...exceptions import FederationError
from .._auto_strengths import start_item_biases, start_user_biases
from .._fedmavg._fedmavg_protocol import (
    EPS_LIPSCHITZ,
    client_metrics,
    combine_metrics,
    init_user_factors,
    lambda_max,
    prox_nonsmooth,
    user_steps,
)
from . import _fedmgs_round as rounds
from ._fedmgs_batched import group_layout, group_share, make_batched, unpack
from ._fedmgs_kernels import (
    add_outer,
    add_rows,
    ascending_runs,
    outer_changes,
    outer_sum,
    quadratic_forms,
    replace_outer,
    replace_rows,
)

RESUM_EVERY = 20  # rounds between exact sums of the server's cached aggregates

# alpha_u = alpha_v = "auto": the strength MAP estimation gives a Gaussian model, noise
# variance over a factor entry's prior variance, estimated each round by the server at its
# current model (:func:`auto_alpha`), times AUTO_C, capped at AUTO_MAX times the ratings'
# standard deviation (the former constant 10 on ratings of deviation ~1). AUTO_C was chosen
# on bench_defaults' "chosen" sets (docs/guide/defaults.rst).
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
    only weakens the penalty where the data's noise is low against its low-rank signal.
    (The three sums in one compiled pass, :func:`._fedmgs_kernels.quadratic_forms`: a
    three-operand ``einsum`` took 4 ms a round at the Netflix shape's 17,770 items.)"""
    fitted, cross, signal = quadratic_forms(np.ascontiguousarray(free), total, n_components)
    rss = max(sum_squares - 2.0 * cross + fitted, 0.0)
    if signal <= 0.0:
        return cap
    return min(cap, AUTO_C * rss / n_ratings * np.sqrt(n_components * n_ratings / signal))


def _sum_squares(upload):
    """A client's ``S``: sent in the rows form, the squares of the compact form's ``x``."""
    return float(upload["ss"]) if "ss" in upload else float(np.dot(upload["x"], upload["x"]))


# ---- pure solver functions ------------------------------------------------------------------
def init_server(rng, *, n_items, n_components, init_scale, biased=False, item_bias=None):
    """``V^0`` of rank ``n_components`` (:func:`~sklearn_fedmf._biases.random_item_factor`;
    ``item_bias``: ``[V^0; 1; b_i^0]``, the ``"auto"`` start of :mod:`._auto_strengths`)."""
    Vt = _biases.random_item_factor(rng, n_items, n_components, init_scale, biased)
    if biased:
        start_item_biases(Vt, item_bias)
    return {"Vt": Vt}, Vt


def share(U, X, biased=False, sum_squares=False, layout=None):
    """What a client sends: its data aggregates ``G1_j``, ``G2_j`` on the items it rated (the
    masked form of (29); module docstring) and its Gram; they do not depend on ``V``.

    ``{"items", "G", "gram"}``: row ``q`` of ``G`` is ``[G2_j, vec(G1_j)]`` for item ``j =
    items[q]``. A one-user client with biases sends the compact form ``{"items", "x", "a"}``
    (``G1_j = a a^T``, ``G2_j = x_j a``). With biases ``a_t = [u_t, 1]`` (the columns the free
    item entries ``[V; b_i]`` multiply) and ``x_tj`` is the rating minus ``b_u``.
    ``sum_squares`` (``alpha_u="auto"``): the rows form also holds ``"ss"``, ``sum_tj
    x_tj^2`` (the compact form holds every ``x_tj`` already). ``layout``: the client's
    rated items as :func:`._fedmgs_batched.group_layout` gives them (fixed by its data; None:
    laid out here)."""
    group = _OneClient(X)
    layout = group_layout(group) if layout is None else layout
    return group_share({"U": U, **layout}, group, np.array([0]), biased, sum_squares)[0]


class _OneClient:
    """A client's block seen as a group of one client (for :func:`group_share`)."""

    def __init__(self, X):
        self.X, self.start, self.n_rows, self.n_clients = X, 0, X.shape[0], 1
        self.row_ptr = np.array([0, X.shape[0]], dtype=np.int64)


def init_client(block, Vt, rng, *, init_scale, positive, biased=False, weighted=False,
                sum_squares=False, user_shrinkage=None):
    """Private ``U_p^0`` and the upload of its aggregates (Algorithm 2's ``G1^0``, ``G2^0``);
    weighted regularization: also its ratings per item, once (their sum over the clients is
    the item weights ``n_j``). The state also keeps the layout of its rated items, which its
    data fixes (laid out once, not every round)."""
    U = init_user_factors(block, Vt.shape[1], rng, init_scale, positive, biased)
    if biased:  # (user_shrinkage: b_u starts at its shrunk mean, the "auto" start)
        start_user_biases(U, block.X, Vt, user_shrinkage)
    layout = group_layout(_OneClient(block.X))
    upload = share(U, block.X, biased, sum_squares, layout)
    if weighted:
        upload["counts"] = item_counts(block.X)
    return {"U": U, "layout": layout}, upload


def u_phase(state, block, broadcast, *, local_iter_u, c_factor, alpha_u, l1_ratio, positive,
            biased=False, weighted=False):
    """Q1 proximal-gradient steps on ``U_p`` at ``V^s`` (step ``1/(c_factor L_U)``;
    ``alpha_u="auto"``: at the broadcast strength)."""
    Vt, alpha_u, _ = unpack(broadcast, alpha_u)
    alpha_u = row_alpha(alpha_u, block.X, weighted)
    return {**state, "U": user_steps(state["U"], Vt, block.X, local_iter_u, c_factor,
                                     alpha_u * (1.0 - l1_ratio), alpha_u, l1_ratio, positive,
                                     biased)}


def share_state(state, block, broadcast, *, biased=False):
    """:func:`share` of the client's new ``U_p`` (``"auto"`` strengths, a dict broadcast:
    with the sum of squares)."""
    return share(state["U"], block.X, biased, isinstance(broadcast, dict), state.get("layout"))


def client_update(state, block, broadcast, rng, selected, *, biased=False, **params):
    """FedMGS's client round (:func:`sklearn_fedmf.completion._fedmgs._fedmgs_round.client_update`)
    with :func:`u_phase` (``params``) and :func:`share_state`."""
    return rounds.client_update(state, block, broadcast, rng, selected,
                                local_phase=partial(u_phase, biased=biased, **params),
                                share=partial(share_state, biased=biased))


# ---- the server's cache of every client's latest aggregates ---------------------------------
# A client's aggregates are zero outside the items it rated, so the server keeps each
# client's rated rows only (memory proportional to the ratings, not p n r^2) and the running
# sums ``total`` (row j: [G2_j, vec(G1_j)]; with one-user clients only, packed: G2_j and the
# upper triangle of the symmetric G1_j row by row, as ``_pack_blocks``, see packed_sums).
# Consecutive clients are stored together in segments: dicts with the segment's first client
# ``lo``, ``ptr`` (client ``lo + i`` owns rows ``ptr[i]:ptr[i + 1]``) and ``items``, and
# either (``kind="rows"``) ``G``, the rows, and ``grams``, one Gram per client, or
# (``kind="outer"``, one-user clients with biases) ``x`` and ``a``, one ``a`` per client. A
# client's piece is ``(kind, items, G or x, gram or a)``, the last with a leading axis.
def _piece(upload):
    """What the cache keeps of one upload (views of the message's arrays)."""
    if "x" in upload:
        return "outer", upload["items"], upload["x"], upload["a"][None]
    return "rows", upload["items"], upload["G"], np.asarray(upload["gram"])[None]


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


def _items(a):
    """Item indices as the cache's kernels take them: int32 (the clients' layouts are views
    of their CSR indices, int32 for any data that fits in memory) and read-only, a view
    unless a client sent another dtype (numba compiles a signature per dtype and writeable
    flag: a cached segment may be a concatenation or a client's read-only view)."""
    return read_only(a, np.int32)


def _segment(lo, pieces, chained=False, items_chained=None):
    """The pieces as one segment: views of their buffer where ``chained`` (``items_chained``
    for the items, ``chained`` when None), else concatenations."""
    kind = pieces[0][0]
    _, rows, x, y = zip(*pieces)
    ptr = np.zeros(len(pieces) + 1, dtype=np.int64)
    np.cumsum([len(r) for r in rows], out=ptr[1:])
    first, second = _FIELDS[kind]
    items_chained = chained if items_chained is None else items_chained
    return {"kind": kind, "lo": lo, "ptr": ptr, "items": _items(_joined(rows, items_chained)),
            first: _joined(x, chained), second: _joined(y, chained)}


def _one_segment(piece):
    """:func:`_segment` of one piece, without a copy of its (contiguous) arrays."""
    kind, rows, x, y = piece
    first, second = _FIELDS[kind]
    return {"kind": kind, "lo": 0, "ptr": np.array([0, len(rows)], dtype=np.int64),
            "items": _items(rows), first: np.ascontiguousarray(x),
            second: np.ascontiguousarray(y)}


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


# The compact segments' kernels work on item ranges: consecutive segments' calls are kept
# and run together, each range by one task that takes every call in segment order (one
# split_rows a round; one per segment cost more in threads than it saved), so that each
# item's sums add in client order whatever the ranges and threads (the same bits).
def _item_ranges(lo, hi, calls):
    """Rows ``lo:hi`` of every pending call ``(kernel, args, done)``, in order."""
    for kernel, args, _ in calls:
        kernel(lo, hi, *args)


def _flush(total, calls):
    """Run the pending item-range calls (threads inside ``parallel_kernels``), then each
    one's ``done``."""
    if calls:
        split_rows(_item_ranges, total.shape[0], calls)
        for _, _, done in calls:
            if done is not None:
                done()
        calls.clear()


def packed_sums(segments):
    """Whether the server keeps its sums packed: when every cached client is a one-user
    client (compact form). Its ``G1_j`` are sums of ``a a^T``, whose ``a_b a_c`` is ``a_c
    a_b`` exactly: the lower triangle would repeat the upper's sums (0.64 of the numbers at
    rank 6; the update measured 2.3x faster). A rows-form client's update is 1.9x slower on
    packed sums (its rows are full): those keep ``[G2_j, vec(G1_j)]``."""
    return all(seg["kind"] == "outer" for seg in segments)


def cache_sum(segments, n_items, r):
    """The exact sums of the cached aggregates (packed as :func:`packed_sums` says), in client
    order (independent of ``n_jobs``)."""
    total = np.zeros((n_items, r + (r * (r + 1) // 2 if packed_sums(segments) else r * r)))
    pending = []
    for seg in segments:
        if seg["kind"] == "rows":
            _flush(total, pending)
            add_rows(total, _items(seg["items"]), seg["G"], 1.0)
        else:
            items = _items(seg["items"])
            pending.append((add_outer, (total, items, seg["ptr"], seg["x"], seg["a"], 1.0,
                                        ascending_runs(items, seg["ptr"])), None))
    _flush(total, pending)
    return total


def gram_sum(segments):
    """``sum_p A_p^T A_p`` over the cached Grams."""
    return sum(seg["grams"].sum(axis=0) if seg["kind"] == "rows" else outer_sum(seg["a"])
               for seg in segments)


def _join_compact(sent):
    """Compact uploads ``sent`` joined: ``(items, ptr, x, A)``, upload ``q``'s in
    ``ptr[q]:ptr[q + 1]`` and ``A[q]`` (a copy of their few numbers per rating: one kernel
    call per client, with the views' checks of the rows form, cost 3x the round at one
    client per user)."""
    items, x, a = zip(*[(u["items"], u["x"], u["a"]) for u in sent])
    ptr = offsets(np.fromiter(map(len, items), dtype=np.int64, count=len(items)))
    # (np.stack of 604 rows costs 10x their concatenation)
    return (_items(np.concatenate(items)), ptr, np.concatenate(x),
            np.concatenate(a).reshape(len(a), -1))


def _replace_outer(seg, total, local, new_items, new_ptr, new_x, new_A, mismatch, pending):
    """:func:`._fedmgs_kernels.replace_outer` of a compact segment's clients ``local``, added
    to ``pending``: the checks and each client's change of ``a a^T`` now, the items by
    ranges with the other pending calls (threads inside ``parallel_kernels``: the server's
    update was serial while the 100-client round ran on ``n_jobs`` workers), then the new
    ``a``."""
    r = new_A.shape[1]
    packed = total.shape[1] < r + r * r
    change = np.empty((len(local), r * (r + 1) // 2 if packed else r * r))
    items = _items(seg["items"])
    ascending = outer_changes(items, seg["ptr"], seg["a"], local, new_items, new_ptr, new_A,
                              mismatch, change, packed)

    def done():
        seg["a"][local[~mismatch]] = new_A[~mismatch]

    pending.append((replace_outer, (total, items, seg["ptr"], seg["x"], seg["a"],
                                    local, new_ptr, new_x, new_A, mismatch, change,
                                    ascending), done))


def update_cache(segments, total, uploads):
    """Replace the cached aggregates and Grams of the clients of ``uploads`` (sorted) and
    update ``total`` by their changes, in place, in client order. A client's rated items
    are fixed by its data: a message on other items, or of the other form, is refused."""
    if not uploads:
        return segments
    clients = np.fromiter(uploads, dtype=np.int64, count=len(uploads))
    where = np.searchsorted([s["lo"] for s in segments], clients, side="right") - 1
    pending = []  # the compact segments' item-range calls, run together (_flush)
    # every upload compact and in client order (one client per user): joined once, each
    # segment's clients a run of them
    joined = (_join_compact(uploads.values()) if np.all(np.diff(clients) > 0)
              and all("x" in u for u in uploads.values()) else None)
    for g in np.unique(where).tolist():
        seg, members = segments[g], np.flatnonzero(where == g)
        local = clients[members] - seg["lo"]
        if seg["kind"] == "outer" and joined is not None:
            q0, q1 = int(members[0]), int(members[-1]) + 1
            items, ptr, x, A = joined
            mismatch = np.zeros(q1 - q0, dtype=bool)
            _replace_outer(seg, total, local, items, ptr[q0:q1 + 1], x, A[q0:q1], mismatch,
                           pending)
            sent = []
        else:
            sent = [uploads[c] for c in clients[members].tolist()]
        if seg["kind"] == "outer" and sent and all("x" in u for u in sent):
            mismatch = np.zeros(len(sent), dtype=bool)
            items, ptr, x, A = _join_compact(sent)
            _replace_outer(seg, total, local, items, ptr, x, A, mismatch, pending)
            sent = []
        pieces = [_piece(u) for u in sent]
        if pieces:
            mismatch = np.array([p[0] != seg["kind"] for p in pieces])
        if pieces and not mismatch.any():
            # rows-form uploads of a group are consecutive views of its call's arrays: one
            # call on them as they are, their items (views of the clients' fixed layout,
            # with gaps) joined; other uploads one call each (concatenating them would copy
            # every client's rows); the same updates in client order either way
            spans = [tuple(_span(x) for x in piece[1:]) for piece in pieces]
            chained = [all(_follows(a[f], b[f]) for a, b in zip(spans, spans[1:]))
                       for f in range(3)]
            if len(pieces) > 1 and chained[1] and chained[2]:
                calls = [(slice(None), _segment(0, pieces, chained=True,
                                                items_chained=chained[0]))]
            else:
                calls = [(slice(q, q + 1), _one_segment(p)) for q, p in enumerate(pieces)]
            for part, new in calls:
                if seg["kind"] == "rows":
                    _flush(total, pending)
                    seg["grams"][local[part]] = new["grams"]
                    replace_rows(total, _items(seg["items"]), seg["ptr"], seg["G"],
                                 local[part], new["items"], new["ptr"], new["G"],
                                 mismatch[part])
                else:
                    _replace_outer(seg, total, local[part], new["items"], new["ptr"],
                                   new["x"], new["a"], mismatch[part], pending)
        if mismatch.any():
            _flush(total, pending)
            raise FederationError(
                f"Client {int(local[mismatch][0] + seg['lo'])} sent its aggregates on other "
                "items or in another form than before; its rated items are fixed.")
    _flush(total, pending)
    return segments


def server_init_uploads(server_state, uploads, *, n_clients, auto=False, n_ratings=None,
                        rating_rms=None):
    """Cache every client's aggregates (rated rows) and Gram, and their sums (Algorithm 2's
    ``G1^0``, ``G2^0``, item by item); ``auto``: also their sums of squares, and round 1's
    strength, the cap ``AUTO_MAX`` times the ratings' root mean square (what the sums of
    squares give before any bias is fitted; ``rating_rms`` when the biases start elsewhere),
    goes with ``V``."""
    pieces = [_piece(uploads[p]) for p in range(n_clients)]
    r = pieces[0][3].shape[-1]
    segments = cache_segments(pieces)
    total = cache_sum(segments, server_state["Vt"].shape[0], r)
    state = {"Vt": server_state["Vt"], "segments": segments, "sums": total}
    if "counts" in uploads[0]:
        state["counts"] = counts = np.zeros(total.shape[0])
        for p in range(n_clients):  # (grouped clients send theirs on their rated items)
            sent = uploads[p]["counts"]
            if isinstance(sent, LazyRows):
                sent.add_to(counts)
            else:
                counts += sent
    if auto:
        state["ss"] = np.array([_sum_squares(uploads[p]) for p in range(n_clients)])
        if rating_rms is None:
            rating_rms = np.sqrt(state["ss"].sum() / n_ratings)
        state["alpha"] = state["alpha_max"] = AUTO_MAX * rating_rms
        return state, {"Vt": server_state["Vt"], "alpha": np.array([state["alpha"]])}
    return state, server_state["Vt"]


def server_update(server_state, uploads, round_index, *, d_factor, local_iter_v, alpha_v,
                  l1_ratio, positive, biased=False, n_ratings=None, n_components=None):
    """``Q2 = local_iter_v`` proximal-gradient steps on ``V`` with the exact gradient (32):
    FedMGS's server step (:func:`sklearn_fedmf.completion._fedmgs._fedmgs_round.server_step`) on the
    plain server's cache (:func:`fold_cache`), by :func:`squared_step`."""
    return rounds.server_step(server_state, uploads, round_index, fold=fold_cache,
                              step=partial(squared_step, d_factor=d_factor,
                                           local_iter_v=local_iter_v, alpha_v=alpha_v,
                                           l1_ratio=l1_ratio, positive=positive, biased=biased,
                                           n_ratings=n_ratings, n_components=n_components))


def fold_cache(server_state, uploads, round_index):
    """The plain server's fold: ``(state, total, grams)``, its cache of every client's latest
    aggregates with the uploaded clients' changes, their sums and Grams.

    The sums ``G1_j``, ``G2_j`` hold every client's latest aggregates, so the gradient of
    item ``j``'s row at any ``V`` is ``G1_j v_j - G2_j``: each step is exact for the clients'
    current factors (the sampled clients' new ones, the others' unchanged ones). The cache
    is updated in place (the server owns it and it is large): the sums take the uploaded
    clients' changes and are recomputed exactly every ``RESUM_EVERY`` rounds, which bounds
    the rounding drift; both in client order, the one-user clients' by item ranges (threads
    inside ``parallel_kernels``, the same bits). The state keeps them packed when
    :func:`packed_sums`; ``total`` is their ``[G2_j, vec(G1_j)]``. ``alpha_v="auto"``: the
    clients' sums of squares too.
    """
    total = server_state["sums"]
    if "ss" in server_state:  # (_sum_squares inline: 604 uploads a round at one per user)
        ss, dot = server_state["ss"], np.dot
        for c, upload in uploads.items():
            sent = upload.get("ss")
            ss[c] = dot(upload["x"], upload["x"]) if sent is None else sent
    segments = update_cache(server_state["segments"], total, uploads)
    grams = gram_sum(segments)
    r = grams.shape[0]
    if round_index % RESUM_EVERY == 0:
        total = cache_sum(segments, total.shape[0], r)
    full = total if total.shape[1] == r + r * r else _unpack_blocks(total, r)
    return {**server_state, "segments": segments, "sums": total}, full, grams


def squared_step(server_state, total, grams, *, alpha_v, d_factor, local_iter_v, l1_ratio,
                 positive, biased, n_ratings, n_components):
    """The squared loss's step in ``V``: ``Q2`` proximal-gradient steps from the sums
    ``total`` of every client's latest aggregates and ``grams`` of their Grams.

    Weighted regularization (``server_state`` holds the item counts ``n_j``): the penalty
    ``alpha_v/2 sum_j n_j ||v_j||^2`` is taken whole in the prox, an exact per-row shrink,
    and ``d`` holds the data's Lipschitz bound only. ``alpha_v="auto"``: at the round's
    strength; then the next round's from the new ``V`` (:func:`auto_alpha`), broadcast with
    it.
    """
    if alpha_v == "auto":
        alpha_v = server_state["alpha"]
    Vt = server_state["Vt"]
    auto = "ss" in server_state
    counts = server_state.get("counts")
    ridge = alpha_v * (1.0 - l1_ratio) if counts is None else 0.0
    if biased:  # one bound per column block: the ones column must not slow the factors
        d = d_factor * np.maximum(_biases.item_step_bounds(grams, ridge), EPS_LIPSCHITZ)
    else:
        d = d_factor * max(lambda_max(grams) + ridge, EPS_LIPSCHITZ)
    free = _biases.free_item(Vt) if biased else Vt  # (the fixed row does not move)
    r = free.shape[1]
    G2, G1 = total[:, :r], total[:, r:].reshape(-1, r, r)
    if counts is None:  # the ridge in the gradient, the l1 part and the sign in the prox
        free = rounds.server_steps(
            free, local_iter_v, d,
            lambda W: (np.matmul(G1, W[:, :, None])[:, :, 0] - G2) + ridge * W,
            lambda Z, d: prox_nonsmooth(Z, 1.0 / d, alpha_v, l1_ratio, positive))
    else:  # the weighted penalty whole in the prox: an exact per-row shrink
        alpha = alpha_v * counts[:, None]
        free = rounds.server_steps(
            free, local_iter_v, d, lambda W: np.matmul(G1, W[:, :, None])[:, :, 0] - G2,
            lambda Z, d: prox_elastic_net(Z, 1.0 / d, alpha, l1_ratio, positive))
    Vt = _biases.with_item(free) if biased else free
    state = {**server_state, "Vt": Vt}
    if not auto:
        return state, Vt
    state["alpha"] = auto_alpha(free, total, float(state["ss"].sum()), n_ratings, n_components,
                                state["alpha_max"])
    return state, {"Vt": Vt, "alpha": np.array([state["alpha"]])}


# ---- secure aggregation: the running sums of every client's latest aggregates -----------------
# The server needs sum_p of each client's LATEST aggregates, Gram and sum of squares: a
# cumulative exchange (sklearn_fedmf.secure._rounds). Each client sends its aggregates dense
# over all items (the item set is public), each item's symmetric r x r block as its upper
# triangle: n_items (r + r (r + 1) / 2) numbers; the sum of squares divided by the public
# number of ratings, so that it fits the encoding's clip.
def _pack_blocks(sums, r):
    """``(n_items, r + r^2)`` aggregates -> ``(n_items, r + r (r + 1) / 2)``: each item's
    symmetric block ``sum u u^T`` as its upper triangle (what the secure sum carries)."""
    rows, cols = np.triu_indices(r)
    blocks = sums[:, r:].reshape(-1, r, r)
    return np.concatenate([sums[:, :r], blocks[:, rows, cols]], axis=1)


def _unpack_blocks(packed, r):
    """The inverse of :func:`_pack_blocks` (the blocks made symmetric from their triangle):
    one gather of the packed columns."""
    rows, cols = np.triu_indices(r)
    source = np.empty((r, r), dtype=np.intp)
    source[rows, cols] = source[cols, rows] = r + np.arange(len(rows))
    return packed.take(np.concatenate([np.arange(r), source.ravel()]), axis=1)


def secure_summands(upload, weight=None, broadcast=None, *, n_items, auto, n_ratings):
    """A client's aggregates over all items (blocks packed), its Gram and (``auto``) its sum of
    squares over ``n_ratings``, from its upload in either form."""
    kind, items, x, y = _piece(upload)
    r = y.shape[-1]
    sums = cache_sum([_segment(0, [(kind, items, x, y)])], n_items, r)
    out = {"sums": sums if sums.shape[1] < r + r * r else _pack_blocks(sums, r),
           "gram": np.asarray(y[0] if kind == "rows" else outer_sum(y), dtype=np.float64)}
    if auto:
        out["ss"] = _sum_squares(upload) / n_ratings
    return out


def denoise_aggregates(sums):
    """Noisy secure sums (``privacy=DistributedDP``) post-processed: each item's block
    ``sum u u^T`` and the Gram sum made positive semidefinite
    (:func:`~sklearn_fedmf.privacy._distributed_dp.psd_project`), the sum of squares kept
    above zero."""
    from ...privacy._distributed_dp import psd_project

    out = dict(sums)
    r = out["gram"].shape[0]
    total = _unpack_blocks(out["sums"], r)
    blocks = psd_project(total[:, r:].reshape(-1, r, r))
    out["sums"] = _pack_blocks(np.concatenate([total[:, :r], blocks.reshape(-1, r * r)],
                                              axis=1), r)
    out["gram"] = psd_project(out["gram"])
    if "ss" in out:
        out["ss"] = max(float(out["ss"]), np.finfo(np.float64).tiny)
    return out


def secure_server_init(server_state, sums, n_summed, *, n_clients, auto, n_ratings,
                       rating_rms=None):
    """:func:`server_init_uploads` from the secure sums (every client's)."""
    if n_summed != n_clients:
        raise ValueError(f"FedMGS needs the aggregates of all {n_clients} clients, got "
                         f"{n_summed}.")
    Vt = server_state["Vt"]
    total = _unpack_blocks(sums["sums"], sums["gram"].shape[0])
    state = {"Vt": Vt, "sums": total, "grams": sums["gram"]}
    if not auto:
        return state, Vt
    ss = sums["ss"] * n_ratings
    state["ss"] = np.array([ss])  # (the plain server keeps one per client; their sum counts)
    rms = np.sqrt(ss / n_ratings) if rating_rms is None else rating_rms
    state["alpha"] = state["alpha_max"] = AUTO_MAX * rms
    return state, {"Vt": Vt, "alpha": np.array([state["alpha"]])}


def secure_server_update(server_state, sums, n_summed, round_index, *, n_ratings, **step):
    """:func:`server_update` at the running sums of the clients' latest aggregates
    (:func:`fold_secure`)."""
    return rounds.server_step(server_state, sums, n_summed, round_index,
                              fold=partial(fold_secure, n_ratings=n_ratings),
                              step=partial(squared_step, n_ratings=n_ratings, **step))


def fold_secure(server_state, sums, n_summed, round_index, *, n_ratings):
    """The secure server's fold: ``(state, total, grams)`` from the running sums the exchange
    delivered (blocks unpacked; ``"auto"``: the sum of squares, times ``n_ratings``)."""
    total = _unpack_blocks(sums["sums"], sums["gram"].shape[0])
    state = {**server_state, "sums": total, "grams": sums["gram"]}
    if "ss" in server_state:
        state["ss"] = np.array([sums["ss"] * n_ratings])
    return state, total, sums["gram"]


def _metrics(state, block, broadcast, *, alpha_u, alpha_v, **params):
    """:func:`._fedmavg_protocol.client_metrics` at ``V``; also the sums over a client
    group's stacked rows (a :class:`~sklearn_fedmf.engine._groups.ClientGroup` has the block's
    fields)."""
    Vt, alpha_u, alpha_v = unpack(broadcast, alpha_u, alpha_v)
    return client_metrics(state, block, {"Vt": Vt}, alpha_u=alpha_u, alpha_v=alpha_v, **params)


def _combine(server_state, sums, *, alpha_v, **params):
    """:func:`._fedmavg_protocol.combine_metrics` at the round's strength; ``"auto"`` strengths also
    record ``alpha``, the strength the server sends with this round's ``V``."""
    if alpha_v == "auto":
        alpha_v = server_state["alpha"]
    record = combine_metrics(server_state, sums, alpha_v=alpha_v, **params)
    if "alpha" in server_state:
        record["alpha"] = float(server_state["alpha"])
    return record


def make_protocol(*, n_items, n_clients, n_components, local_iter_u, local_iter_v, c_factor,
                  d_factor, alpha_u, alpha_v, l1_ratio, positive, init_scale, biased=False,
                  weighted=False, n_ratings=None, item_bias=None, user_shrinkage=None,
                  rating_rms=None):
    """Bind the hyperparameters to the pure functions above (``"auto"`` strengths:
    ``n_ratings``, the sum of the clients' rating counts, is the rule's denominator;
    ``item_bias``, ``user_shrinkage``: the biases' start, :mod:`._auto_strengths`, with
    ``rating_rms``, the centred ratings' root mean square, for the cap)."""
    auto = "auto" in (alpha_u, alpha_v)
    update = dict(local_iter_u=local_iter_u, c_factor=c_factor, alpha_u=alpha_u,
                  l1_ratio=l1_ratio, positive=positive, biased=biased, weighted=weighted)
    init = dict(init_scale=init_scale, positive=positive, biased=biased, weighted=weighted,
                sum_squares=auto, user_shrinkage=user_shrinkage)
    metrics = dict(alpha_u=alpha_u, l1_ratio=l1_ratio, biased=biased, alpha_v=alpha_v,
                   weighted=weighted)
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items, n_components=n_components,
                            init_scale=init_scale, biased=biased, item_bias=item_bias),
        init_client=partial(init_client, **init),
        server_init_uploads=partial(server_init_uploads, n_clients=n_clients, auto=auto,
                                    n_ratings=n_ratings, rating_rms=rating_rms),
        client_update=partial(client_update, **update),
        server_update=partial(server_update, d_factor=d_factor, local_iter_v=local_iter_v,
                              alpha_v=alpha_v, l1_ratio=l1_ratio, positive=positive,
                              biased=biased, n_ratings=n_ratings, n_components=n_components),
        client_metrics=partial(_metrics, **metrics),
        combine_metrics=partial(_combine, loss_scale=1.0, alpha_v=alpha_v,
                                l1_ratio=l1_ratio, biased=biased, weighted=weighted),
        batched=make_batched(init=init, update=update,
                             client_metrics=partial(_metrics, **metrics)),
        # (the weighted regularization's item counts are sent once per client: not summable)
        summable=None if weighted else SummableUploads(
            client=partial(secure_summands, n_items=n_items, auto=auto, n_ratings=n_ratings),
            server_update=partial(secure_server_update, d_factor=d_factor,
                                  local_iter_v=local_iter_v, alpha_v=alpha_v,
                                  l1_ratio=l1_ratio, positive=positive, biased=biased,
                                  n_ratings=n_ratings, n_components=n_components),
            cumulative=True,
            init_client=partial(secure_summands, n_items=n_items, auto=auto,
                                n_ratings=n_ratings),
            server_init=partial(secure_server_init, n_clients=n_clients, auto=auto,
                                n_ratings=n_ratings, rating_rms=rating_rms)),
    )
