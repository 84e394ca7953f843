"""What the ``fedmf`` command shows and writes: the results table of ``run``, the ranked
table of ``tune``, the figure of the per-round histories, the ``--out`` folder and its JSON."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ._messages import CommandError, _note


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
    legend = rows_legend(results)
    if legend:
        lines.append(legend)
    return "\n".join(lines)


_ROW_MEANINGS = {
    "mean": "global mean = the training mean",
    "baseline": "biases only = FedBaseline (mean + user and item biases)",
    "papers": "(papers) = PAPER_SETTINGS",
    "defaults": "(defaults) = the estimator's defaults",
}


def rows_legend(results):
    """The line under the table that says what each kind of row is ('' for one kind)."""
    kinds = list(dict.fromkeys(r.get("settings", "") for r in results))
    parts = [_ROW_MEANINGS[k] for k in kinds if k in _ROW_MEANINGS]
    if len(parts) < 2:
        return ""
    return ("rows: " + "; ".join(parts) + ". Same split, clients and rounds; seconds "
            "exclude compilation (an untimed warm-up round first)")


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
    styles = iter([":", "--", "-."])
    # one colour per method; its defaults row dashed beside its papers' row
    colours = {m: f"C{k}" for k, m in enumerate(dict.fromkeys(
        r["method"] for r in results if r.get("settings") not in ("mean", "baseline")))}
    for r in results:
        if r.get("settings") in ("mean", "baseline"):  # yardsticks: their final test RMSE
            axes[1].axhline(r["summary"]["eval_rmse"], color="0.35", lw=1.2,
                            ls=next(styles, ":"), label=r["label"])
            continue
        for ax, key in zip(axes, ("objective", right)):
            pts = [(h["round"], h[key]) for h in r["history"] if h.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), label=r["label"], lw=1.8, color=colours[r["method"]],
                        ls="--" if r.get("settings") == "defaults" else "-")
    axes[0].set_yscale("log")
    axes[0].set_title("Relaxed objective (its weight lambda_t grows)" if binary
                      else "Training objective")
    same = len({r["objective"] for r in results
                if r.get("settings") not in ("mean", "baseline")}) == 1
    axes[0].set_ylabel("objective (log scale)" if same
                       else "objective, each method's own (log scale)")
    axes[1].set_title("F1 on the training data" if binary else "Test RMSE")
    axes[1].set_ylabel(right_label)
    for ax in axes:
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("communication round")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # (the yardsticks alone draw no objective)
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


def output_folder(text, files):
    """The ``--out`` folder, created now, so that a bad path fails before any fit."""
    out = Path(text).expanduser()
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {text}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"--out {text}: cannot create the folder ({exc.strerror})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise CommandError(f"--out {text}: the folder is not writable")
    for name in files:
        if (out / name).is_dir():
            raise CommandError(f"--out {text}: {out / name} is a folder, not a file")
    return out


def jsonable(obj):
    """``obj`` with numpy scalars as Python numbers and unknown objects as their repr."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.integer, np.bool_)):
        return obj.item()
    if isinstance(obj, np.floating):
        return float(obj)
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return repr(obj)
