"""Federated Boolean matrix factorization of noisy tiles (Felb, Felb-MU, one-shot baseline).

A binary matrix holds five planted Boolean tiles: disjoint blocks that are 90% ones. 10% of
its cells are flipped (XOR noise). Ten clients each hold a slice of its rows. Felb and
Felb-MU learn a shared Boolean item factor by proximal optimization. Each client uploads only
its relaxed copy of that factor at every synchronization. The one-shot ``AggregatedBMF``
factorizes each client's rows on their own and takes a majority vote. The figure shows the
data, the planted tiles and each reconstruction, with rows and columns ordered by tile so the
blocks are visible. F1* measures recovery of the planted tiles. F1 and RMSD measure the fit
to the noisy data.

Run ``python examples/plot_binary_factorization.py [--quick] [--out DIR]``.
"""

import argparse
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from sklearn_fedmf import AggregatedBMF, Felb  # noqa: E402
from sklearn_fedmf.datasets import make_binary_tiles  # noqa: E402
from sklearn_fedmf.metrics import f1_boolean, rmsd  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("FEDMF_QUICK")),
                        help="a smaller matrix and fewer synchronizations (also FEDMF_QUICK=1)")
    parser.add_argument("--out", default="fedmf-out/examples", help="folder of the figure")
    args = parser.parse_args()
    (n_rows, n_cols), syncs = ((200, 80), 20) if args.quick else ((1000, 300), 100)

    data = make_binary_tiles(n_rows, n_cols, 5, noise=0.1, overlap=False, random_state=0)
    X = data.X.toarray()
    common = dict(n_components=5, n_clients=10, random_state=0)
    models = {
        "Felb": Felb(max_iter=syncs, **common),
        "Felb-MU": Felb(solver_params={"update": "mu"}, max_iter=syncs, **common),
        "AggregatedBMF (one shot)": AggregatedBMF(local_iter=10 * syncs, **common),
    }
    # Order rows and columns by their planted tile (none last), so the tiles show as blocks.
    rows = np.argsort(np.where(data.U.any(axis=1), np.argmax(data.U, axis=1), 5), kind="stable")
    cols = np.argsort(np.where(data.V.any(axis=0), np.argmax(data.V, axis=0), 5), kind="stable")
    clean = data.X_clean.toarray()
    panels = [("data (10% of cells flipped)", X), ("planted tiles", clean)]
    print(f"{'method':<25} {'F1*':>6} {'F1':>6} {'RMSD':>6} {'kB up':>7}")
    for name, model in models.items():
        model.fit(X)
        X_hat = model.predict(X)  # Boolean U o V from each row's own fold-in
        up = sum(h["bytes_uploaded"] for h in model.history_) / 1e3
        print(f"{name:<25} {f1_boolean(clean, X_hat):>6.3f} {f1_boolean(X, X_hat):>6.3f}"
              f" {rmsd(X, X_hat):>6.3f} {up:>7.1f}")
        panels.append((f"{name}\nF1* = {f1_boolean(clean, X_hat):.3f}", X_hat))

    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 4.2),
                             layout="constrained")
    for ax, (title, image) in zip(axes, panels):
        ax.imshow(np.asarray(image, dtype=float)[rows][:, cols], cmap="Greys",
                  aspect="auto", interpolation="nearest")
        ax.set(title=title, xlabel="columns (items)", xticks=[], yticks=[])
    axes[0].set_ylabel("rows (held by 10 clients)")
    fig.suptitle(f"Boolean factorization of a {n_rows} x {n_cols} matrix with 5 planted tiles")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "binary_factorization.png", dpi=110)
    print(f"wrote {out / 'binary_factorization.png'}")


if __name__ == "__main__":
    main()
