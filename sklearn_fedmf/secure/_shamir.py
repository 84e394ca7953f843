"""Shamir secret sharing over a prime field, on Python integers.

A secret ``s`` (here a 32-byte key or seed, read as an integer below ``2^256``) is the value
at 0 of a random polynomial ``f`` of degree ``t - 1`` over GF(p); share ``i`` is ``(x_i,
f(x_i))`` with distinct nonzero ``x_i``. Any ``t`` shares give ``f(0)`` by Lagrange
interpolation at 0. Any ``t - 1`` shares are uniformly distributed whatever the secret:
for every candidate secret there is exactly one polynomial of degree ``t - 1`` through
them and ``(0, secret)``, and the ``t - 1`` random coefficients make all such polynomials
equally likely. The protocol gives client ``c`` the point ``x = c + 1``.
"""

from __future__ import annotations

from ._crypto import random_bytes

__all__ = ["PRIME", "SHARE_BYTES", "split", "split_many", "reconstruct",
           "lagrange_at_zero"]

PRIME = 2**256 + 297  # the smallest prime above 2^256: every 32-byte secret is a field element
SHARE_BYTES = 33  # a field element on the wire


def _random_elements(rng, prime, count):
    """``count`` uniform elements of GF(prime), by rejection from random bytes (no modulo
    bias), drawn in batches: one call of the generator for all of them but the rejected."""
    n_bits = prime.bit_length()
    n_bytes = (n_bits + 7) // 8
    top = (1 << n_bits) - 1
    out = []
    while len(out) < count:
        need = count - len(out)
        # (a candidate is accepted with probability prime / 2^n_bits > 1/2: draw twice the need)
        raw = random_bytes(rng, 2 * need * n_bytes)
        accepted = [v for v in (int.from_bytes(raw[start:start + n_bytes], "little") & top
                                for start in range(0, len(raw), n_bytes)) if v < prime]
        out.extend(accepted[:count - len(out)])
    return out


def evaluate(coefficients, x, prime=PRIME):
    """``f(x) mod prime`` for ``f = coefficients[0] + coefficients[1] x + ...`` (Horner)."""
    value = 0
    for c in reversed(coefficients):
        value = (value * x + c) % prime
    return value


def _evaluate_all(coefficients, points, prime):
    # Horner with one reduction at the end: for the small x of the protocol (client ids) the
    # unreduced value grows by log2(x) bits per coefficient, cheaper than a reduction each step
    reversed_coefficients = coefficients[::-1]
    values = []
    for x in points:
        value = 0
        for c in reversed_coefficients:
            value = value * x + c
        values.append(value % prime)
    return values


def _evaluate_pair(first, second, points, prime):
    """:func:`_evaluate_all` of two polynomials of one degree at once: Horner on their
    coefficients packed side by side in one integer (``first + second 2^b``), ``b`` bits
    above any unreduced value of ``first`` (nonnegative coefficients below ``prime``, points
    at least 1), then each value cut out and reduced: half the interpreted steps."""
    largest = max(points)
    bits = prime.bit_length() + (len(first) - 1) * largest.bit_length() + len(first).bit_length()
    packed = [a | (b << bits) for a, b in zip(reversed(first), reversed(second))]
    low = (1 << bits) - 1
    values_first, values_second = [], []
    for x in points:
        value = 0
        for c in packed:
            value = value * x + c
        values_first.append((value & low) % prime)
        values_second.append((value >> bits) % prime)
    return values_first, values_second


def _check(secrets, points, threshold, prime):
    if not all(0 <= secret < prime for secret in secrets):
        raise ValueError(f"The secret must be in [0, prime), got {secrets}.")
    if len(set(points)) != len(points) or not all(0 < x < prime for x in points):
        raise ValueError("Share points must be distinct and in [1, prime).")
    if not 1 <= threshold <= len(points):
        raise ValueError(f"threshold must be in [1, {len(points)}] (the number of shares), "
                         f"got {threshold}.")


def split_many(secrets, points, threshold, rng=None, prime=PRIME):
    """:func:`split` of each of ``secrets`` at the same ``points`` (a list of share dicts):
    the coefficients of all the polynomials drawn at once, each polynomial its own."""
    secrets, points = [int(s) for s in secrets], list(points)
    _check(secrets, points, threshold, prime)
    drawn = _random_elements(rng, prime, len(secrets) * (threshold - 1))
    polynomials = [[secret] + drawn[i * (threshold - 1):(i + 1) * (threshold - 1)]
                   for i, secret in enumerate(secrets)]
    values = []
    for i in range(0, len(polynomials) - 1, 2):  # (two at a time, packed)
        values.extend(_evaluate_pair(polynomials[i], polynomials[i + 1], points, prime))
    if len(polynomials) % 2:
        values.append(_evaluate_all(polynomials[-1], points, prime))
    return [dict(zip(points, v)) for v in values]


def split(secret, points, threshold, rng=None, prime=PRIME):
    """Shares of ``secret`` at ``points``, any ``threshold`` of which reconstruct it.

    Parameters
    ----------
    secret : int
        In ``[0, prime)``.
    points : iterable of int
        Distinct x-coordinates in ``[1, prime)``.
    threshold : int
        ``t``: the polynomial has degree ``t - 1``; ``1 <= t <= len(points)``.
    rng : numpy.random.Generator or None
        Source of the coefficients (None: the OS, see :func:`~._crypto.random_bytes`).
    prime : int
        The field's order.

    Returns
    -------
    shares : dict
        ``{x: f(x)}``.
    """
    return split_many([secret], points, threshold, rng, prime)[0]


def lagrange_at_zero(points, prime=PRIME):
    """The Lagrange weights ``l_j(0)`` of the distinct ``points``: ``f(0) = sum_j l_j f(x_j)``
    for every polynomial of degree below ``len(points)``. Computed once per set of points."""
    points = list(points)
    n = len(points)
    # numerators prod_{m != j} x_m from prefix and suffix products
    prefix, suffix = [1] * (n + 1), [1] * (n + 1)
    for j, x in enumerate(points):
        prefix[j + 1] = prefix[j] * x % prime
    for j in range(n - 1, -1, -1):
        suffix[j] = suffix[j + 1] * points[j] % prime
    dens = []
    for j, xj in enumerate(points):
        den = 1  # (unreduced: for the protocol's small points, cheaper than a reduction a step)
        for m, xm in enumerate(points):
            if m != j:
                den *= xm - xj
        dens.append(den % prime)
    # one modular inverse for all the denominators (Montgomery's batch inversion): the
    # inverse of their product, then each inverse from the running products
    running = [1] * (n + 1)
    for j, den in enumerate(dens):
        running[j + 1] = running[j] * den % prime
    inverse = pow(running[n], -1, prime)
    weights = [0] * n
    for j in range(n - 1, -1, -1):
        weights[j] = prefix[j] * suffix[j + 1] % prime * (inverse * running[j] % prime) % prime
        inverse = inverse * dens[j] % prime
    return weights


def reconstruct(shares, threshold, prime=PRIME, weights=None):
    """The secret of ``threshold`` of ``shares`` (``{x: y}``), by Lagrange interpolation at 0.

    Uses the ``threshold`` shares of smallest ``x``. Fewer than ``threshold`` shares raise a
    ``ValueError``: they determine nothing about the secret. ``weights`` may pass
    :func:`lagrange_at_zero` of those points when many secrets share them.
    """
    if len(shares) < threshold:
        raise ValueError(f"{len(shares)} shares cannot reconstruct a secret shared with "
                         f"threshold {threshold}: at least {threshold} are needed.")
    points = sorted(shares)[:threshold]
    if weights is None:
        weights = lagrange_at_zero(points, prime)
    return sum(w * shares[x] for w, x in zip(weights, points)) % prime
