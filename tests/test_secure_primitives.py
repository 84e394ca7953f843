"""Secure aggregation's building blocks: Shamir sharing, the fixed-point ring encoding, and
how the protocol calls the primitives of ``cryptography``."""

import itertools

import numpy as np
import pytest
from scipy import stats

pytest.importorskip("cryptography", reason="secure aggregation needs the 'secure' extra")

from sklearn_fedmf.secure import FixedPointEncoding  # noqa: E402
from sklearn_fedmf.secure._crypto import (  # noqa: E402
    add_prg,
    agree,
    decrypt,
    encrypt,
    prg,
    public_key,
)
from sklearn_fedmf.secure._shamir import (  # noqa: E402
    PRIME,
    evaluate,
    lagrange_at_zero,
    reconstruct,
    split,
    split_many,
)


def _is_probable_prime(n, rng):
    """Miller-Rabin with 40 random bases: a composite passes with probability < 4^-40."""
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for _ in range(40):
        x = pow(int(rng.integers(2, 2**62)), d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = pow(x, 2, n)
            if x == n - 1:
                break
        else:
            return False
    return True


def test_field_is_prime_and_holds_every_key():
    rng = np.random.default_rng(0)
    assert PRIME > 2**256
    assert _is_probable_prime(PRIME, rng)
    assert not _is_probable_prime(PRIME - 2, rng)  # 71 divides it: the test can say no


@pytest.mark.parametrize("n, t", [(7, 4), (5, 5), (6, 1), (8, 3)])
def test_shamir_any_t_of_n_reconstruct(n, t):
    rng = np.random.default_rng(n * 10 + t)
    secret = int.from_bytes(rng.bytes(32), "little")
    shares = split(secret, range(1, n + 1), t, rng)
    for size in range(t, n + 1):
        for subset in itertools.combinations(shares, size):
            assert reconstruct({x: shares[x] for x in subset}, t) == secret


def test_shamir_below_threshold_is_refused_and_a_wrong_set_gives_a_wrong_value():
    rng = np.random.default_rng(1)
    secret, other = 12345, 67890
    shares = split(secret, range(1, 6), 3, rng)
    with pytest.raises(ValueError, match="at least 3 are needed"):
        reconstruct({1: shares[1], 2: shares[2]}, 3)
    foreign = split(other, range(1, 6), 3, rng)
    mixed = {1: shares[1], 2: shares[2], 3: foreign[3]}
    assert reconstruct(mixed, 3) != secret


def test_shamir_t_minus_1_shares_reveal_nothing():
    # GF(7), t = 3: over all coefficient pairs (a1, a2), the shares at x = 1, 2 take every
    # pair of values exactly once, whatever the secret: the shares are independent of it
    p, points = 7, (1, 2)
    for secret in range(p):
        seen = [tuple(evaluate([secret, a1, a2], x, p) for x in points)
                for a1 in range(p) for a2 in range(p)]
        assert sorted(seen) == sorted(itertools.product(range(p), repeat=2))


def test_shamir_coefficients_are_uniform():
    # t = 2 over GF(11): the share at x = 1 is secret + a1, uniform when a1 is; chi-square
    # at level 1e-3 (the seed is fixed; a random one would fail this test 0.1% of the time)
    rng = np.random.default_rng(2)
    draws = [split(4, [1, 2], 2, rng, prime=11)[1] for _ in range(4400)]
    counts = np.bincount(draws, minlength=11)
    assert stats.chisquare(counts).pvalue > 1e-3


@pytest.mark.parametrize("n_points", [1, 2, 3, 20, 39])
def test_lagrange_weights_are_the_definition(n_points):
    # l_j(0) = prod_{m != j} x_m / (x_m - x_j) mod p, each inverse on its own (the batched
    # inversion must give the same field elements), at ids up to 2^32 as the protocol's
    rng = np.random.default_rng(n_points)
    points = [int(x) for x in rng.choice(2**32, size=n_points, replace=False) + 1]
    expected = []
    for j, xj in enumerate(points):
        num = den = 1
        for m, xm in enumerate(points):
            if m != j:
                num, den = num * xm % PRIME, den * (xm - xj) % PRIME
        expected.append(num * pow(den, -1, PRIME) % PRIME)
    assert lagrange_at_zero(points) == expected
    # and they interpolate: f(0) of a random polynomial of degree n_points - 1
    coefficients = [int.from_bytes(rng.bytes(32), "little") % PRIME for _ in range(n_points)]
    values = [evaluate(coefficients, x) for x in points]
    assert sum(w * y for w, y in zip(expected, values)) % PRIME == coefficients[0]


def test_shamir_validation():
    with pytest.raises(ValueError, match="distinct"):
        split(1, [1, 1, 2], 2)
    with pytest.raises(ValueError, match="threshold"):
        split(1, [1, 2], 3)
    with pytest.raises(ValueError, match="secret"):
        split(PRIME, [1, 2], 2)


def test_encoding_round_trip_within_half_a_step():
    enc = FixedPointEncoding(clip=100.0, scale_bits=20)
    x = np.random.default_rng(3).uniform(-100, 100, size=1000)
    assert np.max(np.abs(enc.decode(enc.encode(x)) - x)) <= 2.0**-21


@pytest.mark.parametrize("ring_bits", [64, 32, 16])
def test_encoding_sum_at_the_largest_client_count_does_not_wrap(ring_bits):
    enc = FixedPointEncoding(clip=8.0, scale_bits=4, ring_bits=ring_bits)
    n = enc.max_clients
    assert n * 2 * enc.clip * 2**enc.scale_bits < 2 ** (ring_bits - 1)
    assert (n + 1) * 2 * enc.clip * 2**enc.scale_bits >= 2 ** (ring_bits - 1)
    modulus = np.uint64((1 << ring_bits) - 1)
    for sign in (1.0, -1.0):
        q = enc.encode(np.full(3, sign * enc.clip))
        total = (q * np.uint64(n % 2**64)) & modulus  # n copies summed in the ring
        assert np.all(np.abs(enc.decode(total) - sign * n * enc.clip) <= enc.error_bound(n))
    with pytest.raises(ValueError, match="could wrap"):
        enc.check_clients(n + 1)


def test_encoding_wraps_where_the_bound_says_it_may():
    # the check is not vacuous: twice the allowed clients at +clip wrap to a negative sum
    enc = FixedPointEncoding(clip=8.0, scale_bits=4, ring_bits=16)
    n = 2 * (enc.max_clients + 1)
    total = (enc.encode(np.array([enc.clip])) * np.uint64(n)) & np.uint64(0xFFFF)
    assert enc.decode(total)[0] != n * enc.clip


def test_encoding_refuses_what_it_cannot_represent():
    enc = FixedPointEncoding(clip=1.0)
    with pytest.raises(ValueError, match="exceeds"):
        enc.encode(np.array([0.5, -1.5]))
    with pytest.raises(ValueError, match="NaN"):
        enc.encode(np.array([np.nan]))
    with pytest.raises(ValueError, match="ring_bits"):
        FixedPointEncoding(ring_bits=65)
    with pytest.raises(ValueError, match="no room"):
        FixedPointEncoding(clip=2.0**40, scale_bits=30)


def test_pairwise_keys_agree_and_the_channel_authenticates():
    rng = np.random.default_rng(4)
    a, b = rng.bytes(32), rng.bytes(32)
    (k_ab,) = agree(a, [public_key(b)], b"label")
    (k_ba,) = agree(b, [public_key(a)], b"label")
    assert k_ab == k_ba and len(k_ab) == 32
    assert agree(a, [public_key(b)], b"other") != [k_ab]
    ciphertext = encrypt(k_ab, 3, 8, b"share")
    assert decrypt(k_ba, 3, 8, ciphertext) == b"share"
    from cryptography.exceptions import InvalidTag

    with pytest.raises(InvalidTag):
        decrypt(k_ba, 8, 3, ciphertext)  # another direction is another nonce


def test_prg_is_a_function_of_its_seed():
    rng = np.random.default_rng(5)
    seed = rng.bytes(32)
    assert np.array_equal(prg(seed, 100), prg(seed, 100))
    assert np.array_equal(prg(seed, 100)[:40], prg(seed, 40))
    assert not np.array_equal(prg(seed, 100), prg(rng.bytes(32), 100))
    assert prg(seed, 100, ring_bits=20).max() < 2**20


def test_split_many_gives_each_secret_its_own_polynomial():
    rng = np.random.default_rng(6)
    secrets = [int.from_bytes(rng.bytes(32), "little") for _ in range(3)]
    points, t = list(range(1, 8)), 4
    shares = split_many(secrets, points, t, rng)
    for secret, own in zip(secrets, shares):
        for subset in itertools.combinations(points, t):
            assert reconstruct({x: own[x] for x in subset}, t) == secret
    # independent coefficients: two polynomials differ beyond their constant terms, so the
    # shares' differences are no constant (equal coefficients have probability ~2^-768)
    diffs = {(shares[0][x] - shares[1][x]) % PRIME for x in points}
    assert len(diffs) == len(points)
    with pytest.raises(ValueError, match="threshold"):
        split_many(secrets, points, 8, rng)


@pytest.mark.parametrize("t", [1, 2, 13, 30])
def test_two_polynomials_packed_evaluate_as_each_alone(t):
    """split_many evaluates its polynomials two at a time packed in one integer: each value
    is Horner's of its own polynomial, at small and at the largest points, with the largest
    coefficients (where an overlap of the packed values would show first)."""
    from sklearn_fedmf.secure._shamir import _evaluate_pair

    rng = np.random.default_rng(t)
    first = [PRIME - 1] * t
    second = [int.from_bytes(rng.bytes(32), "little") for _ in range(t)]
    points = [1, 2, 3, 2**31 + 7, 2**32]
    values_first, values_second = _evaluate_pair(first, second, points, PRIME)
    assert values_first == [evaluate(first, x) for x in points]
    assert values_second == [evaluate(second, x) for x in points]


def test_add_prg_adds_the_prg_in_place_for_any_ring():
    rng = np.random.default_rng(7)
    seeds = [rng.bytes(32) for _ in range(3)]
    for length in (1000, 10, 3000):  # the keystream buffer is reused, shorter and longer
        base = rng.integers(0, 2**63, size=length, dtype=np.uint64)
        total = base.copy()
        assert add_prg(total, seeds[0]) is total
        add_prg(total, seeds[1], -1)
        np.testing.assert_array_equal(total, base + prg(seeds[0], length) - prg(seeds[1], length))
        low = np.uint64(2**20 - 1)
        expected = (base + prg(seeds[0], length, 20) - prg(seeds[1], length, 20)) & low
        np.testing.assert_array_equal(total & low, expected)
