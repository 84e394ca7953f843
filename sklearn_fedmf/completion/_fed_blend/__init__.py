"""FedBlend: members over one federation, blended from summed validation statistics."""
