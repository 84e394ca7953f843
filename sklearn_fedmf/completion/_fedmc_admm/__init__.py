"""FedMC-ADMM: estimator, protocol per loss, batched phases, kernels."""
