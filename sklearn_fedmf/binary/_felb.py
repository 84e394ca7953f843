"""Felb and Felb-MU: federated binary matrix factorization by proximal optimization.

Dalleiger, Vreeken and Kamp, Algorithm 1 (with the gaps of the paper resolved as documented
below and in the user guide). One engine round is
one synchronization: every client runs ``sync_every`` (b) Gauss-Seidel iPALM steps on its
private ``U_i`` and its copy ``V_i`` (pulled towards the last ``Vh``), then uploads ``V_i``
(k x m, privatized when DP is on); the server averages the uploads and applies the Elb prox
with the current ``lambda_t``; the clients restart from the broadcast ``Vh``. The broadcast
also carries the global local-step counter ``t``, which fixes ``lambda_t`` on every client.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.utils._param_validation import Interval, StrOptions

from .._docstrings import SHARED_PARAMETERS, Substitution, federation_keys
from ..engine._fit import FEDERATION_KEYS, resolve_solver_params
from ._base import ELB_CONSTRAINTS, BooleanFactorizationBase, elb_solver_params
from ._felb_protocol import make_protocol

__all__ = ["Felb"]


# ---- estimator ----------------------------------------------------------------------------
@Substitution(**SHARED_PARAMETERS, federation_keys=federation_keys())
class Felb(BooleanFactorizationBase):
    """Federated Boolean matrix factorization by proximal optimization (Felb and Felb-MU).

    The rows of a binary matrix ``A`` are held by clients. Each client fits its rows as
    ``A_i ~ U_i o Vh`` through a continuous relaxation: iPALM steps on a private ``U_i`` and a
    local copy ``V_i`` with the Elb regularizer (two elastic nets centred at 0 and 1, whose
    weight ``lambda_t`` grows every step and drives the factors to {0, 1}) and a proximity pull
    ``gamma`` towards the global ``Vh``. Every ``sync_every`` steps the clients upload ``V_i``
    (k x m, optionally differentially private), the server sets ``Vh`` to the Elb prox of their
    average, and the clients continue from ``Vh``. ``U_i`` and ``A_i`` never leave a client.
    At the end every factor is rounded at 1/2, so ``components_`` and the reconstructions are
    exactly Boolean.

    Parameters
    ----------
    n_components : int, default=10
        Number of Boolean components ``k``.
    sync_every : int, default=10
        Local steps ``b`` between two synchronizations (the paper's local rounds).
    max_iter : int, default=100
        Synchronizations ``T`` (communication rounds); ``T * sync_every`` local steps in all.
    lam : float, default=0.1
        Initial quadratic weight ``lambda`` of the Elb regularizer; it grows every local step
        (``solver_params["growth"]``) and drives the factors to {0, 1}.
    gamma : float, default=1.0
        Weight of the proximity pull of ``V_i`` towards the last ``Vh`` (the paper leaves it
        open; 1 and 10 both recover planted tiles, 0 degrades Felb-MU).
    %(privacy)s
        Felb's upload is ``V_i`` (k x m), the only thing a client sends: ``"auto"`` is
        Gaussian noise per entry; ``"laplace"`` and randomized response (``"bernoulli"``)
        are supported too. ``clip=1.5`` bounds the relaxed entries with room to spare.
    n_clients : int, default=10
        %(n_clients)s
    binarize : float or None, default=None
        %(binarize)s
    tol : float, default=0.0
        Stop when the relative change of the relaxed objective between syncs is below ``tol``.
    solver_params : dict or None, default=None
        The paper's step constants and variant switches (Appendix D's settings and the
        resolutions of the user guide); a key left out keeps its default:

        %(federation_keys)s
        - ``kappa`` : float, default=1e-3
          L1 weight of the Elb regularizer (constant).
        - ``growth`` : float, default=1.05
          ``lambda_t = min(lam * growth**t, lam_max)``.
        - ``lam_max`` : float, default=1e12
          Cap of ``lambda_t`` (``1.05**t`` overflows near ``t = 14500``).
        - ``rate_unit`` : {"local", "sync"}, default="local"
          ``t`` counts local steps, or synchronizations (exponent ``t // sync_every``).
        - ``inertia`` : float in [0, 1), default=1e-3
          iPALM inertia ``beta`` (0 is plain PALM); the V inertia is reset at every synchronization.
        - ``update`` : {"palm", "mu"}, default="palm"
          ``"palm"``: Felb, steps ``step_scale / max(||Gram||_F, 1e-4)``. ``"mu"``: Felb-MU,
          per-entry multiplicative-update steps ``Xbar / (Xbar Gram)``, evaluated at the
          extrapolated point clamped at 0 (entries that reach exactly 0 stay 0: zeros of ``Vh`` are
          absorbing, a faithful consequence of the method).
        - ``prox_mode`` : {"exact_nonneg", "exact", "paper", "paper_nonneg"}, default="exact_nonneg"
          The exact prox of the Elb regularizer on ``x >= 0`` (a correction of eq. 6), or the
          paper's eq. 6 (which omits the soft-threshold dead zones), clamped at 0 or not.
        - ``proximity`` : {"sequential", "joint"}, default="sequential"
          The paper's Elb prox followed by the proximity prox, or their exact joint prox.
        - ``step_scale`` : float > 0, default=1.0
          Multiplies the Lipschitz steps (``update="palm"`` only).
        - ``server_step`` : float > 0 or "1/C", default=1.0
          Step ``eta_s`` of the server's Elb prox; ``"1/C"`` is the exact minimizer of the server
          subproblem.

        ``Felb(solver_params={"update": "mu"})`` is Felb-MU.
    callback : callable, default=None
        %(callback)s
    random_state : int, RandomState instance or None, default=None
        Seeds the partition, the initialization and the privacy noise.
    n_jobs : int, default=None
        %(n_jobs)s
    verbose : int, default=0
        %(verbose)s
    secure_aggregation : bool or SecureAggregation, default=False
        %(secure_aggregation)s

    Attributes
    ----------
    components_ : ndarray of bool, shape (n_components, n_features)
        The global Boolean factor ``Vh > 1/2``.
    components_relaxed_ : ndarray of shape (n_components, n_features)
        The relaxed ``Vh`` before rounding.
    user_factors_ : ndarray of bool, shape (n_samples, n_components)
        The clients' Boolean ``U_i > 1/2`` in row order (kept for analysis only; in a real
        federation they never leave their client).
    user_factors_relaxed_ : ndarray of shape (n_samples, n_components)
    n_iter_ : int
        Synchronizations run.
    n_clients_ : int
    clients_ : ndarray of shape (n_samples,)
        Client label of each row.
    history_ : list of dict
        One record per synchronization: ``objective`` (relaxed Phi at ``lambda_t``), ``f1``
        and ``rmsd`` of the Boolean model on the training rows, ``integrality_gap_u``,
        ``integrality_gap_v``, ``integrality_gap_v_max``, ``lambda_t``, ``bytes_uploaded``,
        ``bytes_downloaded``, ``seconds``.
    %(privacy_attributes)s
    converged_ : bool
        False when ``tol`` > 0 was not met within ``max_iter`` rounds.
    degenerate_ : str or None
        Why the fitted model is trivial (an all-zero Boolean reconstruction), or None. A
        fit that ends with ``converged_`` False or a ``degenerate_`` reason raises one
        :class:`~sklearn_fedmf.exceptions.DegenerateFitWarning`.
    n_features_in_ : int

    See Also
    --------
    sklearn_fedmf.binary.AggregatedBMF : One-shot aggregation of local factorizations.

    References
    ----------
    S. Dalleiger, J. Vreeken, M. Kamp. Federated Binary Matrix Factorization using Proximal
    Optimization.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.binary import Felb
    >>> X = np.zeros((40, 12), dtype=int)
    >>> X[:20, :6] = 1
    >>> X[20:, 6:] = 1
    >>> model = Felb(n_components=2, n_clients=4, max_iter=30, random_state=0).fit(X)
    >>> model.components_.dtype, model.score(X)
    (dtype('bool'), 1.0)
    """

    _parameter_constraints: dict = {
        **BooleanFactorizationBase._parameter_constraints,
        "sync_every": [Interval(Integral, 1, None, closed="left")],
        "max_iter": [Interval(Integral, 1, None, closed="left")],
        "lam": ELB_CONSTRAINTS["lam"],
        "gamma": [Interval(Real, 0, None, closed="left")],
        "tol": [Interval(Real, 0, None, closed="left")],
        "solver_params": [dict, None],
    }
    _solver_params: dict = {
        **FEDERATION_KEYS,
        **elb_solver_params(kappa=1e-3, growth=1.05, lam_max=1e12, inertia=1e-3, update="palm",
                            prox_mode="exact_nonneg"),
        "rate_unit": ("local", [StrOptions({"local", "sync"})]),
        "proximity": ("sequential", [StrOptions({"sequential", "joint"})]),
        "step_scale": (1.0, [Interval(Real, 0, None, closed="neither")]),
        "server_step": (1.0, [Interval(Real, 0, None, closed="neither"), StrOptions({"1/C"})]),
    }
    _moved_params = {key: f"solver_params['{key}']" for key in _solver_params}

    def __init__(
        self,
        n_components=10,
        *,
        sync_every=10,
        max_iter=100,
        lam=0.1,
        gamma=1.0,
        privacy=None,
        n_clients=10,
        binarize=None,
        tol=0.0,
        solver_params=None,
        callback=None,
        random_state=None,
        n_jobs=None,
        verbose=0,
        secure_aggregation=False,
    ):
        super().__init__(
            n_components, binarize=binarize, n_clients=n_clients, callback=callback,
            random_state=random_state, n_jobs=n_jobs, verbose=verbose,
            secure_aggregation=secure_aggregation,
        )
        self.sync_every = sync_every
        self.max_iter = max_iter
        self.lam = lam
        self.gamma = gamma
        self.privacy = privacy
        self.tol = tol
        self.solver_params = solver_params

    def _make_protocol(self, ctx):
        solver = {key: value for key, value in resolve_solver_params(self).items()
                  if key not in FEDERATION_KEYS}  # (the skeleton reads those)
        solver["beta"] = solver.pop("inertia")
        return make_protocol(
            n_items=ctx.n_features, n_clients=ctx.n_clients, n_components=self.n_components,
            sync_every=self.sync_every, lam=self.lam, gamma=self.gamma,
            privacy=ctx.info.privacy, **solver,
        )

    def _collect(self, state, blocks, ctx):
        Vh = state.server_state["Vh"]
        U = self._stack_rows(blocks, [s["U"] for s in state.client_states],
                             self.n_components, np.float64)
        self.components_relaxed_ = Vh
        self.components_ = Vh > 0.5
        self.user_factors_relaxed_ = U
        self.user_factors_ = U > 0.5
        self._read_privacy_spent(ctx.info.privacy, state.n_uploads)

    def _privacy_upload(self, n_items):
        return (self.n_components, n_items), self.max_iter  # V_i, at most once per round

    def _fold_in_params(self):
        solver = resolve_solver_params(self)
        return dict(n_steps=self.max_iter * self.sync_every, kappa=solver["kappa"],
                    lam=self.lam, growth=solver["growth"], lam_max=solver["lam_max"],
                    rate_unit=solver["rate_unit"], sync_every=self.sync_every,
                    beta=solver["inertia"], update=solver["update"],
                    prox_mode=solver["prox_mode"], step_scale=solver["step_scale"])
