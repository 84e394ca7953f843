"""Kernels on the observed entries of a CSR rating block.

Each kernel fuses the sampled dense-dense product (the residual ``e = P_Omega(U W - M)`` at the
stored entries only) with the sparse-dense product that consumes it, in one pass over the
entries and without allocating an ``nnz x r`` gather. They are compiled with numba (``nogil``,
so joblib's threading backend runs clients truly in parallel; ``cache`` so the compilation is
paid once per machine). ``tests/test_kernels.py`` checks each against a dense numpy oracle;
``benchmarks/bench_fedmcadmm.py`` times them, inside the estimator, against a plain
numpy/scipy implementation of the same algorithm.

Reductions that LLVM may vectorize are compiled with ``fastmath={"reassoc", "contract"}``
(``_reduce``): their summation order then depends on the length only, not on the alignment of
the arrays, so results stay the same for any ``n_jobs`` and backend.

Factor layout: ``U`` is ``(m_i, r)``; the item factor is passed transposed, ``Wt`` of shape
``(n_items, r)``, C-contiguous, so that an entry's item row is a contiguous read.
"""

import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
from numba import njit

__all__ = [
    "grad_rows",
    "grad_cols",
    "squared_error",
    "values_at",
    "ridge_fold_in",
    "prox_grad_rows",
    "squared_distance",
    "shifted_data_and_row_sums",
    "rank_in_rows",
    "parallel_kernels",
    "row_tasks",
    "split_rows",
    "read_only",
]

_jit = njit(cache=True, nogil=True, fastmath=False)
# Small helpers are inlined into the loops that call them (numba IR inlining): a call per
# entry or per step would otherwise cost more than the arithmetic.
_inline = njit(cache=True, nogil=True, inline="always")
# Row kernels (and FedMGS's item kernel) may split their rows over threads: each row is
# computed by one call of the same compiled range kernel (nogil), so its values do not depend
# on the split, and the results are bit for bit the serial kernel's whatever the thread count.
# Python threads rather than numba's parallel=True: measured on a loaded two-core machine,
# numba's OpenMP layer spins at its barriers (2x slower than serial), and its workqueue layer
# aborts on launches from two threads at once.
MIN_ROWS_PER_TASK = 64

# How many threads this thread's kernels may use (:func:`parallel_kernels`). A new thread
# starts with the default, 1: the engine's worker threads and processes (clients run
# ``n_jobs`` at a time) run the kernels in one piece, so the threads never nest.
_THREADS = ContextVar("sklearn_fedmf_kernel_threads", default=1)
_PARALLEL_OWNER = threading.RLock()  # one owner per process: the pool is never shared
_POOL = {}  # n_threads -> ThreadPoolExecutor of n_threads - 1, made on first use


@contextmanager
def parallel_kernels(n_threads=2):
    """Let the row kernels called by this thread inside the ``with`` split their rows over
    ``n_threads`` threads (this one and ``n_threads - 1`` of a pool).

    A fit holds it with ``n_jobs`` threads while it runs its clients' phases: a round whose
    clients run in the fit's own thread (one batch) splits their rows instead. Only one
    thread of a process holds it at a time (a fit started meanwhile in another thread of the
    process runs its kernels in one piece). Yields the number of threads granted (1: off).
    The results do not depend on it.
    """
    if n_threads < 2 or not _PARALLEL_OWNER.acquire(blocking=False):
        yield 1
        return
    token = _THREADS.set(int(n_threads))
    try:
        yield int(n_threads)
    finally:
        _THREADS.reset(token)
        _PARALLEL_OWNER.release()


def row_tasks(n_rows):
    """Into how many pieces :func:`split_rows` cuts ``n_rows`` rows here (1: one call in
    this thread)."""
    n_threads = _THREADS.get()
    n_tasks = min(4 * n_threads, n_rows // MIN_ROWS_PER_TASK)
    return n_tasks if n_threads >= 2 and n_tasks >= 2 else 1


def split_rows(kernel, n_rows, *args):
    """``kernel(lo, hi, *args)`` over the rows ``0:n_rows``: in one call, or, inside
    :func:`parallel_kernels`, in contiguous pieces (at least ``MIN_ROWS_PER_TASK`` rows,
    about four per thread) taken in turn by this thread and the pool's. ``kernel`` must
    write rows ``lo:hi`` of its outputs only, each from its own inputs (owned outputs).

    This thread works too and the pool's threads only take the pieces left: a pool thread
    that is not scheduled in time takes none (its task is cancelled)."""
    n_tasks = row_tasks(n_rows)
    if n_tasks < 2:
        kernel(0, n_rows, *args)
        return
    n_threads = _THREADS.get()
    if n_threads not in _POOL:
        _POOL[n_threads] = ThreadPoolExecutor(n_threads - 1, "sklearn_fedmf_kernel")
    edges = np.linspace(0, n_rows, n_tasks + 1).astype(np.int64).tolist()
    pieces, lock = iter(range(n_tasks)), threading.Lock()

    def work():
        while True:
            with lock:
                q = next(pieces, None)
            if q is None:
                return
            kernel(edges[q], edges[q + 1], *args)

    helpers = [_POOL[n_threads].submit(work) for _ in range(n_threads - 1)]
    work()
    for helper in helpers:
        if not helper.cancel():  # (started: it may hold a piece)
            helper.result()


def read_only(a, dtype=None):
    """``a`` as a C-contiguous read-only array (of ``dtype``, if given): a view, copied only
    to change its dtype or layout.

    For a kernel's input arrays: numba compiles a signature per writeable flag, so inputs
    that are sometimes read-only (a broadcast, a group's shared arrays) are passed read-only
    always, and the kernel compiles once.
    """
    a = np.ascontiguousarray(a, dtype=dtype)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


@_inline
def row_dot(A, i, B, j):
    """``A[i] . B[j]``, summed in order (a score ``u . v`` of one entry)."""
    v = 0.0
    for a in range(A.shape[1]):
        v += A[i, a] * B[j, a]
    return v

@_inline
def _residual_products(indptr, indices, data, U, Wt, out, cols):
    """Add each entry's residual ``e = (U Wt^T - M)_tj`` times the other factor's row to
    ``out`` (``out[t] += e Wt[j]``, or ``out[j] += e U[t]`` with ``cols``); returns the half
    squared error. (Inlined: ``cols`` is a constant in each caller.)"""
    r = U.shape[1]
    loss = 0.0
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            j = indices[s]
            e = -data[s]
            for a in range(r):
                e += U[t, a] * Wt[j, a]
            loss += e * e
            if cols:
                for a in range(r):
                    out[j, a] += e * U[t, a]
            else:
                for a in range(r):
                    out[t, a] += e * Wt[j, a]
    return 0.5 * loss


@_jit
def grad_rows(indptr, indices, data, U, Wt, out):
    """``out = P_Omega(U Wt^T - M) Wt``; returns ``1/2 ||P_Omega(U Wt^T - M)||^2``."""
    out[:, :] = 0.0
    return _residual_products(indptr, indices, data, U, Wt, out, False)


@_jit
def grad_cols(indptr, indices, data, U, Wt, out):
    """``out = (U^T P_Omega(U Wt^T - M))^T`` (items x r); returns the half squared error."""
    out[:, :] = 0.0
    return _residual_products(indptr, indices, data, U, Wt, out, True)


def shifted_data_and_row_sums(indptr, indices, data, shift, weight):
    """``data - shift[indices]`` and each row's ``sum_j weight[j]`` over its stored entries,
    summed in entry order from zero (what ``np.bincount(rows, weights=weight[indices])``
    gives) in one pass, without the gathered temporaries (on numba's threads under
    :func:`parallel_kernels`: the same values)."""
    n_rows = len(indptr) - 1
    shifted, sums = np.empty(len(data)), np.empty(n_rows)
    split_rows(_shifted_rows, n_rows, indptr, indices, data, shift, weight, shifted, sums)
    return shifted, sums


@_jit
def _shifted_rows(lo, hi, indptr, indices, data, shift, weight, shifted, sums):
    """:func:`shifted_data_and_row_sums` of rows ``lo:hi``."""
    for t in range(lo, hi):
        acc = 0.0
        for s in range(indptr[t], indptr[t + 1]):
            j = indices[s]
            shifted[s] = data[s] - shift[j]
            acc += weight[j]
        sums[t] = acc


@_jit
def rank_in_rows(indptr, keys):
    """Each stored entry's rank by ``keys`` among its row's entries (ties by position: what
    ``np.lexsort((keys, rows))`` gives), one small stable sort per row."""
    rank = np.empty(len(keys), dtype=np.int64)
    for t in range(len(indptr) - 1):
        lo = indptr[t]
        order = np.argsort(keys[lo:indptr[t + 1]], kind="mergesort")
        for m in range(len(order)):
            rank[lo + order[m]] = m
    return rank


@_jit
def squared_error(indptr, indices, data, U, Wt):
    """``||P_Omega(U Wt^T - M)||^2`` without any output array.

    Four entries at a time into four partial sums: one running sum makes every entry wait for
    the previous addition (the loop is latency-bound otherwise; 1.3x).
    """
    r = U.shape[1]
    l0 = l1 = l2 = l3 = 0.0
    for t in range(U.shape[0]):
        s, hi = indptr[t], indptr[t + 1]
        while s + 4 <= hi:
            j0, j1, j2, j3 = indices[s], indices[s + 1], indices[s + 2], indices[s + 3]
            e0, e1, e2, e3 = -data[s], -data[s + 1], -data[s + 2], -data[s + 3]
            for a in range(r):
                u = U[t, a]
                e0 += u * Wt[j0, a]
                e1 += u * Wt[j1, a]
                e2 += u * Wt[j2, a]
                e3 += u * Wt[j3, a]
            l0 += e0 * e0
            l1 += e1 * e1
            l2 += e2 * e2
            l3 += e3 * e3
            s += 4
        while s < hi:
            j, e = indices[s], -data[s]
            for a in range(r):
                e += U[t, a] * Wt[j, a]
            l0 += e * e
            s += 1
    return (l0 + l1) + (l2 + l3)


@_jit
def values_at(indptr, indices, U, Wt, out):
    """``out[s] = U[row(s)] . Wt[col(s)]`` for every stored entry ``s``."""
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            out[s] = row_dot(U, t, Wt, indices[s])


def ridge_fold_in(indptr, indices, data, Wt, alpha, out):
    """Row-wise ridge: ``out[t] = argmin_u 1/2 sum_j (m_tj - u.w_j)^2 + alpha/2 ||u||^2``.

    Rows without entries get 0. ``alpha`` (a scalar or one value per row) must be > 0 or
    every row must have >= r entries in general position (otherwise the least-squares
    solution is used via lstsq).
    """
    alpha = np.asarray(alpha, dtype=np.float64)
    _ridge_fold_in(indptr, indices, data, Wt, read_only(np.broadcast_to(alpha, (out.shape[0],))),
                   out)


@_jit
def _ridge_fold_in(indptr, indices, data, Wt, alpha, out):
    """:func:`ridge_fold_in` with one ``alpha`` per row."""
    r = Wt.shape[1]
    G = np.empty((r, r))
    b = np.empty(r)
    for t in range(out.shape[0]):
        G[:, :] = 0.0
        b[:] = 0.0
        for s in range(indptr[t], indptr[t + 1]):
            j = indices[s]
            for a in range(r):
                b[a] += data[s] * Wt[j, a]
                for c in range(r):
                    G[a, c] += Wt[j, a] * Wt[j, c]
        for a in range(r):
            G[a, a] += alpha[t]
        if indptr[t + 1] == indptr[t]:
            out[t, :] = 0.0
        elif alpha[t] > 0.0:
            out[t, :] = np.linalg.solve(G, b)
        else:
            out[t, :] = np.linalg.lstsq(G, b)[0]


@_inline
def _prox_entry(x, l1, shrink, positive):
    """Entrywise prox of the elastic net (``sklearn_fedmf._prox.prox_elastic_net``)."""
    if positive:
        z = x - l1
        z = z if z > 0.0 else 0.0
    elif l1 != 0.0:
        z = abs(x) - l1
        z = (1.0 if x > 0.0 else -1.0 if x < 0.0 else 0.0) * (z if z > 0.0 else 0.0)
    else:
        z = x
    return z / shrink


@_inline
def _gram_pays(nnz, r, n_steps):
    """Whether forming a row's ``r x r`` Gram once beats ``n_steps`` passes over its entries."""
    return nnz * (r * r + 2 * r) + n_steps * 2 * r * r < n_steps * 4 * r * nnz


# Reassociating lets LLVM vectorize the reductions. The summation order then depends only on
# the length (no peeling for alignment: tested), so results stay the same for any n_jobs.
_reduce = njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})


def squared_distance(A, B):
    """``||A - B||_F^2`` in one pass, without the ``A - B`` temporary. Both are read in the
    memory order of ``A`` (no copy of a Fortran-ordered ``A``, like Felb's factors, or of a
    ``B`` in the same order)."""
    order = "F" if np.isfortran(A) else "C"
    return float(_squared_sum(np.ravel(A, order=order), np.ravel(B, order=order)))


@_reduce
def _squared_sum(a, b):
    total = 0.0
    for i in range(a.size):
        d = a[i] - b[i]
        total += d * d
    return total



@_reduce
def _gram_of_gathered(Bt, k, x, G, b):
    """``G = Bt[:, :k] Bt[:, :k]^T`` and ``b = Bt[:, :k] x[:k]`` as contiguous dot products."""
    r = Bt.shape[0]
    for a in range(r):
        Ba = Bt[a]
        acc = 0.0
        for s in range(k):
            acc += x[s] * Ba[s]
        b[a] = acc
        for c in range(a, r):
            Bc = Bt[c]
            acc = 0.0
            for s in range(k):
                acc += Ba[s] * Bc[s]
            G[a, c] = acc
            G[c, a] = acc


@_inline
def _row_gram(indptr, indices, data, t, F, Bt, x, G, b):
    """``G = sum_j f_j f_j^T`` and ``b = sum_j m_tj f_j`` over the stored entries of row ``t``.

    The row's factors are gathered into the rows of ``Bt`` (``r x k``, at least ``k`` long)
    first: accumulating into ``G`` entry by entry is bound by the latency of its updates
    (2.3x slower).
    """
    lo, k = indptr[t], indptr[t + 1] - indptr[t]
    for s in range(k):
        j = indices[lo + s]
        x[s] = data[lo + s]
        for a in range(F.shape[1]):
            Bt[a, s] = F[j, a]
    _gram_of_gathered(Bt, k, x, G, b)


@_inline
def _gram_buffers(indptr, r, n_steps, lo=0, hi=-1):
    """Gather buffers long enough for every row of ``indptr`` (rows ``lo:hi``; ``hi < 0``:
    to the end) whose Gram pays."""
    longest = 0
    for t in range(lo, len(indptr) - 1 if hi < 0 else hi):
        k = indptr[t + 1] - indptr[t]
        if k > longest and _gram_pays(k, r, n_steps):
            longest = k
    return np.empty((r, longest)), np.empty(longest)


@_inline
def _row_gradient(indptr, indices, data, t, x, F, use_gram, G, b, g):
    """``g = sum_j (x . f_j - m_tj) f_j`` over row ``t``: from the Gram, or entry by entry."""
    r = F.shape[1]
    if use_gram:
        for a in range(r):
            acc = -b[a]
            for c in range(r):
                acc += G[a, c] * x[c]
            g[a] = acc
        return
    for a in range(r):
        g[a] = 0.0
    for s in range(indptr[t], indptr[t + 1]):
        j = indices[s]
        e = -data[s]
        for a in range(r):
            e += x[a] * F[j, a]
        for a in range(r):
            g[a] += e * F[j, a]


def prox_grad_rows(indptr, indices, data, U, Wt, L, n_steps, l1, shrink, positive, ridge, out):
    """``n_steps`` proximal-gradient steps ``U <- prox(U - (grad_U + ridge U) / L)``, ``Wt``
    fixed (``ridge``: a squared-l2 term taken in the gradient rather than in the prox).

    ``shrink`` and ``ridge`` are scalars or one value per row (a per-row regularization, e.g.
    scaled by each row's number of ratings); ``L`` and ``l1`` are scalars, one value per row
    or one per entry of ``U`` (a step per row and column).
    """
    n = U.shape[0]

    def per_row(a):
        return read_only(np.broadcast_to(np.asarray(a, dtype=np.float64), (n,)))

    def per_entry(a):
        a = np.asarray(a, dtype=np.float64)
        return read_only(np.broadcast_to(a[:, None] if a.ndim == 1 else a, U.shape))

    split_rows(_prox_grad_range, n, indptr, indices, data, U, Wt, per_entry(L), n_steps,
               per_entry(l1), per_row(shrink), positive, per_row(ridge), out)


@_inline
def _prox_grad_chunk(lo, hi, indptr, indices, data, U, Wt, L, n_steps, l1, shrink, positive,
                     ridge, out):
    """The steps of rows ``lo:hi`` (:func:`_prox_grad_rows`), with their own buffers."""
    r = U.shape[1]
    G = np.empty((r, r))
    b = np.empty(r)
    g = np.empty(r)
    u = np.empty(r)
    Bt, x = _gram_buffers(indptr, r, n_steps, lo, hi)
    for t in range(lo, hi):
        use_gram = _gram_pays(indptr[t + 1] - indptr[t], r, n_steps)
        if use_gram:
            _row_gram(indptr, indices, data, t, Wt, Bt, x, G, b)
        for a in range(r):
            u[a] = U[t, a]
        for _ in range(n_steps):
            _row_gradient(indptr, indices, data, t, u, Wt, use_gram, G, b, g)
            for a in range(r):
                u[a] = _prox_entry(u[a] - (g[a] + ridge[t] * u[a]) / L[t, a], l1[t, a],
                                   shrink[t], positive)
        for a in range(r):
            out[t, a] = u[a]


@_jit
def _prox_grad_rows(indptr, indices, data, U, Wt, L, n_steps, l1, shrink, positive, ridge, out):
    """:func:`prox_grad_rows` with one ``shrink``, ``ridge`` per row and one ``L``, ``l1``
    per entry.

    Rows do not interact when ``Wt`` is fixed, so each row runs all its steps at once. Its
    gradient is ``G_t u - b_t`` with ``G_t = sum_j w_j w_j^T`` and ``b_t = sum_j m_tj w_j``;
    for rows with enough ratings these are formed once and each step costs ``O(r^2)``
    instead of a pass over the row's entries (the same iterates up to rounding).
    """
    _prox_grad_chunk(0, U.shape[0], indptr, indices, data, U, Wt, L, n_steps, l1, shrink,
                     positive, ridge, out)


@_jit
def _prox_grad_range(lo, hi, indptr, indices, data, U, Wt, L, n_steps, l1, shrink, positive,
                     ridge, out):
    """:func:`_prox_grad_rows` of rows ``lo:hi`` (a piece of :func:`split_rows`)."""
    _prox_grad_chunk(lo, hi, indptr, indices, data, U, Wt, L, n_steps, l1, shrink, positive,
                     ridge, out)
