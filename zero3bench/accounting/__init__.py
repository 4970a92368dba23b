"""ZeRO's accounting for one rank: measure (from the tensors), predict (the paper, DeepSpeed's estimator,
the activations: pure arithmetic) and explain (where the two differ, in words)."""
