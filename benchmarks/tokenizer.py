"""Tokenizer benchmark and exactness check against the faithful reference.

The reference is transformers 4.x's slow `OpenAIGPTTokenizer` with ftfy and spaCy installed,
built from the original GPT-1 files. Both run in this process, pinned to one CPU core.

    python benchmarks/tokenizer.py                # speed on the novels (ids compared too)
    python benchmarks/tokenizer.py --files 20     # all 20 novels
    python benchmarks/tokenizer.py --processes 2  # also the multi-process encoder
    python benchmarks/tokenizer.py --check        # ids on every text line of ../shared/data
    python benchmarks/tokenizer.py --check-linear # LinearSpacy vs spaCy on every piece there
    python benchmarks/tokenizer.py --runs         # long runs of punctuation: time vs length
    python benchmarks/tokenizer.py --lines 22000  # short lines: reference, encode, CLI batches

--check prints, per source, the number of lines whose ids differ. Lines holding a backslash are
counted separately: gpt1's default (OAI) does not pad backslashes while transformers does
(reference d.1.9); with standardize="hf" they must match too.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("GPT1_SHARED_DATA", ROOT.parent / "shared" / "data"))


def reference_tokenizer(vocab_dir: Path):
    """transformers' slow OpenAIGPTTokenizer from the original files (needs ftfy + spaCy)."""
    import transformers
    from transformers import OpenAIGPTTokenizer

    transformers.logging.set_verbosity_error()
    ref = OpenAIGPTTokenizer(
        str(vocab_dir / "encoder_bpe_40000.json"), str(vocab_dir / "vocab_40000.bpe")
    )
    if ref.fix_text is None:
        raise SystemExit("transformers fell back to BasicTokenizer: install ftfy and spacy")
    return ref


def _fields(row: list[str]) -> Iterator[str]:
    # sentence-like fields of a table row (ids, labels and scores hold no space)
    return (f for f in row if " " in f.strip())


def text_units(data: Path) -> Iterator[tuple[str, str]]:
    """(source, text) for every line of text in ../shared/data: corpus lines, table fields."""
    corpus = sorted((data / "corpus").rglob("*.txt"))
    for path in corpus:
        group = "novels" if path.parent.name == "gutenberg" else path.parent.name
        for line in path.read_text(encoding="utf-8").split("\n"):
            yield group, line
    tables = (
        sorted((data / "glue").rglob("*.tsv"))
        + sorted((data / "glue_kshot_samples").rglob("*.tsv"))
        + sorted(p for p in (data / "nli_samples_textfooler").iterdir() if p.suffix == "")
    )
    for path in tables:
        for line in path.read_text(encoding="utf-8").split("\n"):
            for field in _fields(line.split("\t")):
                yield "glue", field
    for path in sorted((data / "snli").glob("s[12].*")):
        for line in path.read_text(encoding="utf-8").split("\n"):
            yield "snli", line
    for path in sorted((data / "scitail").rglob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            for value in json.loads(line).values():
                if isinstance(value, str) and " " in value:
                    yield "scitail", value
    for path in sorted((data / "story_cloze").glob("*.csv")):
        with open(path, encoding="utf-8", newline="") as fh:
            for row in csv.reader(fh):
                for field in _fields(row):
                    yield "story_cloze", field


def check(data: Path, limit: int | None) -> int:
    from gpt1.text.tokenizer import Tokenizer

    vocab = data / "gpt1_tokenizer"
    ref = reference_tokenizer(vocab)
    oai, hf = Tokenizer.from_dir(vocab), Tokenizer.from_dir(vocab, standardize="hf")
    seen: set[str] = set()
    stats: dict[str, list[int]] = {}
    examples = []
    t0 = time.time()
    for source, text in text_units(data):
        if not text.strip() or text in seen:
            continue
        seen.add(text)
        if limit is not None and len(seen) > limit:
            break
        s = stats.setdefault(source, [0, 0, 0, 0, 0])  # lines, bad, backslash, bad oai, bad hf
        want = ref.encode(text)
        s[0] += 1
        if "\\" in text:
            s[2] += 1
            s[3] += oai.encode(text) != want
            bad_hf = hf.encode(text) != want
            s[4] += bad_hf
            if bad_hf and len(examples) < 5:
                examples.append((source, text))
        elif oai.encode(text) != want or hf.encode(text) != want:
            s[1] += 1
            if len(examples) < 5:
                examples.append((source, text))
    print(
        f"{'source':12s} {'lines':>8s} {'mismatch':>8s} | {'with ' + chr(92):>7s} "
        f"{'oai!=ref':>8s} {'hf!=ref':>7s}"
    )
    totals = [0] * 5
    for source, s in stats.items():
        print(f"{source:12s} {s[0]:8d} {s[1]:8d} | {s[2]:7d} {s[3]:8d} {s[4]:7d}")
        totals = [a + b for a, b in zip(totals, s)]
    print(
        f"{'total':12s} {totals[0]:8d} {totals[1]:8d} | {totals[2]:7d} {totals[3]:8d} "
        f"{totals[4]:7d}   ({time.time() - t0:.0f} s)"
    )
    for source, text in examples:
        print(f"  mismatch in {source}: {text[:120]!r}")
    return 1 if totals[1] or totals[4] else 0


def speed(data: Path, n_files: int, processes: int) -> None:
    from gpt1.text.tokenizer import Tokenizer

    vocab = data / "gpt1_tokenizer"
    novels = sorted((data / "corpus" / "gutenberg").glob("*.txt"))[:n_files]
    texts = [p.read_text(encoding="utf-8") for p in novels]
    n_bytes = sum(len(t.encode()) for t in texts)
    ref = reference_tokenizer(vocab)
    tok = Tokenizer.from_dir(vocab)
    t0 = time.perf_counter()
    want = [ref.encode(t) for t in texts]
    t_ref = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = [tok.encode(t) for t in texts]
    t_ours = time.perf_counter() - t0
    same = sum(a == b for a, b in zip(want, got))
    n_tokens = sum(map(len, got))
    print(
        f"{len(texts)} novels, {n_bytes / 1e6:.2f} MB, {n_tokens:,} tokens; "
        f"identical ids for {same}/{len(texts)} novels"
    )
    print(
        f"transformers slow OpenAIGPTTokenizer: {n_bytes / t_ref / 1e3:8.0f} KB/s ({t_ref:.1f} s)"
    )
    print(
        f"gpt1 Tokenizer (1 process, cold):     {n_bytes / t_ours / 1e3:8.0f} KB/s "
        f"({t_ours:.1f} s)  = {t_ref / t_ours:.2f}x"
    )
    if processes > 1:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
        fresh = Tokenizer.from_dir(vocab)
        t0 = time.perf_counter()
        multi = fresh.encode_batch(texts, processes=processes)
        t_multi = time.perf_counter() - t0
        print(
            f"gpt1 encode_batch, {processes} processes:  {n_bytes / t_multi / 1e3:8.0f} KB/s "
            f"({t_multi:.1f} s)  ids identical: {multi == got}"
        )


def check_linear(data: Path) -> int:
    """LinearSpacy (used for long pieces) against spaCy itself on every distinct unit (chunk,
    or linked chunks) of the shared text, in both lowercase modes, whatever its length."""
    from gpt1.text import normalize as textlib

    splitter = textlib.SpacySplitter()
    assert splitter._linear is not None
    seen: set[str] = set()
    bad = 0
    t0 = time.time()
    for _, text in text_units(data):
        for lower in (True, False):
            for unit in splitter.link(textlib.chunks(text, "oai", lower)):
                if unit in seen or unit in ("\n", textlib.UNK_SENTINEL):
                    continue
                seen.add(unit)
                want = [t.text for t in splitter._tokenizer(unit)]
                if splitter._linear(unit) != want:
                    bad += 1
                    if bad <= 5:
                        print(f"  mismatch: {unit[:120]!r}")
    print(f"{len(seen)} distinct units, {bad} differ ({time.time() - t0:.0f} s)")
    return 1 if bad else 0


RUNS = ["!", "'", ".", "-", ")", "?!", "$%", ".'", "😀", "(x)", "a", "ab", "xyzzy", "random"]
RUN_LENGTHS = (8_000, 16_000, 32_000, 100_000)


def _run_text(pattern: str, n: int) -> str:
    if pattern == "random":  # symbols and letters in no order, no whitespace
        import random

        return "".join(random.Random(n).choices("$%#&*@^=<>'\".!?()-:;,😀…’a1", k=n))
    return pattern * (n // len(pattern))


def runs(data: Path, before_limit: int) -> None:
    """Seconds to encode n characters made of one repeated pattern, with the linear path
    (now) and with spaCy alone on every piece (before; only up to --before-limit characters:
    it is quadratic). Ids are compared wherever both ran."""
    from gpt1.text.tokenizer import Tokenizer

    vocab = data / "gpt1_tokenizer"
    now, before = Tokenizer.from_dir(vocab), Tokenizer.from_dir(vocab)
    now.encode("warm up."), before.encode("warm up.")
    before._splitter._linear = None  # every piece through spaCy itself
    print(f"{'pattern':8s} {'n':>7s} {'now s':>7s} {'before s':>9s} ids")
    for pattern in RUNS:
        for n in RUN_LENGTHS:
            text = _run_text(pattern, n)
            t0 = time.perf_counter()
            got = now.encode(text)
            t_now = time.perf_counter() - t0
            t_before, same = "", ""
            if n <= before_limit:
                t0 = time.perf_counter()
                want = before.encode(text)
                t_before = f"{time.perf_counter() - t0:9.2f}"
                same = "same" if got == want else "DIFFERENT"
            print(f"{pattern!r:8s} {n:7d} {t_now:7.2f} {t_before:>9s} {same}", flush=True)
    python_bpe(now, before_limit)
    whitespace_runs(before_limit)


def whitespace_runs(before_limit: int) -> None:
    """A run of spaces with no newline: text_standardize's newline rule, now (whole runs) and
    before (OAI's regex \\s*\\n\\s*, which retries at every position of the run)."""
    import re

    from gpt1.text import normalize as textlib

    print(f"\nnewline rule on 'a' + n spaces + 'b'\n{'n':>7s} {'now s':>7s} {'before s':>9s}")
    for n in RUN_LENGTHS:
        text = "a" + " " * n + "b\nc"
        t0 = time.perf_counter()
        got = textlib._newline_runs(text, " \n ")
        t_now = time.perf_counter() - t0
        t_before, same = "", ""
        if n <= before_limit:
            t0 = time.perf_counter()
            same = "same" if re.sub(r"\s*\n\s*", " \n ", text) == got else "DIFFERENT"
            t_before = f"{time.perf_counter() - t0:9.2f}"
        print(f"{n:7d} {t_now:7.3f} {t_before:>9s} {same}", flush=True)


def python_bpe(tok, before_limit: int) -> None:
    """The Python BPE (vocabularies without "<unk>" cannot use `tokenizers`) on one long word
    of random letters: the heap version (now) and the rescanning one (before)."""
    import random

    from gpt1.text.tokenizer import bpe, bpe_heap

    print(
        f"\nPython BPE, one word of n random letters\n{'n':>7s} {'heap s':>7s} "
        f"{'rescan s':>9s} pieces"
    )
    for n in RUN_LENGTHS:
        word = "".join(random.Random(n).choices("abcdefghijklmnopqrstuvwxyz", k=n))
        t0 = time.perf_counter()
        got = bpe_heap(word, tok.ranks)
        t_heap = time.perf_counter() - t0
        t_before, same = "", ""
        if n <= before_limit:
            t0 = time.perf_counter()
            same = "same" if bpe(word, tok.ranks) == got else "DIFFERENT"
            t_before = f"{time.perf_counter() - t0:9.2f}"
        print(f"{n:7d} {t_heap:7.2f} {t_before:>9s} {same}", flush=True)


def short_lines(data: Path, n_lines: int) -> None:
    """Short sentences (SST-2 training sentences), one process: the reference line by line,
    gpt1 `encode` line by line (what `gpt1 tokenizer encode` did), and the command's own
    batched path (`encode_lines`)."""
    from gpt1.cli.tokenizer import encode_lines
    from gpt1.text.tokenizer import Tokenizer

    vocab = data / "gpt1_tokenizer"
    lines = []
    with open(data / "glue" / "SST-2" / "train.tsv", encoding="utf-8") as fh:
        next(fh)
        for row in fh:
            lines.append(row.split("\t")[0])
            if len(lines) == n_lines:
                break
    n_bytes = sum(len(t.encode()) for t in lines)
    ref = reference_tokenizer(vocab)
    t0 = time.perf_counter()
    want = [" ".join(map(str, ref.encode(t))) for t in lines]
    t_ref = time.perf_counter() - t0
    times = {}
    for name in ("encode per line", "tokenizer encode (batched)"):
        tok = Tokenizer.from_dir(vocab)
        tok.encode("warm up.")  # spaCy loaded, as in the command before its first line
        t0 = time.perf_counter()
        if name == "encode per line":
            got = [" ".join(map(str, tok.encode(t))) for t in lines]
        else:
            got = list(encode_lines(tok, iter(lines)))
        times[name] = time.perf_counter() - t0
        assert got == want, f"{name}: ids differ from the reference"
    print(f"{len(lines)} lines, {n_bytes / 1e6:.2f} MB; ids identical to the reference")
    print(f"transformers slow OpenAIGPTTokenizer: {t_ref:6.2f} s")
    for name, t in times.items():
        print(f"gpt1 {name:27s}: {t:6.2f} s  = {t_ref / t:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exactness on all shared text")
    parser.add_argument("--limit", type=int, default=None, help="--check at most N lines")
    parser.add_argument("--files", type=int, default=4, help="novels for the speed run")
    parser.add_argument("--processes", type=int, default=1, help="also time encode_batch")
    parser.add_argument(
        "--check-linear",
        action="store_true",
        help="LinearSpacy vs spaCy on every distinct piece of the shared text",
    )
    parser.add_argument("--runs", action="store_true", help="long runs of punctuation")
    parser.add_argument(
        "--before-limit",
        type=int,
        default=8_000,
        help="--runs: longest input for the quadratic spaCy-only path",
    )
    parser.add_argument("--lines", type=int, default=0, help="short lines: the CLI's batches")
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    if not (args.data / "gpt1_tokenizer").is_dir():
        raise SystemExit(f"shared data not found at {args.data} (set GPT1_SHARED_DATA)")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core, both sides
    if args.check:
        return check(args.data, args.limit)
    if args.check_linear:
        return check_linear(args.data)
    if args.runs:
        runs(args.data, args.before_limit)
        return 0
    if args.lines:
        short_lines(args.data, args.lines)
        return 0
    speed(args.data, args.files, args.processes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
