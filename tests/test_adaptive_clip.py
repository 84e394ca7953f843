"""DistributedDP(clip="adaptive"): a clip from the data (privacy/_adaptive_clip.py)."""

import math

import numpy as np
import pytest

from sklearn_fedmf.completion import FedBaseline, FedMAvg, FedMGS
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.privacy import DistributedDP, distributed_noise
from sklearn_fedmf.privacy._adaptive_clip import SPAN, AdaptiveClip
from sklearn_fedmf.secure import SecureAggregation

dp_accounting = pytest.importorskip("dp_accounting")  # (the privacy extra: its accountant)


def _round(plan, enc, norms, d, seed):
    """One exchange of clients whose changes have ``norms``: the ring sum of their noised
    vectors read by the server (its clip updated); returns the clip the round used."""
    m = len(norms)
    clip = plan.clip_of("update")
    rng = np.random.default_rng(seed)
    total = None
    for c, norm in enumerate(norms):
        x = rng.normal(size=d)
        x *= norm / np.linalg.norm(x)
        v, _ = plan.client_vector(x, enc, None, np.random.SeedSequence(seed, spawn_key=(c,)),
                                  m, exchange="update")
        total = v.copy() if total is None else total + v
    assert total.size == d + 1  # the upload and the bit
    plan.take_count(total, range(m), "update", enc, m)
    return clip


@pytest.mark.parametrize("gamma,start", [(0.5, 10.0), (0.3, 0.1), (0.05, 3.0), (0.9, 0.3)])
def test_noisy_quantile_converges_to_the_true_quantile(gamma, start):
    # lognormal norms (median 1, log-sd 0.6), 200 of 2,000 clients a round, the clip started
    # up to 10 times off: in the last 6 rounds the true fraction at or below the clip is
    # gamma within 0.08 (the count's noise is 4 z / m = 0.04 a round)
    population = np.exp(np.random.default_rng(1).normal(0.0, 0.6, 2000))
    plan = distributed_noise(DistributedDP(noise=2.0, clip="adaptive", clip_quantile=gamma),
                             n_releases=30, n_rounds=30, auto_clip=start)
    enc = plan.encoding_for(2000)
    sampler = np.random.default_rng(2)
    clips = [_round(plan, enc, population[sampler.choice(2000, 200, replace=False)], 5, k)
             for k in range(25)]
    fractions = [(population <= c).mean() for c in clips[-5:] + [plan.clip_of("update")]]
    assert max(abs(f - gamma) for f in fractions) < 0.08, (fractions, clips)
    assert clips[0] == start


def test_the_count_and_the_clip_are_exact_in_the_ring():
    # the bit coordinate decodes to (count - m/2) plus its noise; with the noise gone (a
    # multiplier of 1e-9) the server reads the exact fraction at or below the clip
    plan = distributed_noise(DistributedDP(noise=1e-9, clip="adaptive", clip_quantile=0.5),
                             n_releases=1, n_rounds=1, auto_clip=2.0)
    enc = plan.encoding_for(50)
    norms = np.linspace(0.5, 4.0, 50)  # 22 of 50 at or below 2
    _round(plan, enc, norms, 7, 0)
    entry = plan.adaptive.log[-1]
    assert entry["clip"] == 2.0 and entry["n"] == 50
    assert abs(entry["fraction"] - np.mean(norms <= 2.0)) < 1e-9
    # 0.44 < 1/2 at or below: the clip goes up by the travel's first step
    assert plan.clip_of("update") == pytest.approx(2.0 * math.exp(0.25), rel=1e-12)
    assert plan.clip_of("prepare") == 2.0  # each kind its own clip


def test_upload_is_clipped_at_the_rounds_clip_and_the_bit_is_its_norms():
    plan = distributed_noise(DistributedDP(noise=1.0, clip="adaptive"), n_releases=5,
                             n_rounds=5, auto_clip=1.0)
    enc = plan.encoding_for(10)
    assert plan.clip == SPAN  # the ring is sized for the largest clip
    last = enc.encode(np.full(40, 0.01))
    for clip in (0.01, 0.3, 1.0, 7.0):
        plan.adaptive.clips["update"] = clip
        for norm in (clip / 2, clip * 2):
            x = np.full(40, 0.01) + norm / math.sqrt(40)
            seed = np.random.SeedSequence(3)
            vector, committed = plan.client_vector(x, enc, last, seed, 2, exchange="update")
            step = enc.decode(committed - last)  # the committed value moved by <= clip
            assert np.linalg.norm(step) <= clip * (1 + 1e-12)
            # the bit, its noise share taken away: +-1/2 of the unit (norm <= clip)
            unit = plan.clip * 2.0**enc.scale_bits
            noise = plan.noise_share(np.random.SeedSequence(seed.entropy, spawn_key=(1,)),
                                     plan.adaptive.sigma_bit * unit / math.sqrt(2), 1)
            bit = int((vector[-1:] - noise).view(np.int64)[0])
            assert bit == (unit // 2 if norm <= clip else -(unit // 2))
    # past max_releases: no data, the bit's coordinate is noise only
    vector, _ = plan.client_vector(np.ones(40), enc, None, np.random.SeedSequence(4), 2,
                                   data=False, exchange="update")
    noise = plan.noise_share(np.random.SeedSequence(4, spawn_key=(1,)),
                             plan.adaptive.sigma_bit * unit / math.sqrt(2), 1)
    np.testing.assert_array_equal(vector[-1:], noise)


def test_a_count_of_pure_noise_barely_moves_the_clip():
    # 29 clients, sigma_b = 51 (epsilon 1): the fraction's noise is 1.8; once settled, 40
    # rounds of noise move log C by 0.3 * 1.8 / 0.3 / 35 ~ 0.05 each (a random walk of
    # sd 0.3), where an unscaled step (1.8 each) would end 10 times off or more
    rng = np.random.default_rng(0)
    ada = AdaptiveClip(start=1.0, quantile=0.9, sigma_bit=51.0)
    for _ in range(40):
        ada.observe("prepare", 0.9 + rng.normal(0.0, 51.0 / 29), 29)
    assert ada.rates["prepare"][0] is None  # (settled)
    assert abs(math.log(ada.clip("prepare"))) < 3.0  # travel (<= 2.2) plus the walk


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
def test_epsilon_with_the_count_matches_an_independent_rdp_computation():
    X = make_ratings(40, 20, 300, random_state=0).X
    model = FedBaseline(n_clients=40, clients_per_round=20, max_iter=4, random_state=0,
                        privacy=DistributedDP(target_epsilon=4.0, clip="adaptive",
                                              max_releases=None)).fit(X)
    plan, spent = model._ddp_plan, model.privacy_spent_
    z_update, sigma_bit = plan.multiplier, plan.adaptive.sigma_bit
    # each release: the upload (sensitivity C, noise z' C) and the count (sensitivity 1/2,
    # noise sigma_b), two Gaussian mechanisms composed, from dp_accounting alone
    for n in np.unique(spent["n_releases"]):
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.GaussianDpEvent(z_update), int(n))
        acc.compose(dp_accounting.GaussianDpEvent(2 * sigma_bit), int(n))
        np.testing.assert_allclose(spent["epsilon"][spent["n_releases"] == n],
                                   acc.get_epsilon(1e-6), rtol=1e-9)
    # at the calibrated count (every exchange: start + 4 rounds) the target, just
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z_update), 5)
    acc.compose(dp_accounting.GaussianDpEvent(2 * sigma_bit), 5)
    assert 4.0 * (1 - 1e-6) < acc.get_epsilon(1e-6) <= 4.0 + 1e-9
    assert spent["epsilon"].max() <= 4.0 + 1e-9
    assert math.isclose(model.noise_multiplier_,
                        (z_update**-2 + (2 * sigma_bit) ** -2) ** -0.5, rel_tol=1e-9)
    assert math.isclose(sigma_bit, 4 * model.noise_multiplier_, rel_tol=1e-6)


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
@pytest.mark.parametrize("cls", [FedMAvg, FedMGS])
def test_clips_in_history_are_the_public_function_of_the_counts(cls):
    # history_ holds each round's clips and noisy fractions; replaying the server's rule on
    # the fractions gives the clips again (nothing else steers them), within [C0/SPAN,
    # C0*SPAN]; and the secure fit is the measurement path's bit for bit
    from sklearn_fedmf.privacy._distributed_dp import AUTO_CLIP, _unmasked_for_measurement

    X = make_ratings(40, 20, 300, random_state=0).X
    kw = dict(n_clients=40, clients_per_round=20, max_iter=4, random_state=0,
              privacy=DistributedDP(target_epsilon=8.0, clip="adaptive", min_survivors=0.5))
    model = cls(**kw).fit(X)
    fast = cls(**kw, secure_aggregation=_unmasked_for_measurement()).fit(X)
    np.testing.assert_array_equal(model.components_, fast.components_)
    ada = model._ddp_plan.adaptive
    replay = AdaptiveClip(start=ada.start, quantile=ada.quantile, sigma_bit=ada.sigma_bit)
    # (the count's noise: shares sized for max(threshold, 10) of the 20 survivors)
    shares = model._ddp_plan.survivors_needed(SecureAggregation().threshold(20), 20)
    start = AUTO_CLIP[cls.__name__]
    kinds = set()
    for record in model.history_:
        for kind, clip in record["dp_clip"].items():
            assert clip == replay.clip(kind)
            assert start / SPAN <= clip <= start * SPAN
            replay.observe(kind, record["dp_clip_fraction"][kind], 20, math.sqrt(20 / shares))
            kinds.add(kind)
    assert "update" in kinds and len(model.history_) == 4
    assert model.history_[0]["dp_clip"]["update"] == start
    assert any(r["dp_clip"]["update"] != start for r in model.history_[1:])


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
def test_auto_is_adaptive_for_fedmavg_and_fedbaseline_and_the_constant_elsewhere():
    # clip="auto": FedMAvg and FedBaseline adapt from their constants (the measured choice);
    # FedMGS keeps its own; a number is the old fixed clip (no count, no dp_clip)
    from sklearn_fedmf.privacy._distributed_dp import AUTO_CLIP

    X = make_ratings(40, 20, 300, random_state=0).X
    kw = dict(n_clients=40, clients_per_round=20, max_iter=2, random_state=0)
    auto = FedMAvg(**kw, privacy=DistributedDP(target_epsilon=8.0)).fit(X)
    assert auto._ddp_plan.adaptive.start == AUTO_CLIP["FedMAvg"]
    assert auto._ddp_plan.adaptive.gamma("update") == 0.3
    base = FedBaseline(**kw, privacy=DistributedDP(target_epsilon=8.0)).fit(X)
    assert base._ddp_plan.adaptive.start == AUTO_CLIP["FedBaseline"]
    assert base._ddp_plan.adaptive.gamma("update") == 0.5
    assert set(base.history_[0]["dp_clip"]) == {"init", "update"}
    for cls in (FedMGS,):
        model = cls(**kw, privacy=DistributedDP(target_epsilon=8.0)).fit(X)
        assert model._ddp_plan.adaptive is None
        assert model._ddp_plan.clip == AUTO_CLIP[cls.__name__]
    fixed = FedMAvg(**kw, privacy=DistributedDP(target_epsilon=8.0, clip=10.0)).fit(X)
    assert fixed._ddp_plan.adaptive is None and "dp_clip" not in fixed.history_[0]
    assert fixed.noise_multiplier_ == pytest.approx(fixed._ddp_plan.multiplier, rel=1e-9)


def test_the_counts_noise_has_the_accounted_variance():
    # the bit coordinate of a sum of m shares N_Z(0, (sigma_b unit)^2 / t): variance
    # m / t (sigma_b unit)^2, what the accountant assumes at t = m (2,000 sums; the sample
    # variance's relative standard error is sqrt(2 / 2000) = 3.2%, 4 of them allowed)
    plan = distributed_noise(DistributedDP(noise=0.5, clip="adaptive"), n_releases=1,
                             n_rounds=1, auto_clip=1.0)
    enc = plan.encoding_for(6)
    unit = plan.clip * 2.0**enc.scale_bits
    m, t, draws = 6, 4, 2000
    counts = np.empty(draws)
    for k in range(draws):
        total = sum(plan.client_vector(np.zeros(3), enc, None,
                                       np.random.SeedSequence(k, spawn_key=(c,)), t,
                                       exchange="update")[0] for c in range(m))
        counts[k] = float(total[-1:].view(np.int64)[0]) / unit - m / 2  # (every bit is 1)
    expected = m / t * plan.adaptive.sigma_bit**2
    assert abs(counts.var() / expected - 1) < 4 * math.sqrt(2 / draws)
    assert abs(counts.mean()) < 4 * math.sqrt(expected / draws)


def test_the_settling_step_shrinks_with_the_counts_noise_under_dropouts():
    # shares sized for t = 4 of m = 16 survivors: the count's sd is sigma_b sqrt(m / t), twice
    # sigma_b; the server passes that spread (the default min_survivors="threshold" sizes
    # shares for the threshold) and the settling step is halved again
    plan = distributed_noise(DistributedDP(noise=0.5, clip="adaptive"), n_releases=1,
                             n_rounds=1, auto_clip=1.0)
    enc = plan.encoding_for(16)
    seen = []
    plan.adaptive.observe = lambda kind, f, n, spread: seen.append(spread)
    total = sum(plan.client_vector(np.zeros(3), enc, None,
                                   np.random.SeedSequence(0, spawn_key=(c,)), 4,
                                   exchange="update")[0] for c in range(16))
    plan.take_count(total, range(16), "update", enc, 4)
    assert seen == [2.0]
    steps = []
    for spread in (1.0, 2.0):
        ada = AdaptiveClip(start=1.0, quantile=0.5, sigma_bit=10.0)
        ada.rates["update"] = (None, 1.0)  # (settled)
        ada.observe("update", 0.9, 100, spread)  # noise 0.1 and 0.2 on the fraction
        steps.append(-math.log(ada.clip("update")))
    assert steps[0] == pytest.approx(0.3 * 0.4 / 0.5 / 2) and steps[1] == pytest.approx(
        steps[0] / 2)


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
def test_noise_scaled_clip_is_public_logged_and_accounted_as_a_constant():
    # RFRec's clip="auto": C = K n / z from the budget's multiplier z and the round's n
    # clients alone (the same for other data), logged in history_; each client's epsilon is
    # an independent dp_accounting composition of Gaussian(z) over its releases
    from sklearn_fedmf.completion import RFRec
    from sklearn_fedmf.privacy._distributed_dp import AUTO_CLIP, NoiseScaledClip

    rule = AUTO_CLIP["RFRec"]
    assert isinstance(rule, NoiseScaledClip)
    clips = {}
    for eps, per_round, seed in [(2.0, 10, 0), (8.0, 20, 0), (8.0, 20, 1)]:
        X = make_ratings(40, 20, 300, random_state=seed).X
        model = RFRec(n_clients=40, clients_per_round=per_round, max_iter=3, random_state=0,
                      privacy=DistributedDP(target_epsilon=eps, max_releases=None)).fit(X)
        plan, spent = model._ddp_plan, model.privacy_spent_
        assert plan.adaptive is None
        z = plan.multiplier
        assert plan.clip == pytest.approx(rule.noise_of_mean * per_round / z, rel=1e-12)
        assert [r["dp_clip"] for r in model.history_] == [{"update": plan.clip}] * 3
        assert spent["n_releases"].max() > 0
        for n in np.unique(spent["n_releases"][spent["n_releases"] > 0]):
            acc = dp_accounting.rdp.RdpAccountant()
            acc.compose(dp_accounting.GaussianDpEvent(z), int(n))
            np.testing.assert_allclose(spent["epsilon"][spent["n_releases"] == n],
                                       acc.get_epsilon(1e-6), rtol=1e-9)
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.GaussianDpEvent(z), 3)  # (calibrated for every round)
        assert eps * (1 - 1e-6) < acc.get_epsilon(1e-6) <= eps + 1e-9
        clips[eps, per_round, seed] = plan.clip
    assert clips[8.0, 20, 0] == clips[8.0, 20, 1]  # (no data in it)
    assert clips[2.0, 10, 0] < clips[8.0, 20, 0] / 2  # (more noise, fewer clients: smaller)
    # a number still is the fixed clip, unlogged
    fixed = RFRec(n_clients=40, clients_per_round=20, max_iter=2, random_state=0,
                  privacy=DistributedDP(target_epsilon=8.0, clip=0.5)).fit(X)
    assert fixed._ddp_plan.clip == 0.5 and "dp_clip" not in fixed.history_[0]
