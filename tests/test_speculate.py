"""Tests for speculate.py (SimSD, docs/design.md section 3) on tiny random "peaky" models, CPU.

- verify: for a one-layer target every mask slot's logits equal plain decoding's at that
  position and step (a cache-free reference built here), for random step maps with known and
  undrafted positions, with and without a cached prefix and a pending finished block. Deeper
  targets are only approximate, so there the mask verify builds is checked against the rules
  and the flex path against the dense one.
- accept: greedy prefix-and-correction; the sampling rule reproduces p_target (chi-square).
- variants.simsd (simsd_generate with the command lines' names): drafter = target reproduces
  plain decoding with every draft accepted; rejections leave no trace in the target's cache; ablations, input checks and statistics.

Run: python -m pytest tests/test_speculate.py -q
"""
import copy
import itertools
import math
import random
import types
from collections import Counter

import pytest
import torch

import mask
import variants

import fast
import speculate
from decode import DecodeRule, Frontier, Session, generate
from loading.checkpoint import PRESETS
from speculate import Draft
from measure.counts import Counts
from verify import verify_copies, walk

MASK_ID = PRESETS["tiny"]["mask_token_id"]
VOCAB = PRESETS["tiny"]["vocab_size"]
NO_EOS = -1     # an eos_id that never occurs: fixed-length output


def front_of(block, pos):
    """The round loop's frontier for `block` at positions `pos` (its host copy too)."""
    return Frontier(block, pos, int((block == MASK_ID).sum()), block.tolist())


def verify(sess, block, pos, d, rule, rope_copy=True):
    return speculate.verify_temporal(sess, front_of(block, pos), d, rule, rope_copy)


def accept(logits, block, d, rule, generator=None):
    new, k = speculate.accept_temporal(logits, front_of(block, torch.arange(len(block))), d,
                                       rule, generator)
    return new, int(k)


def assert_logits_close(actual, expected):
    """fp32 agreement to 1e-5 of the logits' scale (the peaky model's logits reach about 30)."""
    scale = max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(actual, expected, atol=1e-5 * scale, rtol=0)


def tokens(n, seed=0, vocab=VOCAB):
    """n random ordinary token ids (above the special ids 0..3)."""
    return torch.randint(4, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# ============================================================================ verify

def random_round(B, n_known, n_drafted, seed):
    """A block with n_known known positions (tau = 0) and a hand-made draft of n_drafted of
    its masked positions in a random order (tau = 1..n_drafted); the other masked positions
    stay undrafted. -> (block, Draft, {position: tau})."""
    rng = random.Random(seed)
    order = rng.sample(range(B), B)
    known, drafted = order[:n_known], order[n_known:n_known + n_drafted]
    block = torch.full((B,), MASK_ID)
    block[known] = torch.tensor(tokens(n_known, seed=seed + 1), dtype=torch.long)
    d = Draft(pos=drafted, tokens=tokens(n_drafted, seed=seed + 2),
              p_draft=torch.full((n_drafted, VOCAB), 1.0 / VOCAB),
              tau=list(range(1, n_drafted + 1)))
    tau = {p: 0 for p in known}
    tau.update({p: k + 1 for k, p in enumerate(drafted)})
    return block, d, tau


@torch.no_grad()
def target_session(model, B, n_prefix_blocks, pending, seed):
    """A target session that has committed n_prefix_blocks random blocks and, if `pending`,
    holds one more finished block waiting for the next forward (fused commit).
    -> (session, the committed sequence as a list, position ids of the current block)."""
    sess = Session(model, B, max_len=8 * B, fuse_commit=True)
    seq = tokens(n_prefix_blocks * B, seed=seed + 3)
    sess.prefill(torch.tensor(seq, dtype=torch.long))
    if pending:
        finished = tokens(B, seed=seed + 4)
        sess.commit(torch.tensor(finished, dtype=torch.long))
        seq = seq + finished
    return sess, seq, torch.arange(len(seq), len(seq) + B)


def plain_slot_logits(model, seq, block, d):
    """What plain decoding computes for each slot, without SimSD's machinery: a cache-free,
    block-causal forward of [committed sequence ; the block as it was just before the slot's
    step] (known tokens and the drafts of earlier steps revealed, the rest masked), read at
    the slot's position. Order: drafted slots in draft order, then undrafted positions."""
    B, start = len(block), len(seq)
    rows = []
    for k in range(len(d.pos) + 1):
        state = block.clone()
        state[d.pos[:k]] = torch.tensor(d.tokens[:k], dtype=torch.long)  # drafts, tau' < k + 1
        with torch.no_grad():
            logits = model(torch.tensor([seq + state.tolist()]))[0, start:start + B]
        if k < len(d.pos):
            rows.append(logits[d.pos[k]])
        else:                                                 # undrafted: after every step
            undrafted = [p for p in range(B) if state[p] == MASK_ID]
            rows += [logits[p] for p in undrafted]
    return torch.stack(rows)


# (block size, committed prefix blocks, pending finished block, known, drafted); the drafted
# count below the number of masks leaves undrafted positions (gamma < masks)
VERIFY_CASES = [
    (8, 0, False, 0, 8),
    (8, 0, True, 1, 4),
    (8, 1, False, 2, 6),
    (8, 1, True, 0, 1),
    (8, 2, False, 5, 3),
    (8, 2, True, 3, 2),
    (8, 1, False, 0, 3),
    (4, 3, True, 1, 3),
    (4, 0, False, 2, 1),
]
VERIFY_IDS = [f"B{c[0]}-prefix{c[1]}-{'pending' if c[2] else 'nopending'}-known{c[3]}-drafted{c[4]}"
              for c in VERIFY_CASES]


@pytest.mark.parametrize("B, n_prefix_blocks, pending, n_known, n_drafted", VERIFY_CASES,
                         ids=VERIFY_IDS)
def test_verify_slots_equal_plain_decoding_for_a_one_layer_target(
        tiny_model, B, n_prefix_blocks, pending, n_known, n_drafted):
    model = tiny_model(n_layer=1, block_size=B)
    rule = DecodeRule(MASK_ID, B)
    for seed in range(3):
        block, d, _ = random_round(B, n_known, n_drafted, seed=100 * seed + n_drafted)
        sess, seq, pos = target_session(model, B, n_prefix_blocks, pending, seed)
        with torch.no_grad():
            logits = verify(sess, block, pos, d, rule)
        assert logits.shape == (B - n_known, VOCAB)
        assert sess.committed == len(seq) and sess.pending is None   # the fused commit landed
        assert_logits_close(logits, plain_slot_logits(model, seq, block, d))


def section_visibility(tok, pos, start, tau, n_drafted):
    """The SimSD rules of DESIGN 3, restated over the section verify built (identified by
    token and position id, so independent of its layout): a data token at step t sees data
    with t' <= t and slots with t' > t; a slot at step t sees data with t' < t and slots with
    t' >= t. Known data have t = 0; undrafted slots come after every drafted step."""
    S = len(tok)
    is_slot = [t == MASK_ID for t in tok]
    step = [tau.get(p - start, n_drafted + 1) if slot else tau[p - start]
            for p, slot in zip(pos, is_slot)]
    rows = []
    for q in range(S):
        row = []
        for k in range(S):
            if is_slot[q]:
                row.append(step[k] >= step[q] if is_slot[k] else step[k] < step[q])
            else:
                row.append(step[k] > step[q] if is_slot[k] else step[k] <= step[q])
        rows.append(row)
    return torch.tensor(rows), is_slot


def spy_forwards(sess):
    """Record what each forward of `sess` is given (section tokens, positions, mask)."""
    calls, real = [], sess.forward

    def forward(tok, pos, mask_for, keep):
        n_commit = 0 if sess.pending is None else len(sess.pending)
        q_len = n_commit + len(tok)
        dense = mask.dense_mask(mask_for(sess.committed, n_commit), q_len, sess.committed + q_len)
        calls.append(dict(tokens=tok.tolist(), pos=pos.tolist(), committed=sess.committed,
                          n_commit=n_commit, mask=dense))
        return real(tok, pos, mask_for, keep=keep)
    sess.forward = forward
    return calls


@pytest.mark.parametrize("B, n_prefix_blocks, pending, n_known, n_drafted",
                         [VERIFY_CASES[i] for i in (1, 4, 5, 7)],
                         ids=[VERIFY_IDS[i] for i in (1, 4, 5, 7)])
def test_verify_mask_follows_the_temporal_rules_for_a_deeper_target(
        tiny_model, B, n_prefix_blocks, pending, n_known, n_drafted):
    """For two or more layers the slots are only approximate: a slot at step t also sees
    slots of later steps, whose own hidden states were built from a context holding data
    revealed after t. So here the mask verify uses is checked against the rules, the flex
    path against the dense one, and the slots are shown to differ from plain decoding."""
    model = tiny_model(n_layer=2, block_size=B)
    rule = DecodeRule(MASK_ID, B)
    block, d, tau = random_round(B, n_known, n_drafted, seed=7)
    out = {}
    for impl in ("sdpa", "flex"):
        model.attn_impl = impl
        sess, seq, pos = target_session(model, B, n_prefix_blocks, pending, seed=7)
        calls = spy_forwards(sess)
        with torch.no_grad():
            out[impl] = verify(sess, block, pos, d, rule)
    model.attn_impl = None
    assert_logits_close(out["flex"], out["sdpa"])

    (call,) = calls
    start, shared = len(seq), call["committed"] + call["n_commit"]
    assert call["n_commit"] == (B if pending else 0)
    # the section: each known or drafted position once as data (holding its token), each
    # masked position once as a slot carrying its data token's position (RoPE copy)
    data = {p - start: t for t, p in zip(call["tokens"], call["pos"]) if t != MASK_ID}
    slots = [p - start for t, p in zip(call["tokens"], call["pos"]) if t == MASK_ID]
    drafted = dict(zip(d.pos, d.tokens))
    assert data == {**{p: int(block[p]) for p in range(B) if block[p] != MASK_ID}, **drafted}
    assert sorted(slots) == [p for p in range(B) if block[p] == MASK_ID]

    expected, is_slot = section_visibility(call["tokens"], call["pos"], start, tau, n_drafted)
    dense = call["mask"]
    assert dense[:, :shared].all(), "every query sees the cache and the finished block"
    assert not dense[:call["n_commit"], shared:].any(), "the finished block sees no section token"
    section = dense[call["n_commit"]:, shared:]
    bad = (section != expected).nonzero().tolist()
    assert not bad, f"section mask differs from the rules at (query, key) {bad[:5]}"
    assert sum(is_slot) == len(out["sdpa"])

    # the approximation is real: some slot is off plain decoding by more than fp32 noise
    ref = plain_slot_logits(model, seq, block, d)
    assert (out["sdpa"] - ref).abs().max() > 1e-3 * ref.abs().max()


def test_verify_without_rope_copy_changes_the_slot_logits(tiny_model):
    B = 8
    model = tiny_model(n_layer=1, block_size=B)
    rule = DecodeRule(MASK_ID, B)
    block, d, _ = random_round(B, 2, 4, seed=3)
    sess, seq, pos = target_session(model, B, 1, pending=False, seed=3)
    with torch.no_grad():
        copied = verify(sess, block, pos, d, rule, rope_copy=True)
        own = verify(sess, block, pos, d, rule, rope_copy=False)
    assert_logits_close(copied, plain_slot_logits(model, seq, block, d))
    assert (copied - own).abs().amax(-1).min() > 1e-3, "a slot ignored its RoPE position"


# ============================================================================ accept

def test_greedy_accept_takes_the_matching_prefix_then_the_targets_correction():
    B, V = 4, 8
    rule = DecodeRule(MASK_ID, B)
    block = torch.tensor([MASK_ID, 5, MASK_ID, MASK_ID])
    target_argmax = [6, 7, 4]                    # the target's argmax at the slots of 2, 0, 3
    logits = torch.full((3, V), -5.0)
    d = Draft(pos=[2, 0, 3], tokens=[6, 7, 0], p_draft=torch.full((3, V), 1.0 / V), tau=[1, 2, 3])
    for row, tok in enumerate(target_argmax):
        logits[row, tok] = 5.0
    new, n_accepted = accept(logits, block, d, rule)
    assert n_accepted == 2                        # 6 and 7 match, then 0 != 4
    assert new.tolist() == [7, 5, 6, 4]           # the third slot gets the target's argmax

    # every draft accepted and a mask left: the target's own step (one token a step: its most
    # confident undrafted slot)
    d2 = Draft(pos=[2], tokens=[6], p_draft=torch.full((1, V), 1.0 / V), tau=[1])
    logits2 = torch.full((3, V), -5.0)            # slots: drafted 2, undrafted 0 and 3
    logits2[0, 6], logits2[1, 4], logits2[2, 7] = 5.0, 2.0, 9.0
    new, n_accepted = accept(logits2, block, d2, rule)
    assert n_accepted == 1 and new.tolist() == [MASK_ID, 5, 6, 7]


# six ordinary tokens 0..5, plus the mask id 6 (its probability is 0 under both)
P_TARGET = torch.tensor([0.30, 0.25, 0.15, 0.12, 0.10, 0.08, 0.0])
P_DRAFT = torch.tensor([0.10, 0.15, 0.35, 0.05, 0.20, 0.15, 0.0])
# chi-square critical value for 6 categories (5 degrees of freedom) at alpha = 0.001:
# P(chi2_5 > 20.515) = 0.001 (standard tables; scipy.stats.chi2.ppf(0.999, 5) = 20.5150)
CHI2_5DOF_ALPHA_0001 = 20.515


def chi_square(samples, p):
    n, k = len(samples), int((p > 0).sum())
    observed = torch.bincount(samples, minlength=len(p))[:k].double()
    expected = n * p[:k].double()
    return float(((observed - expected) ** 2 / expected).sum())


def test_sampling_acceptance_reproduces_p_target():
    """Speculative sampling: accept d ~ p_draft with probability min(1, p_target(d) /
    p_draft(d)), else draw from norm(max(0, p_target - p_draft)); the result is distributed
    as p_target. 50k one-draft rounds through `accept` at a fixed seed, chi-square tested."""
    rule = DecodeRule(mask_id=6, block_size=1, temperature=1.0)
    logits = P_TARGET.log()[None]                 # rule.probs(logits) == P_TARGET
    torch.testing.assert_close(rule.probs(logits.clone())[0], P_TARGET)
    g = torch.Generator().manual_seed(0)
    n = 50_000
    drafts = torch.multinomial(P_DRAFT, n, replacement=True, generator=g)
    block, listed = torch.tensor([6]), drafts.tolist()
    drawn, n_accepted = torch.empty(n, dtype=torch.long), 0
    for k in range(n):
        new, a = accept(logits, block, Draft([0], listed[k:k + 1], [1], P_DRAFT[None]), rule, g)
        drawn[k], n_accepted = new[0], n_accepted + a
    assert chi_square(drawn, P_TARGET) < CHI2_5DOF_ALPHA_0001
    # the test has power: the draft tokens themselves are far from p_target
    assert chi_square(drafts, P_TARGET) > CHI2_5DOF_ALPHA_0001
    # acceptance rate = sum min(p_target, p_draft) = 0.65
    assert abs(n_accepted / n - float(torch.minimum(P_TARGET, P_DRAFT).sum())) < 0.01


# ============================================================================ simsd_generate

def drafted_per_round(B, tail, max_new, gamma):
    """Drafts per round when every draft is accepted: min(gamma, masks) each round, and a
    bonus token from the undrafted slots whenever masks remain."""
    rounds, masks = [], B - tail
    n_blocks = math.ceil((tail + max_new) / B)
    for b in range(n_blocks):
        m = masks if b == 0 else B
        while m:
            n = min(gamma, m)
            rounds.append(n)
            m -= n + (n < m)
    return rounds


VARIANTS = [dict(verifier="temporal", acceptance="paper"), dict(verifier="copies", acceptance="paper", lookahead=0),
            dict(verifier="copies", acceptance="gated", lookahead=0),
            dict(verifier="copies", acceptance="lossless", lookahead=0)]   # within the block
VARIANT_IDS = ["temporal-paper", "copies-paper", "copies-gated", "copies-lossless"]


@pytest.mark.parametrize("variant", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("B, gamma", [(4, 4), (4, 2), (8, 8), (8, 3)])
def test_drafter_equal_to_a_one_layer_target_accepts_everything_and_decodes_plainly(
        tiny_model, B, gamma, variant):
    target = tiny_model(n_layer=1, block_size=B)
    drafter = copy.deepcopy(target)
    rule = DecodeRule(MASK_ID, B)
    for prompt_len in (3, 2 * B, 2 * B + 3):
        prompt, max_new = tokens(prompt_len, seed=prompt_len), 3 * B
        plain, _ = generate(target, prompt, max_new, rule, eos_id=NO_EOS)
        out, stats = variants.simsd(target, drafter, prompt, max_new, rule, gamma=gamma,
                                    draft_steps=gamma, eos_id=NO_EOS, draft_threshold=None,
                                    draft_stop=None, vary=False, **variant)   # (the chain alone)
        assert out == plain and len(set(out)) > 2
        rounds = drafted_per_round(B, prompt_len % B, max_new, gamma)
        assert stats["accept_hist"] == dict(sorted(Counter(rounds).items()))


def test_a_target_drafting_for_itself_decodes_plainly(tiny_model):
    """The same model object as target and drafter (both sessions share its cache)."""
    B = 4
    model = tiny_model(n_layer=1, block_size=B)
    prompt = tokens(10, seed=1)
    plain, _ = generate(model, prompt, 12, eos_id=NO_EOS)
    out, stats = variants.simsd(model, model, prompt, 12, gamma=3, eos_id=NO_EOS,
                                draft_threshold=None, draft_stop=None, lookahead=0)
    rounds = drafted_per_round(B, len(prompt) % B, 12, 3)
    assert out == plain and stats["accept_hist"] == dict(sorted(Counter(rounds).items()))


def run_recorded(monkeypatch, target, drafter, prompt, max_new, **kwargs):
    """simsd_generate with every round recorded: the verify inputs and logits, the
    committed length of the target session, the drafts and the number accepted."""
    rounds = []

    real_verify, real_accept = speculate.verify_temporal, speculate.accept_temporal

    def spy_verify(sess, front, d, rule, rope_copy=True):
        logits = real_verify(sess, front, d, rule, rope_copy)
        rounds.append(dict(block=front.block.clone(), pos=front.pos.clone(), d=d, logits=logits,
                           committed=sess.committed))
        return logits

    def spy_accept(logits, front, d, rule, generator=None):
        new, n = real_accept(logits, front, d, rule, generator)
        rounds[-1].update(accepted=int(n), drafted=len(d.pos))
        return new, n
    monkeypatch.setattr(speculate, "verify_temporal", spy_verify)   # where temporal_round looks
    monkeypatch.setattr(speculate, "accept_temporal", spy_accept)   # them up
    kwargs = dict(dict(verifier="temporal", acceptance="paper", draft_threshold=None,
                       draft_stop=None), **kwargs)
    out, stats = variants.simsd(target, drafter, prompt, max_new, **kwargs)
    monkeypatch.undo()
    return out, stats, rounds


@pytest.mark.parametrize("fuse_commit", [True, False])
def test_rejected_drafts_leave_no_trace_in_the_target_cache(tiny_model, monkeypatch, fuse_commit):
    """After a round with a rejection, the next verify forward gives the logits of a fresh
    session that only saw the committed sequence (prompt + finished blocks)."""
    B = 4
    target = tiny_model(n_layer=2, block_size=B, seed=0)
    drafter = tiny_model(n_layer=1, block_size=B, seed=5)
    prompt = tokens(10, seed=2)
    out, stats, rounds = run_recorded(monkeypatch, target, drafter, prompt, 16,
                                      gamma=3, fuse_commit=fuse_commit, eos_id=NO_EOS)
    seq, checked = prompt + out, 0
    for prev, cur in zip(rounds, rounds[1:]):
        if prev["accepted"] == prev["drafted"]:
            continue
        checked += 1
        start = int(cur["pos"][0])
        with torch.no_grad():
            fresh = Session(target, B, max_len=len(seq) + 4 * B)
            fresh.prefill(torch.tensor(seq[:start], dtype=torch.long))
            logits = verify(fresh, cur["block"], cur["pos"], cur["d"], DecodeRule(MASK_ID, B))
        assert_logits_close(cur["logits"], logits)
    assert checked >= 3, "too few rejections: the test would pass vacuously"


def test_the_rope_copy_ablation_moves_the_slots_past_the_block(tiny_model, monkeypatch):
    """rope_copy=False: every mask slot of the temporal verifier sits after the block (the
    paper's ablation); by default each sits at its data token's position, inside the block."""
    B = 4
    target = tiny_model(n_layer=2, block_size=B, seed=0)
    drafter = tiny_model(n_layer=1, block_size=B, seed=5)
    verify, offsets = speculate.verify_temporal, []

    def spy(sess, front, d, rule, rope_copy=True):   # the slots' positions, from the block's start
        forward = sess.forward
        sess.forward = lambda tokens, pos, mask_for, keep, rows=None: (
            offsets.append((pos[len(pos) - keep:] - front.pos[0]).tolist()),
            forward(tokens, pos, mask_for, keep=keep, rows=rows))[1]
        try:
            return verify(sess, front, d, rule, rope_copy)
        finally:
            del sess.forward
    monkeypatch.setattr(speculate, "verify_temporal", spy)
    for kwargs in (dict(), dict(rope_copy=False), dict(order="position", rope_copy=False, gamma=2)):
        offsets.clear()
        out, stats = variants.simsd(target, drafter, tokens(6, seed=4), 13, eos_id=NO_EOS,
                                    verifier="temporal", acceptance="paper", **kwargs)
        assert len(out) == 13 and stats["tokens"] == 13 and MASK_ID not in out
        slots = [x for o in offsets for x in o]
        assert slots and all((x >= B) if "rope_copy" in kwargs else (0 <= x < B) for x in slots)


def test_position_order_verifies_left_to_right(tiny_model, monkeypatch):
    """order="position": the step map follows the positions, whatever the drafter's order."""
    B = 8
    target = tiny_model(n_layer=1, block_size=B, seed=0)
    drafter = tiny_model(n_layer=1, block_size=B, seed=5)
    _, _, rounds = run_recorded(monkeypatch, target, drafter, tokens(3, seed=6), 10,
                                order="position", eos_id=NO_EOS, draft_steps=B)
    assert all(r["d"].pos == sorted(r["d"].pos) for r in rounds)
    _, _, rounds = run_recorded(monkeypatch, target, drafter, tokens(3, seed=6), 10,
                                eos_id=NO_EOS, draft_steps=B)
    assert any(r["d"].pos != sorted(r["d"].pos) for r in rounds)


@pytest.mark.parametrize("kwargs, message", [
    (dict(gamma=-1), "gamma and --draft-steps must be >= 1"),
    (dict(gamma=0), "gamma and --draft-steps must be >= 1"),
    (dict(order="random"), "unknown order 'random': choose tau or position"),
    (dict(order="position"), "the order ablation applies to the temporal verifier only"),
    (dict(lookahead=-1), r"--lookahead must be an int >= 0 \(0 with --verify temporal\): -1"),
    (dict(lookahead=1.5), r"--lookahead must be an int >= 0 .*: 1.5"),
    (dict(lookahead=1, verifier="temporal", acceptance="paper"), r"--lookahead must be .*: 1"),
], ids=["gamma=-1", "gamma=0", "order", "order-copies", "lookahead=-1", "lookahead=1.5",
         "lookahead-temporal"])
def test_bad_settings_raise(tiny_model, kwargs, message):
    model = tiny_model(n_layer=1)
    with pytest.raises(ValueError, match=message):
        variants.simsd(model, copy.deepcopy(model), tokens(5), 8, **kwargs)


@pytest.mark.parametrize("overrides", [dict(vocab=101), dict(mask_token_id=4)],
                         ids=["vocab", "mask_id"])
@pytest.mark.parametrize("entry", [variants.simsd, speculate.simsd_generate])
def test_drafter_with_another_vocabulary_raises(tiny_model, overrides, entry):
    with pytest.raises(ValueError, match="drafter and target differ in vocabulary size or mask"):
        entry(tiny_model(n_layer=1), tiny_model(n_layer=1, **overrides), tokens(5), 8)


@pytest.mark.parametrize("fuse_commit", [True, False])
@pytest.mark.parametrize("prompt_len", [3, 9])
def test_stats_count_every_forward(tiny_model, monkeypatch, fuse_commit, prompt_len):
    B = 4
    target = tiny_model(n_layer=2, block_size=B, seed=0)
    drafter = tiny_model(n_layer=1, block_size=B, seed=5)
    counts = Counter()
    hooks = [m.register_forward_hook(lambda mod, args, out, name=name: counts.update([name]))
             for name, m in (("target", target), ("drafter", drafter))]
    max_new = 14
    out, stats, rounds = run_recorded(monkeypatch, target, drafter, tokens(prompt_len, seed=8),
                                      max_new, gamma=3, fuse_commit=fuse_commit, eos_id=NO_EOS)
    for h in hooks:
        h.remove()
    assert stats["nfe"] == counts["target"] and stats["nfe_draft"] == counts["drafter"]
    assert stats["tokens"] == len(out) == max_new
    n_blocks = math.ceil((prompt_len % B + max_new) / B)
    commits = 0 if fuse_commit else n_blocks          # SDAR's separate commit forwards
    prefill = int(prompt_len >= B)
    assert len(rounds) == sum(stats["accept_hist"].values())
    assert stats["nfe"] == prefill + len(rounds) + commits
    assert stats["nfe_draft"] == sum(r["drafted"] for r in rounds) + commits   # its prefill: in its first
    assert stats["accept_hist"] == dict(sorted(Counter(r["accepted"] for r in rounds).items()))
    assert any(r["accepted"] < r["drafted"] for r in rounds)


# ============================================================================ exact verifier

def perturbed(model, seed, scale=0.1):
    """A drafter that mostly agrees with `model`: a copy with noise on its output head."""
    drafter = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = drafter.lm_head.weight
        w.add_(torch.randn(w.shape, generator=g) * scale * w.std())
    return drafter


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
@pytest.mark.parametrize("rule_kw", [dict(), dict(strategy="low_confidence_dynamic", threshold=0.6),
                                     dict(strategy="random"), dict(strategy="sequential"),
                                     dict(strategy="entropy_bounded", eb_threshold=0.5)],
                         ids=["static", "threshold", "random", "sequential", "entropy"])
@pytest.mark.parametrize("B", [4, 8])
def test_lossless_simsd_equals_plain_decoding(tiny_model, monkeypatch, B, rule_kw, temperature):
    """The target's rule walked through the drafter's exact states and their siblings (no cost
    table: every copy verified, within the block and drafting ahead): plain decoding's tokens
    (with the same seed when sampling), while drafts are both accepted and rejected, and the
    walk goes on from a sibling where the rule reveals what it is sure of."""
    target = tiny_model(n_layer=2, block_size=B, seed=0)
    drafter = perturbed(target, seed=1)
    rule = DecodeRule(MASK_ID, B, temperature=temperature, **rule_kw)
    hist, chain, siblings = Counter(), {}, Counter()

    def drafted_states(front, d, *args, **kw):     # each round's copies: the chain, then siblings
        g = speculate.drafted_states.__wrapped__(front, d, *args, **kw)
        chain[id(g.copies)] = len(drafted_states.__wrapped__(front, d, *args, vary=False).n_masked)
        siblings["proposed"] += len(g.n_masked) - chain[id(g.copies)]
        return g
    drafted_states.__wrapped__ = speculate.drafted_states
    monkeypatch.setattr(speculate, "drafted_states", drafted_states)

    def walking(logits, g, *args):
        w = walk(logits, g, *args)
        siblings["walked"] += any(j >= chain[id(g.copies)] for j in w.visited)
        return w
    for k, L in enumerate((3, B, 2 * B + 1, 5)):
        prompt, max_new = tokens(L, seed=20 + k), 3 * B
        plain, _ = generate(target, prompt, max_new, rule, eos_id=NO_EOS,
                            generator=torch.Generator().manual_seed(k))
        out, stats = variants.simsd(target, drafter, prompt, max_new, rule, acceptance="lossless",
                                    draft_threshold=rule_kw.get("threshold", 0.5), eos_id=NO_EOS,
                                    draft_steps=3, lookahead=(0, 3)[k % 2], walk=walking,
                                    generator=torch.Generator().manual_seed(k))
        assert out == plain, f"prompt {k}"
        hist.update(stats["accept_hist"])
    assert max(hist) >= 2 and hist[0] > 0, f"vacuous: accept histogram {dict(hist)}"
    if rule.strategy in ("low_confidence_dynamic", "entropy_bounded"):    # a copy a drafter step
        assert siblings["proposed"] and siblings["walked"], f"vacuous: siblings {dict(siblings)}"
    else:                                                                  # a copy a draft
        assert not siblings["proposed"]


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
@pytest.mark.parametrize("rule_kw", [dict(), dict(strategy="low_confidence_dynamic", threshold=0.6),
                                     dict(strategy="random"), dict(strategy="entropy_bounded")],
                         ids=["static", "threshold", "random", "entropy"])
@pytest.mark.parametrize("B", [4, 8])
def test_a_temporal_round_that_drafts_nothing_is_the_rules_own_step(tiny_model, B, rule_kw,
                                                                     temperature):
    """With nothing drafted, every round of the temporal path is the target's own step (its
    rule on the slots): plain decoding's tokens, so a round the gate declines loses nothing."""
    target = tiny_model(n_layer=2, block_size=B, seed=0)
    rule = DecodeRule(MASK_ID, B, temperature=temperature, **rule_kw)
    nothing = speculate.Settings(verifier="temporal", propose=lambda front, ahead: Draft([], [], []))
    for k, L in enumerate((3, B, 2 * B + 1)):
        prompt, seeded = tokens(L, seed=40 + k), lambda: torch.Generator().manual_seed(k)
        plain, _ = generate(target, prompt, 3 * B, rule, eos_id=NO_EOS, generator=seeded())
        out, _ = speculate.simsd_generate(target, None, prompt, 3 * B, rule, nothing,
                                          eos_id=NO_EOS, generator=seeded())
        assert out == plain, f"prompt {k}"


def test_gated_acceptance_takes_sure_drafts_then_the_targets_own_step():
    """Draft 1 (position 2) is not the target's top position but it is sure of it (0.95 > 0.9)
    and agrees: accepted. Draft 2 (position 0) agrees but the target is unsure there and would
    reveal position 3 first: the target's own step replaces it. The paper's rule (no gate)
    accepts both and steps once more from the last state."""
    B, V = 4, 8
    rule = DecodeRule(MASK_ID, B)
    block = torch.full((B,), MASK_ID)
    d = Draft(pos=[2, 0], tokens=[6, 7], p_draft=torch.full((2, V), 1.0 / V), tau=[1, 2])
    front = front_of(block, torch.arange(B))
    g = speculate.drafted_states(front, d, 0, frozenset(), MASK_ID)
    copies = g.copies
    assert copies.tolist() == [[MASK_ID] * 4, [MASK_ID, MASK_ID, 6, MASK_ID], [7, MASK_ID, 6, MASK_ID]]

    def row(tok, p):  # logits whose softmax puts p on tok and spreads the rest evenly
        r = torch.full((V,), math.log((1 - p) / (V - 1)))
        r[tok] = math.log(p)
        return r
    logits = torch.stack([torch.stack([row(7, 0.5), row(4, 0.99), row(6, 0.95), row(5, 0.5)]),
                          torch.stack([row(7, 0.5), row(4, 0.6), row(6, 0.95), row(5, 0.97)]),
                          torch.stack([row(7, 0.5), row(4, 0.6), row(6, 0.95), row(5, 0.97)])])
    packed = logits[copies == MASK_ID]                                # as verified
    for how, accepted, step, why, new in (("gated", 1, 2, "target unsure", [MASK_ID, MASK_ID, 6, 5]),
                                          ("paper", 2, 3, "every draft accepted", [7, MASK_ID, 6, 5])):
        counts = Counts()
        adv = variants.on_copies(how, gate=0.9)(packed, g, d, front, rule, None, counts)
        assert counts.n == Counter({("accepted", accepted): 1, ("end", why): 1}), how
        assert (adv.front.step, adv.front.host, adv.done) == (step, new, []), how


@pytest.mark.parametrize("rule_kw, next_at_copy_2, expected", [
    (dict(), 4, (0, 1, "target chose otherwise", [7, MASK_ID, MASK_ID, MASK_ID])),
    (dict(strategy="low_confidence_dynamic"), 4, (2, 2, "target chose otherwise", [7, 4, 6, MASK_ID])),
    (dict(strategy="low_confidence_dynamic"), 5, (3, 3, "every draft accepted", [7, 5, 6, 4])),
], ids=["static", "threshold-skips-a-copy", "threshold-all"])
def test_lossless_acceptance_counts_the_deepest_drafted_state_walked_to(rule_kw, next_at_copy_2, expected):
    """Drafts: position 2 gets 6, then 0 gets 7, then 1 gets 5. The target is sure (0.95) of
    positions 0 and 2. The static rule reveals one a step, the leftmost of the tie, position 0:
    not the drafter's first state, so no draft is accepted. The threshold rule reveals both at
    once, landing on copy 2 (copy 1 skipped): two drafts accepted in one step; from there it
    reveals position 1, as 4 (a state not verified: the round ends) or as the draft 5 (copy 3:
    it steps once more, to the full block)."""
    B, V = 4, 8
    rule = DecodeRule(MASK_ID, B, **rule_kw)
    d = Draft(pos=[2, 0, 1], tokens=[6, 7, 5], p_draft=torch.full((3, V), 1.0 / V), tau=[1, 2, 3])
    g = speculate.drafted_states(front_of(torch.full((B,), MASK_ID), torch.arange(B)), d, 0,
                                 frozenset(), MASK_ID)               # the lossless round's guesses
    copies = g.copies

    def row(tok, p):  # logits whose softmax puts p on tok and spreads the rest evenly
        r = torch.full((V,), math.log((1 - p) / (V - 1)))
        r[tok] = math.log(p)
        return r
    first = torch.stack([row(7, 0.95), row(5, 0.5), row(6, 0.95), row(4, 0.5)])
    second = torch.stack([row(7, 0.95), row(next_at_copy_2, 0.97), row(6, 0.95), row(4, 0.5)])
    logits = torch.stack([first, first, second, second])           # the target at copies 0..3
    packed, counts = logits[copies == MASK_ID], (copies == MASK_ID).sum(-1).tolist()
    assert g.n_masked == counts and g.after is None and g.drafted == [0, 1, 2, 3]
    w = walk(packed, g, 0, rule)                                   # the lossless acceptance: the walk
    counts = Counts()
    counts.lossless(g, w)
    stats = counts.n
    assert w.crossed == []
    steps, new = len(w.path), w.path[-1][1]                        # no block crossed: all in this one
    assert new.tolist() == w.host
    (accepted,), (why,) = ([k[1] for k in stats if k[0] == kind] for kind in ("accepted", "end"))
    assert (accepted, steps, why, new.tolist()) == expected


class FixedLogits(torch.nn.Module):
    """A stand-in model for the decode loop: its distribution at block position i is table[i],
    whatever the context. Enough of Transformer's interface for Session and verify_copies."""

    def __init__(self, table, mask_id):
        super().__init__()
        self.table = table.log()                       # (B, V)
        self.embed = torch.nn.Embedding(1, 1)          # Session reads the device off it
        self.config = types.SimpleNamespace(mask_token_id=mask_id)   # verify_copies reads the mask id

    def setup_cache(self, max_len, batch=1):
        pass

    def forward(self, idx, pos, start=None, mask=None, keep=None, rows=None):
        kept = pos.view(-1)[idx.shape[1] - keep:]
        return self.table[(kept if rows is None else kept[rows]) % len(self.table)][None]


def test_sampled_simsd_commits_p_target_on_the_real_pipeline():
    """Two masked positions, gamma = 2, the real draft -> verify_copies -> accept_paper: every
    committed token follows p_target at its position (chi-square), although the drafter's
    distributions are far from it. When the drafter chose its position by the confidence of
    the token it had just drawn, position 0 came out about [0.30, 0.21, 0.49] here."""
    mask_id, B = 3, 2
    p_draft = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.4, 0.35, 0.25, 0.0]])
    p_target = torch.tensor([[0.2, 0.3, 0.5, 0.0], [0.3, 0.3, 0.4, 0.0]])
    rule = DecodeRule(mask_id, B, temperature=1.0)
    tsess = Session(FixedLogits(p_target, mask_id), B, 8 * B)
    dsess = Session(FixedLogits(p_draft, mask_id), B, 8 * B)
    block, pos, g = torch.full((B,), mask_id), torch.arange(B), torch.Generator().manual_seed(0)
    front, first, second, drafted = Frontier(block, pos, B, [mask_id] * B), [], [], []
    accept = variants.on_copies("paper")
    settings = speculate.Settings(gamma=2, draft_steps=2, draft_threshold=None, draft_stop=None)
    for _ in range(6000):
        d = speculate.draft(dsess, front, rule, settings, 0, frozenset(), g)
        guesses = speculate.drafted_states(front, d, 0, frozenset(), mask_id)
        logits = verify_copies(tsess, guesses, pos)
        new = accept(logits, guesses, d, front, rule, g, Counts()).front.host
        first.append(new[0]), drafted.append(d.tokens[0])
        if new[1] != mask_id:                          # position 1 was decided this round too
            second.append(new[1])
    assert d.pos == [0, 1]                             # the drafter's most confident first
    critical = 13.816                                  # chi-square, 2 dof, alpha = 0.001
    assert chi_square(torch.tensor(first), p_target[0]) < critical
    assert chi_square(torch.tensor(second), p_target[1]) < critical and len(second) > 2000
    assert chi_square(torch.tensor(drafted), p_target[0]) > critical   # the test has power


def test_the_drafter_drafts_several_a_step_and_stops_when_unsure(tiny_model):
    """One token a step, or every one above draft_threshold at once, never past gamma, none
    once its best confidence left is below draft_stop: a drafter forward a drafting step
    (fast.draft_one_sync, every decision on the device: a fixed number, `steps`)."""
    B = 8
    drafter = tiny_model(n_layer=1, block_size=B, seed=3)
    rule, front = DecodeRule(MASK_ID, B), front_of(torch.full((B,), MASK_ID), torch.arange(B))
    for (steps, threshold, stop, gamma, drafted, last_tau), draft in itertools.product((
            (B, None, None, B, B, B), (B, 1e-9, None, B, B, 1), (2, 1e-9, None, 3, 3, 1),
            (B, None, 1.0, B, 1, 1), (3, None, None, B, 3, 3)), (speculate.draft, fast.draft_one_sync)):
        sess = Session(drafter, B, 4 * B)
        settings = speculate.Settings(gamma=gamma, draft_steps=steps, draft_threshold=threshold,
                                      draft_stop=stop)
        d = draft(sess, front, rule, settings, 0, frozenset())
        forwards = steps if draft is fast.draft_one_sync else last_tau
        assert (sess.nfe, len(d.pos), d.tau[-1]) == (forwards, drafted, last_tau), steps
        assert d.tau == sorted(d.tau) and len(set(d.pos)) == drafted
        # reach: the product of p_draft(d_i) over the drafts so far (the odds of reaching each)
        p = d.p_draft.gather(-1, torch.tensor(d.tokens)[:, None]).squeeze(-1).tolist()
        assert d.reach == pytest.approx([math.prod(p[:i + 1]) for i in range(len(p))])
        assert all(1 >= a >= b for a, b in zip(d.reach, d.reach[1:] + [0])), d.reach


@pytest.mark.parametrize("kwargs, message", [
    (dict(verifier="mask"), "--verify 'mask', rope_copy=True: the verifier is copies or temporal"),
    (dict(acceptance="strict"), "unknown acceptance rule"),
    (dict(verifier="temporal", acceptance="lossless"), r"--verify temporal needs --accept paper \(not lossless\)"),
    (dict(verifier="temporal", acceptance="gated"), r"--verify temporal needs --accept paper \(not gated\)"),
    (dict(rope_copy=False), "--verify 'copies', rope_copy=False: .* the rope-copy ablation is the temporal"),
    (dict(gate=0.0), "gate must be in"),
    (dict(gate=1.5), "gate must be in"),
    (dict(draft_threshold=-0.1), r"draft_threshold and draft_stop must be in \(0, 1\]: -0.1"),
    (dict(draft_stop=2.0), r"draft_threshold and draft_stop must be in \(0, 1\]: 0.9, 2.0"),
])
def test_bad_variant_settings_raise(tiny_model, kwargs, message):
    model = tiny_model(n_layer=1)
    with pytest.raises(ValueError, match=message):
        variants.simsd(model, copy.deepcopy(model), tokens(5), 8, **kwargs)


def test_without_a_generator_the_drafters_draws_leave_the_walks_alone(tiny_model):
    """Sampling with no generator: the walk draws from torch's global stream exactly as plain
    decoding does, and the drafter from a stream of its own (seeded from torch's seed), so the
    lossless output is plain decoding's with the same global seed, whatever the drafter draws."""
    B = 4
    target = tiny_model(n_layer=2, block_size=B, seed=0)
    drafter = tiny_model(n_layer=1, block_size=B, seed=5)
    rule = DecodeRule(MASK_ID, B, temperature=1.0)
    prompt = tokens(6, seed=4)
    torch.manual_seed(3)
    plain = generate(target, prompt, 16, rule, eos_id=NO_EOS)[0]
    for steps in (1, 3):
        torch.manual_seed(3)
        assert speculate.simsd_generate(target, drafter, prompt, 16, rule,
                                        speculate.Settings(draft_steps=steps), eos_id=NO_EOS)[0] == plain
