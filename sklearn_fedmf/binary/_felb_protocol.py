"""Felb's pure protocol functions (:class:`~sklearn_fedmf.Felb`, the algorithm in
:mod:`._felb`): the client and server steps, the metrics and ``make_protocol``, which binds
them into the engine's :class:`~sklearn_fedmf.engine._federation.FederatedProtocol`."""

from __future__ import annotations

from functools import partial

import numpy as np

from ..engine._federation import FederatedProtocol, Participation, SummableUploads
from ..metrics._binary import factor_counts
from ..privacy import privatize
from ._elb import (
    elb_value,
    integrality_gap_values,
    lam_at,
    local_steps,
    loss_terms,
    squared_distance,
    transposed_block,
)
from ._elb import prox_elb as _prox_elb


def init_server(rng, *, n_components, n_items, lam):
    """Shared random start ``Vh^0 ~ U[0, 1)^(k x m)`` (Algorithm 1, line 1) and step counter 0.

    ``Vh`` is held in Fortran order (item-major), the layout of the clients' compiled steps,
    so that they read it without a copy (:func:`~._elb.local_steps`).
    """
    Vh = np.asfortranarray(rng.random((n_components, n_items)))
    return {"Vh": Vh, "t": 0, "lam": lam}, {"Vh": Vh, "t": 0}


def init_client(block, broadcast, rng, *, n_components):
    """Private ``U_i^0 ~ U[0, 1)``; ``V_i`` starts at ``Vh^0`` with the first broadcast."""
    U = rng.random((block.n_rows, n_components))
    return {"U": U, "U_prev": U, "V": broadcast["Vh"]}, None


def client_update(state, block, broadcast, rng, selected, *, sync_every, schedule, step,
                  privacy):
    """``sync_every`` local steps from ``V_i = V_i_prev = Vh`` (inertia reset), then upload."""
    Vh = broadcast["Vh"]
    A = block.X
    U, U_prev, V, _ = local_steps(
        state["U"], state["U_prev"], Vh, Vh, A, transposed_block(block), Vh, t0=broadcast["t"],
        n_steps=sync_every, sync_every=sync_every, **schedule, **step,
    )
    upload = privatize(V, rng, mechanism=privacy["mechanism"], clip=privacy["clip"],
                       scale=privacy["scale"])  # a fresh array: never the client's own V_i
    return {"U": U, "U_prev": U_prev, "V": V}, upload


def server_update(server_state, uploads, round_index, *, sync_every, n_clients, server_step,
                  kappa, schedule, prox_mode):
    """``Vh = prox(mean of the uploads; eta_s kappa, eta_s lambda_t)`` (Section 3.2)."""
    order = sorted(uploads)  # the sum in client order: independent of n_jobs
    mean = np.array(uploads[order[0]], dtype=np.float64, order="F")
    for c in order[1:]:
        mean += uploads[c]
    mean /= len(uploads)
    return server_from_mean(server_state, mean, sync_every=sync_every, n_clients=n_clients,
                            server_step=server_step, kappa=kappa, schedule=schedule,
                            prox_mode=prox_mode)


def secure_summands(upload, weight):
    """A client's summand under secure aggregation: its (privatized) ``V_i`` as it is."""
    return {"V": np.asarray(upload, dtype=np.float64)}


def secure_server_update(server_state, sums, n_summed, round_index, **params):
    """The server step from the secure sum of the uploads (their mean)."""
    return server_from_mean(server_state, np.asfortranarray(sums["V"] / n_summed), **params)


def server_from_mean(server_state, mean, *, sync_every, n_clients, server_step, kappa,
                     schedule, prox_mode):
    """The proximal server step at the uploads' mean."""
    t_end = server_state["t"] + sync_every
    lam_t = _lam_of_step(t_end - 1, sync_every, **schedule)
    eta = 1.0 / n_clients if server_step == "1/C" else float(server_step)
    Vh = np.asfortranarray(_prox_elb(mean, eta * kappa, eta * lam_t, prox_mode))
    return {"Vh": Vh, "t": t_end, "lam": lam_t}, {"Vh": Vh, "t": t_end}


def _lam_of_step(t, sync_every, *, lam, growth, lam_max, rate_unit):
    return lam_at(t if rate_unit == "local" else t // sync_every, lam, growth, lam_max)


def client_metrics(state, block, broadcast, *, kappa, gamma, sync_every, schedule):
    """Relaxed loss ``F_i`` (with the client's pre-sync ``V_i``) and Boolean counts at ``Vh``."""
    U, V, Vh = state["U"], state["V"], broadcast["Vh"]
    lam_t = _lam_of_step(max(broadcast["t"] - 1, 0), sync_every, **schedule)
    loss = (0.5 * loss_terms(block.X, U, V) + elb_value(U, kappa, lam_t)
            + elb_value(V, kappa, lam_t) + 0.5 * gamma * squared_distance(V, Vh))
    tp, n_true, n_pred = factor_counts(block.X, U > 0.5, Vh > 0.5)  # X: checked at fit
    return {"loss": loss, "tp": tp, "n_true": n_true, "n_pred": n_pred,
            "n_entries": U.shape[0] * Vh.shape[1], "gap_u": float(integrality_gap_values(U).sum()),
            "n_u": U.size}


def combine_metrics(server_state, sums, *, kappa, n_clients):
    """History record: the global objective Phi, F1/RMSD of the Boolean model, gaps, lambda_t."""
    Vh, lam_t = server_state["Vh"], server_state["lam"]
    gap_v = integrality_gap_values(Vh)
    both = sums["n_true"] + sums["n_pred"]
    return {
        "objective": sums["loss"] + n_clients * elb_value(Vh, kappa, lam_t),
        "f1": 1.0 if both == 0 else 2.0 * sums["tp"] / both,
        "rmsd": float(np.sqrt((both - 2 * sums["tp"]) / sums["n_entries"])),
        "integrality_gap_u": sums["gap_u"] / sums["n_u"],
        "integrality_gap_v": float(gap_v.mean()),
        "integrality_gap_v_max": float(gap_v.max()),
        "lambda_t": lam_t,
    }


def make_protocol(*, n_items, n_clients, n_components, sync_every, kappa, lam, growth, lam_max,
                  rate_unit, beta, gamma, update, prox_mode, proximity, step_scale,
                  server_step, privacy):
    """Bind the hyperparameters to the pure functions above."""
    schedule = dict(lam=lam, growth=growth, lam_max=lam_max, rate_unit=rate_unit)
    step = dict(kappa=kappa, beta=beta, gamma=gamma, update=update, prox_mode=prox_mode,
                proximity=proximity, step_scale=step_scale)
    return FederatedProtocol(
        init_server=partial(init_server, n_components=n_components, n_items=n_items, lam=lam),
        init_client=partial(init_client, n_components=n_components),
        client_update=partial(client_update, sync_every=sync_every, schedule=schedule,
                              step=step, privacy=privacy),
        server_update=partial(server_update, sync_every=sync_every, n_clients=n_clients,
                              server_step=server_step, kappa=kappa, schedule=schedule,
                              prox_mode=prox_mode),
        client_metrics=partial(client_metrics, kappa=kappa, gamma=gamma, sync_every=sync_every,
                               schedule=schedule),
        combine_metrics=partial(combine_metrics, kappa=kappa, n_clients=n_clients),
        participation=Participation(receives="all"),
        summable=SummableUploads(
            client=secure_summands,
            server_update=partial(secure_server_update, sync_every=sync_every,
                                  n_clients=n_clients, server_step=server_step, kappa=kappa,
                                  schedule=schedule, prox_mode=prox_mode)),
    )
