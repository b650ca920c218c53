"""Compiled decoding under the real compiler writes eager's tokens: inductor (C++ on the CPU),
with dynamic and with static shapes, over SDPA and over FlexAttention, for every decoder
(tools/lockstep.py's: plain, threshold, SimSD with a drafter, its trajectory and lookup
references, lossless and temporal, and Spiffy) at B = 4 and 32, every stale cache row filled
with garbage (a row that leaked would change the tokens). And a mixture of experts, whose sparse
MLP compiles its gathered form (static shapes), not eager's loop over the experts hit.

One compiled model serves both block sizes (a mask captures the block size as a tensor; the
cache is sized once), and a prompt shorter than a block runs at B = 4 only: each new graph
costs seconds of C++ compiling (docs/results.md gives the file's time).

Run: python -m pytest tests/test_inductor.py -q
"""
import copy

import pytest
import torch

import fast
from conftest import make_model
from decode import generate
from loading.checkpoint import PRESETS
from decode import DecodeRule
from serve.batch import decode_all
from spiffy import calibrate
from tools.lockstep import decoders, stale_garbage

MASK_ID, SIZES = 3, (4, 32)
CACHE_ROWS = 1 << 13   # what the longest run here asks for (SimSD at B = 32), rounded up


def prompt(n):
    return torch.randint(4, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist()


PROMPTS = {4: [prompt(3), prompt(37)], 32: [prompt(37)]}   # shorter than a block: at B = 4 only


@pytest.fixture(scope="module")
def setting():
    """The models, and for each block size: the threshold rule, a Spiffy graph, eager's tokens."""
    target, drafter = make_model(n_layer=1, seed=0), make_model(n_layer=1, seed=5)
    per_size = {}
    for B in SIZES:
        rule = DecodeRule(MASK_ID, B, strategy="low_confidence_dynamic", threshold=0.6)
        graph = calibrate(target, PROMPTS[4], rule, 2 * B, budget=6)
        runs = decoders(target, drafter, rule, graph, 2 * B)
        per_size[B] = rule, graph, {name: [run(p) for p in PROMPTS[B]] for name, run in runs.items()}
    return target, drafter, per_size


def compiled_writes_eager_tokens(setting, attn, shapes):
    """Both models compiled for `attn` and `shapes`: every decoder's tokens are eager's.
    (tests/test_inductor_flex.py runs flex: a file a worker, the two halves side by side.)"""
    target, drafter, per_size = setting
    torch._dynamo.reset()
    models = [copy.deepcopy(m) for m in (target, drafter)]
    for m in models:
        m.attn_impl = attn
        (fast.compile_static if shapes == "static" else fast.compile_dynamic)(m, backend="inductor")
        m.setup_cache(CACHE_ROWS)   # once, as compiling.warm_up does: a cache that grows is a new graph
        stale_garbage(m)
    for B, (rule, graph, eager) in per_size.items():
        for name, run in decoders(*models, rule, graph, 2 * B).items():
            assert [run(p) for p in PROMPTS[B]] == eager[name], f"{name}, B = {B}"


@pytest.mark.parametrize("shapes", ["dynamic", "static"])
def test_compiled_decoding_over_sdpa_writes_eager_tokens(setting, shapes):
    compiled_writes_eager_tokens(setting, "sdpa", shapes)


def test_a_compiled_mixture_of_experts_writes_eager_tokens():
    """The tiny MoE, one layer, dynamic shapes: plain decoding's tokens, and the logits of a
    prompt within fp32's reordering."""
    eager = make_model(**{**PRESETS["tiny-moe"], "n_layer": 1}, seed=3)
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    fast.compile_dynamic(compiled, backend="inductor")
    rule, p = DecodeRule(MASK_ID, 4), prompt(37)
    assert generate(compiled, p, 12, rule, eos_id=-1)[0] == generate(eager, p, 12, rule, eos_id=-1)[0]
    with torch.no_grad():
        torch.testing.assert_close(compiled(torch.tensor([p])), eager(torch.tensor([p])),
                                   atol=1e-4, rtol=0)


def test_batched_compiled_decoding_writes_eager_tokens(setting):
    """Many prompts together (serve/batch.py: 3 prompts, 2 slots), both models compiled for
    dynamic shapes over SDPA, SimSD and Spiffy: the tokens of the same batch eager."""
    target, drafter, per_size = setting
    rule, graph, _ = per_size[4]
    torch._dynamo.reset()
    models = [copy.deepcopy(m) for m in (target, drafter)]
    for m in models:
        m.attn_impl = "sdpa"
        fast.compile_dynamic(m, backend="inductor")
    prompts = [prompt(3), prompt(37), prompt(9)]
    for name in ("simsd", "spiffy"):   # (their prefills and commits: plain decoding's forwards)
        run = lambda i, p, t, d: decoders(t, d, rule, graph, 8)[name](p)   # noqa: E731
        assert decode_all(run, prompts, models, 2)[0] == decode_all(run, prompts, (target, drafter), 2)[0], name
