"""AggregatedBMF's pure protocol functions (:class:`~sklearn_fedmf.binary.AggregatedBMF`, the
estimator in :mod:`._aggregated`): the Boolean aggregation rules, the client and server steps
and the metrics."""

from __future__ import annotations

import numpy as np

from ..metrics._binary import factor_counts
from ..privacy import privatize
from ._elb import local_steps, transposed_block


def aggregate_boolean(V_stack, aggregation):
    """Combine ``C`` Boolean ``k x m`` matrices (stacked on axis 0) elementwise.

    ``"round"``: ``round(mean)`` with ties (mean 1/2) to 0; ``"majority"``:
    ``sum >= C/2`` (ties to 1); ``"or"``: any (the paper's Appendix B, Algorithm 2, eqs. 11-13).
    """
    return aggregate_counts(np.asarray(V_stack, dtype=np.int64).sum(axis=0), len(V_stack),
                            aggregation)


def aggregate_counts(counts, n, aggregation):
    """:func:`aggregate_boolean` from the entries' ``counts`` of ones among ``n`` matrices: a
    function of their sum, so secure aggregation gives the same model."""
    if aggregation == "round":
        return 2 * counts > n
    if aggregation == "majority":
        return 2 * counts >= n
    if aggregation == "or":
        return counts >= 1
    raise ValueError(f"Unknown aggregation {aggregation!r}; expected 'round', 'majority' or 'or'.")


def init_server(rng):
    return {"Vh": None}, None


def init_client(block, broadcast, rng):
    return {"U": None}, None


def client_update(state, block, broadcast, rng, selected, *, n_components, local_iter, solver,
                  privacy, cover=None):
    """Local Elbmf from a private uniform start, rounded (or the cover solver ``cover =
    (function, params)``); upload the Boolean ``V_i``."""
    A = block.X
    if cover is not None:
        U, V = cover[0](A, n_components, **cover[1])
    else:
        U = rng.random((block.n_rows, n_components))
        V = rng.random((n_components, A.shape[1]))
        U, _, V, _ = local_steps(U, U, V, V, A, transposed_block(block), None, t0=0,
                                 n_steps=local_iter, sync_every=1, rate_unit="local", gamma=0.0,
                                 proximity="sequential", **solver)
    V_bool = V > 0.5
    upload = V_bool
    if privacy["mechanism"]:
        upload = privatize(V_bool, rng, mechanism=privacy["mechanism"],
                           scale=privacy["scale"]) > 0.5
    return {"U": U > 0.5, "V": V_bool}, upload


def server_update(server_state, uploads, round_index, *, aggregation):
    Vh = aggregate_boolean(np.stack([uploads[c] for c in sorted(uploads)]), aggregation)
    return {"Vh": Vh}, Vh


def secure_summands(upload, weight):
    """A client's summand under secure aggregation: its Boolean (maybe randomized) ``V_i``."""
    return {"V": np.asarray(upload, dtype=np.float64)}


def secure_server_update(server_state, sums, n_summed, round_index, *, aggregation):
    """The Boolean aggregation from the secure sum (integers: exact)."""
    Vh = aggregate_counts(np.rint(sums["V"]).astype(np.int64), n_summed, aggregation)
    return {"Vh": Vh}, Vh


def client_metrics(state, block, Vh):
    tp, n_true, n_pred = factor_counts(block.X, state["U"], Vh)  # X: checked at fit
    return {"tp": tp, "n_true": n_true, "n_pred": n_pred, "n_entries": block.X.shape[0]
            * block.X.shape[1]}


def combine_metrics(server_state, sums):
    both = sums["n_true"] + sums["n_pred"]
    return {"f1": 1.0 if both == 0 else 2.0 * sums["tp"] / both,
            "rmsd": float(np.sqrt((both - 2 * sums["tp"]) / sums["n_entries"]))}
