"""RFRec / RFRecF on MovieLens latest-small: accuracy, dropout (Table 3), sensitivity (Table 4).

Usage::

    python benchmarks/bench_rfrec.py --table main         # 5 seeds, beside FedMCADMM, FedMAvg
    python benchmarks/bench_rfrec.py --table dropout      # Table 3: 0-90 % lost uploads
    python benchmarks/bench_rfrec.py --table sensitivity  # Table 4: alpha x lambda grid
    python benchmarks/bench_rfrec.py --table cost         # seconds per round, state memory
    python benchmarks/bench_rfrec.py --table pmf          # Table 2: beside centralized PMF
    python benchmarks/bench_rfrec.py --table paper        # Table 2 with PAPER_SETTINGS
    python benchmarks/bench_rfrec.py --quick              # smoke run of all four, tiny

Protocol: a random 80/20 split of every user's ratings (``train_test_split_ratings``, seeded);
RMSE and MAE at the held-out ratings of the *federated* model ``link(u_i . vbar_j)`` (the
paper's evaluation), the RMSE of the personal models ``link(u_i . v_(c)j)``
(``predict_with="personal"``, never evaluated in the paper), plus the fold-in RMSE of
``score``. Settings (the paper's Section 4 and the authors' code):

- ``paper``: the algorithms as written (plain gradient steps, identity link, raw ratings,
  alpha 0.05 / 0.025, lambda 10, p 0.5, K 100, one client per user);
- ``code``: the authors' notebooks: Adam(0.1) with per-client moments, sigmoid link on
  min-max-scaled ratings, the code's ``lam_L = 10`` (``reg_consensus=20``); RFRecF with the
  averaging probability 0.8, pull ``eta = 1`` and 200 iterations. One client per user.

The paper's numbers are for ML-1M (6040 users); they are printed for reference only.

``pmf`` (Table 2's comparison): RFRec and RFRecF (code settings, one client per user; RFRec
also with ``reg_consensus=100``) beside a centralized PMF: one client holding every user, no
consensus penalty, full-batch Adam 0.01 on the same loss, rank, link and initialization, with
RFRec's regularization (``lambda_u = 0.1``, ``lambda_v = 0``) or with the authors'
``PMF.ipynb`` one (``lambda_u = lambda_v = 0.1``); on the same splits, on ml-latest-small and
on ``make_ratings`` at the ML-100K shape (943 x 1682, 100000 ratings). Every method overfits
with these weak penalties, so the test RMSE depends on when it stops: each fit holds out 10 %
of its training ratings, and the table gives the test RMSE after the paper's ``K`` rounds
(100; RFRecF 200 coin flips) and at the round of the best validation RMSE (of up to 200
rounds for RFRec, 400 with ``reg_consensus=100``, 400 flips for RFRecF, 150 epochs for PMF),
mean (std) over the seeds, with the paired gaps to both PMFs at their own best rounds.

``paper`` (Table 2's protocol with ``PAPER_SETTINGS["RFRec"]`` and ``["RFRecF"]``): a random
80/20 split of the *ratings* (not of each user's), rank 20, through ``RatingRegressor``, test
RMSE and MAE per seed and mean (std), on ml-latest-small (the stand-in for MovieLens 100K: the
same site, 100K ratings); then, on seed 0, the site-like sets of ``make_site_ratings``, where
the settings must not diverge, beside ``BaselineOnly`` when Surprise is installed.
"""

import argparse
import sys
import time
import warnings

import numpy as np
from joblib import Parallel, delayed

from sklearn_fedmf import FedMCADMM, RFRec
from sklearn_fedmf.completion import PAPER_SETTINGS
from sklearn_fedmf.engine._fit import merge_params, route_solver_params
from sklearn_fedmf.model_selection import train_test_split_ratings

try:
    from sklearn_fedmf import FedMAvg
except ImportError:  # not merged yet
    FedMAvg = None

def build(**params):
    """RFRec from one flat dict of settings (its solver_params keys routed into the dict)."""
    return RFRec(**route_solver_params(RFRec, params))


def set_flat(est, **params):
    """``est.set_params`` with flat settings, solver keys merged into its solver_params."""
    return est.set_params(**route_solver_params(
        type(est), merge_params({"solver_params": est.solver_params or {}}, params)))


# the paper's objective (its penalties, no biases), one client per user: PAPER_SETTINGS["RFRec"]
# is the code's settings with its 200 contiguous clients, and the default is 10 clients
OBJECTIVE = dict(alpha_u=0.1, alpha_v=0.0, biased=False, n_clients=None)
PAPER = dict(OBJECTIVE, learning_rate=0.05, reg_consensus=10.0, center=False)
CODE = dict(OBJECTIVE, optimizer="adam", link="sigmoid", learning_rate=0.1,
            reg_consensus=20.0)
CODE_F = dict(CODE, variant="rfrecf", p=0.8, pull_eta=1.0, max_iter=200)
PMF = dict(CODE, n_clients=1, reg_consensus=0.0, learning_rate=0.01)  # full-batch Adam 0.01
# a stronger consensus (the code's lam_L = 50): copies closer to Vbar, slower but closer to PMF
CODE_TIGHT = dict(CODE, reg_consensus=100.0)
PMF_MODELS = {  # name: (model, rounds run, rounds between evaluations); PMF: one client
    "RFRec (code)": (lambda: build(**CODE), 200, 10),
    "RFRec (lambda=100)": (lambda: build(**CODE_TIGHT), 400, 10),
    "RFRecF (code)": (lambda: build(**CODE_F), 400, 20),
    "PMF (RFRec's reg)": (lambda: build(**PMF), 150, 5),
    "PMF (notebook)": (lambda: build(**{**PMF, "alpha_v": 0.1}), 150, 5),
}
TABLE2_ML100K = {"RFRec (code)": 0.9325, "RFRec (lambda=100)": 0.9325, "RFRecF (code)": 0.9385,
                 "PMF (RFRec's reg)": 0.9318, "PMF (notebook)": 0.9318}
MODELS = {
    "RFRec (paper)": lambda: build(**PAPER),
    "RFRecF (paper)": lambda: build(
        **{**PAPER, "learning_rate": 0.025}, solver_params={"variant": "rfrecf", "p": 0.5},
    ),
    "RFRec (code)": lambda: build(**CODE),
    "RFRecF (code)": lambda: build(**CODE_F),
    "FedMCADMM": lambda: FedMCADMM(n_components=5, n_clients=100, clients_per_round=10,
                                   max_iter=100, **PAPER_SETTINGS["FedMCADMM"]),
}
if FedMAvg is not None:
    MODELS["FedMAvg"] = lambda: FedMAvg(n_components=5, n_clients=100, clients_per_round=10,
                                        max_iter=100, **PAPER_SETTINGS["FedMAvg"])
TABLE3 = {  # ML-1M, RMSE then MAE, drop rates 0, 20, 50, 80, 90 %
    "RFRec": ([0.8831, 0.8870, 0.8956, 0.8966, 0.9001], [0.6937, 0.6958, 0.7083, 0.7090, 0.7117]),
    "RFRecF": ([0.8840, 0.8891, 0.9005, 0.9048, 0.9057], [0.6906, 0.6974, 0.7017, 0.7038, 0.7064]),
}
TABLE4 = {  # ML-1M RMSE, rows alpha = 0.1, 0.05, 0.025, 0.0125; columns lambda = 5, 10, 20, 40
    "RFRec": [[0.8912, 0.8948, 0.8963, 0.9036], [0.8957, 0.8846, 0.8869, 0.8887],
              [0.9057, 0.8928, 0.8897, 0.8983], [0.8895, 0.8870, 0.8891, 0.8920]],
    "RFRecF": [[0.9169, 0.9035, 0.9066, 0.9139], [0.9254, 0.9108, 0.8923, 0.9070],
               [0.9101, 0.8830, 0.8856, 0.8908], [1.0491, 0.9588, 0.9102, 0.8992]],
}
ALPHAS, LAMBDAS, DROPS = [0.1, 0.05, 0.025, 0.0125], [5.0, 10.0, 20.0, 40.0], [0, .2, .5, .8, .9]


def load(quick, movielens_dir=None):
    """ml-latest-small (embedded), or MovieLens 100K read from ``movielens_dir`` (its
    ``u.data``; a local copy, never in the repository)."""
    from sklearn_fedmf.datasets import load_movielens

    X = (load_movielens("100k", path=movielens_dir) if movielens_dir
         else load_movielens()).X.tocsr()
    if quick:  # the 150 most active users and the items they rated
        X = X[np.argsort(-np.diff(X.indptr))[:150]]
        X = X[:, np.flatnonzero(X.getnnz(axis=0))].tocsr()
    return X


def evaluate(make, X, seed, quick, **params):
    """Fit on an 80/20 split; federated RMSE/MAE and fold-in RMSE (NaN if it diverged)."""
    X_train, X_test = train_test_split_ratings(X, 0.2, random_state=seed)
    est = set_flat(make(), random_state=seed, eval_every=0, **params)
    if quick:
        est.set_params(max_iter=5)
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            est.fit(X_train)
        except FloatingPointError as exc:
            return dict(rmse=np.nan, mae=np.nan, foldin=np.nan, personal=np.nan, seconds=0.0,
                        note=str(exc).split(";")[0])
    rows = np.repeat(np.arange(X_test.shape[0]), np.diff(X_test.indptr))
    pred = est.inverse_transform(est.user_factors_)[rows, X_test.indices]
    err = pred - X_test.data
    seconds = time.perf_counter() - tic
    foldin = -est.score(X_train, X_test)
    personal = np.nan
    if "predict_with" in est.get_params():
        personal = -set_flat(est, predict_with="personal").score(X_train, X_test)
    return dict(rmse=float(np.sqrt(np.mean(err**2))), mae=float(np.mean(np.abs(err))),
                personal=personal, foldin=foldin, seconds=seconds,
                comm=getattr(est, "comm_rounds_", 2 * est.n_iter_), note="")


def run(tasks, n_jobs):
    return Parallel(n_jobs=n_jobs)(delayed(evaluate)(*t[0], **t[1]) for t in tasks)


def table_main(X, seeds, quick, n_jobs, variants=None):
    tasks = [((MODELS[name], X, seed, quick), {}) for name in MODELS for seed in seeds]
    results = iter(run(tasks, n_jobs))
    print(f"\nml-latest-small {X.shape}, 80/20 split, seeds {list(seeds)}: mean (std)")
    print(f"{'model':16s} {'RMSE':>16s} {'MAE':>16s} {'personal RMSE':>16s} "
          f"{'fold-in RMSE':>16s} {'comm':>5s} {'s/fit':>6s}  note")
    for name in MODELS:
        rs = [next(results) for _ in seeds]
        cell = {k: _mean_std([r[k] for r in rs]) for k in ("rmse", "mae", "personal", "foldin")}
        if "predict_with" not in MODELS[name]().get_params():
            cell["personal"] = "-"
        comm = rs[0].get("comm", "-")
        print(f"{name:16s} {cell['rmse']:>16s} {cell['mae']:>16s} {cell['personal']:>16s} "
              f"{cell['foldin']:>16s} "
              f"{comm!s:>5s} {np.mean([r['seconds'] for r in rs]):6.1f}  {rs[0]['note']}")
    print("ML-1M, paper Table 2: RFRec 0.8831 / 0.6937, RFRecF 0.8840 / 0.6906 (RMSE / MAE)")


def _variants(names):
    return {v: MODELS[f"{v} (code)"] for v in names}


def table_dropout(X, seeds, quick, n_jobs, variants=("RFRec", "RFRecF")):
    makes = _variants(variants)
    tasks = [((makes[v], X, s, quick), {"dropout": d}) for v in makes for d in DROPS
             for s in seeds]
    results = iter(run(tasks, n_jobs))
    print(f"\nTable 3: fraction of lost uploads per round (code settings), seeds {list(seeds)};"
          " ML-1M paper values in brackets")
    print(f"{'':16s}" + "".join(f"{f'{d:.0%}':>18s}" for d in DROPS))
    for v in makes:
        rs = [[next(results) for _ in seeds] for _ in DROPS]
        for k, metric in enumerate(("rmse", "mae")):
            cells = [f"{np.nanmean([r[metric] for r in cell]):.4f} [{TABLE3[v][k][i]:.4f}]"
                     for i, cell in enumerate(rs)]
            print(f"{v + ' ' + metric.upper():16s}" + "".join(f"{c:>18s}" for c in cells))


def table_sensitivity(X, seeds, quick, n_jobs, variants=("RFRec", "RFRecF")):
    makes = _variants(variants)

    def params(v, a, lam):
        p = dict(learning_rate=a, reg_consensus=lam)
        if v == "RFRecF":  # the code's commented-out eta = min(1, alpha lambda / p)
            p.update(p=0.5, pull_eta=min(1.0, a * lam / 0.5))
        return p

    tasks = [((makes[v], X, s, quick), params(v, a, lam)) for v in makes for a in ALPHAS
             for lam in LAMBDAS for s in seeds]
    results = iter(run(tasks, n_jobs))
    print(f"\nTable 4: test RMSE over alpha (rows, Adam step) x lambda (columns), code settings "
          f"(RFRecF: p = 0.5, eta = min(1, alpha lambda / p)), seeds {list(seeds)}; "
          "ML-1M paper values in brackets")
    for v in makes:
        print(f"{v:8s}" + "".join(f"{f'lambda={lam:g}':>18s}" for lam in LAMBDAS))
        for i, a in enumerate(ALPHAS):
            cells = []
            for j in range(len(LAMBDAS)):
                rmse = np.nanmean([next(results)["rmse"] for _ in seeds])
                cells.append(f"{rmse:.4f} [{TABLE4[v][i][j]:.4f}]")
            print(f"{a:<8g}" + "".join(f"{c:>18s}" for c in cells))


def table_cost(X, seeds, quick, n_jobs, variants=None):
    """Seconds per round and state memory: one engine client per user vs 200 groups."""
    data = {"ml-latest-small": X}
    if not quick:
        from sklearn_fedmf.datasets import make_ratings

        data["synthetic ML-1M shape"] = make_ratings(6040, 3706, 1_000_209, random_state=0).X
    print("\nCost of a round (gd, identity, d = 20, no evaluation), n_jobs = 1 and 2")
    print(f"{'data':22s} {'clients':>8s} {'s/round (1)':>12s} {'s/round (2)':>12s} "
          f"{'state MB':>9s} {'dense MB':>9s}")
    rounds = 2 if quick else 5
    for name, Xd in data.items():
        n, m = Xd.shape
        rows = np.repeat(np.arange(n), np.diff(Xd.indptr))
        for n_clients in (None, min(200, n // 2)):  # (the --quick data has 150 users)
            times = []
            for jobs in (1, 2):
                est = build(**{**OBJECTIVE, "learning_rate": 1e-3, "n_clients": n_clients},
                            max_iter=rounds, eval_every=0, n_jobs=jobs, random_state=0)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    est.fit(Xd)
                times.append(np.median([r["seconds"] for r in est.history_]))
            codes = np.unique(est.clients_, return_inverse=True)[1]
            pairs = len(np.unique(codes[rows] * m + Xd.indices))
            state = (n + pairs + 2 * m) * 20 * 8 / 2**20
            dense = est.n_clients_ * m * 20 * 8 / 2**20
            print(f"{name:22s} {est.n_clients_:>8d} {times[0]:>12.3f} {times[1]:>12.3f} "
                  f"{state:>9.1f} {dense:>9.0f}")


def _pmf_curve(name, make, rounds, every, X, seed, quick):
    """Test and validation RMSE every ``every`` rounds of one fit (warm-started chunks)."""
    X_train, X_test = train_test_split_ratings(X, 0.2, random_state=seed)
    X_fit, X_val = train_test_split_ratings(X_train, 0.1, random_state=seed)
    if quick:
        rounds = 4 * every
    est = set_flat(make(), random_state=seed, eval_every=0, max_iter=every, warm_start=True)
    curves = {"val": [], "test": []}
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(rounds // every):
            est.fit(X_fit)
            full = est.inverse_transform(est.user_factors_)
            for key, Y in (("val", X_val), ("test", X_test)):
                rows = np.repeat(np.arange(Y.shape[0]), np.diff(Y.indptr))
                curves[key].append(float(np.sqrt(np.mean((full[rows, Y.indices] - Y.data)**2))))
    print(f"  ({name}, seed {seed}: {time.perf_counter() - tic:.0f} s)", file=sys.stderr,
          flush=True)
    return curves


def table_pmf(X, seeds, quick, n_jobs, variants=None):
    """Table 2's comparison: RFRec, RFRecF and a centralized PMF on the same splits."""
    from sklearn_fedmf.datasets import make_ratings

    shape = (150, 400, 6000) if quick else (943, 1682, 100_000)
    data = {"ml-latest-small": X,
            f"make_ratings {shape[0]}x{shape[1]}": make_ratings(*shape, random_state=0).X}
    for name, Xd in data.items():
        tasks = [(m, *PMF_MODELS[m], Xd, seed, quick) for m in PMF_MODELS for seed in seeds]
        curves = iter(Parallel(n_jobs=n_jobs)(delayed(_pmf_curve)(*t) for t in tasks))
        at_budget, chosen, at_chosen, budgets = {}, {}, {}, {}
        for model, (make, _, every) in PMF_MODELS.items():
            budget = budgets[model] = int(min(make().max_iter, 4 * every if quick else np.inf))
            rs = [next(curves) for _ in seeds]
            at_budget[model] = np.array([r["test"][budget // every - 1] for r in rs])
            best = [int(np.argmin(r["val"])) for r in rs]
            chosen[model] = np.array([(b + 1) * every for b in best])
            at_chosen[model] = np.array([r["test"][b] for r, b in zip(rs, best)])
        print(f"\nTable 2 protocol on {name} {Xd.shape}, seeds {list(seeds)}: an 80/20 split per "
              "user, 10 % of the training ratings held out for validation; test RMSE of "
              "u_i . vbar_j, mean (std); paper ML-100K in brackets")
        print(f"{'model':18s} {'at K (paper)':>17s} {'K':>4s} {'at best val':>17s} "
              f"{'rounds':>7s} {'- PMF (RFRec reg)':>18s} {'- PMF (notebook)':>17s}")
        for model in PMF_MODELS:
            gaps = [_mean_std(at_chosen[model] - at_chosen[ref], signed=True)
                    for ref in ("PMF (RFRec's reg)", "PMF (notebook)")]
            print(f"{model:18s} {_mean_std(at_budget[model]):>17s} "
                  f"{budgets[model]:>4d} {_mean_std(at_chosen[model]):>17s} "
                  f"{np.mean(chosen[model]):>7.0f} {gaps[0]:>18s} {gaps[1]:>17s}  "
                  f"[{TABLE2_ML100K[model]:.4f}]")


def _mean_std(values, signed=False):
    values = np.asarray(values, dtype=float)
    if np.isnan(values).all():
        return "diverged"
    return f"{np.nanmean(values):{'+' if signed else ''}.4f} ({np.nanstd(values):.4f})"


def _paper_fit(name, X, seed, quick=False):
    """Test RMSE and MAE of ``PAPER_SETTINGS[name]`` on a random 80/20 split of the ratings
    (NaN if it diverged; ``quick``: 5 clients, 5 rounds)."""
    from sklearn_fedmf import RatingRegressor

    coo = X.tocoo()
    test = np.random.default_rng(seed).random(coo.nnz) < 0.2
    pairs = np.column_stack([coo.row, coo.col])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            params = {**PAPER_SETTINGS[name], **({"n_clients": 5, "max_iter": 5} if quick
                                                 else {})}
            model = RatingRegressor(RFRec(**params, random_state=seed)).fit(
                pairs[~test], coo.data[~test])
    except FloatingPointError:
        return float("nan"), float("nan")
    error = model.predict(pairs[test]) - coo.data[test]
    return float(np.sqrt(np.mean(error**2))), float(np.mean(np.abs(error)))


def _baseline_rmse(X, seed):
    """Surprise's BaselineOnly on the same split (None without Surprise)."""
    try:
        from surprise import BaselineOnly, Dataset, Reader
    except ImportError:
        return None
    import pandas as pd

    coo = X.tocoo()
    test = np.random.default_rng(seed).random(coo.nnz) < 0.2
    frame = pd.DataFrame({"u": coo.row, "i": coo.col, "r": coo.data})
    reader = Reader(rating_scale=(float(coo.data.min()), float(coo.data.max())))
    train = Dataset.load_from_df(frame[~test], reader).build_full_trainset()
    algo = BaselineOnly(verbose=False).fit(train)
    pred = [algo.predict(u, i).est for u, i in zip(frame.u[test], frame.i[test])]
    return float(np.sqrt(np.mean((np.array(pred) - coo.data[test]) ** 2)))


def table_paper(X, seeds, quick, n_jobs, variants=("RFRec", "RFRecF")):
    """Table 2's protocol with the paper's (the authors' code) settings."""
    from sklearn_fedmf.datasets import SITE_PRESETS, make_site_ratings

    tasks = [(name, X, seed, quick) for name in variants for seed in seeds]
    results = iter(Parallel(n_jobs=n_jobs)(delayed(_paper_fit)(*t) for t in tasks))
    data = ("MovieLens 100K" if X.shape == (943, 1682)
            else f"ml-latest-small {X.shape} (stand-in for MovieLens 100K: --movielens-dir)")
    print(f"\nTable 2 protocol, PAPER_SETTINGS, {data}, random 80/20 of the ratings, "
          f"seeds {list(seeds)}")
    for name in variants:
        rs = np.array([next(results) for _ in seeds])
        per_seed = ", ".join(f"{r:.4f}" for r in rs[:, 0])
        print(f"{name:7s} RMSE {_mean_std(rs[:, 0])}  MAE {_mean_std(rs[:, 1])}  "
              f"[paper ML-100K {TABLE2_ML100K[name + ' (code)']:.4f}]  per seed: {per_seed}")
    sets = {k: make_site_ratings(k, n_ratings=(3000 if quick else None),
                                 random_state=0).X for k in SITE_PRESETS
            if k != "netflix-1m" or quick}
    tasks = [(name, Xs, 0, quick) for Xs in sets.values() for name in variants]
    results = iter(Parallel(n_jobs=n_jobs)(delayed(_paper_fit)(*t) for t in tasks))
    print("\nsite-like sets (seed 0): test RMSE, NaN = diverged")
    print(f"{'data':12s} " + " ".join(f"{v:>8s}" for v in variants) + f" {'Baseline':>9s}")
    for key, Xs in sets.items():
        row = [next(results)[0] for _ in variants]
        base = _baseline_rmse(Xs, 0)
        print(f"{key:12s} " + " ".join(f"{r:8.4f}" for r in row)
              + (f" {base:9.4f}" if base is not None else f" {'-':>9s}"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", choices=["main", "dropout", "sensitivity", "cost", "pmf",
                                            "paper", "all"],
                        default="all")
    parser.add_argument("--seeds", type=int, default=None,
                        help="number of splits/seeds (default 5 for main, 1 otherwise)")
    parser.add_argument("--n-jobs", type=int, default=2, help="fits run in parallel")
    parser.add_argument("--variants", nargs="+", choices=["RFRec", "RFRecF"],
                        default=["RFRec", "RFRecF"], help="for the dropout and sensitivity tables")
    parser.add_argument("--quick", action="store_true", help="smoke run: 150 users, 5 rounds")
    parser.add_argument("--movielens-dir", default=None,
                        help="folder of a MovieLens 100K copy (u.data): every table runs on "
                             "it instead of the embedded ml-latest-small")
    args = parser.parse_args(argv)
    if args.movielens_dir is None:
        print("no --movielens-dir: ml-latest-small (embedded) stands in for MovieLens 100K")
    X = load(args.quick, args.movielens_dir)
    tables = ["main", "dropout", "sensitivity", "cost"] if args.table == "all" else [args.table]
    for table in tables:
        n_seeds = args.seeds or (5 if table in ("main", "pmf", "paper") and not args.quick
                                 else 1)
        tic = time.perf_counter()
        globals()[f"table_{table}"](X, range(n_seeds), args.quick, args.n_jobs, args.variants)
        print(f"({time.perf_counter() - tic:.0f} s)")


if __name__ == "__main__":
    main()
