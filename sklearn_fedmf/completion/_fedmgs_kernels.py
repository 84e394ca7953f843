"""Numba kernels of FedMGS for many small clients at once (a client group, ``_groups``).

One call runs the local work of every active client of a group: :func:`group_user_steps`
takes each active row's ``Q1`` proximal-gradient steps on ``U`` (the per-row body of
:func:`sklearn_fedmf._kernels.prox_grad_rows`, with each row's own step when the factors
carry biases, as ``_biases.row_groups`` gives it), :func:`group_share` forms each sampled
client's gradient in ``V`` on the items it rated only and its Gram. :func:`client_items`
lays those rated items out once per group; :func:`group_share_outer` is the compact form of a
one-user client's gradient (``e a^T``); :func:`replace_rows`, :func:`add_rows` and their
``outer`` forms keep the server's running sum of the clients' latest gradients. They follow
the conventions of :mod:`sklearn_fedmf._kernels` (C-contiguous factors, item factors
transposed) and its arithmetic, entry for entry, so that a group gives the per-client
functions' iterates.
"""

import numpy as np

from .._kernels import _gram_pays, _inline, _jit, _prox_entry, _row_gradient, _row_gram

__all__ = [
    "client_items", "group_user_steps", "group_share", "group_share_outer", "replace_rows",
    "replace_outer", "add_rows", "add_outer", "outer_sum",
]


@_jit
def client_items(indptr, indices, row_ptr, n_items):
    """Each client's rated items (ascending, distinct) and every entry's slot among them.

    Returns ``items``, ``item_ptr`` (client ``i``'s items are ``items[item_ptr[i]:item_ptr[i +
    1]]``) and ``slot`` (entry ``s`` of client ``i`` is item ``items[item_ptr[i] + slot[s]]``).
    """
    n_clients = len(row_ptr) - 1
    seen = np.full(n_items, -1, dtype=np.int64)
    position = np.empty(n_items, dtype=np.int64)
    item_ptr = np.zeros(n_clients + 1, dtype=np.int64)
    items = np.empty(indptr[-1], dtype=indices.dtype)
    slot = np.empty(indptr[-1], dtype=np.int32)
    k = 0
    for i in range(n_clients):
        lo = k
        for s in range(indptr[row_ptr[i]], indptr[row_ptr[i + 1]]):
            j = indices[s]
            if seen[j] != i:
                seen[j] = i
                items[k] = j
                k += 1
        items[lo:k] = np.sort(items[lo:k])
        for q in range(lo, k):
            position[items[q]] = q - lo
        for s in range(indptr[row_ptr[i]], indptr[row_ptr[i + 1]]):
            slot[s] = position[indices[s]]
        item_ptr[i + 1] = k
    return items[:k].copy(), item_ptr, slot


@_jit
def group_user_steps(indptr, indices, data, rows, W, shift, norms2, biased, lam, c_factor,
                     alpha, l1_ratio, n_steps, positive, eps, tau, out):
    """``n_steps`` proximal-gradient steps on the first ``W.shape[1]`` columns of the rows
    ``rows`` of ``out`` (in place), ``W`` fixed, as ``_fedmavg.user_steps`` takes them.

    Row ``t`` sees the ratings ``data - shift[item]`` (the biased view subtracts ``b_i``;
    pass zeros otherwise) and has the strength ``alpha[t]`` (ridge part in the gradient and
    in the bound). Its step is ``1 / c`` with ``c = c_factor max(lam + ridge, eps)``
    (``lam = lambda_max(W^T W)``) or, when ``biased``, the block bounds of
    ``_biases.user_step_bounds``: ``(1 + 1/tau) sum_{j in Omega_t} norms2[j] + ridge`` for
    the factor columns and ``(1 + tau) n_t + ridge`` for the bias (the last column).
    """
    r = W.shape[1]
    longest = 0
    for q in range(len(rows)):
        t = rows[q]
        if indptr[t + 1] - indptr[t] > longest:
            longest = indptr[t + 1] - indptr[t]
    local_ptr = np.zeros(2, dtype=np.int64)
    local_idx = np.empty(longest, dtype=indices.dtype)
    local_data = np.empty(longest)
    Bt = np.empty((r, longest))
    x = np.empty(longest)
    G = np.empty((r, r))
    b = np.empty(r)
    g = np.empty(r)
    u = np.empty(r)
    c = np.empty(r)
    for q in range(len(rows)):
        t = rows[q]
        lo, k = indptr[t], indptr[t + 1] - indptr[t]
        trace = 0.0
        for s in range(k):
            j = indices[lo + s]
            local_idx[s] = j
            local_data[s] = data[lo + s] - shift[j]
            trace += norms2[j]
        local_ptr[1] = k
        ridge = alpha[t] * (1.0 - l1_ratio)
        l1_total = alpha[t] * l1_ratio
        if biased:
            for a in range(r - 1):
                c[a] = c_factor * max((1.0 + 1.0 / tau) * trace + ridge, eps)
            c[r - 1] = c_factor * max((1.0 + tau) * float(k) + ridge, eps)
        else:
            for a in range(r):
                c[a] = c_factor * max(lam + ridge, eps)
        use_gram = _gram_pays(k, r, n_steps)
        if use_gram:
            _row_gram(local_ptr, local_idx, local_data, 0, W, Bt, x, G, b)
        for a in range(r):
            u[a] = out[t, a]
        for _ in range(n_steps):
            _row_gradient(local_ptr, local_idx, local_data, 0, u, W, use_gram, G, b, g)
            for a in range(r):
                u[a] = _prox_entry(u[a] - (g[a] + ridge * u[a]) / c[a], l1_total / c[a],
                                   1.0, positive)
        for a in range(r):
            out[t, a] = u[a]


@_jit
def group_share(indptr, indices, data, row_ptr, clients, U, cols, shift_col, Wf, item_ptr,
                slot, single, out_ptr, out_values, out_grams):
    """The uploads of the group's ``clients``: the gradient ``A^T P_Omega(A Wf^T - M')`` on
    each client's rated items and its Gram ``A^T A``, with ``A = U[:, cols]`` and ``M'`` the
    ratings minus ``U[:, shift_col]`` (``shift_col < 0``: none), as
    :func:`sklearn_fedmf._kernels.grad_cols` accumulates them (entry order, from zero).

    Client ``clients[q]``'s rows go to ``out_values[out_ptr[q]:out_ptr[q + 1]]`` (its items
    in ``item_ptr`` order; with ``single`` every client has one row, whose entries are its
    items, and ``slot`` is not read) and its Gram to ``out_grams[q]``.
    """
    r = len(cols)
    out_values[:, :] = 0.0
    out_grams[:, :, :] = 0.0
    for q in range(len(clients)):
        i = clients[q]
        dest = out_ptr[q]
        first = indptr[row_ptr[i]]
        for t in range(row_ptr[i], row_ptr[i + 1]):
            offset = 0.0 if shift_col < 0 else U[t, shift_col]
            for s in range(indptr[t], indptr[t + 1]):
                j = indices[s]
                e = -(data[s] - offset)
                for a in range(r):
                    e += U[t, cols[a]] * Wf[j, a]
                row = dest + (s - first if single else slot[s])
                for a in range(r):
                    out_values[row, a] += e * U[t, cols[a]]
            for a in range(r):
                for c in range(r):
                    out_grams[q, a, c] += U[t, cols[a]] * U[t, cols[c]]


@_inline
def _same_rows(items, a, k, new_items, new_ptr, q):
    """Whether the new rows of upload ``q`` are the ``k`` cached rows from ``a``."""
    c = new_ptr[q]
    if new_ptr[q + 1] - c != k:
        return False
    for s in range(k):
        if items[a + s] != new_items[c + s]:
            return False
    return True


@_jit
def replace_rows(total, items, ptr, values, local, new_items, new_ptr, new_values, mismatch):
    """The server's cache update: for each client ``local[q]`` of a cached segment whose new
    rows ``new_items[new_ptr[q]:new_ptr[q + 1]]`` are its cached rows, ``total[rows] +=
    new - cached`` and ``cached = new`` in one pass; ``mismatch[q]`` flags the others
    (left unchanged, for the caller)."""
    r = values.shape[1]
    for q in range(len(local)):
        i = local[q]
        a, k = ptr[i], ptr[i + 1] - ptr[i]
        c = new_ptr[q]
        if not _same_rows(items, a, k, new_items, new_ptr, q):
            mismatch[q] = True
            continue
        for s in range(k):
            j = items[a + s]
            for col in range(r):
                v = new_values[c + s, col]
                total[j, col] += v - values[a + s, col]
                values[a + s, col] = v


@_jit
def add_rows(total, items, values, sign):
    """``total[items[s]] += sign * values[s]`` for every cached row ``s``, in order."""
    r = values.shape[1]
    for s in range(len(items)):
        j = items[s]
        for col in range(r):
            total[j, col] += sign * values[s, col]


@_jit
def group_share_outer(indptr, indices, data, clients, U, cols, shift_col, Wf, out_ptr, out_e,
                      out_a, out_grams):
    """:func:`group_share` for one-row clients with biases (``U[:, cols[-1]]`` is the fixed
    1): the gradient of client ``clients[q]`` (row ``clients[q]``) is ``e a^T`` on its rated
    items, with ``e`` to ``out_e[out_ptr[q]:out_ptr[q + 1]]`` and ``a = U[t, cols]`` to
    ``out_a[q]``; the residuals are :func:`group_share`'s, entry for entry."""
    r = len(cols)
    for q in range(len(clients)):
        t = clients[q]
        for a in range(r):
            out_a[q, a] = U[t, cols[a]]
        for a in range(r):
            for c in range(r):
                out_grams[q, a, c] = out_a[q, a] * out_a[q, c]
        dest = out_ptr[q] - indptr[t]
        for s in range(indptr[t], indptr[t + 1]):
            j = indices[s]
            e = -(data[s] - U[t, shift_col])
            for a in range(r):
                e += U[t, cols[a]] * Wf[j, a]
            out_e[dest + s] = e


@_jit
def replace_outer(total, items, ptr, e, A, local, new_items, new_ptr, new_e, new_A, mismatch):
    """:func:`replace_rows` for cached gradients held as ``e a^T`` (``A`` one ``a`` per
    client): the same sums, product for product."""
    r = A.shape[1]
    for q in range(len(local)):
        i = local[q]
        a, k = ptr[i], ptr[i + 1] - ptr[i]
        c = new_ptr[q]
        if not _same_rows(items, a, k, new_items, new_ptr, q):
            mismatch[q] = True
            continue
        for s in range(k):
            j = items[a + s]
            for col in range(r):
                total[j, col] += new_e[c + s] * new_A[q, col] - e[a + s] * A[i, col]
            e[a + s] = new_e[c + s]
        for col in range(r):
            A[i, col] = new_A[q, col]


@_jit
def add_outer(total, items, ptr, e, A, sign):
    """:func:`add_rows` for cached gradients held as ``e a^T``."""
    r = A.shape[1]
    for i in range(len(ptr) - 1):
        for s in range(ptr[i], ptr[i + 1]):
            j = items[s]
            for col in range(r):
                total[j, col] += sign * (e[s] * A[i, col])


@_jit
def outer_sum(A):
    """``sum_i a_i a_i^T`` over the rows of ``A``, in order (the Grams of ``e a^T`` clients)."""
    r = A.shape[1]
    out = np.zeros((r, r))
    for i in range(A.shape[0]):
        for a in range(r):
            for c in range(r):
                out[a, c] += A[i, a] * A[i, c]
    return out
