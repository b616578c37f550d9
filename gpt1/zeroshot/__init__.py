"""Zero-shot: the batched log-likelihood scorer, the paper's heuristics and their datasets."""
