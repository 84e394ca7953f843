"""The biases floor's FedBaseline fit alone with one client per user (issue 38): CPU seconds.

    python benchmarks/bench_floor_per_user.py --shape ml10m --repeat 3 [--n-jobs 1]

The fit is the plain floor's (``completion._validation._fit_floor`` without secure aggregation):
``FedBaseline`` with its defaults (every client in each of 20 rounds) but ``random_state=0``,
``n_jobs`` (the fit's; default None) and ``solver_params={"eval_every": 0}``, ``fit(X_train,
clients=np.arange(n_users))`` on the training part of :mod:`bench_scale_per_user`'s cached split
(grouped clients, ``GroupedTransport``). A default rating fit runs this twice. Each repeat runs in a
fresh Python process (numba's compilations cached on disk by a first, unprinted run). Columns: CPU
and wall seconds of the fit, and a digest of the fitted biases and of every round's byte counts (the
same digest on two trees: the same model, bit for bit, and the same bytes). To compare trees,
alternate runs with ``PYTHONPATH`` set to each.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_scale_per_user import SHAPES, cached_split  # noqa: E402


def run_one(shape, cache_dir, n_jobs):
    """Fit the floor in this process; return its figures."""
    from sklearn_fedmf import FedBaseline

    train, _ = cached_split(shape, cache_dir)
    floor = FedBaseline(n_clients=train.shape[0], random_state=0, n_jobs=n_jobs,
                        solver_params={"eval_every": 0})
    tic, cpu = time.perf_counter(), time.process_time()
    floor.fit(train, clients=np.arange(train.shape[0]))
    seconds, cpu_seconds = time.perf_counter() - tic, time.process_time() - cpu
    digest = hashlib.sha1(floor.user_bias_.tobytes() + floor.item_bias_.tobytes()
                          + repr([(r["bytes_uploaded"], r["bytes_downloaded"])
                                  for r in floor.history_]).encode()).hexdigest()[:12]
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "digest": digest,
            "rounds": len(floor.history_)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="ml10m", choices=tuple(SHAPES))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--n-jobs", type=int, default=None)
    parser.add_argument("--cache-dir", default=Path(os.environ.get(
        "XDG_CACHE_HOME", Path.home() / ".cache")) / "sklearn_fedmf_bench")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(run_one(args.shape, args.cache_dir, args.n_jobs)))
        return
    import sklearn_fedmf

    print(f"{args.shape}: the floor's FedBaseline fit, one client per user, n_jobs="
          f"{args.n_jobs} ({sklearn_fedmf.__file__})")
    print(f"{'run':>4}{'rounds':>7}{'fit s':>8}{'cpu s':>8}  digest")
    command = [sys.executable, __file__, "--worker", "--shape", args.shape,
               "--cache-dir", str(args.cache_dir)]
    command += [] if args.n_jobs is None else ["--n-jobs", str(args.n_jobs)]
    subprocess.run(command, check=True, capture_output=True)  # (numba's cache, unprinted)
    for run in range(args.repeat):
        row = json.loads(subprocess.run(command, check=True, capture_output=True,
                                        text=True).stdout.strip().splitlines()[-1])
        print(f"{run + 1:>4}{row['rounds']:>7}{row['seconds']:>8.2f}{row['cpu_seconds']:>8.2f}"
              f"  {row['digest']}   load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
