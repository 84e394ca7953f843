"""Distributed DP (noise on the secure sum) against local DP: test RMSE per epsilon.

Usage::

    python benchmarks/bench_distributed_dp.py                      # 1,000 x 500 x 50,000
    python benchmarks/bench_distributed_dp.py --users 6040 --items 3706 --ratings 1000000
    python benchmarks/bench_distributed_dp.py --epsilons 8 --estimators FedMAvg

``make_ratings(--users, --items, --ratings, random_state=0)``, an 80/20 split of every
user's ratings, one client per user, ``--per-round`` (10%) of the clients per round,
``--rounds`` rounds, no validation. For each estimator and epsilon (``delta = 1e-6``):

- ``DistributedDP(target_epsilon=eps, clip=--clip)`` (its fit runs secure aggregation);
- ``LocalDP(target_epsilon=eps, target_delta=1e-6, clip=...)`` where the estimator takes
  it (RFRec, Laplace on its clipped item factors); ``n/a`` elsewhere;

beside the non-private plain fit and ``FedBaseline`` (biases only) at the same rounds. Each
fit's seconds are printed (a secure simulation at one client per user runs thousands of
X25519 agreements per round).
"""

import argparse
import time
import warnings

import numpy as np

from sklearn_fedmf import FedBaseline, FedMAvg, FedMGS, RFRec
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.model_selection import train_test_split_ratings
from sklearn_fedmf.privacy import DistributedDP, LocalDP

DELTA = 1e-6
CLASSES = {"FedMAvg": FedMAvg, "FedMGS": FedMGS, "RFRec": RFRec, "FedBaseline": FedBaseline}
LOCAL = {"RFRec": 0.2}  # the estimators that take LocalDP, and its entry clip (RFRec's paper)


def fit(cls, X, X_test, common, **kw):
    """``(test RMSE, seconds, why it failed)``: RMSE of ``score(X, X_test)`` (each user's
    factors folded in from its training ratings)."""
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = cls(**common, **kw).fit(X)
            err = -model.score(X, X_test)
        except (ValueError, np.linalg.LinAlgError, FloatingPointError) as exc:
            return float("nan"), time.perf_counter() - tic, type(exc).__name__
    return err, time.perf_counter() - tic, ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--ratings", type=int, default=50_000)
    parser.add_argument("--per-round", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--clip", type=float, default=None,
                        help="DistributedDP's L2 clip (default: per estimator, CLIP)")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--estimators", nargs="+", default=["FedMAvg", "FedMGS"])
    parser.add_argument("--clip-only", action="store_true",
                        help="also a row at no noise (noise=1e-9): what clipping alone costs")
    parser.add_argument("--min-survivors", default="threshold",
                        help='DistributedDP\'s min_survivors: "threshold" or a fraction')
    parser.add_argument("--max-releases", type=int, default=None,
                        help="DistributedDP's max_releases (default: MAX_RELEASES)")
    args = parser.parse_args()
    data = make_ratings(args.users, args.items, args.ratings, random_state=0)
    X_train, X_test = train_test_split_ratings(data.X, 0.2, random_state=0)
    per_round = max(2, int(round(args.per_round * args.users)))
    common = dict(n_clients=args.users, clients_per_round=per_round, max_iter=args.rounds,
                  random_state=0)
    survivors = (args.min_survivors if args.min_survivors == "threshold"
                 else float(args.min_survivors))
    print(f"make_ratings({args.users}, {args.items}, {args.ratings}), 80/20, one client per "
          f"user, {per_round} per round, {args.rounds} rounds, delta={DELTA:g}, "
          f"min_survivors={survivors}")
    base, s, why = fit(FedBaseline, X_train, X_test, common)
    print(f"FedBaseline (biases only, plain): test RMSE {base:.4f}{why} ({s:.1f} s)")
    print()
    print("| estimator | clip | max_releases | epsilon | DistributedDP RMSE | s | LocalDP RMSE "
          "| s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.estimators:
        cls = CLASSES[name]
        extra = EXTRA.get(name, {})
        plain, s, why = fit(cls, X_train, X_test, common, early_stopping=False, **extra) if (
            name != "FedBaseline") else fit(cls, X_train, X_test, common)
        clip = args.clip if args.clip is not None else CLIP[name]
        cap = args.max_releases if args.max_releases is not None else MAX_RELEASES.get(name)
        print(f"| {name} | - | - | inf (plain) | {plain:.4f}{why} | {s:.1f} | | |", flush=True)
        if args.clip_only:
            err, s, why = fit(cls, X_train, X_test, common, **extra, privacy=DistributedDP(
                noise=1e-9, clip=clip, min_survivors=survivors, max_releases=cap))
            print(f"| {name} | {clip:g} | {cap} | inf (clip only) | {err:.4f}"
                  f"{' ' + why if why else ''} | {s:.1f} | | |", flush=True)
        for eps in args.epsilons:
            ddp = DistributedDP(target_epsilon=eps, target_delta=DELTA, clip=clip,
                                min_survivors=survivors, max_releases=cap)
            err, s, why = fit(cls, X_train, X_test, common, privacy=ddp, **extra)
            local, ls = "n/a", ""
            if name in LOCAL:
                lerr, lsec, lwhy = fit(cls, X_train, X_test, common, early_stopping=False,
                                       privacy=LocalDP(target_epsilon=eps, target_delta=DELTA,
                                                       clip=LOCAL[name]))
                local, ls = f"{lerr:.4f}{' ' + lwhy if lwhy else ''}", f"{lsec:.1f}"
            print(f"| {name} | {clip:g} | {cap} | {eps:g} | {err:.4f}{' ' + why if why else ''} | "
                  f"{s:.1f} | {local} | {ls} |", flush=True)


# DistributedDP's clip per estimator (L2 of a client's summands of one exchange: FedMAvg's
# update W_p - V, FedMGS's change of its aggregates), chosen on make_ratings(300, 200, 15000)
CLIP = {"FedMAvg": 0.1, "FedMGS": 0.3, "RFRec": 1.0, "FedBaseline": 5.0}
# DistributedDP's max_releases per estimator: FedMGS's client is in the start's sum and in
# the rounds it is sampled in (about 2 of 20 at 10%); FedMAvg's default "pcc" sums every
# client's Gram change each round (a release per round: no cap; "pcp", which sums only the
# sampled clients', fits 1.065 plain against 0.897 on make_ratings(1000, 500, 50000))
MAX_RELEASES = {"FedMGS": 5}
EXTRA = {}

if __name__ == "__main__":
    main()
