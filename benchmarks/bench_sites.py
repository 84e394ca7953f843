"""Every rating estimator with its defaults and FedBlend beside Surprise, on real rating sets.

    python benchmarks/bench_sites.py --ratings filmtrust:/path/ratings.txt \
        --ratings ml-100k:/path/u.data --data small
    python benchmarks/bench_sites.py --quick          # smoke run on a fifth of latest-small

Protocol (issue 37): an 80/20 random split of each set's ratings (``train_test_split`` on the
rating indices, seed 0 or ``--seed``; the split of ``bench_blend.py``), test pairs whose user
or item is not in the training part dropped, or the set's own test ratings when it ships them
(``NAME:TRAIN;TEST``, for example a random test drawn apart from self-selected training
ratings). Every rating estimator (``FedBaseline``, ``FedMCADMM``, ``FedMAvg``, ``FedMGS``,
``RFRec``, ``FedBlend``) with all its defaults (``random_state=0`` only) through
``RatingRegressor``; Surprise's ``BaselineOnly()`` and ``SVD(random_state=0)`` (their
defaults; rating scale the training ratings' range) on the same training ratings. Columns:
test RMSE, fit seconds (one untimed warm-up fit first, so no row pays the compilation; the
machine may be shared, so compare seconds within a set), ``kept`` = ``factors_used_`` (``-``
where the model has none), ``z`` = the floor's validation gain over the biases in standard
errors, and the RMSE over ``BaselineOnly``'s. After each set: the best row, whether FedBlend
is best or within 0.002 of the best, every federated row that loses to ``BaselineOnly``,
the blend's weights and its members' validation RMSEs.

``--ratings NAME:PATH[;TEST]`` reads ``user item rating`` lines (whitespace, comma or
semicolon separated; lines that do not parse are skipped; MovieLens ``u.data`` user ids
below 1 dropped) from local files the repository does not ship: real data for measuring
only. ``--data small`` is the embedded ml-latest-small. scikit-surprise is a benchmark-only
extra (``pip install scikit-surprise``); without it its rows are left out. ``--only
FedBlend,BaselineOnly`` fits only the rows named (ours or Surprise's); the summary lines that
need a missing row are left out.
"""

import argparse
import os
import time
import warnings

import numpy as np

from sklearn_fedmf import FedBaseline, FedBlend, FedMAvg, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf.datasets import load_movielens

MODELS = {"FedBaseline": FedBaseline, "FedMCADMM": FedMCADMM, "FedMAvg": FedMAvg,
          "FedMGS": FedMGS, "RFRec": RFRec, "FedBlend": FedBlend}
TIE = 0.002  # "within" tolerance of the targets


def read_triples(path, movielens_ids=False):
    """``(users, items, ratings)`` (ids as strings) of a ``user item rating`` file."""
    rows = []
    with open(path, encoding="latin-1") as lines:
        for line in lines:
            fields = line.replace(",", " ").replace(";", " ").split()
            if len(fields) < 3:
                continue
            try:
                rating = float(fields[2])
            except ValueError:
                continue
            if movielens_ids and int(fields[0]) < 1:  # (u.data's 3 lines of a user 0)
                continue
            rows.append((fields[0], fields[1], rating))
    users, items, ratings = (np.array(column) for column in zip(*rows))
    for ids in (users, items):  # numeric ids keep their numeric order (the users' clients)
        try:
            ids_numeric = ids.astype(np.int64)
        except ValueError:
            continue
        if ids is users:
            users = ids_numeric
        else:
            items = ids_numeric
    return users, items, ratings.astype(float)


def index(train, test=None):
    """Integer ids over the training part (test triples of unseen users/items dropped)."""
    u_ids, users = np.unique(train[0], return_inverse=True)
    i_ids, items = np.unique(train[1], return_inverse=True)
    tr = (np.column_stack([users, items]), train[2])
    if test is None:
        return tr, None
    u_pos, i_pos = np.searchsorted(u_ids, test[0]), np.searchsorted(i_ids, test[1])
    u_pos, i_pos = np.minimum(u_pos, len(u_ids) - 1), np.minimum(i_pos, len(i_ids) - 1)
    known = (u_ids[u_pos] == test[0]) & (i_ids[i_pos] == test[1])
    return tr, (np.column_stack([u_pos[known], i_pos[known]]), test[2][known])


def load(spec, seed=0):
    """``(X_train, y_train, X_test, y_test, own_test)`` of a set ``NAME:PATH[;TEST]`` or
    ``small``."""
    if spec == "small":
        X = load_movielens().X.tocoo()
        triples = (X.row, X.col, X.data)
        own = None
    else:
        _, paths = spec.split(":", 1)
        paths = paths.split(";")
        triples = read_triples(paths[0], movielens_ids=paths[0].endswith("u.data"))
        own = read_triples(paths[1]) if len(paths) > 1 else None
    if own is not None:
        (X_tr, y_tr), (X_te, y_te) = index(triples, own)
        return X_tr, y_tr, X_te, y_te, True
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(triples[2]))
    train, test = train_test_split(idx, test_size=0.2, random_state=seed)
    (X_tr, y_tr), (X_te, y_te) = index(tuple(a[train] for a in triples),
                                       tuple(a[test] for a in triples))
    return X_tr, y_tr, X_te, y_te, False


def rmse(pred, y):
    return float(np.sqrt(np.mean((pred - y) ** 2)))


def fit_ours(cls, data):
    X_tr, y_tr, X_te, y_te = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tic = time.perf_counter()
        reg = RatingRegressor(cls(random_state=0)).fit(X_tr, y_tr)
        seconds = time.perf_counter() - tic
    return rmse(reg.predict(X_te), y_te), seconds, reg.estimator_


def fit_surprise(name, data):
    import pandas as pd
    from surprise import SVD, BaselineOnly, Dataset, Reader

    X_tr, y_tr, X_te, y_te = data
    frame = pd.DataFrame({"u": X_tr[:, 0], "i": X_tr[:, 1], "r": y_tr})
    reader = Reader(rating_scale=(float(y_tr.min()), float(y_tr.max())))
    trainset = Dataset.load_from_df(frame, reader).build_full_trainset()
    algo = BaselineOnly(verbose=False) if name == "BaselineOnly" else SVD(random_state=0)
    tic = time.perf_counter()
    algo.fit(trainset)
    seconds = time.perf_counter() - tic
    pred = np.array([p.est for p in algo.test(list(zip(X_te[:, 0], X_te[:, 1], y_te)))])
    return rmse(pred, y_te), seconds


def describe(name, X_tr, y_tr, X_te, own, seed=0):
    n_u, n_i = X_tr[:, 0].max() + 1, X_tr[:, 1].max() + 1
    scale = np.unique(y_tr)
    scale = (f"{scale.size} levels {scale.min():g}..{scale.max():g}" if scale.size <= 21
             else f"continuous {scale.min():g}..{scale.max():g}")
    print(f"\n## {name}: {n_u} users x {n_i} items, {len(y_tr)} training ratings "
          f"(density {len(y_tr) / (n_u * n_i):.2%}), {len(X_te)} test ratings "
          f"({'its own test' if own else f'80/20 random split, seed {seed}'}), {scale}")


def run_set(name, spec, quick, seed=0, only=None):
    X_tr, y_tr, X_te, y_te, own = load(spec, seed)
    if quick:
        X_tr, y_tr, X_te, y_te = X_tr[::5], y_tr[::5], X_te[::5], y_te[::5]
    data = (X_tr, y_tr, X_te, y_te)
    describe(name, X_tr, y_tr, X_te, own, seed)
    rows = {}
    try:
        for peer in ("BaselineOnly", "SVD"):
            if only is not None and peer not in only:
                continue
            rows[peer] = (*fit_surprise(peer, data), "-", "-")
    except ImportError:
        print("(scikit-surprise not installed: its rows are left out)")
    blend = None
    for label, cls in MODELS.items():
        if only is not None and label not in only:
            continue
        err, seconds, fitted = fit_ours(cls, data)
        used = getattr(fitted, "factors_used_", None)
        evidence = getattr(fitted, "_floor_evidence", None)
        z = "-" if evidence is None else f"{evidence[0] / max(evidence[1], 1e-300):.2f}"
        used = None if cls is FedBaseline else used  # (the biases model: nothing to keep)
        rows[label] = (err, seconds, "-" if used is None else str(bool(used)), z)
        if label == "FedBlend":
            blend = fitted
        print(f"    ({label} {err:.4f} {seconds:.1f} s)", flush=True)
    base = rows.get("BaselineOnly", (None,))[0]
    best = min(rows, key=lambda k: rows[k][0])
    print("\n| model | test RMSE | fit s | kept | z | - BaselineOnly |\n|---|---|---|---|---|---|")
    for label, (err, seconds, used, z) in rows.items():
        diff = "-" if base is None else f"{err - base:+.4f}"
        mark = "**" if label == best else ""
        print(f"| {mark}{label}{mark} | {mark}{err:.4f}{mark} | {seconds:.1f} | {used} | {z} "
              f"| {diff} |")
    if blend is not None:
        _blend_lines(blend)
    if only is not None and not set(MODELS).issubset(rows):
        return
    b = rows["FedBlend"][0]
    ours = {k: v for k, v in rows.items() if k in MODELS}
    members_rmse = [v[0] for k, v in ours.items() if k != "FedBlend"]
    slowest = max(v[1] for k, v in ours.items() if k != "FedBlend")
    best_ours = min(ours, key=lambda k: ours[k][0])
    print(f"\nbest: {best} {rows[best][0]:.4f}; best federated: {best_ours} "
          f"{rows[best_ours][0]:.4f}; FedBlend {b:.4f} "
          + ("is the best" if best == "FedBlend" else
             f"is {'within' if b - rows[best][0] <= TIE else 'NOT within'} {TIE} of the best "
             f"({b - rows[best][0]:+.4f})")
          + f"; FedBlend - best member: {b - min(members_rmse):+.4f}")
    if base is not None:
        losers = [f"{k} {v[0]:.5f} (+{v[0] - base:.5f})" for k, v in ours.items()
                  if v[0] > base]
        print(f"lose to BaselineOnly ({base:.4f}): " + (", ".join(losers) or "none"))
        print(f"FedBlend - SVD: {b - rows['SVD'][0]:+.4f}; SVD - BaselineOnly: "
              f"{rows['SVD'][0] - base:+.4f}")
    biases = rows["FedBaseline"][0]
    print("factor part (kept: RMSE - FedBaseline's): " + ", ".join(
        f"{k} {v[2]}: {v[0] - biases:+.4f}" for k, v in ours.items() if v[2] in ("True", "False")))
    print(f"FedBlend fit / slowest member: {rows['FedBlend'][1] / slowest:.2f}")


def _blend_lines(blend):
    weights = ", ".join(f"{k} {w:+.3f}" for k, w in zip(blend.named_estimators_,
                                                       blend.weights_))
    print(f"\nblend weights (average activity): {weights}; intercept {blend.intercept_:+.4f}; "
          f"ridge strength {getattr(blend, 'final_alpha_', blend.final_alpha):.3g}")
    members = ", ".join(
        f"{k} {v:.4f}" + ("" if getattr(blend.named_estimators_[k], "factors_used_", None)
                          is None else
                          f" (kept {bool(blend.named_estimators_[k].factors_used_)})")
        for k, v in blend.member_validation_rmse_.items())
    print(f"blend validation RMSE {blend.validation_rmse_:.4f}; members: {members}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="", help="'small': the embedded ml-latest-small")
    parser.add_argument("--ratings", action="append", default=[],
                        help="NAME:PATH[;TEST] of a local rating file (never committed)")
    parser.add_argument("--seed", type=int, default=0, help="the 80/20 split's seed")
    parser.add_argument("--only", default=None,
                        help="comma-separated rows to fit (e.g. FedBlend); default: all")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a fifth of ml-latest-small's ratings")
    args = parser.parse_args()
    only = None if args.only is None else set(args.only.split(","))
    unknown = (only or set()) - set(MODELS) - {"BaselineOnly", "SVD"}
    if unknown:
        parser.error(f"--only: unknown rows {sorted(unknown)}")
    specs = [(s.split(":", 1)[0], s) for s in args.ratings]
    specs += [("ml-latest-small", n) for n in args.data.split(",") if n == "small"]
    if args.quick:
        specs = [("ml-latest-small", "small")]
    print(f"load average {os.getloadavg()[0]:.1f}; one warm-up fit first")
    warm = load("small")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        RatingRegressor(FedBlend(random_state=0)).fit(warm[0][:20000], warm[1][:20000])
    for name, spec in specs:
        run_set(name, spec, args.quick, args.seed, only)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
