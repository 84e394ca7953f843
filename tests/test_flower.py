"""The protocols on Flower: the same fit as the simulation, with only the protocol's messages
on the wire.

* contract tests: the ClientApp's functions, driven in-process by a fake ``Grid`` that hands
  each Message to its node's ``Context`` as a SuperNode does, give the simulation's
  ``history_`` and ``components_`` bit for bit;
* the privacy contract over the wire: every Message the server receives holds what the
  simulation's upload holds and nothing of a site's rows;
* a loopback deployment: a SuperLink and two SuperNodes as processes on 127.0.0.1, ``flwr run``
  of the example app, and the model its ServerApp writes equal to the simulated fit.
"""

import dataclasses
import subprocess

import numpy as np
import pytest

flwr = pytest.importorskip(
    "flwr", reason="Flower (the 'flower' extra) is not installed; it needs Python >= 3.11")

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS, Felb, RFRec  # noqa: E402
from sklearn_fedmf.engine._federation import FederatedProtocol  # noqa: E402
from sklearn_fedmf.engine._fit import route_solver_params  # noqa: E402
from sklearn_fedmf.engine._transport import LocalTransport  # noqa: E402
from sklearn_fedmf.flower import MESSAGE_TYPES, client_app, fit_on_grid, split_sites  # noqa: E402
from sklearn_fedmf.flower._client import OTHER_PHASE  # noqa: E402
from sklearn_fedmf.flower._codec import take  # noqa: E402
from sklearn_fedmf.flower._server import wire_bytes  # noqa: E402
from sklearn_fedmf.privacy import LocalDP  # noqa: E402

from .conftest import low_rank_ratings  # noqa: E402

N_SITES = 3


class FakeGrid(Grid):
    """A ``Grid`` whose nodes are in this process: each Message goes to ``client_app`` with its
    node's own ``Context`` (state kept between messages, as a SuperNode keeps it). A client
    function that raises gives an error reply, as Flower's runtime does; ``drop`` names
    ``(message_type, partition-id)`` pairs, or ``(phase, partition-id, round)`` triples,
    whose Message never arrives, ``late`` those whose
    reply comes after the timeout (the site has computed), ``restart`` those whose node loses
    its state first (a SuperNode restarted)."""

    def __init__(self, node_configs, drop=(), late=(), restart=()):
        self.app = client_app()
        self.contexts = {node: Context(run_id=1, node_id=node, node_config=config,
                                       state=RecordDict(), run_config={})
                         for node, config in node_configs.items()}
        self.drop, self.late, self.restart = set(drop), set(late), set(restart)
        self.sent, self.received, self.waiting = [], [], {}
        self._ids = 0

    def set_run(self, run):
        self._run = run

    @property
    def run(self):
        return self._run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        """Deliver each Message at once; its reply waits to be pulled."""
        ids = []
        for msg in messages:
            self._ids += 1
            msg.metadata.__dict__["_message_id"] = f"m{self._ids}"
            ids.append(msg.metadata.message_id)
            self.sent.append(msg)
            context = self.contexts[msg.metadata.dst_node_id]
            site = context.node_config["partition-id"]
            phase = msg.content["phase"]["name"] if "phase" in msg.content else None
            if ((msg.metadata.message_type, site) in self.drop
                    or (phase, site, int(msg.metadata.group_id)) in self.drop):
                continue
            if (msg.metadata.message_type, site) in self.restart:
                context.state = RecordDict()
            try:
                reply = self.app(msg, context)
            except Exception as exc:  # the runtime turns a client's exception into an error
                reply = Message(Error(code=0, reason=repr(exc)), reply_to=msg)
            if (msg.metadata.message_type, site) in self.late:
                continue
            self.received.append(reply)
            self.waiting[msg.metadata.message_id] = reply
        return ids

    def pull_messages(self, message_ids):
        ready = [self.waiting.pop(i) for i in message_ids if i in self.waiting]
        return ready[::-1]  # arrival order must not matter

    def send_and_receive(self, messages, *, timeout=None):
        raise AssertionError("send_and_receive must not be called: the server pushes and pulls "
                             "at its own pace")


@pytest.fixture
def task_identity():
    """The ServerApp's Messages need the run's identity, which the Flower runtime sets."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity.run_id = TaskIdentity.node_id = TaskIdentity.task_id = None


def site_files(tmp_path, X, labels, X_eval=None):
    """One ratings file per site; node ids unrelated to the client order."""
    paths = split_sites(X, labels, tmp_path, X_eval)
    configs = {}
    for c, path in enumerate(paths):
        config = {"partition-id": c, "data": str(path)}
        if X_eval is not None:
            config["eval-data"] = str(path.with_name(f"site-{c}-eval.npz"))
        configs[9000 - 17 * c] = config
    return configs


def ratings(seed=0):
    X, Y, _ = low_rank_ratings(m=90, n=25, r=2, seed=seed)  # 30 rows per site: not 25 or 2
    labels = np.arange(X.shape[0]) % N_SITES
    return X, Y, labels


def strip_seconds(history):
    # (``secure``: each party's measured seconds, which the sites do not report)
    return [{k: v for k, v in r.items() if k not in ("seconds", "secure")} for r in history]


# The "auto" strengths of FedMC-ADMM and FedMAvg, and FedMGS's bias start with biases, need
# moments the sites send once before round 1 (completion/_auto_strengths), which the Flower
# server does not collect yet: the contract pins fixed strengths there (and FedMGS's "auto"
# rule runs without biases), so that both sides fit the same model.
FIXED = {"FedMCADMM": dict(alpha_u=5.0, alpha_v=0.1), "FedMAvg": dict(alpha_u=10.0, alpha_v=10.0)}
CONTRACT = {
    "FedMCADMM": FedMCADMM(
        n_components=2, max_iter=4, clients_per_round=2, random_state=3,
        solver_params={"center": False}, **FIXED["FedMCADMM"],
    ),
    "FedMCADMM-centred": FedMCADMM(n_components=2, max_iter=3, random_state=1,
                                   **FIXED["FedMCADMM"]),
    "FedMAvg": FedMAvg(
        n_components=2, max_iter=4, clients_per_round=2, random_state=3,
        solver_params={"center": False}, **FIXED["FedMAvg"],
    ),
    "FedMAvg-fedmc_admm": FedMAvg(
        n_components=2, max_iter=3, random_state=0,
        solver_params={"variant": "fedmc_admm", "center": False}, **FIXED["FedMAvg"],
    ),
    "FedMGS": FedMGS(n_components=2, max_iter=4, random_state=3, biased=False,
                     solver_params={"center": False}),
    "RFRec": RFRec(
        n_components=2, max_iter=3, n_clients=N_SITES, random_state=3,
        alpha_u=4.5, alpha_v=4.5, solver_params={"center": False},
    ),
    # "auto" strengths: the sites' sums of squares give the scale, summed in another order
    # than numpy's, hence the tolerance of the centred branch
    "RFRec-auto": RFRec(n_components=2, max_iter=3, n_clients=N_SITES, random_state=3),
    "Felb": Felb(n_components=2, max_iter=3, sync_every=2, random_state=3),
    "Felb-gaussian": Felb(n_components=2, max_iter=2,
                          privacy=LocalDP("gaussian", epsilon=0.5, delta=0.05, clip=1.0),
                          random_state=3),
}


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.ConvergenceWarning")
@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_flower_fit_equals_the_simulation(name, tmp_path, task_identity):
    X, Y, labels = ratings()
    if name.startswith("Felb"):  # binary data, no held-out set
        X, Y = X.copy(), None
        X.data = (X.data > 0).astype(float)
    fit_params = {} if Y is None else {"eval_set": Y}
    simulated = CONTRACT[name].__class__(**CONTRACT[name].get_params(deep=False)).fit(
        X, clients=labels, **fit_params)
    grid = FakeGrid(site_files(tmp_path, X, labels, Y))
    flower = fit_on_grid(CONTRACT[name].__class__(**CONTRACT[name].get_params(deep=False)), grid,
                         min_nodes=N_SITES, wait=1)
    assert flower.n_iter_ == simulated.n_iter_
    assert flower.n_clients_ == N_SITES
    if simulated._settings().get("center", False):  # (Felb does not centre)
        # the server's mean is (sum of the sites' sums) / count, numpy's is a pairwise mean
        # of all ratings: they differ in the last bits, and so do the fits
        assert flower.mean_ == pytest.approx(simulated.mean_, rel=1e-14)
        np.testing.assert_allclose(flower.components_, simulated.components_, rtol=1e-9)
    else:
        assert strip_seconds(flower.history_) == strip_seconds(simulated.history_)
        np.testing.assert_array_equal(flower.components_, simulated.components_)
    assert not hasattr(flower, "user_factors_")  # the user factors stay on the sites
    # the Messages carry the protocol's payload plus their encoding
    for record, wire in zip(flower.history_, flower.message_bytes_):
        assert wire["round"] == record["round"]
        assert record["bytes_uploaded"] <= wire["uploaded"]
        assert record["bytes_downloaded"] <= wire["downloaded"]


@pytest.mark.parametrize("cls", [FedMGS, FedMAvg])
def test_implicit_fit_on_flower_equals_the_simulation(cls, tmp_path, task_identity):
    # loss="implicit": the sites' strength sum and count give the "auto" confidence scale
    X, _, labels = ratings()
    X.data = np.abs(X.data) + 1.0  # (strengths are nonnegative)
    params = dict(loss="implicit", n_components=2, max_iter=3, random_state=3)
    simulated = cls(**params).fit(X, clients=labels)
    flower = fit_on_grid(cls(**params), FakeGrid(site_files(tmp_path, X, labels)),
                         min_nodes=N_SITES, wait=1)
    assert flower.confidence_ == pytest.approx(simulated.confidence_, rel=1e-14)
    assert flower.n_iter_ == simulated.n_iter_ == 3
    np.testing.assert_allclose(flower.components_, simulated.components_, rtol=1e-9)
    assert not hasattr(flower, "user_factors_")


def test_centred_fit_equals_run_federation_given_the_same_mean(tmp_path, task_identity):
    """With the server's mean the simulation and Flower run the same protocol on the same
    blocks: the engine's local transport and the Flower transport give the same history."""
    from sklearn_fedmf.engine._federation import initialize_federation, run_federation
    from sklearn_fedmf.flower._sites import load_site, make_site_protocol, site_block

    X, Y, labels = ratings(1)
    params = dict(n_components=2, max_iter=3, clients_per_round=2, random_state=5)
    grid = FakeGrid(site_files(tmp_path, X, labels, Y))
    flower = fit_on_grid(FedMCADMM(**params), grid, min_nodes=N_SITES, wait=1)

    est = FedMCADMM(**params)
    protocol = make_site_protocol(est, n_items=X.shape[1], n_clients=N_SITES,
                                  n_users=X.shape[0], mean=flower.mean_,
                                  rating_range=flower.rating_range_, n_ratings=X.nnz)
    blocks = [site_block(est, load_site(tmp_path / f"site-{c}.npz"),
                         load_site(tmp_path / f"site-{c}-eval.npz")) for c in range(N_SITES)]
    state, init_bytes = initialize_federation(protocol, blocks, entropy=5)
    state = run_federation(protocol, blocks, max_iter=3, clients_per_round=2, entropy=5,
                           state=state, init_bytes=init_bytes)
    assert strip_seconds(state.history) == strip_seconds(flower.history_)


def test_every_message_the_server_receives_holds_only_the_upload(tmp_path, task_identity):
    X, _, labels = ratings(2)
    n_rows = int(np.sum(labels == 0))
    uploads = {}

    def record_uploads(k, info):
        uploads[k] = info["uploads"]

    params = dict(n_components=2, max_iter=3, random_state=4, solver_params={"center": False},
                  **FIXED["FedMCADMM"])  # (see CONTRACT)
    FedMCADMM(**params, callback=record_uploads).fit(X, clients=labels)
    simulated, uploads = uploads, {}
    grid = FakeGrid(site_files(tmp_path, X, labels))
    fit_on_grid(FedMCADMM(**params, callback=record_uploads), grid, min_nodes=N_SITES, wait=1)
    assert uploads.keys() == simulated.keys()

    site_of = {node: ctx.node_config["partition-id"] for node, ctx in grid.contexts.items()}
    phases = {v: k for k, v in MESSAGE_TYPES.items()}
    seen = {phase: 0 for phase in phases.values()}
    for reply in grid.received:
        assert not reply.has_error()
        kind = reply.metadata.message_type
        client = site_of[reply.metadata.src_node_id]
        if kind == "query.hello":  # aggregates only: sizes, rating count, sums and range
            assert set(reply.content.keys()) == {"hello"}
            assert set(reply.content["hello"].keys()) == {
                "client", "n_rows", "n_items", "count", "sum", "sum_squares", "min", "max"}
            continue
        seen[phases[kind]] += 1
        assert set(reply.content.keys()) == {"message.arrays", "message.tree"}
        message = take(reply.content, "message")
        arrays = [a.numpy() for a in reply.content["message.arrays"].values()]
        assert all(n_rows not in a.shape for a in arrays)  # no U_i, no ratings
        if phases[kind] == "client_update":  # what the paper's client sends: W_i and Y_i
            round_ = int(reply.metadata.group_id)
            assert set(message) == {"W", "Y"}
            for key in message:
                np.testing.assert_array_equal(message[key], simulated[round_][client][key])
        elif phases[kind] == "init_client":
            assert set(message) == {"Y"}
        else:  # client_metrics: additive scalar sums
            assert all(np.ndim(v) == 0 for v in message.values())
    assert seen == {"init_client": N_SITES, "client_prepare": 0,
                    "client_update": 3 * N_SITES, "client_metrics": 3 * N_SITES}


@pytest.mark.slow  # (waits for the sites' time-outs)
def test_a_site_that_errs_or_times_out_fails_as_in_the_simulation(tmp_path, task_identity):
    """A missing reply (timeout) or an error reply is the client's failure; the engine's
    policy then raises a ClientError naming the client and the round, as for a simulated
    client whose code raised."""
    from sklearn_fedmf.exceptions import ClientError, ClientFailureWarning

    X, _, labels = ratings()
    configs = site_files(tmp_path, X, labels)
    grid = FakeGrid(configs, drop={("train.update", 1)})
    with pytest.raises(ClientError, match="Client 1 failed in client_update.*TimeoutError"):
        fit_on_grid(FedMCADMM(n_components=2, max_iter=2, random_state=0), grid,
                    min_nodes=N_SITES, timeout=1, wait=1)
    assert grid.sent and not any(r.has_error() for r in grid.received)
    # with on_client_error="skip" the federation goes on without it, as in a simulation
    grid = FakeGrid(configs, drop={("train.update", 1)})
    with pytest.warns(ClientFailureWarning):
        fitted = fit_on_grid(FedMCADMM(
            n_components=2, max_iter=2, random_state=0, solver_params={"on_client_error": "skip"},
        ), grid,
                             min_nodes=N_SITES, timeout=1, wait=1)
    assert [r["n_failed"] for r in fitted.history_] == [1, 1]
    # a site whose reply comes too late has computed, but the server did not use its reply:
    # it goes on from its previous state, exactly as a site that never got the Message
    grid = FakeGrid(configs, late={("train.update", 1)})
    with pytest.warns(ClientFailureWarning):
        late = fit_on_grid(FedMCADMM(
            n_components=2, max_iter=2, random_state=0, solver_params={"on_client_error": "skip"},
        ), grid,
                           min_nodes=N_SITES, timeout=1, wait=1)
    assert strip_seconds(late.history_) == strip_seconds(fitted.history_)
    np.testing.assert_array_equal(late.components_, fitted.components_)

    # a SuperNode that restarted after the init has lost its Context.state: its ClientApp
    # errs, and the error reply is the client's failure
    grid = FakeGrid(configs, restart={("train.update", 2)})
    with pytest.raises(ClientError, match="Client 2 failed in client_update.*init message"):
        fit_on_grid(FedMCADMM(n_components=2, max_iter=2, random_state=0), grid,
                    min_nodes=N_SITES, wait=1)
    assert sum(r.has_error() for r in grid.received) == 1


@dataclasses.dataclass(frozen=True)
class ProtocolWithExtraPhase(FederatedProtocol):
    """A protocol with one more client phase, as secure aggregation adds (keys, shares,
    masked inputs, unmasking): ``fn(state, block, broadcast, rng, selected)``."""

    def client_extra(self, state, block, broadcast, rng, selected):
        return {**state, "extra": state.get("extra", 0) + 1}, {
            "draws": rng.random(2), "twice": 2 * broadcast["v"], "selected": selected,
            "rows": block.X.shape[0], "seen": state.get("extra", 0)}


def test_any_other_phase_of_the_engine_goes_through_unchanged(tmp_path, task_identity,
                                                             monkeypatch):
    from sklearn_fedmf.engine._federation import initialize_federation
    from sklearn_fedmf.engine._transport import client_generator
    from sklearn_fedmf.exceptions import ClientError
    from sklearn_fedmf.flower._server import connect

    make = FedMCADMM._make_protocol
    monkeypatch.setattr(FedMCADMM, "_make_protocol", lambda self, ctx: ProtocolWithExtraPhase(
        **{f.name: getattr(make(self, ctx), f.name)
           for f in dataclasses.fields(FederatedProtocol)}))
    X, _, labels = ratings()
    grid = FakeGrid(site_files(tmp_path, X, labels))
    transport, protocol, _ = connect(FedMCADMM(n_components=2, random_state=0), grid,
                                     min_nodes=N_SITES, wait=1)
    initialize_federation(protocol, transport, entropy=7)
    stream, v = (7, 99, 1), np.arange(3.0)
    for seen in range(2):  # the state the phase returns is the site's next state
        result = transport.run("client_extra", [0, 2], {"v": v}, stream=stream,
                               selected={2}, round_number=1)
        assert not result.failures and list(result.messages) == [0, 2]
        for c, message in result.messages.items():
            np.testing.assert_array_equal(message["draws"],
                                          client_generator(stream, c).random(2))
            np.testing.assert_array_equal(message["twice"], 2 * v)
            assert message["selected"] == (c == 2)
            assert message["rows"] == np.sum(labels == c)
            assert message["seen"] == seen
    assert {m.metadata.message_type for m in grid.sent[-2:]} == {OTHER_PHASE}
    # a name the site's protocol does not have is that site's error
    result = transport.run("client_missing", [1], {"v": v}, stream=stream, round_number=1)
    assert isinstance(result.failures[1], ClientError)
    assert "no client phase 'client_missing'" in str(result.failures[1])


def test_the_server_checks_the_sites(tmp_path, task_identity):
    from sklearn_fedmf.exceptions import FederationError

    X, _, labels = ratings()
    configs = site_files(tmp_path, X, labels)
    with pytest.raises(FederationError, match="Only 3 of 4 SuperNodes"):
        fit_on_grid(FedMCADMM(), FakeGrid(configs), min_nodes=4, wait=0.1)
    twice = {node: {**config, "partition-id": 0} for node, config in configs.items()}
    with pytest.raises(FederationError, match="partition-id"):
        fit_on_grid(FedMCADMM(), FakeGrid(twice), min_nodes=N_SITES, wait=0.1)


def test_wire_bytes_count_the_serialized_message(task_identity):
    from sklearn_fedmf.flower._codec import put

    small, large = RecordDict(), RecordDict()
    put(small, "message", {"W": np.zeros((10, 2))})
    put(large, "message", {"W": np.zeros((1000, 2))})
    a, b = (wire_bytes(Message(c, 1, "train.update")) for c in (small, large))
    # the added payload, plus a few bytes of longer lengths and shapes in the encoding
    assert 0 <= (b - a) - (1000 - 10) * 2 * 8 <= 16


# ---- secure aggregation on Flower ------------------------------------------------------------
SECURE = dict(n_components=2, max_iter=3, random_state=3, secure_aggregation=True,
              solver_params={"center": False}, **FIXED["FedMCADMM"])


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.ConvergenceWarning")
@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
@pytest.mark.parametrize("cls, params", [
    (FedMCADMM, SECURE),  # a cumulative exchange, with a secure initial exchange
    (FedMGS, dict(n_components=2, max_iter=3, random_state=3, biased=False,
                  secure_aggregation=True, solver_params={"center": False})),
    # the guarded W step: a second, cumulative exchange in the prepare phase
    (FedMAvg, dict(n_components=2, max_iter=3, clients_per_round=2, random_state=3,
                   secure_aggregation=True, solver_params={"center": False},
                   **FIXED["FedMAvg"])),
    (RFRec, dict(n_components=2, max_iter=3, n_clients=N_SITES, random_state=3, alpha_u=4.5,
                 alpha_v=4.5, secure_aggregation=True, solver_params={"center": False})),
    (Felb, dict(n_components=2, max_iter=3, sync_every=2, random_state=3,
                secure_aggregation=True)),
])
def test_secure_fit_on_flower_equals_the_in_process_secure_fit(cls, params, tmp_path,
                                                               task_identity):
    """The sites run the protocol's phases with keys from their OS: other masks than the
    simulation's seeded ones, the same ring sums, so the same model bit for bit."""
    X, Y, labels = ratings()
    if cls is Felb:  # binary data, no held-out set
        X, Y = X.copy(), None
        X.data = (X.data > 0).astype(float)
    simulated = cls(**params).fit(X, clients=labels, **({} if Y is None else {"eval_set": Y}))
    grid = FakeGrid(site_files(tmp_path, X, labels, Y))
    flower = fit_on_grid(cls(**params), grid, min_nodes=N_SITES, wait=1)
    np.testing.assert_array_equal(flower.components_, simulated.components_)
    assert strip_seconds(flower.history_) == strip_seconds(simulated.history_)
    names = {m.content["phase"]["name"] for m in grid.sent if "phase" in m.content}
    assert {"secure_advertise_keys", "secure_share_keys", "secure_masked_input",
            "secure_unmask"} <= names


def test_the_server_receives_only_masked_vectors_under_secure_aggregation(tmp_path,
                                                                          task_identity):
    from sklearn_fedmf.secure._rounds import auto_encoding

    X, _, labels = ratings(2)
    n_rows = int(np.sum(labels == 0))
    plain_params = {k: v for k, v in SECURE.items() if k != "secure_aggregation"}
    plain = {}
    FedMCADMM(**plain_params, callback=lambda k, info: plain.update({k: info["uploads"]})).fit(
        X, clients=labels)
    seen = []
    grid = FakeGrid(site_files(tmp_path, X, labels))
    fit_on_grid(FedMCADMM(**SECURE, callback=lambda k, info: seen.append(info["uploads"])),
                grid, min_nodes=N_SITES, wait=1)
    encoding = auto_encoding(N_SITES)
    kinds = {}
    for reply in grid.received:
        assert not reply.has_error()
        kind = reply.metadata.message_type
        if kind in ("query.hello", MESSAGE_TYPES["client_metrics"]):  # aggregates, sums
            continue
        if kind in (MESSAGE_TYPES["init_client"], MESSAGE_TYPES["client_update"]):
            assert set(reply.content.keys()) == {"held"}  # the upload stayed on the site
            kinds["held"] = kinds.get("held", 0) + 1
            continue
        assert kind == OTHER_PHASE
        message = take(reply.content, "message")
        arrays = [a.numpy() for a in reply.content["message.arrays"].values()]
        # keys and ciphertexts are bytes, masked vectors ring elements: no float leaves a site
        assert all(a.dtype in (np.uint8, np.uint64) for a in arrays)
        assert all(n_rows not in a.shape for a in arrays)
        name = type(message).__name__
        kinds[name] = kinds.get(name, 0) + 1
        if name == "SecureInput":  # uniform in the ring: nothing like an encoded upload
            assert message.masked.vector.dtype == np.uint64
            assert np.abs(encoding.decode(message.masked.vector)).max() > 1e6
    # every exchange (the initial one and three rounds) ran all four phases on every site
    assert kinds == {"held": 4 * N_SITES, "KeyAdvertisement": 4 * N_SITES,
                     "EncryptedShares": 4 * N_SITES, "SecureInput": 4 * N_SITES,
                     "UnmaskingShares": 4 * N_SITES}
    # the callback, on the server, sees the masked inputs only
    for k, uploads in enumerate(seen, start=1):
        assert sorted(uploads) == sorted(plain[k])
        assert all(type(u).__name__ == "MaskedInput" for u in uploads.values())


class _MaskedInputLost(LocalTransport):
    """The engine's local transport, but ``site``'s masked input of ``round_number`` is
    lost, as a Flower site that does not reply in time: the in-process oracle."""

    def __init__(self, blocks, site, round_number):
        super().__init__(blocks)
        self.site, self.round_number = site, round_number

    def run(self, phase, clients, broadcast, **kwargs):
        from sklearn_fedmf.engine._transport import PhaseResult
        from sklearn_fedmf.exceptions import ClientDropout

        if phase == "secure_masked_input" and kwargs["round_number"] == self.round_number:
            result = super().run(phase, [c for c in clients if c != self.site], broadcast,
                                 **kwargs)
            return PhaseResult(result.messages, {self.site: ClientDropout("lost")})
        return super().run(phase, clients, broadcast, **kwargs)


@pytest.mark.slow  # (waits for a site's time-out)
def test_a_site_that_times_out_after_the_keys_is_a_dropout_of_the_secure_sum(tmp_path,
                                                                              task_identity):
    """Its masks are removed through the other sites' shares, whatever on_client_error says;
    the model is the simulation's with the same input lost. Below the threshold the round
    has no sum: a FederationError, or a skipped round with on_client_error="skip"."""
    from sklearn_fedmf.engine._federation import initialize_federation, run_federation
    from sklearn_fedmf.exceptions import ClientFailureWarning, FederationError
    from sklearn_fedmf.flower._sites import load_site, make_site_protocol, site_block

    X, _, labels = ratings(1)
    configs = site_files(tmp_path, X, labels)
    grid = FakeGrid(configs, drop={("secure_masked_input", 1, 2)})
    flower = fit_on_grid(FedMCADMM(**SECURE), grid, min_nodes=N_SITES, timeout=0.2, wait=1)

    est = FedMCADMM(**SECURE)
    protocol = make_site_protocol(est, n_items=X.shape[1], n_clients=N_SITES,
                                  n_users=X.shape[0], mean=flower.mean_,
                                  rating_range=flower.rating_range_, n_ratings=X.nnz)
    blocks = [site_block(est, load_site(tmp_path / f"site-{c}.npz")) for c in range(N_SITES)]
    lossy = _MaskedInputLost(blocks, 1, 2)
    state, init_bytes = initialize_federation(protocol, lossy, entropy=3)
    state = run_federation(protocol, lossy, max_iter=3, entropy=3, state=state,
                           init_bytes=init_bytes)
    assert strip_seconds(state.history) == strip_seconds(flower.history_)
    assert flower.history_[1]["bytes_secure"]["masked_input"] < flower.history_[0][
        "bytes_secure"]["masked_input"]

    # two of three sites lost: below the threshold (2) the masks cannot be removed
    drop = {("secure_masked_input", 1, 2), ("secure_masked_input", 2, 2)}
    with pytest.raises(FederationError, match="round 2.*threshold"):
        fit_on_grid(FedMCADMM(**SECURE), FakeGrid(configs, drop=drop), min_nodes=N_SITES,
                    timeout=0.2, wait=1)
    skip = dict(SECURE, solver_params={**SECURE["solver_params"], "on_client_error": "skip"})
    with pytest.warns(ClientFailureWarning, match="round 2.*skipped"):
        skipped = fit_on_grid(FedMCADMM(**skip), FakeGrid(configs, drop=drop),
                              min_nodes=N_SITES, timeout=0.2, wait=1)
    assert [r.get("secure_failed", False) for r in skipped.history_] == [False, True, False]


# ---- a deployment on loopback: a SuperLink, two SuperNodes, flwr run ------------------------
# Each site runs ``python -m sklearn_fedmf.flower``: one ClientApp process for the whole fit
# and short waits, so a round takes about a second; the start (processes, imports) takes most
# of the test's time. The diagnostics are off (eval_every=0): one exchange per round.
DEPLOY_PARAMS = dict(n_components=2, max_iter=3, alpha_u=0.1, alpha_v=0.1, random_state=0,
                     center=False, eval_every=0, secure_aggregation=False)
# the second run of the same deployment: a secure fit, two rounds
SECURE_RUN = dict(secure_aggregation=True, max_iter=2)


# slow: a SuperLink and SuperNode processes on 127.0.0.1 (~30 s of wall time); the fast set
# keeps the in-process Flower tests (the same sites' code, messages and secure sums)
@pytest.mark.slow
@pytest.mark.flower
def test_loopback_deployment_fits_the_simulated_model(tmp_path):
    """A plain fit and a secure one, two runs at once on one deployment: 56 to 76 s measured
    on a busy 2-core machine (load averages 6 to 10; the plain fit alone: 41 to 61 s,
    135 to 177 s with a fresh ClientApp process per Message and Flower's 3 s waits; every
    process is ended by 240 s): marked ``flower`` so that ``-m "not flower"`` leaves it
    out."""
    from sklearn_fedmf.flower import run_loopback

    X, _, labels = ratings()
    labels = labels % 2  # two sites
    models, seconds, logs = run_loopback(X, labels, tmp_path, params=DEPLOY_PARAMS,
                                         runs=[{}, SECURE_RUN])
    # flwr run exits 0 even when the run failed: the ServerApp's output is the result
    for model, run_seconds in zip(models, seconds):
        assert model is not None, f"no model written in {run_seconds:.0f} s; logs:\n" + (
            "\n".join(f"--- {name}\n{text[-3000:]}" for name, text in logs.items()))
    flower, secure = models
    # (the app's flat config keys: center and eval_every go into solver_params, as here)
    simulated = FedMCADMM(**route_solver_params(FedMCADMM, DEPLOY_PARAMS)).fit(
        X, clients=labels)
    np.testing.assert_array_equal(flower.components_, simulated.components_)
    assert strip_seconds(flower.history_) == strip_seconds(simulated.history_)
    # the sites' keys come from their OS: other masks, the same sums, the same model
    simulated = FedMCADMM(**route_solver_params(FedMCADMM, {**DEPLOY_PARAMS, **SECURE_RUN})).fit(
        X, clients=labels)
    np.testing.assert_array_equal(secure.components_, simulated.components_)
    assert strip_seconds(secure.history_) == strip_seconds(simulated.history_)
    for site in ("supernode-0", "supernode-1"):  # one ClientApp process served every Message
        assert logs[site].count("Serving the ClientApp tasks") == 1, logs[site][-3000:]
        assert "flwr-clientapp" not in logs[site]
        # the plain run's updates and the secure run's (train.phase: its secure phases)
        assert logs[site].count("Sending: train.update") == (
            DEPLOY_PARAMS["max_iter"] + SECURE_RUN["max_iter"])
        assert logs[site].count("Sending: train.phase") == 4 * (1 + SECURE_RUN["max_iter"])
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout == "", "processes of the deployment are still running"


def test_the_warm_worker_turns_a_clientapp_exception_into_an_error_reply(monkeypatch,
                                                                        task_identity):
    """The long-lived ClientApp process catches what a ClientApp raises, as Flower's runtime
    does: the site replies with an error Message naming the exception (the server makes it
    the client's failure, above), reports the task failed, keeps no Context, and serves on."""
    from sklearn_fedmf.flower import _worker

    task = Message(RecordDict(), 7, "train")
    task.metadata.__dict__["_message_id"] = "m1"
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    pushed, outputs, closed = [], [], []

    class Client:
        def close(self):
            closed.append(True)

    class Heartbeat:
        def __init__(self, fn):
            pass

        def start(self):
            pass

        def stop(self):
            pass

    def failing_app(message, context):
        raise ValueError("site data has NaN at row 3")

    class Apps:
        def get(self, run, fab):
            return failing_app

    monkeypatch.setattr(_worker, "_runtime_client", lambda address, interceptors: Client())
    monkeypatch.setattr(_worker, "HeartbeatSender", Heartbeat)
    monkeypatch.setattr(_worker, "_pull_task_input", lambda client, poll: (task, context,
                                                                          None, None))
    monkeypatch.setattr(_worker, "push_message", lambda c, reply, ctx: pushed.append(reply))
    monkeypatch.setattr(_worker, "push_task_output",
                        lambda c, ctx, status, details: outputs.append((ctx, status, details)))
    _worker._serve_task("127.0.0.1:0", "token", Apps(), poll=0.01)  # returns: serves on
    (reply,) = pushed
    assert reply.has_error() and "site data has NaN at row 3" in reply.error.reason
    assert reply.error.code == _worker.ErrorCode.CLIENT_APP_RAISED_EXCEPTION
    ((kept, status, details),) = outputs
    assert kept is None and status == _worker.SubStatus.FAILED
    assert "ValueError" in details and closed == [True]
