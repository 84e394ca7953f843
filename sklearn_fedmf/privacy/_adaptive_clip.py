"""Clips for DistributedDP: one that follows the data, paid from the budget, and one from the
settings alone (:class:`NoiseScaledClip`).

Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning with Adaptive
Clipping" (NeurIPS 2021), inside the secure sum. At every exchange each client also sends
the bit ``b = [norm of its upload <= C]`` (its change, in a cumulative exchange; before
clipping) as one more coordinate of its ring vector, centred (``b - 1/2``, in units of the
encoding's unit ``2^bits``) with its own discrete Gaussian share, so the server decodes the
noisy count of clients at or below ``C`` beside the noisy sum (``f``, the noisy fraction).
It moves that exchange kind's clip toward the ``gamma``-quantile of the norms in two phases:

1. *travel*, until ``f - gamma`` first changes sign or is within twice the count's noise
   on ``f`` (``s = sigma_b sqrt(m / t) / n`` for ``n`` clients with data among ``m``
   survivors, each noise share sized for ``t``): ``C <- C exp(-eta sign(f - gamma))``,
   ``eta`` from 0.25, 1.5 times larger each round (at most 1): a clip 10 times off is
   crossed in 5 rounds;
2. *settle*, the paper's geometric step, ``C <- C exp(-eta (f - gamma) / sqrt(gamma (1 -
   gamma)))`` with ``eta = 0.3`` (the paper's 0.2 is for thousands of rounds; the scaling
   keeps a quantile far from 1/2 moving), divided by ``s / 0.05`` when ``s`` is above 0.05
   (the paper's ``sigma_b = m / 20``): a count that is mostly noise (29 clients at epsilon
   1: ``s = 1.8``) barely moves the clip from its start instead of walking it away.

(Simulated over lognormal norms of log-sd 0.2, 0.6 and 1.2, starts 0.01 to 30 times the
quantile, 200 clients a round, noise 0.04 on ``f``: from round 10 to 25 the true fraction at
the clip is within 0.043, 0.021 and 0.015 of ``gamma`` on average; a test checks the same
through the ring.) Each kind (``"init"``, ``"prepare"``, ``"update"``) has its own clip:
their uploads differ in scale (FedMAvg's Gram change about 1, its update ``W_p - V`` about
20 at the MovieLens-1M shape). The start's exchange, once per
fit, uses the start clip ``C0``. The clips stay within ``[C0 / 2^8, C0 2^8]`` (the ring is
sized for the top).

Privacy. Zero-out neighbours: a zeroed client sends 0 in that coordinate, so it moves by at
most ``1/2`` (of the unit) against noise ``sigma_b`` per sum; the upload moves by at most the
round's ``C`` against noise ``z' C``. Both are Gaussian (discrete, KLS Theorem 3) and their
zCDP adds: ``1 / z^2 = 1 / z'^2 + 1 / (2 sigma_b)^2``. A fit calibrated to multiplier ``z``
gives the upload ``z' = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` (Andrew et al., Theorem 1), so every
release is still a Gaussian of multiplier ``z`` in the accountant. ``sigma_b = 4 z``: the
count costs the upload 0.8% more noise (``z' = 1.0079 z``) and its fraction is within
``4 z / m`` (one standard deviation) for ``m`` clients in the sum: 0.013 at 604 clients and
epsilon 8. The clips are a function of the noisy sums only (public,
``history_``'s ``"dp_clip"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

SPAN = 2.0**8  # the clips stay within [C0 / SPAN, C0 SPAN]
LR = 0.25  # the travel's first step (log C moves by at most 1 a round)
SETTLE_LR = 0.3  # the settling step's eta
SETTLE_NOISE = 0.05  # above this noise on the fraction, the settling step shrinks
BIT_NOISE = 4.0  # sigma_b over the fit's multiplier z

# clip="adaptive" with clip_quantile="auto": each estimator's target quantile per exchange
# kind (other kinds and estimators: 1/2), chosen at the MovieLens-1M shape at epsilon 8 where
# the constants were (benchmarks/results/bench_distributed_dp-2026-12.md): FedMAvg's update
# W_p - V has norms 5.6 / 12.6 / 22.9 (10th / 50th / 90th percentile), clip 10 at 0.34; its
# Gram changes 0.05 / 0.39 / 1.1 (a first Gram about 1, then small changes); FedMGS's
# aggregate changes 5.3 / 13.1 / 25.8, clip 3 at 0.03
AUTO_QUANTILE = {
    "FedMAvg": {"update": 0.3, "prepare": 0.9},
    "FedMGS": {"update": 0.05},
}


def bit_noise(multiplier):
    """``sigma_b``, the standard deviation of the noisy count: ``4 z``."""
    return BIT_NOISE * multiplier


def update_multiplier(multiplier, sigma_bit):
    """``z'``: the upload's multiplier for which it and the bit compose to ``multiplier``."""
    rest = multiplier**-2 - (2.0 * sigma_bit) ** -2
    if not rest > 0:
        raise ValueError(f"The clip's count noise {sigma_bit:.3g} leaves no budget for the "
                         f"upload at multiplier {multiplier:.3g}.")
    return rest**-0.5


@dataclass
class AdaptiveClip:
    """The server's adaptive clips of one fit (the ``adaptive`` field of
    :class:`~sklearn_fedmf.privacy.DistributedNoise`; the clients read the clip of the
    exchange from it, the server updates it from each noisy count).

    Parameters
    ----------
    start : float
        ``C0``, every kind's first clip.
    quantile : float or dict
        ``gamma``, or ``{kind: gamma}``.
    sigma_bit : float
        The noisy count's standard deviation (:func:`bit_noise`).
    lr : float
        The travel's first step.

    Examples
    --------
    >>> from sklearn_fedmf.privacy._adaptive_clip import AdaptiveClip
    >>> ada = AdaptiveClip(start=1.0, quantile=0.5, sigma_bit=3.0)
    >>> ada.observe("update", 1.0, 100)  # every norm at or below 1: lower the clip
    >>> round(ada.clip("update"), 4), ada.clip("prepare")
    (0.7788, 1.0)
    """

    start: float
    quantile: object
    sigma_bit: float
    lr: float = LR
    clips: dict = field(default_factory=dict)
    rates: dict = field(default_factory=dict)
    log: list = field(default_factory=list)

    @property
    def ceiling(self):
        return self.start * SPAN

    @property
    def floor(self):
        return self.start / SPAN

    def gamma(self, kind):
        if isinstance(self.quantile, dict):
            return self.quantile.get(kind, 0.5)
        return float(self.quantile)

    def clip(self, kind):
        """The clip of the next exchange of ``kind`` (None: a sum outside the kinds)."""
        return self.clips.get(kind, self.start)

    def observe(self, kind, fraction, n_data, spread=1.0):
        """The server's update from one exchange's noisy fraction of clients at or below
        the clip (``n_data`` clients sent data; the count's noise ``spread`` times
        ``sigma_bit``), logged with the clip it was measured at."""
        clip, gamma = self.clip(kind), self.gamma(kind)
        if not n_data:  # (every client past max_releases: the count is noise only)
            self.log.append({"exchange": kind, "clip": clip, "fraction": math.nan, "n": 0})
            return
        miss = float(fraction) - gamma
        sign = float(np.sign(miss))
        noise = spread * self.sigma_bit / n_data  # (the count's sd on the fraction)
        eta, last = self.rates.get(kind, (self.lr, 0.0))
        if (last and sign and sign != last) or abs(miss) <= 2.0 * noise:
            eta = None  # (settled: from now on the geometric step)
        elif last and eta is not None:
            eta = min(1.5 * eta, 1.0)
        self.rates[kind] = (eta, sign or last)
        step = (eta * sign if eta is not None else SETTLE_LR * miss / math.sqrt(
            gamma * (1.0 - gamma)) / max(1.0, noise / SETTLE_NOISE))
        self.clips[kind] = min(max(clip * math.exp(-step), self.floor), self.ceiling)
        self.log.append({"exchange": kind, "clip": clip, "fraction": float(fraction),
                         "n": int(n_data)})

    def pop_log(self):
        """The exchanges' entries since the last call (a round's, for ``history_``)."""
        out, self.log = self.log, []
        return out


def bit_coordinate(norm, clip, unit, data):
    """A client's centred bit ``(b - 1/2) unit`` as a ring element (0: no data)."""
    if not data:
        return np.uint64(0)
    half = int(unit) // 2
    return np.array(half if norm <= clip else -half, dtype=np.int64).view(np.uint64)


def read_count(last, unit, n_data):
    """The noisy fraction from the sum's bit coordinate ``last`` (a ring element)."""
    centred = float(np.array(last, dtype=np.uint64).view(np.int64)) / unit
    return (centred + n_data / 2.0) / max(n_data, 1)


@dataclass(frozen=True)
class NoiseScaledClip:
    """A clip from public settings alone: the one at which the mean of a round's ``n``
    uploads carries noise of standard deviation ``noise_of_mean`` per entry, ``C =
    noise_of_mean n / z`` (``z`` the fit's multiplier). Where the noise dominates (a small
    ``epsilon`` or few clients a round) it clips harder, trading the bias of clipping for
    less noise; it depends on no client's data, so the accounting is that of a constant.

    Examples
    --------
    >>> from sklearn_fedmf.privacy._adaptive_clip import NoiseScaledClip
    >>> NoiseScaledClip(0.01)(multiplier=2.0, per_round=100)
    0.5
    """

    noise_of_mean: float

    def __call__(self, multiplier, per_round):
        if per_round is None:
            raise ValueError("A noise-scaled clip needs the clients of a round's sum.")
        return self.noise_of_mean * float(per_round) / float(multiplier)
