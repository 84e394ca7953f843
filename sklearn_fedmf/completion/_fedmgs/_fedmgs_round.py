"""FedMGS's round (Wang & Chang, Algorithm 2), written once for every family.

Each round the sampled clients take the local phase (``Q1`` steps on their private factor
against the broadcast global factor) and send their data aggregates, which do not depend on
the global factor: the gradient in it is linear, ``grad = W G1 - G2`` (29). The server keeps
every client's latest aggregates and takes ``Q2`` proximal-gradient steps alone, each with
the exact gradient at the clients' current factors. A family (matrix completion in
:mod:`~sklearn_fedmf.completion._fedmgs._fedmgs_protocol`, clustering in
:mod:`~sklearn_fedmf.cluster._federated_clustering_protocol`) gives its local phase, what it shares,
its gradient and its proximal step (the prox of its regularizer, or the projection on its
constraint).

:func:`server_step` is FedMGS's server step, the one for every family, both losses and both
exchanges: each binds how the received uploads become the sums of every client's latest
aggregates (``fold``) and the step in the global factor from those sums (``step``).
"""

from __future__ import annotations

__all__ = ["client_update", "server_step", "server_steps"]


def client_update(state, block, broadcast, rng, selected, *, local_phase, share):
    """A client's round: ``local_phase(state, block, broadcast)`` (the new state) then, if
    sampled, the upload ``share(new_state, block, broadcast)``, its data aggregates."""
    new = local_phase(state, block, broadcast)
    return new, (share(new, block, broadcast) if selected else None)


def server_steps(W, n_steps, d, gradient, prox):
    """The server's ``n_steps`` proximal-gradient steps (32) ``W <- prox(W - gradient(W) /
    d, d)``: ``gradient`` is the smooth part's (from the cached aggregates), ``prox(Z, d)``
    the proximal step of size ``1/d`` of the nonsmooth part."""
    for _ in range(n_steps):
        W = prox(W - gradient(W) / d, d)
    return W


def server_step(server_state, *received, fold, step):
    """FedMGS's server step: ``fold(server_state, *received)`` gives the state and the sums
    of every client's latest aggregates (the plain server's cache updated by the uploaders'
    changes, or the running sums a secure exchange delivered), then ``step(state, *sums)``
    gives ``(new_state, broadcast)``, the new global factor from those sums alone (the
    squared loss: ``Q2`` steps of :func:`server_steps`; the implicit loss: each item's
    solve). ``received`` is what the engine passes a server update after the state:
    ``(uploads, round_index)``, or ``(sums, n_summed, round_index)`` from a secure exchange."""
    return step(*fold(server_state, *received))
