"""FedBaseline: the biases-only yardstick."""
