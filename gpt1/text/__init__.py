"""Text: the paper's cleaning, the BPE tokenizer, token shards and pretraining windows."""
