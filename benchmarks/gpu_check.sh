#!/usr/bin/env bash
# GPU check (a few minutes on one CUDA device): the paper-size model's training throughput and MFU
# in bf16 autocast with torch.compile, through the real trainer (gpt1 pretrain) on synthetic tokens,
# plus a short exact-resume check on the GPU. Record the printed figures in docs/results.md.
#
#   bash benchmarks/gpu_check.sh            # defaults: micro-batch 16, 30 steps
#   MICRO=32 STEPS=40 bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
MICRO=${MICRO:-16}
STEPS=${STEPS:-30}
WORK=${WORK:-$(mktemp -d)}
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0), torch.__version__)"

# Synthetic prepared folder: 40478-token vocabulary, 4M random tokens (throughput only).
"$PY" - "$WORK/data" <<'PYEOF'
import json, sys
from pathlib import Path
import numpy as np
from gpt1.text.shards import write_shard
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
write_shard(out / "train-00000.bin", rng.integers(0, 40478, 4_000_000), 1, 40478)
write_shard(out / "val-00000.bin", rng.integers(0, 40478, 200_000), 1, 40478)
meta = {"format": "gpt1-tokens", "version": 1, "vocab_size": 40478, "dtype": "uint16",
        "splits": {"train": {"shards": ["train-00000.bin"], "tokens": 4_000_000, "documents": 1},
                   "val": {"shards": ["val-00000.bin"], "tokens": 200_000, "documents": 1}}}
(out / "meta.json").write_text(json.dumps(meta))
PYEOF

echo "== paper model, bf16 + compile, micro-batch $MICRO x 512, global batch 64 (accumulation as needed)"
"$PY" -m gpt1 --quiet pretrain --preset gpt1 --data "$WORK/data" --out "$WORK/run" \
  --max-steps "$STEPS" --micro-batch "$MICRO" --batch-size 64 --precision bf16 --compile \
  --save-every 0 --eval-every 0 --log-every 5 --set train.warmup=5
"$PY" - "$WORK/run" <<'PYEOF'
import json, sys, statistics
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if '"loss"' in l]
late = recs[len(recs) // 2:]   # skip compilation and warm-up intervals
print(f"RESULT tokens/s {statistics.median(r['tokens_per_s'] for r in late):,.0f} | "
      f"MFU {100 * statistics.median(r['mfu'] for r in late):.1f}% | "
      f"max allocated {max(r['mem_gb'] for r in late):.1f} GB | last loss {recs[-1]['loss']:.4f}")
PYEOF

echo "== exact resume on the GPU (fp32, tiny model): kill after step 4, resume, compare"
common=(--preset tiny --data "$WORK/data" --max-steps 8 --save-every 4 --eval-every 0 --log-every 1)
"$PY" -m gpt1 --quiet pretrain "${common[@]}" --out "$WORK/full"
"$PY" -m gpt1 --quiet pretrain "${common[@]}" --out "$WORK/cut" --set train.total_steps=8 --max-steps 4
"$PY" -m gpt1 --quiet pretrain "${common[@]}" --out "$WORK/cut" --resume auto
"$PY" - "$WORK/full" "$WORK/cut" <<'PYEOF'
import json, sys
l = [[json.loads(x)["loss"] for x in open(d + "/metrics.jsonl") if '"loss"' in x] for d in sys.argv[1:]]
print("RESULT resume on GPU:", "bitwise equal" if l[0] == l[1] else f"DIFFERS {l}")
PYEOF
