#!/usr/bin/env bash
# Fresh-machine check: clone this repository into a temporary folder and run the README's
# two commands there, exactly as a newcomer would: `make demo`, then `make test`. Nothing installed by
# hand is used: the clone builds its own .venv (pinned CPU torch first). Prints each step's time,
# and fails a step that was ever silent for more than 15 s (scripts/watch_silence.py).
#
#   scripts/fresh_machine_check.sh            # clones the current checkout's HEAD
#   KEEP=1 scripts/fresh_machine_check.sh     # keep the temporary folder afterwards
set -euo pipefail
SRC="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d -t gpt1-fresh-XXXXXX)"
cleanup() { if [ -z "${KEEP:-}" ]; then rm -rf "$WORK"; else echo "kept $WORK"; fi; }
trap cleanup EXIT
# Tests that read ../shared/data find it beside the clone, as CI lays it out.
if [ -d "$SRC/../shared" ]; then ln -s "$(cd "$SRC/../shared" && pwd)" "$WORK/shared"; fi
echo "== clone $SRC (HEAD $(git -C "$SRC" rev-parse --short HEAD)) into $WORK/gpt1"
git clone --quiet "$SRC" "$WORK/gpt1"
cd "$WORK/gpt1"
step() {
  local name="$1"; shift
  local start=$SECONDS
  echo "== $name"
  python3 "$SRC/scripts/watch_silence.py" --limit 15 -- "$@"
  echo "== $name: ok in $((SECONDS - start)) s"
}
step "make demo" make demo
step "make test" make test
echo "== fresh-machine check passed"
