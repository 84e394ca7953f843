"""CPU time per phase of a round: one client per user against 100 clients (issue 38).

    python benchmarks/profile_fedmgs_round.py [--method FedMGS] [--n-jobs 1] [--quick]

``--method`` is FedMGS (the default), FedMCADMM or FedMAvg, with ``run_all.py``'s settings.
ML-1M shape (``run_all.py``'s cached matrix), rank 5, 10 local steps, 10% of the clients per
round, 20 rounds. Each phase's CPU time (``time.process_time``, the whole process) is summed
per round by wrapping the engine's and FedMGS's functions (those this version has; a missing
one prints 0), and the table prints each phase's median over the rounds. CPU time, not wall
time: it is far less sensitive to the other processes of a shared machine; with
``--n-jobs 2`` it counts every thread's work.
"""

import argparse
import os
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

ENGINE = [
    ("engine._federation", "_round", "round"),
    ("engine._groups", "GroupedTransport.run", "client phase (grouped)"),
    ("engine._transport", "LocalTransport.run", "client phase (per client)"),
    ("engine._exchange", "PlainExchange.update", "exchange update (bytes, server)"),
    ("engine._groups", "dispatch", "  dispatch (grouped tasks)"),
    ("engine._federation", "_evaluate", "evaluation (every 10th round)"),
]
FEDMGS = [
    ("completion._fedmgs._fedmgs_protocol", "fold_cache", "server: fold_cache"),
    ("completion._fedmgs._fedmgs_protocol", "update_cache", "  update_cache"),
    ("completion._fedmgs._fedmgs_protocol", "_replace_compact", "    _replace_compact (main)"),
    ("completion._fedmgs._fedmgs_protocol", "_join_compact", "    _join_compact"),
    ("completion._fedmgs._fedmgs_protocol", "outer_changes", "    outer_changes"),
    ("completion._fedmgs._fedmgs_protocol", "replace_outer", "    replace_outer kernel"),
    ("completion._fedmgs._fedmgs_protocol", "_unpack_blocks", "  _unpack_blocks"),
    ("completion._fedmgs._fedmgs_protocol", "squared_step", "server: squared_step"),
]
_ADMM = "completion._fedmc_admm._fedmc_admm_"
FEDMCADMM = [
    (_ADMM + "batched", "update_group", "  batched client_update"),
    (_ADMM + "batched", "group_update", "    group_update kernel"),
    (_ADMM + "batched", "GroupUpload.messages", "    GroupUpload.messages"),
    (_ADMM + "protocol", "ratings_client_update", "  client_update (per client)"),
    (_ADMM + "protocol", "server_update_lazy", "  server_update_lazy"),
    (_ADMM + "protocol", "server_update", "server: server_update"),
    (_ADMM + "batched", "_parts", "  _parts"),
    (_ADMM + "batched", "_replace", "  _replace"),
    (_ADMM + "batched", "replace_terms", "    replace_terms kernel"),
    (_ADMM + "batched", "_resum", "  _resum"),
    (_ADMM + "batched", "_total", "  _total"),
    (_ADMM + "protocol", "_server_prox", "  _server_prox"),
    (_ADMM + "batched", "FactorHistory.append", "  FactorHistory.append"),
]
_AVG = "completion._fedmavg._fedmavg_"
FEDMAVG = [
    (_AVG + "batched", "prepare_group", "  batched client_prepare"),
    (_AVG + "batched", "update_group", "  batched client_update"),
    (_AVG + "protocol", "server_prepare", "server: server_prepare"),
    (_AVG + "protocol", "server_update", "server: server_update"),
]
METHOD_PHASES = {"FedMGS": FEDMGS, "FedMCADMM": FEDMCADMM, "FedMAvg": FEDMAVG}
PHASES = ENGINE + FEDMGS


def instrument(current, phases=PHASES):
    """Wrap every phase of ``phases`` this version has; their CPU time goes to ``current``."""
    import importlib

    for module_name, attr, label in phases:
        obj = importlib.import_module("sklearn_fedmf." + module_name)
        *owner, name = attr.split(".")
        for part in owner:
            obj = getattr(obj, part)
        if hasattr(obj, name):
            setattr(obj, name, _timed(getattr(obj, name), label, current))


def _timed(function, label, current):
    """``function`` adding its CPU time to ``current[label]``."""
    def wrapped(*args, **kwargs):
        tic = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            current[label] += time.process_time() - tic
    return wrapped


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="FedMGS", choices=sorted(METHOD_PHASES))
    parser.add_argument("--n-jobs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="run_all's tiny ML-1M shape")
    parser.add_argument("--cache-dir", default=Path(os.environ.get(
        "XDG_CACHE_HOME", Path.home() / ".cache")) / "sklearn_fedmf" / "benchmarks")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    from run_all import METHODS, cached_matrix

    import sklearn_fedmf
    from sklearn_fedmf.engine._fit import route_solver_params

    phases = ENGINE + METHOD_PHASES[args.method]
    current, per_round = defaultdict(float), defaultdict(list)
    instrument(current, phases)
    Estimator = getattr(sklearn_fedmf, args.method)
    settings = METHODS[args.method][0]
    X = cached_matrix("ml1m", args.quick, args.cache_dir)
    for clients in ("100", "per-user"):
        def record(k, info, clients=clients):
            for _, _, label in phases:
                per_round[clients, label].append(current.pop(label, 0.0))

        estimator = Estimator()
        estimator.set_params(**route_solver_params(Estimator, dict(
            n_components=5, n_clients=100, random_state=0, n_jobs=args.n_jobs,
            max_iter=args.rounds, eval_every=10, callback=record,
            clients_per_round=0.1 if clients == "per-user" else 10, **settings)))
        current.clear()
        estimator.fit(X, **({"clients": np.arange(X.shape[0])} if clients == "per-user"
                            else {}))
    print(f"{args.method}, ML-1M shape, n_jobs={args.n_jobs}: median CPU ms per round")
    print(f"{'phase':<36}{'100 clients':>12}{'per user':>10}{'diff':>8}")
    for _, _, label in phases:
        a = 1e3 * float(np.median(per_round["100", label]))
        b = 1e3 * float(np.median(per_round["per-user", label]))
        print(f"{label:<36}{a:>12.2f}{b:>10.2f}{b - a:>8.2f}")


if __name__ == "__main__":
    main()
