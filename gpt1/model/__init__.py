"""Models: GPT-1 and its CPU fast paths, the LSTM baseline, task heads, checkpoints and the registry."""
