"""The server: runs the federation and writes the fitted estimator (run config ``output``)."""

from sklearn_fedmf.flower import server_app

app = server_app()
