"""Tests for spiffy.py (Spiffy, docs/design.md section 4) on tiny random "peaky" models, CPU.

- Lossless: Spiffy gives plain decoding's tokens (decode.generate), prompt for prompt, for the
  one-token-per-step rule and the threshold rule, at B = 4, 8, 32, fused and separate commit,
  greedy and sampling with a seeded generator; while spending fewer forwards. The checker,
  `assert_lossless`, is shown to catch a walk that accepts a node that is not the new state.
- Calibration is deterministic; graphs round-trip through JSON and `load_graph`, which
  refuses graphs made for another block size or rule, and malformed files.
- build_drafts: at most D* states, each revealing only masked positions, connected.
- Statistics: the steps-per-forward histogram adds up to plain decoding's step count.

Run: python -m pytest tests/test_spiffy.py -q
"""
import functools
import json
import math

import pytest
import torch

import verify
import spiffy
from conftest import make_model
from decode import DecodeRule, generate, to_host
from loading.checkpoint import PRESETS
from measure.graphs import load_graph
from spiffy import calibrate, graph_rule
from spiffy import build_drafts, ranks
from measure.counts import counting

spiffy_generate = counting(spiffy.spiffy_generate)   # with its rounds counted (measure/counts.py)

MASK_ID = PRESETS["tiny"]["mask_token_id"]
NO_EOS = -1     # an eos_id that never occurs: fixed-length output
DRAFT_BUDGET = 8

RULES = {  # name -> DecodeRule kwargs
    "static": dict(strategy="low_confidence_static"),                  # one token per step
    "dynamic": dict(strategy="low_confidence_dynamic", threshold=0.9),  # several per step
    "random": dict(strategy="random"),
    "sequential": dict(strategy="sequential"),
    "entropy": dict(strategy="entropy_bounded", eb_threshold=0.5),
}
UNEVEN = dict(strategy="low_confidence_static", steps=5)    # B = 8: quota [2, 2, 2, 1, 1]


def tokens(n, seed=0, vocab=PRESETS["tiny"]["vocab_size"]):
    """n random ordinary token ids (above the special ids 0..3)."""
    return torch.randint(4, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def prompts(B, n=20, seed=0):
    """n + 2 prompts of varied lengths, among them whole blocks (B and 2B tokens)."""
    lengths = [B, 2 * B] + [1 + (7 * k + 3) % (2 * B + 3) for k in range(n)]
    return [tokens(L, seed=seed + 1000 * k) for k, L in enumerate(lengths)]


@functools.lru_cache(maxsize=None)
def calibrated(B, rule_name, budget=10):
    """A peaky model of block size B, its rule, and a graph calibrated on four prompts that
    the tests never decode. Cached: calibration is deterministic (tested below)."""
    model = make_model(block_size=B)
    rule = DecodeRule(MASK_ID, B, **(UNEVEN if rule_name == "uneven" else RULES[rule_name]))
    calib_prompts = [tokens(L, seed=77 + L) for L in (5, B + 2, 2 * B, 3)]
    return model, rule, calibrate(model, calib_prompts, rule, max_new_tokens=32, budget=budget)


def assert_lossless(run, model, rule, prompts, max_new, fuse_commit=True, seed=None):
    """run(model, prompt, max_new, rule=, fuse_commit=, eos_id=, generator=) must return
    plain decoding's tokens on every prompt (when sampling, both get a generator seeded
    alike). -> [(plain stats, run stats)] per prompt."""
    stats = []
    if seed is None and rule.strategy == "random":   # random positions: both need one stream
        seed = 0
    for k, prompt in enumerate(prompts):
        def gen():
            return None if seed is None else torch.Generator().manual_seed(seed + k)
        ref, st_ref = generate(model, prompt, max_new, rule, fuse_commit, NO_EOS, gen())
        out, st = run(model, prompt, max_new, rule=rule, fuse_commit=fuse_commit, eos_id=NO_EOS,
                      generator=gen())
        assert out == ref, f"differs from plain decoding on prompt {k} (length {len(prompt)})"
        stats.append((st_ref, st))
    return stats


def check_step_counts(prompt, max_new, B, fuse_commit, plain_stats, spiffy_stats):
    """Every forward after the prefill (and apart from SDAR's commit forwards) advances the
    block by the steps its histogram entry says; together that is plain decoding's steps. (A
    block finished ahead is kept from its copy: it needs no commit forward of its own.)"""
    prefill = int(len(prompt) >= B)
    commits = 0 if fuse_commit else math.ceil((len(prompt) % B + max_new) / B)
    plain_steps = plain_stats["nfe"] - prefill - commits
    hist = spiffy_stats["steps_per_forward"]
    assert sum(k * v for k, v in hist.items()) == plain_steps
    kept = 0 if fuse_commit else spiffy_stats["blocks_ahead"]
    assert sum(hist.values()) == spiffy_stats["nfe"] - prefill - (commits - kept)
    assert sum(spiffy_stats["nodes_per_forward"].values()) == sum(hist.values())
    assert spiffy_stats["tokens"] == plain_stats["tokens"] == max_new
    return plain_steps


def spiffy_with(graph, draft_budget=DRAFT_BUDGET):
    return functools.partial(spiffy_generate, graph=graph, draft_budget=draft_budget)


# ============================================================================ lossless

MAX_NEW = {4: 24, 8: 32, 32: 40}


@pytest.mark.parametrize("B, fuse_commit", [(4, True), (4, False), (8, True), (8, False), (32, True)],
                         ids=["4-fused", "4-separate", "8-fused", "8-separate", "32-fused"])
@pytest.mark.parametrize("rule_name", list(RULES))
def test_greedy_spiffy_equals_plain_decoding(B, rule_name, fuse_commit):   # (separate commits: B-blind)
    model, rule, graph = calibrated(B, rule_name)
    assert 8 <= len(graph["nodes"]) <= 10
    cases = prompts(B)
    max_new = MAX_NEW[B]
    stats = assert_lossless(spiffy_with(graph), model, rule, cases, max_new, fuse_commit)
    steps = [check_step_counts(p, max_new, B, fuse_commit, *s) for p, s in zip(cases, stats)]
    # not vacuous: Spiffy matched nodes, so it spent fewer forwards than plain decoding
    assert sum(s["nfe"] for _, s in stats) < sum(r["nfe"] for r, _ in stats)
    assert max(k for _, s in stats for k in s["steps_per_forward"]) >= 2
    masks = sum(math.ceil((len(p) % B + max_new) / B) * B - len(p) % B for p in cases)
    if rule_name in ("dynamic", "entropy"):   # several tokens revealed in some steps
        assert sum(steps) < masks
    else:
        assert sum(steps) == masks


def test_greedy_spiffy_equals_plain_decoding_when_the_quota_changes_within_a_block():
    """With steps = 5 at B = 8 the rule reveals 2, 2, 2, 1, then 1 token: the walk must hand
    the rule the right step index after each matched node."""
    B = 8
    model, rule, graph = calibrated(B, "uneven")
    assert rule.quota == [2, 2, 2, 1, 1] and max(len(n) for n in graph["nodes"]) >= 2
    stats = assert_lossless(spiffy_with(graph), model, rule, prompts(B, n=10, seed=9), 32)
    assert sum(s["nfe"] for _, s in stats) < sum(r["nfe"] for r, _ in stats)


@pytest.mark.parametrize("rule_name", list(RULES))
@pytest.mark.parametrize("B", [4, 8])
def test_sampling_spiffy_equals_plain_decoding_with_the_same_seed(B, rule_name):
    model, _, graph = calibrated(B, rule_name)
    rule = DecodeRule(MASK_ID, B, **RULES[rule_name], temperature=1.0, top_k=4)
    assert graph_rule(rule) == {k: graph[k] for k in graph_rule(rule)}
    cases = prompts(B, n=8, seed=5)
    stats = assert_lossless(spiffy_with(graph), model, rule, cases, MAX_NEW[B], seed=11)
    assert sum(s["nfe"] for _, s in stats) < sum(r["nfe"] for r, _ in stats)
    outs = [generate(model, p, MAX_NEW[B], rule, eos_id=NO_EOS,
                     generator=torch.Generator().manual_seed(12))[0] for p in cases[:3]]
    greedy = [generate(model, p, MAX_NEW[B], DecodeRule(MASK_ID, B, **RULES[rule_name]),
                       eos_id=NO_EOS)[0] for p in cases[:3]]
    assert outs != greedy, "sampling never left the greedy path: the test would be vacuous"


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
def test_spiffy_equals_plain_decoding_on_a_larger_vocabulary(temperature):
    """SDAR's layout (the mask id at the end of the vocabulary) on 2048 ids, 20x the tiny
    preset's: the packed logits, the rule and the bounded top-k ranks still give plain
    decoding's tokens."""
    B, vocab = 4, 2048
    model = make_model(vocab=vocab, block_size=B, mask_token_id=vocab - 1)
    rule = DecodeRule(vocab - 1, B, temperature=temperature, top_k=8 if temperature else None)
    graph = calibrate(model, [tokens(L, seed=70 + L, vocab=vocab - 1) for L in (5, 6, 8)], rule, 24)
    cases = [tokens(L, seed=L, vocab=vocab - 1) for L in (3, 4, 9, 6)]
    stats = assert_lossless(spiffy_with(graph), model, rule, cases, 24, seed=3 if temperature else None)
    assert sum(s["nfe"] for _, s in stats) < sum(r["nfe"] for r, _ in stats)


@pytest.mark.parametrize("fuse_commit", [True, False], ids=["fused", "separate"])
@pytest.mark.parametrize("graph", ["none", "no-nodes"])
def test_spiffy_without_drafts_is_plain_decoding_at_the_same_cost(graph, fuse_commit):
    B = 8
    for rule_name in RULES:
        model, rule, _ = calibrated(B, rule_name)
        g = None if graph == "none" else dict(graph_rule(rule), nodes=[])
        stats = assert_lossless(spiffy_with(g), model, rule, prompts(B, n=3), 20, fuse_commit)
        for plain, spec in stats:
            assert spec["nfe"] == plain["nfe"]
            assert set(spec["steps_per_forward"]) == {1} and set(spec["nodes_per_forward"]) == {0}


def test_a_walk_that_accepts_a_wrong_node_is_caught(monkeypatch):
    """The lossless check has teeth: let the walk (verify.walk_one_sync's) accept any node that reveals as
    many tokens as the rule's new state (a broken state comparison), and plain decoding's
    tokens are lost."""
    B = 8
    model, rule, graph = calibrated(B, "static")
    cases = prompts(B, n=6)
    one_sync = functools.partial(spiffy_generate, graph=graph, walk=verify.walk_one_sync)
    assert_lossless(one_sync, model, rule, cases, 24)                  # intact: lossless

    def same_reveal_count(copies, state):
        return (copies != MASK_ID).sum(-1) == (state != MASK_ID).sum(-1)
    monkeypatch.setattr(verify, "same_state", same_reveal_count)
    with pytest.raises(AssertionError, match="differs from plain decoding"):
        assert_lossless(one_sync, model, rule, cases, 24)


@pytest.mark.parametrize("fuse_commit", [True, False], ids=["fused", "separate"])
def test_steps_per_forward_add_up_to_plain_decodings_steps(fuse_commit):
    B, max_new = 8, 28
    model, rule, graph = calibrated(B, "static")
    cases = prompts(B, n=4, seed=3)
    stats = assert_lossless(spiffy_with(graph, 5), model, rule, cases, max_new, fuse_commit)
    for prompt, (plain, spec) in zip(cases, stats):
        steps = check_step_counts(prompt, max_new, B, fuse_commit, plain, spec)
        n_blocks = math.ceil((len(prompt) % B + max_new) / B)
        assert steps == n_blocks * B - len(prompt) % B      # one step per generated position
        # a block opens with a forward of the bare state (no drafts to verify yet) unless the
        # round before walked on into it
        assert spec["nodes_per_forward"].get(0, 0) >= n_blocks - spec["blocks_ahead"]
        assert max(spec["nodes_per_forward"]) <= 5
    assert sum(spec["blocks_ahead"] for _, spec in stats) > 0, "vacuous: no round crossed a block"



# ============================================================================ calibration

def test_calibration_is_deterministic_and_round_trips_through_json(tmp_path):
    B = 4
    model, rule, graph = calibrated(B, "static")
    calib_prompts = [tokens(L, seed=77 + L) for L in (5, B + 2, 2 * B, 3)]
    again = calibrate(model, calib_prompts, rule, max_new_tokens=32, budget=10)
    assert json.dumps(again) == json.dumps(graph)
    assert {k: graph[k] for k in graph_rule(rule)} == graph_rule(rule)
    assert len(graph["counts"]) == len(graph["nodes"])

    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph))
    loaded = load_graph(path, rule)
    assert loaded == graph
    prompt = tokens(9, seed=4)
    assert spiffy_generate(model, prompt, 16, rule, graph=loaded, eos_id=NO_EOS)[0] == \
        spiffy_generate(model, prompt, 16, rule, graph=graph, eos_id=NO_EOS)[0]


def test_calibrated_graph_for_one_token_steps_is_connected():
    """Every node of k > 1 reveals has a parent in the graph: k - 1 of its reveals."""
    _, _, graph = calibrated(8, "static", budget=16)
    nodes = [frozenset(map(tuple, n)) for n in graph["nodes"]]
    assert len(nodes) == 16 and any(len(n) > 1 for n in nodes)
    for n in nodes:
        assert len(n) == 1 or any(len(a) == len(n) - 1 and a < n for a in nodes), sorted(n)


@pytest.mark.parametrize("other, field", [
    (dict(block_size=8), "block_size"),
    (dict(strategy="low_confidence_dynamic"), "strategy"),
    (dict(steps=2), "steps"),
], ids=["block_size", "strategy", "steps"])
def test_graph_for_another_block_size_or_rule_is_refused(tmp_path, other, field):
    rule = DecodeRule(MASK_ID, 4)
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(dict(graph_rule(rule), nodes=[[[0, 0]]])))
    wrong = DecodeRule(MASK_ID, **{"block_size": 4, **other})
    with pytest.raises(ValueError) as info:
        load_graph(path, wrong)
    message = str(info.value)
    assert f"'{field}': {graph_rule(rule)[field]!r}" in message      # what the file has
    assert f"'{field}': {graph_rule(wrong)[field]!r}" in message     # what was asked for


def test_graph_for_another_threshold_is_refused(tmp_path):
    rule = DecodeRule(MASK_ID, 4, **RULES["dynamic"])
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(dict(graph_rule(rule), nodes=[[[0, 0]]])))
    with pytest.raises(ValueError, match=r"'threshold': 0\.9.*'threshold': 0\.8"):
        load_graph(path, DecodeRule(MASK_ID, 4, strategy="low_confidence_dynamic", threshold=0.8))


def test_missing_graph_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        load_graph(tmp_path / "nowhere.json", DecodeRule(MASK_ID, 4))


GOOD = graph_rule(DecodeRule(MASK_ID, 4))
BAD_GRAPHS = {
    "not-json": "{nodes: [[[0, 0]]",
    "a-list": json.dumps([[[0, 0]]]),
    "no-nodes": json.dumps(GOOD),
    "nodes-not-a-list": json.dumps(dict(GOOD, nodes=3)),
    "pair-of-three": json.dumps(dict(GOOD, nodes=[[[0, 0, 1]]])),
    "pair-not-a-list": json.dumps(dict(GOOD, nodes=[[0, 0]])),
    "negative-rank": json.dumps(dict(GOOD, nodes=[[[0, -1]]])),
    "string-rank": json.dumps(dict(GOOD, nodes=[[["0", 0]]])),
}
BAD_GRAPHS.update({
    "fractional-rank": json.dumps(dict(GOOD, nodes=[[[0.5, 0]]])),
    "empty-node": json.dumps(dict(GOOD, nodes=[[]])),
    "repeated-position": json.dumps(dict(GOOD, nodes=[[[0, 0], [0, 1]]])),
})


@pytest.mark.parametrize("text", list(BAD_GRAPHS.values()), ids=list(BAD_GRAPHS))
def test_malformed_graph_raises_value_error(tmp_path, text):
    path = tmp_path / "graph.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="malformed draft graph"):
        load_graph(path, DecodeRule(MASK_ID, 4))


@pytest.mark.parametrize("budget", [0, -2])
def test_draft_budget_below_one_raises(budget):
    model, rule, graph = calibrated(4, "static")
    with pytest.raises(ValueError, match="draft budget D\\* must be >= 1"):
        spiffy_generate(model, tokens(5), 8, rule, graph=graph, draft_budget=budget)


# ============================================================================ build_drafts

def as_walked(graph):
    """The graph as spiffy_generate hands it to build_drafts: nodes as tuples of pairs."""
    return dict(graph, nodes=[tuple(map(tuple, n)) for n in graph["nodes"]])


def drafts_for(last, state, graph, budget, rule):
    """build_drafts as a round calls it: `state`'s ranks under `last`, brought to the host."""
    k = 1 + max(j for n in graph["nodes"] for _, j in n)
    ranked = to_host(*ranks(last, state, rule, k))
    return [torch.tensor(d) for d in build_drafts(ranked, state.tolist(), graph, budget, rule)[0]]


def trajectory(model, rule, prompt):
    """Plain decoding's states and logits for the first block (spiffy.trajectories' `record`
    hook, what calibration reads)."""
    seen = []
    with torch.no_grad():                 # (as spiffy.calibrate calls it)
        spiffy.trajectories(model, prompt, rule.block_size, rule, lambda states, logits: seen.append((states, logits)))
    assert seen and len(seen[0][0]) == len(seen[0][1]) + 1       # the block's states, one logits a step
    return seen[0]


def reveals(draft, state):
    """{position: token} where draft differs from state."""
    return {p: int(draft[p]) for p in (draft != state).nonzero().flatten().tolist()}


@pytest.mark.parametrize("rule_name", list(RULES))
def test_build_drafts_reveals_only_masked_positions_within_budget(rule_name):
    B = 8
    model, rule, _ = calibrated(B, rule_name)
    graph = as_walked(calibrated(B, rule_name, budget=16)[2])
    states, logits = trajectory(model, rule, tokens(B + 1, seed=6))
    sizes = set()
    for t in range(1, len(states) - 1):
        state, last = states[t], logits[t - 1]
        masked = set((state == MASK_ID).nonzero().flatten().tolist())
        applicable = [n for n in graph["nodes"] if all(i < len(masked) for i, _ in n)]
        for budget in (1, 3, 5, 16):
            drafts = drafts_for(last, state, graph, budget, rule)
            assert len(drafts) <= budget
            if budget >= len(graph["nodes"]):
                assert len(drafts) == len(applicable)
            revealed = [reveals(d, state) for d in drafts]
            assert len({tuple(d.tolist()) for d in drafts}) == len(drafts), "duplicate drafts"
            for r in revealed:
                assert r and set(r) <= masked and MASK_ID not in r.values()
                sizes.add(len(r))
            if rule.strategy == "low_confidence_static":
                # connected: each chosen node of k > 1 reveals has a chosen parent of k - 1
                for r in revealed:
                    assert len(r) == 1 or any(len(a) == len(r) - 1 and a.items() <= r.items()
                                              for a in revealed)
    assert max(sizes) >= 2, "no multi-step node was built: the checks would be vacuous"


def test_build_drafts_reads_ranks_off_the_last_distribution():
    """(i, j) = the position ranked i by top-1 confidence gets its j-th most likely token."""
    B = 8
    model, rule, _ = calibrated(B, "static")
    states, logits = trajectory(model, rule, tokens(3, seed=8))
    state, last = states[2], logits[1]
    masked = (state == MASK_ID).nonzero().flatten()
    p_target = rule.probs(last[masked])
    by_confidence = masked[p_target.max(-1).values.argsort(descending=True)].tolist()
    graph = dict(graph_rule(rule), nodes=[[[0, 0]], [[1, 2]], [[0, 0], [1, 0]]])
    drafts = drafts_for(last, state, as_walked(graph), 3, rule)
    expected = []
    for node in graph["nodes"]:
        e = {}
        for i, j in node:
            pos = by_confidence[i]
            e[pos] = int(rule.probs(last[pos][None])[0].argsort(descending=True)[j])
        expected.append(e)
    assert sorted(map(sorted, (reveals(d, state).items() for d in drafts))) == \
        sorted(map(sorted, (e.items() for e in expected)))


@pytest.mark.parametrize("rule_kw", [dict(), dict(temperature=0.8, top_p=0.9)], ids=["greedy", "top-p"])
def test_bounded_ranks_are_the_full_sorts_first_k(rule_kw):
    """A round reads each position's k most likely tokens (k: the graph's largest token rank
    + 1) off a top-k, calibration off the full sort: the same positions by rank and the same
    first k probabilities and tokens (of those that can be drawn: cut ones tie at 0); and the
    same from logits packed at the masked positions of the states stepped from."""
    B, V = 8, 4096
    rule = DecodeRule(MASK_ID, B, **rule_kw)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, B, V, generator=g) * 4
    known = torch.rand(3, B, generator=g) < 0.4
    before = torch.where(known, torch.randint(4, V, (3, B), generator=g), MASK_ID)
    before[:, :2] = MASK_ID
    after = before.clone()
    after[:, 0] = 5                                  # one step on: a masked position revealed
    for states in before, after:
        full_order, full_tok, full_p = ranks(logits, states, rule)
        m = (states == MASK_ID).sum(-1)              # (3,): ranks < m are the masked positions
        for k in 1, 3, 16:
            order, tok, p = ranks(logits, states, rule, k)
            assert torch.equal(order, full_order) and torch.equal(p, full_p[..., :k])
            drawable = p > 0
            assert torch.equal(tok[drawable], full_tok[..., :k][drawable])
            packed = ranks(logits[before == MASK_ID], states, rule, k, packed_at=before)
            read = (torch.arange(B) < m[:, None])[..., None] & drawable
            assert torch.equal(packed[0], order)
            assert torch.equal(packed[1][read], tok[read]) and torch.equal(packed[2][read], p[read])


def test_build_drafts_takes_a_graph_as_load_graph_returns_it(tmp_path):
    B = 8
    model, rule, graph = calibrated(B, "static")
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph))
    states, logits = trajectory(model, rule, tokens(3, seed=8))
    drafts = drafts_for(logits[1], states[2], load_graph(path, rule), 3, rule)
    expected = drafts_for(logits[1], states[2], as_walked(graph), 3, rule)
    assert [d.tolist() for d in drafts] == [d.tolist() for d in expected]
