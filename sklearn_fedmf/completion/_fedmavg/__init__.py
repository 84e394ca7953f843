"""FedMAvg: estimator, its round (shared with clustering), protocol per loss, batched phases,
kernels."""
