"""Host syncs: one per target forward in plain, threshold and Spiffy decoding (Spiffy with a
greedy rule with a fixed quota, verify.greedy_fixed_quota; a sampled walk syncs once a step). A sync makes the host wait for the GPU's queue to
drain; the decoders make theirs through decode.to_host, and none anywhere else.

On the CPU nothing waits, so the test counts what would sync on a GPU: a tensor read as a
Python value (.item(), int(), bool(), `in`, .tolist()), a data-dependent size (nonzero),
torch.equal, and each to_host call (one sync, however many tensors it copies). On a GPU,
tests/test_cuda.py counts the real ones with torch.cuda.set_sync_debug_mode.

Run: python -m pytest tests/test_syncs.py -q
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import decode
import fast
import speculate
import spiffy
import verify
from conftest import make_model
from decode import DecodeRule, generate
from loading.checkpoint import PRESETS
from spiffy import calibrate
from measure.counts import counting

spiffy_generate = counting(spiffy.spiffy_generate)   # with its rounds counted (measure/counts.py)

aten = torch.ops.aten
MASK_ID, B, NO_EOS = PRESETS["tiny"]["mask_token_id"], 8, -1
SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.equal.default,
            aten.is_nonzero.default}
# the decoding modules; those that call to_host import it by name, and each such name is patched
DECODERS = [m for m in (decode, fast, verify, speculate, spiffy) if hasattr(m, "to_host")]
assert {decode, verify, speculate} <= set(DECODERS)
RULES = {"static": dict(strategy="low_confidence_static"),
         "threshold": dict(strategy="low_confidence_dynamic", threshold=0.6)}


class SyncCounter(TorchDispatchMode):
    """Counts the would-be host syncs of the code run inside it (see the module docstring)."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.count, self.quiet = 0, False
        tolist, to_host = torch.Tensor.tolist, decode.to_host

        def counted_tolist(t):
            self.count += not self.quiet
            return tolist(t)

        def counted_to_host(*tensors):
            self.count, self.quiet = self.count + 1, True
            try:
                return to_host(*tensors)
            finally:
                self.quiet = False
        monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
        for module in DECODERS:
            monkeypatch.setattr(module, "to_host", counted_to_host)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in SYNC_OPS and not self.quiet
        return func(*args, **(kwargs or {}))


def test_the_counter_sees_every_kind_of_sync(monkeypatch):
    x = torch.arange(5)
    with SyncCounter(monkeypatch) as syncs:
        bool((x > 3).any()), int(x[2]), x.tolist(), x.nonzero(), torch.equal(x, x), 3 in x
        decode.to_host(x, x, x)
    assert syncs.count == 7


def prompts():
    return [torch.randint(4, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist()
            for n in (3, B, 2 * B + 5)]


@pytest.mark.parametrize("rule_name", list(RULES))
@pytest.mark.parametrize("method", ["plain", "spiffy"])
def test_one_host_sync_per_decoding_forward(method, rule_name, monkeypatch):
    """Every forward but the prompt's prefill decodes, and each makes exactly one sync (Spiffy
    with verify.walk_one_sync; verify.walk syncs once a step)."""
    model = make_model(block_size=B)
    rule = DecodeRule(MASK_ID, B, **RULES[rule_name])
    graph = calibrate(model, prompts(), rule, 16, budget=8) if method == "spiffy" else None
    walked = 1
    for p in prompts():
        with SyncCounter(monkeypatch) as syncs:
            if method == "plain":
                _, stats = generate(model, p, 24, rule, eos_id=NO_EOS)
            else:
                _, stats = spiffy_generate(model, p, 24, rule, graph, eos_id=NO_EOS, walk=verify.walk_one_sync)
        prefill = int(len(p) >= B)
        assert syncs.count == stats["nfe"] - prefill
        walked = max(walked, *stats.get("steps_per_forward", [1]))
    assert method == "plain" or walked > 1, "no round walked past a draft: vacuous"


def test_sampled_spiffy_syncs_once_a_walk_step(monkeypatch):
    """A sampled rule draws in plain decoding's order, so the walk cannot step every copy at
    once: one sync a step taken (still one a forward when a round takes one step)."""
    model = make_model(block_size=B)
    rule = DecodeRule(MASK_ID, B, temperature=1.0, top_k=4)
    graph = calibrate(model, prompts(), rule, 16, budget=8)
    for p in prompts():
        with SyncCounter(monkeypatch) as syncs:
            stats = spiffy_generate(model, p, 24, rule, graph, eos_id=NO_EOS, walk=verify.walk_one_sync,
                                    generator=torch.Generator().manual_seed(0))[1]
        assert syncs.count == sum(k * n for k, n in stats["steps_per_forward"].items())


def test_simsd_syncs_once_a_draft_and_once_a_walk(monkeypatch):
    """SimSD with its drafter, greedy threshold rule, fast.draft_one_sync and verify.walk_one_sync: every sync goes through
    to_host (the stats count them all), ONE a drafting round (the draft read back: which
    positions, how many, when to stop and whether to go on past the block stay on the device)
    and one a target forward (the walk): two a target forward."""
    target, drafter = make_model(block_size=B), make_model(n_layer=1, block_size=B, seed=5)
    rule = DecodeRule(MASK_ID, B, **RULES["threshold"])
    per_draft, syncs = [], SyncCounter(monkeypatch)

    def counted(*args, **kw):
        before = syncs.count
        d = fast.draft_one_sync(*args, **kw)
        per_draft.append(syncs.count - before)
        return d
    settings = speculate.Settings(draft_steps=3, draft=counted, walk=verify.walk_one_sync)
    for p in prompts():
        syncs.count = 0
        with syncs:
            stats = counting(speculate.simsd_generate)(target, drafter, p, 24, rule, settings,
                                                       eos_id=NO_EOS)[1]
        decoding = stats["nfe"] - int(len(p) >= B)
        assert syncs.count == stats["syncs"] == 2 * decoding
        assert stats["nfe_draft"] > decoding, "vacuous: one drafter forward a round"
    assert set(per_draft) == {1}
