"""Early stopping on a sample of the clients: its decisions against every client's (issue 39).

Usage::

    python benchmarks/bench_validation_sample.py --trace --data small \
        --ratings ml-100k:/path/u.data --out /tmp/traces.npz     # one trace fit per set
    python benchmarks/bench_validation_sample.py --replay /tmp/traces.npz  # the rules offline
    python benchmarks/bench_validation_sample.py --fits --data small \
        --ratings filmtrust:/path/ratings.txt    # whole default fits, main's rule and the panel

Every set: an 80/20 random split of its ratings (seed 0; the split and the file formats of
``bench_sites.py``), one client per user, 10 % of the clients per round, each estimator's
defaults otherwise (``random_state=0``).

``--trace``: one fit per estimator and set that never stops (``n_iter_no_change`` larger than
``max_iter``) with every client reporting at every round through the per-client transport
(the grouped simulation returns a group's sums), recording each client's validation report
``(sse, count)`` and the test RMSE of the federation's model (the held-out 20 %, the fit's
``eval_set`` report) at every round. ``--replay``: early stopping (``n_iter_no_change`` 10,
the start-up rule, RFRecF's scored rounds) replayed on each trace with the validation RMSE of
every client (main's rule) and of panels (``--draws`` panels per rule, drawn uniformly): the
chosen round and the test RMSE there, against every client's (in % of every client's: the
records' units are the fit's, scaled by some classes), and the round of the best test RMSE.
``--fits``: whole fits with the package's rule (``"auto"``, the default) and with every
client (``validation_panel=None``), their best round and test RMSE (the final model's, floor
included; ``--no-floor``: the kept round's factors, the floor switched off in both).
"""

import argparse
import os
import sys
import time
import warnings

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, os.path.dirname(__file__))
from bench_sites import load  # noqa: E402  (the sets' formats and split)

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS, RFRec  # noqa: E402
from sklearn_fedmf._pairs import predict_pairs  # noqa: E402

MODELS = {"FedMCADMM": FedMCADMM, "FedMAvg": FedMAvg, "FedMGS": FedMGS, "RFRec": RFRec}
PATIENCE = 10


def matrices(spec, seed=0):
    if spec == "1m-shape":  # (no MovieLens 1M file: its shape, synthetic)
        from sklearn_fedmf.datasets import make_ratings
        from sklearn_fedmf.model_selection import train_test_split_ratings

        X = make_ratings(6040, 3706, 1_000_000, random_state=0).X.tocsr()
        return train_test_split_ratings(X, 0.2, random_state=seed)
    X_tr, y_tr, X_te, y_te, _ = load(spec, seed)
    shape = (int(X_tr[:, 0].max()) + 1, int(X_tr[:, 1].max()) + 1)
    train = sp.csr_matrix((y_tr, (X_tr[:, 0], X_tr[:, 1])), shape=shape)
    test = sp.csr_matrix((y_te, (X_te[:, 0], X_te[:, 1])), shape=shape)
    return train, test


def test_rmse(est, test):
    coo = test.tocoo()
    pred = est._clip(predict_pairs(est._factor_model(), coo.row, coo.col, est.mean_))
    return float(np.sqrt(np.mean((pred - coo.data) ** 2)))


def trace(name, cls, train, test):
    """Per round: each client's validation report and the test RMSE (the record's units)."""
    import sklearn_fedmf.engine._fit as fit_module

    n = train.shape[0]
    reports, tests, coins = [], [], []

    def callback(k, info):
        seen = info["validation_reports"]
        sse = np.zeros(n)
        cnt = np.zeros(n)
        for c, (s, m) in seen.items():
            sse[c], cnt[c] = s, m
        reports.append((sse, cnt))
        tests.append(info["record"]["eval_rmse"])
        coins.append(bool(info["record"].get("coin", True)))

    old = fit_module.GROUP_MIN_CLIENTS
    fit_module.GROUP_MIN_CLIENTS = 10**9  # (per-client reports)
    try:
        est = cls(n_clients=n, clients_per_round=0.1, random_state=0, callback=callback,
                  n_iter_no_change=10**6, solver_params={"validation_panel": None})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tic = time.perf_counter()
            est.fit(train, clients=np.arange(n), eval_set=test)
    finally:
        fit_module.GROUP_MIN_CLIENTS = old
    scale = getattr(est, "rating_scale_", 1.0)
    sse = np.array([r[0] for r in reports])
    cnt = np.array([r[1] for r in reports])
    # (RFRecF scores only its averaging rounds; every default scores every round)
    rfrecf = (est.solver_params or {}).get("variant") == "rfrecf"
    scored = np.array(coins) if rfrecf else np.ones(len(coins), bool)
    print(f"  {name}: {len(reports)} rounds, {time.perf_counter() - tic:.0f} s, "
          f"scale {scale:.4g}", flush=True)
    return sse, cnt, np.array(tests) * scale, scored


def stopping(scores, scored, patience=PATIENCE):
    """The best round (1-based) early stopping keeps for validation ``scores`` per round."""
    best, best_round, first, waited = None, None, None, 0
    for k, (s, ok) in enumerate(zip(scores, scored)):
        if not ok:
            continue
        if best is None:
            first = k
        if best is None or s < best:
            best, best_round, waited = s, k, 0
            continue
        waited += 1
        if waited >= patience and best_round != first:
            break
    return best_round


def panel_blocks(n, m, size, rng):
    return rng.permutation(n)[:size]


def replay(path, draws, seed=0):
    data = np.load(path, allow_pickle=True)
    keys = sorted({k.rsplit("|", 1)[0] for k in data.files})
    rng = np.random.default_rng(seed)
    print("| set / estimator | clients | m | every client: round | best test round | rule | "
          "panel (mean clients) | same round % | mean abs round diff | test diff % mean | "
          "p90 | max |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in keys:
        sse, cnt = data[key + "|sse"], data[key + "|cnt"]
        tests, scored = data[key + "|test"], data[key + "|scored"]
        n = sse.shape[1]
        m = max(1, int(np.ceil(0.1 * n)))
        full = np.sqrt(sse.sum(1) / cnt.sum(1))
        k0 = stopping(full, scored)
        for rule, size_of in RULES.items():
            rounds, diffs, sizes = [], [], []
            for _ in range(draws):
                order = rng.permutation(n)
                size = min(n, size_of(n, m, sse[0][order], cnt[0][order]))
                panel = order[:size]
                scores = np.sqrt(sse[:, panel].sum(1) / np.maximum(cnt[:, panel].sum(1), 1))
                k = stopping(scores, scored)
                rounds.append(k)
                diffs.append(100 * (tests[k] - tests[k0]) / tests[k0])
                sizes.append(size)
            rounds, diffs = np.array(rounds), np.array(diffs)
            best = int(np.argmin(tests))
            print(f"| {key} | {n} | {m} | {k0 + 1} | {best + 1} "
                  f"({100 * (tests[best] - tests[k0]) / tests[k0]:+.2f} %) | {rule} | "
                  f"{np.mean(sizes):.0f} | {100 * np.mean(rounds == k0):.0f} | "
                  f"{np.mean(np.abs(rounds - k0)):.1f} | {diffs.mean():+.3f} | "
                  f"{np.quantile(diffs, 0.9):+.3f} | {diffs.max():+.3f} |", flush=True)


def _grow(target):
    """The package's ``"auto"`` panel with relative standard error ``target``, replayed on
    the first evaluation's reports (``sse``, ``cnt`` in the panel's order): blocks of ``m``
    added until :func:`~sklearn_fedmf.engine._panel.panel_enough`."""
    from sklearn_fedmf.engine._panel import panel_enough

    def size_of(n, m, sse, cnt):
        parts, done = [], 0
        while done < n:
            end = min(done + m, n)
            parts.append([sse[done:end].sum(), cnt[done:end].sum()])
            done = end
            if panel_enough(parts, target):
                break
        return done
    return size_of


RULES = {
    "1 round (m)": lambda n, m, s, c: m,
    "2 rounds": lambda n, m, s, c: 2 * m,
    "4 rounds": lambda n, m, s, c: 4 * m,
    "half": lambda n, m, s, c: (n + 1) // 2,
    **{f"SE {t:g}": _grow(t) for t in (0.02, 0.05)},
}


def fits(sets, only, floor=True):
    print("| set | estimator | every client: best round, test RMSE, kept | panel: clients, "
          "best round, test RMSE, kept | fit s every / panel |")
    print("|---|---|---|---|---|")
    if not floor:  # (the kept round's factors themselves: no fallback to the biases)
        for cls in MODELS.values():
            cls._floor_class = None
    for name, spec in sets:
        train, test = matrices(spec)
        n = train.shape[0]
        for label, cls in MODELS.items():
            if only and label not in only:
                continue
            out = []
            for panel in (None, "auto"):
                est = cls(n_clients=n, clients_per_round=0.1, random_state=0,
                          solver_params={"validation_panel": panel})
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tic = time.perf_counter()
                    est.fit(train, clients=np.arange(n))
                    seconds = time.perf_counter() - tic
                clients = est.history_[-1].get("validation_clients", n)
                out.append((est.best_iteration_, test_rmse(est, test), est.factors_used_,
                            seconds, clients))
            (r0, t0, u0, s0, _), (r1, t1, u1, s1, c1) = out
            print(f"| {name} | {label} | {r0}, {t0:.4f}, {u0} | {c1}, {r1}, {t1:.4f}, {u1} | "
                  f"{s0:.0f} / {s1:.0f} |", flush=True)


def sets_of(args):
    sets = {"small": [("ml-latest-small", "small")],
            "1m-shape": [("ML-1M shape", "1m-shape")]}.get(args.data, [])
    for spec in args.ratings:
        sets.append((spec.split(":", 1)[0], spec))
    return sets


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--replay", metavar="NPZ")
    parser.add_argument("--fits", action="store_true")
    parser.add_argument("--data", choices=["small", "1m-shape"],
                        help="the embedded ml-latest-small, or make_ratings(6040, 3706, 1M)")
    parser.add_argument("--ratings", action="append", default=[], metavar="NAME:PATH")
    parser.add_argument("--out", default="traces.npz")
    parser.add_argument("--only", default=None, help="estimators, comma separated")
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--no-floor", action="store_true",
                        help="--fits without the biases floor: the kept round's factors")
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else None
    if args.replay:
        replay(args.replay, args.draws)
        return
    if args.fits:
        fits(sets_of(args), only, floor=not args.no_floor)
        return
    out = dict(np.load(args.out)) if os.path.exists(args.out) else {}
    for name, spec in sets_of(args):
        train, test = matrices(spec)
        print(f"{name}: {train.shape[0]} users x {train.shape[1]} items, {train.nnz} ratings",
              flush=True)
        for label, cls in MODELS.items():
            if only and label not in only:
                continue
            sse, cnt, tests, scored = trace(label, cls, train, test)
            key = f"{name}/{label}"
            out.update({key + "|sse": sse, key + "|cnt": cnt, key + "|test": tests,
                        key + "|scored": scored})
            np.savez(args.out, **out)


if __name__ == "__main__":
    main()
