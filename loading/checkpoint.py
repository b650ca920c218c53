"""HF-format checkpoints: the directory layout of real SDAR / Qwen3 checkpoints, read and written.

- config.json <-> ModelConfig: every key that shapes the network is required, with its type
  (`config_from_hf`, under config.json's names: HF_KEYS); generation_config.json adds a chat
  model's stop ids. check_config refuses a network that cannot run; PRESETS: SDAR's shapes.
- Weights: model.safetensors, or the shards that model.safetensors.index.json lists, under HF's
  names (HF_NAMES; a mixture of experts' one tensor an expert, EXPERT, stacked here as shards
  arrive). `from_pretrained` reads one shard at a time straight onto the device, into
  a model built on the meta device, so the weights never exist twice in memory.
- Bad files are refused with a one-line ValueError (FileNotFoundError if missing) naming them.

Imports point down: this module imports model.py, which knows no file layout; callers load
and save through the functions here.
"""
import json
import re
from pathlib import Path

import torch

from model import ModelConfig, Transformer
from loading.util import atomic_write, read_json

# ---- config.json ----
# each ModelConfig field's config.json name (check_config's messages use them too)
HF_KEYS = dict(vocab_size="vocab_size", n_layer="num_hidden_layers", n_head="num_attention_heads",
               n_kv_head="num_key_value_heads", n_embd="hidden_size", head_dim="head_dim",
               intermediate_size="intermediate_size", rope_theta="rope_theta",
               norm_eps="rms_norm_eps", tie_embeddings="tie_word_embeddings",
               block_size="block_size", block_sizes="block_sizes", mask_token_id="mask_token_id",
               eos_token_id="eos_token_id", max_seq_len="max_position_embeddings")
# the shapes of the SDAR checkpoints (measure/sol.py), and a tiny one for the tests
SDAR = dict(vocab_size=151936, rope_theta=1e6, mask_token_id=151669, eos_token_id=151643,
            max_seq_len=32768, head_dim=128)
PRESETS = {
    "sdar-1.7b": dict(SDAR, n_layer=28, n_embd=2048, n_head=16, n_kv_head=8,
                      intermediate_size=6144, tie_embeddings=True),
    "sdar-4b": dict(SDAR, n_layer=36, n_embd=2560, n_head=32, n_kv_head=8,
                    intermediate_size=9728, tie_embeddings=True),
    "sdar-8b": dict(SDAR, n_layer=36, n_embd=4096, n_head=32, n_kv_head=8,
                    intermediate_size=12288, tie_embeddings=False),
    # Qwen3-30B-A3B's trunk: every layer sparse, 8 of 128 experts a row
    "sdar-30b-a3b": dict(SDAR, n_layer=48, n_embd=2048, n_head=32, n_kv_head=4,
                         intermediate_size=6144, tie_embeddings=False, n_experts=128, top_k=8,
                         moe_intermediate_size=768, norm_topk_prob=True),
    "tiny": dict(vocab_size=97, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, head_dim=16,
                 intermediate_size=128, mask_token_id=3, eos_token_id=2, max_seq_len=1024),
    "tiny-moe": dict(vocab_size=97, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, head_dim=16,
                     intermediate_size=128, mask_token_id=3, eos_token_id=2, max_seq_len=1024,
                     n_experts=8, top_k=2, moe_intermediate_size=64, norm_topk_prob=True),
    # SDAR's vocabulary on a tiny trunk: the head is most of a forward (measure/sol.py)
    "qwen-vocab-2l": dict(SDAR, n_layer=2, n_embd=256, n_head=4, n_kv_head=2, head_dim=64,
                          intermediate_size=768, tie_embeddings=True),
}


def check_config(config):
    """Refuse a ModelConfig whose network cannot be built or run, in one line that uses
    config.json's names; -> the config."""
    for name in ("vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "head_dim",
                 "intermediate_size", "block_size", "max_seq_len"):
        if getattr(config, name) < 1:
            raise ValueError(f"{HF_KEYS[name]} must be >= 1, got {getattr(config, name)}")
    if not (config.rope_theta > 0 and config.norm_eps > 0):
        raise ValueError(f"rope_theta and rms_norm_eps must be > 0, got {config.rope_theta}, "
                         f"{config.norm_eps}")
    if config.n_head % config.n_kv_head:
        raise ValueError(f"num_attention_heads ({config.n_head}) is not a multiple of "
                         f"num_key_value_heads ({config.n_kv_head})")
    if config.head_dim % 2:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {config.head_dim}")
    if not 0 <= config.mask_token_id < config.vocab_size:  # (an odd EOS id only never stops)
        raise ValueError(f"mask_token_id {config.mask_token_id} is outside the vocabulary "
                         f"(vocab_size {config.vocab_size})")
    if not all(0 <= i < config.vocab_size for i in config.stop_ids):
        raise ValueError(f"eos_token_id {list(config.stop_ids)} holds an id outside the "
                         f"vocabulary (vocab_size {config.vocab_size})")
    if config.n_experts:
        check_moe(config)
    if any(b < 1 for b in config.block_sizes) or \
            (config.block_sizes and config.block_size not in config.block_sizes):
        raise ValueError(f"block_sizes {list(config.block_sizes)} must be >= 1 and include "
                         f"block_size {config.block_size}")
    return config


def check_moe(config):
    """check_config's part for a mixture of experts."""
    for name in ("top_k", "moe_intermediate_size", "decoder_sparse_step"):
        if getattr(config, name) < 1:
            raise ValueError(f"{HF_MOE_KEYS[name]} must be >= 1, got {getattr(config, name)}")
    if config.top_k > config.n_experts:
        raise ValueError(f"num_experts_per_tok {config.top_k} is above num_experts "
                         f"{config.n_experts}")


# what config.json may leave out (rope_theta: checked apart, it may sit in rope_parameters)
OPTIONAL = {"head_dim", "tie_embeddings", "block_sizes", "eos_token_id", "max_seq_len", "rope_theta"}
FIELD_TYPES = dict(rope_theta=float, norm_eps=float, tie_embeddings=bool, block_sizes=list,
                   norm_topk_prob=bool, mlp_only_layers=list)  # else int
# a mixture of experts' keys (model_type sdar_moe / qwen3_moe); the sizes are required, the rest
# default as in transformers' Qwen3MoeConfig
HF_MOE_KEYS = dict(n_experts="num_experts", top_k="num_experts_per_tok",
                   moe_intermediate_size="moe_intermediate_size", norm_topk_prob="norm_topk_prob",
                   decoder_sparse_step="decoder_sparse_step", mlp_only_layers="mlp_only_layers")
MOE_DEFAULTS = dict(top_k=8, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[])
MOE_TYPES = ("sdar_moe", "qwen3_moe")
JSON_TYPES = {int: "an integer", float: "a number", bool: "true or false", list: "a list of integers"}


def _is(value, kind):
    """config.json's types: bools are not numbers, floats are not integers."""
    if kind is list:
        return type(value) is list and all(type(v) is int for v in value)
    return type(value) in ((int, float) if kind is float else (kind,))


def _fail(source, msg):
    """Refuse a config file: one ValueError naming it."""
    raise ValueError(f"{source}: {msg}")


def _stop_ids(hf, source, generation):
    """The eos_token_id ids of config.json, then generation_config.json's new ones (each may
    give one id or a list; Qwen3 chat configs list several, the first is the EOS)."""
    stops = []
    for where, cfg in ((source, hf), ("generation_config.json", generation or {})):
        eos = cfg.get("eos_token_id")
        eos = [] if eos is None else eos if type(eos) is list else [eos]
        if not all(type(i) is int for i in eos):
            _fail(where, f"eos_token_id must be an id or a list of ids, got {cfg['eos_token_id']!r}")
        stops += [i for i in eos if i not in stops]
    return stops


def _rope_theta(hf, theta, source):
    """RoPE's base: config.json's rope_theta (`theta`, None if absent) or rope_parameters'.
    Only plain RoPE: a scaled or otherwise typed one would silently change the numerics."""
    rope, scaling = hf.get("rope_parameters") or {}, hf.get("rope_scaling") or {}
    if not isinstance(rope, dict) or not isinstance(scaling, dict):
        _fail(source, "rope_parameters / rope_scaling must be objects")
    for kind in (rope.get("rope_type"), scaling.get("rope_type", scaling.get("type"))):
        if kind not in (None, "default"):
            _fail(source, f"RoPE type {kind!r} is not supported (only plain RoPE)")
    theta = rope.get("rope_theta") if theta is None else theta
    if theta is None:
        _fail(source, "rope_theta is missing (at the top level or in rope_parameters)")
    if not _is(theta, float):
        _fail(source, f"rope_theta must be a number, got {theta!r}")
    return float(theta)


def _moe_fields(hf, source):
    """ModelConfig's mixture-of-experts fields from config.json (num_experts is transformers
    5's num_local_experts)."""
    hf, kw = dict(hf, num_experts=hf.get("num_experts", hf.get("num_local_experts"))), {}
    for ours, theirs in HF_MOE_KEYS.items():
        kind, value = FIELD_TYPES.get(ours, int), hf.get(theirs)
        if value is None and ours not in MOE_DEFAULTS:
            _fail(source, f"{theirs} is missing (it shapes the model, so it has no default)")
        value = MOE_DEFAULTS[ours] if value is None else value
        if not _is(value, kind):
            _fail(source, f"{theirs} must be {JSON_TYPES[kind]}, got {value!r}")
        kw[ours] = tuple(value) if kind is list else value
    return kw


def config_from_hf(hf, source="config.json", generation=None, cls=ModelConfig):
    """A ModelConfig from an HF config.json dict (SDAR, or Qwen3 with a mask token added). Every
    key that shapes the network is required, with its type; only head_dim (hidden_size / heads,
    as in HF), tie_word_embeddings (False, as in HF Qwen3), eos_token_id (Qwen's) and
    max_position_embeddings may be left out. `generation`: generation_config.json's dict, whose
    eos_token_id ids join config.json's as stop ids. Errors name the key and `source`."""
    if not isinstance(hf, dict):
        _fail(source, f"a JSON {type(hf).__name__}, not an object")
    if hf.get("model_type") not in ("sdar", "qwen3", *MOE_TYPES):
        _fail(source, f"model_type {hf.get('model_type')!r} is not SDAR/Qwen3-like")
    if hf.get("mask_token_id") is None:
        _fail(source, "no mask_token_id: not a block-diffusion checkpoint")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("use_sliding_window", False)):
        if hf.get(key, want) != want:
            _fail(source, f"{key} {hf[key]!r} is not supported (only {want!r})")
    stops = _stop_ids(hf, source, generation)
    hf, kw = dict(hf, eos_token_id=stops[0] if stops else None), {}
    for ours, theirs in HF_KEYS.items():
        kind, value = FIELD_TYPES.get(ours, int), hf.get(theirs)
        if value is None:
            if ours not in OPTIONAL:
                _fail(source, f"{theirs} is missing (it shapes the model, so it has no default)")
        elif not _is(value, kind):
            _fail(source, f"{theirs} must be {JSON_TYPES[kind]}, got {value!r}")
        else:
            kw[ours] = value
    kw["rope_theta"] = _rope_theta(hf, kw.get("rope_theta"), source)
    if hf["model_type"] in MOE_TYPES:
        kw.update(_moe_fields(hf, source))
    if "head_dim" not in kw:                                 # HF's default
        if kw["n_head"] < 1 or kw["n_embd"] % kw["n_head"]:
            _fail(source, f"no head_dim, and hidden_size {kw['n_embd']} is not a multiple of "
                          f"num_attention_heads {kw['n_head']}")
        kw["head_dim"] = kw["n_embd"] // kw["n_head"]
    kw.update(block_sizes=tuple(kw.get("block_sizes", ())),
              tie_embeddings=kw.get("tie_embeddings", False),     # HF Qwen3's default
              eos_token_id=kw.get("eos_token_id", 151643),        # Qwen's <|endoftext|>
              stop_ids=tuple(stops) if len(stops) > 1 else ())
    try:
        return check_config(cls(**kw))
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def config_to_hf(config):
    """The config.json dict of an SDAR checkpoint with this config (stop ids as eos_token_id)."""
    hf = {theirs: getattr(config, ours) for ours, theirs in HF_KEYS.items()}
    hf["eos_token_id"] = list(config.stop_ids) or config.eos_token_id
    if config.n_experts:
        hf.update({theirs: getattr(config, ours) for ours, theirs in HF_MOE_KEYS.items()},
                  mlp_only_layers=list(config.mlp_only_layers))
    kind = "Moe" if config.n_experts else ""
    return dict(hf, model_type="sdar_moe" if kind else "sdar", architectures=[f"SDAR{kind}ForCausalLM"],
                hidden_act="silu", attention_bias=False, block_sizes=list(config.block_sizes))


# ---- weights ----
HF_NAMES = {  # HF name -> ours; {i} is the layer index
    "model.embed_tokens.weight": "embed.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
    "model.layers.{i}.input_layernorm.weight": "layers.{i}.attn_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "layers.{i}.mlp_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "layers.{i}.attn.wq.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "layers.{i}.attn.wk.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "layers.{i}.attn.wv.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "layers.{i}.attn.wo.weight",
    "model.layers.{i}.self_attn.q_norm.weight": "layers.{i}.attn.q_norm.weight",
    "model.layers.{i}.self_attn.k_norm.weight": "layers.{i}.attn.k_norm.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "layers.{i}.mlp.gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "layers.{i}.mlp.up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "layers.{i}.mlp.down.weight",
    "model.layers.{i}.mlp.gate.weight": "layers.{i}.mlp.router.weight",   # a sparse layer's
}
# a sparse layer's expert e: one tensor each, a slice e of our stacked layers.{i}.mlp.{kind}
EXPERT = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
TO_HF = {ours: theirs for theirs, ours in HF_NAMES.items()}


def rename(name, to_local=True):
    """HF weight name -> ours (or back), through HF_NAMES with the layer index as {i}. Back, an
    expert's slice has our name layers.{i}.mlp.{kind}.{e} (expected_slices)."""
    if not to_local and (m := re.fullmatch(r"layers\.(\d+)\.mlp\.(gate|up|down)\.(\d+)", name)):
        return f"model.layers.{m[1]}.mlp.experts.{m[3]}.{m[2]}_proj.weight"
    table, prefix = (HF_NAMES, "model.layers.") if to_local else (TO_HF, "layers.")
    m = re.match(re.escape(prefix) + r"(\d+)\.(.*)", name)
    key = f"{prefix}{{i}}.{m.group(2)}" if m else name
    if key not in table:
        raise ValueError(f"unexpected weight in checkpoint: {name}")
    return table[key].replace("{i}", m.group(1) if m else "")


def read_config(path):
    """The ModelConfig of checkpoint directory `path`: config.json, with the stop ids of
    generation_config.json (chat checkpoints) if there is one."""
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in checkpoint directory {path}")
    generation = path / "generation_config.json"
    return config_from_hf(read_json(path / "config.json"), source=path / "config.json",
                          generation=read_json(generation) if generation.is_file() else None)


def find_shards(path):
    """The weight files of directory `path`: those its model.safetensors.index.json lists, else
    model.safetensors alone."""
    if (path / "model.safetensors.index.json").is_file():
        return indexed_shards(path / "model.safetensors.index.json")
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"no model.safetensors(.index.json) in {path}")
    return ["model.safetensors"]


def indexed_shards(index):
    """The shard files a model.safetensors.index.json lists (each checked to exist)."""
    path, weight_map = index.parent, read_json(index).get("weight_map")
    if not (isinstance(weight_map, dict) and weight_map
            and all(isinstance(s, str) for s in weight_map.values())):
        raise ValueError(f"{index}: no weight_map (weight name -> shard file)")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if not (path / shard).is_file():
            raise FileNotFoundError(f"shard {shard} listed in {index} not found")
    return shards


def load_shard(model, file, expected, device, dtype, take=None):
    """Assign the weights in safetensors `file` to `model` (on `device`, cast to `dtype` if
    given), each checked against `expected` (our name -> shape), each as take(our name, tensor)
    gives it (a rank's part: parallel.take); -> our names loaded."""
    from safetensors import SafetensorError, safe_open
    config, loaded = model.config, set()
    try:
        with safe_open(file, framework="pt", device=str(device or "cpu")) as f:
            for hf_name in f.keys():
                if EXPERT.fullmatch(hf_name):
                    loaded.add(load_expert(model, f, hf_name, expected, device, dtype))
                    continue   # (another rank's expert: None)
                name = rename(hf_name)
                if name not in expected:
                    raise ValueError(f"unexpected weight in checkpoint: {hf_name} (the "
                                     f"config has {config.n_layer} layers)")
                if name == "lm_head.weight" and config.tie_embeddings:
                    continue  # some tied checkpoints store the head too: it is the embedding
                t = take(name, f.get_tensor(hf_name)) if take else f.get_tensor(hf_name)
                if t.shape != expected[name]:
                    raise ValueError(f"shape mismatch for {hf_name}: checkpoint "
                                     f"{tuple(t.shape)}, model {tuple(expected[name])}")
                model.load_state_dict({name: t.to(dtype or t.dtype)}, strict=False, assign=True)
                loaded.add(name)
    except SafetensorError as e:  # truncated or not safetensors at all
        raise ValueError(f"{file} is not a readable safetensors file: {e}") from None
    return loaded


def load_expert(model, f, hf_name, expected, device, dtype):
    """Copy one expert's tensor (safetensors file `f`) into its slice of our stacked parameter,
    which is put on `device` when its first slice arrives. A rank holds experts [first, first +
    its count) (parallel.py): another's is not read. -> the slice's name (name.e), or None"""
    i, e, kind = EXPERT.fullmatch(hf_name).groups()
    name, e = f"layers.{i}.mlp.{kind}", int(e)
    shape = expected.get(name, ())
    if len(shape) != 3 or e >= model.config.n_experts:
        raise ValueError(f"unexpected weight in checkpoint: {hf_name} (the config has "
                         f"{model.config.n_experts} experts, in layers that are sparse)")
    mlp = model.get_submodule(f"layers.{i}.mlp")
    first = getattr(mlp, "first", 0)
    if not first <= e < first + shape[0]:
        return None
    t = f.get_tensor(hf_name)
    if t.shape != shape[1:]:
        raise ValueError(f"shape mismatch for {hf_name}: checkpoint {tuple(t.shape)}, model "
                         f"{tuple(shape[1:])}")
    if getattr(mlp, kind).is_meta:
        empty = torch.empty(shape, dtype=dtype or t.dtype, device=device or "cpu")
        setattr(mlp, kind, torch.nn.Parameter(empty))
    with torch.no_grad():
        getattr(mlp, kind)[e - first] = t
    return f"{name}.{e}"


def expected_slices(model, expected):
    """Every weight a checkpoint must hold, by our name; a stacked expert parameter (3-D) by
    its slices, name.e (a rank's: from its first expert on)."""
    names = set()
    for name, shape in expected.items():
        first = getattr(model.get_submodule(name.rsplit(".", 1)[0]), "first", 0) if len(shape) == 3 else 0
        names |= {f"{name}.{e}" for e in range(first, first + shape[0])} if len(shape) == 3 else {name}
    return names


def from_pretrained(path, device=None, dtype=None, cls=Transformer, split=None):
    """Load an HF-format SDAR/Qwen3 directory, one shard at a time straight onto `device` (the
    model is built on the meta device, so weights never exist twice in memory); split(meta model)
    -> take, or None (parallel.shard): each tensor read as take(name, tensor). -> in eval mode"""
    path = Path(path)
    config = read_config(path)
    shards = find_shards(path)
    with torch.device("meta"):
        model = cls(config)
    take = split(model) if split else None
    expected = {k: v.shape for k, v in model.state_dict().items()}
    loaded = set()
    for shard in shards:
        loaded |= load_shard(model, path / shard, expected, device, dtype, take)
    missing = expected_slices(model, expected) - loaded - ({"lm_head.weight"} if config.tie_embeddings
                                                    else set())
    if missing:
        names = ", ".join(sorted(rename(n, to_local=False) for n in missing))
        raise ValueError(f"checkpoint {path} lacks weight(s): {names}")
    if config.tie_embeddings:
        model.lm_head.weight = model.embed.weight
    return model.eval()


def save_pretrained(model, path, dtype=torch.bfloat16):
    """Write config.json and model.safetensors, each replaced whole (util.atomic_write)."""
    from safetensors.torch import save_file
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {}
    for name, t in model.state_dict().items():   # an expert's stacked parameter: a tensor each
        if not (name == "lm_head.weight" and model.config.tie_embeddings):
            slices = {f"{name}.{e}": s for e, s in enumerate(t)} if t.dim() == 3 else {name: t}
            state |= {rename(n, to_local=False): s.detach().to(dtype).contiguous().cpu()
                      for n, s in slices.items()}
    with atomic_write(path / "model.safetensors") as tmp:
        save_file(state, tmp, metadata={"format": "pt"})
    with atomic_write(path / "config.json") as tmp:
        tmp.write_text(json.dumps(config_to_hf(model.config), indent=2) + "\n")
