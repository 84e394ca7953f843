"""Fixed-point encoding of float vectors in the ring Z_{2^k}.

A client's float vector ``x`` with ``|x_j| <= clip`` is encoded entry-wise as
``q_j = round(x_j 2^s) mod 2^k`` (``s = scale_bits``, ``k = ring_bits``; negative values in
two's complement); the server decodes the ring sum of ``n`` encodings as a signed integer
divided by ``2^s``. See the user guide (secure aggregation) for the no-wrap proof; in short,
``|round(x_j 2^s)| <= clip 2^s + 1/2 <= 2 clip 2^s`` (when ``clip 2^s >= 1/2``), so the integer
sum over ``n`` clients lies strictly inside ``(-2^(k-1), 2^(k-1))`` whenever
``n * 2 * clip * 2^s < 2^(k-1)``, and reducing it mod ``2^k`` loses nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["FixedPointEncoding"]


@dataclass(frozen=True)
class FixedPointEncoding:
    """How float uploads become elements of the ring Z_{2^ring_bits}.

    Parameters
    ----------
    clip : float, default=65536.0
        Largest absolute value an entry may have; a larger one is refused with a
        ``ValueError`` (clipping it silently would make the sum wrong without the server
        being able to tell).
    scale_bits : int, default=24
        An entry is rounded to a multiple of ``2^-scale_bits`` (about 6e-8 by default).
    ring_bits : int, default=64
        ``k``: encodings, masks and sums are integers mod ``2^k`` (``8 <= k <= 64``),
        ``ceil(k / 8)`` bytes each on the wire.

    Notes
    -----
    The sum of ``n`` encodings decodes to the sum of the ``n`` float vectors within
    :meth:`error_bound` per entry as long as ``n <= max_clients``; at the defaults that is
    ``2^22`` clients (about 4.2 million) and an error of ``n 2^-25`` (plus the float
    rounding of the result).

    Examples
    --------
    >>> from sklearn_fedmf.secure import FixedPointEncoding
    >>> enc = FixedPointEncoding(clip=4.0, scale_bits=16)
    >>> q = enc.encode(np.array([1.5, -0.25]))
    >>> q.dtype, enc.decode(q)
    (dtype('uint64'), array([ 1.5 , -0.25]))
    >>> enc.max_clients
    17592186044415
    """

    clip: float = 2.0**16
    scale_bits: int = 24
    ring_bits: int = 64

    def __post_init__(self):
        if not 8 <= int(self.ring_bits) <= 64 or self.ring_bits != int(self.ring_bits):
            raise ValueError(f"ring_bits must be an integer in [8, 64], got {self.ring_bits!r}.")
        if self.scale_bits != int(self.scale_bits) or not 0 <= self.scale_bits < self.ring_bits:
            raise ValueError(f"scale_bits must be an integer in [0, ring_bits), got "
                             f"{self.scale_bits!r}.")
        if not (math.isfinite(self.clip) and self.clip * 2.0**self.scale_bits >= 0.5):
            raise ValueError(f"clip must be finite with clip * 2^scale_bits >= 1/2, got "
                             f"clip={self.clip!r}.")
        if self.max_clients < 1:
            raise ValueError(f"clip={self.clip} and scale_bits={self.scale_bits} leave no room "
                             f"for even one client in a {self.ring_bits}-bit ring.")

    @property
    def max_clients(self):
        """The largest ``n`` with ``n * 2 * clip * 2^scale_bits < 2^(ring_bits - 1)``."""
        per_client = 2 * self.clip * 2.0**self.scale_bits
        n = math.ceil(2.0 ** (self.ring_bits - 1) / per_client) - 1
        # float rounding of the ratio: step to the exact largest n
        while n > 0 and n * per_client >= 2.0 ** (self.ring_bits - 1):
            n -= 1
        return n

    @property
    def element_bytes(self):
        """Bytes of one ring element on the wire."""
        return (self.ring_bits + 7) // 8

    def check_clients(self, n_clients):
        """Raise a ``ValueError`` when the sum of ``n_clients`` encodings could wrap."""
        if n_clients > self.max_clients:
            raise ValueError(
                f"The sum of {n_clients} uploads could wrap around the {self.ring_bits}-bit "
                f"ring (n * 2 * clip * 2^scale_bits must stay below 2^{self.ring_bits - 1}): "
                f"at most {self.max_clients} clients with clip={self.clip} and "
                f"scale_bits={self.scale_bits}; lower clip or scale_bits.")

    def error_bound(self, n_clients):
        """Largest absolute error per entry of a decoded sum of ``n_clients`` encodings:
        ``n 2^-(s+1)`` from rounding each entry, plus ``2^-52 n clip`` for the float64
        conversion of the integer sum. Below ``n 2^-s`` when ``clip <= 2^(51 - s)``."""
        return n_clients * (2.0 ** -(self.scale_bits + 1) + 2.0**-52 * self.clip)

    def _mask(self):
        return np.uint64((1 << self.ring_bits) - 1)

    def encode(self, x):
        """The ring elements (``uint64``) of the finite float vector ``x``."""
        x = np.asarray(x, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValueError("Cannot encode a vector with NaN or infinite entries.")
        largest = float(np.max(np.abs(x))) if x.size else 0.0
        if largest > self.clip:
            raise ValueError(f"An entry of absolute value {largest:.6g} exceeds the encoding's "
                             f"clip={self.clip}; raise clip (fewer clients then fit the ring) "
                             f"or scale the upload.")
        q = np.rint(x * 2.0**self.scale_bits).astype(np.int64).view(np.uint64)
        return q & self._mask() if self.ring_bits < 64 else q

    def decode(self, q):
        """The float vector of ring elements ``q`` (an encoding or a sum of encodings)."""
        q = np.asarray(q, dtype=np.uint64)
        if self.ring_bits == 64:
            signed = q.view(np.int64)
        else:
            signed = (q & self._mask()).astype(np.int64)
            signed[signed >= 1 << (self.ring_bits - 1)] -= 1 << self.ring_bits
        return signed.astype(np.float64) * 2.0**-self.scale_bits
