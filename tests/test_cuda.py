"""The GPU path (skipped without CUDA; `gpu_check.sh` runs it): FlexAttention on CUDA against
SDPA on the CPU, and the decoders on CUDA against plain decoding, in fp32.

Run: python -m pytest tests/test_cuda.py -q
"""
import copy

import pytest
import torch

from conftest import make_model
import fast
from decode import DecodeRule, generate
from loading.checkpoint import PRESETS
from speculate import simsd_generate
from spiffy import calibrate
from spiffy import spiffy_generate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
MASK_ID, B = PRESETS["tiny"]["mask_token_id"], 8


@pytest.fixture(autouse=True)
def no_tf32():
    """fp32 means fp32: TF32 matmuls would round like bf16's mantissa."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def prompts():
    return [torch.randint(4, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist()
            for n in (3, B, 2 * B + 5, 13)]


def test_flex_on_cuda_matches_sdpa_on_the_cpu():
    cpu = make_model(block_size=B)
    gpu = copy.deepcopy(cpu).cuda()
    gpu.attn_impl = "flex"
    ids = torch.randint(4, 97, (1, 3 * B + 5), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(gpu(ids.cuda()).cpu(), cpu(ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("strategy", ["low_confidence_static", "low_confidence_dynamic"])
def test_decoders_on_cuda_equal_plain_decoding(strategy):
    cpu = make_model(block_size=B)
    model, drafter = copy.deepcopy(cpu).cuda(), make_model(n_layer=1, block_size=B, seed=5).cuda()
    rule = DecodeRule(MASK_ID, B, strategy=strategy, threshold=0.6)
    graph = calibrate(model, prompts()[:2], rule, 16, budget=8)
    for p in prompts():
        plain = generate(model, p, 24, rule, eos_id=-1)[0]
        assert plain == generate(cpu, p, 24, rule, eos_id=-1)[0]
        assert spiffy_generate(model, p, 24, rule, graph, eos_id=-1)[0] == plain
        assert simsd_generate(model, drafter, p, 24, rule, eos_id=-1)[0] == plain


def test_compiled_decoding_on_cuda_equals_eager():
    model = make_model(block_size=B).cuda()
    rule = DecodeRule(MASK_ID, B)
    eager = [generate(model, p, 24, rule, eos_id=-1)[0] for p in prompts()]
    fast.compile_dynamic(model)
    assert [generate(model, p, 24, rule, eos_id=-1)[0] for p in prompts()] == eager


@pytest.mark.parametrize("method", ["plain", "spiffy"])
def test_static_compiled_decoding_with_cuda_graphs_equals_eager(method):
    """compile_static(mode="reduce-overhead"): padded buckets replayed as CUDA graphs."""
    model = make_model(block_size=B).cuda()
    rule = DecodeRule(MASK_ID, B)
    graph = calibrate(model, prompts()[:2], rule, 16, budget=8) if method == "spiffy" else None

    def run(p):
        if method == "spiffy":
            return spiffy_generate(model, p, 24, rule, graph, eos_id=-1)[0]
        return generate(model, p, 24, rule, eos_id=-1)[0]
    eager = [run(p) for p in prompts()]
    fast.compile_static(model, mode="reduce-overhead")
    assert [run(p) for p in prompts()] == eager


@pytest.mark.parametrize("method", ["plain", "spiffy"])
def test_one_host_sync_per_decoding_forward_on_cuda(method, monkeypatch):
    """The real syncs, as torch.cuda.set_sync_debug_mode sees them, plus decode.to_host's one
    (its stream wait is let through uncounted and counted as one)."""
    import warnings

    import decode
    import verify
    model = make_model(block_size=B).cuda()
    rule = DecodeRule(MASK_ID, B)
    graph = calibrate(model, prompts()[:2], rule, 16, budget=8) if method == "spiffy" else None
    calls, to_host = [], decode.to_host

    def counted(*tensors):
        calls.append(1)
        torch.cuda.set_sync_debug_mode(0)
        try:
            return to_host(*tensors)
        finally:
            torch.cuda.set_sync_debug_mode("warn")
    for module in (decode, verify):
        monkeypatch.setattr(module, "to_host", counted)
    for p in prompts():
        calls.clear()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                if method == "spiffy":
                    stats = spiffy_generate(model, p, 24, rule, graph, eos_id=-1)[1]
                else:
                    stats = generate(model, p, 24, rule, eos_id=-1)[1]
            finally:
                torch.cuda.set_sync_debug_mode(0)
        syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
        assert len(calls) + len(syncs) == stats["nfe"] - int(len(p) >= B), syncs[:3]
