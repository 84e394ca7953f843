"""Dense references of ``loss="implicit"`` (tests only): every user-item pair, in loops."""

import numpy as np
import scipy.sparse as sp


def tiny(seed=0, m=6, n=5, r=2):
    """6 users x 5 items, rank 2: interactions with strengths 1..5, factors."""
    rng = np.random.default_rng(seed)
    mask = rng.random((m, n)) < 0.45
    mask[np.arange(m), rng.integers(0, n, m)] = True  # every user interacted
    X = sp.csr_matrix(np.where(mask, rng.integers(1, 6, (m, n)), 0).astype(float))
    return X, rng.normal(size=(m, r)), rng.normal(size=(n, r))


def planted_interactions(m=80, n=40, seed=0):
    """Interactions whose choice follows a planted rank-2 affinity (strengths 1..5)."""
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(m, 2)) @ rng.normal(size=(2, n))
    mask = rng.random((m, n)) < 1 / (1 + np.exp(-(2 * A - 2.5)))
    mask[np.arange(m), np.argmax(A, axis=1)] = True
    return sp.csr_matrix(np.where(mask, rng.integers(1, 6, (m, n)), 0).astype(float))


def dense_parts(X):
    """``(P, C)`` over every pair: preference 1 at a stored entry, confidence strength ``r``
    there (0 elsewhere)."""
    X = X.tocsr()
    P = np.zeros(X.shape)
    R = np.zeros(X.shape)
    for u in range(X.shape[0]):
        for s in range(X.indptr[u], X.indptr[u + 1]):
            P[u, X.indices[s]] = 1.0
            R[u, X.indices[s]] = X.data[s]
    return P, R


def dense_implicit_objective(X, U, Vt, *, confidence, alpha_u=0.0, alpha_v=0.0):
    """``1/2 sum_{u,i} c_ui (p_ui - u.v_i)^2 + alpha_u/2 ||U||^2 + alpha_v/2 ||V||^2``."""
    P, R = dense_parts(X)
    total = 0.0
    for u in range(P.shape[0]):
        for i in range(P.shape[1]):
            c = 1.0 + confidence * R[u, i]
            total += c * (P[u, i] - U[u] @ Vt[i]) ** 2
    return 0.5 * total + 0.5 * alpha_u * np.sum(U ** 2) + 0.5 * alpha_v * np.sum(Vt ** 2)


def _dense_data_gradients(X, U, Vt, *, confidence):
    """The gradients in ``U`` and ``Vt`` of the data term ``1/2 sum c (p - u.v)^2``, pair
    by pair."""
    P, R = dense_parts(X)
    gU, gV = np.zeros_like(U), np.zeros_like(Vt)
    for u in range(P.shape[0]):
        for i in range(P.shape[1]):
            e = (1.0 + confidence * R[u, i]) * (U[u] @ Vt[i] - P[u, i])
            gU[u] += e * Vt[i]
            gV[i] += e * U[u]
    return gU, gV


def dense_item_gradient(X, U, Vt, *, confidence):
    """The gradient in ``Vt`` of the data term, pair by pair."""
    return _dense_data_gradients(X, U, Vt, confidence=confidence)[1]


def dense_user_gradient(X, U, Vt, *, confidence):
    """The gradient in ``U`` of the data term, pair by pair."""
    return _dense_data_gradients(X, U, Vt, confidence=confidence)[0]


def dense_user_factors(X, Vt, *, confidence, alpha_u):
    """Each row's minimizer from the dense normal equations ``(V^T C_u V + alpha I) u =
    V^T C_u p_u``."""
    P, R = dense_parts(X)
    r = Vt.shape[1]
    U = np.zeros((P.shape[0], r))
    for u in range(P.shape[0]):
        C = np.diag(1.0 + confidence * R[u])
        U[u] = np.linalg.solve(Vt.T @ C @ Vt + alpha_u * np.eye(r), Vt.T @ C @ P[u])
    return U


def dense_preference_confidence(X, confidence):
    """``(P, C)``: preference 1 at the stored entries of the sparse ``X`` and 0 elsewhere;
    confidence ``1 + confidence * r`` there and 1 elsewhere."""
    P, R = dense_parts(X)
    return P, 1.0 + confidence * R


def dense_implicit_gradients(X, U, Vt, *, confidence):
    """Gradients of ``sum c (p - u . v)^2`` (no 1/2) in ``U`` and ``Vt``, pair by pair."""
    gU, gV = _dense_data_gradients(X, U, Vt, confidence=confidence)
    return 2.0 * gU, 2.0 * gV


def top_movies_leave_one_out():
    """The embedded MovieLens on its 300 most rated movies (users with 5+ ratings), one
    rating per user held out (``leave_one_out_split``, seed 0): ``(train, hit_rate)`` where
    ``hit_rate(scores)`` is the HR@10 of full rankings of the unseen items by ``scores``."""
    from sklearn_fedmf.datasets import load_movielens
    from sklearn_fedmf.metrics import hit_rate_at_k
    from sklearn_fedmf.model_selection import leave_one_out_split

    X = load_movielens().X
    keep = np.argsort(-np.diff(X.tocsc().indptr))[:300]  # the 300 most rated movies
    X = X[:, keep].tocsr()
    X = X[np.diff(X.indptr) >= 5]
    coo = X.tocoo()
    train_df, test_df = leave_one_out_split(np.column_stack([coo.row, coo.col, coo.data]),
                                            random_state=0)
    t = np.asarray(train_df)
    train = sp.csr_matrix((t[:, 2], (t[:, 0].astype(int), t[:, 1].astype(int))),
                          shape=X.shape)
    test = np.asarray(test_df)
    users, items = test[:, 0].astype(int), test[:, 1].astype(int)

    def hit_rate(scores):
        scores = np.where(train.toarray() > 0, -np.inf, scores)[users]
        top = np.argsort(-scores, axis=1, kind="stable")[:, :10]
        return hit_rate_at_k([[i] for i in items], top, k=10)

    return train, hit_rate


def popularity_scores(train):
    """Every user's scores of most-popular: each item's interaction count."""
    return np.tile(np.diff(train.tocsc().indptr).astype(float), (train.shape[0], 1))
