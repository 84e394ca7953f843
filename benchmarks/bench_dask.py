"""FedMC-ADMM on a Dask cluster against the same fit on local threads.

A ``LocalCluster`` of worker processes on loopback stands in for remote machines: each
client's data block is sent to one worker once per fit (``resident_blocks``), and each round
only the sampled clients' states, the broadcast and the uploads travel. The script checks that
both fits give the same model bit for bit and prints their times and what the cluster moved.

    python benchmarks/bench_dask.py --quick          # small matrix, seconds
    python benchmarks/bench_dask.py                  # ML-1M shape
    python benchmarks/bench_dask.py --shape netflix  # 480,189 x 17,770, 1e8 ratings, rank 13
    python benchmarks/bench_dask.py --faults 10      # a worker killed mid-fit, 10 times

``--faults N`` runs the lost-worker scenario N times: FedMC-ADMM (20 clients, 10 per round,
150 rounds, ``eval_every=1``) on ``make_ratings(3000, 2000, 300_000)`` on a two-process
``LocalCluster``; in each run one worker process ends with ``os._exit(1)``, alternately from
the ``callback`` after a round and from a thread after a random delay (mid-round). Each fit
must end within a deadline with either the fault-free model (recovered) or a
``FederationError`` naming the worker and the round; the table prints which.

Needs the optional extra: ``pip install "sklearn_fedmf[dask]"``.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from run_all import RANK, cached_matrix  # noqa: E402  (the same cached matrices)

from sklearn_fedmf.engine._federation import nbytes  # noqa: E402


def fit(X, n_jobs, rounds, rank):
    from sklearn_fedmf import FedMCADMM
    from sklearn_fedmf.completion import PAPER_SETTINGS
    from sklearn_fedmf.engine._fit import merge_params

    model = FedMCADMM(**merge_params(PAPER_SETTINGS["FedMCADMM"], dict(
        n_components=rank, n_clients=100, clients_per_round=10, max_iter=rounds, random_state=0,
        n_jobs=n_jobs, solver_params={"eval_every": 25})))
    tic = time.perf_counter()
    model.fit(X)
    return model, time.perf_counter() - tic


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="ml1m", choices=sorted(RANK))
    parser.add_argument("--quick", action="store_true", help="tiny matrix and 5 rounds")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--faults", type=int, default=0, metavar="N",
                        help="run the lost-worker scenario N times instead")
    parser.add_argument("--cache-dir", default=Path(os.environ.get(
        "XDG_CACHE_HOME", Path.home() / ".cache")) / "sklearn_fedmf" / "benchmarks")
    args = parser.parse_args()
    import distributed
    from joblib import parallel_config

    if args.faults:
        return fault_runs(args.faults, args.quick)
    X = cached_matrix(args.shape, args.quick, args.cache_dir)
    rounds = 5 if args.quick else args.rounds
    rank = RANK[args.shape]
    local, local_seconds = fit(X, args.workers, rounds, rank)
    with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        fit(X[:2000], args.workers, 1, rank)  # start the workers and compile their kernels
        with parallel_config(backend="dask"):
            remote, remote_seconds = fit(X, args.workers, rounds, rank)
    same = (np.array_equal(local.components_, remote.components_)
            and np.array_equal(local.user_factors_, remote.user_factors_))
    protocol = sum(r["bytes_uploaded"] + r["bytes_downloaded"] for r in remote.history_)
    # The driver simulates the clients: their states go to the workers and back each round.
    state = np.mean([nbytes(s) for s in remote._federation.client_states])
    print(f"FedMCADMM, {X.shape[0]} x {X.shape[1]}, {X.nnz:,} ratings, rank {rank}, 10 of 100 "
          f"clients, N = 10, {rounds} rounds; {args.workers} workers")
    print(f"{'where':<34}{'fit s':>8}{'same model':>12}")
    print(f"{f'threads, n_jobs={args.workers}':<34}{local_seconds:>8.1f}{'':>12}")
    print(f"{f'Dask LocalCluster, {args.workers} processes':<34}{remote_seconds:>8.1f}"
          f"{'yes' if same else 'NO':>12}")
    print(f"per round: the protocol's messages {protocol / rounds / 2**20:,.1f} MiB (history_); "
          f"the simulated clients' states, to the workers and back, "
          f"{2 * 10 * state / 2**20:,.1f} MiB; the data blocks went once, before round 1")
    if not same:
        sys.exit("the Dask fit differs from the local fit")


def _exit_soon(delay):
    import threading

    threading.Timer(delay, os._exit, (1,)).start()  # the process ends, as on a crashed node


def _fault_run(client, X, params, reference, victim, *, kill_round, delay, deadline):
    """One fit on Dask with ``victim`` killed from the callback after ``kill_round`` (or, when
    it is None, from a thread after ``delay`` s); returns (how, outcome, seconds)."""
    import threading

    from joblib import parallel_config

    from sklearn_fedmf import FedMCADMM
    from sklearn_fedmf.exceptions import FederationError

    tic, killed, outcome = time.perf_counter(), [], {}

    def kill():
        killed.append(time.perf_counter() - tic)
        client.run(_exit_soon, 0.05, workers=[victim])  # after run() has answered

    def callback(k, info):
        if k == kill_round:
            kill()

    def fit():
        try:
            with parallel_config(backend="dask"):
                outcome["model"] = FedMCADMM(n_jobs=-1, callback=callback, **params).fit(X)
        except FederationError as exc:  # the other outcome allowed; anything else propagates
            outcome["error"] = exc

    timer = None if kill_round is not None else threading.Timer(delay, kill)
    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    if timer is not None:
        timer.start()
    thread.join(deadline)
    seconds = time.perf_counter() - tic
    if timer is not None:
        timer.cancel()
    how = (f"callback, round {kill_round}" if kill_round is not None
           else f"thread, after {killed[0]:.1f} s" if killed else "thread (fit ended first)")
    if thread.is_alive():
        return how, f"HANG (no result after {deadline:.0f} s)", seconds
    if "error" in outcome:
        return how, f"FederationError: {str(outcome['error'])[:40]}", seconds
    if "model" not in outcome:
        return how, "another exception (traceback above)", seconds
    model = outcome["model"]
    same = (np.array_equal(model.components_, reference.components_)
            and np.array_equal(model.user_factors_, reference.user_factors_))
    result = "recovered, same model" if same else "DIFFERENT MODEL"
    return how, result + ("" if killed else " (no kill)"), seconds


def fault_runs(n_runs, quick, deadline=300.0):
    """The lost-worker scenario ``n_runs`` times (module docstring); prints a table."""
    import logging

    import distributed

    from sklearn_fedmf import FedMCADMM
    from sklearn_fedmf.datasets import make_ratings

    shape, rounds = ((600, 400, 30_000), 30) if quick else ((3000, 2000, 300_000), 150)
    X = make_ratings(*shape, random_state=0).X.tocsr()
    params = dict(n_components=5, n_clients=20, clients_per_round=10, max_iter=rounds,
                  random_state=0, solver_params={"eval_every": 1})
    tic = time.perf_counter()
    reference = FedMCADMM(n_jobs=1, **params).fit(X)
    local_seconds = time.perf_counter() - tic
    rng = np.random.default_rng(0)
    print(f"FedMCADMM, {X.shape[0]} x {X.shape[1]}, {X.nnz:,} ratings, 10 of 20 clients, "
          f"{rounds} rounds, eval_every=1; one of 2 worker processes ends mid-fit "
          f"(fault-free fit on one thread: {local_seconds:.1f} s)")
    print(f"{'run':>3}  {'kill':<26}{'outcome':<52}{'fit s':>7}")
    for run in range(n_runs):  # a fresh cluster each run: two workers at the start
        kill_round = int(rng.integers(rounds // 4, 3 * rounds // 4))
        delay = float(rng.uniform(0.2, 0.6) * local_seconds + 1.0)
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      host="127.0.0.1", dashboard_address=None,
                                      silence_logs=logging.CRITICAL) as cluster, \
                distributed.Client(cluster) as client:
            victim = sorted(client.ncores())[run % 2]
            how, result, seconds = _fault_run(
                client, X, params, reference, victim, deadline=deadline, delay=delay,
                kill_round=kill_round if run % 2 == 0 else None,
            )
            print(f"{run + 1:>3}  {how:<26}{result:<52}{seconds:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
