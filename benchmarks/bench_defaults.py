"""Defaults vs best tuned, per data set: do the completion estimators' defaults transfer?

    python benchmarks/bench_defaults.py            # the table (one to two hours on 2 busy cores)
    python benchmarks/bench_defaults.py --quick    # smoke run: two small data sets, 5 rounds
    python benchmarks/bench_defaults.py --data ml,ml-users --estimators FedMAvg

Protocol (the papers'): an 80/20 random split of each user's ratings; rank 5, 100 clients, 10
sampled per round, 100 rounds; every other parameter at its default. ``plain`` and
``weighted`` are the test RMSEs of the two regularizations at their reference strengths
(``PLAIN``: the papers' unweighted penalties; ``WEIGHTED``: ALS-WR's weighted lambda, per
rating); ``default`` is the estimator's defaults (one of the two). "tuned" picks, on a
holdout (20 %) of the training part only, the best of each regularization's strengths at a
third, one and three times its reference (with biases) and the defaults without biases,
then refits it on the whole training part; every column is scored on the test part, which
no choice sees. A default passes when it is within 0.02 RMSE of the tuned value.

Data sets. The defaults were chosen on ``ml`` (MovieLens latest-small), ``ml-users`` (its
300 most active users), ``1m-0.5`` and ``1m-1.0`` (the last two also chose the biased steps'
block weight ``tau`` of ``sklearn_fedmf._biases``); the others only confirm them:

* ``ml-items``: latest-small restricted to its 1,700 most rated items (rows left empty
  dropped);
* ``1m-0.5``, ``1m-1.0``: ``make_ratings`` at the ML-1M shape (6040 x 3706, 1,000,209
  ratings) scaled down 8x in rows and ratings (755 users, 125,026 ratings, the same ratings
  per user and the same items), noise 0.5 and 1.0;
* ``10m-0.5``, ``10m-1.0``: the ML-10M shape (69878 x 10677, 10,000,054 ratings) scaled down
  40x in rows and ratings (1747 users, 250,001 ratings), noise 0.5 and 1.0;
* ``100k-0.8``: the ML-100K shape (943 x 1682, 100,000 ratings), noise 0.8;
* ``20m-0.7``: the ML-20M shape (138493 x 26744, 20,000,263 ratings) scaled down 100x in rows
  and ratings (1384 users, 200,002 ratings: few ratings per item), noise 0.7.

The last two joined after the defaults of 2026-11 were chosen: no default has seen them.

Site-like sets (``sklearn_fedmf.datasets.make_site_ratings``; they only confirm): biases
first, weak taste, heavy-tailed activity, other scales:

* ``filmtrust``: FilmTrust's shape and 0.5-4 half-star scale (1508 x 2071, 35,497 ratings,
  median 12 ratings per user);
* ``douban``: the Douban movie subset's shape (3000 x 3000, 136,891 ratings, 1-5 stars);
* ``epinions``: Epinions scaled down 8x (5020 x 17467, 83,103 ratings, median 10);
* ``netflix-1m``: Netflix's titles and activity at 1,000,000 ratings, half stars 0.5-5
  (``netflix-100k`` and ``netflix-200k``: the same at 100,000 and 200,000 ratings).

A MovieLens release on disk is ``<release>:<path>`` (e.g. ``100k:ml-100k/u.data``), read with
``load_movielens``: for measuring on real data that the repository does not ship.

The scaling keeps each user's number of ratings and the item count; it is there so that the
whole table runs in about an hour on a shared two-core machine.
"""

import argparse
import time
import warnings

import numpy as np

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS, RFRec
from sklearn_fedmf.datasets import SITE_PRESETS, load_movielens, make_ratings, make_site_ratings
from sklearn_fedmf.model_selection import train_test_split_ratings

PROTOCOL = dict(n_components=5, n_clients=100, clients_per_round=10, max_iter=100,
                random_state=0, solver_params={"eval_every": 0})
ESTIMATORS = {"FedMCADMM": FedMCADMM, "FedMAvg": FedMAvg, "FedMGS": FedMGS, "RFRec": RFRec}
CHOSEN_ON = ("ml", "ml-users", "1m-0.5", "1m-1.0")
# the sets that chose the "auto" strengths of FedMC-ADMM, FedMAvg and FedMGS
# (sklearn_fedmf.completion._auto_strengths); every other set only confirms them
AUTO_CHOSEN_ON = ("ml", "filmtrust", "douban", "epinions")
# the two regularizations at their reference strengths (RFRec has only its own)
PLAIN = {"FedMCADMM": {"regularization": "plain", "alpha_u": 10.0, "alpha_v": 0.1},
         "FedMAvg": {"regularization": "plain", "alpha_u": 10.0, "alpha_v": 10.0},
         "FedMGS": {"regularization": "plain", "alpha_u": 10.0, "alpha_v": 10.0}}
WEIGHTED = {"regularization": "weighted", "alpha_u": 0.1, "alpha_v": 0.1}
PLAIN_WEIGHTED = ("plain", "weighted")
SHAPES = {"1m": (6040, 3706, 1000209, 8), "10m": (69878, 10677, 10000054, 40),
          "100k": (943, 1682, 100000, 1), "20m": (138493, 26744, 20000263, 100)}
# the site-like sets: (preset of make_site_ratings, ratings or None for the preset's)
SITE_SETS = {**{name: (name, None) for name in SITE_PRESETS},
             "netflix-100k": ("netflix-1m", 100_000), "netflix-200k": ("netflix-1m", 200_000)}


def load(name, quick=False):
    """The rating matrix of a data set of the protocol (``<release>:<path>``: a MovieLens
    release read from a local file, e.g. ``100k:ml-100k/u.data``; never committed)."""
    if ":" in name:
        variant, path = name.split(":", 1)
        return load_movielens(variant, path=path).X.tocsr()
    if name.startswith("ml"):
        X = load_movielens().X.tocsr()
        if name == "ml-items":
            top = np.sort(np.argsort(-np.diff(X.tocsc().indptr), kind="stable")[:1700])
            X = X[:, top]
            X = X[np.diff(X.indptr) > 0]
        elif name == "ml-users":
            X = X[np.sort(np.argsort(-np.diff(X.indptr), kind="stable")[:300])]
            X = X[:, np.diff(X.tocsc().indptr) > 0]
        return X.tocsr()
    if name in SITE_SETS:
        preset, n_ratings = SITE_SETS[name]
        n_ratings = n_ratings or SITE_PRESETS[preset]["n_ratings"]
        return make_site_ratings(preset, n_ratings=n_ratings // (8 if quick else 1),
                                 random_state=0).X
    shape, noise = name.split("-")
    n_users, n_items, n_ratings, down = SHAPES[shape]
    down *= 8 if quick else 1  # (--quick: 94 users)
    return make_ratings(n_users // down, n_items, n_ratings // down, noise=float(noise),
                        random_state=0).X


def references(name):
    """``{"plain": params, "weighted": params}`` (RFRec: ``{"default": {}}``)."""
    if name not in PLAIN:
        return {"default": {}}
    return {"plain": PLAIN[name], "weighted": WEIGHTED}


def candidates(name):
    """The tuning grid: each regularization's strengths x 1/3, 1, 3 with biases, and the
    defaults without biases."""
    grid = []
    for ref in references(name).values():
        base = {**ESTIMATORS[name]().get_params(), **ref}
        if isinstance(base["alpha_u"], str):  # data-driven ("auto") strengths: no multiple
            grid.append({**ref, "biased": True})
            continue
        for factor in (1 / 3, 1.0, 3.0):
            grid.append({**ref, "alpha_u": base["alpha_u"] * factor,
                         "alpha_v": base["alpha_v"] * factor, "biased": True})
    grid.append({"biased": False})
    return grid


def rmse(model, X_fit, X_eval):
    return -model.score(X_fit, X_eval)


def is_default(name, params):
    defaults = ESTIMATORS[name]().get_params()
    return all(defaults[key] == value for key, value in params.items())


def run(name, data, rounds):
    """``(RMSE per reference, default RMSE, tuned RMSE, tuned params, seconds)`` of one
    estimator on one data set."""
    X_train, X_test = data
    X_fit, X_val = train_test_split_ratings(X_train, 0.2, random_state=1)
    cls = ESTIMATORS[name]
    protocol = dict(PROTOCOL, max_iter=rounds)
    tic = time.perf_counter()
    refs = {key: rmse(cls(**protocol, **params).fit(X_train), X_train, X_test)
            for key, params in references(name).items()}
    default = next((refs[key] for key, params in references(name).items()
                    if is_default(name, params)), None)
    if default is None:
        default = rmse(cls(**protocol).fit(X_train), X_train, X_test)
    scores = [(rmse(cls(**protocol, **params).fit(X_fit), X_fit, X_val), k)
              for k, params in enumerate(candidates(name))]
    best = candidates(name)[min(scores)[1]]
    tuned = rmse(cls(**protocol, **best).fit(X_train), X_train, X_test)
    return refs, default, tuned, best, time.perf_counter() - tic


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (small, 5 rounds)")
    parser.add_argument("--data", default="ml,ml-users,1m-0.5,ml-items,1m-1.0,10m-0.5,10m-1.0,"
                                          "100k-0.8,20m-0.7")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS))
    args = parser.parse_args()
    names = args.data.split(",") if not args.quick else ["1m-0.5"]
    rounds = 5 if args.quick else PROTOCOL["max_iter"]
    if args.quick:  # (94 users: fewer clients)
        PROTOCOL.update(n_clients=20, clients_per_round=5)
    print(f"defaults vs best tuned (holdout of the training part), rank 5, "
          f"{PROTOCOL['n_clients']} clients, {PROTOCOL['clients_per_round']} per round, "
          f"{rounds} rounds; test RMSE\n")
    header = (f"{'data':10s} {'role':8s} {'estimator':10s} {'plain':>7s} {'weighted':>8s} "
              f"{'default':>8s} {'tuned':>8s} {'gap':>7s} {'ok':>3s} {'seconds':>8s}  "
              f"tuned parameters")
    print(header + "\n" + "-" * len(header), flush=True)
    for data_name in names:
        X = load(data_name, quick=args.quick)
        data = train_test_split_ratings(X, 0.2, random_state=0)
        role = "chosen" if data_name in CHOSEN_ON else "confirm"
        for name in args.estimators.split(","):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # empty item columns of the small subsets
                refs, default, tuned, best, seconds = run(name, data, rounds)
            gap = default - tuned
            best_text = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                  for k, v in best.items())
            plain, weighted = (f"{refs[k]:.4f}" if k in refs else "-" for k in PLAIN_WEIGHTED)
            print(f"{data_name:10s} {role:8s} {name:10s} {plain:>7s} {weighted:>8s} "
                  f"{default:8.4f} {tuned:8.4f} "
                  f"{gap:+7.4f} {'yes' if gap <= 0.02 else 'NO':>3s} {seconds:8.1f}  "
                  f"{best_text}", flush=True)


if __name__ == "__main__":
    main()
