"""DistributedDP: noise on the secure sum (sklearn_fedmf/privacy/_distributed_dp.py)."""

import math

import numpy as np
import pytest

from sklearn_fedmf.binary import Felb
from sklearn_fedmf.completion import FedBaseline, FedMAvg, FedMCADMM, RFRec
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.privacy import (
    DistributedDP,
    ddg_rho,
    discrete_gaussian,
    distributed_noise,
)
from sklearn_fedmf.secure import secure_sum
from sklearn_fedmf.secure._protocol import default_threshold

dp_accounting = pytest.importorskip("dp_accounting")  # (the privacy extra: its accountant)


def _noisy_sum(plan, n, survivors, d, seed, flat=None):
    """The decoded secure sum of ``n`` clients' noised zero (or ``flat``) vectors, the
    clients from ``survivors`` on dropping before their masked input."""
    t = default_threshold(n)
    enc = plan.encoding_for(n)
    ups = {c: plan.client_vector(np.zeros(d) if flat is None else flat[c], enc, None,
                                 np.random.SeedSequence(seed, spawn_key=(c,)), t)[0]
           for c in range(n)}
    result = secure_sum(ups, encoding=enc, seed=seed,
                        dropout={"masked_input": set(range(survivors, n))})
    return np.asarray(result.sum), result.clients, t


@pytest.mark.parametrize("survivors", ["t", "all"])
def test_sum_noise_has_the_accounted_variance_down_to_the_threshold(survivors):
    # sigma^2 / t per client: t survivors give sigma^2 exactly, n give n / t times it
    plan = distributed_noise(DistributedDP(noise=1.5, clip=2.0), n_releases=1, n_rounds=1)
    n, d = 9, 40_000
    t = default_threshold(n)
    m = t if survivors == "t" else n
    total, clients, _ = _noisy_sum(plan, n, m, d, seed=3)
    assert len(clients) == m
    expected = (plan.multiplier * plan.clip) ** 2 * m / t
    # sample variance of d iid draws: relative standard error sqrt(2 / d) = 0.7%; 5 of them
    assert abs(total.var() / expected - 1) < 5 * math.sqrt(2 / d)
    assert abs(total.mean()) < 5 * math.sqrt(expected / d)


def test_discrete_gaussian_sampler_matches_its_pmf():
    sigma = 1.3
    z = discrete_gaussian(np.random.default_rng(0), sigma, 200_000)
    support = np.arange(-8, 9)
    pmf = np.exp(-support**2 / (2 * sigma**2))
    pmf /= pmf.sum()
    observed = np.array([(z == k).sum() for k in support])
    expected = pmf * z.size
    keep = expected > 20
    chi2 = (((observed - expected) ** 2 / expected)[keep]).sum()
    # chi-square with <= 16 degrees of freedom: 40 is beyond its 99.9% quantile (39.3)
    assert chi2 < 40


def test_the_ring_never_wraps_at_the_default_sizes():
    # the largest values a fit can hold: every client at the clip in every exchange, plus
    # noise; the encoding keeps them inside the signed 64-bit range with the tail margin
    for n, rounds, z in [(6040, 101, 30.0), (100, 20, 3.0), (2, 1, 0.5)]:
        plan = distributed_noise(DistributedDP(noise=z, clip=7.0), n_releases=rounds,
                                 n_rounds=rounds)
        enc = plan.encoding_for(n)
        unit = plan.clip * 2.0**enc.scale_bits
        largest = unit * (n * (rounds + 1) * 1.5) + 11 * plan.sigma_ring(enc) * math.sqrt(
            n * (rounds + 1) * n)
        assert largest < 2.0**62
        assert enc.max_clients >= n
    # and a sum at the clip with noise decodes to the true sum within the noise
    plan = distributed_noise(DistributedDP(noise=0.01, clip=3.0), n_releases=1, n_rounds=1)
    n, d = 6, 50
    flat = {c: np.full(d, -3.0 / math.sqrt(d) * (1 if c % 2 else -1) * 0.999) for c in range(n)}
    flat[0] = np.full(d, 3.0 / math.sqrt(d) * 0.999)
    total, _, t = _noisy_sum(plan, n, n, d, seed=1, flat=flat)
    truth = sum(flat.values())
    sd = plan.multiplier * plan.clip * math.sqrt(n / t)
    assert np.all(np.abs(total - truth) < 6 * sd)


def test_clipping_bound_holds_per_client():
    plan = distributed_noise(DistributedDP(noise=1.0, clip=0.5), n_releases=1, n_rounds=1)
    enc = plan.encoding_for(10)
    rng = np.random.default_rng(0)
    for scale in (1e-3, 1.0, 1e3):
        x = rng.normal(size=500) * scale
        q = enc.encode(plan.clip_vector(x, enc))
        # the encoded upload before noise, in the upload's units
        assert np.linalg.norm(enc.decode(q)) <= plan.clip * (1 + 1e-12)
    # a cumulative change is clipped, not the value: the committed value moves by <= clip
    last = enc.encode(np.full(500, 0.001))
    _, committed = plan.client_vector(np.full(500, 5.0), enc, last,
                                      np.random.SeedSequence(0), 2)
    step = enc.decode(committed - last)
    assert np.linalg.norm(step) <= plan.clip * (1 + 1e-12)


def test_epsilon_matches_an_independent_rdp_computation():
    X = make_ratings(40, 20, 300, random_state=0).X
    model = FedBaseline(n_clients=40, clients_per_round=20, max_iter=4, random_state=0,
                        privacy=DistributedDP(target_epsilon=4.0, clip=5.0,
                                              max_releases=None)).fit(X)
    spent = model.privacy_spent_
    assert spent["n_releases"].max() <= 5 and spent["n_releases"].min() >= 1  # init + rounds
    assert spent["epsilon"].max() <= 4.0 + 1e-6
    # KLS zCDP at the fit's sigma (tau underflows at millions of ring units)
    z = model.noise_multiplier_
    plan = model._ddp_plan
    enc = plan.encoding_for(40)
    unit = plan.clip * 2.0**enc.scale_bits
    rho = ddg_rho(unit, plan.sigma_ring(enc) / math.sqrt(40), 40, 10**6)
    assert math.isclose(z, 1 / math.sqrt(2 * rho), rel_tol=1e-12)
    assert math.isclose(z, plan.multiplier, rel_tol=1e-9)
    for n in np.unique(spent["n_releases"]):
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.GaussianDpEvent(z), int(n))
        want = acc.get_epsilon(1e-6)
        got = spent["epsilon"][spent["n_releases"] == n]
        np.testing.assert_allclose(got, want, rtol=1e-9)
    # the releases are the noisy sums each client was in: the start's and its rounds'
    assert spent["n_releases"].sum() == 40 + 4 * 20


def test_estimators_that_cannot_take_it_refuse():
    with pytest.raises(ValueError, match="privacy"):
        Felb(privacy=DistributedDP(target_epsilon=1.0)).fit(np.eye(6))
    with pytest.raises(TypeError):
        FedMCADMM(privacy=DistributedDP(target_epsilon=1.0))
    X = make_ratings(30, 15, 200, random_state=0).X
    with pytest.raises(ValueError, match="early_stopping"):
        FedMAvg(n_clients=30, max_iter=2, early_stopping=True,
                privacy=DistributedDP(target_epsilon=1.0)).fit(X)
    with pytest.raises(ValueError, match="exactly one"):
        FedBaseline(n_clients=30, max_iter=2,
                    privacy=DistributedDP(target_epsilon=1.0, noise=1.0)).fit(X)


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
def test_fit_is_deterministic_and_noisy():
    X = make_ratings(40, 20, 300, random_state=0).X
    kw = dict(n_clients=40, clients_per_round=20, max_iter=3)

    def fit(seed, privacy):
        return RFRec(random_state=seed, privacy=privacy, **kw).fit(X)

    ddp = DistributedDP(target_epsilon=8.0, clip=5.0)
    a, b, c = fit(0, ddp), fit(0, ddp), fit(1, ddp)
    np.testing.assert_array_equal(a.components_, b.components_)
    np.testing.assert_array_equal(a.privacy_spent_["epsilon"], b.privacy_spent_["epsilon"])
    assert not np.array_equal(a.components_, c.components_)
    # the noise is there: the secure fit without it differs
    plain = RFRec(random_state=0, secure_aggregation=True, **kw).fit(X)
    assert not np.allclose(plain.components_, a.components_)
    assert a.privacy_spent_["epsilon"].max() <= 8.0 + 1e-6


def test_past_max_releases_a_client_sends_noise_only():
    plan = distributed_noise(DistributedDP(noise=1.0, clip=1.0, max_releases=2),
                             n_releases=10, n_rounds=10)
    enc = plan.encoding_for(4)
    last = enc.encode(np.full(100, 0.01))
    vector, committed = plan.client_vector(np.full(100, 0.05), enc, last,
                                           np.random.SeedSequence(0), 2, data=False)
    np.testing.assert_array_equal(committed, last)  # its value in the running sum stays
    noise_only, _ = plan.client_vector(np.zeros(100), enc, None, np.random.SeedSequence(0), 2)
    np.testing.assert_array_equal(vector, noise_only)  # the same draws, no data
    assert plan.may_release(1) and not plan.may_release(2)
    plan.record([0, 1], 100, 4)
    plan.record([0], 100, 4)
    plan.record([0], 100, 4)
    assert plan.counts(3).tolist() == [2, 1, 0]  # a release past the cap carries no data


def test_min_survivors_sizes_the_shares_and_the_server_refuses_fewer():
    from sklearn_fedmf.secure._rounds import SecureRoundFailed

    plan = distributed_noise(DistributedDP(noise=1.0, min_survivors=0.9), n_releases=1,
                             n_rounds=1)
    assert plan.survivors_needed(threshold=9, n_members=100) == 90
    assert plan.survivors_needed(threshold=95, n_members=100) == 95
    plan.check_survivors(range(90), 9, 100)
    with pytest.raises(SecureRoundFailed, match="fewer than the 90"):
        plan.check_survivors(range(89), 9, 100)


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
@pytest.mark.parametrize("name,extra", [
    ("FedMGS", {}),  # cumulative: running sums of clipped changes
    ("FedMAvg", {}),  # a cumulative prepare exchange, a reference
    ("RFRec", {"solver_params": {"dropout": 0.2}}),  # dropouts: members beyond survivors
    ("FedBaseline", {}),
])
def test_unmasked_measurement_path_gives_the_secure_fits_model_bit_for_bit(name, extra):
    # the benchmark's fast path (no keys, no masks) runs the same client and server
    # functions; SecAgg+'s masks cancel exactly in the ring, so every fitted array is equal
    from sklearn_fedmf import completion
    from sklearn_fedmf.privacy._distributed_dp import _unmasked_for_measurement

    X = make_ratings(40, 20, 300, random_state=0).X
    cls = getattr(completion, name)
    kw = dict(n_clients=40, clients_per_round=20, max_iter=3, random_state=0,
              privacy=DistributedDP(target_epsilon=8.0, clip=5.0, min_survivors=0.5), **extra)
    secure = cls(**kw).fit(X)
    fast = cls(**kw, secure_aggregation=_unmasked_for_measurement()).fit(X)
    fitted = [k for k, v in vars(secure).items() if k.endswith("_")
              and isinstance(v, np.ndarray)]
    assert {"components_", "item_bias_"} <= set(fitted)
    for k in fitted:
        np.testing.assert_array_equal(getattr(secure, k), getattr(fast, k), err_msg=k)
    for k in ("n_releases", "epsilon"):
        np.testing.assert_array_equal(secure.privacy_spent_[k], fast.privacy_spent_[k])
    # and it refuses to run without noise (it would be a plain sum a server could read)
    with pytest.raises(ValueError, match="measuring a DistributedDP fit"):
        cls(**{**kw, "privacy": None}, secure_aggregation=_unmasked_for_measurement()).fit(X)


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
def test_auto_defaults_cap_releases_at_the_binomial_quantile_with_exact_epsilon():
    # the defaults: clip="auto" (the estimator's bound), max_releases="auto" (start + the
    # 0.9 quantile of a client's sampled rounds); epsilon still exactly the RDP composition
    from scipy.stats import binom

    from sklearn_fedmf.privacy._distributed_dp import AUTO_CLIP

    X = make_ratings(60, 20, 400, random_state=0).X
    model = FedBaseline(n_clients=60, clients_per_round=12, max_iter=10, random_state=0,
                        privacy=DistributedDP(target_epsilon=4.0)).fit(X)
    plan = model._ddp_plan
    cap = 1 + int(binom.ppf(0.9, 10, 12 / 60))  # (FedBaseline: a start, one exchange a round)
    assert plan.max_releases == cap < 11
    assert plan.adaptive.start == AUTO_CLIP["FedBaseline"]  # (its adaptive clip's start)
    spent = model.privacy_spent_
    assert spent["n_releases"].max() == cap  # (some client was sampled more often)
    # the multiplier is calibrated for cap releases: at cap, exactly the target; an
    # independent RdpAccountant gives each client's epsilon
    z = model.noise_multiplier_
    for n in np.unique(spent["n_releases"]):
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(dp_accounting.GaussianDpEvent(z), int(n))
        np.testing.assert_allclose(spent["epsilon"][spent["n_releases"] == n],
                                   acc.get_epsilon(1e-6), rtol=1e-9)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z), cap)
    assert 4.0 * (1 - 1e-3) < acc.get_epsilon(1e-6) <= 4.0 + 1e-9


@pytest.mark.parametrize("summed", [False, True])
def test_measurement_paths_sum_noise_has_the_accounted_variance(summed):
    # the benchmark's summed noise (one draw of the survivors' total variance per entry)
    # gives the decoded sum the variance the m shares give it: m sigma^2 / share
    from types import SimpleNamespace

    from sklearn_fedmf.engine._federation import SummableUploads
    from sklearn_fedmf.privacy._distributed_dp import _NoisySumsUnmasked, _unmasked_for_measurement

    plan = distributed_noise(DistributedDP(noise=1.5, clip=2.0, min_survivors=0.5),
                             n_releases=1, n_rounds=1)
    n, d = 12, 40_000
    options = _unmasked_for_measurement(summed_noise=summed)
    options = type(options)(**{**vars(options), "noise": plan})
    exchange = _NoisySumsUnmasked(options)
    exchange.slots = {c: {"upload": np.zeros(d)} for c in range(n)}
    exchange._summable = SummableUploads(client=lambda upload, weight: {"x": upload},
                                         server_update=None)
    exchange._call = (7, None, "test", False)
    transport = SimpleNamespace(n_clients=n)
    result = exchange._sum(transport, list(range(n)), (), (1,), 1, "update")
    share = plan.survivors_needed(options.threshold(n), n)
    expected = (plan.multiplier * plan.clip) ** 2 * n / share
    total = result.sums["x"]
    assert abs(total.var() / expected - 1) < 5 * math.sqrt(2 / d)
    assert abs(total.mean()) < 5 * math.sqrt(expected / d)
    assert plan.counts(n).tolist() == [1] * n  # a release of each survivor


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
@pytest.mark.parametrize("variant,rounds,clip", [("rfrec", 3, 1.0), ("rfrecf", 6, 2.0)])
def test_rfrec_clips_its_item_matrix_minus_the_public_shared_columns(variant, rounds, clip):
    # each client clips V_(c) minus the round's shared columns (a client's upload without
    # ratings, public), so the clip bounds its rated columns only: a clip below the norm of
    # the public column of ones in every V_(c) (sqrt(n_items)) leaves the noise-free fit
    # the plain secure fit (RFRecF: its upload and pull rounds too); clipping the whole
    # V_(c) there would shrink every upload
    from sklearn_fedmf.completion._rfrec._rfrec_protocol import secure_reference

    X = make_ratings(40, 20, 300, random_state=0).X
    kw = dict(n_clients=40, clients_per_round=20, max_iter=rounds, random_state=0,
              solver_params={"variant": variant})
    plain = RFRec(secure_aggregation=True, **kw).fit(X)
    assert np.sqrt(X.shape[1]) > 2 * clip
    model = RFRec(privacy=DistributedDP(noise=1e-9, clip=clip, max_releases=None),
                  **kw).fit(X)
    np.testing.assert_allclose(model.components_, plain.components_, atol=1e-7)
    np.testing.assert_allclose(model.item_bias_, plain.item_bias_, atol=1e-7)
    # the reference is the shared columns after the round's step: at gd's auto step on a
    # start of zero change (W = Vbar, no ridge) it is W itself
    W = np.arange(12.0).reshape(6, 2)
    ref = secure_reference({"W": W, "W_opt": None, "Vbar": W, "coin": (0, 0)}, None,
                           variant="rfrec", schedule=None, lr=0.1, reg=1.0, reg_v=0.0, p=None,
                           eta=None, optimizer="gd")
    np.testing.assert_allclose(ref["V"], W)
