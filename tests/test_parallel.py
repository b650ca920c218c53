"""Tensor parallelism (parallel.py) on 2 CPU ranks with gloo, as torchrun starts them.

One run of tests/parallel_worker.py (with PARALLEL_CHECK=1: every forward's queries compared
across ranks) gives the split target's logits against the whole model's for every kind of
forward, with a negative control (one all-reduce dropped), and every lossless decoder's tokens
against plain decoding's on the same ranks. One more run shows bad input is one line and every
rank exits. Both have their own timeout: a hang fails, it does not stall the suite."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import parallel
from loading.checkpoint import PRESETS, read_config
from model import ModelConfig, Transformer

ROOT = Path(__file__).parent.parent
TOLERANCE = 1e-5   # max |difference| / max |logit|: the all-reduce sums in another order


def torchrun(*args, env=None, timeout=240):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("parallel") / "results.json"
    run = torchrun("tests/parallel_worker.py", out, env=dict(PARALLEL_CHECK="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("model", ["target", "moe"])
def test_the_split_models_logits_are_the_whole_ones(two_ranks, model):
    """Without a cache, prefill, a cached block, copies and the temporal mask; the MoE's experts
    routed one at a time (eager) and a row at a time (compiled)."""
    assert two_ranks["ranks"] == 2
    assert two_ranks[model] <= TOLERANCE and two_ranks.get("moe-by-row", 0) <= TOLERANCE
    assert two_ranks[model + "-one-sum-dropped"] > 100 * TOLERANCE   # the negative control fails


@pytest.mark.parametrize("name", ["simsd", "simsd-trajectory", "simsd-lookup", "spiffy"])
def test_every_decoder_writes_plain_decodings_tokens_on_two_ranks(two_ranks, name):
    """Greedy at B = 4 and sampled at B = 8, alone and batched; each took multi-step rounds."""
    assert len(two_ranks[name]) == 12 and all(two_ranks[name])
    assert two_ranks[name + "-multistep"] > 0


def test_the_json_names_the_ranks_and_each_ranks_weight_bytes(two_ranks):
    whole = Transformer(read_config(ROOT / "models/target"))
    split = [p.numel() * 4 for n, p in whole.named_parameters() if parallel.is_split(n)]
    line = two_ranks["json"]
    assert line["ranks"] == 2 and line["tokens"] == 8
    assert line["rank_weight_bytes"] == [parallel.weight_bytes(whole) - sum(split) // 2] * 2


def test_a_failure_on_one_rank_fails_every_rank(two_ranks):
    assert two_ranks["failed"]["load"] == "rank 1: checkpoint directory nowhere does not exist"
    assert two_ranks["failed"]["bad"].startswith("shape mismatch for model.embed_tokens.weight: checkpoint (194, 64)")
    assert "the ranks diverged" in two_ranks["failed"]["diverged"]


def test_a_target_the_ranks_cannot_split_is_one_line_and_every_rank_exits():
    run = torchrun("sample.py", "--spec", "none", "--target", "models/drafter", "--max-new-tokens", "4", timeout=120)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 1 and run.stdout == ""
    assert errors == ["error: 2 ranks cannot split the target: its num_key_value_heads 1 is not a multiple of 2"]


@pytest.mark.parametrize("preset", ["sdar-8b", "sdar-30b-a3b"])
def test_each_rank_holds_half_of_the_split_weights(preset):
    """On the meta device: attention, MLP and experts halve; embedding, norms, router and head stay."""
    with torch.device("meta"):
        whole = Transformer(ModelConfig(**PRESETS[preset]))
        half = parallel.split(Transformer(ModelConfig(**PRESETS[preset])), 1, 2, reduce=False)
    kept = sum(p.numel() for n, p in whole.named_parameters() if not parallel.is_split(n))
    assert sum(p.numel() for p in half.parameters()) * 2 == sum(p.numel() for p in whole.parameters()) + kept
    with pytest.raises(ValueError, match="num_key_value_heads 8 is not a multiple of 16|num_key_value_heads 4 "
                                         "is not a multiple of 8"):
        parallel.check(whole.config, {"sdar-8b": 16, "sdar-30b-a3b": 8}[preset])


def test_more_ranks_than_gpus_is_refused(monkeypatch):
    monkeypatch.setattr(parallel, "WORLD", 2)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="with 2 ranks here: give --device cuda, with a GPU a rank"):
        parallel.device("cuda")


def test_the_modelled_gpu_column_adds_two_all_reduces_a_layer():
    """SDAR-8B on 2 GPUs: each reads half the split weights and all the rest, and 2 x 36
    all-reduces of 4 rows x 4096 in bf16; on one GPU, as before (no all-reduce)."""
    from measure.sol import GPU_MODEL as g, forward_bytes, forward_s, preset_whole
    whole, every = 2 * preset_whole("sdar-8b"), forward_bytes("sdar-8b", 4)
    reduce = g["reduce_s"] + 2 * (1 / 2) * 2 * 4 * 4096 / g["link"]
    assert forward_s("sdar-8b", 4, 2) == pytest.approx((whole + (every - whole) / 2) / g["bandwidth"] + 72 * reduce)
    assert forward_s("sdar-8b", 4, 1) == every / g["bandwidth"]
