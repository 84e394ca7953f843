"""FedMC-ADMM with one client per user, its combinations' values held or made
(``solver_params["cache_rows"]`` True or False): fit seconds, CPU seconds, the consensus
metric's seconds, peak memory and test RMSE, side by side.

    python benchmarks/bench_fedmc_admm_cache_rows.py                  # 20,000 x 5,000, 2M
    python benchmarks/bench_fedmc_admm_cache_rows.py --shape ml10m    # the ML-10M shape

``mid`` is ``make_ratings(20000, 5000, 2_000_000, random_state=0)``, ``ml10m`` the split of
``bench_scale_per_user.py`` (cached in ``--cache-dir``); both split 80/20 within each user.
Each fit is ``FedMCADMM(random_state=0, clients_per_round=0.01)`` with its defaults
otherwise, ``fit(X_train, clients=np.arange(n_users))``, in a fresh process (its own peak),
the two layouts alternating ``--repeats`` times. "consensus s" is the wall time inside the
metric's kernel (``lazy_consensus``). The models are the same bits either way (the RMSE
column shows it to its digits); ``"auto"`` picks the held values while the state with them
takes at most half of the available memory.
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


def split(shape, cache_dir):
    if shape == "ml10m":
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_scale_per_user import cached_split

        return cached_split("ml10m", cache_dir)
    from sklearn_fedmf.datasets import make_ratings
    from sklearn_fedmf.model_selection import train_test_split_ratings

    X = make_ratings(20000, 5000, 2_000_000, random_state=0).X.tocsr()
    return train_test_split_ratings(X, 0.2, random_state=0)


def run_one(shape, cache_rows, cache_dir):
    import warnings

    import sklearn_fedmf
    from sklearn_fedmf.completion._fedmc_admm import _fedmc_admm_batched as batched

    train, test = split(shape, cache_dir)
    spent = [0.0]
    consensus = batched.lazy_consensus

    def timed(*args):
        tic = time.perf_counter()
        out = consensus(*args)
        spent[0] += time.perf_counter() - tic
        return out

    batched.lazy_consensus = timed
    est = sklearn_fedmf.FedMCADMM(random_state=0, clients_per_round=0.01,
                                  solver_params={"cache_rows": cache_rows})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tic, cpu = time.perf_counter(), time.process_time()
        est.fit(train, clients=np.arange(train.shape[0]))
        seconds, cpu_seconds = time.perf_counter() - tic, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    predicted = est.predict(train, at=test)
    return {"seconds": seconds, "cpu": cpu_seconds, "consensus": spent[0], "peak_gb": peak,
            "rmse": float(np.sqrt(np.mean((predicted.data - test.data) ** 2)))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="mid", choices=("mid", "ml10m"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache-dir", default=Path(os.environ.get(
        "XDG_CACHE_HOME", Path.home() / ".cache")) / "sklearn_fedmf_bench")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(run_one(spec["shape"], spec["cache_rows"], spec["cache_dir"])))
        return
    print(f"{args.shape}: one client per user, 1% per round; load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
    print(f"{'cache_rows':<11}{'fit s':>8}{'CPU s':>8}{'consensus s':>13}{'peak GB':>9}"
          f"{'test RMSE':>11}", flush=True)
    for _ in range(args.repeats):
        for cache_rows in (True, False):
            spec = json.dumps({"shape": args.shape, "cache_rows": cache_rows,
                               "cache_dir": str(args.cache_dir)})
            out = subprocess.run([sys.executable, __file__, "--worker", spec], check=True,
                                 capture_output=True, text=True).stdout
            row = json.loads(out.strip().splitlines()[-1])
            print(f"{str(cache_rows):<11}{row['seconds']:>8.1f}{row['cpu']:>8.1f}"
                  f"{row['consensus']:>13.1f}{row['peak_gb']:>9.2f}{row['rmse']:>11.6f}"
                  f"   load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
