from gpt1.recipes.demo_world import build_world


def test_world_is_deterministic_and_split_by_creature():
    a, b = build_world(seed=3), build_world(seed=3)
    assert a.corpus == b.corpus and a.train == b.train and a.dev == b.dev
    assert build_world(seed=4).corpus != a.corpus
    train_names = {w for s, _ in a.train for w in s.split() if w in a.creatures}
    dev_names = {w for s, _ in a.dev for w in s.split() if w in a.creatures}
    assert train_names and dev_names and not train_names & dev_names
    # every dev creature's nature is stated in the unlabelled corpus
    text = " ".join(a.corpus)
    assert all(f" {n} " in f" {text} " for n in dev_names)
    # labels are balanced and follow the creature's nature
    labels = [label for _, label in a.dev]
    assert 0.3 < sum(labels) / len(labels) < 0.7
    for sentence, label in a.dev:
        name = next(w for w in sentence.split() if w in a.creatures)
        assert label == (a.creatures[name] == "dangerous")
