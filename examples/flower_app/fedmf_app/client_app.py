"""A site: serves the protocol's client phases on the ratings its node config names."""

from sklearn_fedmf.flower import client_app

app = client_app()
