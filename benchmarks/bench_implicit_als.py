"""FedMGS's default ``loss="implicit"`` fit time beside ``implicit``'s ALS (issue 38).

    python benchmarks/bench_implicit_als.py                    # ML-1M shape, 3 runs
    python benchmarks/bench_implicit_als.py --runs 5 --threads 1
    python benchmarks/bench_implicit_als.py --quick            # smoke run: 100,000 ratings
    python benchmarks/bench_implicit_als.py --set ml-100k --path DIR/u.data --threads 1
    python benchmarks/bench_implicit_als.py --set playcounts --path user_artists.dat

The set: ``make_ratings(6040, 3706, 1_000_000, random_state=0)`` (MovieLens 1M's shape; no
real 1M file ships with the repository), every rating an interaction; ``--set`` also takes
the embedded ``ml-latest-small``, ``ml-100k`` (``--path``: its ``u.data``) and
``playcounts`` (``--path``: a tab-separated file with a header, user, item, count, as
Last.fm hetrec 2011's ``user_artists.dat``). Each run fits, one
after the other under the same load, ``implicit.als.AlternatingLeastSquares(factors=64,
iterations=15)`` on the binary interactions and ``FedMGS(loss="implicit",
random_state=0)`` with each row solver of ``--solvers`` (``solver_params={"implicit_solver":
...}``, or ``SOLVER:CG_STEPS@MAX_ITER``, e.g. ``cg:3@10``, the former default; everything else
the defaults: 10 clients, 5 rounds of 4 CG steps, rank 48 at 1M interactions; ALS has 64
factors, its default: the comparison is of the two defaults).
``--threads 0`` (default) leaves both at their defaults, every core (``implicit``'s
``num_threads=0``, FedMGS's ``n_jobs=None``); ``--threads N`` gives ``num_threads=N`` and
``n_jobs=N``. BLAS runs on one thread for both (``implicit``'s advice; FedMGS runs its own
threads). Columns: median wall seconds over the runs and the median of each run's ratio to
ALS's, then the same for the CPU seconds of the process (all its threads: with one thread
each, the measure a loaded machine moves least). The machine's load moves the seconds; the
ratios of one run compare fits made under the same load. The accuracy of these fits:
``bench_topn.py``.

``--phases`` adds, after the runs, one fit of each ``--solvers`` entry on one thread with its
process CPU seconds (user and system) and minor page faults split by phase: the users'
steps, the clients' aggregates (the messages), the server's sums and solve, the recorded
objective, and the rest (the engine, the first messages).
"""

import argparse
import resource
import statistics
import time
import warnings
from collections import defaultdict

import pandas as pd
from threadpoolctl import threadpool_limits

import sklearn_fedmf.completion._fedmgs._fedmgs_implicit as fedmgs_implicit
from sklearn_fedmf import FedMGS
from sklearn_fedmf.datasets import load_movielens, make_ratings, ratings_to_matrix
from sklearn_fedmf.exceptions import FedMFWarning


def load(name, path, quick):
    """The interactions of ``--set`` (CSR, strengths as stored)."""
    if quick:
        return make_ratings(2000, 1000, 100_000, random_state=0).X.tocsr()
    if name == "ml1m-shape":
        return make_ratings(6040, 3706, 1_000_000, random_state=0).X.tocsr()
    if name == "ml-latest-small":
        frame = load_movielens(return_df=True).frame
    elif path is None:
        raise SystemExit(f"--set {name} reads --path FILE")
    elif name == "ml-100k":
        frame = pd.read_csv(path, sep="\t", header=None, usecols=[0, 1, 2],
                            names=["userId", "movieId", "rating"])
    else:
        frame = pd.read_csv(path, sep="\t")
        frame.columns = ["userId", "movieId", "rating", *frame.columns[3:]]
    return ratings_to_matrix(frame[["userId", "movieId", "rating"]])[0].tocsr()


def fit_als(X, threads):
    """ALS's fit seconds, None without ``implicit`` (the ``bench`` extra)."""
    try:
        from implicit.als import AlternatingLeastSquares
    except ImportError:
        return None
    binary = X.copy()
    binary.data[:] = 1.0
    model = AlternatingLeastSquares(factors=64, iterations=15, random_state=0,
                                    num_threads=threads)
    start, cpu = time.perf_counter(), time.process_time()
    model.fit(binary, show_progress=False)
    return time.perf_counter() - start, time.process_time() - cpu


def variant(spec):
    """``FedMGS`` parameters of a ``--solvers`` entry ``SOLVER[:CG_STEPS][@MAX_ITER]`` (e.g.
    ``cg``, ``cg:3@10``, ``cholesky@10``): the row solver, and the defaults unless given."""
    spec, _, rounds = spec.partition("@")
    solver, _, steps = spec.partition(":")
    params = {"solver_params": {"implicit_solver": solver,
                                **({"cg_steps": int(steps)} if steps else {})}}
    return {**params, **({"max_iter": int(rounds)} if rounds else {})}


def fit_fedmgs(X, solver, threads):
    est = FedMGS(loss="implicit", random_state=0, n_jobs=threads or None, **variant(solver))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        start, cpu = time.perf_counter(), time.process_time()
        est.fit(X)
    return time.perf_counter() - start, time.process_time() - cpu


# the functions of _fedmgs_implicit each phase of a round calls (--phases)
PHASES = {"users' steps": "implicit_user_factors", "clients' aggregates": "implicit_item_sums",
          "server: sums": "add_messages", "server: solve": "server_solve",
          "objective": "implicit_objective"}


def phase_profile(X, solver):
    """``{phase: (user s, system s, minor faults)}`` of one fit on one thread, "total" and
    "rest" included (the phases' functions wrapped for the fit)."""
    spent = defaultdict(lambda: [0.0, 0.0, 0])
    saved = {name: getattr(fedmgs_implicit, name) for name in PHASES.values()}

    def timed(phase, fn):
        def wrapper(*args, **kwargs):
            before = resource.getrusage(resource.RUSAGE_SELF)
            out = fn(*args, **kwargs)
            after = resource.getrusage(resource.RUSAGE_SELF)
            spent[phase][0] += after.ru_utime - before.ru_utime
            spent[phase][1] += after.ru_stime - before.ru_stime
            spent[phase][2] += after.ru_minflt - before.ru_minflt
            return out
        return wrapper

    try:
        for phase, name in PHASES.items():
            setattr(fedmgs_implicit, name, timed(phase, saved[name]))
        timed("total", fit_fedmgs)(X, solver, 1)
    finally:
        for name, fn in saved.items():
            setattr(fedmgs_implicit, name, fn)
    total = spent.pop("total")
    spent["rest"] = [total[k] - sum(v[k] for v in spent.values()) for k in range(3)]
    return {**spent, "total": total}


def print_phases(X, solvers):
    for solver in solvers:
        profile = phase_profile(X, solver)
        total = sum(profile["total"][:2])
        print(f'\nFedMGS(loss="implicit"), {solver}, one thread: CPU seconds by phase')
        print(f"{'phase':<22}{'user s':>8}{'sys s':>8}{'share':>8}{'faults':>9}")
        for phase, (user, system, faults) in profile.items():
            print(f"{phase:<22}{user:8.2f}{system:8.2f}{(user + system) / total:8.0%}"
                  f"{faults:9d}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0,
                        help="0: each library's default (every core); N: N threads each")
    parser.add_argument("--solvers", default="cholesky,cg",
                        help="FedMGS's implicit_solver values, comma-separated; an entry "
                        "SOLVER[:CG_STEPS][@MAX_ITER] also sets cg_steps and max_iter")
    parser.add_argument("--set", default="ml1m-shape",
                        choices=("ml1m-shape", "ml-latest-small", "ml-100k", "playcounts"))
    parser.add_argument("--path", default=None, help="the file of ml-100k or playcounts")
    parser.add_argument("--quick", action="store_true", help="100,000 ratings, one run")
    parser.add_argument("--phases", action="store_true",
                        help="then one fit per solver with its CPU seconds by phase")
    args = parser.parse_args()
    X = load(args.set, args.path, args.quick)
    solvers = args.solvers.split(",")
    runs = 1 if args.quick else args.runs
    seconds = {name: [] for name in ("ALS", *solvers)}
    with threadpool_limits(1, "blas"):
        for solver in solvers:  # (compile, or load, each solver's kernels once)
            fit_fedmgs(X[:200], solver, args.threads)
        for _ in range(runs):
            seconds["ALS"].append(fit_als(X, args.threads))
            for solver in solvers:
                seconds[solver].append(fit_fedmgs(X, solver, args.threads))
    print(f"{args.set}: {X.shape[0]:,} x {X.shape[1]:,}, {X.nnz:,} interactions; threads: "
          f"{args.threads or 'defaults'}; {runs} run(s)")
    als = seconds["ALS"] if None not in seconds["ALS"] else None
    if als is None:
        print("implicit is not installed (the bench extra): no ALS row, no ratios")
    print(f"{'fit':<40}{'median s':>10}{'x ALS':>8}{'cpu s':>8}{'x ALS':>8}   runs (s)")
    for name, values in seconds.items():
        if name == "ALS" and als is None:
            continue
        label = ("implicit ALS(factors=64, iterations=15)" if name == "ALS"
                 else f'FedMGS(loss="implicit"), {name}')
        cells = ""
        for k in (0, 1):  # wall, then CPU seconds (the process's threads together)
            ratio = (statistics.median(v[k] / a[k] for v, a in zip(values, als)) if als
                     else None)
            cells += (f"{statistics.median(v[k] for v in values):{10 - 2 * k}.2f}"
                      + (f"{ratio:>8.2f}" if ratio is not None else f"{'-':>8}"))
        print(f"{label:<40}{cells}   " + " ".join(f"{v[0]:.2f}" for v in values),
              flush=True)
    if args.phases:
        with threadpool_limits(1, "blas"):
            print_phases(X, solvers)


if __name__ == "__main__":
    main()
