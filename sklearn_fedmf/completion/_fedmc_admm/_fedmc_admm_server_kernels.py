"""Numba kernels of FedMC-ADMM's server over many small clients
(:mod:`._fedmc_admm_batched`): its store of every client's term ``Z_i = W_i + Y_i / beta``
(a combination of the broadcasts and the deviations on the client's rated rows), kept and
summed in ``O(ratings)``."""

from collections import namedtuple

from ..._kernels import _jit

__all__ = ["TermMessages", "TermStore", "lazy_total", "replace_terms", "sum_terms"]


# (the arrays travel in named tuples: numba takes one as one argument)
class TermMessages(namedtuple("TermMessages", "clients rows e_ptr D hist coef h_ptr")):
    """The messages :func:`replace_terms` stores, concatenated."""

    __slots__ = ()


class TermStore(namedtuple("TermStore", "rows D rd_at rd_len hist coef hc_at hc_len")):
    """The server's store of the terms (:func:`replace_terms`)."""

    __slots__ = ()


@_jit
def replace_terms(messages, store, dst, h_dst, S, C, stored, beta, accumulate):
    """Replace the server's terms ``Z_i = W_i + Y_i / beta`` of the ``clients`` (a
    :class:`TermMessages`: the messages concatenated as in :func:`group_update`'s outputs,
    ``e_ptr``/``h_ptr`` over the clients) in the :class:`TermStore` ``store`` (its fields
    ``store_rows``, ``store_D``, ``store_hist``, ``store_coef`` below).

    A term is stored as its broadcasts and coefficients ``coef[:, 0] + coef[:, 1] / beta`` (at
    ``h_dst[a]`` of ``store_hist``, ``store_coef``), valid on every row, and its explicit rows'
    deviations ``D`` from that combination (:func:`group_update`'s ``D_out``; at ``dst[a]`` of
    ``store_rows``, ``store_D``: the client's old rows when they are as many, read before
    they are written; ``stored``: the rows there are the client's already, ``rows`` is not
    read, and each row takes its change in one pass); ``rd_at``, ``rd_len``, ``hc_at``,
    ``hc_len`` then point there. With
    ``accumulate`` the sum takes the change, client by client (the old term out, the new one
    in): ``C[t]`` sums the coefficients of broadcast ``t`` and ``S`` the deviations
    (:func:`lazy_total`). Only the rows and the broadcasts a client has are touched.
    """
    clients, rows, e_ptr, D, hist, coef, h_ptr = messages
    store_rows, store_D, rd_at, rd_len, store_hist, store_coef, hc_at, hc_len = store
    r = S.shape[1]
    for a in range(clients.size):
        c = clients[a]
        if accumulate:
            q0, nq = hc_at[c], hc_len[c]
            for q in range(q0, q0 + nq):
                C[store_hist[q]] -= store_coef[q]
            if not stored:  # (else each row takes its change below, in one pass)
                o = rd_at[c]
                for e in range(o, o + rd_len[c]):
                    j = store_rows[e]
                    for b in range(r):
                        S[j, b] -= store_D[e, b]
        q0, q1 = h_ptr[a], h_ptr[a + 1]
        hd = h_dst[a] - q0
        for q in range(q0, q1):
            cq = coef[q, 0] + coef[q, 1] / beta
            store_hist[hd + q], store_coef[hd + q] = hist[q], cq
            if accumulate:
                C[hist[q]] += cq
        d = dst[a] - e_ptr[a]
        for e in range(e_ptr[a], e_ptr[a + 1]):
            if stored:
                j = store_rows[d + e]
                for b in range(r):
                    z = D[e, b]
                    if accumulate:
                        S[j, b] += z - store_D[d + e, b]
                    store_D[d + e, b] = z
                continue
            j = rows[e]
            store_rows[d + e] = j
            for b in range(r):
                z = D[e, b]
                store_D[d + e, b] = z
                if accumulate:
                    S[j, b] += z
        rd_at[c], rd_len[c] = dst[a], e_ptr[a + 1] - e_ptr[a]
        hc_at[c], hc_len[c] = h_dst[a], q1 - q0


@_jit
def lazy_total(S, C, H, m, out):
    """``out = S + sum_t C[t] H[t]`` over the first ``m`` broadcasts: the sum of every
    client's ``Z_i``, its combination counted on all rows (``C``) and its explicit rows'
    deviations from it (``S``)."""
    n, r = S.shape
    o, s = out.reshape(n * r), S.reshape(n * r)
    for i in range(n * r):
        o[i] = s[i]
    for t in range(m):
        c, h = C[t], H[t].reshape(n * r)
        for i in range(n * r):
            o[i] += c * h[i]


@_jit
def sum_terms(store, S, C):
    """``S``, ``C`` of :func:`replace_terms` from every client's stored term (exact, the
    :class:`TermStore` ``store``)."""
    rows, D, rd_at, rd_len, hist, coef, hc_at, hc_len = store
    for c in range(rd_at.size):
        for q in range(hc_at[c], hc_at[c] + hc_len[c]):
            C[hist[q]] += coef[q]
        for e in range(rd_at[c], rd_at[c] + rd_len[c]):
            j = rows[e]
            for b in range(S.shape[1]):
                S[j, b] += D[e, b]
