"""The round's copies docs/design.md draws (section 6, "A round's copies, drawn") are what
speculate.drafted_states makes of that draft, verify.next_copies says where the walk goes on as
drawn, and both walks go where the prose says; drafted_states' assert trips on a draft that
reaches a later block before the block before it is whole."""
from pathlib import Path

import pytest
import torch

import speculate
import verify
from decode import DecodeRule, Frontier

M, V = 3, 16                                      # the mask id, the vocabulary
TOKEN = {"m": M, "a": 10, "b": 11, "c": 12, "d": 13}
REACH = [0.5, 0.25, 0.125, 0.0625]                # the drafts' running product: r1 .. r4
DESIGN = Path(__file__).resolve().parent.parent / "docs" / "design.md"


def drawn():
    """The drawing's rows, {label: cells}, read from docs/design.md."""
    text = DESIGN.read_text().split("**A round's copies, drawn.**")[1]
    lines = text.split("\n\n")[1].splitlines()
    return {line.split()[0]: line.split()[1:] for line in lines}


def drafted(every=True):
    d = speculate.Draft([0, 1, 2, 3], [TOKEN[t] for t in "abcd"], [1, 1, 2, 2], None, REACH)
    front = Frontier(torch.tensor([M, M]), torch.arange(2), 2, [M, M])
    return speculate.drafted_states(front, d, 1, frozenset(), M, every)


def test_the_drawing_is_what_drafted_states_and_next_copies_make():
    rows, g = drawn(), drafted()
    assert rows["copy"] == [str(i) for i in range(len(g.n_masked))]
    assert [TOKEN[t] for t in rows["state"]] == g.copies.flatten().tolist()
    assert [int(a) for a in rows["after"]] == g.after
    assert [1.0 if r == "1" else REACH[int(r[1:]) - 1] for r in rows["reach"]] == g.reach
    assert [int(n) for n in rows["drafted"]] == g.drafted
    assert [None if c == "None" else int(c) for c in rows["next_copies"]] == verify.next_copies(g)


def test_one_copy_a_drafter_step_leaves_out_the_states_inside_a_step():
    full, steps = drafted(), drafted(every=False)
    assert steps.copies.tolist() == full.copies[[0, 2, 3, 5]].tolist()
    assert steps.after == [-1, -1, 1, 1] and verify.next_copies(steps) == [0, 2, 2, None]


@pytest.mark.parametrize("walk", [verify.walk, verify.walk_one_sync], ids=["verify", "fast"])
def test_the_walk_goes_where_the_drawing_says(walk):
    """Logits that make the threshold rule reveal a b from copy 0 and c d from copy 3: the walk
    finishes block 0 at copy 2, goes on from copy 3, and ends at c d (copy 5: nothing after)."""
    g, rule = drafted(), DecodeRule(M, 2, strategy="low_confidence_dynamic")
    rows = []                                     # packed: copy by copy, its masked positions
    for state, after in zip(g.copies.tolist(), g.after):
        rows += [TOKEN[("ab" if after < 0 else "cd")[p]] for p, t in enumerate(state) if t == M]
    logits = torch.full((len(rows), V), -10.0)
    logits[torch.arange(len(rows)), torch.tensor(rows)] = 10.0
    w = walk(logits, g, 0, rule)
    assert w.host == [TOKEN["c"], TOKEN["d"]] and w.crossed == [(1, 2)] and w.visited == [2]
    assert [new.tolist() for _, new in w.path] == [[TOKEN["a"], TOKEN["b"]], w.host]


def test_a_draft_past_a_block_still_masked_trips_the_assert():
    """Drafts in draft order reach block 1 (position 2) while block 0's position 1 is masked:
    no drafter step does that, and the next block's copy would follow an incomplete one."""
    d = speculate.Draft([0, 2, 1], [TOKEN["a"], TOKEN["c"], TOKEN["b"]], [1, 2, 3], None, REACH[:3])
    front = Frontier(torch.tensor([M, M]), torch.arange(2), 2, [M, M])
    with pytest.raises(AssertionError, match="past a block still masked"):
        speculate.drafted_states(front, d, 1, frozenset(), M)


def test_the_siblings_drawing_is_what_drafted_states_makes():
    """docs/design.md's siblings drawing: one drafter step from [m m m m] drafts a (position 0),
    then b (position 2); position 1, token c, is the surest it left masked."""
    text = DESIGN.read_text().split("**Siblings: a drafter step's state, one position off.**")[1]
    rows = {line.split()[0]: line.split()[1:] for line in text.split("\n\n")[1].splitlines()}
    d = speculate.Draft([0, 2], [TOKEN["a"], TOKEN["b"]], [1, 1], None, [0.5, 0.25], {1: (1, TOKEN["c"])})
    front = Frontier(torch.tensor([M] * 4), torch.arange(4), 4, [M] * 4)
    g = speculate.drafted_states(front, d, 0, frozenset(), M, every=False, vary=True)
    states = [t for t in rows["state"] if not t.startswith("(")]
    assert [TOKEN[t] for t in states] == g.copies.flatten().tolist()
    assert [int(a) for a in rows["after"]] == (g.after or [-1] * len(g.n_masked))
    assert len(rows["copy"]) - rows["copy"].count("(fewer)") - rows["copy"].count("(more)") \
        - rows["copy"].count("(swapped)") == len(g.n_masked)
    alone = speculate.drafted_states(front, d, 0, frozenset(), M, every=False)     # vary off
    assert alone.copies.tolist() == g.copies[:2].tolist()
