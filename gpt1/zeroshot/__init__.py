"""Zero-shot: the paper's heuristics and the zero-shot task table (`heuristics`), the
zero-shot-only datasets (`data`), and the evaluation of checkpoints with the curve over a run
(`curve`); they score with `gpt1.inference.scoring`."""
