"""One secure sum of a round's uploads, every phase of the protocol run in this process."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from . import _protocol as protocol  # (the four phases, one step of each side each)
from ._encoding import FixedPointEncoding

__all__ = ["SecureSumResult", "secure_sum", "secure_aggregate"]


class SecureSumResult(NamedTuple):
    """What :func:`secure_sum` returns.

    Parameters
    ----------
    sum : ndarray
        The sum of the survivors' vectors, in the uploads' shape.
    clients : tuple of int
        The survivors: the clients whose vectors are in ``sum``.
    bytes_uploaded, bytes_downloaded : dict
        ``{phase: {client: bytes}}``: each client's message of each phase, and the server's
        message each client received to start the phase (the key list before
        ``share_keys``, its routed shares before ``masked_input``, the survivor list before
        ``unmasking``).
    seconds : dict
        ``{phase: (clients, server)}``: the clients' computing time summed over clients
        (they would run in parallel), and the server's.
    server_view : dict
        ``{phase: {client: message}}``: every message the server received, i.e. all it
        learns besides the sum (public keys, ciphertexts, masked vectors, shares).

    Examples
    --------
    >>> from sklearn_fedmf.secure import secure_sum
    >>> result = secure_sum({c: np.ones(4) for c in range(3)}, seed=0)
    >>> result.bytes_uploaded["masked_input"]  # 4 bytes of id, 4 ring elements of 8 bytes
    {0: 36, 1: 36, 2: 36}
    >>> result.server_view["masked_input"][0].vector.dtype
    dtype('uint64')
    """

    sum: np.ndarray
    clients: tuple
    bytes_uploaded: dict
    bytes_downloaded: dict
    seconds: dict
    server_view: dict

    def total_bytes(self):
        """``(up, down)``: every client's bytes sent and received, over every phase."""
        return tuple(sum(sum(per_client.values()) for per_client in side.values())
                     for side in (self.bytes_uploaded, self.bytes_downloaded))


_SERVER_KEY = 2**32  # above every client id


def _generators(seed, clients):
    """Each client's generator and the server's (clients: None, i.e. ``os.urandom``, when
    ``seed`` is None)."""
    if seed is None:
        return dict.fromkeys(clients), np.random.default_rng()
    if not isinstance(seed, np.random.SeedSequence):
        seed = np.random.SeedSequence(seed)
    return ({c: np.random.default_rng(np.random.SeedSequence(
        seed.entropy, spawn_key=(*seed.spawn_key, c))) for c in clients},
            np.random.default_rng(np.random.SeedSequence(
                seed.entropy, spawn_key=(*seed.spawn_key, _SERVER_KEY))))


def secure_sum(uploads, *, encoding=None, threshold=None, neighbours=None, seed=None,
               dropout=None):
    """The sum of the clients' vectors, computed by the secure-aggregation protocol.

    Runs the four phases of :mod:`sklearn_fedmf.secure` (advertise keys, share keys, masked
    input, unmasking) for the clients of ``uploads`` in this process, as an estimator's
    server would run them over its transport: the server's functions only ever see keys,
    ciphertexts, masked vectors and shares, never a client's vector.

    Parameters
    ----------
    uploads : dict
        ``{client: array}``: client ids (ints from 0, below ``2^32``) to float arrays of one
        shape.
    encoding : FixedPointEncoding, default=None
        The fixed-point encoding (``FixedPointEncoding()`` when None); the number of clients
        must fit its ring (:meth:`~FixedPointEncoding.check_clients`).
    threshold : int, default=None
        Shares needed to reconstruct a secret; a strict majority of the clients a secret is
        shared among when None (``n // 2 + 1``, or ``(neighbours + 1) // 2 + 1``). Fewer
        clients than this at any phase, or among a secret's holders, fail the sum.
    neighbours : int or None, default=None
        None: every client pairs with every other (SecAgg, ``O(n)`` work and bytes per
        client). An even degree: each client pairs with that many neighbours of a random
        graph the server draws (SecAgg+, ``O(neighbours)`` per client); a degree of at least
        ``n - 1`` is the complete graph.
    seed : int, numpy.random.SeedSequence or None, default=None
        Simulation: client ``c``'s keys, seeds and share coefficients come from
        ``SeedSequence(seed.entropy, spawn_key=(*seed.spawn_key, c))``, so the same seed
        gives bit-identical messages (and anyone who knows it knows the keys); the server's
        graph comes from ``spawn_key=(*seed.spawn_key, 2**32)``. None: from the OS
        (``os.urandom``), as in a deployment.
    dropout : dict, default=None
        ``{phase: clients}``: simulated clients that go offline before sending their
        message of ``phase`` (one of ``"share_keys"``, ``"masked_input"``, ``"unmasking"``)
        and do nothing after. Clients dropped before ``unmasking`` are not in the sum.

    Returns
    -------
    SecureSumResult
        The sum, the survivors, and bytes and seconds per phase.

    Raises
    ------
    FederationError
        When fewer than ``threshold`` clients take part in a phase.

    Examples
    --------
    >>> from sklearn_fedmf.secure import secure_sum
    >>> uploads = {c: np.full(3, 0.5 * c) for c in range(5)}
    >>> result = secure_sum(uploads, seed=0, dropout={"masked_input": {4}})
    >>> result.clients, np.round(result.sum, 6)
    ((0, 1, 2, 3), array([3., 3., 3.]))
    """
    encoding = FixedPointEncoding() if encoding is None else encoding
    clients = sorted(uploads)
    if not clients:
        raise ValueError("secure_sum needs at least one client's upload.")
    if not all(isinstance(c, (int, np.integer)) and 0 <= c < 2**32 for c in clients):
        raise ValueError("Client ids must be integers in [0, 2^32).")
    clients = [int(c) for c in clients]
    shape = np.shape(uploads[clients[0]])
    if any(np.shape(uploads[c]) != shape for c in clients):
        raise ValueError("Every upload of a secure sum must have the same shape.")
    encoding.check_clients(len(clients))
    holders = len(clients) if neighbours is None else min(int(neighbours) + 1, len(clients))
    threshold = protocol.default_threshold(holders) if threshold is None else int(threshold)
    if not 1 <= threshold <= holders:
        raise ValueError(f"threshold must be in [1, {holders}] (the clients a secret is shared "
                         f"among), got {threshold}.")
    dropout = {} if dropout is None else dropout
    unknown = set(dropout) - set(protocol.PHASES[1:])
    if unknown:
        raise ValueError(f"dropout phases must be among {protocol.PHASES[1:]}, "
                         f"got {sorted(unknown)}.")
    gone = set()
    up = {p: {} for p in protocol.PHASES}
    down = {p: {} for p in protocol.PHASES}
    seconds = {}

    def run_clients(phase, online, step):
        """Each online client's step, minus those that drop now; with their bytes."""
        gone.update(dropout.get(phase, ()))
        states, messages, t0 = {}, {}, time.perf_counter()
        for c in online:
            if c not in gone:
                states[c], messages[c] = step(c)
                up[phase][c] = messages[c].nbytes
        return states, messages, time.perf_counter() - t0

    rngs, server_rng = _generators(seed, clients)
    states, adverts, t_c = run_clients(
        "advertise_keys", clients, lambda c: protocol.client_advertise_keys(c, threshold, rngs[c]))
    t0 = time.perf_counter()
    keys = protocol.server_collect_keys(adverts, threshold, neighbours, server_rng)
    seconds["advertise_keys"] = (t_c, time.perf_counter() - t0)

    down["share_keys"] = {c: sum(a.nbytes for a in keys[c].values()) for c in keys}
    states, shares, t_c = run_clients(
        "share_keys", list(keys), lambda c: protocol.client_share_keys(states[c], keys[c]))
    t0 = time.perf_counter()
    routed = protocol.server_route_shares(shares, threshold)
    seconds["share_keys"] = (t_c, time.perf_counter() - t0)

    down["masked_input"] = {c: m.nbytes for c, m in routed.items()}
    states, masked, t_c = run_clients(
        "masked_input", list(routed),
        lambda c: protocol.client_masked_input(states[c], routed[c], uploads[c], encoding))
    t0 = time.perf_counter()
    survivors = protocol.server_collect_masked(masked, routed, threshold)
    seconds["masked_input"] = (t_c, time.perf_counter() - t0)

    down["unmasking"] = dict.fromkeys(survivors.clients, survivors.nbytes)
    _, unmasking, t_c = run_clients(
        "unmasking", survivors.clients, lambda c: protocol.client_unmask(states[c], survivors))
    t0 = time.perf_counter()
    total = protocol.server_unmask(keys, routed, masked, unmasking, threshold, encoding)
    seconds["unmasking"] = (t_c, time.perf_counter() - t0)
    view = {"advertise_keys": adverts, "share_keys": shares, "masked_input": masked,
            "unmasking": unmasking}
    return SecureSumResult(total.reshape(shape), survivors.clients, up, down, seconds, view)


def secure_aggregate(uploads, *, encoding=None, threshold=None, neighbours=None, seed=None,
                     dropout=None):
    """The sums of a round's uploads by one secure sum, as an estimator's server needs them.

    Each upload is a dict of named arrays and numbers, as the protocols' uploads are (for
    example ``{"W": weight * W_p, "weight": weight}``: a client applies its weight itself, so
    that the server's weighted mean is a ratio of two sums). The entries of every upload are
    laid end to end in the order of their sorted names, summed by :func:`secure_sum` as one
    vector, and the sum is cut back into the same names and shapes.

    Parameters
    ----------
    uploads : dict
        ``{client: {name: array or number}}``, the same names and shapes for every client.
    encoding : FixedPointEncoding, default=None
        As in :func:`secure_sum`; every entry of every upload must lie within its ``clip``.
    threshold : int, default=None
        As in :func:`secure_sum`.
    neighbours : int or None, default=None
        As in :func:`secure_sum`.
    seed : int, numpy.random.SeedSequence or None, default=None
        As in :func:`secure_sum` (a fit would pass one spawned per round).
    dropout : dict, default=None
        As in :func:`secure_sum`.

    Returns
    -------
    sums : dict
        ``{name: sum over the survivors}``, arrays in the uploads' shapes, numbers as floats.
    result : SecureSumResult
        The protocol's record (survivors, bytes and seconds per phase, what the server saw).

    Examples
    --------
    >>> from sklearn_fedmf.secure import secure_aggregate
    >>> W = {c: np.full((2, 2), float(c)) for c in range(4)}  # client c's copy, weight c + 1
    >>> uploads = {c: {"W": (c + 1) * W[c], "weight": c + 1.0} for c in range(4)}
    >>> sums, result = secure_aggregate(uploads, seed=0)
    >>> sums["weight"], np.round(sums["W"] / sums["weight"], 6)  # the weighted mean
    (10.0, array([[2., 2.],
           [2., 2.]]))
    """
    if not uploads:
        raise ValueError("secure_aggregate needs at least one client's upload.")
    first = next(iter(uploads.values()))
    if not isinstance(first, Mapping):
        raise TypeError(f"An upload must be a dict of named arrays, got "
                        f"{type(first).__name__}; use secure_sum for plain vectors.")
    names = sorted(first)
    shapes = {name: np.shape(first[name]) for name in names}
    vectors = {}
    for client, upload in uploads.items():
        if not isinstance(upload, Mapping) or sorted(upload) != names or any(
                np.shape(upload[name]) != shapes[name] for name in names):
            raise ValueError(f"Client {client}'s upload does not have the names and shapes "
                             f"of the others ({shapes}).")
        vectors[client] = np.concatenate(
            [np.ravel(np.asarray(upload[name], dtype=np.float64)) for name in names])
    result = secure_sum(vectors, encoding=encoding, threshold=threshold,
                        neighbours=neighbours, seed=seed, dropout=dropout)
    sums, start = {}, 0
    for name in names:
        size = int(np.prod(shapes[name], dtype=np.int64))
        part = result.sum[start:start + size]
        sums[name] = float(part[0]) if shapes[name] == () else part.reshape(shapes[name])
        start += size
    return sums, result
