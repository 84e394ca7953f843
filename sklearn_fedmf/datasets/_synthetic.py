"""Synthetic data: low-rank ratings with skewed activity, and planted Boolean tiles."""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp
from scipy.special import logsumexp
from sklearn.utils import Bunch, check_random_state

from ..engine._client_data import check_int

__all__ = ["make_ratings", "make_binary_ratings", "make_binary_tiles"]


def _check_generator(random_state):
    """A numpy Generator from an sklearn-style ``random_state`` (never the global RNG)."""
    if isinstance(random_state, np.random.Generator):
        return random_state
    if random_state is None or isinstance(random_state, numbers.Integral):
        return np.random.default_rng(random_state)
    return np.random.default_rng(check_random_state(random_state).randint(2**31 - 1))


def make_ratings(
    n_users=1000,
    n_items=500,
    n_ratings=20000,
    *,
    n_components=5,
    noise=0.5,
    rating_scale=(1, 5),
    popularity=1.0,
    random_state=None,
    dtype=np.float64,
    chunk_size=2**23,
):
    """Generate a sparse low-rank rating matrix with skewed user activity and item popularity.

    The planted model is ``offset + user_factors @ item_factors.T + noise * N(0, 1)``,
    rounded to integers and clipped to ``rating_scale``. The factors have i.i.d. Gaussian
    entries scaled so that the low-rank part has standard deviation ``(high - low) / 4``
    (1 when ``rating_scale=None``); ``offset`` is the middle of the scale (0 for None).

    Which pairs are observed: user ``u`` rates ``n_u`` items, where ``n_u - 1`` follows a
    multinomial over users with lognormal weights ``exp(popularity * N(0, 1))`` (every user
    has at least one rating when ``n_ratings >= n_users``; no user rates more than
    ``n_items``). Its items are drawn without replacement with Zipf weights
    ``rank ** -popularity`` over a random ranking of the items. ``popularity=0`` gives
    uniform users and items. The result has exactly ``n_ratings`` distinct stored pairs.

    Memory stays proportional to ``n_ratings`` (no dense users x items array): users are
    processed in blocks of ``chunk_size`` cells and the CSR arrays are filled in place. The
    Netflix shape (480189 x 17770, 1e8 ratings) fits in about 2 GB.

    Parameters
    ----------
    n_users, n_items : int, default=1000, 500
        Shape of ``X``.
    n_ratings : int, default=20000
        Number of observed entries, at most ``n_users * n_items``.
    n_components : int, default=5
        Rank of the planted factors.
    noise : float, default=0.5
        Standard deviation of the Gaussian noise added before rounding.
    rating_scale : (low, high) or None, default=(1, 5)
        Ratings are rounded to integers and clipped to ``[low, high]``; None keeps continuous,
        unclipped values.
    popularity : float, default=1.0
        Skew of user activity and item popularity (0 = uniform).
    random_state : int, RandomState, Generator or None
        Seed. The output depends on it and on ``chunk_size``.
    dtype : {np.float64, np.float32}, default=np.float64
        dtype of ``X``.
    chunk_size : int, default=2**23
        Number of users x items cells handled at once (bounds the working memory).

    Returns
    -------
    data : sklearn.utils.Bunch
        ``X`` (CSR, n_users x n_items), ``user_factors`` (n_users, n_components),
        ``item_factors`` (n_items, n_components) and ``offset`` (float).

    Examples
    --------
    >>> from sklearn_fedmf.datasets import make_ratings
    >>> data = make_ratings(100, 50, 1000, random_state=0)
    >>> data.X.shape, data.X.nnz, float(data.X.data.min()), float(data.X.data.max())
    ((100, 50), 1000, 1.0, 5.0)
    """
    n_users = check_int(n_users, "n_users", 1)
    n_items = check_int(n_items, "n_items", 1)
    n_ratings = check_int(n_ratings, "n_ratings", 0)
    k = check_int(n_components, "n_components", 1)
    chunk_size = check_int(chunk_size, "chunk_size", 1)
    if n_ratings > n_users * n_items:
        raise ValueError(
            f"n_ratings={n_ratings} exceeds the number of cells n_users * n_items = "
            f"{n_users * n_items}."
        )
    if not noise >= 0 or not popularity >= 0:
        raise ValueError(f"noise and popularity must be >= 0, got {noise} and {popularity}.")
    if rating_scale is not None and not rating_scale[0] < rating_scale[1]:
        raise ValueError(f"rating_scale must be (low, high) with low < high, got {rating_scale}.")
    rng = _check_generator(random_state)

    spread = 1.0 if rating_scale is None else (rating_scale[1] - rating_scale[0]) / 4
    offset = 0.0 if rating_scale is None else (rating_scale[0] + rating_scale[1]) / 2
    scale = np.sqrt(spread / np.sqrt(k))
    user_factors = rng.standard_normal((n_users, k)) * scale
    item_factors = rng.standard_normal((n_items, k)) * scale

    log_p = -popularity * np.log(rng.permutation(n_items) + 1.0)
    log_p -= logsumexp(log_p)
    p = np.exp(log_p)
    w = np.exp(popularity * rng.standard_normal(n_users))
    counts = _user_counts(n_ratings, w / w.sum(), n_items, rng)

    index_dtype = np.int32 if max(n_items, n_ratings) < 2**31 else np.int64
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = np.empty(n_ratings, dtype=index_dtype)
    data = np.empty(n_ratings, dtype=dtype)

    sampler = _PairSampler(p, log_p, rng, max(1, chunk_size // n_items) * n_items)
    ut, vt = user_factors.T.copy(), item_factors.T.copy()
    block = max(1, chunk_size // n_items)
    for start in range(0, n_users, block):
        stop = min(start + block, n_users)
        rows, cols = sampler.sample(counts[start:stop])
        values = np.zeros(len(rows))
        for f in range(k):
            values += ut[f, start:stop][rows] * vt[f][cols]
        values += offset + noise * rng.standard_normal(len(rows))
        if rating_scale is not None:
            np.clip(np.rint(values), rating_scale[0], rating_scale[1], out=values)
        lo, hi = indptr[start], indptr[stop]
        indices[lo:hi] = cols
        data[lo:hi] = values
    if index_dtype is np.int32:
        indptr = indptr.astype(np.int32)
    X = sp.csr_matrix((data, indices, indptr), shape=(n_users, n_items))
    X.has_canonical_format = True
    return Bunch(X=X, user_factors=user_factors, item_factors=item_factors, offset=offset)


def _user_counts(n_ratings, w, n_items, rng):
    """Ratings per user: 1 + multinomial (when possible), capped at n_items, exact total."""
    n_users = len(w)
    if n_ratings >= n_users:
        counts = 1 + rng.multinomial(n_ratings - n_users, w)
    else:
        counts = rng.multinomial(n_ratings, w)
    excess = int(np.maximum(counts - n_items, 0).sum())
    while excess:  # users over capacity give their surplus to the others, by weight
        np.minimum(counts, n_items, out=counts)
        room = w * (counts < n_items)
        counts += rng.multinomial(excess, room / room.sum())
        excess = int(np.maximum(counts - n_items, 0).sum())
    return counts


class _PairSampler:
    """Draw, for a block of users, given numbers of distinct items without replacement.

    Light users draw items with replacement and keep the first new ones (successive
    sampling); users for whom that would take more than ``n_items`` draws use exact
    Gumbel top-k keys instead. A boolean mask over the block's cells tracks chosen pairs.
    """

    def __init__(self, p, log_p, rng, n_cells):
        self.p, self.log_p, self.rng = p, log_p, rng
        self.n_items = len(p)
        self.cdf = np.cumsum(p)
        self.cdf /= self.cdf[-1]
        tail = np.cumsum(np.sort(p))[::-1]  # mass left after the j most popular items
        with np.errstate(divide="ignore"):
            self.cost = np.cumsum(1.0 / tail)  # expected draws to collect j + 1 items
        self.mask = np.zeros(n_cells, dtype=bool)
        self.slot = np.empty(n_cells, dtype=np.int64)

    def sample(self, need):
        """Return ``(local_rows, cols)`` of the chosen pairs in row-major order."""
        n_items, n_rows = self.n_items, len(need)
        need = need.copy()
        cost = np.where(need > 0, self.cost[np.maximum(need - 1, 0)], 0.0)
        heavy = np.flatnonzero(cost > n_items)
        self._top_k(heavy, need[heavy])
        need[heavy] = 0
        mass = np.zeros(n_rows)
        active = np.flatnonzero(need)
        draws = np.ceil(1.05 * cost[active]).astype(np.int64) + 1
        for _ in range(50):
            if not active.size:
                break
            users = np.repeat(active, draws)
            items = np.searchsorted(self.cdf, self.rng.random(len(users)), side="right")
            flat = users * n_items + items
            pos = np.arange(len(flat))
            self.slot[flat] = pos  # one winner per repeated cell
            new = (self.slot[flat] == pos) & ~self.mask[flat]
            seen = np.cumsum(new)
            starts = np.cumsum(draws) - draws
            rank = seen - np.repeat(seen[starts] - new[starts], draws)  # 1-based among new
            keep = new & (rank <= np.repeat(need[active], draws))
            self.mask[flat[keep]] = True
            need -= np.bincount(users[keep], minlength=n_rows)
            mass += np.bincount(users[keep], weights=self.p[items[keep]], minlength=n_rows)
            active = np.flatnonzero(need)
            room = np.clip(1.0 - mass[active], 1e-3, 1.0)
            draws = np.minimum(np.ceil(1.2 * need[active] / room), 10 * n_items).astype(np.int64)
            draws += 1
        if active.size:  # rare: finish these users exactly, from scratch
            cells = self.mask[: n_rows * n_items].reshape(n_rows, n_items)
            need[active] += cells[active].sum(axis=1)
            cells[active] = False
            self._top_k(active, need[active])
        flat = np.flatnonzero(self.mask[: n_rows * n_items])
        self.mask[flat] = False
        rows = flat // n_items
        return rows, flat - rows * n_items

    def _top_k(self, rows, k):
        """Exact weighted sampling without replacement (Gumbel top-k) for a few rows."""
        n_items = self.n_items
        batch = max(1, len(self.mask) // (4 * n_items))
        for b in range(0, len(rows), batch):
            r, kk = rows[b : b + batch], k[b : b + batch]
            keys = self.log_p + self.rng.gumbel(size=(len(r), n_items))
            order = np.argsort(-keys, axis=1)
            take = np.arange(n_items) < kk[:, None]
            self.mask[(r[:, None] * n_items + order)[take]] = True


def make_binary_ratings(
    n_users=162541,
    n_items=62423,
    density=0.002,
    *,
    n_groups=20,
    affinity=0.5,
    popularity=1.0,
    random_state=None,
    dtype=np.float64,
    chunk_size=2**23,
):
    """Generate implicit-feedback binary data with skewed activity, popularity and tastes.

    The stand-in for the Felb paper's MovieLens (its defaults: 162541 users x 62423 movies,
    ratings >= 3.5 set to 1, density 0.002 here). Each user belongs to one of ``n_groups``
    taste groups and has ``n_u`` ones, with ``n_u`` skewed as the user activity of
    :func:`make_ratings` (lognormal weights ``exp(popularity * N(0, 1))``, at least one each).
    The items are drawn without replacement from a mixture: with weight ``1 - affinity``
    the global Zipf popularity ``rank ** -popularity`` (over a random ranking of the items),
    with weight ``affinity`` the group's own Zipf ranking. The Boolean structure is thus a
    popular core shared by all plus one block of favourite items per group; ``affinity=0``
    leaves popularity only.

    Memory stays proportional to the number of ones (about ``12 bytes`` each plus the
    working ``chunk_size`` cells); the default shape has 20.3 million ones.

    Parameters
    ----------
    n_users, n_items : int, default=162541, 62423
        Shape of ``X``.
    density : float in (0, 1], default=0.002
        Share of the cells that are one: ``round(density * n_users * n_items)`` ones.
    n_groups : int, default=20
        Taste groups (users are assigned uniformly at random).
    affinity : float in [0, 1], default=0.5
        Weight of the group's own ranking in each draw.
    popularity : float, default=1.0
        Skew of user activity and item popularity (0 = uniform).
    random_state : int, RandomState, Generator or None
        Seed; the output depends on it and on ``chunk_size``.
    dtype : numpy dtype, default=np.float64
        dtype of the stored ones.
    chunk_size : int, default=2**23
        Users x items cells handled at once (bounds the working memory).

    Returns
    -------
    data : sklearn.utils.Bunch
        ``X`` (CSR of the ones, n_users x n_items) and ``groups`` (each user's taste group).

    Examples
    --------
    >>> from sklearn_fedmf.datasets import make_binary_ratings
    >>> data = make_binary_ratings(200, 100, 0.05, n_groups=4, random_state=0)
    >>> data.X.shape, data.X.nnz, set(data.X.data.tolist())
    ((200, 100), 1000, {1.0})
    """
    n_users = check_int(n_users, "n_users", 1)
    n_items = check_int(n_items, "n_items", 1)
    n_groups = check_int(n_groups, "n_groups", 1)
    chunk_size = check_int(chunk_size, "chunk_size", 1)
    if not 0 < density <= 1:
        raise ValueError(f"density must be in (0, 1], got {density!r}.")
    if not 0 <= affinity <= 1 or not popularity >= 0:
        raise ValueError(f"affinity must be in [0, 1] and popularity >= 0, got {affinity!r} "
                         f"and {popularity!r}.")
    rng = _check_generator(random_state)
    n_ones = int(round(density * n_users * n_items))

    def zipf():
        p = (rng.permutation(n_items) + 1.0) ** -popularity
        return p / p.sum()

    shared = zipf()
    w = np.exp(popularity * rng.standard_normal(n_users))
    counts = _user_counts(n_ones, w / w.sum(), n_items, rng)
    groups = rng.integers(n_groups, size=n_users)

    index_dtype = np.int32 if max(n_items, n_ones) < 2**31 else np.int64
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = np.empty(n_ones, dtype=index_dtype)
    block = max(1, chunk_size // n_items)
    for g in range(n_groups):
        p = (1.0 - affinity) * shared + affinity * zipf()
        with np.errstate(divide="ignore"):
            sampler = _PairSampler(p, np.log(p), rng, block * n_items)
        users = np.flatnonzero(groups == g)
        for start in range(0, len(users), block):
            chunk = users[start:start + block]
            rows, cols = sampler.sample(counts[chunk])
            first = np.searchsorted(rows, rows)  # rows come sorted, each row's items in a run
            indices[indptr[chunk[rows]] + np.arange(len(rows)) - first] = cols
    if index_dtype is np.int32:
        indptr = indptr.astype(np.int32)
    X = sp.csr_matrix((np.ones(n_ones, dtype=dtype), indices, indptr), shape=(n_users, n_items))
    X.sort_indices()
    return Bunch(X=X, groups=groups)


def make_binary_tiles(
    n_rows=1000,
    n_cols=500,
    n_tiles=10,
    *,
    noise=0.05,
    tile_density=0.9,
    overlap=True,
    row_frac=(0.05, 0.2),
    col_frac=(0.05, 0.2),
    random_state=None,
    dtype=np.float64,
):
    """Generate a binary matrix with planted Boolean tiles and XOR noise (the Felb paper's
    Section 4.1).

    Tile ``l`` covers rows ``R_l`` and columns ``C_l``: ``U[R_l, l] = V[l, C_l] = 1``.
    With ``overlap=True`` (the recommended generator) ``R_l`` is a random subset of
    ``ceil(n_rows * Uniform(row_frac))`` rows, and likewise for columns, so tiles may
    overlap. With ``overlap=False`` rows and columns are each split at random into
    ``n_tiles + 1`` nearly equal groups, tile ``l`` is row group ``l`` x column group ``l``
    and the last groups stay empty. The signal keeps each tile cell with probability
    ``tile_density`` (OR over tiles); then every cell is flipped with probability ``noise``
    (destructive XOR noise; 0.5 is pure noise).

    Parameters
    ----------
    n_rows, n_cols : int, default=1000, 500
        Shape of ``X``.
    n_tiles : int, default=10
        Number of tiles, the true Boolean rank k.
    noise : float in [0, 1], default=0.05
        Probability of flipping each cell.
    tile_density : float in [0, 1], default=0.9
        Probability that a tile cell is one before noise.
    overlap : bool, default=True
        Random (possibly overlapping) tiles, or disjoint tiles as described above.
    row_frac, col_frac : (float, float), default=(0.05, 0.2)
        Range of the fraction of rows / columns of a tile (``overlap=True`` only).
    random_state : int, RandomState, Generator or None
        Seed.
    dtype : numpy dtype, default=np.float64
        dtype of the sparse matrices.

    Returns
    -------
    data : sklearn.utils.Bunch
        ``X`` (CSR, only the ones stored: every cell of a binary matrix is observed),
        ``X_clean`` (the Boolean product of U and V: full tiles, the ground truth G of F1*),
        ``X_signal`` (the thinned tiles, i.e. X before the XOR noise; equals ``X_clean``
        when ``tile_density=1``), ``U`` (bool, n_rows x n_tiles) and ``V`` (bool,
        n_tiles x n_cols).

    Examples
    --------
    >>> from sklearn_fedmf.datasets import make_binary_tiles
    >>> data = make_binary_tiles(100, 40, 3, noise=0.0, tile_density=1.0, random_state=0)
    >>> bool(((data.U @ data.V) != data.X.toarray()).sum() == 0)
    True
    """
    n_rows = check_int(n_rows, "n_rows", 1)
    n_cols = check_int(n_cols, "n_cols", 1)
    k = check_int(n_tiles, "n_tiles", 1)
    for name, value in (("noise", noise), ("tile_density", tile_density)):
        if not 0 <= value <= 1:
            raise ValueError(f"{name} must be in [0, 1], got {value!r}.")
    rng = _check_generator(random_state)
    U = np.zeros((n_rows, k), dtype=bool)
    V = np.zeros((k, n_cols), dtype=bool)
    if overlap:
        for tile in range(k):
            n_r = int(np.ceil(n_rows * rng.uniform(*row_frac)))
            n_c = int(np.ceil(n_cols * rng.uniform(*col_frac)))
            U[rng.choice(n_rows, min(n_r, n_rows), replace=False), tile] = True
            V[tile, rng.choice(n_cols, min(n_c, n_cols), replace=False)] = True
    else:
        row_groups = np.array_split(rng.permutation(n_rows), k + 1)
        col_groups = np.array_split(rng.permutation(n_cols), k + 1)
        for tile in range(k):
            U[row_groups[tile], tile] = True
            V[tile, col_groups[tile]] = True

    clean, signal = [], []
    for tile in range(k):
        cells = (np.flatnonzero(U[:, tile])[:, None] * n_cols + np.flatnonzero(V[tile])).ravel()
        clean.append(cells)
        signal.append(cells[rng.random(len(cells)) < tile_density])
    clean = np.unique(np.concatenate(clean))
    signal = np.unique(np.concatenate(signal))
    flips = _bernoulli_cells(n_rows * n_cols, noise, rng)
    noisy = np.setxor1d(signal, flips, assume_unique=True)

    def to_csr(cells):
        indptr = np.searchsorted(cells, np.arange(n_rows + 1) * n_cols)
        X = sp.csr_matrix(
            (np.ones(len(cells), dtype=dtype), cells % n_cols, indptr), shape=(n_rows, n_cols)
        )
        X.has_canonical_format = True
        return X

    return Bunch(X=to_csr(noisy), X_clean=to_csr(clean), X_signal=to_csr(signal), U=U, V=V)


def _bernoulli_cells(n_cells, prob, rng):
    """Sorted indices of the cells that a Bernoulli(prob) process selects (geometric gaps)."""
    if prob == 0:
        return np.empty(0, dtype=np.int64)
    chunks, last = [], -1
    while last < n_cells - 1:
        size = int(1.05 * prob * (n_cells - last)) + 64
        cells = last + np.cumsum(rng.geometric(prob, size=size))
        chunks.append(cells[cells < n_cells])
        last = cells[-1]
    return np.concatenate(chunks)
