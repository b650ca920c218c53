"""Tests for decode.py's DecodeRule against SDAR's own decoder and its stated semantics.

- A trained target decodes exactly as SDAR's block_diffusion_generate does: the fixture
  holds SDAR's outputs and forward counts (greedy, static and threshold, B = 4 / 8 / 32,
  prompts off the block grid; how it was produced is in its "produced_by" field and the
  README) for the embedded target as it was then, kept beside it in fixtures/sdar_target;
  SDAR's code is not in this repository.
- Constructed cases for what the fixture cannot tell apart: the confidence counts the mask
  token, the threshold is strict, and each strategy reveals what it says.

Run: python -m pytest tests/test_decode.py -q
"""
import json
import math
from pathlib import Path

import pytest
import torch

from loading import checkpoint
import verify
from decode import STRATEGIES, DecodeRule, generate

ROOT = Path(__file__).resolve().parents[1]
SDAR = json.loads((Path(__file__).parent / "fixtures" / "sdar_reference.json").read_text())


@pytest.fixture(scope="module")
def target():
    return checkpoint.from_pretrained(Path(__file__).parent / "fixtures" / "sdar_target", dtype=torch.float32)


@pytest.mark.parametrize("B", [4, 8, 32])
@pytest.mark.parametrize("threshold", [1.0, 0.9], ids=["static", "threshold"])
def test_generate_matches_sdars_own_decoder(target, B, threshold):
    runs = [r for r in SDAR["runs"] if r["block_size"] == B and r["threshold"] == threshold]
    assert len(runs) == 24 and all(len(r["prompt_ids"]) % B for r in runs)
    rule = DecodeRule(target.config.mask_token_id, B, strategy="low_confidence_static"
                      if threshold == 1.0 else "low_confidence_dynamic", threshold=threshold)
    for r in runs:
        out, st = generate(target, r["prompt_ids"], SDAR["max_new_tokens"], rule, fuse_commit=False)
        assert (out, st["nfe"]) == (r["tokens"], r["nfe"])
        fused, st_fused = generate(target, r["prompt_ids"], SDAR["max_new_tokens"], rule)
        n_blocks = math.ceil((len(r["prompt_ids"]) % B + len(out) + 1) / B)   # + 1: the EOS
        assert fused == out and st_fused["nfe"] == r["nfe"] - n_blocks


MASK, V = 3, 6


def rows(*dists):
    """(n, V) logits whose softmax is each given distribution (zeros become -inf)."""
    return torch.tensor(dists).log()


def test_confidence_counts_the_mask_token_as_sdar_does():
    """Position 0 is sure of token 0 among real tokens (0.9 of their mass) but the mask token
    takes most of its softmax; position 1 is 0.6 sure. SDAR's confidence (whole vocabulary)
    reveals position 1 first; renormalising without the mask would reveal position 0."""
    logits = rows([0.09, 0.005, 0.005, 0.9, 0.0, 0.0], [0.6, 0.2, 0.1, 0.0, 0.05, 0.05])
    rule = DecodeRule(MASK, 2)
    assert rule(logits, torch.tensor([MASK, MASK]), 0).tolist() == [MASK, 0]
    assert rule.probs(logits)[0, 0] == pytest.approx(0.9)      # drawn from: mask removed


def test_a_token_is_never_the_mask_token():
    logits = rows([0.1, 0.05, 0.05, 0.8, 0.0, 0.0])
    new = DecodeRule(MASK, 1)(logits, torch.tensor([MASK]), 0)
    assert new.tolist() == [0]


def test_threshold_is_strict():
    logits = rows([0.9, 0.1, 0, 0, 0, 0], [0.95, 0.05, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0])
    block = torch.tensor([MASK] * 3)
    rule = DecodeRule(MASK, 3, strategy="low_confidence_dynamic", threshold=0.9)
    assert rule(logits, block, 0).tolist() == [MASK, 0, MASK]      # 0.9 is not > 0.9


def test_ties_go_to_the_leftmost_position():
    logits = rows(*[[0.5, 0.5, 0, 0, 0, 0]] * 4)
    new = DecodeRule(MASK, 4)(logits, torch.tensor([5, MASK, MASK, MASK]), 0)
    assert new.tolist() == [5, 0, MASK, MASK]


def test_sequential_reveals_the_leftmost_masks_whatever_the_confidence():
    logits = rows([0.2, 0.8, 0, 0, 0, 0], [0.4, 0.6, 0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0], [1.0, 0, 0, 0, 0, 0])
    rule = DecodeRule(MASK, 4, strategy="sequential", steps=2)                # quota 2
    assert rule(logits, torch.tensor([4, MASK, MASK, MASK]), 0).tolist() == [4, 1, 0, MASK]


def test_entropy_bounded_reveals_the_surest_run_under_the_bound():
    sure, fair, split = [0.99, 0.01, 0, 0, 0, 0], [0.9, 0.1, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0, 0]
    logits = rows(split, sure, fair, sure)
    h = lambda p: -sum(x * math.log(x) for x in p if x)
    assert 2 * h(sure) < 0.35 < 2 * h(sure) + h(fair)                          # SDAR's 0.35
    rule = DecodeRule(MASK, 4, strategy="entropy_bounded")
    assert rule(logits, torch.tensor([MASK] * 4), 0).tolist() == [MASK, 0, MASK, 0]
    # nothing under the bound: still one token, the surest
    assert DecodeRule(MASK, 4, strategy="entropy_bounded", eb_threshold=1e-6)(
        logits, torch.tensor([MASK] * 4), 0).tolist() == [MASK, 0, MASK, MASK]


def test_random_reveals_the_quota_at_positions_drawn_from_the_generator():
    logits = rows(*[[0.7, 0.3, 0, 0, 0, 0]] * 8)
    rule = DecodeRule(MASK, 8, strategy="random", steps=4)                    # quota 2
    block = torch.full((8,), MASK)
    seen = set()
    for seed in range(20):
        new = rule(logits, block, 0, torch.Generator().manual_seed(seed))
        again = rule(logits, block, 0, torch.Generator().manual_seed(seed))
        assert torch.equal(new, again) and int((new != MASK).sum()) == 2
        seen |= set((new != MASK).nonzero().flatten().tolist())
    assert len(seen) == 8


def test_top_confidence_is_the_confidence_of_the_most_likely_token():
    rule = DecodeRule(MASK, 4, temperature=0.7, top_k=3, top_p=0.9)
    logits = torch.randn(12, V, generator=torch.Generator().manual_seed(0)) * 3
    logits[0, MASK] = 50.0                                           # the mask never counts as best
    tokens = rule.probs(logits).argmax(-1)
    expected = (logits / 0.7).softmax(-1).gather(-1, tokens[:, None])[:, 0]
    torch.testing.assert_close(rule.best(logits)[1], expected)


@pytest.mark.parametrize("kw", [{}, dict(top_k=3), dict(top_p=0.5)], ids=["greedy", "top-k", "top-p"])
def test_a_greedy_pick_is_the_argmax_of_probs_without_its_softmax(kw):
    """Greedy, pick reads the most likely non-mask token off the logits (no softmax): the
    argmax of the distribution it would draw from, ties to the lowest id, and the same
    confidence bits as a draw of that token scores."""
    rule = DecodeRule(MASK, 4, **kw)
    logits = torch.randn(40, V, generator=torch.Generator().manual_seed(1)) * 4
    logits[0, MASK] = 50.0                                           # the mask is never picked
    logits[1, 2] = logits[1, 4] = logits[1].max() + 1                # a tie: the lower id
    tokens, confidence = rule.pick(logits)
    assert torch.equal(tokens, rule.probs(logits).argmax(-1)) and tokens[1] == 2
    peaked = logits.clone()
    peaked[torch.arange(len(tokens)), tokens] += 1e4            # a draw can only take the best token
    drawn, scored = DecodeRule(MASK, 4, temperature=1.0, **kw).pick(peaked, torch.Generator())
    assert torch.equal(drawn, tokens) and torch.equal(scored, rule.pick(peaked)[1])
    torch.testing.assert_close(confidence, logits.softmax(-1).gather(-1, tokens[:, None])[:, 0])


def test_decoding_ends_at_the_first_of_several_stop_ids_or_when_on_block_says_so(tiny_model):
    model = tiny_model(vocab=97)
    prompt = [5, 17, 40, 8, 61]
    free, st = generate(model, prompt, 24, eos_id=-1)
    assert st["stop"] == "max_new_tokens" and len(free) == 24
    a, b = free[9], free[4]                                  # two ids it emits; b comes first
    k = free.index(b)
    out, st = generate(model, prompt, 24, eos_id=[a, b])
    assert (out, st["stop"]) == (free[:k], "stop_id")
    model.config.stop_ids = (a, b)                           # the checkpoint's list, by default
    assert generate(model, prompt, 24)[0] == free[:k]
    assert generate(model, prompt, k, eos_id=[a, b])[1]["stop"] == "max_new_tokens"
    seen = []
    out, st = generate(model, prompt, 24, eos_id=-1, on_block=lambda new: seen.append(new) or len(seen) == 2)
    assert st["stop"] == "on_block" and out == seen[0] + seen[1] == free[:len(out)]



@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_packed_logits_step_as_every_positions_logits_do(strategy, temperature):
    """The decoders compute logits at the masked positions only (packed, in order): from
    them the rule takes the step it takes from every position's logits, a sampled one with
    the same draws for the same seed; a batch of blocks too (one (M, V) for them all)."""
    B, V, n = 8, 50, 3
    rule = DecodeRule(MASK, B, strategy=strategy, temperature=temperature, steps=4, eb_threshold=2.0)
    g = torch.Generator().manual_seed(0)
    for seed in range(10):
        logits = torch.randn(n, B, V, generator=g) * 3
        known = torch.rand(n, B, generator=g) < 0.5
        known[:, seed % B] = False                                  # at least one masked
        states = torch.where(known, torch.randint(4, V, (n, B), generator=g), MASK)
        for b in range(n):
            full = rule(logits[b], states[b], 1, torch.Generator().manual_seed(seed))
            packed = rule(logits[b][states[b] == MASK], states[b], 1, torch.Generator().manual_seed(seed))
            assert torch.equal(packed, full) and (full != states[b]).any()
        if verify.greedy_fixed_quota(rule):
            assert torch.equal(rule(logits[states == MASK], states, 1), rule(logits, states, 1))


def test_the_confidences_are_sdars():
    """Confidence: a token's probability under the temperature-scaled softmax over the whole
    vocabulary (mask token included); best's is its most likely non-mask token's."""
    rule, x = DecodeRule(3, 4, temperature=0.7, top_k=5), torch.randn(6, 11, generator=torch.Generator().manual_seed(0))
    tokens, confidence = rule.pick(x, torch.Generator().manual_seed(0))
    assert torch.allclose(confidence, (x / 0.7).softmax(-1).gather(-1, tokens[:, None]).squeeze(-1))
    best = (x / 0.7).softmax(-1).gather(-1, rule.best(x)[0][:, None]).squeeze(-1)
    assert torch.allclose(rule.best(x)[1], best)
    assert torch.equal(rule.best(x)[0], rule.scaled(x, no_mask=True).argmax(-1)) and (rule.best(x)[0] != 3).all()


@pytest.mark.parametrize("kw", [{}, dict(temperature=0.7, top_k=5), dict(temperature=1.0, top_p=0.8)])
def test_the_drafted_rows_probabilities_are_the_full_forwards_rows_to_the_bit(kw):
    """The drafter takes its drafted rows' distribution from every row's (speculate.draft:
    probs(logits)[take]): each row's softmax is its own, so it holds the bits of
    probs(logits[take]), and the logits are left as they were (scaled copies them)."""
    g = torch.Generator().manual_seed(1)
    for m in (1, 3, 8, 32):
        x = torch.randn(m, 2048, generator=g) * 4
        take = torch.randperm(m, generator=g)[:max(1, m // 3)]
        rule, x0 = DecodeRule(3, 4, **kw), x.clone()
        conf = rule.best(x)[1].clone()
        assert torch.equal(rule.probs(x)[take], DecodeRule(3, 4, **kw).probs(x[take]))
        assert torch.equal(x, x0), "the rule wrote into the logits"
        assert torch.equal(rule.best(x)[1], conf) and torch.equal(rule.scaled(x, no_mask=True)[:, 3], torch.full((m,), -torch.inf))
