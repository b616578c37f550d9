"""gpt1 as a model of EleutherAI's lm-evaluation-harness (`adapter`)."""
