"""Every rating estimator with all its defaults: test RMSE, fit seconds, whether the factor
part was kept (``factors_used_``) and the evidence the floor read (issue 37).

    python benchmarks/bench_factors_kept.py                          # latest-small and shapes
    python benchmarks/bench_factors_kept.py --data ml,1m-shape
    python benchmarks/bench_factors_kept.py --ratings ml-100k:/path/to/u.data
    python benchmarks/bench_factors_kept.py --ratings filmtrust:/path/a.txt,/path/b.txt

Protocol: an 80/20 random split of the ratings (entry-wise, seed 0), every estimator with
all its defaults (``random_state=0`` only) through ``RatingRegressor``, scored on the test
part. ``z`` is the kept model's validation gain over the federated biases-only model in
standard errors (the floor with evidence, ``completion/_validation``; ``-`` where the fit has
no floor). ``--ratings NAME:PATH[,PATH...]`` reads whitespace-separated ``user item rating``
lines (more columns ignored; lines that do not parse are skipped, and so are user ids below
1 in a MovieLens ``u.data``) from local files that the repository does not ship: for
measuring on real data only. Data sets of ``bench_defaults.py`` by name, and ``1m-shape``:
``make_ratings`` at the MovieLens 1M shape (6040 x 3706, 1,000,000 ratings).
"""

import argparse
import time
import warnings

import numpy as np
import scipy.sparse as sp
from bench_accuracy import entrywise_split, pairs
from bench_defaults import load

from sklearn_fedmf import FedBaseline, FedMAvg, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf.datasets import make_ratings

MODELS = {"FedBaseline": (FedBaseline, {}), "FedMCADMM": (FedMCADMM, {}),
          "FedMAvg": (FedMAvg, {}), "FedMGS": (FedMGS, {}), "RFRec": (RFRec, {}),
          "RFRecF": (RFRec, {"solver_params": {"variant": "rfrecf"}})}


def read_ratings(paths, movielens_ids=False):
    """A CSR rating matrix from ``user item rating`` lines of the files ``paths``."""
    triples = []
    for path in paths:
        with open(path) as lines:
            for line in lines:
                fields = line.replace(",", " ").split()
                try:
                    triples.append([float(f) for f in fields[:3]])
                except (ValueError, IndexError):
                    continue
    a = np.array([t for t in triples if len(t) == 3])
    if movielens_ids:  # (MovieLens ids start at 1)
        a = a[(a[:, 0] >= 1) & (a[:, 1] >= 1)]
    users = np.unique(a[:, 0], return_inverse=True)[1]
    items = np.unique(a[:, 1], return_inverse=True)[1]
    return sp.csr_matrix((a[:, 2], (users, items)))


def run(name, X, models):
    X_train, X_test = entrywise_split(X)
    (P_train, y_train), (P_test, y_test) = pairs(X_train), pairs(X_test)
    for model_name in models:
        cls, params = MODELS[model_name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tic = time.perf_counter()
            model = RatingRegressor(cls(random_state=0, **params)).fit(P_train, y_train)
            seconds = time.perf_counter() - tic
        fitted = model.estimator_
        rmse = float(np.sqrt(np.mean((model.predict(P_test) - y_test) ** 2)))
        evidence = getattr(fitted, "_floor_evidence", None)
        z = "-" if evidence is None else f"{evidence[0] / max(evidence[1], 1e-300):.2f}"
        used = getattr(fitted, "factors_used_", None)
        print(f"{name:13s} {X.nnz:8d} {model_name:12s} {rmse:8.4f} {seconds:8.1f} "
              f"{str(used):>6s} {z:>7s}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="ml,100k-0.8,1m-1.0,filmtrust,douban,epinions")
    parser.add_argument("--ratings", action="append", default=[],
                        help="NAME:PATH[,PATH...] of a local rating file (never committed)")
    parser.add_argument("--estimators", default=",".join(MODELS))
    args = parser.parse_args()
    models = [m for m in args.estimators.split(",") if m]
    print(f"{'data':13s} {'ratings':>8s} {'estimator':12s} {'rmse':>8s} {'seconds':>8s} "
          f"{'kept':>6s} {'z':>7s}")
    for name in [n for n in args.data.split(",") if n]:
        X = (make_ratings(6040, 3706, 1_000_000, random_state=0).X.tocsr()
             if name == "1m-shape" else load(name))
        run(name, X, models)
    for spec in args.ratings:
        name, paths = spec.split(":", 1)
        run(name, read_ratings(paths.split(","), movielens_ids="u.data" in paths), models)


if __name__ == "__main__":
    main()
