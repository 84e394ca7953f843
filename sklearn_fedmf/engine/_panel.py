"""Early stopping's validation panel (issue 39): who reports the validation when the rounds
of a fit sample their clients (:func:`~sklearn_fedmf.engine._federation.run_federation`).

When every client takes part in every round, every client reports at every evaluation. When
a round samples its clients, a report from every client would ask every device to be online
at each evaluation and, under secure aggregation, a secure sum over every client each time;
the evaluation then asks a panel of clients drawn once from the fit's seed, in blocks of at
most a round's clients (:func:`panel_reports`).
"""

from __future__ import annotations

import numpy as np

from ._transport import _rng

__all__ = ["PANEL_MIN_BLOCKS", "PANEL_RELATIVE_SE", "panel_enough", "panel_reports"]

_PANEL = 11  # early stopping's validation panel: its seed kind (the floor's, blend's: 9, 10)
# The validation panel of a fit that samples its clients (EarlyStopping(panel="auto")): blocks
# of a round's clients are added at its first evaluation until the validation MSE's relative
# standard error, from the spread of the blocks' sums, is at most this
# (benchmarks/results/bench_validation_sample-2026-12.md); the spread is trusted from this many
# blocks on (from 2 blocks, a tenth of the draws stopped there on a chance small spread).
PANEL_RELATIVE_SE = 0.02
PANEL_MIN_BLOCKS = 4


def panel_reports(run, state, round_number, client_error):
    """The validation reports of early stopping's panel at one evaluation: ``(sums, reports
    seen, (bytes up, bytes down))``, ``sums`` the report keys over the panel (``run``: the
    engine's settings of the call; ``client_error``: the engine's error for a client that
    failed, raised).

    The panel's clients report in blocks of at most a round's clients (each block one secure
    sum under secure aggregation, ``exchange.reports`` with ``part``). At the first
    evaluation the panel is drawn (a permutation of the clients from ``SeedSequence(entropy,
    (11,))``): an ``int`` rule takes that many clients; ``"auto"`` adds blocks until the
    validation MSE's relative standard error, from the spread of the blocks' sums
    (:func:`panel_enough`, from ``PANEL_MIN_BLOCKS`` blocks on), is at most
    ``PANEL_RELATIVE_SE``, or every client reports. Then
    the same clients report at every evaluation, so that the rounds' scores differ by the
    model, not by who reported."""
    transport, keys, rule = run.transport, run.early_stopping.report_keys, run.panel
    first = state.panel is None
    if first:
        order = _rng(run.entropy, _PANEL).permutation(transport.n_clients)
        limit = order.size if rule == "auto" else min(int(rule), order.size)
    else:
        order = np.asarray(state.panel)
        limit = order.size
    parts, seen, up, down, done = [], {}, 0, 0, 0
    while done < limit:
        block = np.sort(order[done:min(done + run.n_sampled, limit)]).tolist()
        result = transport.run_each(block, state.broadcast, round_number=round_number)
        for client, exc in result.failures.items():
            raise client_error("client_metrics", client, exc, round_number) from exc
        summed, block_seen, (u, d) = run.exchange.reports(
            run.protocol, transport, result.messages, keys, round_number, part=len(parts))
        parts.append([summed[k] if k in summed else
                      sum(m[k] for m in result.messages.values()) for k in keys])
        seen.update(block_seen)
        up, down, done = up + u, down + d, done + len(block)
        if first and rule == "auto" and panel_enough(parts, PANEL_RELATIVE_SE):
            break
    if first:
        state.panel = order[:done].copy()
    totals = np.sum(parts, axis=0, dtype=np.float64)
    state.panel_count = float(totals[1])
    return dict(zip(keys, totals.tolist())), seen, (up, down)


def panel_enough(parts, target, min_blocks=None):
    """Whether the blocks' validation sums ``parts`` (``[sse, count]`` each) give their
    ratio, the panel's validation MSE, a relative standard error at most ``target``: the
    ratio estimator's, from the spread of the blocks around it, once there are
    ``min_blocks`` of them (default ``PANEL_MIN_BLOCKS``; at least two)."""
    if len(parts) < max(2, PANEL_MIN_BLOCKS if min_blocks is None else min_blocks):
        return False
    sse, count = np.asarray(parts, dtype=np.float64)[:, :2].T
    total, n = sse.sum(), count.sum()
    if total <= 0 or n <= 0:
        return False
    ratio = total / n
    b = len(parts)
    variance = b / (b - 1) * np.sum(np.square(sse - ratio * count)) / n**2
    return bool(np.sqrt(variance) <= target * ratio)
