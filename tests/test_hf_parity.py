"""Parity with HF transformers' Qwen3 (an independent implementation of the same network) and
the loader's behaviour on HF-format checkpoints.

SDAR is Qwen3 plus a block-causal mask (docs/design.md section 1), so a random-weight
`transformers.Qwen3ForCausalLM`, saved with `save_pretrained` and relabelled as SDAR in its
config.json, must give our logits when it is run with the same block-causal 4D mask and
position ids. transformers is a test-only dependency: the HF tests skip without it.

- parity of the full forward, fp32, on the flex and the SDPA path (tied and untied heads, one
  file and sharded, the transformers 5 `rope_parameters` layout and the older top-level
  `rope_theta` one);
- a KV-cached decode step against the full forward and HF;
- loading in bf16;
- loader errors (foreign model_type, unexpected, missing and mis-shaped tensors);
- peak memory of loading a ~1B-parameter sharded checkpoint (slow: RUN_SLOW=1 only).

Run: python -m pytest tests/test_hf_parity.py -q -s    (-s shows the measured differences)
     RUN_SLOW=1 python -m pytest tests/test_hf_parity.py -q -s -k peak_memory
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loading import checkpoint
import mask

ROOT = Path(__file__).resolve().parents[1]
B = 4            # block size of every checkpoint here
VOCAB = 300
MASK_ID = 299    # the mask token id written into config.json (< VOCAB)
T = 37           # not a multiple of B: the last block is partial
TOL = 1e-4       # max abs logit difference allowed against HF, fp32

# name -> (tied head, max_shard_size or None for one file, config layout, rope_theta)
CASES = {
    "tied-1file-ropeparams": (True, None, "rope_parameters", 1e6),
    "untied-sharded-ropeparams": (False, "40KB", "rope_parameters", 1e6),
    "tied-sharded-toplevel-theta1e4": (True, "40KB", "rope_theta", 1e4),
}


# ============================================================================ helpers

def block_causal_4d(n, block_size):
    """[1, 1, n, n] bool, True = attend: token i sees token j iff j // B <= i // B. Built here
    with plain torch ops, independently of mask.py."""
    i = torch.arange(n).view(n, 1)
    j = torch.arange(n).view(1, n)
    return (torch.div(j, block_size, rounding_mode="floor")
            <= torch.div(i, block_size, rounding_mode="floor")).view(1, 1, n, n)


def random_ids(n, seed):
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def build_hf_checkpoint(path, tied, shard, layout, theta, seed=0):
    """A random-weight Qwen3ForCausalLM (hidden 64, 2 layers, 8 heads / 2 KV heads, head_dim
    16), saved with save_pretrained and relabelled as SDAR. Weights are drawn "peaky" (fan-in
    scaled Linear weights, unit-variance embedding, norm weights 1 +- 0.2, so a swapped or
    dropped norm weight shows) to keep the logits far from flat. -> the HF model (fp32, eval)."""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.disable_progress_bar()
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        tie_word_embeddings=tied, max_position_embeddings=512, attn_implementation="sdpa")
    torch.manual_seed(seed)
    hf = transformers.Qwen3ForCausalLM(config).float().eval()
    assert (hf.lm_head.weight is hf.model.embed_tokens.weight) == tied
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():   # a tied head is listed once, as the embedding
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.4 * (torch.rand(p.shape, generator=g) - 0.5))
            elif name == "model.embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / math.sqrt(p.shape[1])))
    kwargs = {"max_shard_size": shard} if shard else {}
    hf.save_pretrained(path, **kwargs)
    if shard:
        assert (path / "model.safetensors.index.json").is_file()
        assert len(list(path.glob("model-*-of-*.safetensors"))) >= 3
    else:
        assert (path / "model.safetensors").is_file()
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(model_type="sdar", architectures=["SDARForCausalLM"], block_size=B,
               mask_token_id=MASK_ID)
    if layout == "rope_theta":       # real SDAR configs: the pre-5.x layout
        cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]
    else:
        assert "rope_theta" not in cfg and cfg["rope_parameters"]["rope_theta"] == theta
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return hf


def hf_logits(hf, ids, attention_mask, pos=None):
    pos = torch.arange(ids.shape[1]) if pos is None else pos
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=attention_mask, position_ids=pos.view(1, -1)).logits.float()


def ours(model, impl, *args, **kwargs):
    model.attn_impl = impl
    with torch.no_grad():
        return model(*args, **kwargs)


def maxdiff(a, b):
    return float((a.float() - b.float()).abs().max())


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    """(name, HF model, checkpoint directory, our model loaded from it)."""
    tied, shard, layout, theta = CASES[request.param]
    path = tmp_path_factory.mktemp(request.param)
    hf = build_hf_checkpoint(path, tied, shard, layout, theta)
    return request.param, hf, path, checkpoint.from_pretrained(path)


# ============================================================================ parity

def test_loaded_config_and_weights(case):
    name, hf, path, m = case
    tied, _, _, theta = CASES[name]
    c = m.config
    assert (c.vocab_size, c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.head_dim) == (VOCAB, 2, 64, 8, 2, 16)
    assert (c.block_size, c.mask_token_id, c.rope_theta, c.norm_eps) == (B, MASK_ID, theta, 1e-6)
    assert c.tie_embeddings == tied and (m.lm_head.weight is m.embed.weight) == tied
    assert not m.training
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in m.parameters())
    # every HF tensor, by the loader's own name map
    ref = hf.state_dict()
    ours_state = m.state_dict()
    for hf_name, t in ref.items():
        if hf_name == "lm_head.weight" and tied:
            continue
        assert torch.equal(ours_state[checkpoint.rename(hf_name)], t), hf_name


def test_hf_reference_applies_the_block_mask(case):
    """Guard against a reference that ignores or rewrites the custom 4D mask: HF's logits under
    the block mask differ from its causal ones, and changing the token at position 9 (block
    [8, 12)) changes rows 8.. (row 8 only through bidirectional in-block attention) and no
    row before 8."""
    _, hf, _, _ = case
    ids = random_ids(T, seed=1)
    block = hf_logits(hf, ids, block_causal_4d(T, B))[0]
    causal = hf_logits(hf, ids, None)[0]
    causal_4d = hf_logits(hf, ids, torch.ones(T, T, dtype=torch.bool).tril().view(1, 1, T, T))[0]
    assert maxdiff(causal_4d, causal) <= 1e-5       # a custom 4D bool mask is honoured as given
    assert maxdiff(block, causal) > 1e-1
    changed = ids.clone()
    changed[0, 9] = (changed[0, 9] + 1) % VOCAB
    rows = (hf_logits(hf, changed, block_causal_4d(T, B))[0] - block).abs().amax(-1)
    assert float(rows[:8].max()) <= 1e-5 and float(rows[8:].min()) > 1e-3
    # an additive float mask (0 / -inf) is the same mask to HF's SDPA path
    additive = torch.zeros(1, 1, T, T).masked_fill(~block_causal_4d(T, B), float("-inf"))
    assert maxdiff(hf_logits(hf, ids, additive)[0], block) <= 1e-5


@pytest.mark.parametrize("impl", ["flex", "sdpa"])
def test_full_forward_matches_hf(case, impl):
    name, hf, _, m = case
    ids = random_ids(T, seed=2)
    ref = hf_logits(hf, ids, block_causal_4d(T, B))
    got = ours(m, impl, ids, torch.arange(T))        # explicit positions, default (config) mask
    got_mask = ours(m, impl, ids, torch.arange(T), None, mask.block_causal(B))
    assert got.shape == ref.shape == (1, T, VOCAB) and got.dtype == torch.float32
    d, d_mask = maxdiff(got, ref), maxdiff(got_mask, ref)
    # shifted, non-contiguous positions (as SimSD's copies have): RoPE from position_ids
    pos = torch.arange(T) + 5
    pos[20:] += 11
    d_pos = maxdiff(ours(m, impl, ids, pos), hf_logits(hf, ids, block_causal_4d(T, B), pos))
    print(f"\n[hf parity] {name} {impl}: max|logit| {float(ref.abs().max()):.1f}, max abs diff "
          f"{d:.2e} (explicit mask {d_mask:.2e}, shifted positions {d_pos:.2e})")
    assert d <= TOL and d_mask <= TOL and d_pos <= TOL
    assert float(ref.std()) > 1.0       # not flat: the comparison means something


@pytest.mark.parametrize("impl", ["flex", "sdpa"])
def test_cached_decode_step_matches_full_forward_and_hf(case, impl):
    """Prefill 32 tokens into the cache, then decode the block [32, 36) against it."""
    name, hf, _, m = case
    ids = random_ids(36, seed=3)
    full = ours(m, impl, ids)[:, 32:]
    ref = hf_logits(hf, ids, block_causal_4d(36, B))[:, 32:]
    m.setup_cache(64)
    try:
        ours(m, impl, ids[:, :32], start=0)
        step = ours(m, impl, ids[:, 32:], torch.arange(32, 36), 32, mask.block_causal(B, 32))
        kept = ours(m, impl, ids, keep=4)      # cache-free again: start None
        for layer in m.layers:                 # a fresh cache, no prefill: zero keys/values
            layer.attn.cache = None
        m.setup_cache(64)
        blind = ours(m, impl, ids[:, 32:], torch.arange(32, 36), 32, mask.block_causal(B, 32))
    finally:
        for layer in m.layers:
            layer.attn.cache = None
    d_full, d_hf = maxdiff(step, full), maxdiff(step, ref)
    print(f"\n[hf parity] {name} {impl} cached step: vs full forward {d_full:.2e}, vs HF {d_hf:.2e}")
    assert step.shape == (1, 4, VOCAB)
    assert d_full <= 1e-5 * max(1.0, float(full.abs().max())) and d_hf <= TOL
    torch.testing.assert_close(kept, full, atol=0, rtol=0)
    assert maxdiff(blind, full) > 1e-1         # so the step above did read the prefilled cache


def test_bf16_load(case):
    name, hf, path, m32 = case
    m16 = checkpoint.from_pretrained(path, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in m16.parameters())
    assert (m16.lm_head.weight is m16.embed.weight) == CASES[name][0]
    ids = random_ids(T, seed=4)
    ref = ours(m32, "sdpa", ids)
    for impl in ("sdpa", "flex"):
        got = ours(m16, impl, ids)
        assert got.dtype == torch.float32 and got.shape == ref.shape
        rel = maxdiff(got, ref) / float(ref.abs().max())
        agree = float((got.argmax(-1) == ref.argmax(-1)).float().mean())
        print(f"\n[hf parity] {name} bf16 {impl}: max abs diff / max|logit| {rel:.3f}, "
              f"argmax agreement {agree:.2f}")
        assert rel < 0.1 and agree >= 0.8


# ============================================================================ loader errors

def small_checkpoint(make_model, path, tied=False):
    """A tiny SDAR checkpoint in HF layout (our save_pretrained, fp32, one file)."""
    checkpoint.save_pretrained(make_model(tie_embeddings=tied), path, torch.float32)
    return path


def edit_weights(path, edit):
    state = load_file(path / "model.safetensors")
    edit(state)
    save_file(state, path / "model.safetensors")


def test_foreign_model_type_raises_naming_it(tiny_model, tmp_path):
    path = small_checkpoint(tiny_model, tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "llama"}))
    with pytest.raises(ValueError, match="llama"):
        checkpoint.from_pretrained(path)


def test_unexpected_tensor_raises_naming_it(tiny_model, tmp_path):
    path = small_checkpoint(tiny_model, tmp_path)
    edit_weights(path, lambda s: s.update({"model.layers.0.self_attn.foo.weight": torch.ones(4, 4)}))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.foo\.weight"):
        checkpoint.from_pretrained(path)


MISSING = [("model.layers.1.mlp.up_proj.weight", False), ("model.norm.weight", False),
           ("lm_head.weight", False), ("model.embed_tokens.weight", True),
           ("model.layers.0.self_attn.k_norm.weight", True)]


@pytest.mark.parametrize("hf_name,tied", MISSING)
def test_missing_tensor_raises_naming_it(tiny_model, tmp_path, hf_name, tied):
    path = small_checkpoint(tiny_model, tmp_path, tied)
    edit_weights(path, lambda s: s.pop(hf_name))
    with pytest.raises(ValueError, match=r"(^|\W)" + hf_name.replace(".", r"\.")):
        checkpoint.from_pretrained(path)


def test_missing_tensor_error_uses_the_checkpoint_name(tiny_model, tmp_path):
    path = small_checkpoint(tiny_model, tmp_path)
    edit_weights(path, lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        checkpoint.from_pretrained(path)


def test_wrong_shape_raises_naming_it(tiny_model, tmp_path):
    path = small_checkpoint(tiny_model, tmp_path)
    name = "model.layers.1.self_attn.k_proj.weight"
    edit_weights(path, lambda s: s.update({name: torch.zeros(s[name].shape[0] + 1, s[name].shape[1])}))
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        checkpoint.from_pretrained(path)


def test_tied_checkpoint_that_also_stores_the_head_loads(tiny_model, tmp_path):
    """Some tied checkpoints store lm_head.weight too: it is the embedding, and ignored."""
    model = tiny_model(tie_embeddings=True)
    path = small_checkpoint(tiny_model, tmp_path, tied=True)
    edit_weights(path, lambda s: s.update(
        {"lm_head.weight": torch.zeros_like(s["model.embed_tokens.weight"])}))
    loaded = checkpoint.from_pretrained(path)
    assert loaded.lm_head.weight is loaded.embed.weight
    ids = torch.randint(4, 97, (1, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), atol=0, rtol=0)


# ============================================================================ peak memory (slow)

BIG = dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=16, num_attention_heads=16,
           num_key_value_heads=8, head_dim=128, intermediate_size=6144)
N_SHARDS = 4


def write_big_checkpoint(path):
    """A random-weight, SDAR-shaped bf16 checkpoint (untied, ~0.94B parameters) in N_SHARDS
    shards plus an index, built one shard at a time. -> total tensor bytes."""
    c = BIG
    d, hd, nh, nkv, inter = (c["hidden_size"], c["head_dim"], c["num_attention_heads"],
                             c["num_key_value_heads"], c["intermediate_size"])

    def layer(i):
        p = f"model.layers.{i}."
        return {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                p + "self_attn.q_proj.weight": (nh * hd, d), p + "self_attn.k_proj.weight": (nkv * hd, d),
                p + "self_attn.v_proj.weight": (nkv * hd, d), p + "self_attn.o_proj.weight": (d, nh * hd),
                p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                p + "mlp.gate_proj.weight": (inter, d), p + "mlp.up_proj.weight": (inter, d),
                p + "mlp.down_proj.weight": (d, inter)}

    per = c["num_hidden_layers"] // N_SHARDS
    plan = []
    for s in range(N_SHARDS):
        shapes = {}
        if s == 0:
            shapes["model.embed_tokens.weight"] = (c["vocab_size"], d)
        for i in range(s * per, (s + 1) * per):
            shapes.update(layer(i))
        if s == N_SHARDS - 1:
            shapes.update({"model.norm.weight": (d,), "lm_head.weight": (c["vocab_size"], d)})
        plan.append((f"model-{s + 1:05d}-of-{N_SHARDS:05d}.safetensors", shapes))
    g = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for shard, shapes in plan:
        tensors = {}
        for name, shape in shapes.items():
            if len(shape) == 1:
                tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
            else:
                tensors[name] = torch.empty(shape, dtype=torch.bfloat16).normal_(0, 0.02, generator=g)
            total += tensors[name].numel() * 2
            weight_map[name] = shard
        save_file(tensors, path / shard, metadata={"format": "pt"})
        del tensors
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(dict(
        BIG, model_type="sdar", architectures=["SDARForCausalLM"], rms_norm_eps=1e-6,
        rope_theta=1e6, tie_word_embeddings=False, block_size=4, mask_token_id=31999,
        eos_token_id=2, max_position_embeddings=4096, torch_dtype="bfloat16")))
    return total


LOAD_AND_MEASURE = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import torch
from loading import checkpoint
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
base = rss()
t0 = time.perf_counter()
m = checkpoint.from_pretrained(sys.argv[2], dtype=torch.bfloat16)
seconds = time.perf_counter() - t0
params = list(m.parameters())
after_load, peak_load = rss(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with torch.no_grad():   # safetensors may hand out lazily mapped tensors: read every page
    finite = all(bool(p.abs().amax().isfinite()) for p in params)
print(json.dumps(dict(
    peak=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, base=base, after=rss(),
    after_load=after_load, peak_load=peak_load, finite=finite,
    seconds=seconds, n_params=sum(p.numel() for p in params),
    param_bytes=sum(p.numel() * p.element_size() for p in params),
    dtypes=sorted({str(p.dtype) for p in params}), meta=any(p.is_meta for p in params))))
"""


@pytest.mark.skipif(os.environ.get("RUN_SLOW") != "1", reason="slow (writes ~1.9 GB): RUN_SLOW=1")
def test_peak_memory_of_loading_a_sharded_checkpoint():
    """Loading shard by shard onto the meta-built model must not hold two copies of the
    weights: peak RSS of a fresh process < 1.5 x checkpoint bytes + 1 GB. safetensors (0.8)
    returns CPU tensors backed by a private mmap of the shard, paged in on first touch, so the
    peak is taken after every weight has been read."""
    tmp = Path(tempfile.mkdtemp(prefix="sdar-1b-", dir="/tmp"))
    try:
        total = write_big_checkpoint(tmp)
        on_disk = sum(f.stat().st_size for f in tmp.glob("*.safetensors"))
        out = subprocess.run([sys.executable, "-c", LOAD_AND_MEASURE, str(ROOT), str(tmp)],
                             capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-3000:]
        r = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gb = 1 << 30
    print(f"\n[peak memory] checkpoint {on_disk / gb:.2f} GiB on disk ({total / gb:.2f} GiB of "
          f"tensors, {r['n_params'] / 1e9:.3f} B params); RSS after imports {r['base'] / gb:.2f} GiB; "
          f"just after from_pretrained ({r['seconds']:.1f} s): RSS {r['after_load'] / gb:.2f} GiB, "
          f"peak {r['peak_load'] / gb:.2f} GiB; after reading every weight: RSS "
          f"{r['after'] / gb:.2f} GiB, peak {r['peak'] / gb:.2f} GiB; "
          f"limit {(1.5 * on_disk + gb) / gb:.2f} GiB")
    assert r["dtypes"] == ["torch.bfloat16"] and not r["meta"] and r["finite"]
    assert r["param_bytes"] == total
    assert r["peak"] < 1.5 * on_disk + gb
