"""Tests for verify.walk's two algorithms on random verified copies, CPU:

- verify.walk, plain decoding's loop (any rule), against a reference written here the
  obvious way (a dict from each verified state to its logits): the same path, the same random
  draws (greedy and seeded sampling);
- verify.walk_one_sync, the fast path for a greedy rule with a fixed quota (every copy stepped in one call), against
  verify.walk: the same path, logits and host results, with Spiffy's ranks as `extra`;
- walk dispatches to the one that applies;
- host syncs (tests/test_syncs.py's counter): verify.walk_one_sync makes ONE, verify.walk one a step.

A random round: copies[0] a block with random known positions; a chain of states that the
rule itself reaches (each copy stepped on its own random logits, with the random stream the
walk will use), cut short at random by a near miss (the rule's next state with one token
changed: the walk stops there); near misses and repeats of chain states with other logits as
distractors (a walk takes the first matching copy); then copies[1:] shuffled.

Run: python -m pytest tests/test_walk.py -q
"""
import random

import pytest
import torch

import verify
from decode import DecodeRule
from loading.checkpoint import PRESETS
from spiffy import ranks
from test_syncs import SyncCounter

MASK_ID, V = PRESETS["tiny"]["mask_token_id"], 11
STATELESS = {"static": dict(), "threshold": dict(strategy="low_confidence_dynamic", threshold=0.9),
             "sequential": dict(strategy="sequential"),
             "entropy": dict(strategy="entropy_bounded", eb_threshold=0.5),
             "two-a-step": dict(steps=4)}                  # B = 8: quota 2 at every step
STATEFUL = {"random": dict(strategy="random"),
            "uneven-steps": dict(steps=3),                 # B = 8: quotas 3, 3, 2
            "sampled-static": dict(temperature=1.0, top_k=3),
            "sampled-threshold": dict(temperature=1.0, strategy="low_confidence_dynamic", threshold=0.9),
            "sampled-top-p": dict(temperature=0.7, top_p=0.9, steps=3)}
SEEDS = range(12)


def near_miss(state, before, rng):
    """`state` with one of the tokens revealed since `before` changed to another one."""
    revealed = (state != before).nonzero().squeeze(-1).tolist()
    miss = state.clone()
    p = rng.choice(revealed)
    miss[p] = rng.choice([t for t in range(V) if t not in (MASK_ID, int(state[p]))])
    return miss


def random_round(rule, seed, draw_seed=None):
    """-> (packed logits, copies, counts, step) of a random round (see the module docstring);
    draw_seed: the seed of the random stream the walk will draw from (sampled rules)."""
    B, rng, g = rule.block_size, random.Random(seed), torch.Generator().manual_seed(seed)
    draw = None if draw_seed is None else torch.Generator().manual_seed(draw_seed)
    block = torch.full((B,), MASK_ID)
    known = rng.sample(range(B), rng.randrange(B - 1))
    block[known] = torch.randint(0, V, (len(known),), generator=g).clamp(min=MASK_ID + 1)
    step, noise = rng.randrange(2), lambda: torch.randn(B, V, generator=g) * 4
    chain, extras, state = [], [], block      # chain: (state, its logits), as the rule walks
    while True:
        chain.append((state, noise()))
        if not (state == MASK_ID).any():      # full: the walk ends here
            break
        new = rule(chain[-1][1][state == MASK_ID], state, step + len(chain) - 1, draw)
        if rng.random() < 0.3:
            extras.append(near_miss(new, state, rng))
        if rng.random() < 0.1:                # the walk stops at the rule's new state
            chain.append((near_miss(new, state, rng), noise()))
            break
        state = new
    copies = chain + [(s, noise()) for s in extras]
    copies += [(s, noise()) for s, _ in copies[1:] if rng.random() < 0.15]   # repeats
    rest = copies[1:]
    rng.shuffle(rest)
    states = torch.stack([s for s, _ in [copies[0]] + rest])
    logits = torch.stack([lg for _, lg in [copies[0]] + rest])
    masked = states == MASK_ID
    return logits[masked], states, masked.sum(-1).tolist(), step


def reference_walk(logits, copies, counts, step, rule, generator=None):
    """Plain decoding through the verified states, the obvious way: -> the new states."""
    each = logits.split(counts)
    verified = {}
    for state, lg in zip(copies[1:].tolist(), each[1:]):
        verified.setdefault(tuple(state), lg)                # the first copy of a state counts
    state, lg, walked = copies[0], each[0], []
    while True:
        new = rule(lg, state, step + len(walked), generator)
        walked.append(new.tolist())
        if tuple(walked[-1]) not in verified or MASK_ID not in walked[-1]:
            return walked
        state, lg = new, verified[tuple(walked[-1])]


def make_rule(rule_kw):
    return DecodeRule(MASK_ID, 8, **rule_kw)


def seeded(seed):
    return torch.Generator().manual_seed(1000 + seed)


def with_ranks(rule):
    return lambda lg, cp, st: ranks(lg, st, rule, 3, cp)     # Spiffy's extra


def read(w):
    """A Walk's host results as Spiffy reads them: the state, and with ranks (Walk.ranks), the
    positions by rank and the token ranks of the masked ones only (a known position's are any
    row's)."""
    state, ranked = w.host, w.ranks
    m = state.count(MASK_ID)
    return [state] + ([ranked[0]] + [r[:m] for r in ranked[1:]] if ranked else [])


@pytest.mark.parametrize("rule_kw", list(STATELESS.values()) + list(STATEFUL.values()),
                         ids=list(STATELESS) + list(STATEFUL))
def test_the_stepwise_walk_is_plain_decoding_through_the_verified_states(rule_kw):
    rule, lengths = make_rule(rule_kw), []
    for seed in SEEDS:
        logits, copies, counts, step = random_round(rule, seed, draw_seed=1000 + seed)
        ref_gen, gen = seeded(seed), seeded(seed)
        expected = reference_walk(logits, copies, counts, step, rule, ref_gen)
        w = verify.walk(logits, verify.Guesses(copies, counts), step, rule, gen)
        path, state = w.path, w.host
        assert [new.tolist() for _, new in path] == expected and state == expected[-1], seed
        assert w.ranks == [] and w.crossed == [] and w.copies == copies.tolist(), seed
        assert torch.equal(gen.get_state(), ref_gen.get_state()), "not plain decoding's draws"
        lengths.append(len(path))
    assert max(lengths) >= 3 and min(lengths) <= 2, f"vacuous: walk lengths {lengths}"


@pytest.mark.parametrize("rule_kw", list(STATELESS.values()), ids=list(STATELESS))
def test_the_batched_walk_takes_the_stepwise_walks_path(rule_kw):
    rule, lengths = make_rule(rule_kw), []
    assert verify.greedy_fixed_quota(rule)
    for seed in SEEDS:
        logits, copies, counts, step = random_round(rule, seed)
        for extra in (verify.no_extra, with_ranks(rule)):
            g = verify.Guesses(copies, counts)
            batched_w = verify.walk_one_sync(logits, g, step, rule, None, extra)
            slow_w = verify.walk(logits, g, step, rule, None, extra)
            quick, slow = batched_w.path, slow_w.path
            assert len(quick) == len(slow), seed
            for (lg_f, new_f), (lg_s, new_s) in zip(quick, slow):
                assert torch.equal(lg_f, lg_s) and torch.equal(new_f, new_s), seed
            assert read(batched_w) == read(slow_w), seed
            assert (batched_w.crossed, batched_w.copies, batched_w.visited) == \
                (slow_w.crossed, slow_w.copies, slow_w.visited), seed
        lengths.append(len(quick))
    assert max(lengths) >= 3 and min(lengths) <= 2, f"vacuous: walk lengths {lengths}"


def walk_result(w):
    """A Walk as host values: the path (logits and new states), the final state and its ranks,
    the crossings, the copies and the copies visited."""
    return ([(lg.tolist(), new.tolist()) for lg, new in w.path], [w.host, *w.ranks], w.crossed, w.copies,
            w.visited)


@pytest.mark.parametrize("rule_kw", list(STATEFUL.values()), ids=list(STATEFUL))
def test_walk_steps_a_stateful_rule_one_step_at_a_time(rule_kw):
    rule = make_rule(rule_kw)
    assert not verify.greedy_fixed_quota(rule)
    for seed in SEEDS[:4]:
        logits, copies, counts, step = random_round(rule, seed, draw_seed=1000 + seed)
        g = verify.Guesses(copies, counts)
        got = verify.walk(logits, g, step, rule, seeded(seed), with_ranks(rule))
        want = verify.walk(logits, g, step, rule, seeded(seed), with_ranks(rule))
        assert walk_result(got) == walk_result(want)


@pytest.mark.parametrize("rule_kw", [STATELESS["threshold"], STATELESS["two-a-step"], STATEFUL["sampled-static"]],
                         ids=["threshold", "two-a-step", "sampled-static"])
def test_the_batched_walk_syncs_once_and_the_stepwise_walk_once_a_step(rule_kw, monkeypatch):
    rule, syncs, lengths = make_rule(rule_kw), SyncCounter(monkeypatch), []
    for seed in SEEDS:
        logits, copies, counts, step = random_round(rule, seed, draw_seed=1000 + seed)
        extra, g = with_ranks(rule), verify.Guesses(copies, counts)
        if verify.greedy_fixed_quota(rule):
            syncs.count = 0
            with syncs:
                verify.walk_one_sync(logits, g, step, rule, None, extra)
            assert syncs.count == 1, seed
        syncs.count = 0
        with syncs:
            path = verify.walk(logits, g, step, rule, seeded(seed), extra).path
        assert syncs.count == len(path), seed
        syncs.count = 0
        with syncs:
            verify.walk_one_sync(logits, g, step, rule, seeded(seed), extra)
        assert syncs.count == (1 if verify.greedy_fixed_quota(rule) else len(path)), seed
        lengths.append(len(path))
    assert max(lengths) >= 3, f"vacuous: walk lengths {lengths}"


# ---- across blocks: copies of later blocks, after the complete copy of the block before

def tree_round(rule, seed, draw_seed=None):
    """A random round over up to three blocks: in each, a chain of states the rule reaches
    from the block's first state (block 0: random known positions; later blocks: all masks,
    after the complete copy that ends the chain before), cut short at random; near misses and
    states of one block posing as states of another as distractors; copies[1:] shuffled.
    -> (packed logits, copies, counts, parent, step)."""
    B, rng, g = rule.block_size, random.Random(seed), torch.Generator().manual_seed(seed)
    draw = None if draw_seed is None else torch.Generator().manual_seed(draw_seed)
    noise = lambda: torch.randn(B, V, generator=g) * 4
    state = torch.full((B,), MASK_ID)
    known = rng.sample(range(B), rng.randrange(B - 1))
    state[known] = torch.randint(0, V, (len(known),), generator=g).clamp(min=MASK_ID + 1)
    step, copies, parent, group = rng.randrange(2), [], [], -1    # copies: (state, logits)
    for b in range(3):
        s = step if b == 0 else 0
        while True:
            copies.append((state, noise()))
            parent.append(group)
            if not (state == MASK_ID).any():
                break
            new = rule(copies[-1][1][state == MASK_ID], state, s, draw)
            s += 1
            if rng.random() < 0.3:
                copies.append((near_miss(new, state, rng), noise()))
                parent.append(group)
            if rng.random() < 0.08:
                break
            state = new
        if (state == MASK_ID).any() or rng.random() < 0.2:
            break
        group, state = len(copies) - 1, torch.full((B,), MASK_ID)
        if rng.random() < 0.3:            # the next block's first state, in the wrong block
            copies.append((state, noise()))
            parent.append(-1)
    order = [0] + rng.sample(range(1, len(copies)), len(copies) - 1)
    where = {old: new for new, old in enumerate(order)}
    states = torch.stack([copies[i][0] for i in order])
    logits = torch.stack([copies[i][1] for i in order])
    masked = states == MASK_ID
    parents = [where[parent[i]] if parent[i] >= 0 else -1 for i in order]
    return logits[masked], states, masked.sum(-1).tolist(), parents, step


def reference_tree_walk(logits, copies, counts, parent, step, rule, generator=None):
    """The walk across blocks, the obvious way: a dict from (block, state) to the first copy;
    a complete state goes on from the next block's first copy after it. -> (new states,
    crossings)."""
    each, B = logits.split(counts), copies.shape[1]
    verified = {}
    for j in range(1, len(copies)):
        verified.setdefault((parent[j], tuple(copies[j].tolist())), j)
    child = {}
    for j in range(len(copies)):
        if parent[j] >= 0 and counts[j] == B:
            child.setdefault(parent[j], j)
    i, group, walked, crossed = 0, -1, [], []
    while True:
        new = rule(each[i], copies[i], step, generator)
        walked.append(new.tolist())
        j = verified.get((group, tuple(walked[-1])))
        if j is None or (MASK_ID not in walked[-1] and j not in child):
            return walked, crossed
        if MASK_ID in walked[-1]:
            i, step = j, step + 1
        else:
            crossed.append((len(walked), j))
            i, group, step = child[j], j, 0


@pytest.mark.parametrize("rule_kw", list(STATELESS.values()) + list(STATEFUL.values()),
                         ids=list(STATELESS) + list(STATEFUL))
def test_the_walk_across_blocks_is_plain_decoding_through_the_verified_states(rule_kw):
    rule, crossings = make_rule(rule_kw), 0
    for seed in range(40):
        logits, copies, counts, parent, step = tree_round(rule, seed, draw_seed=1000 + seed)
        ref_gen, gen = seeded(seed), seeded(seed)
        expected, ref_crossed = reference_tree_walk(logits, copies, counts, parent, step, rule, ref_gen)
        g = verify.Guesses(copies, counts, parent)
        w = verify.walk(logits, g, step, rule, gen)
        path, state, crossed = w.path, w.host, w.crossed
        assert [new.tolist() for _, new in path] == expected and state == expected[-1], seed
        assert crossed == ref_crossed and w.ranks == [], seed
        assert torch.equal(gen.get_state(), ref_gen.get_state()), "not plain decoding's draws"
        if verify.greedy_fixed_quota(rule):
            batched_w = verify.walk_one_sync(logits, g, step, rule)
            quick, fast_state, fast_crossed = batched_w.path, batched_w.host, batched_w.crossed
            assert [new.tolist() for _, new in quick] == expected and fast_crossed == crossed, seed
            assert fast_state == state and batched_w.visited == w.visited, seed
        crossings += len(crossed)
    assert crossings >= 5, f"vacuous: {crossings} crossings"
