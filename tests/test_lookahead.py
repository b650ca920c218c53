"""Decoding across the block boundary, CPU, tiny random models:

- SimSD with --lookahead K = 1..3 (the drafter drafts past the block; its states of the next
  block are verified in the same target forward, after the drafted block): lossless SimSD is
  plain decoding token for token, greedy and seeded sampling, every strategy, with prompts off
  the block grid and longer than a block, max_new_tokens ending inside a block, and a stop id
  inside a block the round reached ahead; the paper's and the gated rule (greedy, every draft
  drafted) give what they give without lookahead, in fewer target forwards.
- Spiffy's copies of the next block after a draft that finishes the block: plain decoding's
  tokens with a stop id inside a block it went on into.
- The KV cache after cross-block commits holds plain decoding's keys and values, whether a
  finished block is fused into the next forward or kept from its copy (copy_commit), and
  keeping it changes nothing but the query rows; the drafter's tentative commits are rolled
  back.

Run: python -m pytest tests/test_lookahead.py -q
"""
import copy
from functools import partial

import pytest
import torch

import costs
import speculate
from conftest import make_model
from decode import DecodeRule, Frontier, Session, generate
from model import PRESETS
from speculate import simsd_generate
from simsd_paper import accept_gated, accept_paper, copies_round
from spiffy import calibrate, spiffy_generate

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
    """Greedy, every masked position drafted (gamma unbounded, no draft_stop): the next block's
    drafts are the ones a fresh round would draft there, judged on the same logits, so
    lookahead changes the forward count only."""
    target, drafter = pair(B)
    rule = DecodeRule(MASK_ID, B)
    fewer = 0
    for k, (prompt, max_new) in enumerate(cases(B)):
        kw = dict(acceptance=acceptance, gamma=100, draft_stop=None, eos_id=NO_EOS)
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


@pytest.mark.parametrize("copy_commit", [True, False], ids=["kept", "recomputed"])
@pytest.mark.parametrize("fuse_commit", [True, False], ids=["fused", "separate"])
@pytest.mark.parametrize("method", ["simsd", "spiffy"])
def test_the_cache_after_cross_block_commits_is_plain_decodings(method, fuse_commit, copy_commit):
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
                                     fuse_commit=fuse_commit, eos_id=NO_EOS, copy_commit=copy_commit)
        else:
            out, st = spiffy_generate(target, prompt, max_new, rule, graph, fuse_commit=fuse_commit,
                                      eos_id=NO_EOS, copy_commit=copy_commit)
        assert out == plain
        for (k_want, v_want), (k_got, v_got) in zip(want, cache_rows(target, n)):
            torch.testing.assert_close(k_got, k_want, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(v_got, v_want, rtol=1e-5, atol=1e-5)


def query_rows(st):
    return sum(rows * n for rows, n in st["rows"].items())


@pytest.mark.parametrize("method", ["simsd-lossless", "simsd-paper", "simsd-gated", "spiffy"])
def test_keeping_a_finished_block_from_its_copy_changes_only_the_query_rows(method):
    """A block a round finished ahead, kept from its copy's keys and values (copy_commit),
    instead of fused into the next forward: the same tokens and forwards, B fewer query rows a
    kept block (a drafter that is the target: every round goes ahead)."""
    B = 4
    target = make_model(n_layer=2, block_size=B, seed=0)
    rule = DecodeRule(MASK_ID, B, strategy="low_confidence_dynamic", threshold=0.6)
    graph = calibrate(target, [tokens(5, 1), tokens(9, 2)], rule, 16) if method == "spiffy" else None
    saved = 0
    for k, (prompt, max_new) in enumerate(cases(B)):
        runs = [spiffy_generate(target, prompt, max_new, rule, graph, eos_id=NO_EOS, copy_commit=keep)
                if graph else simsd_generate(target, target, prompt, max_new, rule, acceptance=method[6:],
                                             lookahead=2, eos_id=NO_EOS, copy_commit=keep) for keep in (False, True)]
        (fused, st_fused), (kept, st_kept) = runs
        assert kept == fused and st_kept["nfe"] == st_fused["nfe"], k
        assert (query_rows(st_fused) - query_rows(st_kept)) % B == 0 and query_rows(st_kept) <= query_rows(st_fused)
        saved += query_rows(st_fused) - query_rows(st_kept)
    assert saved, "vacuous: no block was kept"


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


def test_the_drafters_tentative_commits_are_rolled_back():
    """Drafting ahead commits the drafted block to the drafter's cache for a while: after the
    round its session is where it was, and drafting again drafts the same."""
    B = 4
    sess, rule, block, pos = drafting(B)
    first = speculate.draft(sess, block, pos, rule, 3 * B, lookahead=2)
    assert first.per_block == [B, B, B] and (sess.committed, sess.pending) == (2 * B, None)
    again = speculate.draft(sess, block, pos, rule, 3 * B, lookahead=2)
    assert torch.equal(first.pos, again.pos) and torch.equal(first.tokens, again.tokens)
    assert first.pos.max() == 3 * B - 1 and first.states(block).shape == (3 * B + 3, B)


@pytest.mark.parametrize("method", ["simsd", "spiffy"])
def test_cost_sized_copies_never_change_the_output(method):
    """The copies a round verifies are sized by a forward cost model (cost=, costs.py): with a
    flat cost every draft is verified, with a steep one none; the tokens are plain decoding's
    either way, only the forward count moves."""
    B = 4
    target, drafter = pair(B)
    rule = DecodeRule(MASK_ID, B, strategy="low_confidence_dynamic", threshold=0.6)
    graph = calibrate(target, [tokens(5, 1), tokens(9, 2)], rule, 16) if method == "spiffy" else None
    nfe = {}
    for name, cost in (("none", None), ("flat", lambda n: 1.0), ("steep", lambda n: float(n) ** 3),
                       ("linear", lambda n: 1.0 + 0.2 * n)):     # (some states, not every one)
        nfe[name] = 0
        for k, (prompt, max_new) in enumerate(cases(B)):
            plain, _ = generate(target, prompt, max_new, rule, eos_id=NO_EOS)
            out, st = (simsd_generate(target, drafter, prompt, max_new, rule, lookahead=2, eos_id=NO_EOS, cost=cost)
                       if method == "simsd" else spiffy_generate(target, prompt, max_new, rule, graph, eos_id=NO_EOS,
                                                                 cost=cost))
            assert out == plain, (name, k)
            nfe[name] += st["nfe"]
            assert name != "steep" or max(st["rows"]) <= 3 * B   # the block alone (+ finished blocks)
    assert nfe["none"] == nfe["flat"] < nfe["steep"]             # no cost model: every copy verified


def test_a_draft_is_cut_to_the_prefix_that_pays():
    B = 4
    d = speculate.Draft(pos=torch.tensor([1, 0, 3, 2, 5]), tokens=torch.tensor([5, 6, 7, 8, 9]),
                        p_draft=torch.full((5, VOCAB), 0.9 / (VOCAB - 1)).index_put_(
                            (torch.arange(5), torch.tensor([5, 6, 7, 8, 9])), torch.tensor(0.9)),
                        tau=torch.arange(1, 6), per_block=[4, 1], mask_id=MASK_ID)
    assert d.sized(lambda n: 1.0).per_block == [4, 1]                  # flat: every draft
    assert d.sized(lambda n: float(n) ** 3).per_block == [0]           # steep: none
    four = d.prefix(4)                                                 # the block, and the next one's start
    assert four.per_block == [4, 0] and len(four.states(torch.full((B,), MASK_ID))) == 6


def step_draft(step_end):
    """Five drafts at 0.9 each: the open block's four, then the next block's first."""
    return speculate.Draft(pos=torch.tensor([1, 0, 3, 2, 5]), tokens=torch.tensor([5, 6, 7, 8, 9]),
                           p_draft=torch.full((5, VOCAB), 0.1 / (VOCAB - 1)).index_put_(
                               (torch.arange(5), torch.tensor([5, 6, 7, 8, 9])), torch.tensor(0.9)),
                           tau=torch.tensor([1, 1, 1, 1, 2]), per_block=[4, 1], mask_id=MASK_ID,
                           step_end=step_end)


def test_states_inside_a_drafter_step_are_the_first_a_cost_cuts():
    """The drafter drafted the open block in one step: the target's step, which also reveals
    several tokens at once, rarely stops inside it (INSIDE_STEP), so a cost that keeps two
    states keeps the block's end and the next block's first draft, not the states between."""
    B, cost = 4, (lambda n: 1.0 + 0.1 * n)
    d = step_draft([False, False, False, True, True]).sized(cost)
    assert d.keep == [3, 4] and d.per_block == [4, 1]
    counts, parent, src = d.layout(B, B)
    assert (counts, parent, src) == ([4, 0, 4, 3], [-1, -1, 1, 1], [0, 0, 0, 0, 2])
    states = d.states(torch.full((B,), MASK_ID))
    assert [int((s == MASK_ID).sum()) for s in states] == counts
    assert states[1].tolist() == [6, 5, 8, 7] and states[3].tolist() == [MASK_ID, 9, MASK_ID, MASK_ID]
    every = step_draft(None).sized(cost)                       # each draft its own step: a prefix
    assert every.keep is None and every.per_block == [4, 1]
    block = torch.full((B,), MASK_ID)                          # a walk that ended at a state cut
    assert d.cut_at(block, 0, [6, 5, MASK_ID, MASK_ID]) and not d.cut_at(block, 0, [6, 7, MASK_ID, MASK_ID])
    assert not d.cut_at(block, 1, [MASK_ID, 9, MASK_ID, MASK_ID]) and not every.cut_at(block, 0, [6, 5, 3, 3])


@pytest.mark.parametrize("seed", range(20))
def test_any_kept_set_of_states_is_laid_out_consistently(seed):
    """Whatever drafts a round keeps, each copy's count is its masks, a later block's copies
    continue the complete copy of the block before, and a draft is held from its src on."""
    B, gen = 4, torch.Generator().manual_seed(seed)
    sess, rule, block, pos = drafting(B)
    d = speculate.draft(sess, block, pos, rule, 3 * B, lookahead=2)
    n = len(d.pos)
    keep = sorted(torch.randperm(n, generator=gen)[:int(torch.randint(0, n + 1, (1,), generator=gen))].tolist())
    ends = {sum(d.per_block[:b + 1]) - 1 for b in range(len(d.per_block) - 1)}
    keep = [i for i in keep if all(e in keep for e in ends if e < i)]   # (what value order keeps)
    k = d.prefix(keep[-1] + 1 if keep else 0)
    k.keep = keep
    counts, parent, src = k.layout(B, B)
    states = k.states(block)
    assert [int((s == MASK_ID).sum()) for s in states] == counts
    for c, p in enumerate(parent or [-1] * len(counts)):
        assert p == -1 or (counts[p] == 0 and p < c)
    blocks = []                                               # each copy's block, by its parent
    for p in parent or [-1] * len(counts):
        blocks.append(0 if p == -1 else blocks[p] + 1)
    for i, (q, t) in enumerate(zip(k.pos.tolist(), k.tokens.tolist())):
        holds = [c for c, b in enumerate(blocks) if b > q // B or b == q // B and states[c][q % B] == t]
        assert min(holds, default=len(states)) == src[i] + 1


@pytest.mark.parametrize("seed", [6, 8])
@pytest.mark.parametrize("acceptance", ["paper", "gated"])
def test_the_papers_rules_verify_every_drafted_state_whatever_a_cost_table_kept(acceptance, seed):
    """The paper's and the gated rule read the state before each draft: a Draft whose cost table
    kept only some states (the lossless walk's sizing) gives them what the whole draft gives.
    (Prompts where the rules accept some drafts and reject one between two kept states.)"""
    B = 4
    target, drafter = pair(B)
    rule, prompt = DecodeRule(MASK_ID, B), torch.tensor(tokens(2 * B, seed))
    block, pos = torch.full((B,), MASK_ID), torch.arange(2 * B, 3 * B)
    dsess = Session(drafter, B, 12 * B)
    dsess.prefill(prompt)
    d = speculate.draft(dsess, block, pos, rule, 2 * B, lookahead=1)
    kept = copy.copy(d)
    kept.keep = [B - 1, len(d.pos) - 1]                           # each block's end only
    rules = dict(paper=accept_paper, gated=partial(accept_gated, gate=0.5))
    got = []
    for draft_ in (d, kept):
        tsess = Session(target, B, 12 * B)
        tsess.prefill(prompt)
        round_ = copies_round(tsess, lambda f, r, d=draft_: d, rule, rules[acceptance])
        adv, accepted, why = round_(Frontier(block, pos, B), 64)
        got.append((adv.front.host, adv.front.step, accepted, why))
    assert got[0] == got[1] and got[0][2] > 0


def test_the_drafter_stops_where_its_drafts_would_not_be_verified():
    """With the forward cost, draft stops once its newest drafts fall past the prefix worth
    verifying: a flat cost (every draft pays) drafts what no cost drafts, a steep one (no
    draft pays) stops after the drafter's first forward; what it drafted is the same prefix."""
    B = 4
    sess, rule, block, pos = drafting(B)
    drafts = {name: speculate.draft(sess, block, pos, rule, 3 * B, lookahead=2, cost=cost)
              for name, cost in (("none", None), ("flat", lambda n: 1.0), ("steep", lambda n: float(n) ** 3))}
    assert torch.equal(drafts["flat"].pos, drafts["none"].pos) and drafts["none"].per_block == [B, B, B]
    assert drafts["steep"].per_block == [1] and torch.equal(drafts["steep"].tokens, drafts["none"].tokens[:1])
    tau, ends = drafts["none"].tau.tolist(), drafts["none"].step_end     # where each step ended
    assert ends == [i + 1 == len(tau) or tau[i + 1] != tau[i] for i in range(len(tau))]


def test_the_forward_cost_is_measured_and_grows_with_the_copies():
    cost = costs.cost_of(costs.measure(make_model(n_layer=2, block_size=4), 4, repeats=1))
    assert 0 < cost(1) <= cost(2) <= cost(16) <= cost(20) and cost(3) <= cost(4)
