"""Helpers for testing gpt1 and programs built on it: fault injection (`gpt1.testing.faults`)."""
