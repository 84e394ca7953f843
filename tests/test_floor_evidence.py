"""The biases-only floor with evidence (``completion/_validation``): the factor part is kept
only when its validation gain over the biases is larger than ``FLOOR_Z`` standard errors,
computed from sums that each client sends (users as the sample's units)."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf import FedMAvg, FedMGS
from sklearn_fedmf.completion._validation import FLOOR_Z, client_paired_sums, floor_evidence
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.exceptions import DegenerateFitWarning


def _per_user_oracle(d, rows):
    """Gain and cluster-robust standard error, straight from the per-user sums."""
    users = np.unique(rows)
    D = np.array([d[rows == u].sum() for u in users])
    n = np.array([np.count_nonzero(rows == u) for u in users], dtype=float)
    gain = -D.sum() / n.sum()
    m = users.size
    variance = np.sum((D + gain * n) ** 2) / n.sum() ** 2 * m / (m - 1)
    return gain, np.sqrt(variance)


def test_evidence_from_client_sums_equals_the_per_user_oracle_for_any_partition():
    rng = np.random.default_rng(0)
    n_rows, n = 40, 600
    rows = np.sort(rng.integers(0, n_rows, n))
    factor, floor = rng.normal(size=n), rng.normal(size=n) * 1.1
    expected = _per_user_oracle(np.square(factor) - np.square(floor), rows)
    for n_clients in (1, 3, 40):
        codes = rng.integers(0, n_clients, n_rows)  # any partition of the users
        sums = client_paired_sums(factor, floor, rows, codes, n_clients)
        assert sums.shape == (n_clients, 5)
        gain, noise = floor_evidence(sums.sum(axis=0), n)
        assert gain == pytest.approx(expected[0], rel=1e-12)
        assert noise == pytest.approx(expected[1], rel=1e-12)


def test_evidence_is_calibrated_when_errors_are_correlated_within_users():
    """With no true gain, z = gain / noise is standard normal (one-sided above 1: about
    16%, above 2: about 2.3%), although each user's differences share a user effect: the
    users are the sample's units. Per rating, ignoring that, z would exceed 2 far more
    often."""
    rng = np.random.default_rng(1)
    n_rows, per_user, trials = 200, 8, 1500
    rows = np.repeat(np.arange(n_rows), per_user)
    codes = np.arange(n_rows) % 10
    z_users, z_naive = [], []
    for _ in range(trials):
        # each model's errors share a part per user; both models are equally good
        factor = np.repeat(rng.normal(size=n_rows), per_user) + rng.normal(size=rows.size)
        floor = np.repeat(rng.normal(size=n_rows), per_user) + rng.normal(size=rows.size)
        gain, noise = floor_evidence(
            client_paired_sums(factor, floor, rows, codes, 10).sum(axis=0), rows.size)
        d = np.square(factor) - np.square(floor)
        z_users.append(gain / noise)
        z_naive.append(gain / (d.std(ddof=1) / np.sqrt(d.size)))
    z_users, z_naive = np.array(z_users), np.array(z_naive)
    assert 0.12 < np.mean(z_users > 1) < 0.20
    assert 0.005 < np.mean(z_users > 2) < 0.045
    assert np.mean(z_naive > 2) > 2 * np.mean(z_users > 2)


@pytest.fixture(scope="module")
def low_rank():
    return make_ratings(400, 300, 30_000, noise=0.5, random_state=0).X.tocsr()


@pytest.mark.parametrize("cls", [FedMAvg, FedMGS])
def test_real_low_rank_structure_keeps_the_factor_part(low_rank, cls):
    model = cls(random_state=0).fit(low_rank)
    gain, noise = model._floor_evidence
    assert model.factors_used_
    assert gain > 5 * FLOOR_Z * noise


def test_a_gain_within_the_validation_noise_drops_the_factor_part():
    """Low-rank structure under six times the noise, validated on a handful of ratings:
    the factor model still validates better than the biases (the rule before the evidence
    kept it), but by less than FLOOR_Z standard errors of so small a sample, so the fit
    keeps the biases."""
    rng = np.random.default_rng(2)
    coo = make_ratings(400, 300, 30_000, noise=3.0, random_state=0).X.tocoo()
    held = rng.choice(coo.nnz, 12, replace=False)  # 12 validation ratings
    mask = np.zeros(coo.nnz, bool)
    mask[held] = True
    train, valid = (sp.csr_matrix((coo.data[k], (coo.row[k], coo.col[k])), shape=coo.shape)
                    for k in (~mask, mask))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = FedMAvg(random_state=0, early_stopping=True, validation_fraction=None).fit(
            train, eval_set=valid)
    gain, noise = model._floor_evidence
    assert 0 < gain <= FLOOR_Z * noise
    assert not model.factors_used_
    assert not model.components_.any()
    messages = [str(w.message) for w in caught if issubclass(w.category, DegenerateFitWarning)]
    assert len(messages) == 1 and "standard error" in messages[0]


def test_secure_aggregation_sums_the_same_evidence(low_rank):
    """The paired sums are summable: under secure aggregation the server reads the same
    gain and standard error (to the fixed-point encoding's rounding) and decides alike."""
    params = dict(n_clients=6, max_iter=15, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = FedMGS(**params).fit(low_rank)
        secure = FedMGS(**params, secure_aggregation=True).fit(low_rank)
    assert secure.factors_used_ == plain.factors_used_
    assert secure._floor_evidence == pytest.approx(plain._floor_evidence, rel=1e-5)
