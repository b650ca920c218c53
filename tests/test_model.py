"""Tests for model.py: the forward on both attention paths, the KV cache, plain block-diffusion
decoding against a slow cache-free reference decoder, the decoding rule, input checks and the
HF-format checkpoint round trip. All on tiny random "peaky" models (conftest.make_model), CPU.

Run: python -m pytest tests/test_model.py -q
"""
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from loading import checkpoint
import mask
from decode import DecodeRule, generate
from model import ModelConfig, RMSNorm, rope
from loading.checkpoint import PRESETS

MASK_ID = PRESETS["tiny"]["mask_token_id"]
NO_EOS = -1     # an eos_id that never occurs: fixed-length output


def assert_logits_close(actual, expected):
    """fp32 agreement to 1e-5 of the logits' scale (the peaky model's logits reach about 30, so
    a plain atol of 1e-5 would ask for agreement below the fp32 resolution there)."""
    scale = max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(actual, expected, atol=1e-5 * scale, rtol=0)


def tokens(n, seed=0, vocab=97):
    """n random ordinary token ids (above the special ids 0..3)."""
    return torch.randint(4, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# ============================================================================ forward

@pytest.mark.parametrize("block_size", [4, 8])
def test_forward_shape_and_default_mask_is_block_causal(tiny_model, block_size):
    model = tiny_model(block_size=block_size)
    idx = torch.tensor([tokens(21, seed=1), tokens(21, seed=2)])
    with torch.no_grad():
        logits = model(idx)
        assert logits.shape == (2, 21, model.config.vocab_size) and logits.dtype == torch.float32
        explicit = model(idx, torch.arange(21), None, mask.block_causal(block_size))
        dense = model(idx, None, None, mask.dense_mask(mask.block_causal(block_size), 21, 21))
        last = model(idx, keep=5)
    torch.testing.assert_close(explicit, logits, atol=0, rtol=0)
    torch.testing.assert_close(dense, logits, atol=0, rtol=0)
    torch.testing.assert_close(last, logits[:, -5:], atol=0, rtol=0)


def test_forward_attends_block_causally(tiny_model):
    """Changing a token changes the logits of its own block (bidirectional) and of later
    blocks, never of earlier blocks."""
    B = 4
    model = tiny_model(block_size=B)
    idx = torch.tensor([tokens(16, seed=3)])
    changed = idx.clone()
    changed[0, 9] = (changed[0, 9] + 1 - 4) % 93 + 4      # position 9: block 2 = [8, 12)
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    differs = (a - b).abs().amax(-1) > 1e-4
    assert not differs[:8].any(), "an earlier block saw a later token"
    assert differs[8:].all(), "the own block or a later block ignored the token"


def test_batch_rows_are_independent_with_per_row_positions(tiny_model):
    model = tiny_model()
    idx = torch.tensor([tokens(12, seed=4), tokens(12, seed=5)])
    pos = torch.stack([torch.arange(12), torch.arange(12) + 4])
    with torch.no_grad():
        both = model(idx, pos)
        rows = [model(idx[i:i + 1], pos[i]) for i in range(2)]
    assert_logits_close(both, torch.cat(rows))


def test_rope_depends_only_on_relative_positions(tiny_model):
    """Rotary embeddings make attention depend on position differences only: shifting every
    position id by a constant leaves the logits unchanged (up to fp32 rounding of the angles)."""
    model = tiny_model()
    idx = torch.tensor([tokens(12, seed=6)])
    with torch.no_grad():
        a = model(idx, torch.arange(12))
        b = model(idx, torch.arange(12) + 40)
        c = model(idx, torch.arange(12).flip(0))    # a real change of the relative positions
    torch.testing.assert_close(a, b, atol=1e-3, rtol=0)
    assert (a - c).abs().max() > 1e-2


def run_forwards(model, impl, prompt, block, simsd):
    """Prefill, then a plain block, then a SimSD-style section (mask slots copying the RoPE
    positions of their data tokens), all through the KV cache; -> the three logits."""
    model.attn_impl = impl
    P, B = len(prompt), len(block)
    model.setup_cache(64)
    out = [model(torch.tensor([prompt]), None, 0)]
    out.append(model(torch.tensor([block]), None, P, keep=B))
    step, is_slot = simsd
    section = block + [MASK_ID] * sum(is_slot)
    pos = torch.arange(P, P + B).tolist()
    pos += [pos[i] for i in range(B) if step[i] > 0]
    mod = mask.simsd_temporal(P, 0, torch.tensor(step), torch.tensor(is_slot))
    out.append(model(torch.tensor([section]), torch.tensor(pos), P, mod))
    model.attn_impl = None
    return out


@pytest.mark.parametrize("shape", [(1, 4, 9, 64), (2, 2, 17, 16)])
def test_rope_and_the_norm_are_the_two_half_and_unfused_formulas_to_the_bit(shape):
    """RoPE as x cos + rotate_half(x) sin, and RMSNorm as one op with its weight (fp32), compute
    the same bits as (x1 cos - x2 sin, x2 cos + x1 sin) and weight * rms_norm(x)."""
    g = torch.Generator().manual_seed(0)
    x, angles = torch.randn(shape, generator=g) * 3, torch.randn(1, 1, shape[2], shape[3] // 2, generator=g) * 50
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x.chunk(2, dim=-1)
    twice = lambda t: torch.cat((t, t), dim=-1)  # noqa: E731
    assert torch.equal(rope(x, twice(cos), twice(sin)), torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1))
    norm = RMSNorm(shape[-1], 1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5, generator=g)
        assert torch.equal(norm(x), norm.weight * torch.nn.functional.rms_norm(x, x.shape[-1:], eps=1e-6))


def test_flex_and_sdpa_paths_agree(tiny_model):
    model = tiny_model(block_size=4)
    idx = torch.tensor([tokens(37, seed=7), tokens(37, seed=8)])
    with torch.no_grad():
        model.attn_impl = "flex"
        flex = model(idx)
        model.attn_impl = "sdpa"
        sdpa = model(idx)
        model.attn_impl = None
    assert_logits_close(flex, sdpa)

    # with the KV cache, the default mask and a non-default one (SimSD temporal)
    prompt, block = tokens(12, seed=9), tokens(4, seed=10)
    simsd = ([0, 1, 2, 1, 1, 2, 1], [False] * 4 + [True] * 3)   # slots pair with positions 1, 2, 3
    with torch.no_grad():
        flex = run_forwards(model, "flex", prompt, block, simsd)
        sdpa = run_forwards(model, "sdpa", prompt, block, simsd)
    for f, s in zip(flex, sdpa):
        assert_logits_close(f, s)


@pytest.mark.parametrize("impl", ["sdpa", "flex"])
def test_cached_forward_equals_uncached(tiny_model, impl):
    """Prefill a prompt into the cache, then run [finished block ; next block] (fused commit)
    against it: the rows match a cache-free forward over the whole sequence."""
    B = 4
    model = tiny_model(block_size=B)
    model.attn_impl = impl
    seq = torch.tensor([tokens(20, seed=11)])
    with torch.no_grad():
        full = model(seq)
        model.setup_cache(32)
        prefill = model(seq[:, :12], None, 0)
        fused = model(seq[:, 12:20], None, 12, keep=8)
    model.attn_impl = None
    assert_logits_close(prefill, full[:, :12])
    assert_logits_close(fused, full[:, 12:])


@pytest.mark.parametrize("impl", ["sdpa", "flex"])
def test_scratch_rows_above_the_queries_never_leak(tiny_model, impl):
    """Rows of the static cache above start + T (stale drafts) must not be attended to."""
    model = tiny_model()
    model.attn_impl = impl
    prompt, block = torch.tensor([tokens(8, seed=12)]), torch.tensor([tokens(4, seed=13)])
    with torch.no_grad():
        model.setup_cache(48)
        model(prompt, None, 0)
        before = model(block, None, 8)
        g = torch.Generator().manual_seed(0)
        for layer in model.layers:
            layer.attn.cache.k[:, :, 12:] = 100 * torch.randn(layer.attn.cache.k[:, :, 12:].shape,
                                                              generator=g)
            layer.attn.cache.v[:, :, 12:] = 100 * torch.randn(layer.attn.cache.v[:, :, 12:].shape,
                                                              generator=g)
        after = model(block, None, 8)
    model.attn_impl = None
    torch.testing.assert_close(after, before, atol=0, rtol=0)


# ============================================================================ decoding

def reference_generate(model, prompt, max_new_tokens, rule, eos_id, generator=None):
    """The slow decoder the cached one must match token for token: no cache; every step runs
    the model on the whole sequence so far (prompt blocks, finished blocks, current block)
    with the default block-causal mask and applies the rule to the current block's logits.
    The prompt's tail (len % B tokens) opens the first block as known tokens.
    -> (new tokens, forwards, revealed-per-step counts)."""
    B = rule.block_size
    assert model.config.block_size == B, "the default mask must use the rule's block size"
    n_prefix = len(prompt) // B * B
    seq, tail, out, forwards, reveals = list(prompt[:n_prefix]), list(prompt[n_prefix:]), [], 0, []
    while len(out) < max_new_tokens:
        block = torch.tensor(tail + [rule.mask_id] * (B - len(tail)))
        step = 0
        while (block == rule.mask_id).any():
            with torch.no_grad():
                logits = model(torch.tensor([seq + block.tolist()]))[0, -B:]
            forwards += 1
            new_block = rule(logits, block, step, generator)
            reveals.append(int((new_block != block).sum()))
            block, step = new_block, step + 1
        new = block[len(tail):].tolist()
        seq, tail = seq + block.tolist(), []
        if eos_id in new:
            out += new[:new.index(eos_id)]
            break
        out += new
    return out[:max_new_tokens], forwards, reveals


RULES = {  # name -> DecodeRule kwargs given the block size
    "static-1-per-step": lambda B: dict(strategy="low_confidence_static", steps=B),
    "static-2-per-step": lambda B: dict(strategy="low_confidence_static", steps=B // 2),
    "dynamic": lambda B: dict(strategy="low_confidence_dynamic", threshold=0.95),
}


@pytest.mark.parametrize("rule_name", list(RULES))
@pytest.mark.parametrize("prompt_len", [3, 8, 10])
@pytest.mark.parametrize("B", [4, 8])
def test_cached_generate_equals_cache_free_reference(tiny_model, B, prompt_len, rule_name):
    model = tiny_model(block_size=B)
    rule = DecodeRule(MASK_ID, B, **RULES[rule_name](B))
    prompt, max_new = tokens(prompt_len, seed=B * 100 + prompt_len), 13
    out, stats = generate(model, prompt, max_new, rule, eos_id=NO_EOS)
    ref, forwards, reveals = reference_generate(model, prompt, max_new, rule, NO_EOS)
    assert out == ref
    assert len(out) == max_new and stats["tokens"] == max_new
    assert len(set(out)) >= 2, "degenerate model: the test would pass vacuously"
    # fused commit: the prefill forward (when the prompt holds a whole block), then one
    # forward per denoising step
    assert stats["nfe"] == forwards + (prompt_len >= B)
    if rule_name == "dynamic":
        assert max(reveals) >= 2, "threshold never revealed several tokens in one step"
        assert min(reveals) == 1, "threshold always triggered: the fallback went untested"
    else:  # the static quota: 1 or 2 a step (fewer only when fewer masks are left)
        per_step = 1 if rule_name.startswith("static-1") else 2
        masks = [B - prompt_len % B] + [B] * (math.ceil((prompt_len % B + max_new) / B) - 1)
        assert forwards == sum(math.ceil(m / per_step) for m in masks)
        assert max(reveals) == per_step


def test_generate_on_flex_equals_sdpa(tiny_model):
    """The whole decode loop (prefill, fused [finished ; next] forwards) on both paths."""
    B = 4
    model = tiny_model(block_size=B)
    rule = DecodeRule(MASK_ID, B, strategy="low_confidence_dynamic", threshold=0.95)
    prompt, outs = tokens(10, seed=23), {}
    for impl in ("flex", "sdpa"):
        model.attn_impl = impl
        outs[impl] = generate(model, prompt, 12, rule, eos_id=NO_EOS)
    model.attn_impl = None
    assert outs["flex"][0] == outs["sdpa"][0] and outs["flex"][1]["nfe"] == outs["sdpa"][1]["nfe"]


def test_cached_generate_equals_reference_when_sampling(tiny_model):
    B = 4
    model = tiny_model(block_size=B)
    rule = DecodeRule(MASK_ID, B, temperature=1.0, top_k=20, top_p=0.95)
    prompt = tokens(6, seed=14)
    out, _ = generate(model, prompt, 16, rule, eos_id=NO_EOS,
                      generator=torch.Generator().manual_seed(5))
    ref, _, _ = reference_generate(model, prompt, 16, rule, NO_EOS,
                                   generator=torch.Generator().manual_seed(5))
    assert out == ref


@pytest.mark.parametrize("rule_name", list(RULES))
@pytest.mark.parametrize("prompt_len", [3, 8, 10])
def test_fused_commit_changes_nfe_not_tokens(tiny_model, prompt_len, rule_name):
    B = 4
    model = tiny_model(block_size=B)
    rule = DecodeRule(MASK_ID, B, **RULES[rule_name](B))
    prompt, max_new = tokens(prompt_len, seed=15 + prompt_len), 14
    blocks_f, blocks_s = [], []
    fused, st_f = generate(model, prompt, max_new, rule, True, NO_EOS, on_block=blocks_f.append)
    separate, st_s = generate(model, prompt, max_new, rule, False, NO_EOS, on_block=blocks_s.append)
    assert fused == separate and blocks_f == blocks_s
    n_blocks = math.ceil((prompt_len % B + max_new) / B)
    assert len(blocks_f) == n_blocks
    assert st_s["nfe"] == st_f["nfe"] + n_blocks      # SDAR: one commit forward per block
    if rule_name == "static-1-per-step":              # one forward per generated position
        assert st_f["nfe"] == (prompt_len >= B) + n_blocks * B - prompt_len % B


def test_on_block_reports_each_finished_block(tiny_model):
    model = tiny_model(block_size=4)
    seen = []
    out, _ = generate(model, tokens(6, seed=16), 10, eos_id=NO_EOS, on_block=seen.append)
    assert [len(b) for b in seen] == [2, 4, 4]        # the prompt tail (2) opens block 1
    assert sum(seen, []) == out


def test_greedy_decoding_is_deterministic(tiny_model):
    model = tiny_model(block_size=4)
    prompt = tokens(9, seed=17)
    runs = [generate(model, prompt, 12, eos_id=NO_EOS)[0] for _ in range(2)]
    assert runs[0] == runs[1] and len(set(runs[0])) > 2


def test_sampling_is_reproducible_with_a_seeded_generator(tiny_model):
    model = tiny_model(block_size=4)
    rule = DecodeRule(MASK_ID, 4, temperature=1.0, top_k=20, top_p=0.9)
    prompt = tokens(9, seed=18)

    def sample(seed):
        return generate(model, prompt, 24, rule, eos_id=NO_EOS,
                        generator=torch.Generator().manual_seed(seed))[0]
    a, b, c = sample(1), sample(1), sample(2)
    assert a == b
    assert a != c
    assert MASK_ID not in a + c


def test_decode_rule_probs_apply_top_k_top_p_and_never_the_mask():
    logits = torch.tensor([[0.0, 1.0, 2.0, 5.0, 3.0, 4.0, -1.0, 0.5]])   # mask id 3 is the max
    p = DecodeRule(MASK_ID, 4).probs(logits)
    assert p[0, MASK_ID] == 0 and p[0].argmax() == 5
    torch.testing.assert_close(p.sum(-1), torch.ones(1))
    p = DecodeRule(MASK_ID, 4, temperature=1.0, top_k=2).probs(logits)
    assert (p[0] > 0).nonzero().flatten().tolist() == [4, 5]
    # top_p: the smallest set of most likely tokens whose mass reaches top_p
    p_all = DecodeRule(MASK_ID, 4, temperature=1.0).probs(logits)[0]
    p = DecodeRule(MASK_ID, 4, temperature=1.0, top_p=float(p_all[5]) + 1e-3).probs(logits)
    assert (p[0] > 0).nonzero().flatten().tolist() == [4, 5]
    p = DecodeRule(MASK_ID, 4, temperature=1.0, top_p=float(p_all[5]) - 1e-3).probs(logits)
    assert (p[0] > 0).nonzero().flatten().tolist() == [5]


def test_decode_rule_splits_the_block_evenly_over_the_steps():
    assert DecodeRule(MASK_ID, 8, steps=3).quota == [3, 3, 2]
    assert DecodeRule(MASK_ID, 4).quota == [1, 1, 1, 1]
    assert DecodeRule(MASK_ID, 4, steps=1).quota == [4]


def test_eos_stops_right_before_it(tiny_model):
    model = tiny_model(block_size=4)
    prompt = tokens(6, seed=19)
    full, _ = generate(model, prompt, 24, eos_id=NO_EOS)
    # an eos that first occurs mid-way, not at the start of a block
    k = next(i for i in range(3, len(full)) if full[i] not in full[:i] and (i + 2) % 4 != 0)
    out, stats = generate(model, prompt, 24, eos_id=full[k])
    assert out == full[:k] and stats["tokens"] == k
    # the default eos is config.eos_token_id
    model.config.eos_token_id = full[k]
    assert generate(model, prompt, 24)[0] == full[:k]


def test_max_new_tokens_truncates(tiny_model):
    model = tiny_model(block_size=4)
    prompt = tokens(8, seed=20)
    full, _ = generate(model, prompt, 12, eos_id=NO_EOS)
    for n in (1, 5, 7):
        out, stats = generate(model, prompt, n, eos_id=NO_EOS)
        assert out == full[:n] and stats["tokens"] == n


# ============================================================================ input checks

def test_bad_prompts_raise(tiny_model):
    model = tiny_model(max_seq_len=32)
    with pytest.raises(ValueError, match="empty prompt"):
        generate(model, [], 4)
    with pytest.raises(ValueError, match="exceeds the context of 32"):
        generate(model, tokens(20), 13)
    generate(model, tokens(20), 12, eos_id=NO_EOS)               # exactly the context: fine
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 97\)"):
        generate(model, [5, 97], 4)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 97\)"):
        generate(model, [-1, 5], 4)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        generate(model, [5, 6], 0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.5), "temperature must be >= 0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(top_k=0), "top_k must be >= 1"),
    (dict(steps=5), r"steps must be in \[1, block_size=4\]"),
    (dict(steps=0), r"steps must be in \[1, block_size=4\]"),
    (dict(strategy="margin"), "unknown strategy 'margin'"),
    (dict(threshold=0.0), r"threshold must be in \(0, 1\]"),
    (dict(threshold=1.5), r"threshold must be in \(0, 1\]"),
    (dict(eb_threshold=0.0), "eb_threshold > 0"),
], ids=["temperature<0", "top_p=0", "top_p=1.5", "top_k=0", "steps>B", "steps=0", "strategy",
        "threshold=0", "threshold>1", "eb_threshold=0"])
def test_bad_decode_rules_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecodeRule(MASK_ID, 4, **kwargs)


# ============================================================================ checkpoints

@pytest.mark.parametrize("tied", [True, False])
def test_save_and_load_round_trip(tiny_model, tmp_path, tied):
    model = tiny_model(tie_embeddings=tied, block_size=8)
    checkpoint.save_pretrained(model, tmp_path, torch.float32)
    loaded = checkpoint.from_pretrained(tmp_path)
    assert loaded.config == model.config
    assert (loaded.lm_head.weight is loaded.embed.weight) == tied
    assert not loaded.training
    idx = torch.tensor([tokens(19, seed=21)])
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx), model(idx), atol=0, rtol=0)
    names = set(load_file(tmp_path / "model.safetensors"))
    assert ("lm_head.weight" in names) == (not tied)
    assert "model.layers.1.self_attn.q_norm.weight" in names


def test_load_sharded_checkpoint_and_hf_rope_parameters(tiny_model, tmp_path):
    """Real checkpoints come in shards with an index; transformers 5.x writes rope_theta inside
    rope_parameters (DESIGN 6). A tied checkpoint may also store lm_head: it is ignored."""
    model = tiny_model(rope_theta=1e4)
    checkpoint.save_pretrained(model, tmp_path, torch.float32)
    state = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, tmp_path / shard)
    extra = {"lm_head.weight": torch.zeros_like(state["model.embed_tokens.weight"])}
    save_file(extra, tmp_path / "model-extra.safetensors")
    weight_map = {k: s for s, keys in shards.items() for k in keys}
    weight_map["lm_head.weight"] = "model-extra.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"] = {"rope_theta": config.pop("rope_theta"), "rope_type": "default"}
    (tmp_path / "config.json").write_text(json.dumps(config))

    loaded = checkpoint.from_pretrained(tmp_path)
    assert loaded.config.rope_theta == 1e4
    idx = torch.tensor([tokens(9, seed=22)])
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx), model(idx), atol=0, rtol=0)


def edit_checkpoint(model, path, edit):
    checkpoint.save_pretrained(model, path, torch.float32)
    state = load_file(path / "model.safetensors")
    edit(state)
    save_file(state, path / "model.safetensors")


def test_missing_weight_raises_naming_it(tiny_model, tmp_path):
    edit_checkpoint(tiny_model(), tmp_path, lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"layers\.1\.mlp\.up"):
        checkpoint.from_pretrained(tmp_path)


def test_unknown_weight_raises_naming_it(tiny_model, tmp_path):
    def add(state):
        state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    edit_checkpoint(tiny_model(), tmp_path, add)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.rotary_emb\.inv_freq"):
        checkpoint.from_pretrained(tmp_path)


def test_weight_of_an_extra_layer_raises_naming_it(tiny_model, tmp_path):
    def add(state):
        state["model.layers.2.mlp.up_proj.weight"] = state["model.layers.1.mlp.up_proj.weight"].clone()
    edit_checkpoint(tiny_model(n_layer=2), tmp_path, add)
    with pytest.raises(ValueError, match=r"layers\.2\.mlp\.up"):
        checkpoint.from_pretrained(tmp_path)


def test_wrong_shape_raises_naming_the_weight(tiny_model, tmp_path):
    def reshape(state):
        state["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(32, 64)
    edit_checkpoint(tiny_model(), tmp_path, reshape)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.q_proj\.weight"):
        checkpoint.from_pretrained(tmp_path)


def test_missing_directory_config_or_weights_raise_file_not_found(tiny_model, tmp_path):
    with pytest.raises(FileNotFoundError):
        checkpoint.from_pretrained(tmp_path / "does-not-exist")
    checkpoint.save_pretrained(tiny_model(), tmp_path / "no-config", torch.float32)
    (tmp_path / "no-config" / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        checkpoint.from_pretrained(tmp_path / "no-config")
    checkpoint.save_pretrained(tiny_model(), tmp_path / "no-weights", torch.float32)
    (tmp_path / "no-weights" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        checkpoint.from_pretrained(tmp_path / "no-weights")


def test_config_hf_round_trip():
    config = ModelConfig(vocab_size=101, n_layer=3, block_size=8, tie_embeddings=False)
    assert checkpoint.config_from_hf(checkpoint.config_to_hf(config)) == config
    with pytest.raises(ValueError, match="llama"):
        checkpoint.config_from_hf({**checkpoint.config_to_hf(config), "model_type": "llama"})


def test_config_json_defaults_only_what_hf_qwen3_does():
    """head_dim (hidden / heads) and tie_word_embeddings (false) may be left out; every other
    key that shapes the network is an error naming the key and the file, not a default."""
    hf = checkpoint.config_to_hf(ModelConfig(vocab_size=101, n_embd=64, n_head=4, head_dim=16,
                                             tie_embeddings=True))
    for key in ("head_dim", "tie_word_embeddings", "eos_token_id", "max_position_embeddings"):
        hf.pop(key)
    config = checkpoint.config_from_hf(hf)
    assert (config.head_dim, config.tie_embeddings) == (16, False)
    for key in ("vocab_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "hidden_size", "intermediate_size", "rms_norm_eps", "block_size", "rope_theta"):
        with pytest.raises(ValueError, match=f"^ckpt/config.json: {key} is missing"):
            checkpoint.config_from_hf({k: v for k, v in hf.items() if k != key}, source="ckpt/config.json")
    theta = {k: v for k, v in hf.items() if k != "rope_theta"}
    assert checkpoint.config_from_hf(dict(theta, rope_parameters={"rope_theta": 1e4})).rope_theta == 1e4
