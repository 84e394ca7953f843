"""``fedmf flower-split``: one ratings file per site, and the commands that start a Flower
federation on them (see the guide "Deploying with Flower")."""

from __future__ import annotations

from pathlib import Path

from ._messages import CommandError

EXAMPLE_APP = "examples/flower_app"


def add_flower_split(sub, positive_int, columns):
    split = sub.add_parser(
        "flower-split", help="split ratings into one file per site and print the Flower "
                             "commands (SuperLink, SuperNodes, run)",
        description="Split the users of a ratings data set into --sites sites (random, seeded; "
                    "each site keeps its users' rows in their original order), write "
                    "site-<i>.npz (training ratings, CSR) and site-<i>-eval.npz (held-out "
                    "ratings of the same rows, --test-size per user) to --out, and print the "
                    "commands that start a Flower SuperLink, one SuperNode per site and the "
                    "run of the example app on 127.0.0.1.")
    split.add_argument("--data", default="embedded", metavar="SPEC",
                       help="as in 'fedmf run --data' (default: %(default)s)")
    columns(split)
    split.add_argument("--sites", type=positive_int, default=2,
                       help="number of sites (default: %(default)s)")
    split.add_argument("--test-size", type=float, default=0.2, metavar="FRACTION",
                       help="held-out fraction of each user's ratings; 0 writes no eval "
                            "files (default: %(default)s)")
    split.add_argument("--out", default="flower-sites", metavar="DIR",
                       help="folder of the site files (default: %(default)s)")
    split.add_argument("--port", type=positive_int, default=9092,
                       help="the SuperLink's port on 127.0.0.1 (default: %(default)s)")
    split.add_argument("--seed", type=int, default=0,
                       help="seed of the hold-out split and the site assignment "
                            "(default: %(default)s)")
    split.set_defaults(func=cmd_flower_split)


def cmd_flower_split(args):
    import numpy as np

    from ..flower import split_sites
    from ..model_selection import train_test_split_ratings
    from ._data import _columns, load_data

    if not 0 <= args.test_size < 1:
        raise CommandError(f"--test-size must be in [0, 1), got {args.test_size}")
    X, name = load_data(args.data, args.seed, _columns(args))
    if args.sites > X.shape[0]:
        raise CommandError(f"--sites {args.sites} is more than the {X.shape[0]} users")
    X_eval = None
    if args.test_size:
        X, X_eval = train_test_split_ratings(X, args.test_size, random_state=args.seed)
    rng = np.random.default_rng(args.seed)
    sites = rng.permutation(np.arange(X.shape[0]) % args.sites)
    paths = split_sites(X, sites, args.out, X_eval)
    print(f"{name}: {X.shape[0]} users x {X.shape[1]} items, {X.nnz} training ratings, "
          f"split into {len(paths)} sites in {args.out}/")
    for c, path in enumerate(paths):
        print(f"  site {c}: {int(np.sum(sites == c))} users ({path.name})")
    print()
    print(flower_commands(paths, args.port, eval_data=X_eval is not None, out=args.out))
    return 0


def flower_commands(paths, port, *, eval_data, out):
    """The shell commands that run a Flower federation on the site files ``paths``; writes
    the connection ``fedmf-local`` (127.0.0.1:``port``) to ``out/flwr-home/config.toml``."""
    out = Path(out).resolve()
    home = out / "flwr-home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "fedmf-local"\n\n[superlink.fedmf-local]\n'
        f'address = "127.0.0.1:{port}"\ninsecure = true\n', encoding="utf-8")
    lines = ["# 1. the SuperLink (a terminal of its own):",
             f"flower-superlink --insecure --host 127.0.0.1 --port {port} "
             "--disable-runtime-dependency-installation",
             "# 2. one SuperNode per site (a terminal each; the site's data stays there; "
             "python -m sklearn_fedmf.flower is flower-supernode with rounds at network speed):"]
    for c, path in enumerate(paths):
        path = Path(path).resolve()
        config = f'partition-id={c} data="{path}"'
        if eval_data:
            config += f' eval-data="{path.with_name(path.stem + "-eval.npz")}"'
        lines.append(f"python -m sklearn_fedmf.flower --insecure --superlink 127.0.0.1:{port} "
                     f"--port {port + 10 + c} --node-config '{config}'")
    lines += ["# 3. the run: the example app of the source tree, whose ServerApp writes the "
              "fitted model",
              f"FLWR_HOME={home} flwr run {EXAMPLE_APP} fedmf-local --stream "
              f"--run-config 'min-nodes={len(paths)} output=\"{out / 'model.joblib'}\"'"]
    return "\n".join(lines)
