"""Numba kernels of FedMAvg's client phases (Wang & Chang, Algorithm 1) for many clients whose
rows are stacked in one CSR matrix (:mod:`sklearn_fedmf.engine._groups`).

:func:`partner_grams` forms each client's
``U_p^T U_p`` of the columns the item side sees; :func:`rated_item_steps` runs each client's
``Q2`` gradient steps (13) on the rows of its copy ``W_p`` of ``V`` that it rated. An item a
client did not rate has a zero data gradient, so its row only shrinks by the ridge, the same
closed form for every client: the caller keeps those rows implicit
(:class:`~sklearn_fedmf.engine._groups.LazyRows`), and a client's work is proportional to its
ratings, not to ``n_items``.

Conventions of :mod:`sklearn_fedmf._kernels`: C-contiguous float64 factors, item factors
transposed (``(n_items, k)``), entry-wise arithmetic in the order of the dense numpy code they
replace (so a client gives the same iterates, to rounding, whichever path runs it). With
biases the factors are the augmented ``U_aug = [U, b_u, 1]`` and ``Vt_aug = [Vt, 1, b_i]``
(``_biases``): the fixed entries are substituted (exact), never stepped.
"""

import numpy as np

from ..._kernels import _inline, _jit, _prox_entry

__all__ = ["partner_grams", "rated_item_steps", "add_rows"]


@_inline
def _partner_col(a, k, biased):
    """Column of ``U_aug`` (or of ``Vt_aug``) behind free item-side column ``a``: with biases
    the item side sees ``[U, 1]`` and steps ``[Vt, b_i]``, skipping column ``k - 1`` of each
    (``b_u``, the fixed ones)."""
    return a + 1 if biased and a == k - 1 else a


@_jit
def partner_grams(row_ptr, clients, U, biased, out):
    """``out[q] = A^T A`` over the stacked rows ``row_ptr[i]:row_ptr[i + 1]`` of client
    ``i = clients[q]``, with ``A = U`` (``[U, 1]`` of ``U_aug`` with biases)."""
    k = U.shape[1] - 1 if biased else U.shape[1]
    for q in range(clients.shape[0]):
        i = clients[q]
        for a in range(k):
            for cc in range(a, k):
                acc = 0.0
                ca, ccol = _partner_col(a, k, biased), _partner_col(cc, k, biased)
                for t in range(row_ptr[i], row_ptr[i + 1]):
                    acc += U[t, ca] * U[t, ccol]
                out[q, a, cc] = acc
                out[q, cc, a] = acc


@_jit
def rated_item_steps(indptr, indices, data, row_ptr, clients, U, Vt, biased, d, scale, n_steps,
                     ridge, l1, positive, out_ptr, out_items, out_values):
    """Each client's ``n_steps`` gradient steps (13) ``W <- prox(W - (scale grad + ridge W)
    / d)`` from ``W = V``, on the rows of ``W`` it rated.

    Client ``i = clients[q]`` owns the stacked rows ``row_ptr[i]:row_ptr[i + 1]`` and uses
    ``scale[q]``, the steps ``1 / d[q, a]`` and the prox thresholds ``l1[q, a]`` of the free
    columns ``a`` (with biases one bound per column block). Its rated items go ascending to
    ``out_items[out_ptr[q]:out_ptr[q + 1]]`` and the rows of ``W_p`` there to ``out_values``
    (``Vt``'s layout: ``[W, 1, b_i]`` with biases, whose free entries ``[W, b_i]`` step
    against ``[U, 1]`` on the ratings minus ``b_u``); ``out_ptr[0]`` must be 0. The other rows
    of ``W_p`` have a zero data gradient (the caller's closed form). The arithmetic is
    :func:`sklearn_fedmf._kernels.grad_cols`' on the client's block, in its order.
    """
    kw = Vt.shape[1] - 1 if biased else Vt.shape[1]
    slot = np.full(Vt.shape[0], -1, np.int64)
    most_entries, most_rows = 0, 0
    for q in range(clients.shape[0]):
        i = clients[q]
        most_entries = max(most_entries, indptr[row_ptr[i + 1]] - indptr[row_ptr[i]])
        most_rows = max(most_rows, row_ptr[i + 1] - row_ptr[i])
    seen = np.empty(most_entries, np.int64)
    at_slot = np.empty(most_entries, np.int64)  # each entry's row of W
    y = np.empty(most_entries)  # the ratings the steps fit (minus b_u)
    A = np.empty((most_rows, kw))  # the client's [U, 1]
    W = np.empty((most_entries, kw))
    G = np.empty((most_entries, kw))
    for q in range(clients.shape[0]):
        i = clients[q]
        first_row, lo, hi = row_ptr[i], indptr[row_ptr[i]], indptr[row_ptr[i + 1]]
        n = 0
        for s in range(lo, hi):
            j = indices[s]
            if slot[j] < 0:
                slot[j] = 0
                seen[n] = j
                n += 1
        items = np.sort(seen[:n])
        for m in range(n):
            slot[items[m]] = m
            for a in range(kw):
                W[m, a] = Vt[items[m], _partner_col(a, kw, biased)]
        for t in range(first_row, row_ptr[i + 1]):
            for a in range(kw):
                A[t - first_row, a] = U[t, _partner_col(a, kw, biased)]
            for s in range(indptr[t], indptr[t + 1]):
                at_slot[s - lo] = slot[indices[s]]
                y[s - lo] = data[s] - U[t, kw - 1] if biased else data[s]
        sq = scale[q]
        for _ in range(n_steps):
            G[:n] = 0.0
            for t in range(row_ptr[i + 1] - first_row):
                for s in range(indptr[first_row + t] - lo, indptr[first_row + t + 1] - lo):
                    m = at_slot[s]
                    e = -y[s]
                    for a in range(kw):
                        e += A[t, a] * W[m, a]
                    for a in range(kw):
                        G[m, a] += e * A[t, a]
            for m in range(n):
                for a in range(kw):
                    w = W[m, a]
                    W[m, a] = _prox_entry(w - (sq * G[m, a] + ridge * w) / d[q, a], l1[q, a],
                                          1.0, positive)
        at = out_ptr[q]
        for m in range(n):
            out_items[at + m] = items[m]
            for a in range(kw):
                out_values[at + m, _partner_col(a, kw, biased)] = W[m, a]
            if biased:
                out_values[at + m, kw - 1] = 1.0
            slot[items[m]] = -1
        out_ptr[q + 1] = at + n


@_jit
def add_rows(out, rows, values, base, scale, weight):
    """``out[rows] += weight * (values - scale * base[rows])`` (``scale``: one per column): an
    lazy message's rated rows into an aggregate."""
    for m in range(rows.shape[0]):
        j = rows[m]
        for a in range(out.shape[1]):
            out[j, a] += weight * (values[m, a] - scale[a] * base[j, a])
