"""Secure aggregation's cost: seconds and bytes per phase of one secure sum.

Usage::

    python benchmarks/bench_secure.py           # n = 10 and 100 clients, vectors of 10,000
    python benchmarks/bench_secure.py --quick   # smoke run: n = 5, 20, vectors of 1,000
    python benchmarks/bench_secure.py --estimators            # fits, plain against secure
    python benchmarks/bench_secure.py --estimators --ml-1m --repeats 3  # the issue's target
    python benchmarks/bench_secure.py --estimators --ml-1m --rounds default  # whole fits
    python benchmarks/bench_secure.py --deployment   # what each party pays per round
    python benchmarks/bench_secure.py --deployment --ml-1m --only FedMGS  # the issue's shape
    python benchmarks/bench_secure.py --deployment --no-early-stopping  # without the floor

Each client uploads a float vector of length ``d`` (standard normal); the default encoding
(``clip = 2^16``, ``scale_bits = 24``, 64-bit ring). Every phase of the protocol runs in this
process, one client after another (:func:`sklearn_fedmf.secure.secure_sum`), so "client s" is
the *mean* seconds of one client's step (in a deployment the clients run at once) and
"server s" the server's. Bytes are per client: what one client uploads and downloads in the
phase (at most, over clients). A second row per ``n`` drops 10% of the clients after the
key-sharing phase, which the server recovers through their shares (the unmasking phase then
recomputes their pairwise masks with every survivor). Each ``n`` runs SecAgg (every pair of
clients masks; "graph" ``all``) and SecAgg+ with ``2 ceil(log2 n)`` neighbours per client.
The sum's max error against the plain sum is printed beside the encoding's bound.

``--estimators``: one row per estimator that supports ``secure_aggregation=True``, each
fitted plain and secure on ``make_site_ratings("netflix-1m", n_ratings=...)`` (the
Netflix-like preset scaled down; 20,000 ratings by default) with one client per user and 10%
of the clients per round (``--only`` picks estimators): fit seconds plain and secure, the
mean bytes per round (up and down, every phase) and the max relative difference of the
fitted factors. The issue's target is a secure fit
at most 3x the plain one at the full size.

``--ml-1m``: the issue's target shape instead, ``make_ratings(6040, 3706, 1_000_000)`` (the
MovieLens-1M shape; 604 clients per round); ``--repeats N`` fits each estimator N times plain
and N times secure and prints the median seconds (3 by default with ``--ml-1m``).
``outside s`` is a fit's time outside its rounds (plain / secure: data checks, the start,
which for the secure fit includes the initial exchange over every client of FedMC-ADMM,
FedMGS and FedBaseline, and the final collection), ``round s`` its mean round
(``history_``'s seconds, secure exchanges included) and the second ``ratio`` theirs: what
the ratio tends to over many rounds. ``kB/client`` is the most one client
sends and receives in a round's secure phases (keys, shares, masked vector, unmasking;
``history_``'s ``bytes_secure_client``), the mean over rounds.

``--deployment``: what a deployment pays per round (issue 39), from ``history_``'s
``secure`` records (:mod:`sklearn_fedmf.secure._costs`) of one secure fit per estimator on
``make_ratings(--users, --items, --ratings)`` (2,000 x 1,000 x 100,000 by default; with
``--ml-1m`` 6,040 x 3,706 x 1,000,000), one client per user, ``--per-round`` clients a round
(200; 10% with ``--ml-1m``), ``--rounds`` rounds (5; ``default``: each estimator's
max_iter and early stopping), each estimator's defaults otherwise.
Per round (median over the rounds; ``max`` columns: the largest over them): ``server s``,
the server's CPU seconds in its phase functions; ``client ms`` median / max, each client's
CPU milliseconds over its phases and exchanges of the round (timed in its own task);
``kB sent`` median / max per client; ``start``: the same for the fit's initial exchange over
every client (FedMGS, FedMC-ADMM, FedBaseline), or ``-``. Then the simulation: ``plain s``
and ``secure s``, the two fits' wall seconds, and ``floor s``, the protocol's floor of every
exchange in the secure fit's ``history_`` (its X25519 agreements times the seconds of one
agreement, plus its keystream bytes over the AES-256-CTR throughput, both measured at the
start of the run with the module's own primitives, called as the protocol calls them: a
loaded private key agreeing with a key list of 24 peers, HKDF included; the keystream of
one 8 MB buffer), and ``ratio``, ``secure / (floor + plain)`` (the issue's target: at most
1.3); then the same in CPU seconds of the process (``time.process_time``; the primitives
by the same clock), which a loaded machine does not inflate, with ``(s-p)/f``, ``(secure -
plain) / floor``. ``floor+exp`` adds to the CPU floor each expansion's fixed cost (a mask
needs its own AES key and CTR context whatever its length: ``add_prg`` of a 2-word vector,
measured; an agreement's seconds include its own per-call objects the same way), and its
``(s-p)/f``: the floor on the buffers the protocol expands (most of a validated fit's masks
are short: the biases floor's and the 2-word validation reports), where the 8 MB
throughput alone is a best case no expansion of a short mask reaches. ``--in-situ`` also
times every agreement and expansion where the protocol calls them during the secure fit
(CPU seconds and counts; the timing adds ~2 us a call) and prints the fit's CPU seconds
outside them: what no measurement of the primitives before the fit can misjudge.
The biases floor of a validated fit (a nested FedBaseline fit, under secure aggregation
with the fit's ``clients_per_round``) is not in the outer fit's ``history_``: the bench
records its fits and adds their exchanges (start and rounds) to ``floor s``, and the
validation's one-off secure sums (the paired evidence; a sampled floor's start, summed in
sums of a round's clients) at the floor of an exchange without dropouts (``2 n k``
agreements, ``n (k + 2) d`` keystream words: ``secure_sum`` does not record costs).
``floor ex`` is the largest of the nested fits' exchanges after their start and of those
sums, in clients, and ``x plain`` the secure fit's wall time over the plain one's. Below
each row, the secure fit's exchanges by kind (its own, its floors', the one-off sums): how
many, clients per exchange in the simulation and in a deployment (where every client
sends its validation report, not a group's; a validation panel's blocks: their
clients), agreements and floor CPU seconds (a
deployment's), and the simulation's wall seconds; then the largest exchange after the
fit's start. ``--no-early-stopping``
fits without validation (no report exchanges, no floor).
"""

import argparse
import math
import time
import warnings

import numpy as np

from sklearn_fedmf import FedBaseline, FedMAvg, FedMCADMM, FedMGS, RFRec
from sklearn_fedmf.datasets import make_ratings, make_site_ratings
from sklearn_fedmf.secure import FixedPointEncoding, secure_sum
from sklearn_fedmf.secure._protocol import PHASES

# (estimator, parameters, the plain fit's extra parameters, fitted factor)
ESTIMATORS = {
    "FedMCADMM": (FedMCADMM, dict(local_iter=10), {}, "components_"),
    "FedMAvg": (FedMAvg, {}, {}, "components_"),
    "FedMGS": (FedMGS, {}, {}, "components_"),
    # secure aggregation sums dense uploads: the plain fit with the same dense uploads
    "RFRec": (RFRec, {}, {"solver_params": {"simulate_uploads": True}}, "components_"),
    "FedBaseline": (FedBaseline, {}, {}, "item_bias_"),
}


def fit_seconds(est, X, clients):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, clients=clients)
    return time.perf_counter() - start


def bench_estimators(X, max_iter, repeats, only=None):
    clients = np.arange(X.shape[0])  # one client per user
    rounds = "default rounds and early stopping" if max_iter is None else f"{max_iter} rounds"
    print(f"{X.shape[0]:,} users (one client each) x {X.shape[1]:,} items, {X.nnz:,} ratings, "
          f"10% of the clients per round, {rounds}, median of {repeats} fits")
    header = (f"{'estimator':<12} {'plain s':>8} {'secure s':>9} {'ratio':>6} "
              f"{'outside s':>13} {'round s':>11} {'ratio':>6} "
              f"{'MB/round plain':>15} {'MB/round secure':>16} {'kB/client':>10} "
              f"{'max rel diff':>13}")
    print(header)
    print("-" * len(header))
    for name, (cls, params, plain_extra, attribute) in ESTIMATORS.items():
        if only is not None and name not in only:
            continue
        params = dict(params, n_clients=X.shape[0], clients_per_round=0.1, random_state=0)
        if max_iter is not None:  # (None: the estimator's default max_iter)
            params["max_iter"] = max_iter
        fit_seconds(cls(**dict(params, max_iter=1), **plain_extra), X, clients)  # (compiles)
        times, fitted = {"plain": [], "secure": []}, {}
        for _ in range(repeats):
            for kind in times:
                extra = plain_extra if kind == "plain" else {"secure_aggregation": True}
                fitted[kind] = cls(**params, **extra)
                times[kind].append(fit_seconds(fitted[kind], X, clients))
        plain, secure = fitted["plain"], fitted["secure"]
        t_plain, t_secure = (float(np.median(times[k])) for k in ("plain", "secure"))
        # a fit's mean round and its time outside the rounds (data checks, start with any
        # initial exchange, final collection), from the last fit of each kind
        rounds = {k: float(np.mean([r["seconds"] for r in e.history_])) for k, e in fitted.items()}
        outside = {k: times[k][-1] - rounds[k] * len(e.history_) for k, e in fitted.items()}
        mb = [np.mean([r["bytes_uploaded"] + r["bytes_downloaded"] for r in e.history_]) / 1e6
              for e in (plain, secure)]
        # the most one client sent and received in a round's secure phases
        per_client = np.mean([sum(r.get("bytes_secure_client", {}).values())
                              for r in secure.history_]) / 1e3
        a, b = getattr(plain, attribute), getattr(secure, attribute)
        diff = float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-300))
        if max_iter is None:  # rounds run (early stopping may end a fit before max_iter)
            print(f"{name}: {len(plain.history_)} rounds plain, {len(secure.history_)} secure")
        print(f"{name:<12} {t_plain:>8.2f} {t_secure:>9.2f} {t_secure / t_plain:>6.1f} "
              f"{outside['plain']:>6.1f}/{outside['secure']:<6.1f} "
              f"{rounds['plain']:>5.2f}/{rounds['secure']:<5.2f} "
              f"{rounds['secure'] / rounds['plain']:>6.1f} {mb[0]:>15.2f} {mb[1]:>16.2f} "
              f"{per_client:>10.1f} {diff:>13.1e}", flush=True)


def measure_primitives(clock, repeats=5, degree=24):
    """``(seconds per X25519 agreement, AES-256-CTR keystream bytes per second, seconds per
    expansion)``, medians by ``clock``, each the way the protocol calls it: agreements by
    :func:`~sklearn_fedmf.secure._crypto.agree` of a loaded private key with a key list of
    ``degree`` peers (HKDF included); the throughput of ``_keystream`` on an 8 MB buffer;
    and the fixed cost of one expansion (a fresh AES key and CTR context), ``add_prg`` of a
    2-word vector (which the protocol's validation reports are)."""
    from sklearn_fedmf.secure import _crypto
    from sklearn_fedmf.secure._crypto import MASK_LABEL, _keystream, add_prg, agree, public_key

    # (a checkout before load_private, e.g. a "before" run: agree loads the raw key itself)
    load_private = getattr(_crypto, "load_private", lambda key: key)

    rng = np.random.default_rng(0)
    peers = [public_key(rng.bytes(32)) for _ in range(200)]
    words = 1 << 20  # 8 MB of keystream
    out = np.empty(words + 2, dtype="<u8")
    short = np.zeros(2, dtype=np.uint64)
    seeds = [rng.bytes(32) for _ in range(2000)]
    per_agreement, throughput, per_expansion = [], [], []
    for _ in range(repeats):
        own = [load_private(rng.bytes(32)) for _ in range(0, len(peers), degree)]
        start = clock()
        for i, key in enumerate(own):
            agree(key, peers[i * degree:(i + 1) * degree], MASK_LABEL)
        per_agreement.append((clock() - start) / len(peers))
        start = clock()
        _keystream(rng.bytes(32), out, words)
        throughput.append(8 * words / (clock() - start))
        start = clock()
        for seed in seeds:
            add_prg(short, seed)
        per_expansion.append((clock() - start) / len(seeds))
    return (float(np.median(per_agreement)), float(np.median(throughput)),
            float(np.median(per_expansion)))


def _fit_timed(cls, params, X):
    """The fitted estimator, its wall seconds and its process CPU seconds."""
    est = cls(**params)
    cpu = time.process_time()
    wall = fit_seconds(est, X, np.arange(X.shape[0]))
    return est, wall, time.process_time() - cpu


def _recording_floors(floors):
    """Patch the validation's floor fit to append each nested floor to ``floors``; returns
    the original (to restore)."""
    from sklearn_fedmf.completion import _validation

    original = _validation._fit_floor

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        floors.append(out[0])
        return out

    _validation._fit_floor = recording
    return original


def _expansions(costs):
    """The keystream expansions of a record (a round's ``"secure"`` entry or one exchange):
    each exchange's keystream words over its vector's, one expansion per mask."""
    if "exchanges" in costs:
        return sum(_expansions(e) for e in costs["exchanges"])
    words = costs.get("vector_words", 0)
    return costs["keystream_words"] // words if words else 0


def floor_seconds(costs, agreement_s, keystream_bps, expansion_s=0.0):
    """:func:`~sklearn_fedmf.secure._costs.floor_seconds`, with each expansion's fixed cost
    ``expansion_s`` (the module docstring's ``floor+exp``)."""
    from sklearn_fedmf.secure._costs import floor_seconds as issue_floor

    return issue_floor(costs, agreement_s, keystream_bps) + expansion_s * _expansions(costs)


def _recording_sums(sums):
    """Patch the validation's one-off secure sums (:func:`sum_securely`: the floor's
    evidence, and a sampled floor's start) to append ``(clients, vector words, wall s)`` of
    each to ``sums``; returns the original (to restore)."""
    from sklearn_fedmf.completion import _validation

    original = _validation.sum_securely

    def recording(values, option, **kwargs):
        start = time.perf_counter()
        out = original(values, option, **kwargs)
        words = int(np.asarray(next(iter(values.values()))).size) if values else 0
        sums.append((len(values), words, time.perf_counter() - start))
        return out

    _validation.sum_securely = recording
    return original


def _sum_costs(n, words):
    """An exchange's floor without dropouts (:mod:`sklearn_fedmf.secure._costs`): each client
    agrees a channel key and a mask seed with each of its ``k`` neighbours (``2 n k``) and
    expands its self mask and ``k`` pairwise masks; the server expands every self mask
    (``n (k + 2) d`` keystream words)."""
    from sklearn_fedmf.secure import SecureAggregation

    k = SecureAggregation().degree(n)
    k = n - 1 if k is None or k >= n else k
    return {"agreements": 2 * n * k, "keystream_words": n * (k + 2) * words}


def exchange_table(name, secure, floors, sums, primitives, n_clients):
    """The secure fit's exchanges (its own, its nested biases floors', its one-off sums),
    grouped by kind: how many, clients per exchange (min-max; ``report``: the simulation's
    and, after the slash, a deployment's, where every client reports), agreements and the
    floor's CPU seconds of them (deployment: every client), and the simulation's wall
    seconds."""
    rows = {}  # kind -> [count, clients, agreements, floor cpu s, wall s, deployed clients]

    def add(kind, record, deployed=None):
        row = rows.setdefault(kind, [0, [], 0, 0.0, 0.0, []])
        costs = record if deployed is None else _sum_costs(deployed, record["vector_words"])
        row[0] += 1
        row[1].append(record["clients"])
        row[2] += costs["agreements"]
        row[3] += floor_seconds(costs, *primitives["cpu"])
        row[4] += record["wall_s"]
        row[5].append(deployed or record["clients"])

    def add_fit(prefix, estimator):
        for i, r in enumerate(estimator.history_):
            if i == 0 and "start" in r["secure"]:
                add(f"{prefix} start", r["secure"]["start"])
            for e in r["secure"]["exchanges"]:
                # (grouped clients report their group's sums in the simulation; in a
                # deployment every client reports; a validation panel's blocks are sums of
                # their own clients' reports, in the simulation as in a deployment)
                add(f"{prefix} {e['label']}", e,
                    n_clients if e["label"] == "report" and "validation_clients" not in r
                    else None)

    add_fit("fit", secure)
    for j, floor in enumerate(floors):
        add_fit("floor" if j == 0 else "floor refit", floor)
    for clients, words, wall in sums:  # (a sampled floor's start: 2 words an item)
        add("floor start sums" if words == 2 * secure.n_features_in_ else "evidence sum",
            {"clients": clients, "vector_words": words, "wall_s": wall,
             **_sum_costs(clients, words)})
    print(f"  {name}: exchanges of the secure fit (agreements and floor CPU s: a deployment's, "
          f"every client in a report; wall: the simulation's)")
    header = (f"  {'exchange':<20} {'count':>5} {'clients sim':>12} {'clients dep':>12} "
              f"{'agreements':>11} {'floor cpu s':>11} {'wall s':>8}")
    print(header)
    def span(v):
        return f"{min(v)}" if min(v) == max(v) else f"{min(v)}-{max(v)}"

    for kind, (count, clients, agreements, cpu, wall, deployed) in rows.items():
        print(f"  {kind:<20} {count:>5} {span(clients):>12} {span(deployed):>12} "
              f"{agreements:>11,} {cpu:>11.2f} {wall:>8.1f}", flush=True)
    after = [max(row[5]) for kind, row in rows.items() if kind != "fit start"]
    print(f"  {name}: largest exchange after the fit's start: {max(after, default=0)} clients "
          f"(a deployment's), of {n_clients}", flush=True)


def _nested_floor(floors, primitives, sums):
    """``({kind: floor seconds}, largest exchange after the start)`` of the nested floor
    fits and of the one-off secure sums ``sums`` (``(clients, words, wall s)`` each, their
    floor from :func:`_sum_costs`: ``secure_sum`` does not record costs)."""
    total, largest = {kind: 0.0 for kind in primitives}, 0
    for floor in floors:
        costs = [r["secure"] for r in floor.history_]
        start = costs[0].get("start")
        for kind, prims in primitives.items():  # (a sampled floor's start: in ``sums``)
            total[kind] += sum(floor_seconds(c, *prims) for c in costs + [start] if c)
        largest = max([largest] + [e["clients"] for c in costs for e in c["exchanges"]])
    for clients, words, _ in sums:
        for kind, prims in primitives.items():
            total[kind] += floor_seconds(_sum_costs(clients, words), *prims)
        largest = max(largest, clients)
    return total, largest


def _timing_primitives(totals):
    """Patch the protocol's ``agree`` and ``add_prg`` to add their CPU seconds and counts
    (agreements, expansions) to ``totals``; returns the originals (to restore)."""
    from sklearn_fedmf.secure import _protocol

    originals = {"agree": _protocol.agree, "add_prg": _protocol.add_prg}

    def agree(private, peer_publics, label):
        tic = time.process_time()
        keys = originals["agree"](private, peer_publics, label)
        totals["agree_s"] += time.process_time() - tic
        totals["agreements"] += len(keys)
        return keys

    def add_prg(total, seed, sign=1):
        tic = time.process_time()
        out = originals["add_prg"](total, seed, sign)
        totals["expand_s"] += time.process_time() - tic
        totals["expansions"] += 1
        return out

    _protocol.agree, _protocol.add_prg = agree, add_prg
    return originals


def bench_deployment(X, per_round, max_iter, only=None, early_stopping=True, in_situ=False):
    measured = {"wall": measure_primitives(time.perf_counter),
                "cpu": measure_primitives(time.process_time)}
    # the issue's floor (agreements and keystream bytes) by both clocks, and in CPU seconds
    # with each expansion's fixed cost too ("cpu+exp", module docstring)
    primitives = {"wall": measured["wall"][:2], "cpu": measured["cpu"][:2],
                  "cpu+exp": measured["cpu"]}
    n = X.shape[0]
    print(f"{n:,} users (one client each) x {X.shape[1]:,} items, {X.nnz:,} ratings, "
          f"{per_round} clients per round, {max_iter or 'default'} rounds, "
          f"{'' if early_stopping else 'early_stopping=False, '}defaults otherwise")
    for kind, (agreement_s, keystream_bps, expansion_s) in measured.items():
        print(f"measured ({kind}): {agreement_s * 1e6:.1f} us per X25519 agreement (+HKDF), "
              f"AES-256-CTR keystream {keystream_bps / 1e9:.2f} GB/s, "
              f"{expansion_s * 1e6:.2f} us per expansion")
    header = (f"{'estimator':<12} {'rounds':>6} {'server s':>9} {'client ms med/max':>18} "
              f"{'kB sent med/max':>16} {'start: server s, client ms, kB':>31} "
              f"{'plain s':>8} {'secure s':>9} {'floor s':>8} {'ratio':>6} "
              f"{'cpu: plain':>10} {'secure':>7} {'floor':>7} {'ratio':>6} {'(s-p)/f':>7} "
              f"{'floor+exp':>9} {'(s-p)/f':>7} {'floor ex':>8} {'x plain':>7}")
    print(header)
    print("-" * len(header))
    for name, (cls, params, plain_extra, _) in ESTIMATORS.items():
        if only is not None and name not in only:
            continue
        params = dict(params, n_clients=n, clients_per_round=per_round, random_state=0)
        if "max_iter" in cls().get_params() and max_iter is not None:
            params["max_iter"] = max_iter
        if not early_stopping and "early_stopping" in cls().get_params():
            params["early_stopping"] = False  # (no validation: no biases floor either)
        _, wall_plain, cpu_plain = _fit_timed(cls, dict(params, **plain_extra), X)
        floors, sums = [], []  # the nested biases floors and one-off sums of the secure fit
        original = _recording_floors(floors), _recording_sums(sums)
        situ = dict.fromkeys(("agree_s", "agreements", "expand_s", "expansions"), 0)
        timed = _timing_primitives(situ) if in_situ else None
        try:
            secure, wall_secure, cpu_secure = _fit_timed(
                cls, dict(params, secure_aggregation=True), X)
        finally:
            from sklearn_fedmf.completion import _validation
            from sklearn_fedmf.secure import _protocol

            _validation._fit_floor, _validation.sum_securely = original
            if timed is not None:
                _protocol.agree, _protocol.add_prg = timed["agree"], timed["add_prg"]
        costs = [r["secure"] for r in secure.history_]
        start = costs[0].get("start")
        nested, largest = _nested_floor(floors, primitives, sums)
        floor = {kind: nested[kind] + sum(floor_seconds(c, *primitives[kind])
                                          for c in costs + ([start] if start else []))
                 for kind in primitives}
        server = np.median([c["server_s"] for c in costs])
        client = (np.median([c["client_s_median"] for c in costs]) * 1e3,
                  max(c["client_s_max"] for c in costs) * 1e3)
        sent = (np.median([c["client_bytes_sent_median"] for c in costs]) / 1e3,
                max(c["client_bytes_sent_max"] for c in costs) / 1e3)
        if start is None:
            start_text = "-"
        else:
            phases = start["phases"].values()
            start_text = (f"{sum(p['server_s'] for p in phases):.2f}, "
                          f"{sum(p['client_s_median'] for p in phases) * 1e3:.1f}, "
                          f"{sum(p['client_bytes_sent_median'] for p in phases) / 1e3:.1f}")
        print(f"{name:<12} {len(costs):>6} {server:>9.3f} "
              f"{client[0]:>8.1f}/{client[1]:<9.1f} {sent[0]:>7.1f}/{sent[1]:<8.1f} "
              f"{start_text:>31} {wall_plain:>8.2f} {wall_secure:>9.2f} {floor['wall']:>8.2f} "
              f"{wall_secure / (floor['wall'] + wall_plain):>6.2f} {cpu_plain:>10.2f} "
              f"{cpu_secure:>7.2f} {floor['cpu']:>7.2f} "
              f"{cpu_secure / (floor['cpu'] + cpu_plain):>6.2f} "
              f"{(cpu_secure - cpu_plain) / floor['cpu']:>7.2f} {floor['cpu+exp']:>9.2f} "
              f"{(cpu_secure - cpu_plain) / floor['cpu+exp']:>7.2f} "
              f"{largest if floors else '-':>8} {wall_secure / wall_plain:>7.1f}", flush=True)
        if in_situ:
            inside = situ["agree_s"] + situ["expand_s"]
            print(f"  {name} in situ (CPU): {situ['agreements']:,} agreements in "
                  f"{situ['agree_s']:.2f} s ({situ['agree_s'] / situ['agreements'] * 1e6:.1f} "
                  f"us each), {situ['expansions']:,} expansions in {situ['expand_s']:.2f} s "
                  f"({situ['expand_s'] / situ['expansions'] * 1e6:.2f} us each); the secure "
                  f"fit outside them {cpu_secure - inside:.2f} s, (s-p)/in situ "
                  f"{(cpu_secure - cpu_plain) / inside:.2f}", flush=True)
        exchange_table(name, secure, floors, sums, primitives, n)
        if floors:
            print(f"  {name}: {len(secure.history_)} rounds, factors_used_="
                  f"{secure.factors_used_}; nested floors: "
                  + ", ".join(f"{len(f.history_)} rounds of {f.clients_per_round or n} clients"
                              for f in floors), flush=True)


def run(n, d, drop_fraction, neighbours, seed=0):
    rng = np.random.default_rng(seed)
    uploads = {c: rng.standard_normal(d) for c in range(n)}
    dropped = set(range(0, n, round(1 / drop_fraction))) if drop_fraction else set()
    start = time.perf_counter()
    result = secure_sum(uploads, neighbours=neighbours, seed=seed,
                        dropout={"masked_input": dropped})
    wall = time.perf_counter() - start
    plain = np.sum([uploads[c] for c in result.clients], axis=0)
    error = float(np.max(np.abs(result.sum - plain)))
    return result, wall, error, FixedPointEncoding().error_bound(len(result.clients))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run on small sizes")
    parser.add_argument("--length", type=int, default=None, help="vector length d")
    parser.add_argument("--estimators", action="store_true",
                        help="fit every supporting estimator plain and secure")
    parser.add_argument("--ratings", type=int, default=20_000,
                        help="ratings of the MovieLens-1M-shaped set (--estimators)")
    parser.add_argument("--ml-1m", action="store_true",
                        help="--estimators on make_ratings(6040, 3706, 1_000_000), the "
                             "MovieLens-1M shape (the issue's target)")
    parser.add_argument("--rounds", default="5",
                        help="rounds per fit (--estimators), or 'default': each estimator's "
                             "default max_iter and early stopping (whole fits)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="fits per estimator and kind, median printed (--estimators; "
                             "default 3 with --ml-1m, else 1)")
    parser.add_argument("--only", default=None,
                        help="comma-separated estimators (--estimators; default: all)")
    parser.add_argument("--deployment", action="store_true",
                        help="each party's seconds and bytes per round, and the floor")
    parser.add_argument("--users", type=int, default=2000, help="users (--deployment)")
    parser.add_argument("--items", type=int, default=1000, help="items (--deployment)")
    parser.add_argument("--n-ratings", type=int, default=100_000,
                        help="ratings (--deployment)")
    parser.add_argument("--per-round", type=int, default=None,
                        help="clients per round (--deployment; 200, or 10%% with --ml-1m)")
    parser.add_argument("--no-early-stopping", action="store_true",
                        help="early_stopping=False (--deployment): no validation reports and "
                             "no biases floor, a nested fit over every client every round")
    parser.add_argument("--in-situ", action="store_true",
                        help="--deployment: also time the protocol's agreements and "
                             "expansions inside the secure fit (module docstring)")
    args = parser.parse_args()
    only = None if args.only is None else set(args.only.split(","))
    unknown = set() if only is None else only - set(ESTIMATORS)
    if unknown:
        parser.error(f"unknown estimators {sorted(unknown)}; among {list(ESTIMATORS)}")
    if args.deployment:
        if args.ml_1m:
            shape = (6040, 3706, 1_000_000)
        elif args.quick:
            shape = (200, 80, 3000)
        else:
            shape = (args.users, args.items, args.n_ratings)
        X = make_ratings(*shape, random_state=0).X
        per_round = args.per_round or (max(2, X.shape[0] // 10) if args.ml_1m or args.quick
                                       else 200)
        # ("default": each estimator's max_iter and early stopping, whole fits)
        rounds = (None if args.rounds == "default" else
                  2 if args.quick and args.rounds == "5" else int(args.rounds))
        bench_deployment(X, per_round, rounds, only, not args.no_early_stopping, args.in_situ)
        return
    if args.estimators:
        if args.ml_1m:
            X = make_ratings(6040, 3706, 1_000_000, random_state=0).X
        else:
            X = make_site_ratings("netflix-1m", n_ratings=args.ratings, random_state=0).X
        repeats = args.repeats or (3 if args.ml_1m else 1)
        if args.rounds != "default" and not args.rounds.isdigit():
            parser.error(f"--rounds must be a number or 'default', got {args.rounds!r}")
        bench_estimators(X, None if args.rounds == "default" else int(args.rounds), repeats,
                         only)
        return
    sizes = (5, 20) if args.quick else (10, 100)
    d = args.length or (1_000 if args.quick else 10_000)
    print(f"secure sum of n float vectors of length {d} (plain upload: {8 * d:,} bytes)")
    header = (f"{'n':>4} {'graph':>5} {'dropped':>7} {'phase':<15} {'client s':>9} "
              f"{'server s':>9} {'up B/client':>12} {'down B/client':>14}")
    print(header)
    print("-" * len(header))
    for n in sizes:
        for neighbours, drop in ((None, 0.0), (None, 0.1), (2 * math.ceil(math.log2(n)), 0.1)):
            result, wall, error, bound = run(n, d, drop, neighbours)
            graph = "all" if neighbours is None else str(neighbours)
            n_dropped = n - len(result.clients)
            for phase in PHASES:
                clients_s, server_s = result.seconds[phase]
                n_active = max(len(result.bytes_uploaded[phase]), 1)
                up = max(result.bytes_uploaded[phase].values(), default=0)
                down = max(result.bytes_downloaded[phase].values(), default=0)
                print(f"{n:>4} {graph:>5} {n_dropped:>7} {phase:<15} "
                      f"{clients_s / n_active:>9.4f} {server_s:>9.4f} {up:>12,} {down:>14,}")
            print(f"{n:>4} {graph:>5} {n_dropped:>7} {'total (wall)':<15} {wall:>9.3f} s for "
                  f"all; max error {error:.2e} <= bound {bound:.2e}")


if __name__ == "__main__":
    main()
