"""Run the federation on Flower: the same protocols, with every site in its own process.

:func:`client_app` is the site's Flower ``ClientApp`` (its ratings and private state never
leave it), :func:`server_app` the ``ServerApp`` that runs the engine with the sites as its
clients (:class:`FlowerTransport`) and writes the fitted estimator, :func:`fit_on_grid` the
same fit from any Flower ``Grid``. :func:`split_sites` writes one ratings file per site;
:func:`run_loopback` runs a whole deployment on 127.0.0.1 in one call.
``python -m sklearn_fedmf.flower <flower-supernode arguments>`` runs a site whose ClientApp
process lives for the whole fit (rounds of about a second instead of several).

Needs the ``flower`` extra (``pip install "sklearn_fedmf[flower]"``; Flower needs Python
3.11 or later). See the guide "Deploying with Flower".
"""

__all__ = ["client_app", "server_app", "fit_on_grid", "FlowerTransport", "load_site",
           "split_sites", "run_loopback", "MESSAGE_TYPES"]

_FLOWER_NAMES = {"client_app": "_client", "MESSAGE_TYPES": "_client", "server_app": "_server",
                 "fit_on_grid": "_server", "FlowerTransport": "_server",
                 "run_loopback": "_loopback"}


_PLAIN_NAMES = {"load_site": "_sites", "split_sites": "_sites"}  # they need no Flower


def __getattr__(name):  # each module is imported when one of its names is asked for
    from importlib import import_module

    if name in _PLAIN_NAMES:
        return getattr(import_module(f".{_PLAIN_NAMES[name]}", __name__), name)
    if name in _FLOWER_NAMES:
        try:
            import flwr  # noqa: F401
        except ImportError as exc:
            raise ImportError(
                f"sklearn_fedmf.flower.{name} needs Flower: pip install "
                "'sklearn_fedmf[flower]' (Python >= 3.11)."
            ) from exc
        return getattr(import_module(f".{_FLOWER_NAMES[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
