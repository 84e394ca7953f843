"""What a deployment pays for secure aggregation: each party's seconds and bytes per round.

A one-process simulation runs every client one after another, so its wall time is not what a
deployment pays. Each secure exchange (:func:`~sklearn_fedmf.secure._rounds.run_secure_exchange`)
therefore times each party's own work: every client's step of every phase inside the
client's task (``PhaseResult.seconds`` of the transport; what a phone would compute), and
the server's phase functions (collect keys, route shares, collect masked inputs, unmask and
decode). Seconds are CPU seconds of the running thread (``time.thread_time``): the work,
without the waits of a loaded machine, and without Python's garbage collections, which
scan the whole simulation's heap (a pass of ~0.1 s would land on whichever client's step
triggered it; a phone's heap is its own) (:func:`work_clock`). The simulation's wall time
is kept apart.

``history_``'s record of a secure round holds them under ``"secure"``::

    record["secure"] = {
        "exchanges": [                      # the round's secure sums, in order
            {"label": "prepare" | "update" | "report",
             "clients": n,                  # the clients of the exchange (dropped ones too)
             "survivors": s,                # those whose masked input is in the sum
             "vector_words": d,             # ring elements of one masked input
             "agreements": a,               # X25519 agreements of all parties
             "keystream_words": w,          # AES-CTR keystream words of all parties
             "wall_s": ...,                 # the simulation's wall time of the exchange
             "phases": {phase: {            # advertise_keys, share_keys, masked_input, unmasking
                 "clients": m,              # the clients that sent in this phase
                 "server_s": ...,           # the server's function after the phase
                 "client_s_median": ..., "client_s_max": ...,
                 "client_bytes_sent_median": ..., "client_bytes_sent_max": ...,
                 "client_bytes_received_median": ..., "client_bytes_received_max": ...}}},
            ...],
        # the round, each client's total over its exchanges and phases:
        "clients": ..., "server_s": ..., "client_s_median": ..., "client_s_max": ...,
        "client_bytes_sent_median": ..., "client_bytes_sent_max": ...,
        "client_bytes_received_median": ..., "client_bytes_received_max": ...,
        "agreements": ..., "keystream_words": ..., "wall_s": ...,
        "start": {...},                     # first round of a fit only: the start's exchange
    }

Bytes are the messages' ``nbytes`` (their size on the wire, :mod:`._protocol`): sent, a
client's message of the phase; received, the server's message that starts it (its key list,
its routed shares, the survivor list; and the weight, 8 bytes, when the server sends one).
``client_s_*`` are None when the transport does not report its clients' seconds (a remote
transport). ``agreements`` and ``keystream_words`` are the protocol's floor: a client
agrees a channel key with each peer of its key list and a mask seed with each peer whose
shares it received, and expands its self mask and one pairwise mask per such peer; the
server expands every survivor's self mask and, for each dropped client, agrees and expands
its pairwise mask with each surviving neighbour. None of this reaches the model: the same
fit gives the same model and the same other ``history_`` fields.
"""

from __future__ import annotations

import gc
import threading
import time

import numpy as np

from ._protocol import PHASES

__all__ = ["exchange_costs", "round_costs", "floor_seconds", "work_clock"]

_GC = threading.local()  # this thread's CPU seconds in garbage collections, and the current


def _on_gc(phase, info):
    now = time.thread_time()
    if phase == "start":
        _GC.start = now
    elif getattr(_GC, "start", None) is not None:
        _GC.total = getattr(_GC, "total", 0.0) + now - _GC.start
        _GC.start = None


def work_clock():
    """CPU seconds of this thread outside the garbage collector's passes (a difference of
    two readings is the work between them)."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)
    return time.thread_time() - getattr(_GC, "total", 0.0)


def _median(values):
    return float(np.median(values)) if values else None


def _max(values):
    return max(values) if values else None


def _spread(name, per_client):
    values = list(per_client.values())
    return {f"{name}_median": _median(values), f"{name}_max": _max(values)}


def exchange_costs(label, members, survivors, vector_words, up, down, client_s, server_s,
                   work, wall_s):
    """The record of one secure exchange (module docstring). ``up``, ``down``, ``client_s``:
    ``{phase: {client: bytes or seconds}}``; ``server_s``: ``{phase: seconds}``; ``work``:
    ``{"agreements": ..., "keystream_words": ...}``. The per-client figures of the whole
    exchange ride along under ``"_per_client"`` for :func:`round_costs` (dropped there)."""
    phases = {}
    for phase in PHASES:
        timed = client_s.get(phase)
        # (a client that received nothing to start the phase, e.g. advertise_keys: 0 bytes)
        received = {c: down[phase].get(c, 0) for c in set(up[phase]) | set(down[phase])}
        phases[phase] = {
            "clients": len(up[phase]),
            "server_s": float(server_s[phase]),
            **(_spread("client_s", timed) if timed else
               {"client_s_median": None, "client_s_max": None}),
            **_spread("client_bytes_sent", up[phase]),
            **_spread("client_bytes_received", received),
        }
    per_client = {"sent": {}, "received": {}, "seconds": {}}
    for phase in PHASES:
        for side, values in (("sent", up[phase]), ("received", down[phase]),
                             ("seconds", client_s.get(phase) or {})):
            totals = per_client[side]
            for c, v in values.items():
                totals[c] = totals.get(c, 0) + v
    return {"label": label, "clients": len(members), "survivors": len(survivors),
            "vector_words": int(vector_words), "agreements": int(work["agreements"]),
            "keystream_words": int(work["keystream_words"]), "wall_s": float(wall_s),
            "phases": phases, "_per_client": per_client}


def round_costs(exchanges, start=None):
    """The ``"secure"`` entry of a round's record from its exchanges' records (module
    docstring); ``start``: the record of the fit's initial exchange, if any."""
    sent, received, seconds = {}, {}, {}
    timed = True
    records = []
    for exchange in exchanges:
        exchange = dict(exchange)
        per_client = exchange.pop("_per_client")
        for totals, side in ((sent, "sent"), (received, "received"), (seconds, "seconds")):
            for c, v in per_client[side].items():
                totals[c] = totals.get(c, 0) + v
        timed = timed and all(p["client_s_max"] is not None or p["clients"] == 0
                              for p in exchange["phases"].values())
        records.append(exchange)
    clients = set(sent) | set(received)
    out = {"exchanges": records, "clients": len(clients),
           "server_s": float(sum(p["server_s"] for e in records for p in e["phases"].values())),
           **(_spread("client_s", seconds) if timed and seconds else
              {"client_s_median": None, "client_s_max": None}),
           **_spread("client_bytes_sent", sent),
           **_spread("client_bytes_received", received),
           "agreements": sum(e["agreements"] for e in records),
           "keystream_words": sum(e["keystream_words"] for e in records),
           "wall_s": float(sum(e["wall_s"] for e in records))}
    if start is not None:
        start = dict(start)
        start.pop("_per_client", None)
        out["start"] = start
    return out


def floor_seconds(costs, seconds_per_agreement, keystream_bytes_per_second):
    """The protocol's floor of a record's secure work (a round's ``"secure"`` entry or one
    exchange): its agreements times the seconds of one X25519 agreement plus its keystream
    bytes over the AES-CTR throughput, both measured on the machine at hand."""
    return (costs["agreements"] * seconds_per_agreement
            + 8 * costs["keystream_words"] / keystream_bytes_per_second)
