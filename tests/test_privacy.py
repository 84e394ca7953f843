"""Oracles for the shared DP mechanisms: closed forms of the Gaussian, Laplace and
randomized-response mechanisms."""

import math

import numpy as np
import pytest

from sklearn_fedmf.privacy import (
    PrivacyWarning,
    check_privacy,
    clip_entries,
    compose_basic,
    flip_probability,
    gaussian_sigma,
    laplace_epsilon,
    laplace_scale,
    privatize,
    randomized_response,
    sensitivity_of,
)


@pytest.mark.parametrize("epsilon, expected", [(0.5, 5.0745), (1.0, 2.5373), (2.0, 1.2686)])
def test_gaussian_sigma_reference_values(epsilon, expected):
    # the Felb paper's setting (Section 3.3): Delta = 1, delta = 0.05; the factor is
    # sqrt(2 ln 25) = 2.537272
    assert gaussian_sigma(epsilon, 0.05) == pytest.approx(expected, abs=5e-5)
    assert gaussian_sigma(epsilon, 0.05, sensitivity=3.0) == pytest.approx(3 * expected, abs=2e-4)


def test_laplace_scale_and_flip_probability():
    assert laplace_scale(0.5, 2.0) == 4.0
    assert laplace_epsilon(laplace_scale(0.7, 0.4), 0.4) == pytest.approx(0.7)
    assert flip_probability(1.0) == pytest.approx(0.268941, abs=1e-6)
    assert flip_probability(1e-9) == pytest.approx(0.5)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_epsilon_must_be_positive(bad):
    for fn in (lambda: gaussian_sigma(bad, 0.05), lambda: laplace_scale(bad),
               lambda: flip_probability(bad)):
        with pytest.raises(ValueError, match="epsilon"):
            fn()
    with pytest.raises(ValueError, match="epsilon"):
        check_privacy("laplace", bad, clip=1.5)


def test_gaussian_delta_range():
    for delta in (0.0, 1.0, None):
        with pytest.raises(ValueError, match="delta"):
            gaussian_sigma(0.5, delta)


def test_empirical_noise_distributions():
    # 10^6 draws: std within 1% of sigma, Laplace MAD within 1% of b, flip rate within 0.002
    n = 1_000_000
    X = np.full((1000, 1000), 0.3)
    rng = np.random.default_rng(0)
    W = privatize(X, rng, mechanism="gaussian", epsilon=1.0, delta=0.05, clip=1.5)
    sigma = gaussian_sigma(1.0, 0.05, sensitivity=1.5)
    assert abs((W - X).std() / sigma - 1) < 0.01
    W = privatize(X, rng, mechanism="laplace", epsilon=0.5, clip=1.5)
    assert abs(np.abs(W - X).mean() / laplace_scale(0.5, 1.5) - 1) < 0.01
    B = (rng.random(n) < 0.5).astype(float)
    W = privatize(B, rng, mechanism="bernoulli", epsilon=1.0)
    assert abs(np.mean(W != B) - flip_probability(1.0)) < 0.002
    assert set(np.unique(W)) <= {0.0, 1.0}


def test_clipping_bounds_every_pre_noise_entry():
    X = np.array([[-4.0, -1.0, 0.2], [1.49, 1.51, 9.0]])
    C = clip_entries(X, 1.5)
    assert np.abs(C).max() <= 1.5
    np.testing.assert_array_equal(C, [[-1.5, -1.0, 0.2], [1.49, 1.5, 1.5]])
    # the residual of privatize is measured from the clipped matrix, not from X
    rng = np.random.default_rng(1)
    W = privatize(X, rng, mechanism="laplace", epsilon=1e6, clip=1.5)
    np.testing.assert_allclose(W, C, atol=1e-4)


def test_randomized_response_real_values_and_xor():
    X = np.array([0.0, 1.0, 0.25, 0.8])
    np.testing.assert_allclose(randomized_response(X, 1.0, np.random.default_rng(0)),
                               [1.0, 0.0, 0.75, 0.2])
    np.testing.assert_array_equal(randomized_response(X, 0.0, np.random.default_rng(0)), X)


def test_sensitivity_kinds():
    assert sensitivity_of("gaussian") == 1.0
    assert sensitivity_of("laplace", clip=1.5) == 1.5
    assert sensitivity_of("gaussian", 1.5, (4, 25), "matrix") == pytest.approx(15.0)
    assert sensitivity_of("laplace", 1.5, (4, 25), "matrix") == pytest.approx(150.0)
    assert sensitivity_of("gaussian", 1.5, (4, 25), 0.3) == 0.3
    with pytest.raises(ValueError, match="shape"):
        sensitivity_of("laplace", 1.5, None, "matrix")


def test_privatize_never_aliases_and_is_seeded():
    X = np.random.default_rng(0).random((3, 4))
    for mech in (None, "gaussian", "laplace", "bernoulli"):
        a = privatize(X, np.random.default_rng(5), mechanism=mech, epsilon=0.5, delta=0.05,
                      clip=1.5)
        b = privatize(X, np.random.default_rng(5), mechanism=mech, epsilon=0.5, delta=0.05,
                      clip=1.5)
        assert not np.shares_memory(a, X)
        np.testing.assert_array_equal(a, b)
        assert (mech is None) == np.array_equal(a, X)


def test_check_privacy_warnings_and_composition():
    with pytest.warns(PrivacyWarning, match="epsilon < 1"):
        check_privacy("gaussian", 1.0, 0.05, clip=1.5)
    with pytest.warns(PrivacyWarning, match="without clipping"):
        check_privacy("laplace", 0.5)
    with pytest.raises(ValueError, match="mechanism"):
        check_privacy("poisson", 0.5)
    assert check_privacy(None, 0.5) is None
    eps, delta = compose_basic(0.5, 0.05, 100)
    assert math.isclose(eps, 50.0) and math.isclose(delta, 5.0)
