"""What a first GPU run needs, checked on the CPU.

- Device consistency: every forward kind (plain, fused commit, copies, copies of the next
  block, the temporal mask; dynamic and static shapes) on a model whose tensors live on
  another device than the CPU, with every aten op watched: no op may mix a CPU tensor with the
  model's (a compiled GPU kernel cannot read a CPU tensor a mask captured). The other device
  is "meta": torch's fake CUDA tensors fail at the first index on a CPU-only build
  ("PyTorch is not linked with support for cuda devices"), meta tensors run every op here.
- Flex attention's kernel choice for SDAR's head counts at every query-row bucket.
- The row cap on copies, the warm-up (no graph after it), the checkpoint's dtype.
"""
import json

import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import cli
import decode
import mask as masks
from conftest import ROOT, make_model
import fast
from measure.pricing import GPU_ROWS, MAX_BUCKET, default_rows
import compiling
from decode import DecodeRule, Session, generate
from model import ModelConfig, Transformer, flex_kernel_options
from loading.checkpoint import PRESETS
from speculate import Settings, simsd_generate
from spiffy import calibrate
from spiffy import spiffy_generate
from verify import Guesses, verify_copies

MASK_ID, B = PRESETS["tiny"]["mask_token_id"], 4


class MixedDevices(TorchDispatchMode):
    """Records every aten op whose tensors (inputs and outputs) span more than one device, but
    the copies between devices (decode.to_device's, decode.to_host's)."""

    def __init__(self):
        super().__init__()
        self.mixed = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        devices = {t.device.type for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)}
        if len(devices) > 1 and func not in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            self.mixed.append(f"{func} on {sorted(devices)}")
        return out


def meta_model(static):
    with torch.device("meta"):
        model = Transformer(ModelConfig(**PRESETS["tiny"])).eval()
    if static:     # the static path, uncompiled: the same code compile_static compiles
        fast.static_shapes(model, Transformer.trunk)
    return model


def forwards(model):
    """One forward of each kind, as the decoders make them (Session.forward)."""
    d = dict(device="meta")
    sess = Session(model, B, 16 * B)
    pos = torch.arange(B, 2 * B, **d)
    block = torch.full((B,), MASK_ID, **d)
    yield "prefill", lambda: sess.prefill(torch.full((B,), 5, **d))
    yield "plain", lambda: sess.forward(block, pos, keep=B)

    def fused():
        sess.pending = torch.full((B,), 5, **d)
        sess.forward(block, pos + B, keep=B)
    yield "fused commit", fused
    copies = torch.full((3, B), MASK_ID, **d)
    yield "copies", lambda: verify_copies(sess, Guesses(copies, [B] * 3), pos)
    yield "copies of the next block", lambda: verify_copies(sess, Guesses(copies, [B] * 3, [-1, -1, 1]), pos)
    step, slot = torch.tensor([0, 1, 2, 3, 1, 2, 3, 0], **d), torch.arange(2 * B, **d) >= B
    yield "temporal", lambda: sess.forward(torch.full((2 * B,), MASK_ID, **d), pos.repeat(2),
                                           lambda prefix, n_commit: masks.simsd_temporal(prefix, n_commit, step, slot), keep=B)


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("attn", ["sdpa", "flex"])
def test_no_forward_mixes_cpu_tensors_into_the_models_device(static, attn, monkeypatch):
    """flex: the BlockMask is built from the mask_mod on the model's device (create_block_mask
    evaluates it there); the attention itself, which eager flex refuses on meta, is stood in
    for by an empty output of its shape."""
    import model as model_module
    monkeypatch.setattr(model_module, "flex_attention", lambda q, *a, **kw: torch.empty_like(q))
    model = meta_model(static)
    model.attn_impl = attn
    kinds = []
    for kind, forward in forwards(model):
        with MixedDevices() as watch:
            forward()
        assert not watch.mixed, f"{kind}: {watch.mixed[:3]}"
        kinds.append(kind)
    assert len(kinds) == 6


def test_a_default_forward_mixes_no_devices():
    model = meta_model(False)
    with MixedDevices() as watch:
        model(torch.zeros(1, 2 * B, dtype=torch.long, device="meta"))
    assert not watch.mixed


@pytest.mark.parametrize("preset", ["sdar-1.7b", "sdar-4b", "sdar-8b", "tiny"])
def test_flex_decoding_is_bypassed_where_its_tile_cannot_fit(preset):
    """torch's flex decoding kernel (under 128 query rows) tiles next_pow2(rows x heads per KV
    head) rows and needs 128 to be a multiple of the tile: past 128 the main kernel is forced,
    at every bucket decoding pads to (1 to MAX_BUCKET blocks of B = 4, 8, 32)."""
    c = PRESETS[preset]
    group = c["n_head"] // c["n_kv_head"]
    for B_ in (4, 8, 32):
        blocks = 1
        while blocks <= MAX_BUCKET:
            rows = blocks * B_
            forced = flex_kernel_options(rows, group) is not None
            tile = max(16, 1 << (rows * group - 1).bit_length())
            assert forced == (rows < 128 and 128 % tile != 0), (preset, rows)
            blocks *= 2
    assert flex_kernel_options(64, 4) == {"FORCE_USE_FLEX_ATTENTION": True}      # SDAR-8B, 64 rows
    assert flex_kernel_options(64, 2) is None and flex_kernel_options(32, 4) is None


def prompt(n):
    return torch.randint(4, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist()


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_capped_rows_keep_the_tokens_and_fit_the_largest_bucket(static, monkeypatch):
    """A row cap on a verification's copies (fast.cutter; a GPU's default: pricing.default_rows); the output stays
    plain decoding's, every forward fits, and fewer rows are verified."""
    target, drafter = make_model(block_size=B), make_model(n_layer=1, block_size=B, seed=5)
    if static:
        for m in target, drafter:
            fast.static_shapes(m, Transformer.trunk)
    rule = DecodeRule(MASK_ID, B, strategy="low_confidence_dynamic", threshold=0.6)
    graph = calibrate(target, [prompt(5), prompt(11)], rule, 16, budget=8)
    for n in (3, 9):
        plain = generate(target, prompt(n), 24, rule, eos_id=-1)[0]
        for rows in (B, 3 * B, 8 * B):
            out, st = simsd_generate(target, drafter, prompt(n), 24, rule, Settings(cut=fast.cutter(None, rows, B)), eos_id=-1)
            assert out == plain and max(st["rows"]) <= rows + B        # + the pending block
            out, st = spiffy_generate(target, prompt(n), 24, rule, graph, eos_id=-1, cut=fast.cutter(None, rows, B))
            assert out == plain and max(st["rows"]) <= rows + B
    many = dict(settings=Settings(draft_steps=4 * B), eos_id=-1)       # (one token a step: a copy a draft)
    static_rule = DecodeRule(MASK_ID, B)
    if static:   # uncapped, a verification outgrows the largest bucket: an error, never eager
        monkeypatch.setattr(fast, "STATIC_ROWS", MAX_BUCKET * B)
        with pytest.raises(RuntimeError, match="largest compiled bucket"):
            simsd_generate(target, drafter, prompt(9), 24, static_rule, **many)
    else:
        assert max(simsd_generate(target, drafter, prompt(9), 24, static_rule, **many)[1]["rows"]) > MAX_BUCKET * B
    with pytest.raises(ValueError, match="below one block"):
        fast.cutter(None, B - 1, B)


def test_the_gpu_default_cap_fits_the_largest_bucket():
    for B_ in (4, 8, 32):
        rows = default_rows(None, "cpu", "static", B_)
        assert rows + B_ <= MAX_BUCKET * B_ and rows <= GPU_ROWS
    assert default_rows(None, "cpu", "auto", 4) is None and default_rows(12, "cpu", None, 4) == 12


@pytest.mark.parametrize("block_size", [4, 8, 32])
def test_no_graph_is_compiled_after_the_warm_up(block_size):
    """The CPU's compiled path (dynamic shapes; the "eager" backend runs dynamo's capture and
    guards, where recompiles come from): after compiling.warm_up (the shortest and the longest
    prompt), prompts of every other length compile nothing, for each decoder. (It failed while
    the masks captured views of one tensor, and while views reached the compiled forward:
    a guard on a view's base, or two sizes equal by chance, made new graphs later.)"""
    target = make_model(block_size=block_size, block_sizes=(4, 8, 32))
    drafter = make_model(n_layer=1, block_size=block_size, block_sizes=(4, 8, 32), seed=5)
    rule = DecodeRule(MASK_ID, block_size, strategy="low_confidence_dynamic", threshold=0.6)
    graph = calibrate(target, [prompt(5), prompt(11)], rule, 16, budget=8)
    torch._dynamo.reset()
    counters.clear()
    for m in target, drafter:
        fast.compile_dynamic(m, backend="eager")
    n = block_size + 4
    runs = [lambda ids, k: generate(target, ids, k, rule, eos_id=-1),
            lambda ids, k: simsd_generate(target, drafter, ids, k, rule, eos_id=-1),
            lambda ids, k: spiffy_generate(target, ids, k, rule, graph, eos_id=-1)]
    prompts = [prompt(k) for k in (2, 3, 7, 9, 13, 17, 22, 31, 40, 41)]
    compiling.warm_up(runs, prompts, n, block_size, target, drafter)
    graphs = counters["stats"]["unique_graphs"]
    for ids in prompts:
        for run in runs:
            run(ids, n)
    assert counters["stats"]["unique_graphs"] == graphs


def test_the_checkpoints_own_dtype_is_the_default(tmp_path):
    import shutil
    for name in ("config.json", "model.safetensors", "tokenizer.model"):
        shutil.copy(ROOT / "models/target" / name, tmp_path / name)
    assert cli.load(tmp_path)[0].embed.weight.dtype == torch.float32          # names none: fp32
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(hf, torch_dtype="bfloat16")))
    assert cli.load(tmp_path)[0].embed.weight.dtype == torch.bfloat16
    assert cli.load(tmp_path, dtype=torch.float32)[0].embed.weight.dtype == torch.float32


def test_decoding_counts_its_host_syncs():
    model = make_model(block_size=B)
    rule = DecodeRule(MASK_ID, B, strategy="low_confidence_dynamic", threshold=0.6)
    before = decode.SYNCS["host"]
    st = generate(model, prompt(9), 16, rule, eos_id=-1)[1]
    assert st["syncs"] == decode.SYNCS["host"] - before == st["nfe"] - 1    # prefill reads nothing
