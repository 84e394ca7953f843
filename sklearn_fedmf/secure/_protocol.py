"""The secure-aggregation protocol of Bonawitz et al. (CCS 2017), as pure phase functions,
with the sparse neighbour graph of SecAgg+ (Bell et al., CCS 2020) as an option.

One aggregation runs four phases. In each, every client still online runs its client
function on its state and the server's last message, and the server turns the clients'
messages into the next one::

    phase            client function                      server function
    advertise_keys   client_advertise_keys  -> KeyAdvertisement   server_collect_keys
    share_keys       client_share_keys      -> EncryptedShares    server_route_shares
    masked_input     client_masked_input    -> MaskedInput        server_collect_masked
    unmasking        client_unmask          -> UnmaskingShares    server_unmask -> the sum

Client ``u`` draws two X25519 key pairs (a channel pair, whose agreement with ``v``'s keys
an authenticated channel ``u -> v`` through the server, and a mask pair, whose agreement
seeds the pairwise mask of ``u`` and ``v``) and a self-mask seed ``b_u``. It Shamir-shares
``b_u`` and its mask private key among its neighbours that advertised keys (``U1``; in
SecAgg every other client, in SecAgg+ those of a random graph of even degree the server
draws), encrypted for each recipient. Its masked input is ``y_u = q_u + PRG(b_u) +
sum_{v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv) mod 2^k`` over its neighbours ``v`` in ``U2``
(``q_u`` its fixed-point encoding, ``U2`` the clients whose shares went out). The pairwise
masks of two clients that both send ``y`` cancel in the sum; for every client ``v`` of
``U2`` whose ``y`` did not arrive, its neighbours send their shares of ``v``'s mask key so
that the server can remove ``v``'s pairwise masks from the survivors' inputs; for every
survivor, they send their shares of its self-mask seed. A client never reveals both kinds
of share for the same client.

Threat model: the server is honest but curious (it follows the protocol and reads all it
receives). Signatures and the consistency round of the actively secure version are not
implemented. By default the threshold ``t`` of the shares is a strict majority of the
clients a secret is shared among, so no two disjoint groups of them can each reach it.
Every message is a dataclass whose ``nbytes`` is its size on the wire (client ids as 4
bytes, field elements as 33 bytes, ring elements as ``ceil(k / 8)`` bytes), which the
engine's byte counts read.

Randomness: with a numpy ``Generator`` a client's keys, seed and share coefficients are
reproducible, a *simulation* property (whoever knows the seed knows the keys); with None
they come from ``os.urandom``, as a deployment needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from ..exceptions import FederationError
from ._crypto import (
    CHANNEL_LABEL,
    KEY_BYTES,
    MASK_LABEL,
    add_prg,
    agree,
    channel_cipher,
    decrypt,
    encrypt,
    load_private,
    public_key,
    random_bytes,
)
from ._shamir import SHARE_BYTES, lagrange_at_zero, reconstruct, split_many

__all__ = [
    "PHASES", "ID_BYTES", "default_threshold", "neighbour_graph",
    "KeyAdvertisement", "EncryptedShares", "MaskedInput", "Survivors", "UnmaskingShares",
    "ClientState", "client_advertise_keys", "client_share_keys", "client_masked_input",
    "client_unmask", "server_collect_keys", "server_route_shares", "server_collect_masked",
    "server_unmask",
]

PHASES = ("advertise_keys", "share_keys", "masked_input", "unmasking")
ID_BYTES = 4


def default_threshold(n_clients):
    """A strict majority, ``n // 2 + 1``: the default number of shares that reconstruct."""
    return n_clients // 2 + 1


def _require(count, threshold, what):
    if count < threshold:
        raise FederationError(
            f"Secure aggregation failed: only {count} clients {what}, fewer than the threshold "
            f"{threshold}; the masks cannot be removed, so the round has no sum.")


# ---------------------------------------------------------------------------- messages
@dataclass(frozen=True)
class KeyAdvertisement:
    """Client ``client``'s two public keys (phase ``advertise_keys``)."""

    client: int
    channel_key: bytes
    mask_key: bytes

    @property
    def nbytes(self):
        return ID_BYTES + len(self.channel_key) + len(self.mask_key)


@dataclass(frozen=True)
class EncryptedShares:
    """Ciphertexts of shares. Uploaded by ``client`` (``{recipient: ciphertext}``), or routed
    by the server to ``client`` (``{sender: ciphertext}``)."""

    client: int
    ciphertexts: Mapping[int, bytes]

    @property
    def nbytes(self):
        return ID_BYTES * (1 + len(self.ciphertexts)) + sum(map(len, self.ciphertexts.values()))


@dataclass(frozen=True)
class MaskedInput:
    """Client ``client``'s masked, encoded vector: ring elements of ``element_bytes`` each."""

    client: int
    vector: np.ndarray
    element_bytes: int = 8

    @property
    def nbytes(self):
        return ID_BYTES + self.vector.size * self.element_bytes


@dataclass(frozen=True)
class Survivors:
    """The clients whose masked input reached the server (phase ``unmasking``'s request)."""

    clients: tuple

    @property
    def nbytes(self):
        return ID_BYTES * len(self.clients)


@dataclass(frozen=True)
class UnmaskingShares:
    """Client ``client``'s shares of the survivors' self-mask seeds and of the dropped
    clients' mask keys, ``{owner: share}`` each (two lists with their lengths on the wire)."""

    client: int
    self_mask_shares: Mapping[int, int]
    mask_key_shares: Mapping[int, int]

    @property
    def nbytes(self):
        n = len(self.self_mask_shares) + len(self.mask_key_shares)
        return 3 * ID_BYTES + n * (ID_BYTES + SHARE_BYTES)


@dataclass(frozen=True)
class ClientState:
    """What a client keeps between the phases; it never leaves the client."""

    client: int
    threshold: int
    channel_private: bytes
    mask_private: bytes
    self_mask_seed: bytes
    rng: Any = field(default=None, repr=False)
    keys: Mapping[int, KeyAdvertisement] | None = None
    channels: Mapping[int, bytes] | None = None
    own_shares: tuple | None = None
    received: Mapping[int, bytes] | None = None
    mask_public: bytes | None = None  # its own advertised mask key (no recomputation)

    # Its two private keys as loaded X25519 keys and its channels' ciphers, made once (loading
    # a key computes its public key, a scalar multiplication): not fields, so never encoded,
    # pickled or compared; a state rebuilt elsewhere (a Flower site's Context) makes them
    # again from its fields, which hold the same keys.
    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_transient"}

    def _live(self):
        return self.__dict__.setdefault("_transient", {})

    def loaded(self, name):
        """The loaded X25519 key of field ``name`` (``channel_private`` or ``mask_private``)."""
        live = self._live()
        if name not in live:
            live[name] = load_private(getattr(self, name))
        return live[name]

    def evolve(self, **changes):
        """:func:`dataclasses.replace` that keeps the loaded keys and ciphers: a copy of the
        attributes (a state has no ``__post_init__`` to rerun), a fifth of ``replace``'s
        time, which a client pays at each of its steps."""
        if not changes.keys() <= _STATE_FIELDS:
            raise TypeError(f"ClientState has no fields {sorted(changes.keys() - _STATE_FIELDS)}.")
        new = object.__new__(ClientState)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new


_STATE_FIELDS = frozenset(f.name for f in fields(ClientState))


def _to_int(key):
    return int.from_bytes(key, "little")


def _to_key(value):
    if value >= 1 << (8 * KEY_BYTES):
        raise FederationError("Secure aggregation failed: shares reconstructed a value that is "
                              "no 32-byte key (inconsistent shares).")
    return value.to_bytes(KEY_BYTES, "little")


# ----------------------------------------------------------------- phase 0: advertise keys
def client_advertise_keys(client, threshold, rng=None):
    """Draw the client's key pairs and self-mask seed; advertise the public keys.

    Returns ``(state, KeyAdvertisement)``. ``rng``: a numpy ``Generator`` (simulation,
    reproducible) or None (``os.urandom``).
    """
    # (one draw: the same bytes as three, from a numpy Generator or the OS)
    drawn = random_bytes(rng, 3 * KEY_BYTES)
    channel_private, mask_private, self_mask_seed = (
        drawn[i * KEY_BYTES:(i + 1) * KEY_BYTES] for i in range(3))
    state = ClientState(client, threshold, channel_private, mask_private, self_mask_seed, rng)
    mask_public = public_key(state.loaded("mask_private"))
    state = state.evolve(mask_public=mask_public)
    return state, KeyAdvertisement(client, public_key(state.loaded("channel_private")),
                                   mask_public)


def neighbour_graph(clients, degree, rng):
    """SecAgg+'s sparse graph: a Harary graph ``H(degree, n)`` on a random order of ``clients``.

    Each client is joined to the ``degree / 2`` clients on either side of it on a ring of the
    clients in random order; ``degree`` must be even. With ``degree >= n - 1`` every pair is
    joined (SecAgg). Returns ``{client: sorted neighbours}``.
    """
    clients = sorted(clients)
    n = len(clients)
    if degree != int(degree) or degree < 2 or degree % 2:
        raise ValueError(f"The neighbour degree must be an even integer >= 2, got {degree!r}.")
    if degree >= n - 1:
        return {c: [v for v in clients if v != c] for c in clients}
    order = [clients[i] for i in rng.permutation(n)]
    graph = {c: set() for c in clients}
    for i, c in enumerate(order):
        for step in range(1, degree // 2 + 1):
            v = order[(i + step) % n]
            graph[c].add(v)
            graph[v].add(c)
    return {c: sorted(graph[c]) for c in clients}


def server_collect_keys(adverts, threshold, degree=None, rng=None):
    """``{client: KeyAdvertisement}`` (``U1``) -> ``{client: its key list}``.

    With ``degree`` None every client receives every key (SecAgg); with an even ``degree``
    the server draws a :func:`neighbour_graph` from ``rng`` and each client receives its
    neighbours' keys and its own (SecAgg+). Every key list must hold ``threshold`` clients.
    """
    _require(len(adverts), threshold, "advertised keys")
    keys = {}
    for c in sorted(adverts):
        if adverts[c].client != c:
            raise FederationError(f"Client {c} sent the keys of client {adverts[c].client}.")
        keys[c] = adverts[c]
    public = [k for a in keys.values() for k in (a.channel_key, a.mask_key)]
    if len(set(public)) != len(public):
        raise FederationError("Secure aggregation failed: two advertised public keys are equal.")
    if degree is None or degree >= len(keys) - 1:
        return dict.fromkeys(keys, keys)  # one list, shared by every client
    if degree + 1 < threshold:
        raise ValueError(f"A neighbourhood of {degree + 1} clients cannot hold the threshold "
                         f"{threshold} of shares; raise the degree or lower the threshold.")
    graph = neighbour_graph(keys, degree, rng)
    return {c: {v: keys[v] for v in sorted([c, *graph[c]])} for c in keys}


# -------------------------------------------------------------------- phase 1: share keys
def client_share_keys(state, keys):
    """Shamir-share the self-mask seed and the mask private key among the clients of its key
    list ``keys`` (itself included) and encrypt each recipient's pair of shares for it.
    Returns ``(state, EncryptedShares)``."""
    u, t = state.client, state.threshold
    own = state.mask_public or public_key(state.loaded("mask_private"))
    if u not in keys or keys[u].mask_key != own:
        raise ValueError(f"The server's key list does not hold client {u}'s own keys.")
    if len(keys) < t:
        raise ValueError(f"The key list has {len(keys)} clients, fewer than the threshold {t}.")
    points = [v + 1 for v in keys]
    seed_shares, key_shares = split_many(
        [_to_int(state.self_mask_seed), _to_int(state.mask_private)], points, t, state.rng)
    peers = [v for v in keys if v != u]
    channels = dict(zip(peers, agree(state.loaded("channel_private"),
                                     [keys[v].channel_key for v in peers], CHANNEL_LABEL)))
    ciphers = {v: channel_cipher(channels[v]) for v in peers}  # (kept to decrypt: _live)
    ciphertexts = {}
    own = u.to_bytes(ID_BYTES, "little")
    for v in peers:
        plaintext = b"".join((own, v.to_bytes(ID_BYTES, "little"),
                              seed_shares[v + 1].to_bytes(SHARE_BYTES, "little"),
                              key_shares[v + 1].to_bytes(SHARE_BYTES, "little")))
        ciphertexts[v] = encrypt(ciphers[v], u, v, plaintext)
    state = state.evolve(keys=dict(keys), channels=channels,
                         own_shares=(seed_shares[u + 1], key_shares[u + 1]))
    state._live()["ciphers"] = ciphers
    return state, EncryptedShares(u, ciphertexts)


def server_route_shares(uploads, threshold):
    """``{client: EncryptedShares}`` (``U2``) -> ``{recipient: EncryptedShares}`` routed to
    each client of ``U2``: the ciphertexts the other clients of ``U2`` sent it."""
    senders = sorted(uploads)
    _require(len(senders), threshold, "shared their keys")
    inbox = {v: {} for v in senders}  # one pass over the ciphertexts (not one per recipient)
    for u in senders:
        for v, ciphertext in uploads[u].ciphertexts.items():
            if v in inbox:
                inbox[v][u] = ciphertext
    return {v: EncryptedShares(v, inbox[v]) for v in senders}


# ------------------------------------------------------------------ phase 2: masked input
def _add_pairwise_masks(total, mask_private, peers, keys, own):
    """``total += sum_{v > own} PRG(s_uv) - sum_{v < own} PRG(s_uv)`` over ``peers`` (mod
    2^64, in place: one keystream buffer for all the peers)."""
    seeds = agree(mask_private, [keys[v].mask_key for v in peers], MASK_LABEL)
    for v, seed in zip(peers, seeds):
        add_prg(total, seed, 1 if v > own else -1)
    return total


def client_masked_input(state, routed, vector, encoding):
    """Encode ``vector`` and add the self mask and the pairwise masks with every client that
    shared its keys (``routed``'s senders). Returns ``(state, MaskedInput)``.

    A ``uint64`` ``vector`` is taken as ring elements already (e.g. the change of an
    encoding since the client's last upload, :mod:`sklearn_fedmf.secure._rounds`)."""
    u = state.client
    if state.keys is None:
        raise ValueError("client_masked_input runs after client_share_keys.")
    peers = sorted(routed.ciphertexts)
    if len(peers) + 1 < state.threshold or not set(peers) <= set(state.keys) - {u}:
        raise ValueError(f"Client {u} got shares from {len(peers)} other clients of the key "
                         f"list; at least {state.threshold - 1} are needed.")
    vector = np.ravel(vector)
    y = vector.copy() if vector.dtype == np.uint64 else encoding.encode(vector)
    add_prg(y, state.self_mask_seed)
    _add_pairwise_masks(y, state.loaded("mask_private"), peers, state.keys, u)
    if encoding.ring_bits < 64:
        y &= np.uint64((1 << encoding.ring_bits) - 1)
    state = state.evolve(received=dict(routed.ciphertexts))
    return state, MaskedInput(u, y, encoding.element_bytes)


def server_collect_masked(uploads, shared, threshold):
    """``{client: MaskedInput}`` -> the :class:`Survivors` (``U3``); ``shared`` is ``U2``."""
    survivors = tuple(sorted(uploads))
    if not set(survivors) <= set(shared):
        raise FederationError("A masked input came from a client that did not share its keys.")
    _require(len(survivors), threshold, "sent their masked input")
    return Survivors(survivors)


# --------------------------------------------------------------------- phase 3: unmasking
def client_unmask(state, survivors):
    """Decrypt the received shares; send the survivors' self-mask seed shares and the dropped
    clients' mask key shares, never both for one client. Returns ``(state,
    UnmaskingShares)``; the state no longer holds the received ciphertexts."""
    u = state.client
    if state.received is None:
        raise ValueError("client_unmask runs after client_masked_input.")
    alive = set(survivors.clients)
    shared = set(state.received) | {u}
    if u not in alive or len(alive & shared) < state.threshold:
        raise ValueError(f"Client {u} refuses to unmask: the survivor list does not hold "
                         f"itself and at least {state.threshold} of the clients it shares with.")
    seed_shares = {u: state.own_shares[0]}
    key_shares = {}
    own = u.to_bytes(ID_BYTES, "little")
    seed_at, key_at = 2 * ID_BYTES, 2 * ID_BYTES + SHARE_BYTES
    channels = state._live().get("ciphers") or state.channels
    for v, ciphertext in state.received.items():
        plaintext = decrypt(channels[v], v, u, ciphertext)
        if plaintext[:seed_at] != v.to_bytes(ID_BYTES, "little") + own:
            sender = int.from_bytes(plaintext[:ID_BYTES], "little")
            recipient = int.from_bytes(plaintext[ID_BYTES:seed_at], "little")
            raise ValueError(f"A share routed from client {v} to {u} names {sender} -> "
                             f"{recipient}.")
        if v in alive:
            seed_shares[v] = int.from_bytes(plaintext[seed_at:key_at], "little")
        else:
            key_shares[v] = int.from_bytes(plaintext[key_at:], "little")
    state._live().clear()  # (the keys and ciphers of this exchange are spent)
    return (state.evolve(received=None, channels=None),
            UnmaskingShares(u, seed_shares, key_shares))


def server_unmask(keys, shared, masked, uploads, threshold, encoding, decode=True,
                  summed=None):
    """The decoded sum of the survivors' vectors (its ring elements when ``decode`` is False).

    Parameters
    ----------
    keys : dict
        The clients' key lists (:func:`server_collect_keys`).
    shared : collection of int
        ``U2``, the clients whose shares were routed.
    masked : dict
        ``{client: MaskedInput}`` of the survivors.
    uploads : dict
        ``{client: UnmaskingShares}``.
    threshold : int
    encoding : FixedPointEncoding
    decode : bool, default=True
        False: return the ring sum (``uint64``) undecoded.
    summed : ndarray of uint64 or None, default=None
        The ring sum of the survivors' masked vectors when the server added them up as they
        arrived (it is unmasked in place); ``masked`` then only names the survivors (its
        values are not read).

    Returns
    -------
    total : ndarray of float64
        ``sum_{u in survivors} vector_u`` within ``encoding.error_bound(len(masked))``.
    """
    _require(len(uploads), threshold, "sent unmasking shares")
    survivors = sorted(masked)
    dropped = sorted(set(shared) - set(survivors))
    cache = {}  # Lagrange weights per set of points (one set in SecAgg)
    # {owner: {point: share}} of each kind, in one pass over the uploads (not one per owner)
    held = {"self_mask_shares": {}, "mask_key_shares": {}}
    for c in sorted(uploads):
        for kind, by_owner in held.items():
            for owner, share in getattr(uploads[c], kind).items():
                by_owner.setdefault(owner, {})[c + 1] = share

    def secret_of(owner, kind):
        shares = held[kind].get(owner, {})
        if len(shares) < threshold:
            raise FederationError(
                f"Secure aggregation failed: only {len(shares)} clients sent shares of client "
                f"{owner}'s secret, fewer than the threshold {threshold}; the masks cannot be "
                f"removed, so the round has no sum.")
        points = tuple(sorted(shares)[:threshold])
        if points not in cache:
            cache[points] = lagrange_at_zero(points)
        return _to_key(reconstruct(shares, threshold, weights=cache[points]))

    ring_bits = encoding.ring_bits
    if summed is None:
        total = np.zeros(masked[survivors[0]].vector.size, dtype=np.uint64)
        for u in survivors:
            total += masked[u].vector
    else:
        total = summed
    for v in survivors:
        add_prg(total, secret_of(v, "self_mask_shares"), -1)
    alive = set(survivors)
    for v in dropped:
        private = load_private(secret_of(v, "mask_key_shares"))  # (loaded once for both)
        if public_key(private) != keys[v][v].mask_key:
            raise FederationError(f"Secure aggregation failed: the shares of client {v}'s mask "
                                  f"key reconstruct another key.")
        # survivor u added +PRG(s_uv) when v > u and -PRG(s_uv) when v < u: the negation
        # of v's own pairwise sum over its surviving neighbours, which is added back
        peers = [u for u in keys[v] if u in alive]
        _add_pairwise_masks(total, private, peers, keys[v], v)
    if ring_bits < 64:
        total &= np.uint64((1 << ring_bits) - 1)
    return encoding.decode(total) if decode else total
