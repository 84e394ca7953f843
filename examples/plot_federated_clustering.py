"""Federated clustering with label-skewed clients (FedMGS and FedMAvg on orthogonal NMF).

The samples are split among 20 clients, and each client holds samples of only two of the
five classes: the pathological non-i.i.d. split of federated learning
(:func:`~sklearn_fedmf.datasets.partition_label_skew`). ``FederatedClustering`` fits the
cluster centers by gradient sharing (FedMGS) or model averaging (FedMAvg). No client sends its
samples. The result is compared with k-means on the pooled data, which a federation cannot
run. The blobs differ in direction, because orthogonal NMF clusters by direction. The figure
shows the clustering accuracy (best matching of clusters to classes) and the objective per
round, and a 2-D PCA view of the clusters that FedMGS found.

Run ``python examples/plot_federated_clustering.py [--quick] [--out DIR]``.
"""

import argparse
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.cluster import KMeans  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402

from sklearn_fedmf import FederatedClustering  # noqa: E402
from sklearn_fedmf.datasets import partition_label_skew  # noqa: E402
from sklearn_fedmf.metrics import clustering_accuracy  # noqa: E402


def blobs(n_samples, n_features, n_clusters, rng):
    """Nonnegative blobs around centers drawn in U[0, 1]^M (well separated, as in Wang and
    Chang's Section V)."""
    centers = rng.random((n_clusters, n_features))
    y = rng.integers(n_clusters, size=n_samples)
    X = np.maximum(centers[y] + 0.3 * rng.normal(size=(n_samples, n_features)), 0.0)
    return X, y


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("FEDMF_QUICK")),
                        help="fewer samples and rounds (also FEDMF_QUICK=1)")
    parser.add_argument("--out", default="fedmf-out/examples", help="folder of the figure")
    args = parser.parse_args()
    n_samples, rounds = (400, 60) if args.quick else (2000, 1000)

    rng = np.random.default_rng(0)
    X, y = blobs(n_samples, 50, 5, rng)
    clients = partition_label_skew(y, 20, classes_per_client=2, random_state=0)
    kmeans = KMeans(5, n_init=10, random_state=0).fit(X)
    print(f"{'method':<24} {'accuracy':>8} {'rounds':>6} {'MB sent':>8}")
    print(f"{'k-means (pooled data)':<24} {clustering_accuracy(y, kmeans.labels_):>8.3f}")

    fig, (ax_acc, ax_obj, ax_pca) = plt.subplots(1, 3, figsize=(15, 4.3), layout="constrained")
    # one federation each (n_init=1), so that the curves follow its rounds; tol=0 runs every
    # round on purpose (the figure is the curve), so no ConvergenceWarning about tol
    common = dict(clients_per_round=5, max_iter=rounds, n_init=1, tol=0.0, random_state=0)
    models = {
        "FedMGS (gradient sharing)": FederatedClustering(5, algorithm="fedmgs", **common),
        "FedMAvg (model averaging)": FederatedClustering(5, algorithm="fedmavg", **common),
    }
    for name, model in models.items():
        accuracy = []
        model.set_params(callback=track_accuracy(X, y, accuracy))
        model.fit(X, clients=clients)
        sent = sum(h["bytes_uploaded"] + h["bytes_downloaded"] for h in model.history_)
        final = clustering_accuracy(y, model.labels_)
        print(f"{name:<24} {final:>8.3f} {model.n_iter_:>6} {sent / 1e6:>8.2f}")
        ax_acc.plot(np.arange(1, len(accuracy) + 1), accuracy, label=name)
        ax_obj.plot([h["round"] for h in model.history_],
                    [h["objective"] for h in model.history_], label=name)
    ax_acc.axhline(clustering_accuracy(y, kmeans.labels_), color="k", ls="--",
                   label="k-means, pooled data")
    ax_acc.set(xlabel="communication round", ylabel="clustering accuracy",
               title="Accuracy of the current centers", xscale="log")
    ax_obj.set(xlabel="communication round", ylabel="objective (log scale)",
               title="Penalized ONMF objective (rho grows: SNCP)", xscale="log", yscale="log")
    for ax in (ax_acc, ax_obj):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    coords = PCA(2, random_state=0).fit_transform(X)
    ax_pca.scatter(*coords.T, c=models["FedMGS (gradient sharing)"].labels_, s=6, cmap="tab10")
    ax_pca.set(xlabel="PC 1", ylabel="PC 2", title="FedMGS clusters (PCA of the samples)")
    fig.suptitle(f"{n_samples} samples, 5 classes, 20 clients holding 2 classes each, "
                 "5 sampled per round")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "federated_clustering.png", dpi=110)
    print(f"wrote {out / 'federated_clustering.png'}")


def track_accuracy(X, y, accuracy):
    """A ``callback(round, info)`` that records the accuracy of the current centers.

    A simulation diagnostic computed outside the clients: every sample goes to the center that
    fits it best up to a nonnegative scale (the rule of ``FederatedClustering.predict``).
    """

    def callback(round_number, info):
        W = info["server_state"]["W"]  # n_features x n_clusters
        norms = np.maximum((W * W).sum(axis=0), 1e-300)
        labels = np.argmax(np.maximum(X @ W, 0.0) ** 2 / norms, axis=1)
        accuracy.append(clustering_accuracy(y, labels))
        return False

    return callback


if __name__ == "__main__":
    main()
