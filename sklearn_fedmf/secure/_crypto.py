"""The cryptographic primitives of secure aggregation, all from ``cryptography``.

Nothing here is a hand-written cipher or curve: X25519 key agreement, HKDF-SHA256,
the AES-256-CTR keystream as a pseudo-random generator (about twice ChaCha20's speed with
AES instructions, measured) and ChaCha20-Poly1305 as the
authenticated channel between two clients are ``cryptography``'s (OpenSSL's). This module
only fixes how the protocol calls them (key sizes, nonces, domain-separation labels).
"""

from __future__ import annotations

import os
import threading

import numpy as np

__all__ = ["KEY_BYTES", "random_bytes", "load_private", "public_key", "agree", "prg", "add_prg",
           "encrypt", "decrypt", "channel_cipher", "load_primitives"]

# cryptography's primitives, imported on first use (load_primitives): the engine imports
# this package (sklearn_fedmf.engine._exchange), and a fit without secure aggregation needs neither
# the optional package nor its import time (~0.3 s)
hashes = serialization = X25519PrivateKey = X25519PublicKey = None
Cipher = algorithms = modes = ChaCha20Poly1305 = HKDF = None
_RAW = None


def load_primitives():
    """Import ``cryptography``'s primitives (once); a clear error without the ``secure``
    extra."""
    global hashes, serialization, X25519PrivateKey, X25519PublicKey, Cipher, algorithms
    global modes, ChaCha20Poly1305, HKDF, _RAW
    if _RAW is not None:
        return
    try:
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric.x25519 import (
            X25519PrivateKey,
            X25519PublicKey,
        )
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
        raise ModuleNotFoundError(
            "Secure aggregation needs the 'cryptography' package: "
            "pip install 'sklearn_fedmf[secure]'.", name="cryptography") from exc
    _RAW = (serialization.Encoding.Raw, serialization.PublicFormat.Raw)


KEY_BYTES = 32  # X25519 keys, HKDF outputs, PRG seeds and channel keys
TAG_BYTES = 16  # ChaCha20-Poly1305's authentication tag

# HKDF labels: one shared secret never gives the same key for two purposes
MASK_LABEL = b"sklearn_fedmf secagg pairwise mask"
CHANNEL_LABEL = b"sklearn_fedmf secagg channel"



def random_bytes(rng, n):
    """``n`` random bytes: from the numpy ``Generator`` ``rng`` in a simulation (reproducible,
    *not* secret from whoever knows the seed), from the OS (``os.urandom``) when ``rng`` is
    None, as a real deployment must."""
    return os.urandom(n) if rng is None else rng.bytes(n)


def load_private(private):
    """The X25519 private key of the raw 32 bytes ``private``. Loading derives its public key
    (OpenSSL computes it on import: a scalar multiplication, ~ one agreement), so a party
    loads each of its keys once and passes the loaded key to :func:`public_key` and
    :func:`agree`."""
    load_primitives()
    return X25519PrivateKey.from_private_bytes(private)


def public_key(private):
    """The raw 32-byte X25519 public key of the private key ``private`` (raw 32 bytes, or
    loaded by :func:`load_private`)."""
    if isinstance(private, bytes):
        private = load_private(private)
    return private.public_key().public_bytes(*_RAW)


def agree(private, peer_publics, label):
    """X25519 key agreement of ``private`` (raw 32 bytes, or loaded by :func:`load_private`)
    with each of ``peer_publics``, each followed by HKDF-SHA256 to a 32-byte key for
    ``label`` (one list of keys).

    Symmetric: ``agree(a, [public_key(b)], l) == agree(b, [public_key(a)], l)``.
    """
    own = load_private(private) if isinstance(private, bytes) else private
    return [HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=label).derive(
        own.exchange(X25519PublicKey.from_public_bytes(peer))) for peer in peer_publics]


# the keystream is written into the words; update_into asks for one more block of room
_SLACK_WORDS = 2  # AES's 16-byte block, in 64-bit words
_ZEROS = [memoryview(bytes(0))]  # the largest zero plaintext made so far (read-only)
_SCRATCH = threading.local()  # a keystream buffer per thread, reused across expansions
_CTR = []  # the zero counter block's mode object, made once (immutable)


def _zeros(n):
    """``n`` zero bytes (a view of one shared buffer, grown when needed)."""
    if len(_ZEROS[0]) < n:
        _ZEROS[0] = memoryview(bytes(max(n, 2 * len(_ZEROS[0]))))
    return _ZEROS[0][:n]


def _ctr():
    """The zero counter block's mode object, made once (immutable)."""
    if not _CTR:
        load_primitives()
        _CTR.append(modes.CTR(bytes(16)))
    return _CTR[0]


def _keystream(seed, out, length):
    """The first ``length`` little-endian 64-bit words of the AES-256-CTR keystream under key
    ``seed`` (zero counter block: every seed of the protocol is fresh for one expansion),
    written into ``out`` (``uint64``, at least ``length + _SLACK_WORDS`` long)."""
    mode = _ctr()  # (first: it loads the primitives)
    encryptor = Cipher(algorithms.AES(seed), mode).encryptor()
    encryptor.update_into(_zeros(8 * length), memoryview(out).cast("B"))
    return out[:length]


def prg(seed, length, ring_bits=64):
    """``length`` ring elements of Z_{2^ring_bits} (as ``uint64``) expanded from a 32-byte seed.

    The AES-256-CTR keystream under key ``seed`` read as little-endian 64-bit words, reduced
    mod ``2^ring_bits``: uniform on the ring when the seed is (AES-CTR is a PRG as long as
    AES is a pseudo-random permutation; 2^64 words is far beyond any vector here).
    """
    words = _keystream(seed, np.empty(length + _SLACK_WORDS, dtype="<u8"), length)
    if words.dtype != np.uint64:  # (a big-endian machine)
        words = words.astype(np.uint64)
    if ring_bits < 64:
        words &= np.uint64((1 << ring_bits) - 1)
    return words


_NATIVE = np.dtype("<u8") == np.dtype(np.uint64)  # (little-endian: the keystream's words)


def add_prg(total, seed, sign=1):
    """``total += sign * PRG(seed)`` mod 2^64 in place (``total``: ``uint64``), without a new
    array per expansion. Reducing the result mod ``2^k`` afterwards gives the same as adding
    :func:`prg` ``(seed, len(total), k)``, since ``2^k`` divides ``2^64``."""
    # (:func:`_keystream` inlined, with this thread's buffer and its byte view kept: a
    # protocol's expansions are many and short, so their Python overhead is most of their cost)
    length = total.size
    scratch = getattr(_SCRATCH, "words", None)
    if scratch is None or scratch.size < length + _SLACK_WORDS:
        scratch = _SCRATCH.words = np.empty(length + _SLACK_WORDS, dtype="<u8")
        _SCRATCH.bytes = memoryview(scratch).cast("B")
    mode = _ctr()
    Cipher(algorithms.AES(seed), mode).encryptor().update_into(_zeros(8 * length),
                                                               _SCRATCH.bytes)
    words = scratch[:length] if _NATIVE else scratch[:length].astype(np.uint64)
    if sign > 0:
        np.add(total, words, out=total)
    else:
        np.subtract(total, words, out=total)
    return total


def _nonce(sender, recipient):
    # the channel key of a pair is the same both ways: the direction makes each nonce unique
    # (6 little-endian bytes each, packed in one conversion)
    if sender >> 48:
        raise OverflowError(f"A client id must be below 2^48, got {sender}.")
    return (sender | recipient << 48).to_bytes(12, "little")


def channel_cipher(key):
    """The ChaCha20-Poly1305 cipher of the 32-byte channel key ``key`` (made once for a
    channel's encryption and decryption)."""
    load_primitives()
    return ChaCha20Poly1305(key)


def encrypt(key, sender, recipient, plaintext):
    """ChaCha20-Poly1305 encryption of ``plaintext`` from ``sender`` to ``recipient``
    (``key``: 32 bytes, or its :func:`channel_cipher`)."""
    cipher = channel_cipher(key) if isinstance(key, bytes) else key
    return cipher.encrypt(_nonce(sender, recipient), plaintext, None)


def decrypt(key, sender, recipient, ciphertext):
    """The plaintext of :func:`encrypt`; raises ``cryptography.exceptions.InvalidTag`` when the
    ciphertext was altered or is not from ``sender`` to ``recipient`` under ``key``."""
    cipher = channel_cipher(key) if isinstance(key, bytes) else key
    return cipher.decrypt(_nonce(sender, recipient), ciphertext, None)
