"""Secure aggregation inside a fit: the protocol's phases as rounds of messages through the
engine's transport.

A protocol whose server needs only the sum of a round's uploads declares it with
:class:`~sklearn_fedmf.engine._federation.SummableUploads`. With ``secure_aggregation=True`` the
transport keeps each client's upload on the client (the engine only learns that it is
ready), and the fit's exchange (:class:`~sklearn_fedmf.engine._exchange.SecureExchange`, which the
engine calls) runs the four phases of :mod:`sklearn_fedmf.secure._protocol` as four more
transport calls::

    secure_advertise_keys  -> KeyAdvertisement   (every client of the round, dropped ones too)
    secure_share_keys      -> EncryptedShares
    secure_masked_input    -> SecureInput        (the clients whose upload is ready)
    secure_unmask          -> UnmaskingShares    (the survivors)

The server's message of a secure phase differs per client (its key list, its routed shares):
it is a :class:`PerClient` and each client receives its own entry.
A client's work in those phases is :func:`client_secure_phase`; what it keeps between them
(its keys, its held upload, and for a cumulative exchange the encoding it last sent) is its
*secure slot*, held by the transport next to its state.

Cumulative exchanges (FedMC-ADMM, FedMGS, FedMAvg's Grams): the server needs every client's
last value, stale ones included. A client then sends the change of its encoded value since
the last one that reached a sum (ring elements, so the change is exact), and the server
keeps the running ring sum: its decoding is the sum of the clients' current encodings,
within the encoding's bound however many rounds ran (nothing accumulates). To compute that
change, a client whose upload is smaller than its encoding (a one-user FedMGS client: its
few rated items against a dense vector over all items) keeps the upload it last sent, not
the encoding, and re-encodes it when the next change is due: the same functions of the same
values give the same ring elements (a digest of the encoding checks it), so the sums are
those of the clients that keep their encodings, at a fraction of the memory.

Memory on the server's side: the masked inputs arrive in batches of :data:`MASKED_BATCH`
clients (one transport call each) and are added to the ring sum as they come; a round's
own are kept only for a fit's callback (its ``uploads``), never the start's over every
client.

Each exchange also times what each party computes and counts what it sends
(:mod:`sklearn_fedmf.secure._costs`): ``history_``'s ``secure`` records.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np

from .._message_size import nbytes
from ..exceptions import FederationError
from ._costs import exchange_costs, work_clock
from ._encoding import FixedPointEncoding
from ._protocol import (
    PHASES,
    client_advertise_keys,
    client_masked_input,
    client_share_keys,
    client_unmask,
    default_threshold,
    server_collect_keys,
    server_collect_masked,
    server_route_shares,
    server_unmask,
)

__all__ = ["SECURE_PHASES", "SecureAggregation", "SecureInput", "SecureRoundFailed",
           "PerClient", "client_secure_phase", "default_neighbours", "run_secure_exchange"]


class PerClient(NamedTuple):
    """A server message that differs per client: each client receives ``messages[client]``."""

    messages: dict


# the transport's names of the four phases (PHASES of _protocol, prefixed)
SECURE_PHASES = tuple(f"secure_{p}" for p in ("advertise_keys", "share_keys", "masked_input",
                                              "unmask"))


class SecureRoundFailed(FederationError):
    """Fewer clients than the threshold remained at a phase before unmasking: the round has
    no sum, and nothing of it reached a running sum (so the fit may skip it)."""


def default_neighbours(n_clients):
    """SecAgg+'s default degree: the smallest even number >= ``3 log2(n)``, or None (every
    pair, SecAgg) when that reaches ``n - 1``."""
    degree = 2 * math.ceil(1.5 * math.log2(max(n_clients, 2)))
    return None if degree >= n_clients - 1 else degree


# clients per transport call of the masked-input phase (their dense vectors are summed and
# dropped after each call): 64 vectors of FedMGS's 801 kB at MovieLens-1M are 51 MB
MASKED_BATCH = 64

AUTO_CLIP = 2.0**16  # the clip of the automatic encoding
MAX_SCALE_BITS = 36  # beyond, float64's rounding of the decoded sum dominates the error


def auto_encoding(n_clients):
    """The encoding of a fit with ``n_clients`` clients: ``clip = 2^16`` and the most scale
    bits ``s`` (at most ``MAX_SCALE_BITS``) for which the sum over all of them cannot wrap
    the 64-bit ring, ``n 2^17 2^s < 2^63``: 36 up to 512 clients, 33 at 6,040, 27 at 480,189
    (the error of a sum is ``n 2^-(s+1)`` per entry)."""
    scale = MAX_SCALE_BITS
    while scale > 0 and FixedPointEncoding(AUTO_CLIP, scale).max_clients < n_clients:
        scale -= 1
    return FixedPointEncoding(AUTO_CLIP, scale)


@dataclass(frozen=True)
class SecureAggregation:
    """The options of secure aggregation in a fit (``secure_aggregation=`` of an estimator).

    Parameters
    ----------
    encoding : FixedPointEncoding or None, default=None
        None: :func:`auto_encoding` for the fit's number of clients (``clip = 2^16``, as many
        fractional bits as the 64-bit ring allows, at most 36).
    neighbours : int, "auto" or None, default="auto"
        SecAgg+'s degree, even (:func:`default_neighbours` for ``"auto"``: the smallest even
        number >= ``3 log2(n)`` for ``n`` clients of an exchange); None: every pair (SecAgg).
    noise : DistributedNoise or None, default=None
        Distributed differential privacy (set by ``privacy=DistributedDP``): each client
        clips its summands, encodes them and adds its share of discrete Gaussian noise
        (:mod:`sklearn_fedmf.privacy._distributed_dp`); the server decodes the noisy sum.

    Examples
    --------
    >>> from sklearn_fedmf.secure import SecureAggregation
    >>> SecureAggregation().encoding_for(6040).scale_bits
    33
    >>> SecureAggregation().degree(604), SecureAggregation().degree(10)
    (28, None)
    """

    encoding: FixedPointEncoding | None = None
    neighbours: Any = "auto"
    noise: Any = None  # DistributedNoise (privacy=DistributedDP): noise on the sum

    def encoding_for(self, n_clients):
        """The encoding of a fit with ``n_clients`` clients (the noise's, with noise)."""
        if self.noise is not None:
            return self.noise.encoding_for(n_clients)
        return auto_encoding(n_clients) if self.encoding is None else self.encoding

    def degree(self, n_clients):
        if self.neighbours == "auto":
            return default_neighbours(n_clients)
        return self.neighbours

    def threshold(self, n_clients):
        degree = self.degree(n_clients)
        holders = n_clients if degree is None else min(degree + 1, n_clients)
        return default_threshold(holders)


@dataclass(frozen=True)
class SecureInput:
    """A client's masked input and the layout of its summands (public: the same names and
    shapes for every client)."""

    masked: Any
    layout: tuple

    @property
    def nbytes(self):
        return self.masked.nbytes


class _Ready:
    """What the engine receives instead of an upload the client keeps for the secure sum."""

    nbytes = 0

    def __repr__(self):
        return "READY"


READY = _Ready()


def _flatten(values):
    names = sorted(values)
    layout = tuple((name, np.shape(values[name])) for name in names)
    flat = np.concatenate([np.ravel(np.asarray(values[name], dtype=np.float64))
                           for name in names]) if names else np.zeros(0)
    return flat, layout


def _unflatten(flat, layout):
    sums, start = {}, 0
    for name, shape in layout:
        size = int(np.prod(shape, dtype=np.int64))
        part = flat[start:start + size]
        sums[name] = float(part[0]) if shape == () else part.reshape(shape)
        start += size
    return sums


def _digest(q):
    """A check of ring elements ``q``: their count, sum and xor (mod 2^64)."""
    return q.size, int(np.sum(q, dtype=np.uint64)), int(np.bitwise_xor.reduce(q)) if q.size else 0


@dataclass(frozen=True)
class _Source:
    """What a client's summands of an exchange were computed from: its upload (a one-user
    client's few rated items), the broadcast of an initial exchange, its weight and the
    encoding. A cumulative exchange keeps it instead of the dense encoding it gave, and
    :meth:`encoding_of` recomputes that encoding when the next change is due: the same
    functions of the same values give the same ring elements (``digest`` checks it)."""

    exchange: str
    upload: Any
    broadcast: Any
    weight: Any
    encoding: Any
    digest: tuple = ()

    def values(self, summable):
        """The client's summands ``{name: array or number}``."""
        if self.exchange == "report":
            return self.upload
        if self.exchange == "init":
            return summable.init_client(self.upload, self.broadcast)
        if self.exchange == "prepare":
            return summable.prepare_client(self.upload, self.weight)
        return summable.client(self.upload, self.weight)

    def kept_for(self, q):
        """What the client keeps of its encoding ``q``: this source when it is smaller, else
        ``q`` itself (e.g. a site with many users, whose upload is as large)."""
        try:
            compact = nbytes(self.upload) + nbytes(self.weight) < q.nbytes // 2
        except TypeError:  # (an upload part whose size is unknown: keep the encoding)
            compact = False
        return replace(self, digest=_digest(q)) if compact else q

    def encoding_of(self, summable):
        """The ring elements this source was encoded to (checked against ``digest``)."""
        flat, _ = _flatten(self.values(summable))
        q = self.encoding.encode(flat)
        if _digest(q) != self.digest:
            raise FederationError("A client's re-encoded last upload differs from the one in "
                                  "the running sum (its summands are not a deterministic "
                                  "function of its upload); the running sum is lost.")
        return q


def client_ring_vector(client, slot, message, summable):
    """A client's ring vector of a masked-input phase before its masks: ``(slot, vector,
    layout)``. Its summands encoded (a cumulative exchange: their change since the last
    committed encoding, held as ``slot["pending"]`` until :func:`commit_pending`), or, with
    noise on the sum, clipped, encoded and noised (``privacy._distributed_dp``)."""
    encoding = message["encoding"]
    exchange = message["exchange"]
    if exchange == "report":  # its validation report, kept from client_metrics
        if "report" not in slot:
            raise ValueError(f"Client {client} holds no validation report.")
        upload, broadcast = slot.pop("report"), None
    elif "upload" not in slot:
        raise ValueError(f"Client {client} holds no upload for the secure sum.")
    else:
        upload, broadcast = slot.pop("upload"), slot.pop("broadcast", None)
    source = _Source(exchange, upload, broadcast if exchange == "init" else None,
                     message.get("weight"), encoding)
    flat, layout = _flatten(source.values(summable))
    vector = flat
    prepare = exchange == "prepare"
    cumulative = exchange != "report" and (summable.prepare_cumulative if prepare
                                           else summable.cumulative)
    noise = message.get("noise")
    if noise is not None:  # clipped, encoded and noised (privacy._distributed_dp)
        plan, seed, survivors, reference = noise
        if reference is not None:  # (its update: the server adds the reference back)
            flat = flat - _flatten(reference[0](reference[1], message.get("weight")))[0]
        key = "committed_prepare" if prepare else "committed"
        last = slot.get(key) if cumulative else None
        released = slot.get("dp_releases", 0)
        vector, committed = plan.client_vector(flat, encoding, last, seed, survivors,
                                               data=plan.may_release(released),
                                               exchange=exchange)
        slot["dp_releases"] = released + 1
        if cumulative:  # (the dense committed encoding: a clipped one cannot be rebuilt)
            slot["pending"] = (key, committed)
    elif cumulative:
        key = "committed_prepare" if prepare else "committed"  # (one running sum each)
        q = encoding.encode(flat)
        last = slot.get(key)
        if isinstance(last, _Source):  # re-encoded on demand (module docstring)
            last = last.encoding_of(summable)
        vector = q - last if last is not None else q.copy()  # uint64: mod 2^64
        slot["pending"] = (key, source.kept_for(q))
    return slot, vector, layout


def commit_pending(slot):
    """The client's change is in the sum (it unmasked): the next one starts from here."""
    if "pending" in slot:
        key, q = slot.pop("pending")
        slot[key] = q
    return slot


def client_secure_phase(phase, client, slot, message, rng, summable):
    """One client's step of a secure phase: ``(slot, reply)`` (module docstring).

    ``slot`` is the client's secure slot (a dict; ``{"upload": ...}`` after a held upload),
    ``message`` its entry of the server's message, ``rng`` its generator for the keys.
    """
    slot = dict(slot or {})
    if phase == "secure_advertise_keys":
        slot["secagg"], reply = client_advertise_keys(client, message["threshold"], rng)
        return slot, reply
    if phase == "secure_share_keys":
        slot["secagg"], reply = client_share_keys(slot["secagg"], message)
        return slot, reply
    if phase == "secure_masked_input":
        slot, vector, layout = client_ring_vector(client, slot, message, summable)
        slot["secagg"], masked = client_masked_input(slot["secagg"], message["routed"], vector,
                                                     message["encoding"])
        return slot, SecureInput(masked, layout)
    if phase == "secure_unmask":
        _, reply = client_unmask(slot.pop("secagg"), message)
        return commit_pending(slot), reply
    raise ValueError(f"Unknown secure phase {phase!r}.")


@dataclass
class ExchangeResult:
    """What one secure exchange gave the server."""

    sums: dict | None
    survivors: tuple
    masked: dict
    bytes_up: dict
    bytes_down: dict
    costs: dict | None = None  # each party's seconds and bytes (:mod:`._costs`)


def decode_sum(total, layout, survivors, *, encoding, noise, running, reference, weights,
               words, n_members, exchange=None, shares=None):
    """The server's sums ``{name: value}`` from the unmasked ring sum ``total`` of the
    ``survivors``: added to the ``running`` ring sum of a cumulative exchange, decoded; with
    ``noise`` (``privacy._distributed_dp``), a release of each survivor recorded and their
    references added back (``shares``: the survivors each client's noise was sized for)."""
    if noise is not None:  # (adaptive clipping: the count's coordinate, read and removed)
        total = noise.take_count(total, survivors, exchange, encoding, shares)
    if running is not None:
        if running.get("total") is None:
            running["total"], running["layout"] = np.zeros_like(total), layout
        running["total"] += total
        if encoding.ring_bits < 64:
            running["total"] &= np.uint64((1 << encoding.ring_bits) - 1)
        total = running["total"]
    sums = _unflatten(encoding.decode(total), layout)
    if noise is not None:  # a release of each client in the sum (its accounting)
        noise.record(survivors, words, n_members)
        if reference is not None:  # the survivors' references, added back
            for c in survivors:
                back = reference[0](reference[1], None if weights is None else weights[c])
                for name, value in back.items():
                    sums[name] = sums[name] + value
        if weights is not None and "weight" in sums:  # (the server sent them: exact)
            sums["weight"] = float(sum(weights[c] for c in survivors))
    return sums


def run_secure_exchange(transport, clients, dropped, *, options, stream, server_rng, exchange,
                        weights=None, running=None, check=None, round_number=None,
                        encoding=None, keep_masked=None, reference=None):
    """Run the four secure phases over ``transport`` for one exchange of uploads.

    Parameters
    ----------
    transport : Transport
    clients : list of int
        The clients whose upload is held for the sum.
    dropped : collection of int
        Clients of the round that take part in the key phases and then go offline
        (the ``dropout`` of the fit): their masks are removed through the shares.
    options : SecureAggregation
    stream : tuple
        The clients' stream ``(entropy, kind, ...)`` for their keys.
    server_rng : numpy.random.Generator
        The server's generator (the SecAgg+ graph).
    exchange : {"init", "prepare", "update", "report"}
    weights : dict or None
        ``{client: weight}`` sent with the routed shares.
    running : dict or None
        Cumulative exchanges: the server's ``{"total": ring sum, "layout": ...}``, updated in
        place.
    check : callable
        ``check(result, phase)``: applies the failure policy to a phase's failures (raise or
        count them); a failed client leaves the exchange.
    round_number : int or None
    encoding : FixedPointEncoding or None
        None: ``options.encoding_for(transport.n_clients)``.
    keep_masked : bool or None
        Whether ``ExchangeResult.masked`` holds the masked inputs (else None for each
        survivor; they are summed as they arrive either way). None: all but an ``"init"``
        exchange's (over every client).
    reference : tuple or None
        With noise: ``(summable.reference, server_state)``; each client noises its summands
        minus ``reference(server_state, weight)`` and the server adds the survivors' back.

    Returns
    -------
    ExchangeResult
        With ``costs``, the exchange's record of :mod:`sklearn_fedmf.secure._costs`.

    Raises
    ------
    FederationError
        When fewer clients than the threshold remain at a phase.
    """
    if encoding is None:
        encoding = options.encoding_for(transport.n_clients)
    if options.noise is not None and exchange == "report":
        raise ValueError("privacy=DistributedDP does not noise validation reports; fit "
                         "without early stopping.")
    if len(clients) < 2:  # (the sum of one upload is that upload)
        raise SecureRoundFailed(f"Secure aggregation needs at least 2 uploads in a sum, got "
                                f"{len(clients)}; raise clients_per_round.")
    wall = time.perf_counter()
    members = sorted(set(clients) | set(dropped))
    n = len(members)
    encoding.check_clients(max(n, 1))
    degree = options.degree(n)
    threshold = options.threshold(n)
    up = {p: {} for p in PHASES}
    down = {p: {} for p in PHASES}
    # what each party computed (_costs): the clients' seconds as their transport reports them,
    # the server's phase functions timed here (CPU seconds of this thread)
    client_s = {p: {} for p in PHASES}
    server_s = dict.fromkeys(PHASES, 0.0)
    work = {"agreements": 0, "keystream_words": 0}
    clock = work_clock

    def run(phase, who, messages, name, phase_stream=None):
        result = transport.run(phase, who, PerClient(messages), stream=phase_stream,
                               round_number=round_number)
        if check is not None:
            check(result, phase)
        replies = {c: m for c, m in result.messages.items() if m is not None}
        up[name].update({c: m.nbytes for c, m in replies.items()})
        seconds = getattr(result, "seconds", None)
        if seconds is not None:
            client_s[name].update({c: seconds[c] for c in replies if c in seconds})
        return replies

    try:
        adverts = run("secure_advertise_keys", members,
                      dict.fromkeys(members, {"threshold": threshold}), "advertise_keys", stream)
        tic = clock()
        keys = server_collect_keys(adverts, threshold, degree, server_rng)
        down["share_keys"] = {c: sum(a.nbytes for a in keys[c].values()) for c in keys}
        server_s["advertise_keys"] += clock() - tic
        shares = run("secure_share_keys", list(keys), {c: keys[c] for c in keys}, "share_keys")
        work["agreements"] += sum(len(keys[c]) - 1 for c in shares)  # (channel keys)
        tic = clock()
        routed = server_route_shares(shares, threshold)
        gone = set(dropped)
        inputs = [c for c in routed if c not in gone]
        messages = {}
        for c in inputs:
            messages[c] = {"routed": routed[c], "encoding": encoding, "exchange": exchange}
            down["masked_input"][c] = routed[c].nbytes
            if weights is not None:
                messages[c]["weight"] = weights[c]
                down["masked_input"][c] += 8
            if options.noise is not None:  # the client's noise stream and share
                messages[c]["noise"] = (options.noise, options.noise.seed(stream, c),
                                        options.noise.survivors_needed(threshold, n),
                                        reference)
        server_s["share_keys"] += clock() - tic
        # the masked inputs come in batches, summed as they arrive: the server never holds
        # every client's dense vector at once (the start's exchange is over every client);
        # a round's are kept for a callback only (all the server saw of the uploads)
        keep = exchange != "init" if keep_masked is None else keep_masked
        masked, summed, layouts, words = {}, None, set(), 0
        for start in range(0, len(inputs), MASKED_BATCH):
            batch = inputs[start:start + MASKED_BATCH]
            replies = run("secure_masked_input", batch, {c: messages[c] for c in batch},
                          "masked_input")
            tic = clock()
            for c, reply in replies.items():
                vector = reply.masked.vector
                layouts.add(reply.layout)
                if summed is None:
                    summed, words = vector.copy(), vector.size
                elif vector.size == words:
                    summed += vector
                else:  # (refused below, with the layouts)
                    layouts.add(None)
                masked[c] = reply.masked if keep else None
            del replies
            server_s["masked_input"] += clock() - tic
        tic = clock()
        survivors = server_collect_masked(masked, routed, threshold)
        if options.noise is not None:  # the noise holds down to its survivors
            options.noise.check_survivors(survivors.clients, threshold, n)
        server_s["masked_input"] += clock() - tic
    except FederationError as exc:
        if isinstance(exc, SecureRoundFailed) or type(exc) is not FederationError:
            raise
        raise SecureRoundFailed(str(exc)) from exc
    for c in masked:  # a mask seed with each peer that shared, the self mask and theirs
        peers = len(routed[c].ciphertexts)
        work["agreements"] += peers
        work["keystream_words"] += (1 + peers) * words
    if len(layouts) > 1:
        raise FederationError("The clients' uploads for the secure sum differ in names or "
                              "shapes.")
    down["unmasking"] = dict.fromkeys(survivors.clients, survivors.nbytes)
    unmasking = run("secure_unmask", list(survivors.clients),
                    dict.fromkeys(survivors.clients, survivors), "unmasking")
    # (the clients of a cumulative exchange have committed their change: a failure below
    # this line leaves the running sum behind them, which no policy can repair)
    tic = clock()
    try:
        total = server_unmask(keys, routed, masked, unmasking, threshold, encoding,
                              decode=False, summed=summed)
    except FederationError as exc:
        if running is not None:
            raise FederationError(f"{exc} The running sum of a cumulative exchange cannot "
                                  "skip this round.") from exc
        raise
    sums = decode_sum(total, layouts.pop(), survivors.clients, encoding=encoding,
                      noise=options.noise, running=running, reference=reference,
                      weights=weights, words=words, n_members=n, exchange=exchange,
                      shares=None if options.noise is None
                      else options.noise.survivors_needed(threshold, n))
    server_s["unmasking"] += clock() - tic
    alive = set(survivors.clients)
    work["keystream_words"] += len(alive) * words  # the survivors' self masks
    for v in set(routed) - alive:  # a dropped client's pairwise masks with its survivors
        peers = sum(1 for u in keys[v] if u in alive)
        work["agreements"] += peers
        work["keystream_words"] += peers * words
    costs = exchange_costs(exchange, members, survivors.clients, words, up, down, client_s,
                           server_s, work, time.perf_counter() - wall)
    return ExchangeResult(sums, survivors.clients, masked, up, down, costs)


# ---- the validation reports (early stopping) ------------------------------------------------
REPORT_CLIP = 2.0**24  # a client's squared-error sum and count (up to 16.7 million ratings)


def report_encoding(n_clients):
    """The encoding of the validation reports of ``n_clients`` clients: ``clip = 2^24`` (a
    site's squared-error sum and rating count) and the most scale bits for which their sum
    cannot wrap the 64-bit ring: 34 for 8 clients, 25 at 6,040, 19 at 480,189 (the error of
    a sum is below ``n 2^-(s+1)``: 9e-5 at 6,040 clients, 0.46 at 480,189, on sums of the
    size of the validation ratings' count)."""
    scale = 63 - 2 - int(math.log2(REPORT_CLIP))  # (the most that leaves room for one)
    while scale > 0 and FixedPointEncoding(REPORT_CLIP, scale).max_clients < n_clients:
        scale -= 1
    return FixedPointEncoding(REPORT_CLIP, scale)
