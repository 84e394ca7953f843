"""RFRec and RFRecF: estimator, protocol per loss, batched phases, kernels."""
