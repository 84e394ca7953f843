"""FedMC-ADMM on a Flower deployment on loopback against the same fit simulated.

A SuperLink and one SuperNode per site run as processes on 127.0.0.1 (``run_loopback``);
the ServerApp writes the fitted model. The script prints, per run, the wall time, the
server's seconds per round and the largest difference of ``components_`` from the simulated
fit, then per round the bytes ``history_`` counts (the protocol's arrays) beside the bytes
the Messages carried as Flower serializes them.

    python benchmarks/bench_flower.py --quick    # 2 sites, 2 rounds, one run
    python benchmarks/bench_flower.py            # 2 sites, 3 rounds, 3 runs
    python benchmarks/bench_flower.py --center   # centred ratings: mean from site aggregates
    python benchmarks/bench_flower.py --secure   # also secure_aggregation=True (its own
                                                 # deployment per run)
    python benchmarks/bench_flower.py --clientapp flower   # Flower's own SuperNode: a fresh
                                                           # ClientApp process per Message

Each site runs ``python -m sklearn_fedmf.flower`` by default (one ClientApp process for the
whole fit, the SuperNode's waits at most ``--poll`` seconds). The processes import the
``sklearn_fedmf`` this script imports; to measure a source tree, run it from there with
``PYTHONPATH=.``.

Needs the optional extra (Python >= 3.11): ``pip install "sklearn_fedmf[flower]"``.
"""

import argparse
import os
import statistics
import tempfile

import numpy as np
import scipy.sparse as sp


def ratings(n_users, n_items, rank, density, seed=0):
    rng = np.random.default_rng(seed)
    M = rng.normal(size=(n_users, rank)) @ rng.normal(size=(rank, n_items)) / np.sqrt(rank)
    observed = rng.random((n_users, n_items)) < density
    return sp.csr_matrix((M[observed], np.nonzero(observed)), shape=(n_users, n_items))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run of 2 rounds")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sites", type=int, default=2)
    parser.add_argument("--users", type=int, default=90)
    parser.add_argument("--items", type=int, default=25)
    parser.add_argument("--center", action="store_true", help="centre the ratings")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="rounds between diagnostics (each is one more exchange)")
    parser.add_argument("--clientapp", choices=("warm", "flower"), default="warm",
                        help="warm: one ClientApp process per site for the whole fit; "
                             "flower: flower-supernode, a fresh process per Message")
    parser.add_argument("--poll", type=float, default=0.1,
                        help="longest idle wait of the SuperNodes and the server (warm)")
    parser.add_argument("--secure", action="store_true",
                        help="also fit with secure_aggregation=True, on a deployment of its "
                             "own (the same sites, the same data)")
    args = parser.parse_args()
    from sklearn_fedmf import FedMCADMM
    from sklearn_fedmf.flower import run_loopback

    runs, rounds = (1, 2) if args.quick else (args.runs, args.rounds)
    X = ratings(args.users, args.items, 2, 0.5)
    clients = np.arange(X.shape[0]) % args.sites
    params = dict(n_components=2, max_iter=rounds, alpha_u=0.1, alpha_v=0.1, random_state=0,
                  solver_params={"center": args.center, "eval_every": args.eval_every},
                  secure_aggregation=False)
    kinds = ["plain", "secure"] if args.secure else ["plain"]
    simulated = {kind: FedMCADMM(**{**params, "secure_aggregation": kind == "secure"}).fit(
        X, clients=clients) for kind in kinds}
    print(f"FedMCADMM, {args.sites} sites, {X.shape[0]} users x {X.shape[1]} items, "
          f"{X.nnz} ratings, rank 2, {rounds} rounds, center={args.center}, "
          f"clientapp={args.clientapp}, poll={args.poll:g} s, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'run':>4} {'fit':>7} {'wall s':>8} {'s/round (median)':>17} {'s per round':>22} "
          f"{'max |components_ diff|':>23}")
    last, medians = {}, {kind: [] for kind in kinds}
    for run in range(runs):
        for kind in kinds:  # one deployment each: the rounds of one fit only
            with tempfile.TemporaryDirectory() as workdir:
                model, wall, logs = run_loopback(
                    X, clients, workdir, params={**params, "secure_aggregation": kind == "secure"},
                    clientapp=args.clientapp, poll=args.poll)
            if model is None:
                print(f"{run + 1:>4} {kind:>7} {wall:8.1f}  the run wrote no model; logs:")
                for name, text in logs.items():
                    print(f"--- {name}\n{text[-2000:]}")
                raise SystemExit(1)
            per_round = statistics.median(r["seconds"] for r in model.history_)
            medians[kind].append(per_round)
            each = " ".join(f"{r['seconds']:.2f}" for r in model.history_)
            diff = np.abs(model.components_ - simulated[kind].components_).max()
            print(f"{run + 1:>4} {kind:>7} {wall:8.1f} {per_round:17.2f} {each:>22} "
                  f"{diff:23.3g}")
            last[kind] = model
    for kind in kinds:
        print(f"{kind}: median of the runs' per-round medians: "
              f"{statistics.median(medians[kind]):.2f} s")
    print(f"load average now {os.getloadavg()[0]:.1f}")
    for kind in kinds:
        print()
        print(f"{kind}: {'round':>5} {'history_ up/down B':>20} {'Messages up/down B':>20} "
              f"{'diagnostics up/down B':>22}")
        for record, wire in zip(last[kind].history_, last[kind].message_bytes_):
            print(f"{'':>{len(kind) + 1}} {record['round']:>5} "
                  f"{record['bytes_uploaded']:>9}/{record['bytes_downloaded']:<10}"
                  f" {wire['uploaded']:>9}/{wire['downloaded']:<10}"
                  f" {wire['eval_uploaded']:>10}/{wire['eval_downloaded']:<11}")


if __name__ == "__main__":
    main()
