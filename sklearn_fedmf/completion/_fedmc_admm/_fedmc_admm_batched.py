"""FedMC-ADMM for many small clients: batched client phases on lazy item-side copies.

Each client of Algorithm 1 keeps dense ``n_items x r`` copies ``W_i`` and ``Y_i`` and the
server keeps ``Z_i = W_i + Y_i / beta`` for every client: ``O(p n r)`` memory, and per round
``O(n r)`` work per sampled client whatever its ratings. At one client per user that dwarfs
the ratings (6,040 clients at the ML-1M shape: 1.25 GB per array family).

The simulation here holds the same iterates in ``O(ratings)``: on an item ``j`` a client did
not rate, the W loop (P-15) and the dual step are an affine map of ``(W_ij, V_j, Y_ij)`` with
scalars that are the same for every such item (the ``k = 0`` closed form of
:func:`~._fedmc_admm_kernels.linearized_cols`; Remark 4.1's ``v - y / beta`` for the exact W
update). Starting from ``W_i^0 = V^0`` and ``Y_i^0 = 0`` there (the initial dual is a
gradient on the rated items only), every unrated row of ``W_i`` and ``Y_i`` is therefore
``sum_t c_t V^(k_t)`` over the broadcasts ``V^(k_t)`` the client received. A client keeps its
rated rows explicitly, and per round it took part in two coefficients and the map of that
round (four numbers): the values of its combinations on its rated rows, which a round reads,
are made from them (a map per round it took part in, applied to the start; at a few
rounds per client that costs less than reading them, ``2 r`` float64 numbers per rating,
from the state); the broadcasts are kept once
(:class:`FactorHistory`, ``O(rounds n r)``) with their Gram blocks, which give the client's
``L_W = ||W_i^T W_i||_F`` and the consensus gap without any dense row. The server keeps
``sum_i Z_i`` as ``sum_t C_t V^(k_t)``, every client's coefficients summed per broadcast,
plus on each client's rated rows its term's deviation from its combination
(:func:`~._fedmc_admm_server_kernels.lazy_total`).

Nothing is done per client in Python in a round: a group's clients keep their explicit rows
and coefficients concatenated in shared arrays (:class:`_Pool`), one compiled call per group
reads them where they are and writes the new ones (the linearized round over the old rows,
the exact round past the end, leaving its input state valid; the coefficients are
appended), and the group's messages travel as one :class:`GroupUpload` that the server stores
with one compiled call (:func:`~._fedmc_admm_server_kernels.replace_terms`).

The messages are still the paper's: a client sends its dense ``(W_i, Y_i)``; the engine and
``callback`` see it as a :class:`ClientUpload` (a mapping of :class:`LazyFactor`:
``nbytes`` counts it dense, ``np.asarray`` rebuilds it; its arrays are read from the state
and valid in their round: copy them to keep them),
and the broadcast's message is ``V^k`` (the history rides in its uncounted simulation part:
every client holds the broadcasts it received). ``tests/test_fedmc_admm_batched.py`` checks
that these phases give the per-client functions' states, messages and fits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from functools import partial
from itertools import repeat
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from ... import _biases
from ..._kernels import squared_error
from ..._prox import elastic_net_value
from ...engine._federation import Broadcast
from ...engine._groups import BatchedPhases
from ...engine._groups import offsets as _offsets
from ...engine._groups import segments as _segments
from ...engine._transport import client_generator
from .._auto_strengths import start_user_biases
from .._base import squared_error_of
from ._fedmc_admm_kernels import (
    ClientRows,
    GroupOutput,
    GroupRatings,
    RoundSettings,
    group_update,
    lazy_consensus,
)
from ._fedmc_admm_server_kernels import (
    TermMessages,
    TermStore,
    lazy_total,
    replace_terms,
    sum_terms,
)

__all__ = ["ClientUpload", "FactorHistory", "GroupUpload", "LazyFactor", "make_batched",
           "server_init_lazy", "server_update_lazy", "unpack_broadcast"]


class FactorHistory:
    """The item factors ``V^k`` the server broadcast, stacked, and their Gram blocks.

    ``H[t]`` is the ``t``-th broadcast (``n_items x r``) and ``G[t, u] = H[t]^T H[u]``. The
    server appends each new ``V`` (between the client phases, never during one); clients
    only read.
    """

    def __init__(self, Vt):
        n, r = Vt.shape
        self.H = np.empty((4, n, r), dtype=Vt.dtype)
        self.G = np.empty((4, 4, r, r))
        self.m = 0
        self.append(Vt)

    def append(self, Vt):
        """Store ``Vt`` as the next broadcast; returns its index."""
        m = self.m
        if m == self.H.shape[0]:  # double the capacity (amortized O(n r) per round)
            H = np.empty((2 * m,) + self.H.shape[1:], dtype=self.H.dtype)
            H[:m] = self.H
            G = np.empty((2 * m, 2 * m) + self.G.shape[2:])
            G[:m, :m] = self.G[:m, :m]
            self.H, self.G = H, G
        self.H[m] = Vt
        cross = np.matmul(self.H[m].T[None], self.H[:m + 1]).astype(np.float64, copy=False)
        self.G[m, :m + 1] = cross
        self.G[:m + 1, m] = cross.transpose(0, 2, 1)
        self.m = m + 1
        return m

    def combine(self, hist, coef, dtype):
        """``sum_q coef[q] H[hist[q]]`` (zeros for an empty combination)."""
        out = np.zeros(self.H.shape[1:], dtype=dtype)
        for t, c in zip(hist.tolist(), coef.tolist()):
            out += c * self.H[t]
        return out


class LazyFactor:
    """A client's dense ``n_items x r`` item-side matrix (``W_i`` or ``Y_i``) held as its rows
    ``rows`` (``values``) and, elsewhere, ``sum_q coef[q] V^(hist[q])`` of ``history``.

    It is the message the paper's client sends: :attr:`nbytes` counts it dense and
    ``np.asarray`` rebuilds it.
    """

    __slots__ = ("rows", "values", "hist", "coef", "history", "shape")

    def __init__(self, rows, values, hist, coef, history, shape):
        self.rows, self.values, self.hist, self.coef = rows, values, hist, coef
        self.history, self.shape = history, (int(shape[0]), int(shape[1]))

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def nbytes(self):
        n, r = self.shape
        return n * r * self.values.dtype.itemsize

    def toarray(self):
        if self.hist.size:
            out = self.history.combine(self.hist, self.coef, self.dtype)
        else:
            out = np.zeros(self.shape, dtype=self.dtype)
        out[self.rows] = self.values
        return out

    def __array__(self, dtype=None, copy=None):
        out = self.toarray()
        return out if dtype is None else out.astype(dtype, copy=False)


class GroupUpload:
    """The messages of a group's clients in one phase, concatenated (one object per group
    instead of one per client): client ``a`` (``clients[a]``) has the explicit rows
    ``rows[e_ptr[a]:e_ptr[a + 1]]`` with, for each key, ``values[key]`` there and the
    coefficients ``coef[h_ptr[a]:h_ptr[a + 1], key]`` of the broadcasts ``hist`` elsewhere.
    ``deviation`` (float64, or None to be formed from ``values`` where no row is lazy)
    holds, on the explicit rows, the server's term ``Z_i = W_i + Y_i / beta`` of the message
    minus the combination's: what the server stores of it, formed by the client's kernel
    while the rows are at hand.

    :meth:`messages` gives the per-client messages the engine sees (``{client:
    ClientUpload}``); the server reads the concatenated arrays directly. ``rows`` and
    ``values`` may be given as functions that make them on first access (a server that holds
    a client's rows already never needs them, and it reads only ``deviation``); with a
    function for ``values``, ``dtype`` gives their type.
    """

    __slots__ = ("clients", "keys", "_rows", "e_ptr", "_values", "deviation", "hist", "coef",
                 "h_ptr", "history", "shape", "client_nbytes")

    def __init__(self, clients, keys, rows, e_ptr, values, deviation, hist, coef, h_ptr,
                 history, shape, dtype=None):
        self.clients, self.keys, self._rows, self.e_ptr = clients, keys, rows, e_ptr
        self._values, self.deviation = values, deviation
        self.hist, self.coef, self.h_ptr = hist, coef, h_ptr
        self.history, self.shape = history, (int(shape[0]), int(shape[1]))
        itemsize = np.dtype(values[0].dtype if dtype is None else dtype).itemsize
        # each message counts as the paper's dense n_items x r matrix (LazyFactor.nbytes)
        self.client_nbytes = len(keys) * self.shape[0] * self.shape[1] * itemsize

    @property
    def rows(self):
        if callable(self._rows):
            self._rows = self._rows()
        return self._rows

    @property
    def values(self):
        if callable(self._values):
            self._values = self._values()
        return self._values

    def messages(self):
        n = self.clients.size  # (one object a client: made without a Python loop)
        return dict(zip(self.clients.tolist(), map(ClientUpload, repeat(self, n), range(n))))

    def factor(self, a, key):
        """Client ``a``'s message ``key`` as an :class:`LazyFactor`."""
        k = self.keys.index(key)
        e0, e1, q0, q1 = (int(v) for v in (self.e_ptr[a], self.e_ptr[a + 1], self.h_ptr[a],
                                           self.h_ptr[a + 1]))
        return LazyFactor(self.rows[e0:e1], self.values[k][e0:e1], self.hist[q0:q1],
                              self.coef[q0:q1, k], self.history, self.shape)

    def subset(self, keep):
        """The messages of the clients ``keep`` (a boolean mask over ``clients``)."""
        e_idx, e_ptr = _segments(self.e_ptr[:-1][keep], np.diff(self.e_ptr)[keep])
        h_idx, h_ptr = _segments(self.h_ptr[:-1][keep], np.diff(self.h_ptr)[keep])
        return GroupUpload(self.clients[keep], self.keys, self.rows[e_idx], e_ptr,
                           tuple(_read_only(v[e_idx]) for v in self.values),
                           None if self.deviation is None else
                           _read_only(self.deviation[e_idx]),
                           _read_only(self.hist[h_idx]), _read_only(self.coef[h_idx]), h_ptr,
                           self.history, self.shape)


class ClientUpload(Mapping):
    """One client's message of a :class:`GroupUpload`: ``{key: LazyFactor}``, each made on
    access (read-only arrays); :attr:`nbytes` counts the paper's dense matrices."""

    __slots__ = ("group", "index", "nbytes")

    def __init__(self, group, index):
        self.group, self.index, self.nbytes = group, index, group.client_nbytes

    def __getitem__(self, key):
        if key not in self.group.keys:
            raise KeyError(key)
        return self.group.factor(self.index, key)

    def __iter__(self):
        return iter(self.group.keys)

    def __len__(self):
        return len(self.group.keys)


def unpack_broadcast(broadcast):
    """``(Vt, history, index)`` of a broadcast (history None for a plain ``Vt``)."""
    if isinstance(broadcast, Broadcast):
        history, index = broadcast.simulation
        return broadcast.message, history, index
    return broadcast, None, None


def _read_only(a):
    """A read-only view of ``a``: a message that shares the state's arrays."""
    a = a.view()
    a.flags.writeable = False
    return a


# ---- per-client segments in shared append-only arrays --------------------------------------
class _Pool(NamedTuple):
    """Arrays that hold variable-length per-client segments (``at``: each client's offset).

    A round appends its clients' new segments past ``tail`` and the new state keeps new
    offsets: the segments an earlier state points to are not written by that round, so the
    batched phases leave their input state's values unchanged without copying the whole
    group every round. When the pool is full, :func:`_reserve` compacts it in place (the
    latest state's layout changes, its values do not; older states are then stale) or, for a
    state that is not the latest, copies its live segments to a new pool.

    A named tuple of arrays (``tail`` lives in the one-element ``box``, shared by the states
    that share the pool): early stopping's snapshot of the best round then copies the pool
    into the previous snapshot's buffers, where an opaque object would be deep-copied anew
    while the previous copy is still held (two copies of every client's rows at once).
    """

    arrays: list
    box: np.ndarray

    @classmethod
    def of(cls, arrays, tail):
        return cls(list(arrays), np.array([tail], dtype=np.int64))

    @property
    def tail(self):
        return int(self.box[0])

    @tail.setter
    def tail(self, value):
        self.box[0] = value

    @classmethod
    def holding(cls, arrays):
        n = len(arrays[0])
        pool = cls.of([np.empty((2 * n + 16,) + a.shape[1:], dtype=a.dtype) for a in arrays], n)
        for dst, a in zip(pool.arrays, arrays):
            dst[:n] = a
        return pool

    def gather(self, at, sizes):
        """The segments of the clients with offsets ``at`` and ``sizes``, concatenated."""
        idx, ptr = _segments(at, sizes)
        return [a[idx] for a in self.arrays], ptr


def _pool_array(size, shape, dtype, used):
    """An empty pool array whose part past ``used`` is written once now: the memory is then
    mapped here, in one pass, rather than a page at a time inside the rounds' compiled calls
    (where both threads fault on one address space: rounds measured 1.5-2x slower, erratic)."""
    out = np.empty((size,) + tuple(shape), dtype=dtype)
    out[used:] = 0
    return out


def _reserve(pool, used, at, sizes, n, moving=None):
    """Room for ``n`` entries past a state's segments (offsets ``at``, ``sizes``, pool tail
    ``used``): ``(pool, base, at)``, the new entries going to ``base:base + n``.

    That is ``pool`` itself when the state is its latest and it has room. A full pool of the
    latest state whose live segments and the ``n`` new entries fit, and whose live entries
    then leave at least half their number free, is compacted in place: the segments move down
    in offset order and ``at`` is rewritten in place, so the state that owns ``at`` keeps its
    values (under a new layout) and no second pool is made (a copy would hold the old and the
    new pool at once: the per-user fit's peak). Else a new pool, twice the size needed,
    holds the segments of every client but ``moving`` (whose old values the caller reads from
    the arrays of ``pool``: a copy leaves them unchanged). The free half keeps the entries
    moved within a constant times those written: a pool whose segments grow, as the
    coefficients' do by one entry a round taken part in, was else compacted at nearly every
    call once its live entries neared its size.
    """
    size = len(pool.arrays[0])
    if pool.tail == used:
        if used + n <= size:
            return pool, used, at.copy()
        live = int(sizes.sum())
        if live + n <= size and size - live >= live // 2:
            order = np.argsort(at, kind="stable")
            idx, ptr = _segments(at[order], sizes[order])
            for a in pool.arrays:  # idx is increasing and idx[j] >= j: a move down
                a[:live] = a[idx]
            at[order] = ptr[:-1]
            pool.tail = live
            return pool, live, at.copy()
    keep = np.ones(at.size, dtype=bool)
    if moving is not None:
        keep[moving] = False
    idx, ptr = _segments(at[keep], sizes[keep])
    base = int(ptr[-1])
    at = at.copy()
    at[keep] = ptr[:-1]
    arrays = []
    for a in pool.arrays:  # (take into the new array: one copy of the live entries)
        out = _pool_array(2 * (base + n) + 16, a.shape[1:], a.dtype, base)
        np.take(a, idx, axis=0, out=out[:base], mode="clip")  # ("raise" buffers out)
        arrays.append(out)
    return _Pool.of(arrays, base), base, at


# ---- the clients' side: batched phases -----------------------------------------------------
# A group state holds, for the group's clients in order: "U" (stacked rows); "E" the explicit
# rows (client i's are E[e_ptr[i]:e_ptr[i + 1]]); "loc", for each rating (group.entry_ptr
# order), the position of its item among the client's explicit rows; in the pool "wy" at
# "w_at" (same sizes as E) the explicit values of W_i and Y_i and, with cache_rows, in
# float64, their combinations' values there (BW, BY: the update maps them as it maps the
# coefficients, so a round reads no broadcast row); the broadcasts' indices,
# coefficients (columns W, Y) and the maps of the rounds that received them in the pool "h"
# at "h_at", "h_len" entries per client; "from_v0", per client, whether its first broadcast
# is its start (W_i^0 = V^0 = "V0"). Without cache_rows the values of the combinations on
# the explicit rows are made from these when a round reads them
# (_fedmc_admm_kernels._combination_rows).
def _explicit_rows(group):
    """Each client's rated items (its explicit rows, concatenated; pointer ``e_ptr``) and,
    for each of its ratings, the position of the item among them (empty when that is the
    rating's place among its client's, as with one row per client: 4 bytes a rating)."""
    X, n = group.X, group.X.shape[1]
    entry_ptr = group.entry_ptr
    owner = np.repeat(np.arange(group.n_clients), np.diff(entry_ptr))
    keys = owner * n + X.indices
    if keys.size and np.all(keys[1:] > keys[:-1]):  # one row per client: no sort needed
        e_ptr = entry_ptr.astype(np.int64)
        return X.indices.astype(X.indices.dtype), e_ptr, np.zeros(0, np.int32)
    keys, inverse = np.unique(keys, return_inverse=True)
    e_ptr = np.searchsorted(keys, np.arange(group.n_clients + 1) * n)
    # (item indices as the data's, positions in 32 bits: 8 bytes a rating fewer)
    E = (keys % n).astype(X.indices.dtype)
    loc = (inverse - e_ptr[owner]).astype(np.int32 if n < 2**31 else np.int64)
    return E, e_ptr.astype(np.int64), loc


def _flat_state(U, E, e_ptr, loc, wy, hist, coef, maps, h_len, from_v0, V0, history):
    """A group state from its arrays (each client's segments concatenated in order; ``wy``
    the pool of the explicit values of ``W_i`` and ``Y_i``)."""
    h_at = _offsets(h_len)[:-1]
    h = _Pool.holding([hist, coef, maps])
    for fixed in (E, loc, from_v0):  # (fixed: early stopping's snapshots share them)
        fixed.flags.writeable = False
    return {"U": U, "E": E, "e_ptr": e_ptr, "loc": loc, "wy": wy, "wy_used": wy.tail,
            "w_at": e_ptr[:-1].copy(), "h": h, "h_used": h.tail, "h_at": h_at,
            "h_len": h_len, "from_v0": from_v0, "V0": V0, "history": history}


def init_group(group, Vt, stream, *, n_clients, init_scale, dual_init, positive, biased,
               w_update, user_shrinkage=None, cache_rows=True):
    """Batched ``init_client``: ``U_i^0`` from each client's own generator, ``W_i^0 = V^0``
    (coefficient 1 on broadcast 0), ``Y_i^0`` explicit on the rated items (0 elsewhere);
    ``cache_rows``: the state holds the combinations' values on the rated rows."""
    X = group.X
    dtype = X.dtype
    Vt = Vt.astype(dtype, copy=False)
    r = Vt.shape[1]
    sizes = np.diff(group.row_ptr)
    U = np.concatenate([(init_scale * client_generator(stream, group.start + i).random(
        (sizes[i], r))).astype(dtype, copy=False) for i in range(group.n_clients)])
    if positive:
        U = np.maximum(U, 0.0)
    if biased:  # (row by row: the same as each client's own start)
        start_user_biases(_biases.init_user(U), X, Vt, user_shrinkage)
    E, e_ptr, loc = _explicit_rows(group)
    n = E.size  # the explicit rows go straight into the state's pool: no room past them
    # for the linearized round (it writes them in place), a round's for the exact one
    size = 2 * n + 16 if w_update == "exact" else n
    types = (dtype, dtype, float, float) if cache_rows else (dtype, dtype)
    wy = _Pool.of([_pool_array(size, (r,), t, n) for t in types], n)
    W, Y = (a[:n] for a in wy.arrays[:2])
    np.take(Vt, E, axis=0, out=W, mode="clip")
    if cache_rows:
        wy.arrays[2][:n] = W
        wy.arrays[3][:n] = 0
    if dual_init == "paper":  # -(1/p) grad_V f_i on the rated items, entries in row order
        rows = np.repeat(np.arange(group.n_rows), np.diff(X.indptr))
        resid = np.einsum("sa,sa->s", U[rows], Vt[X.indices]) - X.data
        owner = np.repeat(np.arange(group.n_clients), np.diff(group.entry_ptr))
        at = e_ptr[owner] + loc if loc.size else np.arange(X.nnz)
        grad = np.stack([np.bincount(at, resid * U[rows, a], minlength=e_ptr[-1])
                         for a in range(r)], axis=1).astype(dtype, copy=False)
        np.divide(grad, -n_clients, out=Y)
    else:
        Y[:] = 0
    nc = group.n_clients
    state = _flat_state(U, E, e_ptr, loc, wy, np.zeros(nc, np.int64),
                        np.tile([1.0, 0.0], (nc, 1)), np.zeros((nc, 4)), np.ones(nc, np.int64),
                        np.ones(nc, dtype=bool), Vt, None)
    upload = GroupUpload(group.start + np.arange(nc), ("Y",), E, e_ptr, (_read_only(Y),), None,
                         np.zeros(0, np.int64), np.zeros((0, 1)), np.zeros(nc + 1, np.int64),
                         None, Vt.shape)
    return state, upload.messages()


def _rows_of(wy):
    """``(W, Y, BW, BY, cached)`` of the pool ``wy`` (``BW``, ``BY`` empty when the state
    does not hold the combinations' values)."""
    if len(wy.arrays) == 4:
        return (*wy.arrays, True)
    empty = np.empty((0, wy.arrays[0].shape[1]))
    return (*wy.arrays, empty, empty, False)


def update_group(gs, group, broadcast, stream, active, selected, *, n_clients, beta, local_iter,
                 alpha_u, l1_ratio, positive, w_update, biased, eps):
    """Batched ``client_update``: one compiled call for the group's active clients
    (:func:`~._fedmc_admm_kernels.group_update`); uploads ``(W_i, Y_i)`` as one
    :class:`GroupUpload` (``eps``: the floor of ``L_W`` and ``L_U``).

    The linearized round writes the clients' new explicit rows over their old ones (the
    state is ``2 r`` numbers per rating, ``4 r`` with the combinations' values: a copy per
    round would double the fit's memory; the compiled call that writes comes after every
    allocation and raises nothing but ``MemoryError``), and its uploads' rows are gathered
    from the state when first read, in their round. ``w_update="exact"`` (whose solves raise
    on non-finite input) writes the new rows past the pools' tails and leaves its input state
    unchanged.
    """
    Vt, history, kk = unpack_broadcast(broadcast)
    if history is None:
        raise ValueError("The batched FedMC-ADMM phases need the server's broadcast history "
                         "(server_init_uploads of lazy uploads).")
    act = np.flatnonzero(active)
    X = group.X
    e_sizes, h_len = np.diff(gs["e_ptr"]), gs["h_len"]
    out_ptr, hout_ptr = _offsets(e_sizes[act]), _offsets(h_len[act] + 1)
    n, nh = int(out_ptr[-1]), int(hout_ptr[-1])
    in_place = w_update != "exact"
    if in_place:
        wy, w_at = gs["wy"], gs["w_at"]
        at = w_at[act]
    else:
        wy, base, w_at = _reserve(gs["wy"], gs["wy_used"], gs["w_at"], e_sizes, n, act)
        at = base + out_ptr[:-1]
    h, h_base, h_at = _reserve(gs["h"], gs["h_used"], gs["h_at"], h_len, nh, act)
    U_out = gs["U"].copy()
    deviation = np.empty((n, Vt.shape[1]))
    hist, coef, maps = gs["h"].arrays
    group_update(GroupRatings(X.indptr, X.data, group.row_ptr, group.entry_ptr, gs["loc"],
                              gs["E"], gs["e_ptr"]), act,
                 ClientRows(*_rows_of(gs["wy"]), gs["w_at"], hist, coef, maps, gs["h_at"],
                            h_len, gs["from_v0"], gs["V0"], history.H),
                 gs["U"], Vt, history.G, kk,
                 RoundSettings(n_clients, beta, local_iter, alpha_u, l1_ratio, positive, biased,
                               w_update == "exact", eps),
                 GroupOutput(U_out, *_rows_of(wy)[:4], at, *h.arrays, h_base + hout_ptr[:-1],
                             deviation, out_ptr[:-1]))
    h.tail = h_base + nh
    if in_place:
        W_all, Y_all = wy.arrays[:2]

        def values():  # (the sent rows, gathered from the state when first read)
            idx = _segments(at, e_sizes[act])[0]
            return _read_only(W_all[idx]), _read_only(Y_all[idx])
    else:
        wy.tail = base + n
        w_at[act] = at
        values = tuple(_read_only(a[base:base + n]) for a in wy.arrays[:2])
    h_at[act] = h_base + hout_ptr[:-1]
    h_len = h_len.copy()
    h_len[act] += 1
    state = dict(gs, U=U_out, history=history, wy=wy, wy_used=wy.tail, w_at=w_at, h=h,
                 h_used=h.tail, h_at=h_at, h_len=h_len)
    E, e_ptr = gs["E"], gs["e_ptr"]
    upload = GroupUpload(group.start + act, ("W", "Y"),
                         lambda: E[_segments(e_ptr[act], e_sizes[act])[0]], out_ptr,
                         values, _read_only(deviation),
                         *(_read_only(a[h_base:h_base + nh]) for a in h.arrays[:2]),
                         hout_ptr, history, Vt.shape, dtype=wy.arrays[0].dtype)
    sends = selected[act]
    if not sends.all():
        upload = upload.subset(sends)
    return state, upload.messages()


def metrics_group(gs, group, broadcast, *, beta, alpha_u, l1_ratio, biased):
    """Batched ``client_metrics``: the sums of the group's clients."""
    Vt, history, kk = unpack_broadcast(broadcast)
    U, X = gs["U"], group.X
    sse = squared_error(X.indptr, X.indices, X.data, U, Vt)
    if history is None:  # before any server update: materialize (W_i^0 = V^0)
        consensus = sum(float(np.sum((np.asarray(state_of(gs, group, i)["Wt"]) - Vt) ** 2))
                        for i in range(group.n_clients))
    else:
        # (read in place: a gathered copy is r or 2 r per rating; BW empty: made)
        W, _, BW, _, _ = _rows_of(gs["wy"])
        (hist, coef, maps), h_ptr = gs["h"].gather(gs["h_at"], gs["h_len"])
        consensus = lazy_consensus(gs["e_ptr"], gs["w_at"], W, BW, gs["E"], hist,
                                   np.ascontiguousarray(coef[:, 0]), h_ptr, Vt, history.G, kk,
                                   (maps, gs["from_v0"], gs["V0"], history.H, float(beta)))
    return {
        "loss": 0.5 * sse + elastic_net_value(_biases.free_user(U) if biased else U, alpha_u,
                                              l1_ratio),
        "sse": sse,
        "n": X.nnz,
        "sse_eval": squared_error_of(group.X_eval, U, Vt),
        "n_eval": 0 if group.X_eval is None else group.X_eval.nnz,
        "consensus": consensus,
    }


def _client_parts(gs, group, i):
    """Client ``i``'s ``(E, loc, W, Y, hist, coef, maps, from_v0, *cached)`` (``cached``:
    ``BW``, ``BY`` when the state holds them, else empty)."""
    e0, e1 = gs["e_ptr"][i], gs["e_ptr"][i + 1]
    w0, h0 = gs["w_at"][i], gs["h_at"][i]
    W, Y, *cached = (a[w0:w0 + e1 - e0] for a in gs["wy"].arrays)
    hist, coef, maps = (a[h0:h0 + gs["h_len"][i]] for a in gs["h"].arrays)
    a, b = group.entry_ptr[i], group.entry_ptr[i + 1]
    loc = gs["loc"][a:b] if gs["loc"].size else np.arange(b - a, dtype=np.int32)
    return (gs["E"][e0:e1], loc, W, Y, hist, coef, maps, gs["from_v0"][i:i + 1], *cached)


def _dense(gs, E, values, hist, coef):
    if gs["history"] is not None:
        out = gs["history"].combine(hist, coef, values.dtype)
    else:  # only broadcast 0 so far
        out = np.zeros(gs["V0"].shape, dtype=values.dtype)
        for c in coef.tolist():
            out += c * gs["V0"]
    out[E] = values
    return out


def state_of(gs, group, i):
    """Client ``i``'s per-client state ``{"U", "Wt", "Yt"}``, made dense."""
    a, b = group.row_ptr[i], group.row_ptr[i + 1]
    E, _, W, Y, hist, coef = _client_parts(gs, group, i)[:6]
    return {"U": gs["U"][a:b].copy(), "Wt": _dense(gs, E, W, hist, coef[:, 0]),
            "Yt": _dense(gs, E, Y, hist, coef[:, 1])}


def with_states(gs, group, states):
    """The group state with the per-client ``states`` of some clients: their copies are held
    explicitly on every item (no lazy rows: their combinations are 0)."""
    U = gs["U"].copy()
    n, r = gs["V0"].shape
    parts = [_client_parts(gs, group, i) for i in range(group.n_clients)]
    cached = len(gs["wy"].arrays) == 4
    for i, s in states.items():
        a, b = group.row_ptr[i], group.row_ptr[i + 1]
        U[a:b] = s["U"]
        lo, hi = group.X.indptr[a], group.X.indptr[b]
        # (their combinations start at 0: from_v0 False)
        parts[i] = (np.arange(n, dtype=np.int64), group.X.indices[lo:hi].astype(np.int64),
                    np.asarray(s["Wt"]), np.asarray(s["Yt"]), np.zeros(0, np.int64),
                    np.zeros((0, 2)), np.zeros((0, 4)), np.zeros(1, dtype=bool)) + (
                    (np.zeros((n, r)), np.zeros((n, r))) if cached else ())
    E, loc, W, Y, hist, coef, maps, from_v0, *BW_BY = (np.concatenate(p) for p in zip(*parts))
    e_ptr = _offsets(np.array([p[0].size for p in parts], dtype=np.int64))
    h_len = np.array([p[4].size for p in parts], dtype=np.int64)
    return _flat_state(U, E, e_ptr, loc, _Pool.holding([W, Y, *BW_BY]), hist, coef, maps, h_len,
                       from_v0, gs["V0"], gs["history"])


def make_batched(*, n_clients, init_scale, dual_init, positive, biased, beta, local_iter,
                 alpha_u, l1_ratio, w_update, eps, user_shrinkage=None, cache_rows=True):
    """The :class:`~sklearn_fedmf.engine._groups.BatchedPhases` of FedMC-ADMM
    (``cache_rows``: a new state holds its combinations' values on the rated rows)."""
    return BatchedPhases(
        init_client=partial(init_group, n_clients=n_clients, init_scale=init_scale,
                            dual_init=dual_init, positive=positive, biased=biased,
                            w_update=w_update, user_shrinkage=user_shrinkage,
                            cache_rows=cache_rows),
        client_update=partial(update_group, n_clients=n_clients, beta=beta,
                              local_iter=local_iter, alpha_u=alpha_u, l1_ratio=l1_ratio,
                              positive=positive, w_update=w_update, biased=biased, eps=eps),
        client_metrics=partial(metrics_group, beta=beta, alpha_u=alpha_u, l1_ratio=l1_ratio,
                               biased=biased),
        client_state=state_of,
        with_client_states=with_states,
    )


# ---- the server's side ---------------------------------------------------------------------
def _parts(uploads, keys, n_items):
    """The messages of ``uploads`` as :class:`GroupUpload` parts: each group's taken whole
    (or the part of its clients present), a dense message (a client re-run alone) as a
    part explicit on every row."""
    batched, dense = uploads.values(), []
    if not set(map(type, batched)) <= {ClientUpload}:  # (a round's are: no Python loop)
        dense = [c for c, u in uploads.items() if type(u) is not ClientUpload]
        batched = [u for u in batched if type(u) is ClientUpload]
    parts = []
    for group, count in Counter(map(attrgetter("group"), batched)).items():
        if count < group.clients.size:
            group = group.subset(np.isin(group.clients, np.fromiter(uploads, np.int64)))
        parts.append(group)
    everywhere = np.arange(n_items, dtype=np.int64)
    for c in dense:
        values = tuple(np.asarray(uploads[c][key]) for key in keys)
        parts.append(GroupUpload(np.array([c], dtype=np.int64), keys, everywhere,
                                 np.array([0, n_items], np.int64), values, None,
                                 np.zeros(0, np.int64), np.zeros((0, len(keys))),
                                 np.zeros(2, np.int64), None, values[0].shape))
    return parts


# The server's store of every client's term Z_i = W_i + Y_i / beta: its combination's
# broadcasts and coefficients (pool "hc" at "hc_at", "hc_len"), valid on every row, and its
# explicit rows' deviations from that combination (pool "rd" at "rd_at", "rd_len" rows per
# client). The server keeps sum_i Z_i as "C" (the coefficients per broadcast) and "S" (the
# deviations summed per row): lazy_total. The server owns them and updates them in place.
def _replace(server_state, parts, beta, accumulate):
    """Store the terms of the clients of ``parts`` (``values`` ``(W, Y)``, coefficients ``(W,
    Y)``, their deviations) in place of their old ones; with ``accumulate`` the running sum
    takes the change (:func:`~._fedmc_admm_server_kernels.replace_terms`, one call per
    part). A client's explicit rows overwrite its old ones (their number is fixed: its rated
    items); its coefficients, one more each round it takes part in, are appended."""
    store = server_state["store"]
    for p in parts:
        sizes, h_sizes = np.diff(p.e_ptr), np.diff(p.h_ptr)
        stored = np.array_equal(sizes, store["rd_len"][p.clients])  # (then the same rows)
        if stored:
            dst, rows = store["rd_at"][p.clients], np.zeros(0, np.int64)
        else:  # the first terms, or a client re-run alone (a dense message)
            rows = p.rows
            store["rd"], base, store["rd_at"] = _reserve(
                store["rd"], store["rd"].tail, store["rd_at"], store["rd_len"], sizes.sum())
            store["rd"].tail = base + int(sizes.sum())
            dst = base + p.e_ptr[:-1]
        store["hc"], h_base, store["hc_at"] = _reserve(
            store["hc"], store["hc"].tail, store["hc_at"], store["hc_len"], h_sizes.sum())
        store["hc"].tail = h_base + int(h_sizes.sum())
        deviation = p.deviation
        if deviation is None:  # a dense message: no lazy row
            deviation = np.asarray(p.values[0], float) + np.asarray(p.values[1], float) / beta
        messages = TermMessages(*(_read_only(a) for a in (
            p.clients, rows, p.e_ptr, deviation, p.hist, p.coef, p.h_ptr)))  # (one signature)
        replace_terms(messages, _term_store(store), dst, h_base + p.h_ptr[:-1],
                      server_state["S"], server_state["C"], stored, beta, accumulate)


def _term_store(store):
    """The server's store as :func:`~._fedmc_admm_server_kernels.replace_terms` reads it."""
    return TermStore(*store["rd"].arrays, store["rd_at"], store["rd_len"], *store["hc"].arrays,
                     store["hc_at"], store["hc_len"])


def _resum(server_state):
    """The server's sum from every client's stored term, exactly (bounds the drift); the
    coefficients' store is compacted on the way."""
    store = server_state["store"]
    live, ptr = store["hc"].gather(store["hc_at"], store["hc_len"])
    store["hc"], store["hc_at"] = _Pool.holding(live), ptr[:-1].copy()
    for key in ("S", "C"):
        server_state[key] = np.zeros_like(server_state[key])
    sum_terms(_term_store(store), server_state["S"], server_state["C"])
    server_state["since_exact"] = 0


def _grow_coefficients(server_state):
    """``C`` with an entry for every broadcast so far (doubling)."""
    m = server_state["history"].m
    C = server_state["C"]
    if C.size < m:
        server_state["C"] = np.concatenate([C, np.zeros(max(2 * C.size, m) - C.size)])


def _total(server_state):
    history = server_state["history"]
    _grow_coefficients(server_state)
    out = np.empty(server_state["S"].shape)
    lazy_total(server_state["S"], server_state["C"], history.H, history.m, out)
    return out


def server_init_lazy(Vt, uploads, *, beta, n_clients):
    """``server_init_uploads`` for lazy ``Y_i^0``: ``Z_i^0 = V^0 + Y_i^0 / beta`` of
    every client as a coefficient and rows, and the broadcast ``V^0`` with the history."""
    history = FactorHistory(Vt)
    n, r = Vt.shape
    empty = np.zeros(n_clients, np.int64)
    parts = _parts(uploads, ("Y",), n)
    rows = sum(int(p.e_ptr[-1]) for p in parts)  # (the rated rows' store, made once to size)
    # (the rows' item indices in the clients' type: 32 bits for the data's)
    index_type = parts[0].rows.dtype if parts else np.int64
    store = {"rd": _Pool.of([np.empty(rows, index_type), np.empty((rows, r))], 0),
             "rd_at": empty.copy(),
             "rd_len": empty.copy(), "hc": _Pool.of([np.zeros(0, np.int64), np.zeros(0)], 0),
             "hc_at": empty.copy(), "hc_len": empty.copy()}
    server_state = {"Vt": Vt, "Z": None, "history": history, "store": store,
                    "S": np.zeros((n, r)), "C": np.zeros(4),
                    "since_exact": 0}
    # W_i^0 = V^0: coefficient 1 on broadcast 0 (one group's rows at a time)
    terms = (GroupUpload(p.clients, ("W", "Y"), p.rows, p.e_ptr, (Vt[p.rows], p.values[0]),
                         np.asarray(p.values[0], float) / beta,
                         np.zeros(p.clients.size, np.int64),
                         np.tile([1.0, 0.0], (p.clients.size, 1)),
                         np.arange(p.clients.size + 1), None, Vt.shape) for p in parts)
    _replace(server_state, terms, beta, accumulate=True)
    return server_state, Broadcast(Vt, (history, 0))


def server_update_lazy(server_state, uploads, round_index, *, beta, resum_every):
    """The sum of (P-16) over all clients, replacing the terms of the clients that sent
    ``uploads`` (their rated rows and coefficients: ``O(ratings)``, one compiled call per
    group), exact every ``resum_every`` rounds. Returns ``sum_i Z_i``."""
    server_state["since_exact"] += 1
    resum = server_state["since_exact"] >= resum_every
    _grow_coefficients(server_state)
    if uploads:
        _replace(server_state, _parts(uploads, ("W", "Y"), server_state["history"].H.shape[1]),
                 beta, accumulate=not resum)
    if resum:
        _resum(server_state)
    return _total(server_state)
