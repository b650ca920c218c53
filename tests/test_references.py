"""SimSD without a drafter (variants.py: --reference trajectory and lookup), CPU, tiny random models:

- lossless (block copies + the walk) with either source is plain decoding token for token in
  fp32: greedy and seeded sampling, every strategy, lookahead 0-3, prompts off the block grid,
  max_new_tokens inside a block, a stop id inside a proposed block, a prompt with no n-gram
  match, and prompts whose continuation repeats long spans of them (where lookup pays);
- the paper's temporal path with either source: on a one-layer target (where the temporal
  verifier is exact) every token greedy acceptance commits is the target's argmax at its
  position in the state before it, by an independent, uncached forward;
- the lookup itself (the most recent match of exactly n tokens, no match) and its drafts (a known
  token that disagrees ends them; a block holding a stop id is not gone past);
- no drafter is loaded for a drafter-free reference.

Run: python -m pytest tests/test_references.py -q
"""
import pytest
import torch

from loading import checkpoint
import cli
import sample
import speculate
from conftest import make_model
from decode import DecodeRule, Frontier, generate
from loading.checkpoint import PRESETS
from training.tasks import load_tasks
import variants

MASK_ID, VOCAB, NO_EOS = PRESETS["tiny"]["mask_token_id"], PRESETS["tiny"]["vocab_size"], -1
RULES = {"static": dict(), "threshold": dict(strategy="low_confidence_dynamic", threshold=0.6),
         "random": dict(strategy="random"), "sequential": dict(strategy="sequential"),
         "entropy": dict(strategy="entropy_bounded", eb_threshold=0.5)}


def tokens(n, seed):
    return torch.randint(4, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def cases(B):
    """(prompt, max_new_tokens): off the grid, repeating itself (lookup matches), on the grid,
    ending inside a block, and one token (nothing to match)."""
    return [(tokens(3, 20), 3 * B), (tokens(6, 21) * 3, 3 * B - 1), (tokens(B, 22) * 2, 2 * B + 2),
            (tokens(2 * B + 1, 23), 4 * B - 3), (tokens(1, 24), 2 * B)]


def seeded(k):
    return torch.Generator().manual_seed(k)


@pytest.fixture(scope="module")
def models():
    return {B: make_model(n_layer=2, block_size=B, seed=0) for B in (4, 8)}


@pytest.mark.parametrize("lookahead", [0, 1, 3])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampling"])
@pytest.mark.parametrize("rule_name", list(RULES))
@pytest.mark.parametrize("B", [4, 8])
@pytest.mark.parametrize("reference", ["trajectory", "lookup"])
def test_lossless_without_a_drafter_equals_plain_decoding(models, reference, B, rule_name, temperature,
                                                          lookahead):
    model = models[B]
    rule = DecodeRule(MASK_ID, B, temperature=temperature, **RULES[rule_name])
    saved = proposed = 0
    for k, (prompt, max_new) in enumerate(cases(B)):
        plain, st_plain = generate(model, prompt, max_new, rule, eos_id=NO_EOS, generator=seeded(k))
        out, st = variants.simsd(model, None, prompt, max_new, rule, reference=reference,
                                 lookahead=lookahead, eos_id=NO_EOS, generator=seeded(k))
        assert out == plain, f"prompt {k}"
        saved += st_plain["nfe"] - st["nfe"]
        proposed += sum(n for why, n in st["round_ends"].items() if why != "nothing proposed")
    assert proposed, "vacuous: nothing was ever proposed"
    if temperature == 0 and rule_name in ("static", "sequential"):
        assert saved > 0, "vacuous: no forward saved"


def stop_inside(model, rule, prompt, max_new):
    """A stop id plain decoding first emits after its first generated block (None if none),
    and plain's output with it."""
    B, tail = rule.block_size, len(prompt) % rule.block_size
    plain, _ = generate(model, prompt, max_new, rule, eos_id=NO_EOS)
    stop = next((t for i, t in enumerate(plain) if i >= B - tail and t not in plain[:i]), None)
    return stop, stop and generate(model, prompt, max_new, rule, eos_id=stop)[0]


@pytest.mark.parametrize("reference", ["trajectory", "lookup"])
@pytest.mark.parametrize("B", [4, 8])
def test_a_stop_id_in_a_proposed_block_ends_decoding_where_plain_decoding_does(models, reference, B):
    model, rule = models[B], DecodeRule(MASK_ID, B)
    ended = 0
    for k in range(4):
        prompt = tokens(3 + 2 * k, 40 + k)
        prompt = prompt + generate(model, prompt, 3 * B, rule, eos_id=NO_EOS)[0] + prompt  # repeats
        stop, plain = stop_inside(model, rule, prompt, 4 * B)
        if stop is None:
            continue
        out, st = variants.simsd(model, None, prompt, 4 * B, rule, reference=reference, lookahead=3,
                                 eos_id=stop)
        assert out == plain, k
        ended += st["stop"] == "stop_id"
    assert ended, "vacuous: no run ended at its stop id"


def test_lookup_pays_where_the_answer_repeats_the_prompt():
    """The embedded target on problems that follow their own worked answer (bench.py --tasks
    copy): lookup proposes the answer from the prompt, and the walk keeps it."""
    model, tok = cli.load(cli.DEFAULT_TARGET)
    rule = cli.make_rule(model, 4, cli.THRESHOLD)
    nfe = {"plain": 0, "lookup": 0}
    for ids, _ in load_tasks(None, 3, tok, False, "copy"):
        plain, st_plain = generate(model, ids, 32, rule)
        out, st = variants.simsd(model, None, ids, 32, rule, reference="lookup")
        assert out == plain
        nfe["plain"], nfe["lookup"] = nfe["plain"] + st_plain["nfe"], nfe["lookup"] + st["nfe"]
    assert nfe["lookup"] * 1.5 <= nfe["plain"], nfe


def test_the_lookup_takes_the_most_recent_match():
    assert variants.lookup([1, 2, 3, 9, 2, 3, 8, 5, 2, 3], 2, 2) == [8, 5]        # 2 3: the last one
    assert variants.lookup([7, 2, 3, 9, 5, 2, 3, 8, 7, 2, 3], 3, 2) == [9, 5]     # 7 2 3, not 2 3
    assert variants.lookup([1, 2, 3, 4], 1, 2) == []                              # nothing recurs
    assert variants.lookup([5, 6, 5], 1, 3) == [6, 5]                             # runs into the key
    assert variants.lookup([5], 3, 3) == [] and variants.lookup([5, 5, 5], 3, 2) == []


def front(host, context, ranks=()):
    block = torch.tensor(host)
    return Frontier(block, torch.arange(len(host)), host.count(MASK_ID), host, 0, ranks, context)


def test_lookup_drafts_stop_at_a_disagreeing_token_and_after_a_block_with_a_stop_id():
    rule, M = DecodeRule(MASK_ID, 4), MASK_ID
    context = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 10]            # 10 -> 11 12 ...
    d = variants.lookup_draft(front([M, M, M, M], context), rule, 1, 2, frozenset())
    assert d.tokens == [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 10][:12]
    assert d.pos == list(range(12))                                           # three blocks
    d = variants.lookup_draft(front([M, M, 99, M], context), rule, 1, 2, frozenset())
    assert d.tokens == [11, 12] and d.pos == [0, 1]                            # 99 is not 13
    d = variants.lookup_draft(front([M, M, 13, M], context), rule, 1, 2, frozenset())
    assert d.pos[:3] == [0, 1, 3]                                              # 13 agrees: skipped
    d = variants.lookup_draft(front([M, M, M, M], context), rule, 1, 2, frozenset({16}))
    assert d.pos == list(range(8))                                             # 16 ends block two
    d = variants.lookup_draft(front([M, M, M, M], [1, 2, 3]), rule, 1, 2, frozenset())
    assert d.pos == [] == d.tokens                                             # no match


def test_lookup_orders_the_open_blocks_drafts_by_the_last_forwards_confidence():
    rule, M = DecodeRule(MASK_ID, 4), MASK_ID
    ranks = ([2, 0, 3, 1], [[0]] * 4, [[0.5]] * 4)
    d = variants.lookup_draft(front([M, M, M, M], [5, 6, 7, 8, 9, 5], ranks), rule, 1, 0, frozenset())
    assert d.pos == [2, 0, 3, 1] and d.tokens == [8, 6, 9, 7]


@torch.no_grad()
@pytest.mark.parametrize("reference", ["trajectory", "lookup"])
def test_the_temporal_path_commits_the_targets_argmax_where_the_verifier_is_exact(reference, monkeypatch):
    """One layer: each slot's logits are plain decoding's in the state before its step, so greedy
    paper acceptance commits, at every position, the target's argmax in the state the round
    revealed it from (checked against an uncached forward over prompt + earlier blocks + state)."""
    B = 4
    model = make_model(n_layer=1, block_size=B, seed=3)
    rule = DecodeRule(MASK_ID, B)
    states, accept = [], speculate.accept_temporal

    def recorded(logits, front, d, rule, generator=None):
        new, n = accept(logits, front, d, rule, generator)
        states.append((front.block.clone(), d.pos[:int(n) + 1] if n < len(d.pos) else None, new))
        return new, n
    monkeypatch.setattr(speculate, "accept_temporal", recorded)
    prompt = tokens(6, 70) * 2
    out, st = variants.simsd(model, None, prompt, 4 * B, rule, verifier="temporal", acceptance="paper",
                             reference=reference, eos_id=NO_EOS)
    seq, checked = list(prompt[:len(prompt) // B * B]), 0
    for block, revealed, new in states:
        for i, p in enumerate(revealed or []):
            before = block.clone()                   # the state its slot saw: the drafts before it
            before[revealed[:i]] = new[revealed[:i]]
            logits = model(torch.tensor(seq + before.tolist())[None])[0, len(seq) + p]
            logits[MASK_ID] = -float("inf")
            assert int(new[p]) == int(logits.argmax()), (p, block.tolist())
            checked += 1
        if MASK_ID not in new.tolist():
            seq += new.tolist()
    assert checked and len(out) == 4 * B


def test_no_drafter_is_loaded_for_a_drafter_free_reference(monkeypatch):
    loaded, real = [], checkpoint.from_pretrained

    def counted(path, *a, **kw):
        loaded.append(str(path))
        return real(path, *a, **kw)
    monkeypatch.setattr(checkpoint, "from_pretrained", counted)
    sample.main(spec="simsd", reference="lookup", max_new_tokens=8)
    assert len(loaded) == 1 and loaded[0].endswith("target"), loaded


@pytest.mark.parametrize("B", [4, 8, 32])
@pytest.mark.parametrize("reference", ["drafter", "trajectory", "lookup"])
def test_the_scratch_holds_a_round_whatever_gamma(reference, B):
    """The scratch rows are sized by what a round can verify, not by gamma, which only the
    drafter reads: with gamma = 1 and the largest lookahead the bench sweeps (3), a reference
    that drafts whole blocks ahead fits, and decodes plain decoding's tokens (it overflowed
    the cache before)."""
    target = make_model(n_layer=1, block_size=B, seed=0)
    drafter = make_model(n_layer=1, block_size=B, seed=5) if reference == "drafter" else None
    rule = DecodeRule(MASK_ID, B)       # one token a step: a state a draft
    prompt = tokens(6, 21) * 3          # it repeats itself: lookup drafts blocks ahead
    plain = generate(target, prompt, 4 * B, rule, eos_id=NO_EOS)[0]
    out, _ = variants.simsd(target, drafter, prompt, 4 * B, rule, reference=reference, gamma=1,
                            lookahead=3, eos_id=NO_EOS)
    assert out == plain
