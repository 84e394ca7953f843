"""Privacy budgets of Felb and RFRec: what the accountants report, and what a budget buys.

Usage::

    python benchmarks/bench_privacy.py           # both tables (a few minutes)
    python benchmarks/bench_privacy.py --quick   # smoke run: small data, 10 and 100 rounds

Table 1, **reported epsilon at the same noise**: every client uploads every round with the
noise of one ``(0.5, 1e-5)`` release (Felb: Gaussian, the paper's classical sigma 9.69 per unit
of sensitivity; RFRec: Laplace of per-entry epsilon 0.5, ``LocalDP(noise=4 clip)``). The
figures are ``privacy_spent_`` of real fits after T rounds: basic composition
(``epsilon_basic``) and the PLD accountant (``epsilon``); the RDP column is what the same fit
reports with ``LocalDP(accountant="rdp")`` (``epsilon_spent(..., "rdp")`` on the fit's
release counts, the function the estimator calls); all at ``delta = 1e-5``. They do not
depend on the data, so small data sets serve.

Table 2, **accuracy at a fixed total budget** ``(epsilon, 1e-5)`` for the whole fit:

- *old*: what the library offered before: split the budget evenly over the T releases by basic
  composition and calibrate each release by the classical Gaussian bound (Felb:
  ``LocalDP(epsilon=epsilon / T, delta=delta / T, calibration="classical")``; RFRec:
  ``LocalDP(noise=2 clip T / epsilon)``);
- *new*: ``LocalDP(target_epsilon=epsilon, target_delta=1e-5)``: the PLD accountant finds the
  noise.

Felb: test F1 (fold-in of held-out rows of planted Boolean tiles, against their rows); 100
clients of 32 rows, 20 synchronizations of 5 local steps, Gaussian noise, ``clip = 1.5``.
RFRec: test RMSE of the federated model on MovieLens latest-small (80/20 split of every
user's ratings; the authors' code settings; one client per user; ``clip = 0.2``, the
paper's delta).
"""

import argparse
import time
import warnings

import numpy as np
import scipy.sparse as sp

from sklearn_fedmf import RFRec
from sklearn_fedmf.binary import Felb
from sklearn_fedmf.datasets import load_movielens, make_binary_tiles
from sklearn_fedmf.engine._fit import merge_params
from sklearn_fedmf.model_selection import train_test_split_ratings
from sklearn_fedmf.privacy import LocalDP, epsilon_spent, gaussian_sigma

DELTA = 1e-5
CODE = dict(learning_rate=0.1, reg_consensus=20.0, biased=False, n_clients=None,
            solver_params={"optimizer": "adam", "link": "sigmoid"})  # (one client per user)
RFREC_CLIP = 0.2  # the paper's clipping threshold delta (Fig. 4)
FELB_CLIP = 1.5  # the Felb spec's theta


def tiles(quick, seed=0):
    n, m, k = (400, 60, 3) if quick else (4000, 100, 4)
    data = make_binary_tiles(n, m, k, noise=0.0, tile_density=0.9, overlap=False,
                             random_state=seed)
    X = sp.csr_matrix(data.X)
    return X[: n * 4 // 5], X[n * 4 // 5:]


def ratings(quick, seed=0):
    X = load_movielens().X
    if quick:  # the 150 most active users and the items they rated
        X = X[np.argsort(-np.diff(X.indptr))[:150]]
        X = X[:, np.flatnonzero(X.getnnz(axis=0))].tocsr()
    return train_test_split_ratings(X, 0.2, random_state=seed)


def felb(T, quick, noisy=True, **dp):
    """Felb with Gaussian noise on uploads clipped at FELB_CLIP (``dp``: LocalDP's fields)."""
    privacy = LocalDP("gaussian", clip=FELB_CLIP, **dp) if noisy else None
    return Felb(n_components=3 if quick else 4, n_clients=10 if quick else 100, max_iter=T,
                sync_every=5, privacy=privacy, random_state=0)


def rfrec(T, eval_every=0, **dp):
    """RFRec with Laplace noise on uploads clipped at RFREC_CLIP (``dp``: LocalDP's fields)."""
    return RFRec(**merge_params(CODE, dict(
        n_components=10, max_iter=T, random_state=0, privacy=LocalDP(clip=RFREC_CLIP, **dp),
        solver_params={"eval_every": eval_every})))


def fit(est, X, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate fits at tiny budgets warn; we report them
        return est.fit(X, **kw)


def table_spent(quick):
    rounds = (10, 100) if quick else (10, 100, 1000)
    A, _ = tiles(True)
    R, _ = ratings(True)  # the figures do not depend on the data: small sets suffice
    R = R[:30, np.flatnonzero(R[:30].getnnz(axis=0))]
    z_felb = gaussian_sigma(0.5, DELTA)  # 9.69: the paper's calibration of one release
    print(f"\nTable 1: epsilon reported at delta = {DELTA:g} when every client uploads every "
          "round with the noise of one (0.5, 1e-5) release")
    print(f"{'estimator (noise)':34s} {'T':>5s} {'basic':>9s} {'RDP':>9s} {'PLD':>9s} "
          f"{'basic/PLD':>9s} {'s/fit':>6s}")
    for name, make, X in (
        (f"Felb (Gaussian, z = {z_felb:.2f})",
         lambda T: felb(T, True, epsilon=0.5, delta=DELTA, calibration="classical"), A),
        ("RFRec (Laplace, eps 0.5 per entry)",
         lambda T: rfrec(T, noise=2 * RFREC_CLIP / 0.5), R),
    ):
        for T in rounds:
            tic = time.perf_counter()
            est = fit(make(T), X)
            seconds = time.perf_counter() - tic
            spent = est.privacy_spent_
            assert (spent["n_releases"] == T).all()  # full participation: T releases each
            mechanism = "gaussian" if isinstance(est, Felb) else "laplace"
            z = est.noise_scale_ / (FELB_CLIP if isinstance(est, Felb) else 2 * RFREC_CLIP)
            basic, pld_eps = spent["epsilon_basic"].max(), spent["epsilon"].max()
            rdp_eps = epsilon_spent(mechanism, z, T, DELTA, "rdp")
            print(f"{name:34s} {T:5d} {basic:9.2f} {rdp_eps:9.2f} {pld_eps:9.2f} "
                  f"{basic / pld_eps:9.1f} {seconds:6.1f}")


def table_budget(quick):
    budgets = (1.0, 10.0) if quick else (1.0, 5.0, 10.0)
    T_felb, T_rfrec = (10, 5) if quick else (20, 100)
    A_train, A_test = tiles(quick)
    R_train, R_test = ratings(quick)
    print(f"\nTable 2: accuracy at a total budget (epsilon, {DELTA:g}) for the whole fit; "
          f"Felb {T_felb} rounds, RFRec {T_rfrec} rounds")
    print(f"{'estimator':10s} {'epsilon':>8s} {'calibration':>12s} {'noise':>10s} "
          f"{'spent (PLD)':>11s} {'score':>12s}")

    def f1(est):
        return f"F1 {est.score(A_test):.4f}"

    def rmse(est):
        return f"RMSE {est.history_[-1]['eval_rmse']:.4f}"

    ref = fit(felb(T_felb, quick, noisy=False), A_train)
    print(f"{'Felb':10s} {'inf':>8s} {'no noise':>12s} {0:10.3g} {'-':>11s} {f1(ref):>12s}")
    for eps in budgets:
        for label, params in (
            ("old", dict(epsilon=eps / T_felb, delta=DELTA / T_felb, calibration="classical")),
            ("new", dict(target_epsilon=eps, target_delta=DELTA)),
        ):
            est = fit(felb(T_felb, quick, **params), A_train)
            print(f"{'Felb':10s} {eps:8g} {label:>12s} {est.noise_scale_:10.3g} "
                  f"{est.privacy_spent_['epsilon'].max():11.3f} {f1(est):>12s}")
    ref = fit(RFRec(n_components=10, max_iter=T_rfrec, random_state=0, **CODE), R_train,
              eval_set=R_test)
    print(f"{'RFRec':10s} {'inf':>8s} {'no noise':>12s} {0:10.3g} {'-':>11s} {rmse(ref):>12s}")
    clipped = fit(rfrec(T_rfrec, eval_every=T_rfrec, noise=0.0), R_train, eval_set=R_test)
    print(f"{'RFRec':10s} {'inf':>8s} {'clip only':>12s} {0:10.3g} {'-':>11s} "
          f"{rmse(clipped):>12s}")
    for eps in budgets:
        for label, params in (
            ("old", dict(noise=2 * RFREC_CLIP * T_rfrec / eps)),
            ("new", dict(target_epsilon=eps, target_delta=DELTA)),
        ):
            est = rfrec(T_rfrec, eval_every=T_rfrec, **params)
            try:
                fit(est, R_train, eval_set=R_test)
            except FloatingPointError:  # the noise blew the consensus term up: no model
                noise = params.get("noise", float("nan"))  # the fit kept no attributes
                print(f"{'RFRec':10s} {eps:8g} {label:>12s} {noise:10.3g} "
                      f"{'-':>11s} {'diverged':>12s}")
                continue
            print(f"{'RFRec':10s} {eps:8g} {label:>12s} {est.noise_scale_:10.3g} "
                  f"{est.privacy_spent_['epsilon'].max():11.3f} {rmse(est):>12s}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run on small sizes")
    parser.add_argument("--table", choices=("spent", "budget", "all"), default="all")
    args = parser.parse_args()
    if args.table in ("spent", "all"):
        table_spent(args.quick)
    if args.table in ("budget", "all"):
        table_budget(args.quick)


if __name__ == "__main__":
    main()
