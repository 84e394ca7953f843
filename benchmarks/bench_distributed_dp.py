"""Distributed DP (noise on the secure sum) against local DP: test RMSE per epsilon.

Usage::

    python benchmarks/bench_distributed_dp.py                       # the ML-1M shape
    python benchmarks/bench_distributed_dp.py --users 1000 --items 500 --ratings 50000
    python benchmarks/bench_distributed_dp.py --epsilons 8 --estimators FedMAvg --secure
    python benchmarks/bench_distributed_dp.py --clip adaptive --scale 2   # ratings x2 (0-10)
    python benchmarks/bench_distributed_dp.py --data ml-100k:/work/data/ml-100k/u.data

``make_ratings(--users, --items, --ratings, random_state=0)`` (or a real set, ``--data
NAME:PATH``, read as ``bench_sites.py`` reads it; its ratings of exactly 0 are dropped: a
sparse matrix cannot hold them), its ratings times ``--scale``, an 80/20 split of every
user's ratings, one client per user, ``--per-round`` (10%) of the clients per round,
``--rounds`` rounds, no validation. Reference rows: ``FedBaseline`` (biases only) and each
estimator's non-private plain fit at the same rounds (FedMAvg's also with the equal weights
DistributedDP gives every client: ``weights=1``; ``--estimators FedBaseline``'s is the biases
row). For each estimator (FedMAvg, FedMGS, RFRec, FedBaseline) and epsilon (``delta =
1e-6``):

- ``DistributedDP(target_epsilon=eps)`` at its defaults (``clip="auto"``,
  ``max_releases="auto"``; ``--clip``, ``--max-releases`` override them);
- ``LocalDP(target_epsilon=eps, target_delta=1e-6, clip=0.2)`` where the estimator takes it
  (RFRec, Laplace on its clipped item factors; the paper's clip); ``n/a`` elsewhere.

A last table gives each private row's test RMSE per epsilon and its distance to its
estimator's plain fit (``- plain``) and to the biases (``- biases``), where measured.

Speed (a measurement, not a deployment): by default the DistributedDP fits run the private
measurement path ``_unmasked_for_measurement(summed_noise=True)`` of
:mod:`sklearn_fedmf.privacy._distributed_dp`: the same client clip/encode and server decode
as the secure exchange, without SecAgg+'s keys and masks (which cancel exactly in the ring:
``tests/test_distributed_dp.py`` checks the model is the secure fit's bit for bit), and the
survivors' noise shares drawn as one discrete Gaussian of their summed variance (the
sampler ran 80% of a fit's time at one share per client and entry). ``--shares`` keeps one
share per client (bit for bit the secure fit); ``--secure`` runs the real secure
aggregation (hours at this shape).
"""

import argparse
import json
import time
import warnings

import numpy as np

from sklearn_fedmf import FedBaseline, FedMAvg, FedMGS, RFRec
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.model_selection import train_test_split_ratings
from sklearn_fedmf.privacy import DistributedDP, LocalDP
from sklearn_fedmf.privacy._distributed_dp import _unmasked_for_measurement

DELTA = 1e-6
CLASSES = {"FedMAvg": FedMAvg, "FedMGS": FedMGS, "RFRec": RFRec, "FedBaseline": FedBaseline}
LOCAL = {"RFRec": 0.2}  # the estimators that take LocalDP, and its entry clip (RFRec's paper)


def read_set(spec):
    """The rating matrix of a real set ``NAME:PATH`` (users and items indexed in the
    order of their ids; ratings of exactly 0 dropped)."""
    import scipy.sparse as sp
    from bench_sites import read_triples

    path = spec.split(":", 1)[1]
    users, items, ratings = read_triples(path, movielens_ids=path.endswith("u.data"))
    keep = ratings != 0
    _, u = np.unique(users[keep], return_inverse=True)
    _, i = np.unique(items[keep], return_inverse=True)
    return sp.csr_matrix((ratings[keep], (u, i)))


def clips_shown(model):
    """An adaptive fit's clips: each exchange kind's first, median and last (history_)."""
    kinds = {}
    for record in model.history_:
        for kind, clip in record.get("dp_clip", {}).items():
            kinds.setdefault(kind, []).append(clip)
    return "; ".join(f"{k} {c[0]:.3g}/{np.median(c):.3g}/{c[-1]:.3g}"
                     for k, c in sorted(kinds.items()))


def fit(cls, X, X_test, common, **kw):
    """``(test RMSE, seconds, model or why it failed)``: RMSE of ``score(X, X_test)`` (each
    user's factors folded in from its training ratings)."""
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = cls(**common, **kw).fit(X)
            err = -model.score(X, X_test)
        except (ValueError, np.linalg.LinAlgError, FloatingPointError) as exc:
            return float("nan"), time.perf_counter() - tic, type(exc).__name__
    return err, time.perf_counter() - tic, model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=6040)
    parser.add_argument("--items", type=int, default=3706)
    parser.add_argument("--ratings", type=int, default=1_000_000)
    parser.add_argument("--per-round", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clip", default=None,
                        help="DistributedDP's clip: a number or 'adaptive' (default: 'auto')")
    parser.add_argument("--clip-quantile", type=float, default=None,
                        help="with --clip adaptive: the quantile (default: 'auto')")
    parser.add_argument("--scale", type=float, default=1.0, help="the ratings times this")
    parser.add_argument("--seed", type=int, default=0,
                        help="the fits' random_state (the split's stays 0)")
    parser.add_argument("--data", default=None,
                        help="a real set NAME:PATH instead of make_ratings")
    parser.add_argument("--max-releases", type=int, default=None,
                        help="DistributedDP's max_releases (default: 'auto')")
    parser.add_argument("--epsilons", type=float, nargs="*", default=[1, 2, 4, 8, 16])
    parser.add_argument("--estimators", nargs="+", default=["FedMAvg", "FedMGS", "RFRec"])
    parser.add_argument("--clip-only", action="store_true",
                        help="also a row at no noise (noise=1e-9): what clipping alone costs")
    parser.add_argument("--min-survivors", default="0.9",
                        help='DistributedDP\'s min_survivors: "threshold" or a fraction')
    parser.add_argument("--params", type=json.loads, default={},
                        help="the estimators' parameters, JSON (e.g. '{\"local_iter_v\": 10}')")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the biases-only and non-private rows")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--shares", action="store_true",
                     help="one noise share per client (bit for bit the secure fit)")
    how.add_argument("--secure", action="store_true", help="the real secure aggregation")
    args = parser.parse_args()
    if args.data is None:
        X, label = make_ratings(args.users, args.items, args.ratings, random_state=0).X, (
            f"make_ratings({args.users}, {args.items}, {args.ratings})")
    else:
        X, label = read_set(args.data), args.data.split(":", 1)[0]
        args.users = X.shape[0]
    X = X.tocsr() * args.scale
    X_train, X_test = train_test_split_ratings(X, 0.2, random_state=0)
    per_round = max(2, int(round(args.per_round * args.users)))
    common = dict(n_clients=args.users, clients_per_round=per_round, max_iter=args.rounds,
                  random_state=args.seed, **args.params)
    survivors = (args.min_survivors if args.min_survivors == "threshold"
                 else float(args.min_survivors))
    secure = (True if args.secure else
              _unmasked_for_measurement(summed_noise=not args.shares))
    clip = ("auto" if args.clip is None else args.clip if args.clip in ("auto", "adaptive")
            else float(args.clip))
    quantile = "auto" if args.clip_quantile is None else args.clip_quantile
    cap = "auto" if args.max_releases is None else args.max_releases
    path = ("secure aggregation" if args.secure else "measurement path, one share per client"
            if args.shares else "measurement path, summed noise")
    print(f"{label}{f' x{args.scale:g}' if args.scale != 1 else ''} {X.shape}, {X.nnz} "
          f"ratings, 80/20, one client per "
          f"user, {per_round} per round, {args.rounds} rounds, delta={DELTA:g}, "
          f"min_survivors={survivors}, DistributedDP clip={clip}"
          f"{f' quantile={quantile}' if clip == 'adaptive' else ''}, max_releases={cap} "
          f"({path}){', ' + json.dumps(args.params) if args.params else ''}")
    print()
    print("| estimator | privacy | epsilon | test RMSE | clip | releases cap | noise mult. "
          "| s |")
    print("|---|---|---|---|---|---|---|---|")
    table, plain, biases = {}, {}, None  # (the epsilon table printed last)
    if not args.no_reference:
        base = {k: v for k, v in common.items() if k not in args.params}
        err, s, _ = fit(FedBaseline, X_train, X_test, base)
        biases = plain["FedBaseline"] = err
        print(f"| FedBaseline (biases only) | none | inf | {err:.4f} | | | | {s:.1f} |",
              flush=True)
    for name in args.estimators:
        cls = CLASSES[name]
        if not args.no_reference and name != "FedBaseline":  # (its plain fit: the biases row)
            err, s, _ = fit(cls, X_train, X_test, common, early_stopping=False)
            plain[name] = err
            print(f"| {name} | none | inf | {err:.4f} | | | | {s:.1f} |", flush=True)
            if name == "FedMAvg":  # (DistributedDP weighs every client's update 1)
                err, s, _ = fit(cls, X_train, X_test, common, early_stopping=False,
                                solver_params={"aggregation": "sampled_mean"})
                print(f"| {name} (equal weights) | none | inf | {err:.4f} | | | | {s:.1f} |",
                      flush=True)
        runs = [("clip only", None)] if args.clip_only else []
        runs += [(None, eps) for eps in args.epsilons]
        for label, eps in runs:
            ddp = DistributedDP(target_epsilon=eps, target_delta=DELTA, clip=clip,
                                clip_quantile=quantile,
                                min_survivors=survivors, max_releases=cap,
                                noise=1e-9 if eps is None else None)
            err, s, model = fit(cls, X_train, X_test, common, privacy=ddp,
                                secure_aggregation=secure)
            table.setdefault((name, "DistributedDP"), {})[eps] = err
            if isinstance(model, str):
                print(f"| {name} | DistributedDP | {label or f'{eps:g}'} | nan {model} | | | "
                      f"| {s:.1f} |", flush=True)
                continue
            plan = model._ddp_plan
            shown = f"{plan.clip:g}" if plan.adaptive is None else clips_shown(model)
            print(f"| {name} | DistributedDP | {label or f'{eps:g}'} | {err:.4f} | "
                  f"{shown} | {plan.max_releases} | {model.noise_multiplier_:.3g} | "
                  f"{s:.1f} |", flush=True)
            if name in LOCAL and eps is not None:
                err, s, model = fit(cls, X_train, X_test, common, early_stopping=False,
                                    privacy=LocalDP(target_epsilon=eps, target_delta=DELTA,
                                                    clip=LOCAL[name]))
                why = f" {model}" if isinstance(model, str) else ""
                table.setdefault((name, "LocalDP"), {})[eps] = err
                print(f"| {name} | LocalDP | {eps:g} | {err:.4f}{why} | {LOCAL[name]:g} | | "
                      f"| {s:.1f} |", flush=True)
    epsilon_table(table, plain, biases, [e for e in args.epsilons])


def epsilon_table(table, plain, biases, epsilons):
    """Test RMSE per epsilon of every private row, and its distance to the estimator's own
    non-private fit (``- plain``) and to the biases-only fit (``- biases``) when measured."""
    if not table or not epsilons:
        return
    print()
    print("| estimator | privacy | " + " | ".join(f"eps {e:g}" for e in epsilons) + " | no DP |")
    print("|---|---|" + "---|" * (len(epsilons) + 1))
    for (name, privacy), row in table.items():
        cells = [row.get(e, float("nan")) for e in epsilons]
        ref = plain.get(name)
        print(f"| {name} | {privacy} | " + " | ".join(f"{c:.4f}" for c in cells)
              + f" | {'' if ref is None else f'{ref:.4f}'} |")
        for label, against in (("- plain", ref), ("- biases", biases)):
            if against is not None and not (label == "- biases" and name == "FedBaseline"):
                print(f"| {name} | {privacy} {label} | "
                      + " | ".join(f"{c - against:+.4f}" for c in cells) + " | |")


if __name__ == "__main__":
    main()
