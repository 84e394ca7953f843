"""Fingerprints of fitted models, to show that a reshaping of the code changes no result.

Fits every estimator on small data for a fixed ``random_state`` (plain and secure, both
losses, a few clients with many users each and one client per user, local threads and a
Dask cluster) and hashes each public fitted attribute and ``history_`` without its wall-clock
seconds. Record before a change, compare after::

    python benchmarks/fingerprints.py record before.json
    python benchmarks/fingerprints.py compare before.json        # exit status 1 on a change
    python benchmarks/fingerprints.py compare before.json --dask # the Dask cases too
    python benchmarks/fingerprints.py record grouped.json --grouped  # (a file of its own)

``--grouped`` fits instead one client per user on 700 users, enough for the engine to run the
clients in groups (its batched phases: the cases above have too few clients for that), plain,
with n_jobs 1 and 2 (~40 s).

Only the public API is used, so the script runs on any layout of the package.
"""

import argparse
import hashlib
import json
import sys
import time
import warnings

import numpy as np
import scipy.sparse as sp

from sklearn_fedmf import (
    AggregatedBMF,
    FedBaseline,
    FedBlend,
    FederatedClustering,
    FedMAvg,
    FedMCADMM,
    FedMGS,
    Felb,
    RatingRegressor,
    RFRec,
)
from sklearn_fedmf.datasets import make_binary_tiles, make_ratings


def _ratings():
    X = make_ratings(120, 40, 2400, n_components=3, random_state=0).X.tocsr()
    coo = X.tocoo()
    held = np.random.default_rng(0).random(X.nnz) < 0.2
    train = sp.csr_matrix((coo.data[~held], (coo.row[~held], coo.col[~held])), shape=X.shape)
    test = sp.csr_matrix((coo.data[held], (coo.row[held], coo.col[held])), shape=X.shape)
    return train, test


def _binary():
    return make_binary_tiles(60, 30, 3, noise=0.02, random_state=0).X


def cases():
    """``{name: (make_estimator, data kind)}``: every family, both losses, both paths."""
    few = dict(n_clients=6, clients_per_round=4, max_iter=4, random_state=0)
    per_user = dict(n_clients=120, clients_per_round=0.25, max_iter=3, random_state=0)
    out = {}
    completion = {"FedMCADMM": FedMCADMM, "FedMAvg": FedMAvg, "FedMGS": FedMGS, "RFRec": RFRec}
    for name, cls in completion.items():
        for loss in ("squared", "implicit"):
            for path, params in (("few", few), ("per_user", per_user)):
                for secure in (False, True):
                    key = f"{name}-{loss}-{path}-{'secure' if secure else 'plain'}"
                    out[key] = (lambda cls=cls, p=params, loss=loss, s=secure: cls(
                        loss=loss, secure_aggregation=s, **p), "ratings")
        out[f"{name}-no-validation-few"] = (lambda cls=cls: cls(
            n_clients=6, max_iter=4, random_state=0, early_stopping=False), "ratings")
        out[f"{name}-eval-set-secure"] = (lambda cls=cls: cls(
            n_clients=6, max_iter=4, random_state=0, secure_aggregation=True), "eval")
    for secure in (False, True):
        tag = "secure" if secure else "plain"
        out[f"FedBaseline-{tag}"] = (lambda s=secure: FedBaseline(
            n_clients=6, max_iter=4, random_state=0, secure_aggregation=s), "ratings")
        out[f"FedBlend-{tag}"] = (lambda s=secure: FedBlend(
            [("mgs", FedMGS(max_iter=3)), ("mavg", FedMAvg(max_iter=3))],
            n_clients=6, random_state=0, secure_aggregation=s), "ratings")
    out["FedMCADMM-dropout-secure"] = (lambda: FedMCADMM(
        n_clients=10, max_iter=4, random_state=0, secure_aggregation=True,
        solver_params={"dropout": 0.25}), "ratings")
    out["RatingRegressor"] = (lambda: RatingRegressor(
        FedMGS(n_clients=6, max_iter=3, random_state=0)), "pairs")
    out["Felb"] = (lambda: Felb(n_components=3, n_clients=4, max_iter=4, random_state=0),
                   "binary")
    out["AggregatedBMF"] = (lambda: AggregatedBMF(n_components=3, n_clients=4,
                                                  random_state=0), "binary")
    out["FederatedClustering"] = (lambda: FederatedClustering(
        n_clusters=3, n_clients=4, max_iter=4, random_state=0), "binary")
    out["FederatedClustering-secure"] = (lambda: FederatedClustering(
        n_clusters=3, n_clients=4, max_iter=4, random_state=0, algorithm="fedmavg",
        init="random", secure_aggregation=True), "binary")
    return out


def grouped_cases():
    """One client per user on :func:`_grouped_ratings` (grouped clients): ``{name: make}``."""
    out = {}
    for name, cls in {"FedMCADMM": FedMCADMM, "FedMAvg": FedMAvg, "FedMGS": FedMGS,
                      "RFRec": RFRec}.items():
        for loss in ("squared", "implicit"):
            for n_jobs in (1, 2):
                out[f"{name}-{loss}-grouped-{n_jobs}"] = (
                    lambda cls=cls, loss=loss, n_jobs=n_jobs: cls(
                        loss=loss, max_iter=4, clients_per_round=0.2, random_state=0,
                        n_jobs=n_jobs))
    return out


def _grouped_ratings():
    return make_ratings(700, 150, 14000, n_components=3, random_state=0).X.tocsr()


def run_grouped(names=None):
    X = _grouped_ratings()
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, make in grouped_cases().items():
            if names and name not in names:
                continue
            tic = time.perf_counter()
            out[name] = fingerprint(make().fit(X, clients=np.arange(X.shape[0])))
            print(f"{name:40s} {time.perf_counter() - tic:6.2f} s", file=sys.stderr)
    return out


def _timing(key):
    """Wall-clock and CPU times: the one part of a record that may differ between runs."""
    return "seconds" in key or key.endswith("_s") or "_s_" in key


def _digest(value):
    if isinstance(value, np.ndarray):
        return hashlib.sha256(repr((value.dtype.str, value.shape)).encode()
                              + np.ascontiguousarray(value).tobytes()).hexdigest()[:16]
    if sp.issparse(value):
        value = value.tocsr()
        return _digest(np.concatenate([value.indptr.astype(np.float64),
                                       value.indices.astype(np.float64), value.data]))
    if isinstance(value, dict):
        return {str(k): _digest(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))
                if not _timing(str(k))}
    if isinstance(value, (list, tuple)):
        return [_digest(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value).hex()
    if isinstance(value, (int, np.integer, bool, np.bool_, str)) or value is None:
        return value if not isinstance(value, np.generic) else value.item()
    if hasattr(value, "get_params"):  # a fitted member estimator
        return fingerprint(value)
    return type(value).__name__  # (an object without a value to compare: its kind)


def fingerprint(model):
    """``{attribute: digest}`` of every public fitted attribute, ``history_`` without
    seconds."""
    return {k: _digest(v) for k, v in sorted(vars(model).items())
            if k.endswith("_") and not k.startswith("_")}


def run(names=None, dask=False):
    train, test = _ratings()
    coo = train.tocoo()
    data = {"ratings": train, "binary": _binary(),
            "pairs": (np.column_stack([coo.row, coo.col]), coo.data)}
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (make, kind) in cases().items():
            if names and name not in names:
                continue
            X = data.get(kind)
            if kind == "eval":
                def fit(m):
                    return m.fit(train, eval_set=test)
            elif kind == "pairs":
                def fit(m, X=X):
                    return m.fit(*X)
            else:
                def fit(m, X=X):
                    return m.fit(X)
            tic = time.perf_counter()
            try:
                out[name] = fingerprint(fit(make()))
            except ValueError as exc:  # a refused setting: its message is the result
                out[name] = {"refused": str(exc)}
                continue
            if dask and not name.endswith("secure") and kind != "pairs":
                from joblib import parallel_config

                with parallel_config(backend="dask"):
                    out[name + "-dask"] = fingerprint(fit(make().set_params(n_jobs=2)))
            print(f"{name:40s} {time.perf_counter() - tic:6.2f} s", file=sys.stderr)
    return out


def _differences(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                yield f"{path}/{key}: only in {'before' if key in a else 'after'}"
            else:
                yield from _differences(a[key], b[key], f"{path}/{key}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: {str(a)[:60]} != {str(b)[:60]}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("record", "compare"))
    parser.add_argument("file")
    parser.add_argument("--dask", action="store_true", help="the Dask cases too")
    parser.add_argument("--only", nargs="*", help="case names (default: every case)")
    parser.add_argument("--grouped", action="store_true",
                        help="only the grouped cases: one client per user on 700 users")
    args = parser.parse_args(argv)
    if args.grouped and args.dask:
        parser.error("--grouped runs in this process (Dask keeps one block per client)")
    cluster = None
    if args.dask:
        import distributed

        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None)
        client = distributed.Client(cluster)
    try:
        now = run_grouped(args.only) if args.grouped else run(args.only, args.dask)
    finally:
        if cluster is not None:
            client.close()
            cluster.close()
    if args.action == "record":
        with open(args.file, "w") as f:
            json.dump(now, f, indent=1, sort_keys=True)
        print(f"recorded {len(now)} fits in {args.file}")
        return 0
    with open(args.file) as f:
        before = json.load(f)
    if args.only:
        before = {k: v for k, v in before.items() if k in now}
    diffs = list(_differences(before, now))
    print(f"{len(now)} fits compared: {len(diffs)} differences")
    for line in diffs[:50]:
        print(" ", line)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
