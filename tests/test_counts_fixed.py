"""Every decoder's tokens AND counts, on a fixed set of randomized runs, equal a recorded fixture.

The fixture (tests/fixtures/decoding_counts.json) was written by the decoders before the round
loop was redesigned (a block loop with queues of blocks decoded ahead); the redesign promised
to change no token and no forward. Each run draws its settings from a seeded stream: method
(plain, SimSD lossless / paper / gated on block copies, SimSD on the temporal mask, Spiffy),
B, strategy, greedy or seeded sampling, lookahead 0-3, prompt length (on and off the block
grid), max_new_tokens (ending inside a block or not), a stop id (a token plain decoding writes)
or none, fused or separate commits; every copy verified (no cost model). Tiny random
models: a target and a drafter that mostly agrees with it (tests/test_lookahead.py's pair).

Re-recorded 2026-12-05 for the drafter on the device (a fixed number of drafter forwards a
round, 3 at B = 4 and 1 above; at the threshold rule only the states drafter steps end in
verified): plain and Spiffy runs kept every token and count; the 16 lossless SimSD runs kept
every token (target forwards 154 -> 160, drafter forwards 300 -> 235).

Re-recorded 2026-12-05, evening: the round histograms moved to counts.py (each run now has all
five: Spiffy gained empty accept_hist and round_ends, SimSD nodes_per_forward), and
a block finished ahead is always kept from its copy (the setting that chose it is gone). Every
token of the 96 runs stayed; the 62 runs that kept blocks kept every count; the others kept
their forwards and lost the fused rows of their kept blocks.

Re-recorded 2026-12-06: the drafter's random stream is seeded afresh each round (from the
run's seed and the round's index), so speculate.draft, which stops when the drafter does, and
speculate.draft_one_sync, which runs its fixed number of forwards, write the same text. 16 runs moved, all
sampled SimSD runs (13 paper, gated or temporal runs, 12 of them in tokens; 3 lossless runs in
counts only); no greedy run and no lossless token moved (tests/test_fast.py, whole decodes
of both drafter forms).

Re-recorded 2026-12-06, evening: a drafter's prompt joins its first forward (decode.round_loop:
it may never run, fast.gated). 40 runs moved in the drafter's forwards and rows only; no token
and no target count moved.

Re-recorded 2026-12-06, night: when every draft is accepted, the temporal round takes the
target's own step on the undrafted slots (speculate.accept_temporal: its rule, no longer one
bonus token), so a round that drafts nothing is the rule's own step. 3 of the 16 temporal runs
moved: 1 greedy on the threshold rule, 2 sampled (the rule's draws); the 5 greedy one-token
runs kept every token and count.

Re-recorded 2026-12-07, evening: a drafter step reveals as the threshold rule would
(speculate.DRAFT_THRESHOLD 0.5 -> 0.9; 2 drafter forwards a round above B = 8, not 1), and the
lossless walk's copies include each drafter step's siblings (speculate.drafted_states). Plain and
Spiffy kept every token and count; the 16 lossless SimSD runs kept every token (14 moved in
counts); 30 of the 48 paper, gated and temporal runs moved in tokens (other drafts, accepted on
their own terms), 43 in counts.

A change that moves counts on purpose rewrites the fixture, and says so:
    python tests/test_counts_fixed.py --write
"""
import json
import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from conftest import make_model  # noqa: E402
import fast  # noqa: E402
from decode import DecodeRule, generate  # noqa: E402
from loading.checkpoint import PRESETS  # noqa: E402
from variants import simsd as simsd_generate  # noqa: E402
from spiffy import calibrate
from spiffy import spiffy_generate as spiffy_core  # noqa: E402
from measure.counts import counting  # noqa: E402
from test_lookahead import RULES, pair, tokens  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "decoding_counts.json"
MASK_ID, N_RUNS = PRESETS["tiny"]["mask_token_id"], 96
METHODS = ("plain", "simsd-lossless", "simsd-paper", "simsd-gated", "simsd-temporal", "spiffy")
KEYS = ("stop", "nfe", "nfe_draft", "rows", "rows_draft", "accept_hist", "round_ends",
        "steps_per_forward", "nodes_per_forward", "blocks_ahead")


def settings(k):
    """Run k's settings, drawn from a stream seeded by k (host ints and strings only)."""
    r = random.Random(k)
    method = METHODS[k % len(METHODS)]
    B = r.choice((4, 8, 8, 32))
    rule = r.choice(list(RULES) if method != "simsd-temporal" else ["static", "threshold"])
    return dict(method=method, B=B, rule=rule, temperature=r.choice((0.0, 0.0, 1.0)),
                lookahead=r.randint(0, 3) if method.startswith("simsd-") and method != "simsd-temporal" else 0,
                prompt=tokens(r.randint(1, 2 * B + 3), 100 + k), max_new=r.randint(2, 5 * B),
                stop=r.choice((None, r.randint(0, 40))), fuse=r.random() < 0.8)


GRAPHS = {}


def run(s):
    """One run of settings s -> (tokens, the counts in KEYS it reports)."""
    B, method = s["B"], s["method"]
    target, drafter = pair(B)
    rule = DecodeRule(MASK_ID, B, temperature=s["temperature"], **RULES[s["rule"]])
    stop = -1
    if s["stop"] is not None:   # a token plain decoding writes: the stop-th, counted cyclically
        plain = generate(target, s["prompt"], s["max_new"], rule, eos_id=-1,
                         generator=torch.Generator().manual_seed(7))[0]
        stop = plain[s["stop"] % len(plain)]
    kw = dict(eos_id=stop, fuse_commit=s["fuse"],
              generator=torch.Generator().manual_seed(7))
    if method == "plain":
        out, st = generate(target, s["prompt"], s["max_new"], rule, **kw)
    elif method == "spiffy":
        key = (B, s["rule"])
        if key not in GRAPHS:   # calibrated greedy (a graph knows no temperature); "random" draws
            torch.manual_seed(0)  # from the global stream there
            GRAPHS[key] = calibrate(make_model(n_layer=2, block_size=B, seed=0), [tokens(5, 1), tokens(
                B + 2, 2), tokens(2 * B, 3)], DecodeRule(MASK_ID, B, **RULES[s["rule"]]), 16)
        out, st = counting(spiffy_core)(target, s["prompt"], s["max_new"], rule, GRAPHS[key], **kw)
    else:
        accept = method[6:]
        verifier = "temporal" if accept == "temporal" else "copies"
        out, st = simsd_generate(target, drafter, s["prompt"], s["max_new"], rule, verifier=verifier,
                                 acceptance="paper" if verifier == "temporal" else accept,
                                 lookahead=s["lookahead"], draft=fast.draft_one_sync, **kw)
    counts = {k: st[k] for k in KEYS if k in st}
    return out, json.loads(json.dumps(counts))    # (int keys of dicts as JSON has them)


def recorded():
    return json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("k", range(N_RUNS))
def test_tokens_and_counts_equal_the_recorded_ones(k):
    want = recorded()[k]
    assert want["settings"] == json.loads(json.dumps(settings(k))), "the fixture is of other settings"
    out, counts = run(settings(k))
    assert out == want["tokens"]
    assert counts == want["counts"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_counts_fixed.py --write")
    torch.set_num_threads(1)
    runs = []
    for k in range(N_RUNS):
        out, counts = run(settings(k))
        runs.append(dict(settings=settings(k), tokens=out, counts=counts))
    FIXTURE.write_text(json.dumps(runs) + "\n")
    print(f"wrote {FIXTURE}: {len(runs)} runs")
