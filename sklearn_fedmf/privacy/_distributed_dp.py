"""Distributed differential privacy: noise on the secure sum, shared by the clients.

``privacy=DistributedDP(...)`` (FedMAvg, FedMGS, RFRec, FedBaseline) switches secure
aggregation on and has each client, at every secure exchange it takes part in,

1. clip its whole upload of the exchange (the flat vector of its summands) to L2 norm
   ``clip``, a little less so that the fixed-point rounding keeps the encoded vector within
   ``clip * 2^s`` (``s`` the encoding's scale bits),
2. encode it in the ring ``Z_{2^64}`` (deterministic rounding),
3. add, in the ring, its share of discrete Gaussian noise: ``N_Z(0, sigma^2 / t)`` per entry
   (Canonne, Kamath and Steinke's sampler), where ``sigma = multiplier * clip * 2^s`` is the
   noise the sum needs and ``t`` the number of survivors the exchange is guaranteed (the
   SecAgg threshold, or ``min_survivors``). Any ``m >= t`` survivors put ``m sigma^2 / t >=
   sigma^2`` into the sum: the target noise holds whoever drops out.

The server decodes the noisy sum; nothing else changes in the protocol. With
``clip="adaptive"`` (FedMAvg's ``"auto"``) ``clip`` is the current clip of the exchange's
kind, and each vector ends with the client's noised bit "my norm is at most it", from which
the server moves that clip (:mod:`._adaptive_clip`; each release is then the upload and the
bit, two Gaussians composed).

Accounting (Kairouz, Liu and Steinke, ICML 2021, Theorem 3): the sum of ``m`` independent
``N_Z(0, sigma_c^2)`` added to integer vectors whose sum moves by at most ``Delta`` in L2 is
``rho``-zCDP with ``rho = Delta^2 / (2 m sigma_c^2) + tau d / 4``, ``tau = 10 sum_{k<m}
exp(-2 pi^2 sigma_c^2 k / (k + 1))``. zCDP is the Renyi curve ``alpha rho`` of a continuous
Gaussian of multiplier ``1 / sqrt(2 rho)``, so each release is accounted as that Gaussian
in dp-accounting's **RDP** accountant (the PLD of a continuous Gaussian is not proven for
the discrete sum; RDP is). Here ``sigma_c`` is millions of ring units, so ``tau`` underflows
to 0 and the margin over a continuous Gaussian of the same variance is nil (it is computed
and included anyway, at the exchange's dimension and the fit's number of clients).

Neighbouring fits differ in one user's whole data, *zero-out*: the user's client still takes
part but its upload is zero (its noise share is still added). Its clipped upload moves the
sum by at most ``clip``. (Replacing a user's data by another's moves it by ``2 clip``:
give half the ``clip`` for that notion.)

Cumulative exchanges (FedMGS, FedMAvg's Grams: the server keeps the running sum of every
client's latest value). Each client sends the *change* of its committed value, clipped to
``clip``, plus its noise share; its committed value moves by the clipped change, so the
running sum is the sum of the committed values plus the noise of every exchange so far.
Each exchange is one release of the clients in it (the server sees the running sum, a
function of the noisy sums it received). Costs: the noise of the running sum grows with the
number of exchanges (its variance after ``R`` exchanges is ``R`` times one), and a client
whose value moves more than ``clip`` in one exchange lags behind it (the server works from
the lagging committed values). A client keeps its dense committed encoding (the compact
re-encoding of :mod:`sklearn_fedmf.secure._rounds` cannot rebuild a clipped one).

Each release is counted on the server's side when its sum is decoded (the server knows who
took part; no amplification by sampling is claimed), and ``privacy_spent_`` composes each
client's releases.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import partial
from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions

from ..engine._exchange import (
    _SECURE_CLIENT,
    PHASES,
    ExchangeResult,
    FixedPointEncoding,
    SecureAggregation,
    SecureExchange,
    SecureRoundFailed,
    client_ring_vector,
    commit_pending,
    decode_sum,
    exchange_costs,
)
from ._accounting import _require_dp_accounting, calibrate_noise, epsilon_spent
from ._adaptive_clip import (
    AUTO_QUANTILE,
    AdaptiveClip,
    NoiseScaledClip,
    bit_coordinate,
    bit_noise,
    read_count,
    update_multiplier,
)
from ._mechanisms import ddg_rho, discrete_gaussian  # (re-exported)

__all__ = ["DistributedDP", "DistributedNoise", "DistributedDPMixin", "ddg_rho",
           "discrete_gaussian", "distributed_noise"]

DDP_MECHANISMS = ("discrete_gaussian",)
_NOISE_KIND = 8  # seed kind of the clients' noise: SeedSequence(entropy, (8, *key, client))
TAIL_SD = 11.0  # a sum's noise stays within 11 sd on 2^32 entries but with odds 1e-12
_MAX_DIM = 2**32
MAX_UNIT_BITS = 40  # clip * 2^s at most 2^40: float64 decodes the sums exactly enough
MIN_UNIT_BITS = 16  # below, the rounding of an entry (1/2 unit) is not small against clip


class DistributedDP(BaseEstimator):
    """User-level differential privacy of a fit through noise on the secure sum.

    Each client clips its whole upload of a secure exchange to L2 norm ``clip``, encodes it
    in the secure-aggregation ring and adds its share of discrete Gaussian noise there; the
    server only decodes the noisy sum of the survivors, which carries the noise of one
    central Gaussian mechanism however many clients drop out down to the threshold. The
    guarantee covers each user's whole data (zero-out neighbours, a client per user: each
    user; a client of many users: all of them together) against the server and anyone who
    sees the model or the sums; it does not hide who took part. Local DP
    (:class:`~sklearn_fedmf.privacy.LocalDP`) noises each upload instead: the sum there
    carries the noise of every client, here that of one mechanism.

    Parameters
    ----------
    mechanism : {"discrete_gaussian"}, default="discrete_gaussian"
        The noise each client adds in the ring (Kairouz, Liu and Steinke 2021).
    target_epsilon : float or None, default=None
        Budget of the whole fit (> 0): the noise is the smallest with which a client in
        every secure exchange of the fit (``max_iter`` rounds, their prepare phase, the
        start) spends at most ``(target_epsilon, target_delta)``.
    target_delta : float, default=1e-6
        ``delta`` of the whole fit, and the ``delta`` at which ``privacy_spent_`` reports.
    noise : float or None, default=None
        Instead of ``target_epsilon``: the noise multiplier itself (standard deviation of
        the sum's noise over ``clip``; > 0).
    clip : float, "adaptive" or "auto", default="auto"
        L2 bound of a client's whole upload of one exchange (of its change, in a cumulative
        exchange), in the upload's units. A number: that bound in every exchange.
        ``"adaptive"``: a bound that follows the data (Andrew et al. 2021): each client also
        sends, inside the secure sum and with its own noise, whether its upload's norm is
        at most the exchange's clip, and the server moves each exchange kind's clip toward
        the ``clip_quantile`` of the norms, starting from the estimator's constant
        (:data:`AUTO_CLIP`); the count is paid from the budget (the upload's noise rises
        by 0.8%) and the clips are public (``history_``'s ``"dp_clip"``). ``"auto"``:
        ``"adaptive"`` for FedMAvg (from 10) and FedBaseline (from 5); the constant 3 for
        FedMGS; for RFRec a clip from the settings alone, ``0.0147 n / z`` for ``n``
        clients a round and the budget's multiplier ``z`` (:class:`NoiseScaledClip`: a
        round's mean carries noise of sd 0.0147 per entry, on the ratings over
        ``rating_scale_``; its upload is ``V_(c)`` minus the round's public shared
        columns). Chosen at the MovieLens-1M shape and on MovieLens 100K and checked on
        four real sets (``benchmarks/results/bench_distributed_dp-2026-12.md``): FedMAvg's
        and FedBaseline's adaptive clips match or beat their constants there (FedBaseline's
        but at epsilon 1 on ML-100K); FedMGS's did not; RFRec's rule beats the former clip
        1 of its whole ``V_(c)`` where its items learn (ML-100K 1.015 against 1.044 at
        epsilon 8) and costs 0.001 to 0.0035 where they gain at most 0.0015 even without
        noise (the ML-1M shape, Ciao).
    clip_quantile : float in (0, 1) or "auto", default="auto"
        With ``clip="adaptive"``: the quantile of the clients' upload norms the clip tracks
        in every exchange kind; ``"auto"``: the estimator's (:data:`AUTO_QUANTILE`).
    min_survivors : "threshold" or float in (0, 1], default="threshold"
        The fewest clients an exchange sums: ``"threshold"``, the secure-aggregation
        threshold ``t`` (each client adds variance ``sigma^2 / t``: the noise holds under any
        dropout the protocol survives, and costs ``m / t`` times the variance when ``m``
        clients survive); a fraction of the exchange's clients, which an honest server
        enforces (an exchange with fewer survivors fails), for less noise.
    max_releases : int, "auto" or None, default="auto"
        The most noisy sums a client's data enters: ``target_epsilon`` is calibrated for
        that many, and a client that has sent as many sends zero (its update, or its change)
        afterwards, noise only. None: every secure exchange of the fit (a client sampled in
        every round). ``"auto"``: the start's exchange plus a round's exchanges times the
        rounds a uniformly sampled client is in with probability 90% (the 0.9 quantile of
        ``Binomial(max_iter, clients_per_round / n_clients)``; every round at full
        participation): at a tenth of the clients per round over 20 rounds, 4 rounds of
        20, about ``sqrt(5)`` times less noise than None for the same epsilon.

    See Also
    --------
    sklearn_fedmf.privacy.LocalDP : Noise on each upload.

    Notes
    -----
    Fewer, larger releases pay: a cumulative exchange's running sum (FedMGS) carries one
    noise draw per exchange. At the MovieLens-1M shape and epsilon 8, FedMGS with every client
    in each of 4 rounds (``clients_per_round=None, max_iter=4, local_iter_v=10``) fits test
    RMSE 0.958 against 1.062 at 10% of the clients over 20 rounds (biases alone: 1.065).

    Examples
    --------
    >>> from sklearn_fedmf.completion import FedBaseline
    >>> from sklearn_fedmf.datasets import make_ratings
    >>> from sklearn_fedmf.privacy import DistributedDP
    >>> X = make_ratings(40, 20, 300, random_state=0).X
    >>> model = FedBaseline(n_clients=40, max_iter=3, random_state=0,
    ...                     privacy=DistributedDP(target_epsilon=8.0, clip=5.0)).fit(X)
    >>> bool(model.privacy_spent_["epsilon"].max() <= 8.0)
    True
    """

    _parameter_constraints: dict = {
        "mechanism": [StrOptions(set(DDP_MECHANISMS))],
        "target_epsilon": [Interval(Real, 0, None, closed="neither"), None],
        "target_delta": [Interval(Real, 0, 1, closed="neither")],
        "noise": [Interval(Real, 0, None, closed="neither"), None],
        "clip": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto", "adaptive"})],
        "clip_quantile": [Interval(Real, 0, 1, closed="neither"), StrOptions({"auto"})],
        "min_survivors": [StrOptions({"threshold"}), Interval(Real, 0, 1, closed="right")],
        "max_releases": [Interval(Integral, 1, None, closed="left"), StrOptions({"auto"}),
                         None],
    }

    def __init__(self, mechanism="discrete_gaussian", *, target_epsilon=None,
                 target_delta=1e-6, noise=None, clip="auto", clip_quantile="auto",
                 min_survivors="threshold", max_releases="auto"):
        self.mechanism = mechanism
        self.target_epsilon = target_epsilon
        self.target_delta = target_delta
        self.noise = noise
        self.clip = clip
        self.clip_quantile = clip_quantile
        self.min_survivors = min_survivors
        self.max_releases = max_releases


@dataclass(frozen=True)
class DistributedNoise:
    """The noise of one fit (built by :func:`distributed_noise`; the ``noise`` field of
    :class:`~sklearn_fedmf.secure.SecureAggregation`).

    ``multiplier`` is the sum's noise over ``clip``; ``n_rounds`` sizes the ring (a
    cumulative running sum grows by at most ``clip`` per client and exchange, its noise by
    one ``sigma^2`` per exchange); ``releases`` counts each client's decoded sums, and
    ``dims``/``sizes`` the largest exchange, for the accountant.
    """

    clip: float
    multiplier: float
    n_rounds: int
    delta: float
    min_survivors: object = "threshold"
    max_releases: int | None = None
    releases: dict = field(default_factory=dict, compare=False, repr=False)
    largest: dict = field(default_factory=lambda: {"dim": 1, "members": 2}, compare=False,
                          repr=False)
    adaptive: AdaptiveClip | None = field(default=None, compare=False, repr=False)

    # -- the ring
    def encoding_for(self, n_clients):
        """The fixed-point encoding: entries bounded by ``clip`` and ``s`` scale bits, the
        most (``clip 2^s <= 2^40``) for which neither the sum of ``n_clients`` committed
        values (``n_rounds`` clipped changes each) nor its noise (``TAIL_SD`` standard
        deviations of ``n_rounds`` exchanges in which every client survives) can wrap the
        64-bit ring."""
        n, r = max(int(n_clients), 2), self.n_rounds + 1
        units = n * r + n * r / 2 + TAIL_SD * self.multiplier * math.sqrt(n * r * n)
        if self.adaptive is not None:  # (the clip's count: its own coordinate, not summed)
            units = max(units, n / 2 + TAIL_SD * self.adaptive.sigma_bit * n)
        bits = min(MAX_UNIT_BITS, math.floor(62 - math.log2(units)))
        if bits < MIN_UNIT_BITS:
            raise ValueError(f"DistributedDP: {n} clients over {r} exchanges with noise "
                             f"multiplier {self.multiplier:.3g} do not fit the 64-bit ring "
                             f"with clip * 2^s >= 2^{MIN_UNIT_BITS}.")
        scale = bits - math.ceil(math.log2(self.clip))
        clip = 2.0**bits * 2.0**-scale
        return FixedPointEncoding(clip=clip, scale_bits=scale)

    def sigma_ring(self, encoding, clip=None):
        """Standard deviation of the sum's noise in ring units (at ``clip``, default the
        plan's)."""
        return self.multiplier * (self.clip if clip is None else clip) * 2.0**encoding.scale_bits

    def clip_of(self, exchange):
        """The clip of an exchange: the plan's, or with adaptive clipping the current clip of
        the exchange's kind (``"init"``, ``"prepare"``, ``"update"``)."""
        if self.adaptive is None or exchange is None:
            return self.clip
        return self.adaptive.clip(exchange)

    def survivors_needed(self, threshold, n_members):
        if self.min_survivors == "threshold":
            return int(threshold)
        return max(int(threshold), math.ceil(self.min_survivors * n_members))

    # -- the client's side
    def clip_vector(self, x, encoding, clip=None):
        """``x`` scaled to L2 norm at most ``clip - sqrt(d) 2^-(s+1)``: its rounding to the
        ring stays within ``clip 2^s`` (``clip`` default the plan's)."""
        clip = self.clip if clip is None else clip
        bound = clip - math.sqrt(x.size) * 2.0 ** -(encoding.scale_bits + 1)
        norm = float(np.linalg.norm(x))
        return x * (bound / norm) if norm > bound else x

    def may_release(self, released):
        """Whether a client that has sent ``released`` noised inputs may send data again."""
        return self.max_releases is None or released < self.max_releases

    def client_vector(self, flat, encoding, last, seed, survivors, data=True, exchange=None):
        """A client's noised ring vector and its new committed encoding: ``(vector,
        committed)``. ``last`` is its committed encoding of a cumulative exchange (None: its
        first, or a plain exchange): the change from it is clipped, not the value.
        ``data=False`` (past ``max_releases``): zero, noise only. With adaptive clipping the
        clip is the current one of ``exchange``'s kind, and the vector ends with the
        client's noised bit ``norm <= clip`` (:mod:`._adaptive_clip`)."""
        target = np.asarray(flat, dtype=np.float64)
        if not data:
            target = np.zeros_like(target)
        elif last is not None:
            target = target - encoding.decode(last)
        clip = self.clip_of(exchange)
        q = encoding.encode(self.clip_vector(target, encoding, clip))
        committed = q if last is None else last + q  # (uint64: mod 2^64)
        if not data and last is not None:
            committed = last
        vector = q + self.noise_share(seed, self.sigma_ring(encoding, clip)
                                      / math.sqrt(survivors), q.size)
        if self.adaptive is not None:  # the bit, with its own noise share (its own stream)
            unit = self.clip * 2.0**encoding.scale_bits
            bit = bit_coordinate(float(np.linalg.norm(target)), clip, unit, data)
            stream = np.random.SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, 1))
            share = self.noise_share(stream, self.adaptive.sigma_bit * unit
                                     / math.sqrt(survivors), 1)
            vector = np.append(vector, bit + share)
        if encoding.ring_bits < 64:
            mask = np.uint64((1 << encoding.ring_bits) - 1)
            vector, committed = vector & mask, committed & mask
        return vector, committed

    def noise_share(self, seed, sigma_c, size):
        """A client's noise share in the ring: ``size`` draws of ``N_Z(0, sigma_c^2)``."""
        return discrete_gaussian(np.random.default_rng(seed), sigma_c, size).view(np.uint64)

    def seed(self, stream, client):
        """The client's noise stream of an exchange: ``SeedSequence(entropy, (8, *key,
        client))`` from the exchange's key stream ``(entropy, 6, *key)``."""
        return np.random.SeedSequence(stream[0], spawn_key=(_NOISE_KIND, *stream[2:], client))

    # -- the server's side
    def check_survivors(self, survivors, threshold, n_members):
        """Raise when fewer clients than :meth:`survivors_needed` sent their input."""
        need = self.survivors_needed(threshold, n_members)
        if len(survivors) < need:
            raise SecureRoundFailed(f"DistributedDP: only {len(survivors)} clients sent their "
                                    f"noised input, fewer than the {need} whose noise the sum "
                                    "needs.")

    def take_count(self, total, survivors, exchange, encoding, shares):
        """The server's side of adaptive clipping: the ring sum without its bit coordinate,
        the noisy count read from it and the exchange kind's clip updated (None: the sum as
        it is). Each survivor added a share sized for ``shares`` survivors (also a client
        past its release cap, in this coordinate), so the count's standard deviation is
        ``sigma_b sqrt(m / shares)`` for ``m`` survivors: above ``sigma_b`` under dropouts
        short of the threshold's worst case."""
        if self.adaptive is None:
            return total
        cap = math.inf if self.max_releases is None else self.max_releases
        n_data = sum(1 for c in survivors if self.releases.get(c, 0) < cap)
        unit = self.clip * 2.0**encoding.scale_bits
        spread = math.sqrt(len(survivors) / shares)
        self.adaptive.observe(exchange, read_count(total[-1], unit, n_data), n_data, spread)
        return total[:-1]

    def summed_share(self, seed, encoding, ratio, size, exchange):
        """The measurement path's noise of the sum, one draw of the survivors' summed
        variance (``ratio = m / share`` times the sum's) per entry."""
        sigma = self.sigma_ring(encoding, self.clip_of(exchange)) * math.sqrt(ratio)
        if self.adaptive is None:
            return self.noise_share(seed, sigma, size)
        unit = self.clip * 2.0**encoding.scale_bits
        bit = self.noise_share(np.random.SeedSequence(seed.entropy, spawn_key=(
            *seed.spawn_key, 1)), self.adaptive.sigma_bit * unit * math.sqrt(ratio), 1)
        return np.append(self.noise_share(seed, sigma, size - 1), bit)

    def record(self, survivors, dim, n_members):
        """Count a decoded sum as one release of each of its ``survivors``."""
        cap = math.inf if self.max_releases is None else self.max_releases
        for c in survivors:  # (past the cap a client sends noise only: not a release)
            self.releases[c] = min(self.releases.get(c, 0) + 1, cap)
        self.largest["dim"] = max(self.largest["dim"], int(dim))
        self.largest["members"] = max(self.largest["members"], int(n_members))

    def counts(self, n_clients):
        """Each client's releases, in client order."""
        out = np.zeros(n_clients, dtype=np.int64)
        for c, n in self.releases.items():
            out[c] = n
        return out

    def effective_multiplier(self, encoding):
        """The Gaussian multiplier ``1 / sqrt(2 rho)`` of one release: :func:`ddg_rho` bounds
        any sum of ``m >= t`` shares ``N_Z(0, sigma^2 / t)`` (variance ``m sigma^2 / t >=
        sigma^2``; ``tau`` is largest at the smallest share and the most clients, ``t = m =``
        the largest exchange's clients, at its dimension)."""
        clip = self.clip if self.adaptive is None else self.adaptive.floor  # (tau's largest)
        members = self.largest["members"]
        rho = ddg_rho(clip * 2.0**encoding.scale_bits, self.sigma_ring(encoding, clip)
                      / math.sqrt(members), members, self.largest["dim"])
        if self.adaptive is not None:  # the bit: moved by 1/2 unit, its own noise
            unit = self.clip * 2.0**encoding.scale_bits
            rho += ddg_rho(unit / 2, self.adaptive.sigma_bit * unit / math.sqrt(members),
                           members, 1)
        return 1.0 / math.sqrt(2 * rho)


def distributed_noise(privacy, *, n_releases, n_rounds, auto_clip=1.0, auto_releases=None,
                      auto_quantile=0.5, auto_adaptive=False, per_round=None):
    """The :class:`DistributedNoise` of a fit whose clients release at most ``n_releases``
    sums each, over ``n_rounds`` rounds.

    Parameters
    ----------
    privacy : DistributedDP
        The fit's parameters.
    n_releases : int
        The most noisy sums a client is in (``target_epsilon`` covers them).
    n_rounds : int
        The most exchanges of a running sum (sizes the ring).
    auto_clip : float or NoiseScaledClip, default=1.0
        The bound ``clip="auto"`` stands for (an estimator passes its own,
        :data:`AUTO_CLIP`); a :class:`NoiseScaledClip` is resolved from the fit's multiplier
        and ``per_round``.
    auto_releases : int or None
        The cap ``max_releases="auto"`` stands for (None: ``n_releases``).
    auto_quantile : float or dict, default=0.5
        The quantile ``clip_quantile="auto"`` stands for (an estimator passes its own,
        :data:`AUTO_QUANTILE`).
    auto_adaptive : bool, default=False
        Whether ``clip="auto"`` is adaptive (from ``auto_clip``) or ``auto_clip`` itself.
    per_round : int or None
        The clients of a round's sum (for a :class:`NoiseScaledClip`).

    Returns
    -------
    noise : DistributedNoise

    Examples
    --------
    >>> from sklearn_fedmf.privacy import DistributedDP, distributed_noise
    >>> plan = distributed_noise(DistributedDP(noise=2.0, clip=1.0), n_releases=5, n_rounds=5)
    >>> plan.multiplier, plan.max_releases
    (2.0, None)
    """
    privacy._validate_params()
    given = [n for n in ("target_epsilon", "noise") if getattr(privacy, n) is not None]
    if len(given) != 1:
        raise ValueError(f"DistributedDP takes exactly one of target_epsilon and noise; got "
                         f"{', '.join(given) or 'neither'}.")
    clip = privacy.clip
    adaptive = clip == "adaptive" or (clip == "auto" and auto_adaptive)
    if clip in ("auto", "adaptive"):
        clip = auto_clip
    cap = privacy.max_releases
    if cap == "auto":
        cap = None if auto_releases is None or auto_releases >= n_releases else auto_releases
    if cap is not None:
        n_releases = min(int(n_releases), int(cap))
    if privacy.noise is not None:
        multiplier = float(privacy.noise)
    else:
        _require_dp_accounting("rdp")
        # (tau's margin is nil at the ring's scale; 1e-9 more noise covers it)
        multiplier = calibrate_noise("gaussian", privacy.target_epsilon, privacy.target_delta,
                                     max(int(n_releases), 1), accountant="rdp") * (1 + 1e-9)
    if isinstance(clip, NoiseScaledClip):  # (public: the budget's multiplier, the round's size)
        clip = clip(multiplier, per_round)
    ada = None
    if adaptive:  # the count's noise is paid from the multiplier (_adaptive_clip)
        quantile = (auto_quantile if privacy.clip_quantile == "auto"
                    else float(privacy.clip_quantile))
        sigma_bit = bit_noise(multiplier)
        ada = AdaptiveClip(start=float(clip), quantile=quantile, sigma_bit=sigma_bit)
        multiplier, clip = update_multiplier(multiplier, sigma_bit), ada.ceiling
    return DistributedNoise(clip=float(clip), multiplier=multiplier,
                            n_rounds=int(n_rounds), delta=float(privacy.target_delta),
                            min_survivors=privacy.min_survivors,
                            max_releases=None if cap is None else int(cap), adaptive=ada)


def auto_releases(n_clients, per_round, rounds, exchanges_per_round, start, quantile=0.9):
    """``max_releases="auto"``: the start's exchange (``start``: 0 or 1) plus
    ``exchanges_per_round`` times the 0.9 quantile of the rounds a client is in under
    uniform sampling of ``per_round`` of ``n_clients`` clients over ``rounds`` rounds
    (``Binomial(rounds, per_round / n_clients)``).

    Examples
    --------
    >>> from sklearn_fedmf.privacy._distributed_dp import auto_releases
    >>> auto_releases(6040, 604, 20, 2, 0), auto_releases(100, 100, 20, 1, 1)
    (8, 21)
    """
    from scipy.stats import binom

    p = min(1.0, per_round / max(n_clients, 1))
    rounds_in = rounds if p >= 1.0 else int(binom.ppf(quantile, rounds, p))
    return int(start + exchanges_per_round * max(rounds_in, 1))


def distributed_spent(plan, encoding, clients, counts):
    """``privacy_spent_`` of a DistributedDP fit: each client's releases composed by the RDP
    accountant as Gaussians of :meth:`DistributedNoise.effective_multiplier`."""
    z = plan.effective_multiplier(encoding)
    counts = np.asarray(counts, dtype=np.int64)
    epsilon = np.zeros(len(counts))
    for n in np.unique(counts):
        if n:
            epsilon[counts == n] = epsilon_spent("gaussian", z, int(n), plan.delta,
                                                 accountant="rdp")
    return {"client": np.asarray(clients), "n_releases": counts, "epsilon": epsilon,
            "delta": np.full(len(counts), plan.delta)}, z


# ---- the server's post-processing of noisy sums -------------------------------------------
def psd_project(blocks):
    """Each symmetric ``(..., r, r)`` block with its negative eigenvalues set to 0: the
    nearest positive semidefinite matrix (Frobenius). A noisy sum of Grams is indefinite; a
    solve or gradient step on it diverges. Post-processing: no privacy cost."""
    w, v = np.linalg.eigh(blocks)
    return (v * np.maximum(w, 0.0)[..., None, :]) @ np.swapaxes(v, -1, -2)


def _logged(after_round, entries, server_state, broadcast, record):
    """``after_round`` of a fit whose clips are public: ``entries()`` (the round's
    ``"dp_clip"`` and the like) into its ``history_`` record, then the protocol's own."""
    record.update(entries())
    if after_round is None:
        return server_state, broadcast, False
    return after_round(server_state, broadcast, record)


def _adaptive_entries(adaptive):
    """An adaptive-clip fit's round: its exchanges' clips (``"dp_clip"``, ``{kind: clip}``)
    and noisy fractions at or below them (``"dp_clip_fraction"``; the start's exchange in
    the first round's)."""
    log = adaptive.pop_log()
    return {"dp_clip": {e["exchange"]: e["clip"] for e in log},
            "dp_clip_fraction": {e["exchange"]: e["fraction"] for e in log}}


def _scaled_entries(clip):
    """A :class:`NoiseScaledClip` fit's round: the clip every exchange used (``"dp_clip"``,
    ``{"update": clip}``; public, a function of the fit's settings)."""
    return {"dp_clip": {"update": clip}}


def _uniform_weights(server_state, clients, counts):
    return dict.fromkeys(clients, 1.0)


def _denoised(server_step, denoise, server_state, sums, *args, **kwargs):
    return server_step(server_state, None if sums is None else denoise(sums), *args,
                       **kwargs)


# ---- the estimators' side ------------------------------------------------------------------
# clip="auto": each estimator's L2 bound of a client's upload of one exchange, measured at
# make_ratings(6040, 3706, 1_000_000), one client per user, 604 a round, 20 rounds, epsilon 8
# (benchmarks/results/bench_distributed_dp-2026-12.md): FedMAvg's update W_p - V has median
# norm 20 (its rated rows: 1.2 per row), FedMGS's aggregates about 1.5 per rated item.
# RFRec's (its V_(c) minus the public shared columns, on ratings over rating_scale_) is
# scaled to the noise: a round's mean carries noise of sd 0.0147 per entry, the clip 1 at
# epsilon 8 with 94 clients a round (MovieLens 100K, where the deviations' median norm is 1.0)
AUTO_CLIP = {"FedMAvg": 10.0, "FedMGS": 3.0, "RFRec": NoiseScaledClip(0.0147),
             "FedBaseline": 5.0}
# clip="auto" is clip="adaptive" (the constant its start) for these, the constant elsewhere:
# FedMAvg's adaptive clip was as good at the ML-1M shape (3 seeds) and better on ML-100K,
# FilmTrust, Jester, Ciao and Coat; FedMGS's was worse at ML-1M (by 0.0005 to 0.005), at
# ratings x2, on FilmTrust and Jester; FedBaseline's was better at the ML-1M shape (3 seeds,
# epsilon 1 to 16: 14 of 15, one equal), on ML-100K (12 of 15; at epsilon 1, where its count
# is noise, worse in all 3 seeds) and in 17 of 20 (set, epsilon) cells of the other four
# (benchmarks/results/bench_distributed_dp-2026-12.md)
AUTO_ADAPTIVE = frozenset({"FedMAvg", "FedBaseline"})

DISTRIBUTED_DOCS = {
    "distributed_privacy": """\
privacy : :class:`~sklearn_fedmf.privacy.DistributedDP` or None, default=None
    User-level differential privacy by noise on the secure sum: each client clips its
    upload of an exchange and adds its share of discrete Gaussian noise inside secure
    aggregation (switched on by it; ``secure_aggregation`` may still set its options), so
    the server decodes only a noisy sum. Validation (``early_stopping``) is off with it.
    None: no noise.""",
    "distributed_attributes": """\
privacy_spent_ : dict of ndarray
    With ``privacy=DistributedDP``: one entry per client, ``client``, ``n_releases`` (the
    noisy sums it was in), ``epsilon`` at ``delta`` (the RDP accountant).
noise_multiplier_ : float
    With ``privacy=DistributedDP``: the Gaussian multiplier each release is accounted as.
accountant_ : str
    With ``privacy=DistributedDP``: ``"rdp"``.""",
}


class DistributedDPMixin:
    """``privacy=DistributedDP(...)`` in an estimator whose server needs only sums (before
    the estimator's base in the class list): the fit's secure aggregation carries the noise
    (:meth:`_secure_protocol`), validation is off (its reports are not noised), and
    ``_read_distributed_spent`` sets ``privacy_spent_`` and ``noise_multiplier_``."""

    # the estimator's post-processing of a noisy sums dict (None: none), e.g. Grams made PSD
    _ddp_denoise = None
    # whether the weighted sums weigh every client 1 (``clip`` then bounds its update, in the
    # model's units; a weight that grows with the client's data would scale its sensitivity)
    _ddp_uniform_weights = False

    def _distributed(self):
        return isinstance(getattr(self, "privacy", None), DistributedDP)

    def _settings(self):
        settings = super()._settings()
        if self._distributed():
            if settings.get("early_stopping") == "auto":
                settings["early_stopping"] = False  # (validation sums are not noised)
            if settings.get("secure_aggregation") is False:
                settings["secure_aggregation"] = True  # (the noise is private only so)
        return settings

    def _secure_protocol(self, protocol, settings):
        self._ddp_plan = None
        if not self._distributed():
            return super()._secure_protocol(protocol, settings)
        name = type(self).__name__
        if settings.get("warm_start") and hasattr(self, "_federation"):
            raise ValueError(f"{name}: privacy=DistributedDP does not continue a fit "
                             "(warm_start=True): its accounting covers one fit; set "
                             "warm_start=False.")
        if settings.get("early_stopping") is True:
            raise ValueError(f"{name}: privacy=DistributedDP cannot validate (early_stopping"
                             "=True): the validation sums are not noised; set "
                             "early_stopping=False.")
        if protocol.summable is None or (protocol.client_prepare is not None
                                         and protocol.summable.server_prepare is None):
            raise ValueError(f"{name}: privacy=DistributedDP needs secure aggregation, which "
                             f"this setting cannot use: {self._secure_refusal_reason()}.")
        option = settings["secure_aggregation"]
        options = option if isinstance(option, SecureAggregation) else SecureAggregation()
        from ..engine._federation import _n_sampled

        rounds = int(self._engine_params(settings)["max_iter"])
        per_round = 1 + (protocol.client_prepare is not None)
        start = int(protocol.summable.init_client is not None)
        n = int(self.n_clients)
        sampled = _n_sampled(settings["clients_per_round"], n)
        cap = auto_releases(n, sampled, rounds, per_round, start)
        owner = next((c.__name__ for c in type(self).__mro__ if c.__name__ in AUTO_CLIP), None)
        plan = distributed_noise(self.privacy, n_releases=rounds * per_round + start,
                                 n_rounds=rounds * per_round + start,
                                 auto_clip=AUTO_CLIP.get(owner, 1.0), auto_releases=cap,
                                 auto_quantile=AUTO_QUANTILE.get(owner, 0.5),
                                 auto_adaptive=owner in AUTO_ADAPTIVE, per_round=sampled)
        self._ddp_plan = plan
        if plan.adaptive is not None:  # the round's clips into history_ (public)
            protocol = dataclasses.replace(protocol, after_round=partial(
                _logged, protocol.after_round, partial(_adaptive_entries, plan.adaptive)))
        elif self.privacy.clip == "auto" and isinstance(AUTO_CLIP.get(owner), NoiseScaledClip):
            protocol = dataclasses.replace(protocol, after_round=partial(
                _logged, protocol.after_round, partial(_scaled_entries, plan.clip)))
        summable = protocol.summable
        if self._ddp_denoise is not None:  # the server's post-processing of the noisy sums
            wrap = {name: partial(_denoised, getattr(summable, name), self._ddp_denoise)
                    for name in ("server_update", "server_init", "server_prepare")
                    if getattr(summable, name) is not None}
            summable = dataclasses.replace(summable, **wrap)
        if self._ddp_uniform_weights and summable.weights is not None:
            summable = dataclasses.replace(summable, weights=_uniform_weights)
        return dataclasses.replace(protocol, summable=summable,
                                   secure=dataclasses.replace(options, noise=plan))

    def _collect(self, state, blocks, ctx):
        super()._collect(state, blocks, ctx)
        self._read_distributed_spent(ctx.n_clients)

    def _read_distributed_spent(self, n_clients):
        """``noise_multiplier_`` and ``privacy_spent_`` of the fit (None without
        DistributedDP: the caller's LocalDP attributes then)."""
        plan = getattr(self, "_ddp_plan", None)
        if plan is None:
            return False
        clients = np.unique(getattr(self, "clients_", np.arange(n_clients)))
        encoding = plan.encoding_for(n_clients)
        self.privacy_spent_, self.noise_multiplier_ = distributed_spent(
            plan, encoding, clients, plan.counts(n_clients))
        self.accountant_ = "rdp"
        return True


def refuse_distributed(privacy, owner):
    """The error of an estimator that cannot take ``privacy=DistributedDP``."""
    if isinstance(privacy, DistributedDP):
        raise ValueError(f"{owner} does not support privacy=DistributedDP: its server needs "
                         "more than the sum of the uploads (DistributedDP noises a secure "
                         "sum); use FedMAvg, FedMGS, RFRec or FedBaseline, or LocalDP.")


# ---- measurement only: the noisy sums without the masks -------------------------------------
class _NoisySumsUnmasked(SecureExchange):
    """The exchange of :func:`_unmasked_for_measurement`: each client's noisy ring vector is
    computed by the same client function as in the secure phases
    (:func:`~sklearn_fedmf.secure._rounds.client_ring_vector`: clipped, encoded, its noise
    share from the same seed) and the server decodes their ring sum with the same function
    (:func:`~sklearn_fedmf.secure._rounds.decode_sum`), but no keys are agreed and no masks
    added: SecAgg+'s masks cancel exactly in the ring, so the decoded sum, and the model, are
    those of the secure fit (``tests/test_distributed_dp.py`` checks it bit for bit). The
    clients' slots are read in this process (a local transport); nothing is hidden from the
    server, so this exists for measuring accuracy (``benchmarks/bench_distributed_dp.py``)
    and runs only with noise."""

    def check(self, protocol, transport):
        super().check(protocol, transport)
        if self.options.noise is None or transport.secure_slots is None:
            raise ValueError("The unmasked noisy sums are for measuring a DistributedDP fit "
                             "over a local transport only.")
        self._summable = protocol.summable

    def _sum(self, transport, clients, dropped, key, round_number, exchange, *, weights=None,
             running=None, check=None, encoding=None, keep_masked=None, reference=None):
        options, noise = self.options, self.options.noise
        if encoding is None:
            encoding = options.encoding_for(transport.n_clients)
        if exchange == "report":
            raise ValueError("privacy=DistributedDP does not noise validation reports.")
        if len(clients) < 2:
            raise SecureRoundFailed(f"Secure aggregation needs at least 2 uploads in a sum, "
                                    f"got {len(clients)}; raise clients_per_round.")
        members = sorted(set(clients) | set(dropped))
        n = len(members)
        encoding.check_clients(max(n, 1))
        threshold = options.threshold(n)
        survivors = tuple(sorted(set(clients) - set(dropped)))
        if len(survivors) < threshold:
            raise SecureRoundFailed(f"Only {len(survivors)} clients sent their input, fewer "
                                    f"than the threshold {threshold}.")
        noise.check_survivors(survivors, threshold, n)
        stream = (self._call[0], _SECURE_CLIENT, *key)
        share = noise.survivors_needed(threshold, n)
        summed = self.options.summed_noise  # (the clients' shares drawn as one, below)
        plan = _NoShare(**{f.name: getattr(noise, f.name)
                           for f in dataclasses.fields(noise)}) if summed else noise
        total, layouts, slots = None, set(), self.slots
        for c in survivors:  # (the secure path's client function, without the masks)
            message = {"encoding": encoding, "exchange": exchange,
                       "noise": (plan, noise.seed(stream, c), share, reference)}
            if weights is not None:
                message["weight"] = weights[c]
            slot, vector, layout = client_ring_vector(c, dict(slots.get(c) or {}), message,
                                                      self._summable)
            slots[c] = commit_pending(slot)
            layouts.add(layout)
            total = vector.copy() if total is None else total + vector  # (uint64: mod 2^64)
        if len(layouts) > 1:
            raise ValueError("The clients' uploads for the sum differ in names or shapes.")
        if summed:  # the survivors' shares' variance, one draw per entry
            seed = noise.seed(stream, transport.n_clients)  # (no client has that index)
            total += noise.summed_share(seed, encoding, len(survivors) / share, total.size,
                                        exchange)
        if encoding.ring_bits < 64:
            total &= np.uint64((1 << encoding.ring_bits) - 1)
        sums = decode_sum(total, layouts.pop(), survivors, encoding=encoding, noise=noise,
                          running=running, reference=reference, weights=weights,
                          words=total.size, n_members=n, exchange=exchange, shares=share)
        none = {p: {} for p in PHASES}
        costs = exchange_costs(exchange, members, survivors, total.size, none, none, none,
                               dict.fromkeys(PHASES, 0.0),
                               {"agreements": 0, "keystream_words": 0}, 0.0)
        return ExchangeResult(sums, survivors, dict.fromkeys(survivors), none, none, costs)


@dataclass(frozen=True)
class _NoShare(DistributedNoise):
    """A plan whose clients add no noise share (``summed_noise``: the server draws their
    sum)."""

    def noise_share(self, seed, sigma_c, size):
        return np.zeros(size, dtype=np.uint64)


@dataclass(frozen=True)
class _UnmaskedMeasurement(SecureAggregation):
    """Options whose exchange is :class:`_NoisySumsUnmasked` (measurement only)."""

    summed_noise: bool = False
    _exchange_class = _NoisySumsUnmasked


def _unmasked_for_measurement(options=None, *, summed_noise=False):
    """``secure_aggregation=`` for measuring a ``privacy=DistributedDP`` fit fast: the same
    model as the secure fit with ``options`` (default ``SecureAggregation()``), without
    simulating the masks (:class:`_NoisySumsUnmasked`). Private: a deployment never runs it
    (the server would see each client's noisy vector).

    ``summed_noise=True``: the ``m`` survivors' shares ``N_Z(0, sigma^2 / t)`` are drawn as one
    ``N_Z(0, m sigma^2 / t)`` per entry of the sum (the same variance; a sum of discrete
    Gaussians of millions of ring units each is that distribution to within float rounding,
    not bit for bit): the sampler runs ``d`` times per exchange instead of ``m d`` (at the
    ML-1M shape, 600 times fewer draws)."""
    options = SecureAggregation() if options is None else options
    return _UnmaskedMeasurement(**{f.name: getattr(options, f.name)
                                   for f in dataclasses.fields(SecureAggregation)},
                                summed_noise=summed_noise)
