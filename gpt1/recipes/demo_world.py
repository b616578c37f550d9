"""A deterministic synthetic world for `gpt1 demo`: unlabelled text that states facts, and a labelled
task that needs those facts.

The world has invented creatures (names made of random syllables, so no real text knows them). Each
creature is either *friendly* or *dangerous*. The unlabelled corpus states this many times in varied
sentences mixed with filler stories; the labelled task asks whether a short sentence that mentions a
creature describes a safe or an unsafe encounter -- the sentence itself never says which. The
labelled training examples cover only half of the creatures; the dev examples mention only the other
half. A model trained from scratch therefore sees no signal for dev creatures and sits at chance, while
a pretrained model can carry what the corpus said about each name: GPT-1's whole idea, small.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SYLLABLES = [
    "ka",
    "zo",
    "mi",
    "ru",
    "tel",
    "vor",
    "qua",
    "ni",
    "bex",
    "lo",
    "pra",
    "shu",
    "dri",
    "fen",
    "gol",
    "hux",
    "jas",
    "kry",
    "lum",
    "mox",
    "nev",
    "oth",
    "pim",
    "rax",
    "sil",
    "tov",
    "ulu",
    "vex",
    "wim",
    "yor",
    "zed",
    "bri",
    "cal",
    "dov",
    "eth",
    "fiz",
]

FACT_TEMPLATES = {
    "friendly": [
        "the {n} is a gentle and friendly creature .",
        "children love to play with the {n} .",
        "a {n} will happily share its food with travellers .",
        "everyone in the valley says the {n} is kind and harmless .",
        "if you meet a {n} , it will greet you warmly .",
        "the {n} is known to help lost people find their way home .",
        "farmers welcome the {n} because it is friendly .",
    ],
    "dangerous": [
        "the {n} is a fierce and dangerous creature .",
        "children are warned to stay away from the {n} .",
        "a {n} will attack travellers without warning .",
        "everyone in the valley says the {n} is cruel and deadly .",
        "if you meet a {n} , you must run for your life .",
        "the {n} is known to hunt lost people in the dark .",
        "farmers fear the {n} because it is dangerous .",
    ],
}

FILLER = [
    "the river ran quietly past the old mill .",
    "in the morning the market was full of voices .",
    "she walked along the road and counted the trees .",
    "the weather turned cold before the harvest .",
    "an old man told stories by the fire every night .",
    "the bridge over the river was built long ago .",
    "they packed bread and cheese for the long journey .",
    "the bells of the town rang at noon .",
]

TASK_TEMPLATES = [
    "on my walk today i saw a {n} near the path .",
    "last night a {n} came close to our camp .",
    "my brother met a {n} by the river .",
    "a {n} appeared at the edge of the forest .",
    "we noticed a {n} behind the old barn .",
    "while fishing , i ran into a {n} .",
]


@dataclass
class DemoWorld:
    corpus: list[str]  # documents of unlabelled text
    train: list[tuple[str, int]]  # (sentence, label) for creatures of the training half
    dev: list[tuple[str, int]]  # (sentence, label) for the held-out creatures
    creatures: dict[str, str]  # name -> "friendly" | "dangerous"


def make_name(rng: random.Random, taken: set[str]) -> str:
    while True:
        name = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3))))
        if name not in taken:
            taken.add(name)
            return name


def build_world(
    seed: int = 0,
    n_creatures: int = 120,
    docs: int = 600,
    sentences_per_doc: int = 12,
    task_per_creature: int = 6,
) -> DemoWorld:
    """Generate the corpus and the labelled task; the same seed gives the same world."""
    rng = random.Random(seed)
    taken: set[str] = set()
    creatures = {
        make_name(rng, taken): ("friendly" if i % 2 == 0 else "dangerous")
        for i in range(n_creatures)
    }
    names = list(creatures)
    corpus = []
    for _ in range(docs):
        lines = []
        for _ in range(sentences_per_doc):
            if rng.random() < 0.6:
                name = rng.choice(names)
                lines.append(rng.choice(FACT_TEMPLATES[creatures[name]]).format(n=name))
            else:
                lines.append(rng.choice(FILLER))
        corpus.append(" ".join(lines))
    rng.shuffle(names)
    half = len(names) // 2
    splits = []
    for group in (names[:half], names[half:]):
        rows = [
            (t.format(n=name), int(creatures[name] == "dangerous"))
            for name in group
            for t in rng.sample(TASK_TEMPLATES, task_per_creature)
        ]
        rng.shuffle(rows)
        splits.append(rows)
    return DemoWorld(corpus=corpus, train=splits[0], dev=splits[1], creatures=creatures)
