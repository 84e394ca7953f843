"""Numba kernels of FedMGS for many small clients at once (a client group, ``_groups``).

One call runs the local work of every active client of a group: :func:`group_user_steps`
takes each active row's ``Q1`` proximal-gradient steps on ``U`` (the per-row body of
:func:`sklearn_fedmf._kernels.prox_grad_rows`, with each row's own step when the factors
carry biases, as ``_biases.row_groups`` gives it), :func:`group_share` forms each sampled
client's per-item aggregates ``G1_j``, ``G2_j`` on the items it rated and its Gram (the
per-client :func:`._fedmgs_protocol.share` calls it for one client; a client of many users
takes :func:`share_items`, item by item, whose items can be split over threads).
:func:`client_items` lays those rated items out once per group; :func:`group_share_outer` is
the compact form of a one-user client's aggregates (``a`` and its ratings);
:func:`replace_rows`, :func:`add_rows` and their ``outer`` forms keep the server's running
sums of the clients' latest aggregates (the ``outer`` forms by item ranges, which may run
on threads, and on packed sums when every client is a one-user client);
:func:`quadratic_forms` gives the server's ``"auto"`` rule its sums. They follow the
conventions of :mod:`sklearn_fedmf._kernels` (C-contiguous factors, item factors
transposed) and its arithmetic, entry for entry, so that a group gives the per-client
functions' iterates.
"""

import numpy as np

from ..._kernels import _gram_pays, _inline, _jit, _prox_entry, _row_gradient, _row_gram

__all__ = [
    "client_items", "group_user_steps", "group_share", "group_share_outer", "replace_rows",
    "replace_outer", "outer_changes", "ascending_runs", "add_rows", "add_outer", "outer_sum",
    "row_outers", "row_totals", "share_items", "quadratic_forms",
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
    ``rows`` of ``out`` (in place), ``W`` fixed, as ``_fedmavg_protocol.user_steps`` takes them.

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
def group_share(indptr, indices, data, row_ptr, clients, U, cols, shift_col, item_ptr, slot,
                single, out_ptr, out_values, out_grams, out_ss):
    """The uploads of the group's ``clients``: for each item ``j`` a client rated, its
    aggregates ``G2_j = sum_t x_tj a_t`` and ``G1_j = sum_t a_t a_t^T`` over its users ``t``
    who rated ``j``, with ``a_t = U[t, cols]`` and ``x_tj`` the rating minus ``U[t,
    shift_col]`` (``shift_col < 0``: none), and its Gram ``A^T A``; accumulated from zero in
    entry order.

    Client ``clients[q]``'s item rows ``[G2_j, vec(G1_j)]`` (``r + r^2`` columns) go to
    ``out_values[out_ptr[q]:out_ptr[q + 1]]`` (its items in ``item_ptr`` order; with
    ``single`` every client has one row, whose entries are its items, and ``slot`` is not
    read), its Gram to ``out_grams[q]`` and its ``sum_tj x_tj^2`` to ``out_ss[q]``, as the
    difference of a running sum over the clients' entries (rows, then entries: the
    ``cumsum`` differences it replaces, bit for bit).
    """
    r = len(cols)
    out_values[:, :] = 0.0
    out_grams[:, :, :] = 0.0
    # a_t and vec(a_t a_t^T), formed once per row (the same products the entries add): the
    # per-entry work is then contiguous adds, which the compiler vectorizes
    u = np.empty(r)
    outer = np.empty(r * r)
    running = 0.0
    for q in range(len(clients)):
        i = clients[q]
        dest = out_ptr[q]
        first = indptr[row_ptr[i]]
        before = running
        for t in range(row_ptr[i], row_ptr[i + 1]):
            offset = 0.0 if shift_col < 0 else U[t, shift_col]
            for a in range(r):
                u[a] = U[t, cols[a]]
            for a in range(r):
                for c in range(r):
                    outer[a * r + c] = u[a] * u[c]
            for s in range(indptr[t], indptr[t + 1]):
                x = data[s] - offset
                running += x * x
                row = dest + (s - first if single else slot[s])
                for a in range(r):
                    out_values[row, a] += x * u[a]
                for a in range(r * r):
                    out_values[row, r + a] += outer[a]
            for a in range(r):
                for c in range(r):
                    out_grams[q, a, c] += outer[a * r + c]
        out_ss[q] = running - before


@_jit
def row_outers(lo, hi, U, cols, out):
    """Rows ``lo:hi`` of ``out``: the upper triangle (row by row) of ``a_t a_t^T``, ``a_t =
    U[t, cols]`` (the products :func:`group_share` forms once per row; ``a_c a_a`` is the
    same number as ``a_a a_c``)."""
    r = len(cols)
    for t in range(lo, hi):
        k = 0
        for a in range(r):
            for c in range(a, r):
                out[t, k] = U[t, cols[a]] * U[t, cols[c]]
                k += 1


@_jit
def share_items(lo, hi, col_ptr, col_rows, col_entries, data, U, cols, shift_col, outers,
                out_values):
    """Rows ``lo:hi`` of one client's aggregates, item by item: row ``q`` of ``out_values``
    is ``[G2_j, vec(G1_j)]`` summed from zero over item ``q``'s raters ``col_rows[col_ptr[q]:
    col_ptr[q + 1]]`` (ascending; ``col_entries``: their stored entries), with ``outers``
    from :func:`row_outers`. The rows ascend as in :func:`group_share`, so each sum adds the
    same products in the same order: the same values, bit for bit. ``G1_j`` is summed on
    its upper triangle and mirrored (the products commute exactly). Each item's row is its
    own: the items may be split over threads."""
    r = len(cols)
    n_tri = outers.shape[1]
    acc = np.empty(r + n_tri)
    for q in range(lo, hi):
        acc[:] = 0.0
        for p in range(col_ptr[q], col_ptr[q + 1]):
            t = col_rows[p]
            x = data[col_entries[p]] - (0.0 if shift_col < 0 else U[t, shift_col])
            for a in range(r):
                acc[a] += x * U[t, cols[a]]
            for a in range(n_tri):
                acc[r + a] += outers[t, a]
        for a in range(r):
            out_values[q, a] = acc[a]
        k = r
        for a in range(r):
            for c in range(a, r):
                out_values[q, r + a * r + c] = acc[k]
                out_values[q, r + c * r + a] = acc[k]
                k += 1


@_jit
def row_totals(indptr, data, U, shift_col, outers, gram):
    """One client's Gram ``gram = sum_t a_t a_t^T`` (``outers``: :func:`row_outers`) and its
    ``sum_tj x_tj^2`` (returned), in row order from zero (:func:`group_share`'s sums for a
    client of these rows)."""
    r = gram.shape[0]
    gram[:, :] = 0.0
    total = 0.0
    for t in range(len(indptr) - 1):
        k = 0
        for a in range(r):
            for c in range(a, r):
                gram[a, c] += outers[t, k]
                if c != a:
                    gram[c, a] += outers[t, k]
                k += 1
        offset = 0.0 if shift_col < 0 else U[t, shift_col]
        for s in range(indptr[t], indptr[t + 1]):
            x = data[s] - offset
            total += x * x
    return total


@_jit
def quadratic_forms(free, total, n_components):
    """``(sum_j f_j^T G1_j f_j, sum_j f_j.G2_j, sum_j v_j^T G1_j v_j)`` over the rows ``f_j``
    of ``free`` and ``[G2_j, vec(G1_j)]`` of ``total`` (``v_j``: the first ``n_components``
    entries of ``f_j``): the three sums of :func:`._fedmgs_protocol.auto_alpha` in one pass."""
    r = free.shape[1]
    fitted = 0.0
    cross = 0.0
    signal = 0.0
    for j in range(free.shape[0]):
        for a in range(r):
            fa = free[j, a]
            cross += fa * total[j, a]
            row = 0.0
            head = 0.0
            for c in range(r):
                term = total[j, r + a * r + c] * free[j, c]
                row += term
                if c < n_components:
                    head += term
            fitted += fa * row
            if a < n_components:
                signal += fa * head
    return fitted, cross, signal


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


@_inline
def _matched_segment(items, ptr, i, new_items, new_ptr, q, mismatch):
    """``(a, k, c)``: client ``i``'s cached rows ``a:a + k`` and the start ``c`` of its upload
    ``q``; ``k = -1``, and ``mismatch[q]`` set, when the upload's rows are not the cached
    ones."""
    a, k = ptr[i], ptr[i + 1] - ptr[i]
    if not _same_rows(items, a, k, new_items, new_ptr, q):
        mismatch[q] = True
        return a, -1, new_ptr[q]
    return a, k, new_ptr[q]


@_jit
def replace_rows(total, items, ptr, values, local, new_items, new_ptr, new_values, mismatch):
    """The server's cache update: for each client ``local[q]`` of a cached segment whose new
    rows ``new_items[new_ptr[q]:new_ptr[q + 1]]`` are its cached rows, ``total[rows] +=
    new - cached`` and ``cached = new`` in one pass; ``mismatch[q]`` flags the others
    (left unchanged, for the caller)."""
    r = values.shape[1]
    for q in range(len(local)):
        a, k, c = _matched_segment(items, ptr, local[q], new_items, new_ptr, q, mismatch)
        for s in range(k):  # (none when k = -1)
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
def group_share_outer(indptr, indices, data, clients, U, cols, shift_col, out_ptr, out_x,
                      out_a):
    """:func:`group_share` for one-row clients with biases, in its compact form: client
    ``clients[q]`` (row ``clients[q]``) sends ``a = U[t, cols]`` to ``out_a[q]`` and its
    ratings minus ``b_u = U[t, shift_col]`` to ``out_x[out_ptr[q]:out_ptr[q + 1]]``
    (``G1_j = a a^T``, ``G2_j = x_j a``)."""
    r = len(cols)
    for q in range(len(clients)):
        t = clients[q]
        for a in range(r):
            out_a[q, a] = U[t, cols[a]]
        dest = out_ptr[q] - indptr[t]
        for s in range(indptr[t], indptr[t + 1]):
            out_x[dest + s] = data[s] - U[t, shift_col]


@_inline
def _first_at_least(items, lo, hi, value):
    """The first position in ``lo:hi`` of the ascending ``items`` whose item is at least
    ``value`` (``hi``: none)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_inline
def _item_span(items, a, k, lo, hi, ascending):
    """The slots ``s0:s1`` of a client's ``k`` items from ``a`` that can be items ``lo:hi``:
    by bisection when they ascend, else all of them (the caller tests each)."""
    if not ascending:
        return 0, k
    return (_first_at_least(items, a, a + k, lo) - a,
            _first_at_least(items, a, a + k, hi) - a)


@_jit
def ascending_runs(items, ptr):
    """Whether every client's items ``items[ptr[i]:ptr[i + 1]]`` strictly ascend (the item
    range kernels then find a range's items by bisection)."""
    for i in range(len(ptr) - 1):
        for s in range(ptr[i] + 1, ptr[i + 1]):
            if items[s] <= items[s - 1]:
                return False
    return True


@_jit
def outer_changes(items, ptr, A, local, new_items, new_ptr, new_A, mismatch, change, packed):
    """What :func:`replace_outer` needs once per round: ``mismatch[q]`` as :func:`replace_rows`
    sets it and row ``q`` of ``change`` the change ``a' a'^T - a a^T`` of client
    ``local[q]`` (``packed``: its upper triangle, row by row; else all of it). Returns
    whether the matched clients' items strictly ascend."""
    r = A.shape[1]
    ascending = True
    for q in range(len(local)):
        i = local[q]
        a, k, c = _matched_segment(items, ptr, i, new_items, new_ptr, q, mismatch)
        for s in range(1, k):  # (none when k = -1)
            if items[a + s] <= items[a + s - 1]:
                ascending = False
        t = 0
        for b in range(r):
            for col in range(b if packed else 0, r):
                change[q, t] = new_A[q, b] * new_A[q, col] - A[i, b] * A[i, col]
                t += 1
    return ascending


@_jit
def replace_outer(lo, hi, total, items, ptr, x, A, local, new_ptr, new_x, new_A, mismatch,
                  change, ascending):
    """:func:`replace_rows` for cached aggregates held compactly (``x`` and ``A``, one ``a``
    per client), on the items ``lo <= j < hi`` (rows of ``total``, packed or not as
    ``change``, and their cached ``x``), after :func:`outer_changes`; ``A`` is only read
    (the caller stores ``new_A`` once every range is done). Each item's sums take the same
    products in client order whatever the ranges: they may run on threads
    (:func:`sklearn_fedmf._kernels.split_rows`) with the serial sums, bit for bit."""
    r = A.shape[1]
    n_tri = change.shape[1]
    for q in range(len(local)):
        if mismatch[q]:
            continue
        i = local[q]
        a, c = ptr[i], new_ptr[q]
        s0, s1 = _item_span(items, a, ptr[i + 1] - a, lo, hi, ascending)
        for s in range(s0, s1):
            j = items[a + s]
            if j < lo or j >= hi:
                continue
            for col in range(r):
                total[j, col] += new_x[c + s] * new_A[q, col] - x[a + s] * A[i, col]
            for t in range(n_tri):
                total[j, r + t] += change[q, t]
            x[a + s] = new_x[c + s]


@_jit
def add_outer(lo, hi, total, items, ptr, x, A, sign, ascending):
    """:func:`add_rows` for cached aggregates held compactly, on the items ``lo <= j < hi``
    (for threads, as :func:`replace_outer`; packed sums when ``total`` has ``r + r (r + 1) /
    2`` columns)."""
    r = A.shape[1]
    packed = total.shape[1] < r + r * r
    outer = np.empty(total.shape[1] - r)  # a a^T: the same on each of the client's items
    for i in range(len(ptr) - 1):
        s0, s1 = _item_span(items, ptr[i], ptr[i + 1] - ptr[i], lo, hi, ascending)
        if s1 <= s0:
            continue
        t = 0
        for b in range(r):
            for col in range(b if packed else 0, r):
                outer[t] = sign * (A[i, b] * A[i, col])
                t += 1
        for s in range(ptr[i] + s0, ptr[i] + s1):
            j = items[s]
            if j < lo or j >= hi:
                continue
            for col in range(r):
                total[j, col] += sign * (x[s] * A[i, col])
            for t in range(len(outer)):
                total[j, r + t] += outer[t]


@_jit
def outer_sum(A):
    """``sum_i a_i a_i^T`` over the rows of ``A``, in order (the Grams of one-user clients)."""
    r = A.shape[1]
    out = np.zeros((r, r))
    for i in range(A.shape[0]):
        for a in range(r):
            for c in range(r):
                out[a, c] += A[i, a] * A[i, c]
    return out
