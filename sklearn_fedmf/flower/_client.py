"""The site side: a Flower ``ClientApp`` that runs a protocol's client functions.

Each site holds its own ratings (a file named in its node config) and its private client
state (``U_i``, duals, ...), which lives in ``Context.state`` between messages: the SuperNode
keeps it in memory and hands it to the process that serves each message. Only the
protocol's messages leave the site.

That process is either a fresh one per message (Flower's ``flwr-clientapp``) or one that
serves every message of the fit (``python -m sklearn_fedmf.flower``, see ``_worker``). For
the first, the module imports only Flower and the codec; the estimators, scikit-learn and
pandas are imported by the first message that needs them. For the second, the site's
ratings, block and protocol are kept between messages (:func:`_site`): they are derived
from the node config and the run's setup only, never from the private state.

Node config keys: ``partition-id`` (the site's client index, ``0 .. n_sites - 1``), ``data``
(its ratings: a CSR ``.npz`` or a ``user,item,rating`` CSV), optionally ``eval-data``
(held-out ratings of the same rows, same format) and ``n-items`` (needed for CSV files).
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from ._codec import put, take

__all__ = ["client_app", "message_type", "MESSAGE_TYPES", "HELLO", "OTHER_PHASE"]

# One message type per protocol phase ("<category>.<action>" is Flower's routing key).
HELLO = "query.hello"  # the site's aggregates: rows, rating count, sum and range
MESSAGE_TYPES = {
    "init_client": "train.init",  # the first broadcast in, the one-time upload out
    "client_prepare": "train.prepare",  # a round's broadcast in, its statistics out
    "client_update": "train.update",  # the broadcast in, the upload out
    "client_metrics": "evaluate.metrics",  # the broadcast in, additive sums out
}
# Any other phase of the engine (secure aggregation's, ...) travels as this type, its name
# in the Message: the site calls the protocol's function of that name as the simulation's
# transport calls it, ``fn(state, block, broadcast, rng, selected) -> (state, message)``.
OTHER_PHASE = "train.phase"
SECURE_SLOT = "fedmf.secure"  # the site's secure slot (secure aggregation) in Context.state
_PHASE_OF = {v: k for k, v in MESSAGE_TYPES.items()}


def message_type(phase):
    """The Flower message type that carries the engine's ``phase``."""
    return MESSAGE_TYPES.get(phase, OTHER_PHASE)


def _phase_function(protocol, phase):
    fn = getattr(protocol, phase, None) if phase.isidentifier() else None
    if phase.startswith("_") or not callable(fn):
        raise ValueError(f"This site's protocol has no client phase {phase!r}.")
    return fn


class _Site:
    """This site's data and, once set up, its protocol (derived from the node config and the
    run's setup: nothing of the private state)."""

    def __init__(self, context: Context, setup=None):
        from ._sites import load_site, make_site_protocol, site_block, site_estimator

        config = context.node_config
        if "data" not in config:
            raise ValueError("The node config lacks 'data' (the site's ratings file).")
        if "partition-id" not in config:
            raise ValueError("The node config lacks 'partition-id' (the site's client index).")
        self.client = int(config["partition-id"])
        n_items = config.get("n-items", setup["n_items"] if setup else None)
        self.X = load_site(config["data"], n_items)
        self.X_eval = load_site(config["eval-data"], n_items) if "eval-data" in config else None
        if setup is None:
            return
        if self.X.shape[1] != setup["n_items"]:
            raise ValueError(f"This site's ratings have {self.X.shape[1]} items, the "
                             f"federation {setup['n_items']}.")
        estimator = site_estimator(setup["estimator"], setup["params"])
        self.protocol = make_site_protocol(
            estimator, n_items=setup["n_items"], n_clients=setup["n_clients"],
            n_users=setup["n_users"], mean=setup["mean"], rating_range=setup["rating_range"],
            n_ratings=setup["n_ratings"], sum_squares=setup.get("sum_squares"),
            entropy=setup["entropy"],
        )
        self.block = site_block(estimator, self.X, self.X_eval)


def _hello(msg: Message, context: Context) -> Message:
    X = _Site(context).X
    return Message(RecordDict({"hello": ConfigRecord({
        "client": int(context.node_config["partition-id"]), "n_rows": X.shape[0],
        "n_items": X.shape[1], "count": int(X.nnz), "sum": float(X.data.sum()),
        "sum_squares": float(X.data @ X.data),  # (RFRec's "auto" strengths)
        "min": float(X.data.min()) if X.nnz else 0.0,
        "max": float(X.data.max()) if X.nnz else 0.0,
    })}), reply_to=msg)


_SITES = {}  # this process's sites, most recent last: see _site
_KEEP_SITES = 4


def _site(context, setup):
    """The site of ``context`` for the run's ``setup``: built once per process.

    A process that serves every message of a fit (or several sites, in the tests) keeps the
    last few; the key holds everything a site is derived from, so a new run, another node
    config or another setup builds a new one.
    """
    setup_record = (context.state["fedmf.setup.tree"]["tree"],
                    tuple(a.data for a in context.state["fedmf.setup.arrays"].values()))
    key = (context.run_id, context.node_id, repr(sorted(context.node_config.items())),
           setup_record)
    site = _SITES.pop(key, None) or _Site(context, setup)
    _SITES[key] = site
    while len(_SITES) > _KEEP_SITES:
        _SITES.pop(next(iter(_SITES)))
    return site


def _serve(msg: Message, context: Context) -> Message:
    from .._threads import one_thread

    # one BLAS thread, as in the simulation: the same products, rounded the same way
    with one_thread("blas"):
        return _run_phase(msg, context)


def _committed_state(context, accepted):
    """The client's state as the server knows it.

    A stateful phase stores its new state as pending, tagged with the Message's sequence
    number; the server's next Message names the last number whose reply it accepted. A reply
    the server never used (it came too late, or was lost) is thus discarded: the client keeps
    its previous state, as a failed client does in the simulation.
    """
    state = context.state
    if "fedmf.pending.tree" in state:
        if int(state["fedmf.seq"]["pending"]) == accepted:
            put(state, "fedmf.state", take(state, "fedmf.pending"))
        put(state, "fedmf.pending", None)
    return take(state, "fedmf.state")


def _run_phase(msg, context):
    from ..engine._exchange import SECURE_PHASES, holds_upload
    from ..engine._transport import client_generator

    info = msg.content["phase"]
    phase = _PHASE_OF.get(msg.metadata.message_type) or str(info["name"])
    if phase == "init_client":
        setup = take(msg.content, "setup")
        put(context.state, "fedmf.setup", setup)
    else:
        setup = take(context.state, "fedmf.setup")
        if setup is None:
            raise RuntimeError("This site missed the run's init message (a SuperNode that "
                               "restarted has lost its Context.state).")
    site = _site(context, setup)
    broadcast = take(msg.content, "broadcast")
    if phase in SECURE_PHASES:
        return Message(_secure_phase(context, site, phase, broadcast), reply_to=msg)
    fn = _phase_function(site.protocol, phase)
    state = _committed_state(context, int(info["accepted"]))
    if phase == "client_metrics":
        message = fn(state, site.block, broadcast)
    else:
        rng = client_generator(take(msg.content, "stream"), site.client)
        if phase == "init_client":
            state, message = fn(site.block, broadcast, rng)
        else:
            state, message = fn(state, site.block, broadcast, rng, bool(info["selected"]))
        put(context.state, "fedmf.pending", state)
        context.state["fedmf.seq"] = ConfigRecord({"pending": int(info["seq"])})
    content = RecordDict()
    if message is not None and holds_upload(site.protocol, phase):
        # secure aggregation: the upload stays here, in the site's secure slot, until its
        # masked input is asked for; the server learns only that it is ready
        slot = take(context.state, SECURE_SLOT) or {}
        put(context.state, SECURE_SLOT, {**slot, "upload": message, "broadcast": broadcast})
        content["held"] = ConfigRecord({"held": True})
        return Message(content, reply_to=msg)
    put(content, "message", message)
    return Message(content, reply_to=msg)


def _secure_phase(context, site, phase, message):
    """This site's step of a secure-aggregation phase on its secure slot (kept in
    ``Context.state``, like its private state). Its keys, self-mask seed and share
    coefficients come from the OS (``rng=None``): the server, which draws the simulation's
    streams, must not know them. The sum, and so the model, does not depend on them."""
    from ..engine._exchange import client_secure_phase

    slot, reply = client_secure_phase(phase, site.client, take(context.state, SECURE_SLOT),
                                      message, None, site.protocol.summable)
    put(context.state, SECURE_SLOT, slot or None)
    content = RecordDict()
    put(content, "message", reply)
    return content


def client_app():
    """A Flower ``ClientApp`` that serves the protocol phases of the supported estimators.

    The site reads its ratings from the file its node config names (module docstring),
    rebuilds the protocol from the estimator parameters the server sends with the init
    message, keeps its private state in ``Context.state`` and draws its random numbers from
    the stream the server names, so it computes exactly what the simulation computes.

    Returns
    -------
    app : flwr.clientapp.ClientApp

    Examples
    --------
    The client module of a Flower app (``[tool.flwr.app.components] clientapp``):

    >>> from sklearn_fedmf.flower import client_app
    >>> app = client_app()
    """
    app = ClientApp()
    app.query("hello")(_hello)
    for name in (*MESSAGE_TYPES.values(), OTHER_PHASE):
        category, action = name.split(".")
        getattr(app, category)(action)(_serve)
    return app
