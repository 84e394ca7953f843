"""FedMAvg's round (Wang & Chang, Algorithm 1), written once for every family.

A family (matrix completion in :mod:`~sklearn_fedmf.completion._fedmavg._fedmavg_protocol`,
clustering in :mod:`~sklearn_fedmf.cluster._federated_clustering_protocol`) gives its steps as
functions: the local phase (``Q1`` steps on the client's private factor against the broadcast global
factor), the W phase (``Q2`` steps on the client's copy ``W_p`` of the global factor, sent as
the upload) and, for FedPALM (Remark 1), one local step and one proximal W step. This module
runs them in the round's phases and holds what is the same in every family:

* the local-step schedule ``Q2^s`` (:func:`q2_schedule`);
* the size of the W step, ``"local"``, ``"global"`` (a first exchange of the clients'
  Grams: :func:`client_prepare`, :func:`store_grams`) or ``"guarded"`` (:func:`w_step_size`);
* the two aggregation rules (:func:`average_uploads`) and the check of their combination
  with the sampling (:func:`check_aggregation`);
* the participation modes ``"pcc"`` and ``"pcp"`` (:func:`round_phases`), and under secure
  aggregation the prepare phase's Grams from the sampled clients only
  (:func:`sampled_prepare`).

Every function is pure and module-level (the protocol travels to processes, Dask workers and
Flower clients by pickling; the family's steps are bound with :func:`functools.partial`).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import NamedTuple

import numpy as np

from ...engine._federation import Participation, SummableUploads
from ...engine._groups import LazyRows

__all__ = [
    "RoundRule", "average_uploads", "check_aggregation", "client_prepare", "client_update",
    "palm_client_update", "q2_schedule", "round_phases", "sampled_prepare", "store_grams",
    "w_step_size",
    "weighted_sum", "weighted_upload", "upload_weights", "mean_of_sums",
]

_GRAM_CHUNK = 4096  # Grams per stacked assignment in store_grams


class RoundRule(NamedTuple):
    """The settings of Wang & Chang's rounds that FedMAvg's completion and clustering
    protocols share (their ``make_protocol`` takes them as one ``rule``): the local pairs
    ``local_iter_u``, the server's ``local_iter_v`` steps (capped by ``q_hat``, see
    :func:`q2_schedule`), ``participation``, ``aggregation``, the step factors ``c_factor``
    and ``d_factor``, ``w_step`` and the ``variant``."""

    local_iter_u: int
    local_iter_v: int | None
    q_hat: int
    participation: str
    aggregation: str
    c_factor: float
    d_factor: float
    w_step: str
    variant: str = "wang_chang"


def q2_schedule(round_number, local_iter_v, q_hat):
    """``Q2^s``: constant ``local_iter_v``, or ``floor(q_hat / s) + 1`` when it is None
    (Algorithm 1's diminishing schedule)."""
    if local_iter_v is not None:
        return int(local_iter_v)
    return int(q_hat) // int(round_number) + 1


def check_aggregation(aggregation, sampling):
    """Refuse ``aggregation="weighted"`` with ``sampling="weighted"``: the draws already
    follow ``omega``."""
    if sampling == "weighted" and aggregation == "weighted":
        raise ValueError(
            'aggregation="weighted" with sampling="weighted" would weigh the clients by '
            'omega twice; the paper averages weighted draws with "sampled_mean".'
        )


def w_step_size(d_local, d_global, w_step, d_factor):
    """The W step's ``d`` (step ``1/d``): the client's own ``d_local = d_factor L_Wp``
    (``"local"``), the server's ``d_global`` from every client's Gram (``"global"``), or
    the global one but never a step longer than ``1/(0.51 L_Wp)`` on this client
    (``"guarded"``: the global step is unstable on non-iid clients). Values or arrays."""
    if w_step == "local":
        return d_local
    if w_step == "guarded":
        return np.maximum(d_global, 0.51 * d_local / d_factor)
    return d_global


# ---- client phases ----------------------------------------------------------------------------
def client_prepare(state, block, broadcast, rng, selected, *, local_phase, gram):
    """Prepare phase (global step only): the local phase, then send the Gram of the new
    private factor (``gram(state)``, ``r x r``) for the server's step size."""
    new = local_phase(state, block, broadcast)
    return new, {"gram": gram(new)}


def client_update(state, block, message, rng, selected, *, prepared, local_phase, w_phase,
                  keep):
    """Main phase: the local phase (unless done in the prepare phase) then, if sampled, the
    W phase and the upload ``{"W": W_p}``.

    ``local_phase(state, block, broadcast)`` returns the state the W phase needs (with what
    it keeps of the broadcast); ``w_phase(state, block, d_global)`` returns the upload
    (``d_global``: the server's answer to the prepare phase, None without one);
    ``keep(state)`` is what the client keeps between rounds.
    """
    if not prepared:
        state = local_phase(state, block, message)
    if not selected:
        return keep(state), None
    return keep(state), w_phase(state, block, message["d"] if prepared else None)


def palm_client_update(state, block, broadcast, rng, selected, *, n_pairs, factor, shared,
                       local_step, proximal_step, finish):
    """FedPALM (Remark 1, (15)-(16)): from ``W_p`` = the broadcast ``shared`` factor,
    ``n_pairs`` times one step on the private factor (``state[factor]``) at the current
    ``W_p`` and one proximal step on ``W_p`` at the new private factor; then, if sampled,
    the upload of ``W_p`` (FedMAvg's averaging).

    ``local_step(private, W, block, broadcast)`` and ``proximal_step(W, private, block,
    broadcast)`` are the family's steps, each with its step size at the current iterate (as
    in PALM); ``finish(state, block, private)`` is the client's new state.
    """
    private, W = state[factor], broadcast[shared]
    for _ in range(n_pairs):
        private = local_step(private, W, block, broadcast)
        W = proximal_step(W, private, block, broadcast)
    return finish(state, block, private), ({"W": W} if selected else None)


# ---- server ----------------------------------------------------------------------------------
def store_grams(grams, stats):
    """Put the Grams of ``stats`` (client -> ``{"gram"}``) into the server's cache ``grams``
    (clients x r x r), in place: at one client per user it is ``p x r x r`` (0.75 GB at the
    Netflix shape), too large to copy every round. Stacked assignments (480,189 Grams a
    round there), a chunk at a time: one stack of them all is a 0.75 GB temporary, paged in
    afresh every round."""
    clients = np.fromiter(stats, np.int64, len(stats))
    new = [stat["gram"] for stat in stats.values()]
    for a in range(0, len(new), _GRAM_CHUNK):
        grams[clients[a:a + _GRAM_CHUNK]] = np.concatenate(
            new[a:a + _GRAM_CHUNK]).reshape(-1, *grams.shape[1:])
    return grams


def weighted_sum(messages, weights):
    """``sum_p w_p W_p`` of dense uploads and :class:`~sklearn_fedmf.engine._groups.LazyRows`
    (``scale * base`` but for the rated rows): a lazy upload costs its rated rows, the
    base is added once with the summed coefficients (one per column when the scale is)."""
    total, bases, same = None, {}, {}
    for message, weight in zip(messages, weights):
        if isinstance(message, LazyRows):
            if total is None:
                total = np.zeros(message.shape)
            coef = message.add_to(total, weight)
            if np.any(coef):
                key = same.get(id(message.base))
                if key is None:  # (a process backend unpickles one copy of V per task: the
                    # copies share one coefficient, so the sum is the threads' to the bit)
                    key = next((k for k, (b, _) in bases.items() if b.shape ==
                                message.base.shape and np.array_equal(b, message.base)),
                               id(message.base))
                    same[id(message.base)] = key
                base, summed = bases.get(key, (message.base, 0.0))
                bases[key] = (base, summed + coef)
        elif total is None:
            total = weight * message
        else:
            total += weight * message
    for base, coef in bases.values():  # (an r x r coefficient multiplies from the right)
        total += base @ coef if np.ndim(coef) == 2 else coef * base
    return total


def average_uploads(uploads, counts, weights, aggregation):
    """The server's average of the uploaded copies ``W_p`` ((8)-(10)).

    ``"weighted"``: ``sum omega_p W_p / sum omega_p`` over the senders (``weights``, one per
    client). ``"sampled_mean"``: each upload weighed by its draws ``n_p`` (``counts``, client
    -> draws; None: once), the mean over the multiset of draws ``sum_p n_p W_p / sum_p n_p``
    (Algorithm 1, eqs. (9)-(10); ``1/m`` when every drawn client arrived).
    """
    clients = list(uploads)
    if aggregation == "weighted":
        w = weights[clients]
    else:
        w = np.array([1.0 if counts is None else counts[p] for p in clients])
    w = w / w.sum() if w.sum() > 0 else np.full(len(clients), 1.0 / len(clients))
    return weighted_sum([uploads[p]["W"] for p in clients], w)


# ---- secure aggregation: the average as a ratio of two sums ------------------------------------
def weighted_upload(upload, weight):
    """A client's summands under secure aggregation: ``w_p W_p`` and ``w_p``, its weight
    applied by itself (``weight``: what :func:`upload_weights` gives it)."""
    return {"W": weight * np.asarray(upload["W"], dtype=np.float64), "weight": float(weight)}


def unmoved_upload(server_state, weight):
    """The summands of a client whose copy did not move from the server's ``Vt``: with
    noise on the sum each client clips and noises ``w_p (W_p - Vt)`` (its update)."""
    return {"W": weight * np.asarray(server_state["Vt"], dtype=np.float64),
            "weight": float(weight)}


def upload_weights(server_state, clients, counts, *, aggregation):
    """Each sender's weight in :func:`average_uploads`, unnormalized: ``omega_p``
    (``"weighted"``) or its draws ``n_p`` (``"sampled_mean"``)."""
    if aggregation == "weighted":
        return {p: float(server_state["weights"][p]) for p in clients}
    return {p: float(counts.get(p, 1)) for p in clients}


def mean_of_sums(sums):
    """:func:`average_uploads` from the secure sums: ``sum_p w_p W_p / sum_p w_p``."""
    if not sums["weight"] > 0:
        raise ValueError("The senders' weights sum to zero: no average.")
    return sums["W"] / sums["weight"]


def gram_summand(stats, weight):
    """A client's prepare statistics under secure aggregation: its Gram, as it is."""
    return {"gram": np.asarray(stats["gram"], dtype=np.float64)}


def round_phases(*, participation, prepared, local_phase, w_phase, keep, gram, server_prepare,
                 server_update, palm=None, aggregation=None, secure_update=None,
                 secure_prepare=None):
    """The round's entries of a :class:`~sklearn_fedmf.engine._federation.FederatedProtocol`: the
    family's steps bound into the phases above.

    ``participation``: ``"pcc"``, every client takes the local phase every round and only
    the sampled ones upload (partial client communication; the broadcast reaches all), or
    ``"pcp"``, only the sampled clients compute (partial participation). ``prepared``: the
    W step needs the server's global step (a prepare phase with ``gram`` and
    ``server_prepare``). ``palm``: the keywords of :func:`palm_client_update`
    (``variant="fedpalm"``), whose pairs replace the local and W phases. ``secure_update``:
    the server step from the mean of the uploads, ``secure_update(server_state, Vt,
    round_index) -> (server_state, broadcast)``, which makes the uploads summable
    (:func:`weighted_upload`, weights by ``aggregation``); ``secure_prepare``: the server's
    prepare step from the running sum of the clients' latest Grams, ``secure_prepare(
    server_state, sums, clients, round_index) -> (server_state, message)``.
    """
    if palm is not None:
        update = partial(palm_client_update, **palm)
    else:
        update = partial(client_update, prepared=prepared, local_phase=local_phase,
                         w_phase=w_phase, keep=keep)
    return dict(
        client_prepare=(partial(client_prepare, local_phase=local_phase, gram=gram)
                        if prepared else None),
        server_prepare=server_prepare if prepared else None,
        client_update=update,
        server_update=server_update,
        participation=Participation(computes="all", receives="all") if participation == "pcc"
        else Participation(),
        server_counts=True,
        summable=None if secure_update is None else SummableUploads(
            client=weighted_upload,
            server_update=partial(_server_from_sums, secure_update=secure_update),
            weights=partial(upload_weights, aggregation=aggregation),
            reference=unmoved_upload,
            prepare_client=gram_summand if prepared else None,
            server_prepare=secure_prepare if prepared else None,
            prepare_cumulative=True),
    )


def _server_from_sums(server_state, sums, n_summed, round_index, *, secure_update):
    return secure_update(server_state, mean_of_sums(sums), round_index)


# ---- secure aggregation: the Grams of the sampled clients only --------------------------------
# Under "pcc" every client updates U_p each round; summing every client's Gram would be a
# secure exchange over every client each round (issue 39: 28.8 of 49.9 CPU seconds of a
# secure fit at 2,000 clients, 200 a round). Only the sampled clients send (the change of)
# their Gram: the server's running sum holds the latest Gram of each client that has sent
# one, and the step reads it times n / (the clients that have sent), the clients that have
# not counted at the mean of those that have. Measured (make_ratings(600, 150, 30000), one
# client per user, 60 a round, 80/20 test RMSE after 8, 30, 100 rounds): plain 0.8911,
# 0.7584, 0.7238; this 0.8711, 0.7503, 0.7237; n / m times the round's m Grams alone 0.8933,
# 0.7702, 0.7248; the running sum with the start Gram of the random U_p^0 for a client that
# has not sent (no scaling) train RMSE 1.018 against the plain 0.831 at 300 clients, 30 a
# round, 8 rounds: the start Grams understate the bound.
def _selected_stats(client_prepare, state, block, broadcast, rng, selected):
    new, stats = client_prepare(state, block, broadcast, rng, selected)
    return new, (stats if selected else None)


def _selected_group_stats(client_prepare, group_state, group, broadcast, stream, active,
                          selected):
    new, stats = client_prepare(group_state, group, broadcast, stream, active, selected)
    return new, {c: s for c, s in stats.items() if selected[c - group.start]}


def _scaled_prepare(server_prepare, server_state, sums, clients, round_index):
    """The family's secure ``server_prepare`` on the running sum of the latest Grams of the
    clients that have sent one, times ``n`` over their number (no start Gram added: the
    family's ``"unsent"`` mask passed empty, this function keeps its own)."""
    n_clients = len(server_state["grams"])
    unsent = server_state.get("unsent")
    unsent = np.ones(n_clients, dtype=bool) if unsent is None else unsent.copy()
    unsent[list(clients)] = False
    scale = n_clients / max(n_clients - int(unsent.sum()), 1)
    state = {**server_state, "unsent": np.zeros(n_clients, dtype=bool)}
    new, message = server_prepare(state, {k: v * scale for k, v in sums.items()}, clients,
                                  round_index)
    return {**new, "unsent": unsent}, message


def sampled_prepare(protocol):
    """``protocol`` whose prepare phase (the Grams of the global W step) is a secure running
    sum over the sampled clients only, scaled to every client (the comment above); every
    client still computes its ``U_p``."""
    if protocol.client_prepare is None or protocol.summable is None:
        return protocol
    batched = protocol.batched
    if batched is not None and batched.client_prepare is not None:
        batched = dataclasses.replace(batched, client_prepare=partial(
            _selected_group_stats, batched.client_prepare))
    summable = dataclasses.replace(
        protocol.summable, prepare_cumulative=True,
        server_prepare=partial(_scaled_prepare, protocol.summable.server_prepare))
    return dataclasses.replace(
        protocol, client_prepare=partial(_selected_stats, protocol.client_prepare),
        batched=batched, summable=summable)
