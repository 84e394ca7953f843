"""Local differential-privacy mechanisms applied by a client to an upload before sending it.

Every function is pure: noise comes only from the ``numpy.random.Generator`` passed in (the
engine hands each client a fresh one per round), and inputs are never modified in place.

What a guarantee covers
-----------------------
A mechanism protects **one release** (one upload of one client in one round) against a change
of the client's data that moves the released matrix by at most ``sensitivity``:

- ``gaussian``: ``(epsilon, delta)``-DP when the change is bounded in l2 by ``sensitivity``.
  By default ``sigma`` is the smallest that gives it (the analytic Gaussian mechanism of Balle
  and Wang 2018, :func:`analytic_gaussian_sigma`, exact for every ``epsilon``); the classical
  bound ``sigma = sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon`` (:func:`gaussian_sigma`,
  the Felb paper's) adds 30-100% more noise at ``delta = 1e-5`` (2-35 times as much at
  ``delta = 0.05``) and is proven only for ``epsilon < 1``;
- ``laplace``: ``(epsilon, 0)``-DP for an l1 change of at most ``sensitivity``
  (``scale = sensitivity / epsilon``);
- ``bernoulli``: randomized response, ``epsilon``-DP **per bit** of a 0/1 matrix
  (flip probability ``1 / (1 + e^epsilon)``).

What it does not cover
----------------------
- **Without clipping there is no formal bound**: nothing limits how far one row of a client's
  data moves a factor, so the nominal sensitivity (1 for a relaxed entry in [0, 1]) is a
  calibration, not a proof. :func:`check_privacy` warns about it.
- With ``sensitivity="entry"`` the noise is calibrated per entry: the guarantee holds for a
  neighbour that changes one entry of the upload, not the whole matrix. ``"matrix"`` calibrates
  to the whole ``shape`` (``theta * sqrt(size)`` in l2, ``theta * size`` in l1).
- **Composition**: a client releasing ``T`` uploads spends at most ``(T * epsilon, T * delta)``
  (basic composition, :func:`compose_basic`); the accountants of
  :mod:`sklearn_fedmf.privacy` (:func:`epsilon_spent`) give the far tighter figure that the
  estimators report in ``privacy_spent_``.
- The server's aggregate and everything computed from it are post-processing, hence covered.

Examples
--------
>>> import numpy as np
>>> from sklearn_fedmf.privacy import clip_entries, laplace_noise, laplace_epsilon
>>> rng = np.random.default_rng(0)
>>> V = np.array([[0.1, -0.5, 0.3]])
>>> W = laplace_noise(clip_entries(V, 0.2), scale=0.04, rng=rng)  # RFRec's upload
>>> W.shape, round(laplace_epsilon(0.04, sensitivity=2 * 0.2), 6)   # range of [-d, d] is 2d
((1, 3), 10.0)
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtr

from .._docstrings import Substitution
from ..exceptions import PrivacyWarning

# (the public names are listed once, in the package's ``__all__``)
MECHANISMS = ("gaussian", "laplace", "bernoulli")
CALIBRATIONS = ("analytic", "classical")


def _check_epsilon(epsilon):
    if not isinstance(epsilon, numbers.Real) or not epsilon > 0 or not math.isfinite(epsilon):
        raise ValueError(
            f"epsilon must be a finite number > 0, got {epsilon!r} (epsilon = 0 would need "
            "infinite noise)."
        )
    return float(epsilon)


def _check_positive(value, name):
    if not isinstance(value, numbers.Real) or not value > 0 or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
    return float(value)


def _check_delta(delta):
    if not isinstance(delta, numbers.Real) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1) for the Gaussian mechanism, got {delta!r}.")
    return float(delta)


# laplace_scale and laplace_epsilon are inverses: one example shows both
_LAPLACE_EXAMPLE = Substitution(laplace_example=(
    ">>> from sklearn_fedmf.privacy import laplace_epsilon, laplace_scale\n"
    ">>> laplace_scale(0.5, sensitivity=0.4)\n"
    "0.8\n"
    ">>> laplace_epsilon(0.8, sensitivity=0.4)\n"
    "0.5"))


# ---- noise-scale formulas ------------------------------------------------------------------
def gaussian_sigma(epsilon, delta, sensitivity=1.0):
    """Standard deviation of the classical Gaussian mechanism.

    ``sigma = sensitivity * sqrt(2 ln(1.25 / delta)) / epsilon`` (Dwork & Roth, Thm. A.1);
    the Felb paper writes ``ln(5 / (4 delta))``, the same number, and calls sigma a "variance".

    Parameters
    ----------
    epsilon : float > 0
        Privacy budget of one release (the bound is proven for ``epsilon < 1``).
    delta : float in (0, 1)
        Probability with which the epsilon bound may fail.
    sensitivity : float > 0, default=1.0
        l2 sensitivity of the released quantity.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import gaussian_sigma
    >>> round(gaussian_sigma(1.0, 0.05), 4)
    2.5373
    """
    epsilon = _check_epsilon(epsilon)
    _check_delta(delta)
    sensitivity = _check_positive(sensitivity, "sensitivity")
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def gaussian_delta(epsilon, sigma, sensitivity=1.0):
    """The exact ``delta`` of one Gaussian release at ``epsilon`` (Balle & Wang 2018, Thm. 8).

    ``delta = Phi(D / (2 s) - epsilon s / D) - e^epsilon Phi(-D / (2 s) - epsilon s / D)`` for
    noise ``s = sigma`` and l2 sensitivity ``D``: the smallest ``delta`` for which the release
    is ``(epsilon, delta)``-DP. Every accountant must agree with it on one release.

    Parameters
    ----------
    epsilon : float >= 0
        The epsilon at which ``delta`` is wanted.
    sigma : float > 0
        Standard deviation of the noise.
    sensitivity : float > 0, default=1.0
        l2 sensitivity of the release.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import gaussian_delta
    >>> f"{gaussian_delta(0.5, 7.03):.2e}"
    '1.00e-05'
    """
    if not isinstance(epsilon, numbers.Real) or not epsilon >= 0 or not math.isfinite(epsilon):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}.")
    a = _check_positive(sensitivity, "sensitivity") / _check_positive(sigma, "sigma")
    b = epsilon / a
    # e^eps Phi(.) in log space: it is a product of a huge and a tiny number for large eps
    return float(max(ndtr(a / 2 - b) - math.exp(epsilon + log_ndtr(-a / 2 - b)), 0.0))


def gaussian_epsilon(sigma, delta, sensitivity=1.0):
    """The smallest ``epsilon`` of one Gaussian release at ``delta`` (inverse of
    :func:`gaussian_delta`; 0 when even ``epsilon = 0`` meets ``delta``).

    Parameters
    ----------
    sigma : float > 0
        Standard deviation of the noise.
    delta : float in (0, 1)
        The delta at which epsilon is wanted.
    sensitivity : float > 0, default=1.0
        l2 sensitivity of the release.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import gaussian_epsilon
    >>> round(gaussian_epsilon(9.69, 1e-5), 3)  # the classical sigma for (0.5, 1e-5)
    0.353
    """
    _check_delta(delta)
    if gaussian_delta(0.0, sigma, sensitivity) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_delta(hi, sigma, sensitivity) > delta:
        hi *= 2.0
    return float(brentq(lambda e: gaussian_delta(e, sigma, sensitivity) - delta, 0.0, hi,
                        xtol=1e-13, rtol=1e-12))


def analytic_gaussian_sigma(epsilon, delta, sensitivity=1.0):
    """The smallest Gaussian ``sigma`` that makes one release ``(epsilon, delta)``-DP.

    The analytic Gaussian mechanism (Balle & Wang 2018, Alg. 1): solves
    :func:`gaussian_delta` ``= delta`` for ``sigma``. Valid for every ``epsilon > 0``, and
    below the classical :func:`gaussian_sigma` everywhere (7.03 instead of 9.69 for
    ``(0.5, 1e-5)``).

    Parameters
    ----------
    epsilon : float > 0
        Budget of the release.
    delta : float in (0, 1)
        Its delta.
    sensitivity : float > 0, default=1.0
        l2 sensitivity of the release.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import analytic_gaussian_sigma
    >>> round(analytic_gaussian_sigma(0.5, 1e-5), 2)
    7.03
    """
    epsilon = _check_epsilon(epsilon)
    _check_delta(delta)
    sensitivity = _check_positive(sensitivity, "sensitivity")
    lo, hi = 1.0, 1.0  # delta(sigma) falls as sigma grows: bracket in log space
    while gaussian_delta(epsilon, lo) < delta:
        lo /= 2.0
    while gaussian_delta(epsilon, hi) > delta:
        hi *= 2.0
    z = brentq(lambda s: math.log(gaussian_delta(epsilon, s) or 1e-300) - math.log(delta),
               lo, hi, xtol=1e-14, rtol=1e-12)
    # the root is met to 1e-12; the step up keeps delta(sigma) <= delta on the safe side
    return float(sensitivity * z * (1 + 1e-10))


@_LAPLACE_EXAMPLE
def laplace_scale(epsilon, sensitivity=1.0):
    """Scale ``b = sensitivity / epsilon`` of the Laplace mechanism (l1 sensitivity).

    The density is ``exp(-|x| / b) / (2 b)``; the variance is ``2 b^2``.

    Parameters
    ----------
    epsilon : float > 0
        Privacy budget of one release.
    sensitivity : float > 0, default=1.0
        l1 sensitivity of the released quantity.

    Examples
    --------
    %(laplace_example)s
    """
    return _check_positive(sensitivity, "sensitivity") / _check_epsilon(epsilon)


@_LAPLACE_EXAMPLE
def laplace_epsilon(scale, sensitivity=1.0):
    """The epsilon that Laplace noise of ``scale`` buys for an l1 ``sensitivity``.

    The inverse of :func:`laplace_scale`; e.g. RFRec clips entries to ``[-d, d]`` (range, hence
    per-entry sensitivity, ``2 d``) and reports ``epsilon = 2 d / s``.

    Parameters
    ----------
    scale : float > 0
        Scale ``b`` of the Laplace noise added to each entry.
    sensitivity : float > 0, default=1.0
        l1 sensitivity of the released quantity.

    Examples
    --------
    %(laplace_example)s
    """
    return _check_positive(sensitivity, "sensitivity") / _check_positive(scale, "scale")


def flip_probability(epsilon):
    """Randomized-response flip probability ``1 / (1 + e^epsilon)`` (epsilon-DP per bit).

    Parameters
    ----------
    epsilon : float > 0
        Privacy budget of one released bit.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import flip_probability
    >>> round(flip_probability(1.0), 6)
    0.268941
    """
    epsilon = _check_epsilon(epsilon)
    return 1.0 / (1.0 + math.exp(epsilon)) if epsilon < 700 else 0.0


def sensitivity_of(mechanism, clip=None, shape=None, kind="entry"):
    """The sensitivity ``Delta`` used to calibrate ``mechanism``.

    Parameters
    ----------
    mechanism : {"gaussian", "laplace", "bernoulli"}
        The noise mechanism: its norm (l2 for Gaussian, l1 for Laplace) sets the sensitivity.
    clip : float or None
        Entrywise clipping threshold ``theta``; None means no clipping (nominal range 1).
    shape : tuple of int, optional
        Shape of the released matrix; needed for ``kind="matrix"``.
    kind : {"entry", "matrix"} or float
        ``"entry"``: ``theta`` (1.0 unclipped), one entry of the upload changes.
        ``"matrix"``: every entry may change by ``theta``: ``theta * sqrt(size)`` in l2
        (Gaussian), ``theta * size`` in l1 (Laplace). A float is used as is.
        Randomized response has no sensitivity (it works per bit): 1.0 is returned.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import sensitivity_of
    >>> sensitivity_of("gaussian", clip=0.5, shape=(4, 25), kind="matrix")  # 0.5 * sqrt(100)
    5.0
    >>> sensitivity_of("laplace", clip=0.5, shape=(4, 25), kind="matrix")   # 0.5 * 100
    50.0
    """
    if not isinstance(kind, str):
        return _check_positive(kind, "sensitivity")
    if mechanism == "bernoulli":
        return 1.0
    theta = 1.0 if clip is None else _check_positive(clip, "clip")
    if kind == "entry":
        return theta
    if kind != "matrix":
        raise ValueError(f"sensitivity must be 'entry', 'matrix' or a number, got {kind!r}.")
    if shape is None:
        raise ValueError("sensitivity='matrix' needs the shape of the released matrix.")
    size = math.prod(shape)
    return theta * (math.sqrt(size) if mechanism == "gaussian" else size)


def noise_scale(mechanism, epsilon, delta=None, sensitivity=1.0, calibration="analytic"):
    """Gaussian ``sigma``, Laplace ``b`` or randomized-response flip probability of one
    ``(epsilon, delta)`` release.

    Parameters
    ----------
    mechanism : {"gaussian", "laplace", "bernoulli"}
        Which of the Gaussian formulas, :func:`laplace_scale` and :func:`flip_probability`
        to apply.
    epsilon : float > 0
        Privacy budget of one release.
    delta : float in (0, 1) or None, default=None
        Only for ``"gaussian"``.
    sensitivity : float > 0, default=1.0
        Sensitivity of the release (ignored by ``"bernoulli"``).
    calibration : {"analytic", "classical"}, default="analytic"
        The Gaussian formula: :func:`analytic_gaussian_sigma` or the classical
        :func:`gaussian_sigma`.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import noise_scale
    >>> noise_scale("laplace", 0.5, sensitivity=0.4)
    0.8
    """
    if mechanism == "gaussian":
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}.")
        if calibration == "analytic":
            return analytic_gaussian_sigma(epsilon, delta, sensitivity)
        return gaussian_sigma(epsilon, delta, sensitivity)
    if mechanism == "laplace":
        return laplace_scale(epsilon, sensitivity)
    if mechanism == "bernoulli":
        return flip_probability(epsilon)
    raise ValueError(f"Unknown mechanism {mechanism!r}; expected one of {MECHANISMS}.")


def compose_basic(epsilon, delta, n_releases):
    """Basic sequential composition: ``n_releases`` releases cost ``(n eps, n delta)``.

    Parameters
    ----------
    epsilon : float
        Budget of one release.
    delta : float or None
        Failure probability of one release (None counts as 0).
    n_releases : int
        Number of releases, e.g. the rounds in which a client uploaded.

    Returns
    -------
    epsilon_total, delta_total : float

    Examples
    --------
    >>> from sklearn_fedmf.privacy import compose_basic
    >>> compose_basic(0.5, 1e-5, 20)
    (10.0, 0.0002)
    """
    n = int(n_releases)
    return n * float(epsilon), n * float(delta or 0.0)


# ---- mechanisms ----------------------------------------------------------------------------
def clip_entries(X, threshold):
    """Clamp every entry to ``[-threshold, threshold]`` (a new array).

    Parameters
    ----------
    X : array-like
        The values to clip (not modified).
    threshold : float > 0
        The largest magnitude kept.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import clip_entries
    >>> clip_entries([[0.1, -0.5, 0.3]], 0.2).tolist()
    [[0.1, -0.2, 0.2]]
    """
    threshold = _check_positive(threshold, "clip threshold")
    return np.clip(np.asarray(X, dtype=float), -threshold, threshold)


# the two additive mechanisms differ only in the law of the noise: one docstring, one example
_ADDITIVE_NOISE_DOC = """``X + N`` with ``N`` i.i.d. ``{law}`` per entry (a new array).

    Parameters
    ----------
    X : array-like
        The values to release (not modified).
    {scale} : float >= 0
        {scale_doc}
    rng : numpy.random.Generator
        The only source of randomness.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.privacy import gaussian_noise, laplace_noise
    >>> rng = np.random.default_rng(0)
    >>> G = gaussian_noise(np.zeros((200, 50)), 2.0, rng)  # variance sigma^2 = 4
    >>> L = laplace_noise(np.zeros((200, 50)), 1.0, rng)   # variance 2 b^2 = 2
    >>> G.shape, bool(abs(G.var() - 4.0) < 0.2), bool(abs(L.var() - 2.0) < 0.1)
    ((200, 50), True, True)
    """


def _additive_noise_doc(law, scale, scale_doc):
    """Give the decorated mechanism ``_ADDITIVE_NOISE_DOC`` for its law and scale."""
    def decorate(func):
        func.__doc__ = _ADDITIVE_NOISE_DOC.format(law=law, scale=scale, scale_doc=scale_doc)
        return func
    return decorate


@_additive_noise_doc("Normal(0, sigma^2)", "sigma",
                     "Standard deviation of the noise, e.g. from :func:`gaussian_sigma`.")
def gaussian_noise(X, sigma, rng):
    X = np.asarray(X, dtype=float)
    return X + rng.normal(0.0, sigma, size=X.shape)


@_additive_noise_doc("Laplace(0, scale)", "scale",
                     "Scale ``b`` of the noise, e.g. from :func:`laplace_scale` "
                     "(variance ``2 b^2``).")
def laplace_noise(X, scale, rng):
    X = np.asarray(X, dtype=float)
    return X + rng.laplace(0.0, scale, size=X.shape)


def mean_laplace_noise(n, scale, shape, rng):
    """The mean of ``n`` i.i.d. ``Laplace(0, scale)`` arrays of ``shape``, exactly, at
    O(size) cost: a server that averages ``n`` noised uploads receives this noise.

    A Laplace variable is ``scale * (E1 - E2)`` with ``E1, E2 ~ Exp(1)``, so a sum of ``n``
    is ``Gamma(n, scale) - Gamma(n, scale)``.

    Parameters
    ----------
    n : int >= 1
        Number of averaged uploads.
    scale : float > 0
        Laplace scale of each upload's noise.
    shape : tuple of int
        Shape of the uploads.
    rng : numpy.random.Generator
        The server's generator.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.privacy import mean_laplace_noise
    >>> noise = mean_laplace_noise(100, 0.5, (1000, 100), np.random.default_rng(0))
    >>> round(float(noise.var() / (2 * 0.5**2 / 100)), 1)  # variance 2 s^2 / n
    1.0
    """
    return (rng.gamma(n, scale, shape) - rng.gamma(n, scale, shape)) / n


def randomized_response(X, p, rng):
    """Flip each entry with probability ``p``: ``x -> 1 - x`` (XOR on 0/1 entries).

    On real values in [0, 1] a flipped entry becomes ``1 - x``, i.e. ``X + B * (1 - 2X)``.

    Parameters
    ----------
    X : array-like
        0/1 (or [0, 1]) values to release (not modified).
    p : float in [0, 1]
        Flip probability, e.g. from :func:`flip_probability`.
    rng : numpy.random.Generator
        The only source of randomness.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.privacy import randomized_response
    >>> rng = np.random.default_rng(0)
    >>> randomized_response([[0, 1, 1]], 0.0, rng).tolist()  # never flipped
    [[0.0, 1.0, 1.0]]
    >>> randomized_response([[0, 1, 1]], 1.0, rng).tolist()  # always flipped
    [[1.0, 0.0, 0.0]]
    """
    if not 0 <= p <= 1:
        raise ValueError(f"The flip probability must be in [0, 1], got {p!r}.")
    X = np.asarray(X, dtype=float)
    flips = rng.random(X.shape) < p
    return np.where(flips, 1.0 - X, X)


def check_privacy(mechanism, epsilon, delta=None, clip=None, sensitivity="entry",
                  calibration="analytic"):
    """Validate a privacy setting once per fit and warn where the guarantee is weak.

    Returns ``None`` when ``mechanism`` is None. Raises ValueError on invalid parameters;
    emits :class:`PrivacyWarning` for the classical Gaussian calibration with ``epsilon >= 1``
    (outside its proven range) and for unclipped Gaussian/Laplace noise (no formal bound).

    Parameters
    ----------
    mechanism : {"gaussian", "laplace", "bernoulli"} or None
        The noise mechanism; None means no privacy.
    epsilon : float > 0
        Per-release budget.
    delta : float in (0, 1) or None, default=None
        Required by ``"gaussian"``.
    clip : float > 0 or None, default=None
        Entrywise clipping threshold; None leaves the sensitivity unbounded.
    sensitivity : {"entry", "matrix"} or float, default="entry"
        See :func:`sensitivity_of`; a number is taken as a proven bound (no warning).
    calibration : {"analytic", "classical"}, default="analytic"
        The Gaussian formula (see :func:`noise_scale`).

    Returns
    -------
    mechanism : str or None
        The validated mechanism.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import check_privacy
    >>> check_privacy("laplace", epsilon=0.5, clip=1.0)
    'laplace'
    """
    if mechanism is None:
        return None
    if mechanism not in MECHANISMS:
        raise ValueError(f"Unknown privacy mechanism {mechanism!r}; expected one of {MECHANISMS}.")
    _check_epsilon(epsilon)
    if mechanism == "gaussian":
        noise_scale(mechanism, epsilon, delta, calibration=calibration)
        if epsilon >= 1 and calibration == "classical":
            warnings.warn(
                f"The classical Gaussian mechanism bound is proven for epsilon < 1; with "
                f"epsilon={epsilon} the (epsilon, delta) guarantee is nominal; "
                "calibration='analytic' is exact for every epsilon.",
                PrivacyWarning, stacklevel=3,
            )
    if clip is not None:
        _check_positive(clip, "clip")
    warn_unless_bounded(mechanism, clip, sensitivity, stacklevel=4)
    return mechanism


def is_bounded(mechanism, clip, sensitivity):
    """Whether a release of ``mechanism`` has a proven sensitivity: randomized response works
    per bit; otherwise the upload is clipped or its sensitivity is given as a number."""
    return mechanism == "bernoulli" or clip is not None or isinstance(sensitivity, numbers.Real)


def warn_unless_bounded(mechanism, clip, sensitivity, stacklevel=3):
    """:func:`is_bounded`, and a :class:`PrivacyWarning` when it is not."""
    if is_bounded(mechanism, clip, sensitivity):
        return True
    warnings.warn(
        f"{mechanism} noise without clipping: nothing bounds how much one row changes the "
        "upload, so the noise is calibrated to a nominal sensitivity and gives no formal "
        "guarantee. Set clip to bound it.",
        PrivacyWarning, stacklevel=stacklevel,
    )
    return False


def privatize(X, rng, *, mechanism, epsilon=None, delta=None, clip=None, sensitivity="entry",
              calibration="analytic", scale=None):
    """Clip (optionally) then noise one upload; the result never shares memory with ``X``.

    Parameters
    ----------
    X : ndarray
        The matrix a client is about to send.
    rng : numpy.random.Generator
        The client's generator for this round.
    mechanism : {"gaussian", "laplace", "bernoulli"} or None
        None returns a copy of ``X`` unchanged.
    epsilon, delta : float
        Per-release budget (``delta`` only for ``"gaussian"``).
    clip : float or None
        Entrywise clipping threshold ``theta`` applied before the noise (Gaussian, Laplace).
    sensitivity : {"entry", "matrix"} or float
        See :func:`sensitivity_of`.
    calibration : {"analytic", "classical"}, default="analytic"
        Gaussian ``sigma`` of the ``(epsilon, delta)`` release (see :func:`noise_scale`).
    scale : float, optional
        The noise itself (Gaussian ``sigma``, Laplace ``b`` or flip probability), e.g. from
        :func:`calibrate_noise`; ``epsilon``, ``delta`` and ``sensitivity`` are then unused.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.privacy import privatize
    >>> V = np.full((2, 3), 0.7)
    >>> W = privatize(V, np.random.default_rng(0), mechanism="gaussian", epsilon=0.5,
    ...               delta=0.05, clip=1.5)
    >>> W.shape, bool(np.shares_memory(W, V))
    ((2, 3), False)
    """
    X = np.asarray(X, dtype=float)
    if mechanism is None:
        return X.copy(order="K")  # (keeps a Fortran-ordered upload in its layout)
    if mechanism == "bernoulli":
        return randomized_response(X, flip_probability(epsilon) if scale is None else scale, rng)
    if clip is not None:
        X = clip_entries(X, clip)
    if scale is None:
        delta_s = sensitivity_of(mechanism, clip, X.shape, sensitivity)
        scale = noise_scale(mechanism, epsilon, delta, delta_s, calibration)
    if mechanism == "gaussian":
        return gaussian_noise(X, scale, rng)
    return laplace_noise(X, scale, rng)


# ---- distributed DP: the discrete Gaussian sampler ------------------------------------
def discrete_gaussian(rng, sigma, size):
    """``size`` draws of the discrete Gaussian ``N_Z(0, sigma^2)`` (int64).

    Canonne, Kamath and Steinke's rejection sampler (2020, Algorithm 3), vectorized: a
    discrete Laplace of scale ``t = floor(sigma) + 1`` (the difference of two geometric
    draws), kept with probability ``exp(-(|y| - sigma^2 / t)^2 / (2 sigma^2))``. The
    Bernoulli trials use float64 probabilities (exact sampling would use rationals).

    Parameters
    ----------
    rng : numpy.random.Generator
        The draws' generator.
    sigma : float > 0
        The parameter (about the standard deviation for ``sigma >= 1``).
    size : int
        Number of draws.

    Returns
    -------
    draws : ndarray of int64, shape (size,)

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.privacy import discrete_gaussian
    >>> z = discrete_gaussian(np.random.default_rng(0), 3.0, 20000)
    >>> z.dtype, bool(abs(z.var() / 9.0 - 1) < 0.05)
    (dtype('int64'), True)
    """
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}.")
    out = np.empty(size, dtype=np.int64)
    todo = np.arange(size)
    t = math.floor(sigma) + 1
    p = -math.expm1(-1.0 / t)
    while todo.size:
        m = todo.size
        y = rng.geometric(p, m) - rng.geometric(p, m)  # (both count trials: the 1s cancel)
        keep = rng.random(m) < np.exp(-np.square(np.abs(y) - sigma * sigma / t)
                                      / (2 * sigma * sigma))
        out[todo[keep]] = y[keep]
        todo = todo[~keep]
    return out


# ---- distributed DP: its accounting ------------------------------------------------
def ddg_rho(sensitivity, sigma_client, n_clients, dim):
    """The zCDP ``rho`` of a sum of ``n_clients`` discrete Gaussians ``N_Z(0, sigma_client^2)``
    over integer vectors of ``dim`` entries moved by at most ``sensitivity`` in L2 (Kairouz,
    Liu and Steinke 2021, Theorem 3): ``Delta^2 / (2 n sigma_c^2) + tau dim / 4``.

    Parameters
    ----------
    sensitivity : float
        L2 bound of the change of the integer sum between neighbours.
    sigma_client : float
        Each client's discrete Gaussian parameter.
    n_clients : int
        Clients in the sum.
    dim : int
        Entries of the vector.

    Returns
    -------
    rho : float

    Examples
    --------
    >>> from sklearn_fedmf.privacy import ddg_rho
    >>> ddg_rho(10.0, 10.0, 4, 100) == 10.0**2 / (2 * 4 * 10.0**2)  # tau underflows
    True
    """
    k = np.arange(1, max(int(n_clients), 1))
    tau = 10.0 * float(np.sum(np.exp(-2 * math.pi**2 * sigma_client**2 * k / (k + 1))))
    return sensitivity**2 / (2 * n_clients * sigma_client**2) + tau * dim / 4
