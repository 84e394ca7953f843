"""The federated biases-only model: alternating least squares on ``mean + b_u + b_i``.

The model of Surprise's ``BaselineOnly`` (Koren, 2010, section 2.1) with its ``"als"`` method:
on the centred ratings ``x_ui = r_ui - mean`` it minimizes::

    1/2 sum_(u,i) (x_ui - b_u - b_i)^2 + alpha_u/2 sum_u b_u^2 + alpha_v/2 sum_i b_i^2

by exact block minimizations, items first as Surprise does::

    b_i <- sum_{u rated i} (x_ui - b_u) / (alpha_v + n_i)
    b_u <- sum_{i rated by u} (x_ui - b_i) / (alpha_u + n_u)

Federated: ``b_u`` is a client's own (it never leaves it), ``b_i`` lives on the server.

* Initialization: each client sends, for the items its users rated, its ratings' count and sum
  per item (``{"items", "counts", "sums"}``: the sums of ``x_ui - b_u`` at ``b_u = 0``). The
  counts do not change during the fit, so they are sent once. The server sets ``b_i`` (the
  first item step of Surprise's first epoch) and broadcasts it.
* Round ``k``: each sampled client solves its users' ``b_u`` in closed form against the
  broadcast ``b_i`` and sends the *change* of its per-item sums of ``x_ui - b_u`` on its rated
  items (``{"items", "sums"}``: ``-sum_{u rated i} (b_u^new - b_u^old)``). The server adds the
  changes into its running sums, which therefore always equal the sum of every client's
  latest sums (as FedMC-ADMM's server keeps ``sum_i beta W_i + Y_i``), and sets ``b_i``.
  It needs only the sum of a round's uploads (secure-aggregation ready) and ``O(n_items)``
  memory. Sending the sums themselves would tell the server nothing more: consecutive sums
  give the changes and the changes add up to the sums.

A client that is not sampled has not moved its ``b_u``, so its part of the server's sums is
exact: every server step is an exact minimization in ``b_i`` given every client's current
``b_u``, and partial participation is randomized block-coordinate descent on the same convex
objective. With every client in every round, round ``k`` is Surprise's user step of epoch
``k`` and item step of epoch ``k + 1``: after ``K`` rounds ``b_u`` is Surprise's after ``K``
epochs and ``b_i`` its after ``K + 1`` (whatever the partition of the users into clients).

What an upload discloses: per item the number of the client's users who rated it (once) and
sums of their centred ratings minus their biases. For a client of one user that is the user's
ratings (the initial sums, at ``b_u = 0``) and the changes of its bias: the price of any
per-item aggregate of one user (FedMGS's module documentation says the same of its
aggregates).

The states use the augmented factors of :mod:`sklearn_fedmf._biases` at rank 0 (``U_aug =
[b_u, 1]``, ``Vt_aug = [1, b_i]``), so the completion base reads the fitted model, and the
diagnostics of FedMAvg apply unchanged.

The ``"auto"`` strengths (:func:`moment_strengths`): empirical Bayes, ``alpha = sigma^2 /
tau^2`` (noise variance over the biases' variance, per side), from the moments of a two-way
random-effects model ``x_ui = b_u + b_i + e_ui``. With ``S = sum x_ui^2``, ``B_u = sum_u
(sum of row u)^2 / n_u`` and ``B_i`` likewise per item, ``n`` ratings, ``m`` users and ``k``
items with a rating, their expectations are::

    E[S]   = n tau_u^2 + n tau_i^2 + n sigma^2
    E[B_u] = n tau_u^2 + m tau_i^2 + m sigma^2
    E[B_i] = k tau_u^2 + n tau_i^2 + k sigma^2

(a user's mean holds the mean of its items' biases and of its noise, each of variance over
``n_u``). Three linear equations, solved for the three variances. The one-way analyses of
:func:`~._auto_strengths.bias_shrinkages` drop the cross terms (``m tau_i^2``, ``k
tau_u^2``) and the degrees of freedom, which on a set where most items have one or two
ratings (Ciao: ``k / n = 0.5``) gave ``alpha_v = 0.36`` and a test RMSE 0.015 worse than
Surprise's strengths; these equations give 2.6 there. What a client sends (once, with its
start): ``S`` and ``B_u`` over its users and its number of users with a rating, three
numbers; ``B_i`` is the server's, from the per-item counts and sums of the start. The
strengths are ratios of variances, so they do not depend on the ratings' unit.

Many small clients (one per user: the floor of the factor models' validation, fitted on the
same clients): client groups (``_groups``) run the client phases for all of a group's clients
in a few array operations (:func:`make_batched`), with the same states, messages and sums.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np

from ... import _biases
from ..._biases import _shrunk_mean, item_biases, user_biases
from ...engine._federation import FederatedProtocol, SummableUploads
from ...engine._groups import BatchedPhases, offsets, segments, user_rows_state, with_user_rows
from .._fedmavg import _fedmavg_protocol as _fedmavg
from .._fedmgs._fedmgs_kernels import client_items

__all__ = ["user_biases", "item_biases", "given_start", "make_protocol", "moment_strengths",
           "strengths_from_moments"]

# floor of a bias variance, as a fraction of the ratings' mean square: below it the data show
# no bias and the strength is capped (``_auto_strengths.MIN_BIAS_VARIANCE``'s)
MIN_BIAS_VARIANCE = 1e-3


def _item_factor(item_bias):
    """``Vt_aug = [1, b_i]`` (rank 0 with biases, :mod:`sklearn_fedmf._biases`)."""
    Vt = np.empty((item_bias.shape[0], 2))
    Vt[:, _biases.ONE_V], Vt[:, _biases.B_I] = 1.0, item_bias
    return Vt


# ---- the "auto" strengths ------------------------------------------------------------------
def moment_strengths(X):
    """``(alpha_u, alpha_v)`` of ``"auto"`` for the centred CSR ``X`` (rows: users), from the
    sums the clients send (module docstring): :func:`strengths_from_moments` of them."""
    row_counts = np.diff(X.indptr)
    rows = np.repeat(np.arange(X.shape[0]), row_counts)
    row_sums = np.bincount(rows, weights=X.data, minlength=X.shape[0])
    item_counts = np.bincount(X.indices, minlength=X.shape[1])
    item_sums = np.bincount(X.indices, weights=X.data, minlength=X.shape[1])
    rated, item_rated = row_counts > 0, item_counts > 0
    return strengths_from_moments(
        n_ratings=float(X.nnz), n_users=float(np.count_nonzero(rated)),
        n_items=float(np.count_nonzero(item_rated)), sum_squares=float(X.data @ X.data),
        between_users=float(np.sum(row_sums[rated] ** 2 / row_counts[rated])),
        between_items=float(np.sum(item_sums[item_rated] ** 2 / item_counts[item_rated])))


def strengths_from_moments(*, n_ratings, n_users, n_items, sum_squares, between_users,
                           between_items):
    """``(alpha_u, alpha_v) = (sigma^2 / tau_u^2, sigma^2 / tau_i^2)``, the variances solved
    from the three moment equations of the module docstring.

    Where the equations are singular (every user or every item with one rating: a bias and
    the noise cannot be told apart) the least-squares solution of least norm is taken; a
    negative noise variance is 0 (no shrinkage) and a bias variance is at least
    ``MIN_BIAS_VARIANCE`` times the ratings' mean square (the strength's cap). No rating:
    ``(0, 0)``.
    """
    n, m, k = float(n_ratings), float(n_users), float(n_items)
    if n <= 0 or sum_squares <= 0:
        return 0.0, 0.0
    A = np.array([[n, n, n], [n, m, m], [k, n, k]])
    b = np.array([sum_squares, between_users, between_items])
    tau_u, tau_i, noise = np.linalg.lstsq(A, b, rcond=None)[0]
    floor = MIN_BIAS_VARIANCE * sum_squares / n
    noise = max(float(noise), 0.0)
    return noise / max(float(tau_u), floor), noise / max(float(tau_i), floor)


# ---- the protocol ---------------------------------------------------------------------------
def init_server(rng, *, n_items, start=None):
    """Zero sums, counts and biases; nothing is broadcast before the clients' counts arrive.
    ``start``: the counts and sums of the start, summed before the fit (:func:`given_start`)."""
    state = {"Vt": _item_factor(np.zeros(n_items)), "sums": np.zeros(n_items),
             "counts": np.zeros(n_items)}
    if start is not None:
        state["counts"], state["sums"] = (np.array(a, dtype=np.float64) for a in start)
    return state, None


def given_start(counts, sums, offset):
    """The start's ``(counts, sums of x_ui)`` from per-item counts and sums of the ratings
    ``r_ui`` summed before the fit (the biases floor of a secure sampled fit sums them in
    sums of a round's clients: ``completion._validation.floor_start``), the ratings centred
    by ``offset`` (the fit's mean, known after the sums)."""
    counts = np.rint(counts)
    return counts, np.asarray(sums, dtype=np.float64) - offset * counts


def _without_upload(block, broadcast, rng):
    """:func:`init_client` of a client that keeps its start (the server has its sums)."""
    return init_client(block, broadcast, rng)[0], None


def _without_group_uploads(group, broadcast, stream):
    """:func:`batched_init_client` of clients that keep their start."""
    return batched_init_client(group, broadcast, stream)[0], {}


def init_client(block, broadcast, rng):
    """``b_u = 0`` and the client's count and sum of ratings per rated item."""
    X = block.X
    items, inverse = np.unique(X.indices, return_inverse=True)
    U = _biases.init_user(np.empty((X.shape[0], 2)))
    state = {"U": U, "items": items.astype(np.int32), "inverse": inverse}
    upload = {"items": state["items"],
              "counts": np.bincount(inverse, minlength=len(items)).astype(np.int32),
              "sums": np.bincount(inverse, weights=X.data, minlength=len(items))}
    return state, upload


def server_init_uploads(state, uploads, *, alpha_v):
    """Every client's counts and sums into the server's; the first ``b_i``. As
    :func:`server_update`: one ``np.add.at`` per field over the uploads end to end (each
    client's items are distinct, so each item takes its clients' values in client order, as
    one ``+=`` per upload would; the sums do not depend on ``n_jobs``)."""
    if uploads:
        items, counts, sums = _end_to_end(uploads, ("items", "counts", "sums"))
        np.add.at(state["counts"], items, counts)
        np.add.at(state["sums"], items, sums)
    return _set_item_bias(state, alpha_v)


def _end_to_end(uploads, keys):
    """Each of ``keys`` over the uploads concatenated in client order."""
    parts = list(uploads.values())
    return [np.concatenate([u[key] for u in parts]) for key in keys]


def client_update(state, block, item_bias, rng, selected, *, alpha_u):
    """The client's ``b_u`` against the broadcast ``b_i``, and the change of its per-item sums
    of ``x_ui - b_u`` (module docstring)."""
    U = state["U"]
    new = user_biases(block.X, item_bias, alpha_u)
    change = (U[:, _biases.B_U] - new)[block.row_of_entry]
    upload = {"items": state["items"],
              "sums": np.bincount(state["inverse"], weights=change,
                                  minlength=len(state["items"]))}
    U = U.copy()
    U[:, _biases.B_U] = new
    return {**state, "U": U}, upload


def server_update(state, uploads, round_number, *, alpha_v):
    """Add the round's changes into the sums (each client's items are distinct); new ``b_i``.
    One unbuffered ``np.add.at`` over the uploads end to end: each item's sum takes its
    clients' changes in client order, as one ``+=`` per upload would, without a Python
    step per client (6,040 a round at one client per user)."""
    sums = state["sums"].copy()
    if uploads:
        np.add.at(sums, *_end_to_end(uploads, ("items", "sums")))
    return _set_item_bias({**state, "sums": sums}, alpha_v)


# ---- secure aggregation: the same sums, dense over all items ---------------------------------
# Dense, the server no longer learns which items a client rated; each message costs
# n_items numbers (two at the start) instead of the client's rated items.
def _dense(items, values, n_items):
    out = np.zeros(n_items)
    out[items] = values
    return out


def secure_init_summands(upload, broadcast, *, n_items):
    """A client's counts and sums of ratings over all items."""
    return {"counts": _dense(upload["items"], upload["counts"], n_items),
            "sums": _dense(upload["items"], upload["sums"], n_items)}


def secure_summands(upload, weight, *, n_items):
    """A client's changes of its per-item sums, over all items."""
    return {"sums": _dense(upload["items"], upload["sums"], n_items)}


def secure_server_init(state, sums, n_summed, *, alpha_v):
    """The server's counts and sums from their secure sums (the counts are integers: exact)."""
    return _set_item_bias({**state, "counts": np.rint(sums["counts"]), "sums": sums["sums"]},
                          alpha_v)


def secure_server_update(state, sums, n_summed, round_number, *, alpha_v):
    """The round's summed changes into the sums; new ``b_i``."""
    return _set_item_bias({**state, "sums": state["sums"] + sums["sums"]}, alpha_v)


def _set_item_bias(state, alpha_v):
    item_bias = item_biases(state["sums"], state["counts"], alpha_v)
    return {**state, "Vt": _item_factor(item_bias)}, item_bias


def client_metrics(state, block, item_bias, *, alpha_u):
    """FedMAvg's diagnostics on the augmented factors: ``1/2`` squared error plus the client's
    ``alpha_u/2 sum b_u^2``, train and eval squared errors and counts."""
    return _fedmavg.client_metrics(state, block, {"Vt": _item_factor(item_bias)},
                                   alpha_u=alpha_u, l1_ratio=0.0, biased=True)


# ---- the client phases for a group of clients (``_groups.BatchedPhases``) --------------------
def _group_layout(group):
    """Each client's rated items (ascending), ``item_ptr`` (client ``i``'s are ``items[
    item_ptr[i]:item_ptr[i + 1]]``), each stored entry's slot among its client's items (the
    per-client ``inverse``) and each stacked row's client: fixed by the data."""
    X = group.X
    items, item_ptr, slot = client_items(X.indptr, X.indices, group.row_ptr, X.shape[1])
    owner = np.repeat(np.arange(group.n_clients), np.diff(group.row_ptr))
    return {"items": items.astype(np.int32, copy=False), "item_ptr": item_ptr, "slot": slot,
            "owner": owner}


def _per_item(state, clients, entries, entry_client, weights=None):
    """Per-item ``bincount`` of the entries of ``clients`` (local, ascending) into their
    clients' rated items, end to end: ``(sums, out_ptr)`` (each slot adds its entries in
    entry order, as each client's own ``bincount`` does). ``entries``: indices or, for every
    entry, ``slice(None)``."""
    item_ptr = state["item_ptr"]
    if len(clients) == len(item_ptr) - 1:  # every client: the group's own layout
        out_ptr, place = item_ptr, entry_client
    else:
        out_ptr = offsets(item_ptr[clients + 1] - item_ptr[clients])
        place = np.empty(len(item_ptr) - 1, dtype=np.int64)  # (client -> its place)
        place[clients] = np.arange(len(clients))
        place = place[entry_client]
    index = out_ptr[place] + state["slot"][entries]
    return np.bincount(index, weights=weights, minlength=out_ptr[-1]), out_ptr


def _uploads(group, state, clients, out_ptr, sums, counts=None):
    """Client ``group.start + i``'s message: its items, (``counts``) and ``sums`` (views;
    one client per user makes tens of thousands a group, so the bounds are Python ints and
    each message a dict display)."""
    items, item_ptr = state["items"], state["item_ptr"]
    ends = out_ptr.tolist()
    starts, ends = ends[:-1], ends[1:]
    keys = (clients + group.start).tolist()
    own = [items[a:b] for a, b in zip(item_ptr[clients].tolist(), item_ptr[clients + 1].tolist())]
    part = [sums[a:b] for a, b in zip(starts, ends)]
    if counts is None:
        return {c: {"items": i, "sums": s} for c, i, s in zip(keys, own, part)}
    return {c: {"items": i, "counts": counts[a:b], "sums": s}
            for c, i, s, a, b in zip(keys, own, part, starts, ends)}


def batched_init_client(group, broadcast, stream):
    """:func:`init_client` of every client of the group."""
    X = group.X
    state = {"U": _biases.init_user(np.empty((group.n_rows, 2))), **_group_layout(group)}
    clients = np.arange(group.n_clients)
    entry_client = np.repeat(state["owner"], np.diff(X.indptr))
    counts, out_ptr = _per_item(state, clients, slice(None), entry_client)
    sums, _ = _per_item(state, clients, slice(None), entry_client, X.data)
    return state, _uploads(group, state, clients, out_ptr, counts=counts.astype(np.int32),
                           sums=sums)


def batched_client_update(state, group, item_bias, stream, active, selected, *, alpha_u):
    """:func:`client_update` of the group's active clients: their rows' ``b_u`` (the same
    row sums as :func:`~sklearn_fedmf._biases.user_biases`) and the selected clients'
    changes of their per-item sums. With every client active and selected (a floor's
    rounds) the rows and entries are the group's own, taken whole instead of gathered."""
    X = group.X
    if active.all():
        rows, entries, counts = slice(None), slice(None), np.diff(X.indptr)
    else:
        rows = np.flatnonzero(active[state["owner"]])
        counts = np.diff(X.indptr)[rows]
        entries, _ = segments(X.indptr[rows].astype(np.int64), counts)
    row_of = np.repeat(np.arange(len(counts)), counts)
    deviations = np.bincount(row_of, weights=X.data[entries] - item_bias[X.indices[entries]],
                             minlength=len(counts))
    new = _shrunk_mean(deviations, counts, alpha_u)
    U = state["U"].copy()
    change = (U[rows, _biases.B_U] - new)[row_of]
    U[rows, _biases.B_U] = new
    clients = np.flatnonzero(active & selected)
    entry_client = state["owner"][rows][row_of]
    if len(clients) < group.n_clients:  # (the entries of the selected clients)
        sending = selected[entry_client]
        entries = (np.arange(X.nnz) if isinstance(entries, slice) else entries)[sending]
        entry_client, change = entry_client[sending], change[sending]
    sums, out_ptr = _per_item(state, clients, entries, entry_client, change)
    return {**state, "U": U}, _uploads(group, state, clients, out_ptr, sums=sums)


def client_state(group_state, group, i):
    """Client ``i``'s per-client state: its rows of ``U``, its items and entries' slots."""
    items, item_ptr = group_state["items"], group_state["item_ptr"]
    a, b = group.entry_ptr[i], group.entry_ptr[i + 1]
    return {**user_rows_state(group_state, group, i),
            "items": items[item_ptr[i]:item_ptr[i + 1]].copy(),
            "inverse": group_state["slot"][a:b].astype(np.intp)}


def make_batched(*, alpha_u):
    """FedBaseline's :class:`~sklearn_fedmf.engine._groups.BatchedPhases` (its clients keep only
    ``U`` between rounds; ``client_metrics`` sums over a group's stacked rows)."""
    return BatchedPhases(
        init_client=batched_init_client,
        client_update=partial(batched_client_update, alpha_u=alpha_u),
        client_metrics=partial(client_metrics, alpha_u=alpha_u),
        client_state=client_state, with_client_states=with_user_rows)


def make_protocol(*, n_items, alpha_u, alpha_v, start=None):
    """Bind the strengths to the pure functions above. ``start``: the start's ``(counts,
    sums)`` summed before the fit (:func:`given_start`): no client sends a start, the
    server begins from them."""
    init_client_, batched = init_client, make_batched(alpha_u=alpha_u)
    summable_start = dict(init_client=partial(secure_init_summands, n_items=n_items),
                          server_init=partial(secure_server_init, alpha_v=alpha_v))
    if start is not None:
        init_client_ = _without_upload
        batched = replace(batched, init_client=_without_group_uploads)
        summable_start = {}
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items, start=start),
        init_client=init_client_,
        server_init_uploads=partial(server_init_uploads, alpha_v=alpha_v),
        client_update=partial(client_update, alpha_u=alpha_u),
        server_update=partial(server_update, alpha_v=alpha_v),
        client_metrics=partial(client_metrics, alpha_u=alpha_u),
        batched=batched,
        combine_metrics=partial(_fedmavg.combine_metrics, loss_scale=1.0, alpha_v=alpha_v,
                                l1_ratio=0.0, biased=True),
        summable=SummableUploads(
            client=partial(secure_summands, n_items=n_items),
            server_update=partial(secure_server_update, alpha_v=alpha_v),
            **summable_start),
    )
