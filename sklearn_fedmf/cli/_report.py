"""What the ``fedmf`` command shows: the results table of ``run``, the ranked table of
``tune`` and the figure of the per-round histories."""

from __future__ import annotations

import numpy as np

from ._messages import _note


def format_table(results):
    """Plain-text table: one row per method with its final scores, time and traffic.

    A fit that ended at a degenerate solution (it raised a ``DegenerateFitWarning``) gets a
    ``!`` in a last column and a footnote with the warning.
    """
    binary = results[0]["kind"] == "binary"
    scores = ("f1", "rmsd") if binary else ("train_rmse", "eval_rmse")
    heads = ("F1", "RMSD") if binary else ("train RMSE", "test RMSE")
    flagged = [r for r in results if r["summary"].get("degenerate")]
    header = ["method", "rounds", *heads, "seconds", "MB up", "MB down", *([""] if flagged else [])]
    rows = [header]
    for r in results:
        s = r["summary"]
        rows.append([r["label"], str(s["rounds"]),
                     *(f"{s[k]:.4f}" if k in s else "-" for k in scores),
                     f"{s['seconds']:.1f}", f"{s['bytes_uploaded'] / 1e6:.1f}",
                     f"{s['bytes_downloaded'] / 1e6:.1f}",
                     *(["!" if s.get("degenerate") else ""] if flagged else [])])
    widths = [max(len(row[j]) for row in rows) for j in range(len(header))]
    lines = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                       for j, (c, w) in enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.insert(1, "-" * max(len(line) for line in lines))
    for r in flagged:
        reason = r.get("degenerate") or ["degenerate solution"]
        lines.append(f"! {r['label']}: the fit ended degenerate: {reason[0]}")
    return "\n".join(lines)


def plot_histories(results, path, title):
    """Objective (log scale) and test RMSE (or F1) per round; returns the path or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        _note("matplotlib is not installed, so no figure was drawn (pip install "
              "'sklearn_fedmf[plot]'); the histories are in the JSON file")
        return None
    binary = results[0]["kind"] == "binary"
    right, right_label = ("f1", "F1 of the Boolean reconstruction") if binary else (
        "eval_rmse", "test RMSE (held-out ratings)")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for r in results:
        for ax, key in zip(axes, ("objective", right)):
            pts = [(h["round"], h[key]) for h in r["history"] if h.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), label=r["label"], lw=1.8)
    axes[0].set_yscale("log")
    axes[0].set_title("Relaxed objective (its weight lambda_t grows)" if binary
                      else "Training objective")
    same = len({r["objective"] for r in results}) == 1
    axes[0].set_ylabel("objective (log scale)" if same
                       else "objective, each method's own (log scale)")
    axes[1].set_title("F1 on the training data" if binary else "Test RMSE")
    axes[1].set_ylabel(right_label)
    for ax in axes:
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("communication round")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small", framealpha=0.7)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_search(search, kind, top):
    """The ranked table of a fitted search and its rows (halving: longest runs first)."""
    res = search.cv_results_
    scores = res["mean_test_score"]
    # Halving ranks candidates that survived to more rounds first (scores at fewer rounds are
    # not comparable); a plain grid has one level.
    level = res.get("n_resources", np.zeros(len(scores), dtype=int))
    idx = np.lexsort((-scores, -level))
    sign = 1.0 if kind == "binary" else -1.0
    ranked = [{"rank": i + 1, "score": sign * float(scores[j]),
               "std": float(res["std_test_score"][j]),
               "fit_seconds": float(res["mean_fit_time"][j]), "params": res["params"][j],
               **({"rounds": int(level[j])} if "n_resources" in res else {})}
              for i, j in enumerate(idx)]
    halving = "n_resources" in res
    # the union over the sub-grids (halving adds its resource, max_iter, to every candidate)
    keys = sorted({k for p in res["params"] for k in p if not (halving and k == "max_iter")})
    rows = [["rank", "F1" if kind == "binary" else "CV RMSE", "std", "fit s",
             *(["rounds"] if halving else []), *keys]]
    for r in ranked[:top]:
        values = [f"{v:g}" if isinstance(v, float) else str(v)
                  for v in (r["params"].get(k, "-") for k in keys)]
        rows.append([str(r["rank"]), f"{r['score']:.4f}", f"{r['std']:.4f}",
                     f"{r['fit_seconds']:.1f}", *([str(r["rounds"])] if halving else []),
                     *values])
    widths = [max(len(row[j]) for row in rows) for j in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    if len(ranked) > top:
        lines.append(f"... {len(ranked) - top} more in tune.json")
    return "\n".join(lines), ranked
