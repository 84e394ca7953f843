"""The best round's copy (``_early_stopping.snapshot``): what the rounds after it write in
place does not reach it, constant arrays are shared, the previous copy's buffers are reused."""

import copy

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from sklearn_fedmf.engine import _early_stopping
from sklearn_fedmf.engine._early_stopping import snapshot
from sklearn_fedmf.engine._groups import GroupStates

from .test_validation import FAST, SEED, ratings


def arrays(obj):
    """The arrays of a nested state, in a fixed order."""
    if isinstance(obj, np.ndarray):
        return [obj]
    if isinstance(obj, dict):
        return [a for key in sorted(obj, key=str) for a in arrays(obj[key])]
    if isinstance(obj, (list, tuple)):
        return [a for item in obj for a in arrays(item)]
    return []


def live(state):
    states = state.client_states
    kept = states.group_states if isinstance(states, GroupStates) else states
    return state.server_state, state.broadcast, list(kept)


# the protocols whose rounds write their states in place: FedMGS's server cache of the
# clients' aggregates; one client per user in groups, RFRec's per-(client, item) state and
# FedMC-ADMM's rated rows (the other states are replaced, not written)
MUTATING = [("FedMGS", None), ("RFRec", 1), ("FedMCADMM", 1)]


@pytest.mark.parametrize("name, group_min", MUTATING)
def test_in_place_updates_after_the_copy_leave_it_unchanged(name, group_min, monkeypatch):
    """At every best round after the first, the copy kept at the previous best still holds
    that round's values (a deep copy taken beside it), although the live state's arrays
    of that round were written in place since (checked: the test is not vacuous)."""
    if group_min is not None:
        monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", group_min)
    checks = {"kept": 0, "written": 0}
    previous = {}
    keep = _early_stopping._BestRound._keep

    def checked_keep(self, state):
        if previous:
            for kept, reference in zip(arrays(self.kept), arrays(previous["reference"])):
                assert_array_equal(kept, reference)
            checks["kept"] += 1
            checks["written"] += any(
                not np.array_equal(a, r) for a, r in zip(previous["live"],
                                                         arrays(previous["reference"]))
                if a.shape == r.shape)
        keep(self, state)
        previous["reference"] = copy.deepcopy(live(state))
        previous["live"] = arrays(live(state))

    monkeypatch.setattr(_early_stopping._BestRound, "_keep", checked_keep)
    X = ratings(n_users=60)
    clients = np.arange(X.shape[0]) if group_min is not None else np.arange(60) % 4
    model = FAST[name](max_iter=25, early_stopping=True, validation_fraction=0.2,
                       n_iter_no_change=25, random_state=SEED).fit(X, clients=clients)
    if group_min is not None:
        assert isinstance(model._federation.client_states, GroupStates)
    assert checks["kept"] >= 3
    assert checks["written"] >= 1  # some array of the kept state was written in place


def test_snapshot_shares_constants_reuses_buffers_and_keeps_aliases():
    V = np.arange(6.0).reshape(2, 3)
    layout = np.arange(4)
    layout.flags.writeable = False
    view = layout[1:]  # (read-only, of a read-only array: constant)
    open_view = np.arange(3.0)[1:]
    open_view.flags.writeable = False  # (read-only view of a writeable array: copied)
    F = np.asfortranarray(V + 1)
    state = ({"Vt": V, "layout": layout, "view": view, "open": open_view, "F": F},
             {"Vt": V}, [{"U": V[:, :2], "scalar": 1.5}])
    first = snapshot(state)
    assert first[0]["layout"] is layout and first[0]["view"] is view
    assert first[0]["open"] is not open_view
    assert first[0]["Vt"] is first[1]["Vt"] is not V  # one copy of an array reached twice
    assert first[0]["F"].flags.f_contiguous  # (deepcopy's memory order)
    V[0, 0] = -1.0  # in place, after the copy
    assert first[0]["Vt"][0, 0] == 0.0 and first[2][0]["U"][0, 0] == 0.0
    buffer = first[0]["Vt"]
    second = snapshot(state, first)
    assert second[0]["Vt"] is buffer and second[1]["Vt"] is buffer  # reused, once
    assert second[0]["Vt"][0, 0] == -1.0 and second[0]["F"] is first[0]["F"]
    for a, b in zip(arrays(second), arrays(copy.deepcopy(state))):
        assert_array_equal(a, b)


def fitted(model):
    """A fit's arrays (fitted attributes) and its validation RMSE per round."""
    out = {k: v for k, v in vars(model).items() if k.endswith("_") and isinstance(v, np.ndarray)}
    out["validation"] = np.array([r.get("validation_rmse", np.nan) for r in model.history_])
    return out


@pytest.mark.parametrize("name, group_min", MUTATING + [("FedMAvg", 1)])
def test_a_spilled_copy_restores_the_same_fit(name, group_min, monkeypatch):
    """With every best round's copy written to the spill file (``spill_bytes=0``, every
    array spilled), the fit is the in-memory copy's, bit for bit; the copy held spilled
    arrays (the test is not vacuous), and the best round is not the last (it was restored:
    ``tol=0.03`` counts only improvements of the validation RMSE by 0.03 as new bests)."""
    import functools

    import sklearn_fedmf.completion._validation as validation

    if group_min is not None:
        monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", group_min)
    X = ratings(n_users=60)
    clients = np.arange(X.shape[0]) if group_min is not None else np.arange(60) % 4

    def fit():
        return FAST[name](max_iter=25, early_stopping=True, validation_fraction=0.2,
                          n_iter_no_change=3, tol=0.03, random_state=SEED).fit(
                              X, clients=clients)

    reference = fitted(fit())
    counts = {"written": 0, "read": 0}
    write, read = _early_stopping._Spill.write, _early_stopping._Spill.read

    def counted(method, key):
        def wrapped(self, *args):
            counts[key] += 1
            return method(self, *args)
        return wrapped

    monkeypatch.setattr(_early_stopping._Spill, "write", counted(write, "written"))
    monkeypatch.setattr(_early_stopping._Spill, "read", counted(read, "read"))
    monkeypatch.setattr(_early_stopping, "_SPILL_MIN", 0)
    monkeypatch.setattr(validation, "EarlyStopping",
                        functools.partial(_early_stopping.EarlyStopping, spill_bytes=0))
    model = fit()
    spilled = fitted(model)
    assert counts["written"] >= 2 and counts["read"] >= 1
    assert model.best_iteration_ < len(model.history_)
    assert spilled.keys() == reference.keys()
    for key in reference:
        assert_array_equal(spilled[key], reference[key], err_msg=key)


def test_spill_reads_back_into_the_live_buffers_with_aliases_and_order():
    spill = _early_stopping._Spill()
    V = np.arange(6.0).reshape(2, 3)
    F = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    layout = np.arange(4)
    layout.flags.writeable = False

    class Opaque:  # (an object the copy does not walk: deep-copied, holding V)
        def __init__(self, a):
            self.a = a

    holder = Opaque(V)
    state = ({"V": V, "F": F, "layout": layout, "holder": holder, "x": 1.5}, {"V": V},
             [{"U": np.ones((2, 2)), "P": np.full(3, 7.0)}])
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_early_stopping, "_SPILL_MIN", 0)
        kept = snapshot(state, spill=spill)
    assert kept[0]["layout"] is layout
    # V is shared with the opaque object: one in-memory copy, never a spilled one
    assert isinstance(kept[0]["V"], np.ndarray) and kept[0]["holder"].a is kept[0]["V"]
    assert isinstance(kept[0]["F"], _early_stopping._Spilled)
    assert isinstance(kept[2][0]["P"], _early_stopping._Spilled)
    reference = copy.deepcopy(state)
    U_live, F_live = state[2][0]["U"], state[0]["F"]
    U_live += 1.0  # the rounds after the copy write the live state in place
    F_live[:] = -1.0
    state[2][0]["P"] = np.zeros(5)  # (replaced by an array of another shape)
    out = _early_stopping._unspill(kept, state, spill, {}, set())
    spill.close()
    assert out[2][0]["U"] is U_live and out[0]["F"] is F_live  # read into the live buffers
    assert out[0]["F"].flags.f_contiguous
    assert out[2][0]["P"] is not state[2][0]["P"]
    assert out[0]["V"] is out[1]["V"] is out[0]["holder"].a
    for a, b in zip(arrays(out), arrays(reference)):
        assert_array_equal(a, b)
    assert out[0]["x"] == 1.5


def test_a_copy_that_cannot_be_spilled_stays_in_memory(monkeypatch):
    """When the spill file cannot be written (``OSError``: no room), the copy is kept in
    memory and the fit is the same; the file is closed."""
    import functools

    import sklearn_fedmf.completion._validation as validation

    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1)
    X = ratings(n_users=60)

    def fit():
        return FAST["FedMGS"](max_iter=25, early_stopping=True, validation_fraction=0.2,
                              n_iter_no_change=3, tol=0.03, random_state=SEED).fit(
                                  X, clients=np.arange(60))

    reference = fitted(fit())
    closed = []

    def full(self, a):
        raise OSError(28, "No space left on device")

    close = _early_stopping._Spill.close
    monkeypatch.setattr(_early_stopping._Spill, "write", full)
    monkeypatch.setattr(_early_stopping._Spill, "close",
                        lambda self: closed.append(1) or close(self))
    monkeypatch.setattr(_early_stopping, "_SPILL_MIN", 0)
    monkeypatch.setattr(validation, "EarlyStopping",
                        functools.partial(_early_stopping.EarlyStopping, spill_bytes=0))
    model = fit()
    assert closed and model.best_iteration_ < len(model.history_)
    for key, value in fitted(model).items():
        assert_array_equal(value, reference[key], err_msg=key)
