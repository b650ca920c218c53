"""The speed devices (fast.py) against the core they wrap, on tiny random models, CPU, fp32:
the same tokens and the same forwards, query rows and stats, with fewer host syncs.

- verify.walk_one_sync (one host sync a round for a rule that draws nothing) in Spiffy and SimSD,
  greedy and sampled, every strategy, across the block boundary;
- fast.static_shapes (the code compile_static compiles, run uncompiled: queries padded to a
  power of two of rows) for plain decoding, SimSD (copies and temporal) and Spiffy.
(fast.cutter changes which copies are verified, so forwards move by design: its tokens are
tested in tests/test_lookahead.py; compile_dynamic's in tests/test_compile.py.)

Run: python -m pytest tests/test_fast.py -q
"""
import itertools

import pytest
import torch

import fast
import verify
from conftest import make_model
from decode import DecodeRule, Frontier, Session, generate
from model import Transformer
from loading.checkpoint import PRESETS
import speculate
import variants
from spiffy import calibrate
import spiffy
from measure.counts import counting
from test_lookahead import pair
from test_syncs import SyncCounter

spiffy_generate = counting(spiffy.spiffy_generate)

MASK_ID, NO_EOS = PRESETS["tiny"]["mask_token_id"], -1
RULES = {"static": dict(), "threshold": dict(strategy="low_confidence_dynamic", threshold=0.6),
         "random": dict(strategy="random"), "entropy": dict(strategy="entropy_bounded", eb_threshold=0.5)}
KEYS = ("nfe", "nfe_draft", "rows", "rows_draft", "accept_hist", "round_ends", "steps_per_forward",
        "nodes_per_forward", "blocks_ahead", "stop")


def prompt(n):
    return torch.randint(4, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist()


def counts(stats):
    return {k: stats[k] for k in KEYS if k in stats}


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("rule_name", list(RULES))
def test_the_one_sync_walk_changes_no_token_and_no_count(rule_name, temperature, monkeypatch):
    B = 4
    target, drafter = pair(B)           # a drafter that mostly agrees: walks go past drafts
    rule = DecodeRule(MASK_ID, B, temperature=temperature, **RULES[rule_name])
    graph = calibrate(target, [prompt(5), prompt(11)], DecodeRule(MASK_ID, B, **RULES[rule_name]), 16)
    fewer = 0
    for n in (3, 9, 14):
        for run in (lambda **kw: spiffy_generate(target, prompt(n), 32, rule, graph, eos_id=NO_EOS, **kw),
                    lambda **kw: variants.simsd(target, drafter, prompt(n), 32, rule, eos_id=NO_EOS, **kw)):
            runs = []
            for walk in (None, verify.walk_one_sync):
                with SyncCounter(monkeypatch) as syncs:
                    out, st = run(generator=torch.Generator().manual_seed(n),
                                  **({} if walk is None else dict(walk=walk)))
                runs.append((out, counts(st), syncs.count))
            (core, core_counts, core_syncs), (quick, quick_counts, quick_syncs) = runs
            assert quick == core and quick_counts == core_counts
            assert quick_syncs <= core_syncs
            fewer += quick_syncs < core_syncs
    assert fewer or not verify.greedy_fixed_quota(rule), "vacuous: the one-sync walk saved no sync"


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_the_one_sync_draft_drafts_what_the_drafters_loop_drafts(temperature):
    """fast.draft_one_sync == speculate.draft, call by call: the same positions, tokens, step labels,
    p_draft and reach, from open blocks with known positions or not, with blocks ahead or not,
    and every way the drafter stops (its steps, gamma, draft_stop, a stop id). The loop runs a
    forward a drafting step; the device form min(steps, masks in the window)."""
    B = 4
    drafter = make_model(n_layer=1, block_size=B, seed=5)
    rule = DecodeRule(MASK_ID, B, temperature=temperature)
    stopped = set()
    for known, ahead in ((0, 0), (2, 0), (0, 2), (1, 1)):
        host = prompt(9)[:known] + [MASK_ID] * (B - known)
        front, first = Frontier(torch.tensor(host), torch.arange(8, 8 + B), B - known, host), None
        for case, (steps, threshold, stop, gamma, stop_id) in enumerate((
                (12, None, None, 12, False), (3, 1e-9, None, 12, False), (12, 0.02, None, 5, False),
                (12, None, 0.5, 12, False), (12, None, None, 12, True), (2, None, None, 12, False))):
            drafts = []
            for draft in speculate.draft, fast.draft_one_sync:
                sess = Session(drafter, B, 64)
                sess.prefill(torch.tensor(prompt(8)))
                stops = frozenset(first.tokens[:1] if stop_id else ())   # case 0's first draft
                d = draft(sess, front, rule, speculate.Settings(gamma=gamma, draft_steps=steps,
                          draft_threshold=threshold, draft_stop=stop), ahead, stops,
                          torch.Generator().manual_seed(known))
                drafts.append((d, sess.nfe - 1))
            (a, loop_forwards), (b, device_forwards) = drafts
            first = first or a
            assert (a.pos, a.tokens, a.tau, a.reach, a.more) == (b.pos, b.tokens, b.tau, b.reach, b.more)
            assert torch.equal(a.p_draft, b.p_draft)
            assert loop_forwards == a.tau[-1]
            assert device_forwards == min(steps, B - known + ahead * B)
            stopped.add(len(a.pos) < min(gamma, B - known + ahead * B))
    assert stopped == {True, False}, "vacuous: the drafter never stopped early (or always did)"


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_the_one_sync_draft_writes_what_the_drafters_loop_writes(temperature):
    """Whole decodes, the command lines' fast.draft_one_sync against speculate.draft: the same tokens and
    target counts on every path, sampled ones too (the drafter's stream is seeded afresh each
    round, so a round the loop ends early leaves the next round's draws alone); the loop runs
    fewer drafter forwards."""
    B = 4
    target, drafter = pair(B)
    rule = DecodeRule(MASK_ID, B, temperature=temperature, **RULES["threshold"])
    paths = (dict(), dict(acceptance="paper", lookahead=0),
             dict(verifier="temporal", acceptance="paper"))
    fewer = 0
    for n, path in itertools.product((3, 9, 14), paths):
        runs = [variants.simsd(target, drafter, prompt(n), 24, rule, eos_id=NO_EOS, draft=draft,
                               generator=torch.Generator().manual_seed(n), **path)
                for draft in (speculate.draft, fast.draft_one_sync)]
        (loop, loop_stats), (device, device_stats) = runs
        assert loop == device and {k: v for k, v in counts(loop_stats).items() if "draft" not in k} \
            == {k: v for k, v in counts(device_stats).items() if "draft" not in k}, (n, path)
        fewer += loop_stats["nfe_draft"] < device_stats["nfe_draft"]
    assert fewer, "vacuous: the drafter never stopped early"


@pytest.mark.parametrize("method", ["plain", "simsd", "simsd-temporal", "spiffy"])
def test_static_shapes_change_no_token_and_no_count(method):
    B = 4
    rule = DecodeRule(MASK_ID, B, strategy="low_confidence_dynamic", threshold=0.6)
    models = [(make_model(block_size=B), make_model(n_layer=1, block_size=B, seed=5)) for _ in range(2)]
    for m in models[1]:
        fast.static_shapes(m, Transformer.trunk)
    graph = calibrate(models[0][0], [prompt(5), prompt(11)], rule, 16)
    for n in (3, 9, 13):
        got = []
        for target, drafter in models:
            if method == "plain":
                out, st = generate(target, prompt(n), 20, rule, eos_id=NO_EOS)
            elif method == "spiffy":
                out, st = spiffy_generate(target, prompt(n), 20, rule, graph, eos_id=NO_EOS)
            else:
                temporal = dict(verifier="temporal", acceptance="paper")
                out, st = variants.simsd(target, drafter, prompt(n), 20, rule, eos_id=NO_EOS,
                                         **temporal if method == "simsd-temporal" else {})
            got.append((out, counts(st)))
        assert got[0] == got[1], n
