"""Compiled decoding compiles once: after a short and a long warm-up prompt, prompts of other lengths run the
graphs already compiled (the KV cache is allocated once and reused, masks capture tensors),
for plain, threshold, SimSD and Spiffy decoding, with eager's tokens. The "eager" backend
keeps the test fast; it runs dynamo's capture and guards, which is where recompiles come from.

Static shapes (fast.compile_static, for CUDA graphs): queries padded to 1, 2, 4, 8 or 16
blocks, keys over the whole cache, so a model compiles at most one graph per bucket, whatever
its mask kinds (fast.padded), and the tokens are eager's (the padding is masked exactly).

Run: python -m pytest tests/test_compile.py -q
"""
import copy
import logging

import pytest
import torch
from torch._dynamo.utils import counters

from compiling import RecompileLimitHits
from conftest import make_model
import fast
from decode import DecodeRule, generate
from loading.checkpoint import PRESETS
from speculate import Settings, simsd_generate
from spiffy import calibrate
from spiffy import spiffy_generate

MASK_ID, B = PRESETS["tiny"]["mask_token_id"], 4


def prompt(n):
    return torch.randint(4, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist()


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("method", ["plain", "threshold", "simsd", "simsd-temporal", "spiffy"])
def test_compiled_decoding_does_not_recompile_after_warm_up(method, static):
    target = make_model(n_layer=2, block_size=B, seed=0)
    drafter = make_model(n_layer=1, block_size=B, seed=5)
    rule = DecodeRule(MASK_ID, B, **(dict(strategy="low_confidence_dynamic", threshold=0.6)
                                     if method == "threshold" else {}))
    graph = calibrate(target, [prompt(5), prompt(11)], rule, 16, budget=6) if method == "spiffy" else None

    def run(t, d, ids):
        if method == "simsd":
            return simsd_generate(t, d, ids, 12, rule, Settings(lookahead=2), eos_id=-1)[0]   # across blocks
        if method == "simsd-temporal":     # its sections vary in length: padded to 2B
            return simsd_generate(t, d, ids, 12, rule, Settings(verifier="temporal"), eos_id=-1)[0]
        if method == "spiffy":
            return spiffy_generate(t, ids, 12, rule, graph, 4, eos_id=-1)[0]
        return generate(t, ids, 12, rule, eos_id=-1)[0]

    lengths = [3, 9, 5, 6, 7, 10, 13, 17, 22, 30, 31, 34]     # warm-up: one short, one long
    eager = [run(target, drafter, prompt(n)) for n in lengths]
    torch._dynamo.reset()
    counters.clear()
    ct, cd = copy.deepcopy(target), copy.deepcopy(drafter)
    for m in ct, cd:
        fast.compile_static(m, backend="eager") if static else fast.compile_dynamic(m, backend="eager")
    hits = RecompileLimitHits()          # past dynamo's limit a "compiled" run is eager
    compiled = [run(ct, cd, prompt(n)) for n in lengths[:2]]        # warm-up
    graphs = counters["stats"]["unique_graphs"]
    compiled += [run(ct, cd, prompt(n)) for n in lengths[2:]]
    logging.getLogger("torch._dynamo").removeHandler(hits)
    assert not hits.hits
    if static:    # 5 buckets a model, whatever the mask kinds (fast.padded tables them)
        assert counters["stats"]["unique_graphs"] <= 5 * (1 + method.startswith("simsd"))
    else:
        assert counters["stats"]["unique_graphs"] == graphs
    assert compiled == eager


def test_the_bench_sees_dynamo_fall_back_to_eager():
    """Past the recompile limit dynamo silently runs eager; bench.py must notice."""
    torch._dynamo.reset()
    hits = RecompileLimitHits()
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    double = torch.compile(lambda x: 2 * x, dynamic=False, backend="eager")
    with cfg.patch(**{name: 2}):
        for n in range(1, 4):
            double(torch.ones(n))
    logging.getLogger("torch._dynamo").removeHandler(hits)
    assert len(hits.hits) == 1 and "hit config" in hits.hits[0]


@pytest.mark.parametrize("compile_", ["compile_dynamic", "torch"])
def test_dynamic_compiling_keeps_every_graph_of_a_bench_run(compile_):
    """A bench run decodes with one compiled target and drafter at B = 4, 8 and 32: a graph per
    mask kind, block size (a constant the mask captures) and model, more than dynamo's 8 per
    function, which the two models share. compile_dynamic keeps every one compiled; plain
    torch.compile runs the rest eager, which only dynamo's log says (the reason for it)."""
    target, drafter = make_model(n_layer=2, seed=0), make_model(n_layer=1, seed=5)
    torch._dynamo.reset()
    for m in target, drafter:
        fast.compile_dynamic(m, backend="eager") if compile_ == "compile_dynamic" else m.compile(dynamic=True, backend="eager")
    hits = RecompileLimitHits()
    for b in (4, 8, 32):
        rule = DecodeRule(MASK_ID, b, strategy="low_confidence_dynamic", threshold=0.6)
        for n in (3, 9):
            simsd_generate(target, drafter, prompt(n), 2 * b, rule, Settings(lookahead=1), eos_id=-1)
    logging.getLogger("torch._dynamo").removeHandler(hits)
    assert bool(hits.hits) == (compile_ == "torch")


@pytest.mark.parametrize("strategy", ["low_confidence_dynamic", "entropy_bounded"])
def test_a_step_of_the_rule_traces_as_one_graph(strategy):
    """Compiled (a decode step's rule in the forward's graph: experiments/fused_step.py), the rule is
    one graph, and it gives eager's block."""
    rule = DecodeRule(MASK_ID, B, strategy=strategy, threshold=0.6)
    logits = torch.randn(B, 97, generator=torch.Generator().manual_seed(0))
    block = torch.full((B,), MASK_ID)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(DecodeRule.__call__)(rule, logits, block, 0)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    compiled = torch.compile(DecodeRule.__call__, backend="eager", fullgraph=True)
    assert torch.equal(compiled(rule, logits, block, 0), rule(logits, block, 0))
