"""``_threads.one_thread``: threadpoolctl's limit through one cached controller."""

from threadpoolctl import threadpool_info

from sklearn_fedmf._threads import one_thread


def _threads(user_api):
    return {i["filepath"]: i["num_threads"] for i in threadpool_info()
            if i["user_api"] == user_api}


def test_one_thread_limits_every_blas_library_and_restores_it():
    before = _threads("blas")
    assert before  # numpy's BLAS at least
    with one_thread("blas"):
        assert set(_threads("blas").values()) == {1}
    assert _threads("blas") == before


def test_nested_limits_restore_the_outer_one():
    with one_thread("blas"):
        inside = _threads("blas")
        with one_thread("openmp"):
            assert set(_threads("openmp").values()) <= {1}
            assert _threads("blas") == inside
        assert _threads("blas") == inside
