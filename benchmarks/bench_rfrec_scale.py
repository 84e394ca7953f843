"""RFRec at one client per user: peak memory and seconds per round.

Usage::

    python benchmarks/bench_rfrec_scale.py --table memory     # 20,000 x 5,000, 2M ratings
    python benchmarks/bench_rfrec_scale.py --table netflix    # 480,189 clients, 1% per round
    python benchmarks/bench_rfrec_scale.py --table netflix --users 0.1   # first 10% of users
    python benchmarks/bench_rfrec_scale.py --quick            # both tables, tiny shapes

``memory``: ``RFRec()`` with its defaults (one client per user, every client steps each
round, ``biased=True``, rank 20) and with ``optimizer="adam"``, after 1 and 3 rounds, each fit
in a fresh subprocess: its peak resident memory (``ru_maxrss``) beside the size of ``X`` as
CSR, the memory before the fit (interpreter, libraries, data) and the fitted model's arrays;
with Adam also its moments (two arrays the size of every client's ``u_i`` and rated columns,
which RFRec's per-client persistent Adam needs during the fit), and ``rest / CSR``: what the
fit holds besides the model, the clients' copies and the moments, per MB of ``X``.

``netflix``: the Netflix shape of ``benchmarks/run_all.py`` (``make_ratings(480189, 17770,
1e8, n_components=13)``, cached in ``--cache-dir``), one client per user, 1% of the uploads
used per round, rank 13, ``eval_every=25``; ``--users f`` fits the first fraction ``f`` of the
users (every per-round cost of RFRec is linear in the ratings: every client steps). The fit's
CPU seconds (all threads) are printed beside the wall-clock ones, which a busy machine inflates.
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

MEMORY_SHAPE = (20_000, 5_000, 2_000_000)
QUICK_SHAPE = (2_000, 500, 60_000)


def _rss_mb():
    """Peak resident memory of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current_mb():
    """Resident memory now (MB): what the process holds before the fit."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def csr_mb(X):
    return (X.data.nbytes + X.indices.nbytes + X.indptr.nbytes) / 2**20


def run_memory(optimizer, rounds, quick):
    from sklearn_fedmf import RFRec
    from sklearn_fedmf.datasets import make_ratings

    X = make_ratings(*(QUICK_SHAPE if quick else MEMORY_SHAPE), random_state=0).X
    before = _current_mb()
    tic = time.perf_counter()
    model = RFRec(max_iter=rounds, n_clients=None, random_state=0,
                  solver_params={"optimizer": optimizer}).fit(X)
    seconds = time.perf_counter() - tic
    model_mb = sum(a.nbytes for a in vars(model).values() if isinstance(a, np.ndarray))
    personal = getattr(model, "_personal", None)  # the clients' copies kept for predictions
    arrays = [a for part in (personal or ()) for a in (part if isinstance(part, list) else [part])
              if isinstance(a, np.ndarray)]
    personal_mb = sum(a.nbytes for a in arrays)
    # Adam's first and second moments of every client's u_i and rated columns (RFRec's spec:
    # per-client persistent moments), freed after the fit: two arrays the shape of U and P
    width = arrays[0].shape[1] if arrays else 0
    moments_mb = (2 * (personal_mb + X.shape[0] * width * 8) if optimizer == "adam" else 0)
    return dict(optimizer=optimizer, rounds=rounds, csr_mb=csr_mb(X), before_mb=before,
                peak_mb=_rss_mb(), model_mb=model_mb / 2**20, personal_mb=personal_mb / 2**20,
                moments_mb=moments_mb / 2**20, seconds=seconds,
                rmse=model.history_[-1].get("train_rmse"))


def run_netflix(users, rounds, quick, cache_dir, optimizer, n_jobs):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from run_all import QUICK_SHAPES, SHAPES, cached_matrix

    from sklearn_fedmf import RFRec

    shape = (QUICK_SHAPES if quick else SHAPES)["netflix"]
    path = Path(cache_dir) / ("ratings_{}x{}_{}_seed0".format(*shape))
    if users >= 1 or not (path / "data.npy").exists():
        X = cached_matrix("netflix", quick, cache_dir)  # (generates the cache if missing)
    if users < 1:  # read only the first rows' ratings (the peak is then the fit's)
        import scipy.sparse as sp

        X = None
        n = int(users * shape[0])
        indptr = np.load(path / "indptr.npy")[: n + 1]
        parts = [np.array(np.load(path / f"{name}.npy", mmap_mode="r")[: indptr[-1]])
                 for name in ("data", "indices")]
        X = sp.csr_matrix((*parts, indptr), shape=(n, shape[1]))
    before = _current_mb()
    model = RFRec(
        n_components=13, clients_per_round=0.01, n_clients=None, max_iter=rounds, random_state=0,
        n_jobs=n_jobs, solver_params={"optimizer": optimizer, "eval_every": 25},
    )
    tic, cpu = time.perf_counter(), time.process_time()
    model.fit(X)
    seconds, cpu = time.perf_counter() - tic, time.process_time() - cpu
    per_round = float(np.median([r["seconds"] for r in model.history_]))
    return dict(optimizer=optimizer, n_users=X.shape[0], nnz=X.nnz, rounds=rounds,
                csr_mb=csr_mb(X), before_mb=before, peak_mb=_rss_mb(), fit_s=seconds, cpu_s=cpu,
                round_s=per_round, rmse=model.history_[-1].get("train_rmse"))


def in_subprocess(kind, **kw):
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            f"import bench_rfrec_scale as b; print(json.dumps(b.run_{kind}(**{kw!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ))
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", choices=["memory", "netflix", "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="tiny shapes, seconds")
    parser.add_argument("--users", type=float, default=1.0,
                        help="netflix: fraction of the users fitted (first rows)")
    parser.add_argument("--rounds", type=int, default=100, help="netflix: rounds")
    parser.add_argument("--optimizer", default="gd", choices=["gd", "adam"], help="netflix")
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--cache-dir", default=str(Path.home() / ".cache" / "sklearn_fedmf"
                                                   / "benchmarks"))
    args = parser.parse_args(argv)
    if args.table in ("memory", "all"):
        print("| optimizer | rounds | X as CSR (MB) | before fit (MB) | peak RSS (MB) | "
              "peak - before (MB) | (peak - before) / CSR | model (MB) | personal copies (MB)"
              " | Adam moments (MB) | rest / CSR | fit (s) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for optimizer in ("gd", "adam"):
            for rounds in (1,) if args.quick else (1, 3):
                r = in_subprocess("memory", optimizer=optimizer, rounds=rounds, quick=args.quick)
                grown = r["peak_mb"] - r["before_mb"]
                rest = grown - r["model_mb"] - r["personal_mb"] - r["moments_mb"]
                print(f"| {optimizer} | {rounds} | {r['csr_mb']:.0f} | {r['before_mb']:.0f} | "
                      f"{r['peak_mb']:.0f} | {grown:.0f} | {grown / r['csr_mb']:.1f} | "
                      f"{r['model_mb']:.0f} | {r['personal_mb']:.0f} | {r['moments_mb']:.0f} | "
                      f"{rest / r['csr_mb']:.1f} | {r['seconds']:.1f} |", flush=True)
    if args.table in ("netflix", "all"):
        rounds = 3 if args.quick else args.rounds
        r = in_subprocess("netflix", users=args.users, rounds=rounds, quick=args.quick,
                          cache_dir=args.cache_dir, optimizer=args.optimizer,
                          n_jobs=args.n_jobs)
        print("| users | ratings | optimizer | rounds | seconds/round (median) | fit (s) | "
              "fit, CPU (s) | before fit (MB) | peak RSS (MB) | train RMSE |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        print(f"| {r['n_users']} | {r['nnz']} | {r['optimizer']} | {r['rounds']} | "
              f"{r['round_s']:.2f} | {r['fit_s']:.0f} | {r['cpu_s']:.0f} | {r['before_mb']:.0f} | "
              f"{r['peak_mb']:.0f} | {r['rmse']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
