"""Decoding across the block boundary, CPU, tiny random models:

- SimSD with --lookahead K = 1..3 (the drafter drafts past the block; its states of the next
  block are verified in the same target forward, after the drafted block): lossless SimSD is
  plain decoding token for token, greedy and seeded sampling, every strategy, with prompts off
  the block grid and longer than a block, max_new_tokens ending inside a block, and a stop id
  inside a block the round reached ahead; the paper's and the gated rule (greedy, every draft
  drafted) give what they give without lookahead, in fewer target forwards.
- Spiffy's copies of the next block after a draft that finishes the block: plain decoding's
  tokens with a stop id inside a block it went on into.
- The KV cache after cross-block commits (blocks kept from their copies) holds plain
  decoding's keys and values, with fused or separate commits; the drafter's tentative commits
  are rolled back.

Run: python -m pytest tests/test_lookahead.py -q
"""
import copy

import pytest
import torch

from measure import costs
import fast
import speculate
from conftest import make_model
from decode import DecodeRule, Frontier, Session, generate
from loading.checkpoint import PRESETS
from variants import simsd as simsd_generate

from spiffy import calibrate
from measure.counts import counting
from spiffy import spiffy_generate as spiffy_core
from verify import Guesses

spiffy_generate = counting(spiffy_core)   # with its rounds counted (measure/counts.py)

MASK_ID, VOCAB = PRESETS["tiny"]["mask_token_id"], PRESETS["tiny"]["vocab_size"]
NO_EOS = -1
RULES = {"static": dict(), "threshold": dict(strategy="low_confidence_dynamic", threshold=0.6),
         "random": dict(strategy="random"), "sequential": dict(strategy="sequential"),
         "entropy": dict(strategy="entropy_bounded", eb_threshold=0.5)}


def tokens(n, seed=0):
    return torch.randint(4, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def pair(B):
    """A 2-layer target and a drafter that mostly agrees with it (noise on its head)."""
    target = make_model(n_layer=2, block_size=B, seed=0)
    drafter = copy.deepcopy(target)
    with torch.no_grad():
        w = drafter.lm_head.weight
        w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(1)) * 0.1 * w.std())
    return target, drafter


def seeded(k):
    return torch.Generator().manual_seed(k)


def cases(B):
    """(prompt, max_new_tokens): off the grid and longer than a block, on the grid, and
    generations that end inside a block."""
    return [(tokens(3, 20), 3 * B), (tokens(B, 21), 3 * B - 1), (tokens(2 * B + 1, 22), 2 * B + 2),
            (tokens(5, 23), 4 * B - 3)]


@pytest.mark.parametrize("lookahead", [1, 3])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
@pytest.mark.parametrize("rule_name", list(RULES))
@pytest.mark.parametrize("B", [4, 8])
def test_lossless_simsd_across_blocks_equals_plain_decoding(B, rule_name, temperature, lookahead):
    target, drafter = pair(B)
    rule = DecodeRule(MASK_ID, B, temperature=temperature, **RULES[rule_name])
    crossed = 0
    for k, (prompt, max_new) in enumerate(cases(B)):
        plain, st_plain = generate(target, prompt, max_new, rule, eos_id=NO_EOS, generator=seeded(k))
        out, st = simsd_generate(target, drafter, prompt, max_new, rule, lookahead=lookahead,
                                 eos_id=NO_EOS, generator=seeded(k))
        assert out == plain, f"prompt {k}"
        assert len(out) == max_new
        crossed += st["nfe"] < st_plain["nfe"] and st["lookahead"] == lookahead
    assert crossed, "vacuous: no prompt saved a forward"


def stop_inside(target, rule, prompt, max_new, block):
    """A stop id that plain decoding first emits inside generated block `block` (0: the first)
    or the first block after it with a token new to the output, and plain decoding's output
    with it."""
    B, tail = rule.block_size, len(prompt) % rule.block_size
    plain, _ = generate(target, prompt, max_new, rule, eos_id=NO_EOS)
    starts = range(max(0, block * B - tail), len(plain), B)
    stop = next(t for s in starts for t in plain[s:s + B] if t not in plain[:s])
    return stop, generate(target, prompt, max_new, rule, eos_id=stop)[0]


@pytest.mark.parametrize("lookahead", [1, 3])
@pytest.mark.parametrize("B", [4, 8])
def test_a_stop_id_inside_a_block_reached_ahead_ends_decoding_where_plain_decoding_does(B, lookahead):
    target, drafter = pair(B)
    rule = DecodeRule(MASK_ID, B, strategy="low_confidence_dynamic", threshold=0.6)
    for k in range(4):
        prompt = tokens(3 + 2 * k, 40 + k)
        stop, plain = stop_inside(target, rule, prompt, 6 * B, block=1 + k % 2)
        out, st = simsd_generate(target, drafter, prompt, 6 * B, rule, lookahead=lookahead, eos_id=stop)
        assert out == plain and st["stop"] == "stop_id", k


@pytest.mark.parametrize("acceptance", ["paper", "gated"])
@pytest.mark.parametrize("B", [4, 8])
def test_paper_and_gated_rules_across_blocks_accept_what_they_accept_within_one(B, acceptance):
    """Greedy, every masked position drafted (gamma unbounded, no draft_stop, steps enough to
    draft the whole window): the next block's
    drafts are the ones a fresh round would draft there, judged on the same logits, so
    lookahead changes the forward count only."""
    target, drafter = pair(B)
    rule = DecodeRule(MASK_ID, B)
    fewer = 0
    for k, (prompt, max_new) in enumerate(cases(B)):
        kw = dict(acceptance=acceptance, gamma=100, draft_stop=None, eos_id=NO_EOS, draft_steps=3 * B)
        within, st0 = simsd_generate(target, drafter, prompt, max_new, rule, lookahead=0, **kw)
        across, st2 = simsd_generate(target, drafter, prompt, max_new, rule, lookahead=2, **kw)
        assert across == within, k
        fewer += st2["nfe"] < st0["nfe"]
        assert st2["nfe"] <= st0["nfe"]
    assert fewer, "vacuous: lookahead saved no forward"


def cache_rows(model, n):
    """The first n rows of every layer's keys and values."""
    return [(a.cache.k[..., :n, :].clone(), a.cache.v[..., :n, :].clone())
            for a in (layer.attn for layer in model.layers)]


@pytest.mark.parametrize("fuse_commit", [True, False], ids=["fused", "separate"])
@pytest.mark.parametrize("method", ["simsd", "spiffy"])
def test_the_cache_after_cross_block_commits_is_plain_decodings(method, fuse_commit):
    """Every block a round finished ahead is committed to the target's cache as plain decoding
    commits it: the rows of the prompt and every block before the last two are equal."""
    B = 4
    target, drafter = pair(B)
    rule = DecodeRule(MASK_ID, B, strategy="low_confidence_dynamic", threshold=0.6)
    graph = calibrate(target, [tokens(5, 1), tokens(9, 2)], rule, 16) if method == "spiffy" else None
    for k, (prompt, max_new) in enumerate(cases(B)):
        plain, _ = generate(target, prompt, max_new, rule, fuse_commit=fuse_commit, eos_id=NO_EOS)
        n = len(prompt) // B * B + (-(-(len(prompt) % B + max_new) // B) - 2) * B
        want = cache_rows(target, n)
        if method == "simsd":
            out, st = simsd_generate(target, drafter, prompt, max_new, rule, lookahead=2,
                                     fuse_commit=fuse_commit, eos_id=NO_EOS)
        else:
            out, st = spiffy_generate(target, prompt, max_new, rule, graph, fuse_commit=fuse_commit,
                                      eos_id=NO_EOS)
        assert out == plain
        for (k_want, v_want), (k_got, v_got) in zip(want, cache_rows(target, n)):
            torch.testing.assert_close(k_got, k_want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(v_got, v_want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("B", [4, 8])
def test_spiffy_goes_on_into_the_next_block_and_stops_where_plain_decoding_does(B):
    target = make_model(n_layer=2, block_size=B, seed=0)
    rule = DecodeRule(MASK_ID, B, strategy="low_confidence_dynamic", threshold=0.6)
    graph = calibrate(target, [tokens(5, 1), tokens(B + 2, 2), tokens(2 * B, 3)], rule, 16)
    ahead = 0
    for k in range(6):
        prompt = tokens(3 + 3 * k, 60 + k)
        stop, plain = stop_inside(target, rule, prompt, 6 * B, block=1 + k % 3)
        out, st = spiffy_generate(target, prompt, 6 * B, rule, graph, eos_id=stop)
        assert out == plain and st["stop"] == "stop_id", k
        ahead += st["blocks_ahead"]
    assert ahead, "vacuous: no round went on into the next block"


def drafting(B=4):
    """A one-layer drafter's session after two blocks of prompt, and the next block (all masks)."""
    drafter = make_model(n_layer=1, block_size=B, seed=3)
    sess = Session(drafter, B, 12 * B)
    sess.prefill(torch.tensor(tokens(2 * B, 5)))
    return sess, DecodeRule(MASK_ID, B), torch.full((B,), MASK_ID), torch.arange(2 * B, 3 * B)


def test_drafting_ahead_leaves_the_drafters_cache_where_it_was():
    """The drafter drafts the open block and the blocks past it in one window of scratch rows:
    after the round its session is where it was, and drafting again drafts the same; a block
    drafted whole is followed by the next one's, which starts from all masks."""
    B = 4
    sess, rule, block, pos = drafting(B)
    front = Frontier(block, pos, B, [MASK_ID] * B)
    settings = speculate.Settings(gamma=3 * B, draft_steps=3 * B, draft_threshold=None, draft_stop=None)
    first = speculate.draft(sess, front, rule, settings, 2, frozenset())
    assert sorted(first.pos) == list(range(3 * B)) and (sess.committed, sess.pending) == (2 * B, None)
    again = speculate.draft(sess, front, rule, settings, 2, frozenset())
    assert (first.pos, first.tokens) == (again.pos, again.tokens)
    g = speculate.drafted_states(front, first, 2, frozenset(), MASK_ID)
    assert g.copies.shape == (3 * B + 3, B) and g.after[B + 1] == B and g.n_masked[B + 1] == B


@pytest.mark.parametrize("method", ["simsd", "spiffy"])
def test_cost_sized_copies_never_change_the_output(method):
    """The copies a round verifies are sized by a forward cost model (fast.cutter, tools/costs.py):
    with a flat cost every copy is verified, with a steep one none but the open block; the
    tokens are plain decoding's either way, only the forward count moves."""
    B = 4
    target, drafter = pair(B)
    rule = DecodeRule(MASK_ID, B, strategy="low_confidence_dynamic", threshold=0.6)
    graph = calibrate(target, [tokens(5, 1), tokens(9, 2)], rule, 16) if method == "spiffy" else None
    nfe = {}
    for name, cost in (("none", None), ("flat", lambda n: 1.0), ("steep", lambda n: float(n) ** 3),
                       ("linear", lambda n: 1.0 + 0.2 * n)):     # (some states, not every one)
        nfe[name], cut = 0, fast.cutter(cost, None, B)
        for k, (prompt, max_new) in enumerate(cases(B)):
            plain, _ = generate(target, prompt, max_new, rule, eos_id=NO_EOS)
            out, st = (simsd_generate(target, drafter, prompt, max_new, rule, lookahead=2, eos_id=NO_EOS, cut=cut)
                       if method == "simsd" else spiffy_generate(target, prompt, max_new, rule, graph, eos_id=NO_EOS,
                                                                 cut=cut))
            assert out == plain, (name, k)
            nfe[name] += st["nfe"]
            assert name != "steep" or max(st["rows"]) <= 3 * B   # the block alone (+ finished blocks)
    assert nfe["none"] == nfe["flat"] < nfe["steep"]             # no cost model: every copy verified


def test_the_copies_are_cut_to_the_prefix_that_pays():
    """fast.sized: the prefix with the most expected steps a second (reach: each copy's)."""
    g = Guesses(torch.zeros(5, 4, dtype=torch.long), [4, 3, 2, 1, 0], None, [1.0, 0.9, 0.8, 0.1, 0.05])
    assert len(fast.sized(g, lambda n: 1.0).n_masked) == 5                     # flat: every copy
    assert len(fast.sized(g, lambda n: float(n) ** 3).n_masked) == 1           # steep: none
    assert len(fast.sized(g, lambda n: 1.0 + 0.3 * n).n_masked) == 3           # 2.7 / 1.9 is the best
    assert fast.sized(g, lambda n: 1.0 + 0.3 * n).reach == [1.0, 0.9, 0.8]
    assert fast.cutter(None, None, 4) is None and len(fast.cutter(None, 9, 4)(g).n_masked) == 2


def test_the_forward_cost_is_measured_and_grows_with_the_copies():
    cost = costs.cost_of(costs.measure(make_model(n_layer=2, block_size=4), 4, repeats=1))
    assert 0 < cost(1) <= cost(2) <= cost(16) <= cost(20) and cost(3) <= cost(4)
