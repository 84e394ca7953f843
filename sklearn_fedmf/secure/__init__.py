"""Secure aggregation: the server learns the sum of a round's uploads and no single one.

The protocol of Bonawitz et al. (CCS 2017) as pure phase functions
(:mod:`sklearn_fedmf.secure._protocol`), its primitives from ``cryptography`` (X25519,
HKDF-SHA256, AES-256-CTR, ChaCha20-Poly1305), Shamir sharing over a prime field and a
fixed-point encoding in Z_{2^k}. Needs the ``secure`` extra (``cryptography``).
"""

from ._aggregate import SecureSumResult, secure_aggregate, secure_sum  # noqa: F401
from ._encoding import FixedPointEncoding
from ._rounds import SecureAggregation

__all__ = ["FixedPointEncoding", "SecureAggregation", "secure_aggregate", "secure_sum"]
