"""Every rating estimator's default fit with one client per user at the ML-10M and Netflix
shapes: fit seconds, peak memory, test RMSE (issue 38, point 3).

    python benchmarks/bench_scale_per_user.py --shape ml10m              # every estimator
    python benchmarks/bench_scale_per_user.py --shape netflix --estimators FedMGS
    python benchmarks/bench_scale_per_user.py --shape smoke              # seconds

The shapes: ``ml10m`` is ``make_ratings(69878, 10677, 10_000_054, random_state=0)``
(MovieLens 10M's users, items and ratings), ``netflix`` ``make_ratings(480189, 17770,
100_480_507, random_state=0)``, ``smoke`` 2,000 users, 800 items, 60,000 ratings. The matrix
is generated once and kept in ``--cache-dir`` (the Netflix shape takes about a minute and 2
GB to generate). It is split 80/20 within each user (``train_test_split_ratings``, seed 0).
Each estimator (FedMGS, FedMAvg, FedMCADMM, RFRec) fits the training part with its defaults
but ``random_state=0`` and ``clients_per_round=0.01`` (1% of the clients per round),
``fit(X_train, clients=np.arange(n_users))``: one client per user, grouped
(``GroupedTransport``). Each fit runs in a fresh Python process, so that its peak resident
memory (its own ``ru_maxrss``, Linux: the training and test matrices included) is its own;
``--timeout`` and ``--max-gb`` stop a fit that runs longer or grows larger (the row
then says so).

Columns: rounds run, fit seconds (wall) and CPU seconds (all threads), the process's resident
memory before the fit, at its peak during the rounds (``ru_maxrss`` when early stopping
restores the best round: the federation's own peak, before the biases floor's fits that
follow it), at the end of the fit (the fit's peak) and at its peak after the predict (GB),
and the test RMSE of ``predict(X_train, at=X_test)`` (fold-in of each user's training
ratings, as ``score`` does). The targets of issue 38: at most 3 minutes per fit at the ML-10M
shape, 20 minutes and 16 GB at the Netflix shape, on two cores.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SHAPES = {"ml10m": (69_878, 10_677, 10_000_054), "netflix": (480_189, 17_770, 100_480_507),
          "smoke": (2_000, 800, 60_000)}
ESTIMATORS = ("FedMGS", "FedMAvg", "FedMCADMM", "RFRec")


def cached_split(shape, cache_dir):
    """The 80/20 split of the shape's ``make_ratings`` matrix, made once and kept as .npy."""
    import scipy.sparse as sp

    path = Path(cache_dir) / "per_user_{}x{}_{}_seed0".format(*SHAPES[shape])
    parts = ("train", "test")
    if not (path / "test_data.npy").exists():
        from sklearn_fedmf.datasets import make_ratings
        from sklearn_fedmf.model_selection import train_test_split_ratings

        X = make_ratings(*SHAPES[shape], random_state=0).X.tocsr()
        split = train_test_split_ratings(X, 0.2, random_state=0)
        del X
        path.mkdir(parents=True, exist_ok=True)
        for part, M in zip(parts, split):
            for name in ("indptr", "indices", "data"):
                np.save(path / f"{part}_{name}.npy", getattr(M, name))
    n_users, n_items, _ = SHAPES[shape]
    return [sp.csr_matrix(tuple(np.load(path / f"{part}_{name}.npy")
                                for name in ("data", "indices", "indptr")),
                          shape=(n_users, n_items)) for part in parts]


def run_one(name, shape, cache_dir, spill_gb=None):
    """Fit one estimator in this process; return its figures."""
    import functools
    import warnings

    import psutil

    import sklearn_fedmf
    from sklearn_fedmf.completion import _validation
    from sklearn_fedmf.engine import _early_stopping

    if spill_gb is not None:  # (the best round's copy to the file from this size on)
        _validation.EarlyStopping = functools.partial(_early_stopping.EarlyStopping,
                                                      spill_bytes=int(spill_gb * 2**30))

    train, test = cached_split(shape, cache_dir)
    before = psutil.Process().memory_info().rss / 2**30
    rounds_peak = []
    restore = _early_stopping._BestRound.restore

    def noted_restore(self, state):  # (the peak so far: the rounds', with the data)
        rounds_peak.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
        return restore(self, state)

    _early_stopping._BestRound.restore = noted_restore
    estimator = getattr(sklearn_fedmf, name)(random_state=0, clients_per_round=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tic, cpu = time.perf_counter(), time.process_time()
        estimator.fit(train, clients=np.arange(train.shape[0]))
        seconds, cpu_seconds = time.perf_counter() - tic, time.process_time() - cpu
    fit_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # (before predict)
    predicted = estimator.predict(train, at=test)
    rmse = float(np.sqrt(np.mean((predicted.data - test.data) ** 2)))
    return {"estimator": name, "rounds": len(estimator.history_), "seconds": seconds,
            "cpu_seconds": cpu_seconds, "before_gb": before, "rmse": rmse,
            "n_components": int(estimator.components_.shape[0]),
            "rounds_gb": rounds_peak[0] if rounds_peak else float("nan"), "fit_gb": fit_gb,
            "warnings": sorted({str(w.message)[:80] for w in caught}),
            # (the process's own peak: ru_maxrss is in KiB on Linux)
            "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def run_in_subprocess(name, shape, cache_dir, timeout, max_gb, spill_gb=None):
    """One fit in a fresh Python, stopped past ``timeout`` seconds or ``max_gb`` GB resident
    (polled every 2 s: a shared machine's memory is not all this fit's)."""
    import psutil

    spec = json.dumps({"name": name, "shape": shape, "cache_dir": str(cache_dir),
                       "spill_gb": spill_gb})
    child = subprocess.Popen([sys.executable, __file__, "--worker", spec],
                             stdout=subprocess.PIPE, text=True)
    watched, start, error = psutil.Process(child.pid), time.perf_counter(), None
    while child.poll() is None:
        try:
            rss = watched.memory_info().rss / 2**30
        except psutil.NoSuchProcess:
            break
        if rss > max_gb:
            error = f"stopped at {rss:.1f} GB resident, after {time.perf_counter() - start:.0f} s"
        elif time.perf_counter() - start > timeout:
            error = f"stopped after {timeout:.0f} s at {rss:.1f} GB resident"
        if error:
            cpu = watched.cpu_times()
            error += f" ({cpu.user + cpu.system:.0f} CPU s, data loading included)"
            child.kill()  # (this script's own child)
            child.communicate()
            return {"estimator": name, "error": error}
        time.sleep(2.0)
    out, _ = child.communicate()
    if child.returncode != 0:
        return {"estimator": name, "error": f"exit code {child.returncode}"}
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="ml10m", choices=tuple(SHAPES))
    parser.add_argument("--estimators", default=",".join(ESTIMATORS))
    parser.add_argument("--timeout", type=float, default=1500.0,
                        help="seconds after which a fit is stopped (default 25 minutes)")
    parser.add_argument("--max-gb", type=float, default=16.0,
                        help="resident GB past which a fit is stopped")
    parser.add_argument("--cache-dir", default=Path(os.environ.get(
        "XDG_CACHE_HOME", Path.home() / ".cache")) / "sklearn_fedmf_bench")
    parser.add_argument("--spill-gb", type=float, default=None,
                        help="early stopping's copy goes to a file from this many GiB on "
                             "(default: the library's, 4; at the ML-10M shape 0 shows the "
                             "Netflix shape's case, whose copies are all above it)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(run_one(spec["name"], spec["shape"], spec["cache_dir"],
                                 spec.get("spill_gb"))))
        return
    tic = time.perf_counter()
    train, test = cached_split(args.shape, args.cache_dir)
    print(f"{args.shape}: {train.shape[0]:,} users (one client each) x {train.shape[1]:,} "
          f"items; {train.nnz:,} training and {test.nnz:,} test ratings (split ready in "
          f"{time.perf_counter() - tic:.0f} s); 1% of the clients per round; load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    del train, test
    print(f"{'estimator':<11}{'rank':>5}{'rounds':>7}{'fit s':>8}{'cpu s':>8}"
          f"{'GB before':>10}{'rounds GB':>10}{'fit GB':>8}{'peak GB':>9}{'test RMSE':>10}",
          flush=True)
    for name in args.estimators.split(","):
        row = run_in_subprocess(name, args.shape, args.cache_dir, args.timeout,
                                args.max_gb, args.spill_gb)
        if "error" in row:
            print(f"{name:<11}{row['error']}", flush=True)
            continue
        print(f"{name:<11}{row['n_components']:>5}{row['rounds']:>7}{row['seconds']:>8.1f}"
              f"{row['cpu_seconds']:>8.1f}{row['before_gb']:>10.2f}{row['rounds_gb']:>10.2f}"
              f"{row['fit_gb']:>8.2f}"
              f"{row['peak_gb']:>9.2f}"
              f"{row['rmse']:>10.4f}   load {os.getloadavg()[0]:.1f}", flush=True)
        for message in row["warnings"]:
            print(f"    warning: {message}")


if __name__ == "__main__":
    main()
