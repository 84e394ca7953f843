"""Privacy accounting over a whole fit: what a client's releases cost, and the noise a budget needs.

A client that releases ``T`` noised uploads spends, by basic composition, ``T`` times the
budget of one release. The privacy-loss-distribution (PLD) and Renyi (RDP) accountants of
Google's ``dp-accounting`` (the ``privacy`` extra: ``pip install "sklearn_fedmf[privacy]"``)
give the tight figure: for Gaussian noise of multiplier 9.69 at ``delta = 1e-5``, 100 releases
cost 4.54 (PLD) or 4.90 (RDP) instead of 50. Without the extra, basic composition is used
and a :class:`~sklearn_fedmf.exceptions.PrivacyWarning` says so once per fit.

Mechanisms are described by their **noise multiplier**: Gaussian ``sigma / sensitivity``
(l2), Laplace ``b / sensitivity`` (l1), or the randomized-response flip probability ``p``
(in (0, 1/2]; larger is more private, like the other two).

What is accounted
-----------------
Local differential privacy **against the server**, one client at a time: each upload of the
client is one release, and the client's cost is the composition of the releases it actually
made (a client sampled in 10 of 100 rounds made 10). No amplification by subsampling is
claimed: the server that samples the clients is the adversary, and it knows who was sampled.
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from .._docstrings import Substitution
from ..exceptions import PrivacyWarning
from ._mechanisms import (
    MECHANISMS,
    analytic_gaussian_sigma,
    flip_probability,
    gaussian_epsilon,
)

__all__ = ["ACCOUNTANTS", "basic_epsilon", "calibrate_noise", "epsilon_spent",
           "privacy_spent", "resolve_accountant"]

ACCOUNTANTS = ("pld", "rdp")
# Releases above this epsilon each (odds of e^50) protect nothing; accountants gain nothing
# over basic composition there, and a PLD grid over such a privacy loss does not fit in memory.
_HOPELESS = 50.0
EXTRA = 'pip install "sklearn_fedmf[privacy]"'
# the releases the accountants compose, described once
_RELEASES = Substitution(releases=(
    'mechanism : {"gaussian", "laplace", "bernoulli"}\n'
    "    The mechanism of every release.\n"
    "noise_multiplier : float\n"
    "    Gaussian ``sigma / sensitivity``, Laplace ``b / sensitivity``, or the flip probability.\n"
    "n_releases : int >= 0\n"
    "    Number of releases."))


def _dp_accounting():
    """The ``dp_accounting`` package with its ``pld``, ``rdp`` and ``mechanism_calibration``
    modules, or None when the ``privacy`` extra is not installed."""
    try:
        import dp_accounting
        from dp_accounting import mechanism_calibration, pld, rdp  # noqa: F401
    except ImportError:
        return None
    return dp_accounting


def _require_dp_accounting(accountant):
    dpa = _dp_accounting()
    if dpa is None:
        raise ImportError(f"The {accountant} accountant needs dp-accounting: {EXTRA}.")
    return dpa


def _check_accountant(accountant):
    if accountant not in ACCOUNTANTS + ("basic",):
        raise ValueError(f"accountant must be one of {ACCOUNTANTS + ('basic',)}, got "
                         f"{accountant!r}.")


def resolve_accountant(accountant, mechanism):
    """The accountant a fit uses: ``accountant``, or ``"basic"`` (with a
    :class:`~sklearn_fedmf.exceptions.PrivacyWarning` naming the extra) when ``dp-accounting``
    is not installed. None when ``mechanism`` is None.

    Parameters
    ----------
    accountant : {"pld", "rdp"}
        The accountant asked for.
    mechanism : {"gaussian", "laplace", "bernoulli"} or None
        The mechanism of the fit (None: no noise).

    Examples
    --------
    >>> from sklearn_fedmf.privacy import resolve_accountant
    >>> resolve_accountant("rdp", None) is None  # no noise, nothing to account
    True
    """
    if mechanism is None:
        return None
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}, got {accountant!r}.")
    if _dp_accounting() is None:
        warnings.warn(
            f"dp-accounting is not installed: privacy_spent_ and target_epsilon use basic "
            f"composition (T releases cost T times one), which overstates the budget up to "
            f"tenfold over 100 rounds. Install the privacy extra ({EXTRA}) for the "
            f"{accountant.upper()} accountant.", PrivacyWarning, stacklevel=3,
        )
        return "basic"
    return accountant


def _check(mechanism, noise_multiplier, n_releases, delta):
    if mechanism not in MECHANISMS:
        raise ValueError(f"Unknown mechanism {mechanism!r}; expected one of {MECHANISMS}.")
    if not isinstance(noise_multiplier, numbers.Real) or not noise_multiplier > 0 or not (
            math.isfinite(noise_multiplier)):
        raise ValueError(f"The noise multiplier must be a finite number > 0, got "
                         f"{noise_multiplier!r}.")
    if mechanism == "bernoulli" and noise_multiplier > 0.5:
        raise ValueError(f"A flip probability above 1/2 is not a randomized response that "
                         f"protects anything more; got {noise_multiplier!r}.")
    if not isinstance(n_releases, numbers.Integral) or n_releases < 0:
        raise ValueError(f"n_releases must be an integer >= 0, got {n_releases!r}.")
    if not isinstance(delta, numbers.Real) or not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}.")
    if mechanism == "gaussian" and delta == 0 and n_releases:
        raise ValueError("Gaussian noise gives no guarantee at delta = 0; use delta > 0.")


@_RELEASES
def basic_epsilon(mechanism, noise_multiplier, n_releases, delta):
    """Basic composition: ``n_releases`` times the exact epsilon of one release.

    Gaussian: each release gets ``delta / n_releases`` (so the total is ``delta``) and its
    exact epsilon (:func:`~sklearn_fedmf.privacy.gaussian_epsilon`); Laplace and randomized
    response are pure: ``n / multiplier`` and ``n ln((1 - p) / p)``, at any ``delta``.

    Parameters
    ----------
    %(releases)s
    delta : float in [0, 1)
        Total delta (Gaussian); ignored by the pure mechanisms.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import basic_epsilon
    >>> round(basic_epsilon("laplace", 10.0, 100, 1e-5), 6)  # 100 releases of epsilon 0.1
    10.0
    """
    _check(mechanism, noise_multiplier, n_releases, delta)
    n = int(n_releases)
    if n == 0:
        return 0.0
    if mechanism == "gaussian":
        return n * gaussian_epsilon(noise_multiplier, delta / n)
    if mechanism == "laplace":
        return n / noise_multiplier
    if noise_multiplier == 0.5:
        return 0.0
    return n * math.log((1 - noise_multiplier) / noise_multiplier)


def _event(dpa, mechanism, noise_multiplier, n, accountant):
    """One ``DpEvent`` for ``n`` releases."""
    if mechanism == "gaussian":
        # n Gaussian releases of the same sensitivity are exactly one of multiplier z / sqrt(n)
        # (project the n-dimensional pair of Gaussians on the shift)
        return dpa.GaussianDpEvent(noise_multiplier / math.sqrt(n))
    if mechanism == "laplace":
        return dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(noise_multiplier), n)
    # RR over 2 buckets answers at random with probability q = 2 p. dp-accounting 0.6.0's PLD
    # accountant ignores the count of a SelfComposedDpEvent around a RandomizedResponseDpEvent
    # (100 compositions report the epsilon of one), so the releases are composed one by one.
    rr = dpa.RandomizedResponseDpEvent(2 * noise_multiplier, 2)
    return dpa.ComposedDpEvent([rr] * n) if accountant == "pld" else (
        dpa.SelfComposedDpEvent(rr, n))


def _accountant(dpa, accountant, mechanism, noise_multiplier=1.0, n=1):
    # Our multipliers are normalized by the largest change of one upload between neighbours,
    # i.e. dp-accounting's add/remove convention (its replace-one Gaussian doubles the shift);
    # randomized response is defined for a replaced bit, the only relation it supports.
    relation = (dpa.NeighboringRelation.REPLACE_ONE if mechanism == "bernoulli"
                else dpa.NeighboringRelation.ADD_OR_REMOVE_ONE)
    if accountant == "pld":
        # the PLD is a grid over the range of the privacy loss (``[-eps, eps]`` per Laplace
        # release, about ``1/(2 z^2) + 10/z`` for a Gaussian): 1e-4 (the default) until
        # the grid would pass 1e6 points, as it does for releases of epsilon above 100,
        # then 1e-6 of the range (the PLD rounds pessimistically; the error stays < 0.1%).
        if mechanism == "laplace":
            loss_range = n / noise_multiplier
        elif mechanism == "gaussian":
            z = noise_multiplier / math.sqrt(n)
            loss_range = 1 / (2 * z * z) + 10 / z
        else:
            loss_range = 0.0
        return dpa.pld.PLDAccountant(relation, value_discretization_interval=max(
            1e-4, 1e-6 * loss_range))
    return dpa.rdp.RdpAccountant(neighboring_relation=relation)


@_RELEASES
def epsilon_spent(mechanism, noise_multiplier, n_releases, delta, accountant="pld"):
    """The epsilon at ``delta`` of ``n_releases`` releases of one mechanism.

    Gaussian releases under ``"pld"`` are composed exactly: ``n`` releases of multiplier
    ``z`` have the privacy loss distribution of one release of ``z / sqrt(n)``, whose
    epsilon is :func:`~sklearn_fedmf.privacy.gaussian_epsilon` (dp-accounting's PLD grid
    agrees to 0.1%, slower). Laplace and randomized response use dp-accounting.

    Parameters
    ----------
    %(releases)s
    delta : float in [0, 1)
        At ``delta = 0`` the pure mechanisms compose exactly by basic composition, and so do
        releases of epsilon above 50 each (where accountants gain nothing).
    accountant : {"pld", "rdp", "basic"}, default="pld"
        ``dp-accounting``'s privacy-loss-distribution or Renyi accountant (the ``privacy``
        extra), or :func:`basic_epsilon`.

    Returns
    -------
    epsilon : float

    Examples
    --------
    >>> from sklearn_fedmf.privacy import epsilon_spent
    >>> round(epsilon_spent("laplace", 10.0, 100, 1e-5, accountant="basic"), 6)
    10.0
    """
    _check(mechanism, noise_multiplier, n_releases, delta)
    basic = basic_epsilon(mechanism, noise_multiplier, n_releases, delta)
    _check_accountant(accountant)
    if (accountant == "basic" or n_releases == 0 or (delta == 0 and mechanism != "gaussian")
            or basic > _HOPELESS * n_releases):
        return basic
    if mechanism == "gaussian" and accountant == "pld":
        # the privacy loss distribution of a Gaussian is known exactly: no grid needed
        return gaussian_epsilon(noise_multiplier / math.sqrt(n_releases), delta)
    dpa = _require_dp_accounting(accountant)
    acc = _accountant(dpa, accountant, mechanism, noise_multiplier, int(n_releases))
    acc.compose(_event(dpa, mechanism, noise_multiplier, int(n_releases), accountant))
    return float(acc.get_epsilon(delta))


def _one_release(mechanism, epsilon, delta):
    """The multiplier that makes one release exactly ``(epsilon, delta)``-DP."""
    if mechanism == "gaussian":
        return analytic_gaussian_sigma(epsilon, delta)
    if mechanism == "laplace":
        return 1.0 / epsilon
    return flip_probability(epsilon)


def calibrate_noise(mechanism, target_epsilon, target_delta, n_releases, accountant="pld"):
    """The smallest noise multiplier whose ``n_releases`` releases spend ``target_epsilon``.

    Gaussian noise under ``"pld"`` is exact: ``sqrt(n)`` times the analytic Gaussian
    multiplier of one ``(target_epsilon, target_delta)`` release. Otherwise
    dp-accounting's ``calibrate_dp_mechanism`` bisects between the noise
    of one release at the whole budget (too little for ``n > 1``) and the basic-composition
    noise (enough); the result spends the target within 0.1%. With
    ``accountant="basic"`` each release gets ``(epsilon / n, delta / n)`` exactly (the
    analytic Gaussian mechanism for Gaussian noise).

    Parameters
    ----------
    mechanism : {"gaussian", "laplace", "bernoulli"}
        The mechanism of every release.
    target_epsilon, target_delta : float > 0
        Budget of all the releases together.
    n_releases : int >= 1
        Number of releases the budget must cover.
    accountant : {"pld", "rdp", "basic"}, default="pld"
        How releases compose (see :func:`epsilon_spent`).

    Returns
    -------
    noise_multiplier : float
        Gaussian or Laplace noise per unit of sensitivity, or the flip probability.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import calibrate_noise
    >>> round(calibrate_noise("laplace", 10.0, 1e-5, 100, accountant="basic"), 6)
    10.0
    """
    if mechanism not in MECHANISMS:
        raise ValueError(f"Unknown mechanism {mechanism!r}; expected one of {MECHANISMS}.")
    _check_accountant(accountant)
    for name, value in (("target_epsilon", target_epsilon), ("target_delta", target_delta)):
        if not isinstance(value, numbers.Real) or not value > 0 or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}.")
    if not isinstance(n_releases, numbers.Integral) or n_releases < 1:
        raise ValueError(f"n_releases must be an integer >= 1, got {n_releases!r}.")
    n = int(n_releases)
    basic = _one_release(mechanism, target_epsilon / n, target_delta / n)
    if accountant == "basic":
        return basic
    one = _one_release(mechanism, target_epsilon, target_delta)
    if n == 1 or math.isclose(one, basic):
        return basic
    if mechanism == "gaussian" and accountant == "pld":
        return one * math.sqrt(n)  # n releases of z are one of z / sqrt(n): exact
    dpa = _require_dp_accounting(accountant)
    mc = dpa.mechanism_calibration
    return float(mc.calibrate_dp_mechanism(
        lambda: _accountant(dpa, accountant, mechanism, one, n),
        lambda z: _event(dpa, mechanism, z, n, accountant),
        target_epsilon, target_delta,
        bracket_interval=mc.ExplicitBracketInterval(one, basic),
        tol=1e-6 * one,
    ))


def privacy_spent(clients, n_releases, *, mechanism, noise_multiplier, delta, accountant):
    """The ``privacy_spent_`` attribute: one entry per client, as a dict of arrays.

    Like ``cv_results_``, ``pandas.DataFrame(privacy_spent_)`` gives a table. Keys:
    ``client`` (label), ``n_releases`` (uploads the server received from it), ``epsilon``
    (the ``accountant``'s, at ``delta``), ``delta``, and the basic-composition bound
    ``epsilon_basic`` at ``delta_basic`` (``delta`` for Gaussian noise, 0 for pure mechanisms).
    Clients with the same number of releases share one accountant run.

    Parameters
    ----------
    clients : array-like of shape (n_clients,)
        Client labels, in the engine's client order.
    n_releases : array-like of int, shape (n_clients,)
        Uploads the server received from each client.
    mechanism : {"gaussian", "laplace", "bernoulli"}
        The mechanism of every release.
    noise_multiplier : float
        Gaussian ``sigma / sensitivity``, Laplace ``b / sensitivity``, or the flip probability.
    delta : float in [0, 1)
        The delta at which epsilon is reported.
    accountant : {"pld", "rdp", "basic"}
        How releases compose (see :func:`epsilon_spent`).

    Examples
    --------
    >>> from sklearn_fedmf.privacy import privacy_spent
    >>> spent = privacy_spent(["a", "b"], [10, 0], mechanism="laplace", noise_multiplier=10.0,
    ...                       delta=1e-5, accountant="basic")
    >>> spent["n_releases"].tolist(), spent["epsilon"].round(6).tolist()
    ([10, 0], [1.0, 0.0])
    """
    counts = np.asarray(n_releases, dtype=np.int64)
    epsilon, basic = np.empty(len(counts)), np.empty(len(counts))
    for n in np.unique(counts):
        at = counts == n
        basic[at] = basic_epsilon(mechanism, noise_multiplier, int(n), delta)
        epsilon[at] = (basic[at][0] if accountant == "basic" else
                       epsilon_spent(mechanism, noise_multiplier, int(n), delta, accountant))
    pure = mechanism != "gaussian"
    return {
        "client": np.asarray(clients),
        "n_releases": counts,
        "epsilon": epsilon,
        "delta": np.full(len(counts), float(delta)),
        "epsilon_basic": basic,
        "delta_basic": np.full(len(counts), 0.0 if pure else float(delta)),
    }
