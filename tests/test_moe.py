"""The mixture of experts (model.SparseMLP, SDAR-30B-A3B's Qwen3-MoE trunk) on the CPU:

- parity with transformers' Qwen3MoeForCausalLM under SDAR's block mask, fp32, on random
  shapes and seeds (norm_topk_prob on and off, dense layers among the sparse, tied and untied
  heads), the experts each row is routed to compared before the logits;
- a row's output does not depend on the other rows of the forward, to the bit, and the two
  forms (the loop over the experts hit, the gathered form compiling uses) agree to the bit.
  On a CPU, F.silu's bits depend on an element's place in the vector loop: with an expert width
  that is a multiple of 64 (Qwen3-30B-A3B's 768 is) every row sits alike; at 48 this fails;
- the loader: both names of the expert count, a missing or extra expert tensor named, a
  malformed config refused in one line naming the key;
- every decoder is lossless on a tiny random MoE (plain, threshold, SimSD with a dense drafter
  of the same vocabulary, Spiffy), with walks of more than one step.

Seeds are drawn at random and printed; MOE_SEED=<seed> reruns a failure.
Run: python -m pytest tests/test_moe.py -q -s
"""
import json
import math
import os
import random

import pytest
import torch

import model as model_py
from conftest import make_model
from decode import DecodeRule, generate
from loading import checkpoint
from measure.counts import counting
from speculate import Settings, simsd_generate
from spiffy import calibrate, spiffy_generate
from test_hf_parity import block_causal_4d, hf_logits, ours

B, VOCAB, MASK_ID, T, TOL = 4, 300, 299, 37, 1e-4
SEED = int(os.environ.get("MOE_SEED", random.SystemRandom().randrange(1 << 31)))
# name -> (norm_topk_prob, tied head, mlp_only_layers, decoder_sparse_step, expert-count key)
CASES = {"norm-tied-all-sparse": (True, True, [], 1, "num_local_experts"),
         "raw-untied-dense-first": (False, False, [0], 1, "num_experts"),
         "norm-untied-every-2nd": (True, False, [], 2, "num_local_experts")}


def draw_shape(seed):
    """A random small Qwen3-MoE shape."""
    r = random.Random(seed)
    E = r.choice([4, 8, 16])
    return dict(hidden_size=r.choice([32, 64]), num_hidden_layers=r.choice([2, 3]),
                num_attention_heads=4, num_key_value_heads=r.choice([1, 2]), head_dim=16,
                intermediate_size=r.choice([48, 96]), moe_intermediate_size=r.choice([16, 24, 40]),
                num_experts=E, num_experts_per_tok=r.randint(1, min(E, 4)))


def build_hf_moe(path, case, seed):
    """A random Qwen3MoeForCausalLM, saved by transformers and relabelled SDAR-MoE. Fan-in
    scaled weights the router's scaled up so that a row's k-th and (k+1)-th experts stand
    apart (a near-tie would flip on rounding, on either side). -> the HF model"""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.disable_progress_bar()
    norm, tied, dense, step, count_key = CASES[case]
    config = transformers.Qwen3MoeConfig(
        vocab_size=VOCAB, rms_norm_eps=1e-6, norm_topk_prob=norm, tie_word_embeddings=tied,
        mlp_only_layers=dense, decoder_sparse_step=step, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4}, attn_implementation="sdpa",
        **draw_shape(seed))
    hf = transformers.Qwen3MoeForCausalLM(config).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.4 * (torch.rand(p.shape, generator=g) - 0.5))
            elif name == "model.embed_tokens.weight":   # (a tied head's logits ~ N(0, 10))
                p.copy_(torch.randn(p.shape, generator=g) * 0.4)
            else:
                gain = 12.0 if name.endswith("mlp.gate.weight") else 1.0   # the router: 12
                p.copy_(torch.randn(p.shape, generator=g) * gain / math.sqrt(p.shape[-1]))
    hf.save_pretrained(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(model_type="sdar_moe", architectures=["SDARMoeForCausalLM"], block_size=B,
               mask_token_id=MASK_ID)
    cfg[count_key] = cfg.pop("num_local_experts", None) or cfg.pop("num_experts")
    (path / "config.json").write_text(json.dumps(cfg))
    return hf


def routes(layers, record):
    """Hooks that append each sparse layer's experts a row (sorted) to `record` -> handles."""
    def hook(module, args, out):
        record.append((out[2] if isinstance(out, tuple) else out).sort(-1).values)
    return [layer.register_forward_hook(hook) for layer in layers]


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_routes_equal_transformers_qwen3_moe(case, tmp_path):
    seed = SEED + list(CASES).index(case)
    print(f"\n[moe parity] {case}: seed {seed} (rerun: MOE_SEED={SEED}), {draw_shape(seed)}")
    hf = build_hf_moe(tmp_path, case, seed)
    ours_model = checkpoint.from_pretrained(tmp_path)
    sparse = [layer.mlp for layer in ours_model.layers if isinstance(layer.mlp, model_py.SparseMLP)]
    assert len(sparse) == sum(hasattr(layer.mlp, "experts") for layer in hf.model.layers) >= 1
    assert (ours_model.lm_head.weight is ours_model.embed.weight) == CASES[case][1]
    theirs, mine = [], []
    for mlp in sparse:   # ours: the experts by_expert is handed, sorted a row
        mlp.by_expert = (lambda f: lambda x, e, w: mine.append(e) or f(x, e, w))(mlp.by_expert)
    handles = routes([layer.mlp.gate for layer in hf.model.layers if hasattr(layer.mlp, "gate")
                      and not hasattr(layer.mlp, "gate_proj")], theirs)
    ids = torch.randint(0, VOCAB, (1, T), generator=torch.Generator().manual_seed(seed))
    ref = hf_logits(hf, ids, block_causal_4d(T, B))
    for h in handles:
        h.remove()
    for impl in ("sdpa", "flex"):
        mine.clear()
        got = ours(ours_model, impl, ids)
        for layer, (a, b) in enumerate(zip(mine, theirs)):
            assert torch.equal(a, b), f"MOE_SEED={SEED}: layer {layer} routes rows elsewhere"
        diff = float((got - ref).abs().max())
        print(f"[moe parity] {case} {impl}: max |logit diff| {diff:.2e} (max |logit| "
              f"{float(ref.abs().max()):.1f})")
        assert diff <= TOL, f"MOE_SEED={SEED}: {diff}"


def sparse_mlp(seed, E=8, k=2, norm=True):
    c = model_py.ModelConfig(n_embd=64, n_experts=E, top_k=k, moe_intermediate_size=64,
                             norm_topk_prob=norm)
    torch.manual_seed(seed)
    mlp = model_py.SparseMLP(c)
    with torch.no_grad():
        mlp.router.weight.mul_(100)
    return mlp


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_rows_output_is_independent_of_the_other_rows_to_the_bit(k):
    """The copies forward relies on it: each subset of the rows gives the rows' bits of the whole,
    in either form (by_expert, by_row: gpt-fast's gathered form, which compiling uses). Subsets
    of 2 rows or more, as every forward has (a block): for one row the router's F.linear takes
    another CPU kernel (a matrix-vector product), whose bits differ."""
    seed = SEED + k
    mlp = sparse_mlp(seed, k=k)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 97, 64, generator=g)
    with torch.no_grad():
        whole = mlp(x)[0]
        flat = x[0]
        probs = torch.softmax(mlp.router(flat), -1, dtype=torch.float32)
        w, e = probs.topk(k)
        w = w / w.sum(-1, keepdim=True)
        e, order = e.sort(-1)
        w = w.gather(-1, order)
        assert torch.equal(mlp.by_row(flat, e, w), whole), f"seed {seed}: the forms differ"
        for n in (2, 3, 4, 5, 17):
            rows = torch.randperm(97, generator=g)[:n].sort().values
            assert torch.equal(mlp(x[:, rows])[0], whole[rows]), f"seed {seed}: rows {rows}"
            assert torch.equal(mlp.by_row(flat[rows], e[rows], w[rows]), whole[rows])
    assert len(e.unique()) > 1   # not vacuous: the rows go to several experts


def test_the_dense_mlp_is_what_a_dense_model_builds():
    c = model_py.ModelConfig(n_layer=4, n_experts=4, top_k=2, decoder_sparse_step=2,
                             mlp_only_layers=(3,))
    kinds = [type(b.mlp).__name__ for b in model_py.Transformer(c).layers]
    assert kinds == ["MLP", "SparseMLP", "MLP", "MLP"]


# ============================================================================ the loader

def moe_checkpoint(path, **overrides):
    m = make_model(**{**checkpoint.PRESETS["tiny-moe"], "n_layer": 2, **overrides})
    checkpoint.save_pretrained(m, path, torch.float32)
    return m


def test_a_saved_moe_checkpoint_loads_to_the_same_logits(tmp_path):
    m = moe_checkpoint(tmp_path, mlp_only_layers=(1,))
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "sdar_moe" and cfg["architectures"] == ["SDARMoeForCausalLM"]
    loaded = checkpoint.from_pretrained(tmp_path)
    ids = torch.randint(4, 97, (1, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids), m(ids))


@pytest.mark.parametrize("edit, named", [
    (lambda s: s.pop("model.layers.0.mlp.experts.5.up_proj.weight"),
     "model.layers.0.mlp.experts.5.up_proj.weight"),
    (lambda s: s.update({"model.layers.1.mlp.experts.8.down_proj.weight":
                         s["model.layers.1.mlp.experts.0.down_proj.weight"].clone()}),
     "model.layers.1.mlp.experts.8.down_proj.weight"),
    (lambda s: s.pop("model.layers.1.mlp.gate.weight"), "model.layers.1.mlp.gate.weight")])
def test_a_missing_or_extra_expert_tensor_is_named(tmp_path, edit, named):
    from safetensors.torch import load_file, save_file
    moe_checkpoint(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    edit(state)
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=named.replace(".", r"\.")):
        checkpoint.from_pretrained(tmp_path)


@pytest.mark.parametrize("change, key", [
    (dict(num_experts_per_tok=9), "num_experts_per_tok 9 is above num_experts 8"),
    (dict(moe_intermediate_size=None), "moe_intermediate_size is missing"),
    (dict(num_experts=None), "num_experts is missing"),
    (dict(norm_topk_prob=1), "norm_topk_prob must be true or false")])
def test_a_malformed_moe_config_is_refused_naming_the_key(tmp_path, change, key):
    moe_checkpoint(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg = {k: v for k, v in {**cfg, **change}.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=f"config.json: {key}") as e:
        checkpoint.from_pretrained(tmp_path)
    assert "\n" not in str(e.value)


def test_missing_moe_keys_take_qwen3_moe_defaults():
    hf = checkpoint.config_to_hf(model_py.ModelConfig(**checkpoint.PRESETS["tiny-moe"]))
    for key in ("norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"):
        hf.pop(key)
    hf["num_experts_per_tok"] = hf.pop("num_experts_per_tok") * 0 + 8   # the default is 8
    c = checkpoint.config_from_hf({**hf, "model_type": "qwen3_moe"})
    assert (c.top_k, c.norm_topk_prob, c.decoder_sparse_step, c.mlp_only_layers) == (8, False, 1, ())


# ============================================================================ lossless

def prompts(n=8):
    return [torch.randint(4, 97, (L,), generator=torch.Generator().manual_seed(L)).tolist()
            for L in (3, 4, 5, 7, 8, 9, 11, 13)[:n]]


def test_every_decoder_is_lossless_on_a_tiny_moe():
    """plain, threshold, SimSD (a dense drafter of the same vocabulary) and Spiffy write plain
    decoding's tokens (under their rule) on every prompt, and walk more than a step a forward."""
    target = make_model(**{**checkpoint.PRESETS["tiny-moe"], "n_layer": 2}, seed=3)
    drafter = make_model(n_layer=1, seed=4)
    one = DecodeRule(MASK_ID_TINY, B)
    rule = DecodeRule(MASK_ID_TINY, B, strategy="low_confidence_dynamic", threshold=0.6)
    graph = calibrate(target, [[5, 6, 7], [8] * 6], one, 16, budget=8)
    n, walked = 24, {}
    for name, r in (("plain", one), ("threshold", rule)):
        for p in prompts():
            ref = generate(target, p, n, r, eos_id=-1)[0]
            out, stats = counting(simsd_generate)(target, drafter, p, n, r, Settings(), eos_id=-1)
            assert out == ref, f"SimSD, {name}, prompt {p}"
            walked["simsd", name] = walked.get(("simsd", name), 0) + sum(
                v for k, v in stats["steps_per_forward"].items() if k >= 2)
            if r is one:
                out, stats = counting(spiffy_generate)(target, p, n, r, graph, eos_id=-1)
                assert out == ref, f"Spiffy, prompt {p}"
                walked["spiffy"] = walked.get("spiffy", 0) + sum(
                    v for k, v in stats["steps_per_forward"].items() if k >= 2)
    print(f"\n[moe lossless] forwards that walked 2+ steps: {walked}")
    assert min(walked.values()) >= 1


MASK_ID_TINY = checkpoint.PRESETS["tiny-moe"]["mask_token_id"]



def test_an_moe_forward_reads_the_experts_its_rows_route_to():
    """measure/sol.py on the meta device: SDAR-30B-A3B's forward reads its weights outside the
    experts and 8 experts a layer for one row, more with more rows, all of them (61 GB) for
    many random rows; the dense 8B reads all of its weights whatever the rows."""
    from measure import sol
    outside, expert, sparse = sol.preset_experts("sdar-30b-a3b")
    assert sparse == 48 and expert == 3 * 768 * 2048
    assert sol.forward_bytes("sdar-30b-a3b", 1) == 2 * (outside + 48 * 8 * expert)
    by_rows = [sol.forward_bytes("sdar-30b-a3b", r) for r in (1, 4, 16, 64, 256)]
    assert by_rows == sorted(by_rows) and by_rows[0] < by_rows[-1]
    total = 2 * sol.preset_params("sdar-30b-a3b")[0]
    assert 60e9 < total < 62e9
    assert sol.forward_bytes("sdar-30b-a3b", 256, copies=False) == pytest.approx(total, rel=1e-3)
    assert sol.forward_bytes("sdar-8b", 1) == sol.forward_bytes("sdar-8b", 256)
