"""Rating sets shaped like other sites': strong biases, weak taste, heavy-tailed activity.

:func:`make_ratings` plants a low-rank taste of the same size as the rating spread, so a
factor model always helps there. Ratings of most sites are not like that: a user's mean and
an item's mean explain most of what can be explained, users rate few items (half of them
a dozen or two), a few items get most ratings, and scales differ (half stars, 0.5-4). The
presets below imitate the published statistics of such sets, so that defaults chosen on
MovieLens can be confirmed on data of other shapes.
"""

from __future__ import annotations

from numbers import Real

import numpy as np
import scipy.sparse as sp
from scipy.special import logsumexp
from sklearn.utils import Bunch

from ..engine._client_data import check_int
from ._synthetic import _check_generator, _PairSampler, _user_counts

__all__ = ["SITE_PRESETS", "make_site_ratings"]

# Shape (users, items, ratings) and scale of the real set each preset imitates; the
# spreads (standard deviations on the rating scale) and the median ratings per user are
# this generator's choices, set so that biases alone are near the best model, as the
# published results on these sets report (see make_site_ratings' notes).
SITE_PRESETS = {
    # FilmTrust (Guo, Zhang and Yorke-Smith 2013): 1,508 users, 2,071 films, 35,497
    # ratings on 0.5-4 in half stars; most users rate a dozen films.
    "filmtrust": dict(n_users=1508, n_items=2071, n_ratings=35497, rating_scale=(0.5, 4.0),
                      step=0.5, median_activity=12, user_bias=0.41, item_bias=0.35,
                      interaction=0.18, n_components=3, noise=0.76, popularity=1.1),
    # Douban movies as in Monti, Bronstein and Bresson (2017): 3,000 x 3,000, 136,891
    # ratings, 1-5 stars; biases alone are within 0.02 of the best published models.
    "douban": dict(n_users=3000, n_items=3000, n_ratings=136891, rating_scale=(1.0, 5.0),
                   step=1.0, median_activity=20, user_bias=0.42, item_bias=0.42,
                   interaction=0.18, n_components=5, noise=0.65, popularity=1.0),
    # Epinions (Massa and Avesani 2007), 40,163 x 139,738 with 664,824 ratings, 1-5 stars,
    # scaled down 8x in users, items and ratings: very sparse, extreme popularity skew,
    # item means dominate.
    "epinions": dict(n_users=5020, n_items=17467, n_ratings=83103, rating_scale=(1.0, 5.0),
                     step=1.0, median_activity=10, user_bias=0.45, item_bias=0.65,
                     interaction=0.2, n_components=5, noise=1.0, popularity=0.9),
    # MovieLens' half-star scale (0.5-5) with the Netflix prize's activity (median about
    # 100 ratings per user, 17,770 titles) at 1,000,000 ratings (4,777 users): the 1M size.
    "netflix-1m": dict(n_users=4777, n_items=17770, n_ratings=1_000_000,
                       rating_scale=(0.5, 5.0), step=0.5, median_activity=100,
                       user_bias=0.45, item_bias=0.5, interaction=0.35, n_components=10,
                       noise=0.75, popularity=1.0),
}


def make_site_ratings(preset="filmtrust", *, n_ratings=None, random_state=None,
                      **overrides):
    """Generate a rating set shaped like another site's: biases first, taste second.

    The planted model is ``mean + b_u + b_i + u . v + noise * N(0, 1)``, rounded to
    multiples of ``step`` from the low end of ``rating_scale`` and clipped to it. ``b_u``
    and ``b_i`` are Gaussian with standard deviations ``user_bias`` and ``item_bias``; the
    rank-``n_components`` part ``u . v`` has standard deviation ``interaction`` (weak in
    every preset, so that biases alone are near the best model); ``mean`` is 0.6 of the
    way up the scale, as on most sites.

    Activity is heavy-tailed: user ``u`` rates ``1 + multinomial`` items with lognormal
    weights whose spread puts the median at ``median_activity`` ratings for the mean
    ``n_ratings / n_users`` (``median ~ 1 + (mean - 1) exp(-sigma^2 / 2)``). Items are
    drawn without replacement with Zipf weights ``rank ** -popularity``; the item bias
    grows with popularity (popular items are rated higher), the correlation real sets show.

    Parameters
    ----------
    preset : {"filmtrust", "douban", "epinions", "netflix-1m"}, default="filmtrust"
        The site imitated (see ``SITE_PRESETS`` and the notes).
    n_ratings : int or None, default=None
        Scale the preset to this many ratings: users scale with it (the same activity per
        user), items with its square root. None keeps the preset's size.
    random_state : int, RandomState, Generator or None
        Seed.
    **overrides
        Any key of the preset: ``n_users``, ``n_items``, ``rating_scale``, ``step``,
        ``median_activity``, ``user_bias``, ``item_bias``, ``interaction``,
        ``n_components``, ``noise``, ``popularity``.

    Returns
    -------
    data : sklearn.utils.Bunch
        ``X`` (CSR, n_users x n_items), ``mean`` (float), ``user_bias`` (n_users,),
        ``item_bias`` (n_items,), ``user_factors`` (n_users, n_components),
        ``item_factors`` (n_items, n_components), ``expected`` (CSR with the noise-free
        planted value at each stored entry, before rounding), ``params`` (the settings used).

    Notes
    -----
    What each preset imitates (shape and scale from the sets' published statistics; the
    spreads are chosen so that a biases-only model is within a few hundredths of the best):

    * ``filmtrust``: FilmTrust's shape (1,508 x 2,071, 35,497 ratings) and its 0.5-4
      half-star scale, median 12 ratings per user;
    * ``douban``: the Douban movie subset of Monti et al. (3,000 x 3,000, 136,891 ratings,
      1-5 stars), where biases-only models are within 0.02 RMSE of the best published ones;
    * ``epinions``: Epinions scaled down 8x (5,020 x 17,467, 83,103 ratings, 1-5 stars):
      median 10 ratings per user, a steep popularity tail and strong item means;
    * ``netflix-1m``: the Netflix prize's titles and activity (17,770 items, median 100
      ratings per user) at 1,000,000 ratings, on MovieLens' 0.5-5 half-star scale.

    Examples
    --------
    >>> from sklearn_fedmf.datasets import make_site_ratings
    >>> data = make_site_ratings("filmtrust", random_state=0)
    >>> data.X.shape, data.X.nnz
    ((1508, 2071), 35497)
    >>> sorted(set(data.X.data.tolist()))[:3], float(data.X.data.max())
    ([0.5, 1.0, 1.5], 4.0)
    """
    if preset not in SITE_PRESETS:
        raise ValueError(f"preset must be one of {sorted(SITE_PRESETS)}, got {preset!r}.")
    params = dict(SITE_PRESETS[preset])
    unknown = sorted(set(overrides) - set(params))
    if unknown:
        raise TypeError(f"Unknown settings {unknown}; known: {sorted(params)}.")
    if n_ratings is not None:
        n_ratings = check_int(n_ratings, "n_ratings", 1)
        scale = n_ratings / params["n_ratings"]
        params.update(n_users=max(1, round(params["n_users"] * scale)),
                      n_items=max(1, round(params["n_items"] * np.sqrt(scale))),
                      n_ratings=n_ratings)
    params.update(overrides)
    return _generate(params, _check_generator(random_state))


def _generate(params, rng):
    """Draw the biases, the weak taste, the activity and the rated pairs of ``params``."""
    n_users = check_int(params["n_users"], "n_users", 1)
    n_items = check_int(params["n_items"], "n_items", 1)
    n_ratings = check_int(params["n_ratings"], "n_ratings", 1)
    k = check_int(params["n_components"], "n_components", 1)
    lo, hi = (float(v) for v in params["rating_scale"])
    step = params["step"]
    if not lo < hi or not (isinstance(step, Real) and step > 0):
        raise ValueError(f"rating_scale must be (low, high) with low < high and step > 0, got "
                         f"{params['rating_scale']} and {step!r}.")
    for name in ("user_bias", "item_bias", "interaction", "noise", "popularity"):
        if not params[name] >= 0:
            raise ValueError(f"{name} must be >= 0, got {params[name]!r}.")
    if n_ratings > n_users * n_items:
        raise ValueError(f"n_ratings={n_ratings} exceeds n_users * n_items = "
                         f"{n_users * n_items}.")
    mean_activity = n_ratings / n_users
    median = params["median_activity"]
    if not 1 < median <= mean_activity:
        raise ValueError(f"median_activity must be in (1, n_ratings / n_users = "
                         f"{mean_activity:.3g}], got {median!r}.")
    # lognormal weights: the median of 1 + multinomial is about 1 + (mean - 1) e^(-s^2/2)
    sigma = np.sqrt(2 * np.log((mean_activity - 1) / max(median - 1, 1e-9)))

    # items: Zipf popularity over a random ranking; popular items are liked more
    rank = rng.permutation(n_items) + 1.0
    log_p = -params["popularity"] * np.log(rank)
    log_p -= logsumexp(log_p)
    pop = (log_p - log_p.mean()) / max(log_p.std(), 1e-12)
    item_bias = params["item_bias"] * (0.3 * pop + np.sqrt(1 - 0.3**2) * rng.standard_normal(
        n_items))
    user_bias = params["user_bias"] * rng.standard_normal(n_users)
    scale = np.sqrt(params["interaction"] / np.sqrt(k))
    user_factors = rng.standard_normal((n_users, k)) * scale
    item_factors = rng.standard_normal((n_items, k)) * scale
    mean = lo + 0.6 * (hi - lo)

    w = np.exp(sigma * rng.standard_normal(n_users))
    counts = _user_counts(n_ratings, w / w.sum(), n_items, rng)
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    block = max(1, 2**23 // n_items)  # users per block: 2**23 cells at most in the sampler
    sampler = _PairSampler(np.exp(log_p), log_p, rng, block * n_items)
    indices = np.empty(n_ratings, dtype=np.int32)
    expected = np.empty(n_ratings)
    for start in range(0, n_users, block):
        stop = min(start + block, n_users)
        rows, cols = sampler.sample(counts[start:stop])
        users = rows + start
        values = mean + user_bias[users] + item_bias[cols]
        values += np.einsum("ij,ij->i", user_factors[users], item_factors[cols])
        indices[indptr[start]:indptr[stop]] = cols
        expected[indptr[start]:indptr[stop]] = values
    noisy = expected + params["noise"] * rng.standard_normal(n_ratings)
    ratings = np.clip(lo + step * np.rint((noisy - lo) / step), lo, hi)
    shape = (n_users, n_items)
    X = sp.csr_matrix((ratings, indices, indptr), shape=shape)
    X.has_canonical_format = True
    return Bunch(X=X, mean=mean, user_bias=user_bias, item_bias=item_bias,
                 user_factors=user_factors, item_factors=item_factors,
                 expected=sp.csr_matrix((expected, indices.copy(), indptr.copy()), shape=shape),
                 params=params)
