"""sklearn_fedmf's protocols as a Flower app."""
