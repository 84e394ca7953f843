"""One table: every estimator's round cost, throughput, peak memory and final RMSE.

For each estimator found in ``sklearn_fedmf`` (FedMCADMM, FedMAvg, FedMGS, RFRec, Felb; a
missing one is skipped), each synthetic shape and each ``n_jobs``, one fit runs in a fresh
subprocess so that its peak resident memory (``ru_maxrss`` of that process, data included) is
its own. The matrices come from ``make_ratings`` and are cached on disk (``--cache-dir``), so
the Netflix shape (~50 s and ~1.5 GB to generate) is built once.

    python benchmarks/run_all.py --quick                       # tiny shapes, seconds
    python benchmarks/run_all.py --shapes ml1m                 # ML-1M shape, every method
    python benchmarks/run_all.py --shapes netflix --methods FedMCADMM --rounds 100
    python benchmarks/run_all.py --shapes netflix --methods FedMCADMM --float32
    python benchmarks/run_all.py --shapes ml1m --clients 100,per-user --rounds 20

Workload (the papers'): 100 clients, 10 sampled per round, N = 10 local steps, rank 5 on the
ML-1M shape and 13 on the Netflix shape, ``random_state=0``; the fit uses all ratings.
``--clients per-user`` is the cross-device layout: one client per user (row), 10% of them
per round on the ML-1M shape and 1% on the Netflix shape.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SHAPES = {"ml1m": (6040, 3706, 1_000_209), "netflix": (480_189, 17_770, 100_000_000)}
QUICK_SHAPES = {"ml1m": (600, 400, 30_000), "netflix": (3_000, 1_200, 240_000)}
RANK = {"ml1m": 5, "netflix": 13}
EVAL_EVERY = {"ml1m": 10, "netflix": 25}
# name -> (settings, local steps per round as the method counts them)
METHODS = {
    "FedMCADMM": (dict(local_iter=10), "local_iter"),
    "FedMAvg": (dict(local_iter_u=10), "local_iter_u"),
    "FedMGS": (dict(local_iter_u=10), "local_iter_u"),
    "RFRec": (dict(), None),  # one local step per round (its default: GD, learning_rate="auto")
    "Felb": (dict(sync_every=10, binarize=3.5), "sync_every"),  # Boolean: ratings >= 4
}
PER_USER_FRACTION = {"ml1m": 0.1, "netflix": 0.01}  # clients per round, one client per user
DENSE_ONLY = {"Felb"}  # Boolean factorization of the full matrix: not at the Netflix shape


def cached_matrix(shape_name, quick, cache_dir):
    """The ``make_ratings`` matrix of that shape, generated once and kept as .npy files."""
    import scipy.sparse as sp

    shape = (QUICK_SHAPES if quick else SHAPES)[shape_name]
    path = Path(cache_dir) / ("ratings_{}x{}_{}_seed0".format(*shape))
    if not (path / "data.npy").exists():
        from sklearn_fedmf.datasets import make_ratings

        X = make_ratings(*shape, n_components=RANK[shape_name], random_state=0).X
        path.mkdir(parents=True, exist_ok=True)
        for name in ("indptr", "indices", "data"):
            np.save(path / f"{name}.npy", getattr(X, name))
    parts = [np.load(path / f"{name}.npy") for name in ("data", "indices", "indptr")]
    X = sp.csr_matrix(tuple(parts), shape=shape[:2])
    X.has_canonical_format = True
    return X


def thread_capacity(n_threads=2, n=30_000_000):
    """How much faster ``n_threads`` threads run a perfectly parallel nogil loop than one.

    ``n_threads`` on idle cores; less when other processes hold the cores. It calibrates the
    n_jobs speed-ups of a shared machine.
    """
    from concurrent.futures import ThreadPoolExecutor

    from numba import njit

    @njit(nogil=True)
    def spin(n):
        s = 0.0
        for i in range(n):
            s += (i % 7) * 0.5
        return s

    spin(10)
    tic = time.perf_counter()
    for _ in range(n_threads):
        spin(n)
    one = time.perf_counter() - tic
    tic = time.perf_counter()
    with ThreadPoolExecutor(n_threads) as pool:
        list(pool.map(spin, [n] * n_threads))
    return one / (time.perf_counter() - tic)


def run_one(method, shape_name, n_jobs, rounds, quick, cache_dir, float32=False,
            clients="100"):
    """Fit one configuration in this process; return its figures."""
    import sklearn_fedmf
    from sklearn_fedmf.engine._fit import route_solver_params

    X = cached_matrix(shape_name, quick, cache_dir)
    if float32:  # (estimators without a float32 solver convert back to float64)
        X = X.astype(np.float32)
    settings, steps_param = METHODS[method]
    estimator = getattr(sklearn_fedmf, method)()
    names = estimator.get_params()
    params = dict(n_components=RANK[shape_name], n_clients=100, random_state=0, n_jobs=n_jobs,
                  **settings)
    fit_params = {}
    if clients == "per-user":
        fit_params["clients"] = np.arange(X.shape[0])
        per_round = PER_USER_FRACTION[shape_name]
    else:
        per_round = 10
    if "clients_per_round" in names:
        params.update(clients_per_round=per_round, max_iter=rounds,
                      eval_every=EVAL_EVERY[shape_name])
    else:  # Felb: every client works in every round
        params.update(max_iter=rounds)
    sampled = []
    if method not in DENSE_ONLY:
        params["callback"] = lambda k, info: sampled.append(np.asarray(info["sampled"]))
    estimator.set_params(**route_solver_params(type(estimator), params))

    capacity = thread_capacity()
    tic, cpu = time.perf_counter(), time.process_time()
    estimator.fit(X, **fit_params)
    fit_seconds, cpu_seconds = time.perf_counter() - tic, time.process_time() - cpu
    capacity = (capacity + thread_capacity()) / 2

    history = estimator.history_
    labels = np.unique(estimator.clients_, return_inverse=True)[1]
    client_nnz = np.bincount(labels, weights=np.diff(X.indptr))
    if method in DENSE_ONLY:  # every client, every cell of its rows
        touched = X.shape[0] * X.shape[1]
    else:
        touched = np.mean([client_nnz[s].sum() for s in sampled])
    round_seconds = float(np.median([r["seconds"] for r in history]))
    steps = params[steps_param] if steps_param else 1
    metric = next((k for k in ("train_rmse", "rmsd", "objective") if k in history[-1]), None)
    in_float32 = getattr(estimator, "components_", None) is not None and \
        estimator.components_.dtype == np.float32
    return {
        "method": method + (" f32" if in_float32 else ""), "shape": shape_name,
        "clients": clients, "n_clients": int(estimator.n_clients_),
        "n_jobs": n_jobs, "rounds": len(history),
        "nnz": int(X.nnz), "fit_seconds": fit_seconds, "cpu_seconds": cpu_seconds,
        "round_seconds": round_seconds, "load": os.getloadavg()[0], "capacity": capacity,
        "throughput": touched * steps / round_seconds,
        "metric": metric, "final": float(history[-1][metric]) if metric else float("nan"),
    }


def run_in_subprocess(method, shape_name, n_jobs, rounds, quick, cache_dir, float32=False,
                      clients="100"):
    """Run one configuration in a fresh Python; add its peak RSS (the child's own rusage)."""
    spec = json.dumps(dict(method=method, shape_name=shape_name, n_jobs=n_jobs, rounds=rounds,
                           quick=quick, cache_dir=str(cache_dir), float32=float32,
                           clients=clients))
    child = subprocess.Popen([sys.executable, __file__, "--worker", spec],
                             stdout=subprocess.PIPE, text=True)
    out = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        return {"method": method, "shape": shape_name, "n_jobs": n_jobs, "clients": clients,
                "error": f"exit code {child.returncode}"}
    result = json.loads(out.strip().splitlines()[-1])
    scale = 2**30 if sys.platform == "darwin" else 2**20  # ru_maxrss: bytes on macOS, KiB
    result["peak_gb"] = usage.ru_maxrss / scale
    return result


def print_table(rows, rounds):
    print(f"Round cost per estimator; {rounds} rounds, N = 10 local steps, rank 5 (ML-1M shape) "
          "/ 13 (Netflix shape), the whole matrix as training data. clients: 100 (10 per round) "
          "or one per user (10% per round on ML-1M, 1% on Netflix); x100: s/round against the "
          "100-client row of the same method, shape and n_jobs.")
    print("s/round: median wall time of a round without the evaluation (objective and RMSE are "
          f"evaluated every {EVAL_EVERY['ml1m']} rounds on ML-1M, every "
          f"{EVAL_EVERY['netflix']} on Netflix, and at the last round).")
    print("ratings x steps/s: ratings of the round's sampled clients x local steps per round / "
          "s/round. peak RSS: the fit's own process, data included. final: training RMSE at "
          "the last round (Felb: its RMSD; its throughput counts every cell of the binarized "
          "matrix). CPU s: the fit's CPU time, all threads; load: the machine's 1-minute load "
          "average at the end of the fit (other processes share the cores); 2-thr: how much "
          "faster 2 threads ran a perfectly parallel loop than 1 just before and after the fit "
          "(2.0 on idle cores): the ceiling of any n_jobs=2 speed-up at that time.")
    head = (f"{'method':<15}{'shape':<9}{'clients':>9}{'ratings':>12}{'n_jobs':>7}{'rounds':>7}"
            f"{'fit s':>9}{'CPU s':>9}{'s/round':>10}{'x100':>6}{'ratings x steps/s':>19}"
            f"{'peak RSS GB':>13}{'final':>9}{'load':>6}{'2-thr':>7}")
    base = {(r["method"], r["shape"], r["n_jobs"]): r["round_seconds"] for r in rows
            if r.get("clients") == "100" and "error" not in r}
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['method']:<15}{r['shape']:<9}{r['clients']:>9}{'':>12}{r['n_jobs']:>7}  "
                  f"{r['error']}")
            continue
        ref = base.get((r["method"], r["shape"], r["n_jobs"]))
        ratio = f"{r['round_seconds'] / ref:>6.2f}" if ref else f"{'':>6}"
        print(f"{r['method']:<15}{r['shape']:<9}{r['n_clients']:>9,}{r['nnz']:>12,}"
              f"{r['n_jobs']:>7}{r['rounds']:>7}{r['fit_seconds']:>9.2f}{r['cpu_seconds']:>9.1f}"
              f"{r['round_seconds']:>10.4f}{ratio}"
              f"{r['throughput']:>19.3g}{r['peak_gb']:>13.2f}{r['final']:>9.4f}"
              f"{r['load']:>6.1f}{r['capacity']:>7.2f}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes and 5 rounds")
    parser.add_argument("--shapes", default="ml1m,netflix", help="comma list of ml1m, netflix")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma list of methods")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--n-jobs", default="1,2", help="comma list of n_jobs values")
    parser.add_argument("--cache-dir", default=Path(os.environ.get(
        "XDG_CACHE_HOME", Path.home() / ".cache")) / "sklearn_fedmf" / "benchmarks")
    parser.add_argument("--float32", action="store_true",
                        help="fit float32 data (FedMCADMM then runs in float32)")
    parser.add_argument("--clients", default="100",
                        help="comma list of 100 (the papers' 100 clients) and per-user "
                             "(one client per row)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_one(**json.loads(args.worker))))
        return

    import sklearn_fedmf

    rounds = 5 if args.quick else args.rounds
    rows = []
    for shape_name in args.shapes.split(","):
        if shape_name not in SHAPES:
            parser.error(f"unknown shape {shape_name!r}; choose from {sorted(SHAPES)}")
        cached_matrix(shape_name, args.quick, args.cache_dir)  # generate once, outside timings
        for method in args.methods.split(","):
            if method not in METHODS:
                parser.error(f"unknown method {method!r}; choose from {sorted(METHODS)}")
            if not hasattr(sklearn_fedmf, method):
                print(f"# {method}: not in this sklearn_fedmf, skipped", file=sys.stderr)
                continue
            if method in DENSE_ONLY and shape_name == "netflix":
                print(f"# {method}: Boolean factorization, skipped at the Netflix shape",
                      file=sys.stderr)
                continue
            for clients in args.clients.split(","):
                if clients not in ("100", "per-user"):
                    parser.error(f"unknown --clients {clients!r}; choose 100 or per-user")
                if clients == "per-user" and method in DENSE_ONLY:
                    print(f"# {method}: every client works every round, no per-user rows",
                          file=sys.stderr)
                    continue
                for n_jobs in (int(n) for n in args.n_jobs.split(",")):
                    rows.append(run_in_subprocess(method, shape_name, n_jobs, rounds,
                                                  args.quick, args.cache_dir, args.float32,
                                                  clients))
                    print(f"# done: {rows[-1]}", file=sys.stderr, flush=True)
    print_table(rows, rounds)


if __name__ == "__main__":
    main()
