"""The paper's analyses (Fig. 2 left, Table 5) and two beyond it, each resumable and recorded.

Modules: `sweep` (commands.txt / sweep.json bookkeeping and resumption), `positions` (learned
position embeddings: 2-D projection and cosine matrix), `runs` (one fine-tuning sub-run: the
recipe called with the settings of the `gpt1 finetune` command it records), `layers` (layers
transferred), `ablations` (Table 5 with the LSTM baseline), `data_size` (the labelled-data
curve). `gpt1 analysis ...` calls these.
"""
