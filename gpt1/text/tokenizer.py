"""The GPT-1 tokenizer: vocabulary files, BPE with `</w>`, special tokens, encode/decode, training.

Pipeline (OAI text_utils.py, reference a.3): ftfy -> text_standardize -> spaCy English tokenizer
-> lowercase -> BPE -> ids, unknown -> 0; the text steps live in `gpt1.text.normalize`. Ids are identical
to transformers 4.x's slow `OpenAIGPTTokenizer` with ftfy and spaCy installed (checked on a
large public corpus by benchmarks/tokenizer.py --check). Speed comes from caching the ids of every
whitespace-delimited chunk, so spaCy and BPE run once per distinct chunk.
Time is linear in the input: long pieces go through `gpt1.text.spacy_linear` instead of spaCy's
quadratic affix loop, and BPE runs in `tokenizers` (or `bpe_heap` when the merges are in
learned order), never rescanning a word.

Special tokens `_start_`, `_delimiter_`, `_classify_` follow the vocabulary (40478, 40479, 40480
for the original files); `encode` never adds them.
"""

from __future__ import annotations

import heapq
import json
import logging
from collections.abc import Iterable, Sequence
from itertools import chain
from pathlib import Path

from gpt1.errors import DataError
from gpt1.text import normalize as textlib
from gpt1.text.pool import open_pool

log = logging.getLogger(__name__)

ORIGINAL_FILES = ("encoder_bpe_40000.json", "vocab_40000.bpe")
HF_FILES = ("vocab.json", "merges.txt")
SPECIAL_TOKENS = ("_start_", "_delimiter_", "_classify_")
EOW = "</w>"
_CACHE_LIMIT = 1_000_000  # chunks; the cache is dropped when it grows past this (huge corpora)
_BATCH_TEXTS = 4096  # texts whose new words encode_batch sends through spaCy and BPE together


def bpe(token: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """OAI's TextEncoder.bpe: merge the lowest-ranked adjacent pair (all its occurrences, left to
    right) until no ranked pair remains. `</w>` is glued to the last character. Each round
    rescans the word: quadratic in its length (`bpe_heap` is not)."""
    word = list(token[:-1]) + [token[-1] + EOW]
    while len(word) > 1:
        best, best_rank = None, None
        for pair in zip(word, word[1:]):
            rank = ranks.get(pair)
            if rank is not None and (best_rank is None or rank < best_rank):
                best, best_rank = pair, rank
        if best is None:
            break
        first, second = best
        merged, i = [], 0
        while i < len(word):
            if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                merged.append(first + second)
                i += 2
            else:
                merged.append(word[i])
                i += 1
        word = merged
    return _oai_pieces(word)


def _oai_pieces(word: list[str]) -> list[str]:
    # OAI special case: spaCy's newline token "\n " would give "\n", " </w>"; it means "\n</w>".
    if word == ["\n", " " + EOW]:
        return ["\n" + EOW]
    # The reference joins pieces with spaces and splits them again, so a piece holding a space
    # becomes several (unknown) pieces; keep that behaviour.
    return " ".join(word).split(" ")


def bpe_heap(token: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """`bpe` in O(n log n): pair occurrences in a heap by (rank, position), merged in that
    order. The same pieces as `bpe` when every pair holding a merged token ranks after the merge
    that made it (`merges_are_ordered`; true of learned merges): then the pairs a merge creates
    are never taken before the remaining occurrences of the merge itself, and occurrences of
    one rank go left to right as in `bpe`."""
    word = list(token[:-1]) + [token[-1] + EOW]
    n = len(word)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prev = list(range(-1, n - 1))
    alive = [True] * n
    heap = [(r, i) for i in range(n - 1) if (r := ranks.get((word[i], word[i + 1]))) is not None]
    heapq.heapify(heap)
    while heap:
        rank, i = heapq.heappop(heap)
        j = nxt[i] if alive[i] else -1
        if j == -1 or ranks.get((word[i], word[j])) != rank:
            continue  # stale: one side was merged since this entry was pushed
        word[i] += word[j]
        alive[j] = False
        nxt[i] = nxt[j]
        if nxt[j] != -1:
            prev[nxt[j]] = i
        for left, right in ((prev[i], i), (i, nxt[i])):
            if left != -1 and right != -1:
                r = ranks.get((word[left], word[right]))
                if r is not None:
                    heapq.heappush(heap, (r, left))
    return _oai_pieces([w for w, keep in zip(word, alive) if keep])


def merges_are_ordered(merges: Sequence[tuple[str, str]]) -> bool:
    """Every merge comes after all merges that produce either of its two tokens."""
    made_by: dict[str, int] = {}
    for rank, (a, b) in enumerate(merges):
        made_by[a + b] = rank  # ends as the last merge producing the token
    return all(
        made_by.get(a, -1) < rank and made_by.get(b, -1) < rank
        for rank, (a, b) in enumerate(merges)
    )


def find_vocab_files(folder: str | Path) -> tuple[Path, Path]:
    """The (vocab, merges) pair in `folder`: original names or HF names."""
    folder = Path(folder)
    for vocab, merges in (HF_FILES, ORIGINAL_FILES):
        if (folder / vocab).is_file() and (folder / merges).is_file():
            return folder / vocab, folder / merges
    raise DataError(
        "no tokenizer files here (expected vocab.json + merges.txt, or "
        "encoder_bpe_40000.json + vocab_40000.bpe)",
        folder,
    )


def read_vocab(path: Path) -> dict[str, int]:
    """Read and check an encoder json: token -> id, ids exactly 0..n-1."""
    try:
        encoder = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DataError(f"cannot read vocabulary json ({exc})", path) from None
    if not isinstance(encoder, dict) or not encoder:
        raise DataError("vocabulary json must be a non-empty object {token: id}", path)
    ids = sorted(encoder.values()) if all(type(v) is int for v in encoder.values()) else None
    if ids != list(range(len(encoder))):
        raise DataError(
            f"vocabulary ids must be the integers 0..{len(encoder) - 1}, each once", path
        )
    return encoder


def read_merges(path: Path, encoder: dict[str, int]) -> list[tuple[str, str]]:
    """Read a merges file ("#version" line, then "a b" per line) and check it belongs to
    `encoder`: both halves and the merged token of every merge must be in the vocabulary."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read merges file ({exc})", path) from None
    first = 1 if lines and lines[0].startswith("#version") else 0
    if lines and lines[-1] == "":
        lines.pop()
    merges: list[tuple[str, str]] = []
    for lineno, line in enumerate(lines[first:], start=first + 1):
        parts = line.split(" ")
        if len(parts) != 2 or not all(parts):
            raise DataError(
                f"expected two tokens separated by one space, got {line[:80]!r}", path, lineno
            )
        for token in (parts[0], parts[1], parts[0] + parts[1]):
            if token not in encoder:
                raise DataError(
                    f"merge {line!r}: token {token!r} is not in the vocabulary "
                    "(vocabulary and merges files do not belong together)",
                    path,
                    lineno,
                )
        merges.append((parts[0], parts[1]))
    return merges


class Tokenizer:
    """GPT-1's tokenizer. `standardize="oai"` (default) keeps OAI's unpadded backslashes;
    "hf" pads them like PORT/transformers. `lower_first=True` (default) lowercases the raw text
    before ftfy and spaCy like transformers; False lowercases spaCy's tokens like OAI's
    text_utils.py (spaCy's cased exceptions then apply: "Mr." is one token, as in the
    original vocabulary's "mr.</w>")."""

    def __init__(
        self,
        encoder: dict[str, int],
        merges: Sequence[tuple[str, str]],
        standardize: textlib.Standardize = "oai",
        lower_first: bool = True,
    ) -> None:
        if standardize not in ("oai", "hf"):
            raise ValueError(f"standardize must be 'oai' or 'hf', not {standardize!r}")
        self.encoder = dict(encoder)
        self.merges = list(merges)
        self.standardize: textlib.Standardize = standardize
        self.lower_first = lower_first
        self.ranks = {pair: i for i, pair in enumerate(self.merges)}
        self.vocab_size = len(self.encoder)
        self.n_special = len(SPECIAL_TOKENS)
        self.total_size = self.vocab_size + self.n_special
        self.start_id, self.delimiter_id, self.classify_id = range(self.vocab_size, self.total_size)
        self.decoder = {i: t for t, i in self.encoder.items()}
        for i, name in enumerate(SPECIAL_TOKENS):
            self.decoder[self.vocab_size + i] = name + EOW  # decodes to its name, then a space
        self.unk_id = self.encoder.get(textlib.UNK_TOKEN, 0)
        self._splitter: textlib.SpacySplitter | None = None
        self._cache: dict[str, list[int]] = {}
        self._fast_bpe = None
        self._ordered_merges: bool | None = None
        self._reset_cache()

    def _reset_cache(self) -> None:
        newline = [self.encoder.get(p, self.unk_id) for p in bpe("\n", self.ranks)]
        self._cache = {"\n": newline, textlib.UNK_SENTINEL: [self.unk_id]}
        self._token_cache: dict[str, list[int]] = {}

    # -- loading and saving ------------------------------------------------------------------
    @classmethod
    def from_dir(
        cls, path: str | Path, standardize: textlib.Standardize = "oai", lower_first: bool = True
    ) -> Tokenizer:
        """Load from a folder holding vocab.json + merges.txt (a checkpoint or prepared-data
        folder) or the original encoder_bpe_40000.json + vocab_40000.bpe."""
        vocab_file, merges_file = find_vocab_files(path)
        encoder = read_vocab(vocab_file)
        return cls(
            encoder,
            read_merges(merges_file, encoder),
            standardize=standardize,
            lower_first=lower_first,
        )

    def save(self, out_dir: str | Path) -> None:
        """Write vocab.json + merges.txt (the names transformers' OpenAIGPTTokenizer loads)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "vocab.json", "w", encoding="utf-8") as fh:
            json.dump(self.encoder, fh, ensure_ascii=False)
        # transformers reads merges with split("\n")[1:-1]: header first, newline after the last
        with open(out / "merges.txt", "w", encoding="utf-8") as fh:
            fh.write("#version: 0.2\n")
            fh.writelines(f"{a} {b}\n" for a, b in self.merges)

    # -- encoding ----------------------------------------------------------------------------
    def _encode_chunk_lists(self, chunk_lists: list[list[str]]) -> list[list[int]]:
        """The ids of each text given as its chunks. Units (a chunk, or chunks spaCy must see
        together: SpacySplitter.link) never span two texts; units not in the cache go through
        spaCy and BPE together, once each, whatever text they come from."""
        if self._splitter is None:
            self._splitter = textlib.SpacySplitter()
        unit_lists = [self._splitter.link(c) for c in chunk_lists]
        cache = self._cache
        if len(cache) > _CACHE_LIMIT:
            self._reset_cache()
            cache = self._cache
        missing = [u for u in dict.fromkeys(chain.from_iterable(unit_lists)) if u not in cache]
        if missing:
            split = self._splitter.split(missing)
            tcache = self._token_cache
            new = [t for t in dict.fromkeys(chain.from_iterable(split)) if t not in tcache]
            tcache.update(zip(new, self._bpe_ids(new)))
            for unit, tokens in zip(missing, split):
                cache[unit] = [i for t in tokens for i in tcache[t]]
        return [list(chain.from_iterable(cache[u] for u in units)) for units in unit_lists]

    def _bpe_ids(self, tokens: list[str]) -> list[list[int]]:
        """Ids of spaCy tokens (no whitespace inside): HF `tokenizers`' BPE when the vocabulary
        has "<unk>" (same merges, same `</w>` rule; it is faster), else the Python `bpe`."""
        if not tokens:
            return []
        if self._fast_bpe is None:
            self._fast_bpe = _build_fast_bpe(self.encoder, self.merges) or False
        if self._fast_bpe:
            # one pre-tokenized sequence, one call: no thread pool (we scale with processes)
            enc = self._fast_bpe.encode(tokens, is_pretokenized=True, add_special_tokens=False)
            out: list[list[int]] = [[] for _ in tokens]
            for i, word in zip(enc.ids, enc.word_ids):
                out[word].append(i)
            return out
        get, unk, ranks = self.encoder.get, self.unk_id, self.ranks
        if self._ordered_merges is None:
            self._ordered_merges = merges_are_ordered(self.merges)
        merge = bpe_heap if self._ordered_merges else bpe
        return [[get(p, unk) for p in merge(t, ranks)] for t in tokens]

    def encode(self, text: str) -> list[int]:
        """Text -> ids with the exact GPT-1 pipeline; no special tokens are added."""
        return self._encode_chunk_lists([textlib.chunks(text, self.standardize, self.lower_first)])[
            0
        ]

    def encode_batch(self, texts: Sequence[str], processes: int = 1) -> list[list[int]]:
        """Encode many texts (the same ids as `encode` on each, faster on many short texts:
        their new words go through spaCy and BPE together); `processes` > 1 spreads them over
        worker processes."""
        processes = min(processes, len(texts))
        if processes <= 1:
            out: list[list[int]] = []
            for start in range(0, len(texts), _BATCH_TEXTS):  # bounds the chunk lists held
                out.extend(
                    self._encode_chunk_lists(
                        [
                            textlib.chunks(t, self.standardize, self.lower_first)
                            for t in texts[start : start + _BATCH_TEXTS]
                        ]
                    )
                )
            return out
        pool = open_pool(processes, "encoding processes", _init_worker, (self,))
        if pool is None:
            return self.encode_batch(texts)
        size = max(1, len(texts) // (8 * pool._processes))
        batches = [texts[i : i + size] for i in range(0, len(texts), size)]
        with pool:
            return list(chain.from_iterable(pool.map(_worker_encode, batches)))

    def tokenize(self, text: str) -> list[str]:
        """The BPE pieces of `text` (for inspection)."""
        return [
            self.decoder[i] if i != self.unk_id else textlib.UNK_TOKEN for i in self.encode(text)
        ]

    # -- decoding ----------------------------------------------------------------------------
    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids`, exactly as the `tokenizer.json` of a `gpt1 convert --to hf` export
        decodes them (`AutoTokenizer.from_pretrained(EXPORT).decode(ids)`, default flags): the
        pieces joined, `</w>` read as a space except on the last piece, where it is dropped.
        Nothing else is stripped (the newline token decodes to a newline); a task token reads
        as its name and a space, `<unk>` as itself."""
        pieces = self.pieces(ids)
        if not pieces:
            return ""
        return "".join(p.replace(EOW, " ") for p in pieces[:-1]) + pieces[-1].replace(EOW, "")

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """The vocabulary entries of `ids` (with `</w>`); an id outside the vocabulary is a
        DataError."""
        pieces = []
        for i in ids:
            piece = self.decoder.get(int(i))
            if piece is None:
                raise DataError(
                    f"token id {int(i)} is outside this vocabulary (0..{self.total_size - 1})"
                )
            pieces.append(piece)
        return pieces

    def __len__(self) -> int:
        return self.total_size

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
            f"standardize={self.standardize!r}, lower_first={self.lower_first})"
        )

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_splitter"] = None  # spaCy and tokenizers objects are rebuilt in the worker
        state["_fast_bpe"] = None
        state["_cache"] = state["_token_cache"] = {}
        state["ranks"] = None
        state["decoder"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.ranks = {pair: i for i, pair in enumerate(self.merges)}
        self.decoder = {i: t for t, i in self.encoder.items()}
        for i, name in enumerate(SPECIAL_TOKENS):
            self.decoder[self.vocab_size + i] = name + EOW
        self._reset_cache()

    # -- training ----------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        files_or_texts: Iterable[str | Path],
        merges: int,
        standardize: textlib.Standardize = "oai",
        min_frequency: int = 0,
        processes: int = 1,
        lower_first: bool = True,
    ) -> Tokenizer:
        """Learn a vocabulary of `merges` BPE merges with the same pipeline before BPE.

        `Path` items, and one-line strings naming an existing file or folder, are read as
        UTF-8 files (folders: their .txt files, sorted); other strings are texts. Words are
        the lower-cased spaCy tokens; HF `tokenizers`' BpeTrainer learns the merges with the
        `</w>` end-of-word suffix. The vocabulary is "<unk>" (id 0), the characters, the
        characters with `</w>`, then one token per merge.
        """
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import pre_tokenizers
        from tokenizers.models import BPE
        from tokenizers.trainers import BpeTrainer

        if merges < 0:
            raise ValueError("merges must be >= 0")
        counts = count_words(_iter_texts(files_or_texts), standardize, processes, lower_first)
        plain = sorted({c for w in counts for c in w})
        final = sorted({w[-1] + EOW for w in counts})
        hf = HFTokenizer(BPE(unk_token=textlib.UNK_TOKEN, end_of_word_suffix=EOW))
        # words hold no spaces, so a space-joined stream splits back into the same words
        hf.pre_tokenizer = pre_tokenizers.Split(" ", behavior="removed")
        trainer = BpeTrainer(
            vocab_size=1 + len(plain) + len(final) + merges,
            min_frequency=min_frequency,
            special_tokens=[textlib.UNK_TOKEN],
            end_of_word_suffix=EOW,
            show_progress=False,
        )
        hf.train_from_iterator(_repeat_words(counts), trainer=trainer)
        learned = json.loads(hf.to_str())["model"]["merges"][:merges]
        merge_list = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned]
        if len(merge_list) < merges:
            log.warning("the corpus allowed only %d merges (asked for %d)", len(merge_list), merges)
        encoder = {textlib.UNK_TOKEN: 0}
        for token in chain(plain, final, (a + b for a, b in merge_list)):
            encoder.setdefault(token, len(encoder))
        return cls(encoder, merge_list, standardize=standardize, lower_first=lower_first)


def _iter_texts(files_or_texts: Iterable[str | Path]) -> Iterable[str]:
    for item in files_or_texts:
        if (
            isinstance(item, str)
            and "\n" not in item
            and len(item) < 4096
            and item.strip()
            and Path(item).exists()
        ):
            item = Path(item)  # a path given as a string
        if isinstance(item, Path):
            files = sorted(item.rglob("*.txt")) if item.is_dir() else [item]
            for path in files:
                try:
                    yield path.read_text(encoding="utf-8", errors="replace")
                except OSError as exc:
                    raise DataError(f"cannot read ({exc.strerror})", path) from None
        else:
            yield item


def count_words(
    texts: Iterable[str],
    standardize: textlib.Standardize = "oai",
    processes: int = 1,
    lower_first: bool = True,
) -> dict[str, int]:
    """word -> count, words being the lower-cased spaCy tokens of the GPT-1 pipeline."""
    counts: dict[str, int] = {}
    pool = open_pool(processes, "counting processes")
    if pool is not None:
        with pool:
            jobs = ((t, standardize, lower_first) for t in texts)
            for part in pool.imap_unordered(_count_one, jobs, chunksize=8):
                for w, c in part.items():
                    counts[w] = counts.get(w, 0) + c
        return counts
    for text in texts:
        for w in _normalizer(standardize, lower_first).words(text):
            counts[w] = counts.get(w, 0) + 1
    return counts


_NORMALIZERS: dict[tuple[str, bool], textlib.Normalizer] = {}


def _normalizer(standardize: textlib.Standardize, lower_first: bool) -> textlib.Normalizer:
    # one per process and mode: spaCy takes a while to set up and its cache pays off
    key = (standardize, lower_first)
    if key not in _NORMALIZERS:
        _NORMALIZERS[key] = textlib.Normalizer(standardize, lower_first)
    return _NORMALIZERS[key]


def _count_one(args: tuple[str, textlib.Standardize, bool]) -> dict[str, int]:
    return count_words([args[0]], args[1], lower_first=args[2])


def _repeat_words(counts: dict[str, int], per_item: int = 4096) -> Iterable[str]:
    for word, count in counts.items():
        for start in range(0, count, per_item):
            yield " ".join([word] * min(per_item, count - start))


def _build_fast_bpe(encoder: dict[str, int], merges: list[tuple[str, str]]):
    """A `tokenizers` BPE with GPT-1's conventions, or None when the vocabulary has no <unk>."""
    if textlib.UNK_TOKEN not in encoder:
        return None
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers.models import BPE

    model = BPE(
        vocab=encoder,
        merges=merges,
        unk_token=textlib.UNK_TOKEN,
        end_of_word_suffix=EOW,
        fuse_unk=False,
    )
    return HFTokenizer(model)


# ---------------------------------------------------------------------------------------------
# Worker processes: each holds its own Tokenizer (and so its own cache and spaCy).
_WORKER: Tokenizer | None = None


def _init_worker(tok: Tokenizer) -> None:
    global _WORKER
    _WORKER = tok


def _worker_encode(texts: Sequence[str]) -> list[list[int]]:
    assert _WORKER is not None
    return _WORKER.encode_batch(texts)
