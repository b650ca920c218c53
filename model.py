"""A block-diffusion transformer (SDAR / Qwen3 architecture) in one file; decoding is in decode.py.

- The network is a Qwen3 decoder: GQA attention with per-head RMSNorm on q and k before
  rotate-half RoPE, a SwiGLU MLP, RMSNorm everywhere, tied or untied head. SDAR turns it into
  a block-diffusion LM with nothing but the attention mask (block-causal, mask.py) and a mask
  token; the logits at position i predict token i (no shift).
- Attention runs on FlexAttention (a BlockMask) or SDPA (a dense bool mask), both built from
  the same mask_mod. Position ids are an explicit input, since SimSD copies them.
- A static KV cache (as in gpt-fast): a forward writes its keys at [start, start + T) and
  attends to [0, start + T). Committed blocks live below `start`; scratch rows (drafts,
  verification copies) land above it and are overwritten by the next forward, so a rejected
  draft needs no rollback and can never be attended to again.
- `from_pretrained` reads an HF-format SDAR/Qwen3 checkpoint directory shard by shard; a
  config.json without a key that shapes the network, or with the wrong type, is refused
  (ModelConfig.from_hf), and so are unreadable files, each error naming its file.

References: Qwen3 (HF transformers' modeling_qwen3), SDAR (JetLM), BD3-LM, nanoGPT, gpt-fast.
"""
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

import mask as masks
from util import atomic_write, read_json


@dataclass
class ModelConfig:
    vocab_size: int = 2048
    n_layer: int = 2
    n_head: int = 4
    n_kv_head: int = 2
    n_embd: int = 64
    head_dim: int = 16
    intermediate_size: int = 192
    rope_theta: float = 1e6
    norm_eps: float = 1e-6
    tie_embeddings: bool = True
    block_size: int = 4          # the block size the checkpoint decodes with by default
    block_sizes: tuple = ()      # all it was trained for; () = block_size only (SDAR checkpoints)
    mask_token_id: int = 3
    eos_token_id: int = 2
    stop_ids: tuple = ()         # every id that ends decoding (a chat model's end of turn too)
    max_seq_len: int = 4096      # longest prompt + generation accepted

    def __post_init__(self):
        """Refuse a network that cannot be built or run; messages use config.json's names."""
        for name in ("vocab_size", "n_layer", "n_head", "n_kv_head", "n_embd", "head_dim",
                     "intermediate_size", "block_size", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{HF_KEYS[name]} must be >= 1, got {getattr(self, name)}")
        if not (self.rope_theta > 0 and self.norm_eps > 0):
            raise ValueError(f"rope_theta and rms_norm_eps must be > 0, got {self.rope_theta}, "
                             f"{self.norm_eps}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"num_attention_heads ({self.n_head}) is not a multiple of "
                             f"num_key_value_heads ({self.n_kv_head})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {self.head_dim}")
        if not 0 <= self.mask_token_id < self.vocab_size:  # (an odd EOS id only never stops)
            raise ValueError(f"mask_token_id {self.mask_token_id} is outside the vocabulary "
                             f"(vocab_size {self.vocab_size})")
        if not all(0 <= i < self.vocab_size for i in self.stop_ids):
            raise ValueError(f"eos_token_id {list(self.stop_ids)} holds an id outside the "
                             f"vocabulary (vocab_size {self.vocab_size})")
        if any(b < 1 for b in self.block_sizes) or (self.block_sizes and self.block_size not in self.block_sizes):
            raise ValueError(f"block_sizes {list(self.block_sizes)} must be >= 1 and include "
                             f"block_size {self.block_size}")

    @classmethod
    def from_hf(cls, hf, source="config.json", generation=None):
        """From an HF config.json dict (SDAR, or Qwen3 with a mask token added). Every key that
        shapes the network is required, with its type; only head_dim (hidden_size / heads, as
        in HF), tie_word_embeddings (False, as in HF Qwen3), eos_token_id (Qwen's) and
        max_position_embeddings may be left out. `generation`: generation_config.json's dict,
        whose eos_token_id ids (one or a list) join config.json's as stop ids. Errors name the
        key and `source`."""
        def fail(msg):
            raise ValueError(f"{source}: {msg}")

        if not isinstance(hf, dict):
            fail(f"a JSON {type(hf).__name__}, not an object")
        if hf.get("model_type") not in ("sdar", "qwen3"):
            fail(f"model_type {hf.get('model_type')!r} is not SDAR/Qwen3-like")
        if hf.get("mask_token_id") is None:
            fail("no mask_token_id: not a block-diffusion checkpoint")
        for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("use_sliding_window", False)):
            if hf.get(key, want) != want:
                fail(f"{key} {hf[key]!r} is not supported (only {want!r})")
        stops = []   # config.json's eos_token_id (Qwen3 chat configs may list several; the first
        for where, cfg in ((source, hf), ("generation_config.json", generation or {})):  # is the EOS)
            eos = cfg.get("eos_token_id")
            eos = [] if eos is None else eos if type(eos) is list else [eos]
            if not all(type(i) is int for i in eos):
                raise ValueError(f"{where}: eos_token_id must be an id or a list of ids, got {cfg['eos_token_id']!r}")
            stops += [i for i in eos if i not in stops]
        hf = dict(hf, eos_token_id=stops[0] if stops else None)
        kw = {}
        for ours, theirs in HF_KEYS.items():
            kind, value = FIELD_TYPES.get(ours, int), hf.get(theirs)
            if value is None:
                if ours not in OPTIONAL:
                    fail(f"{theirs} is missing (it shapes the model, so it has no default)")
            elif not _is(value, kind):
                fail(f"{theirs} must be {JSON_TYPES[kind]}, got {value!r}")
            else:
                kw[ours] = value
        rope = hf.get("rope_parameters") or {}
        scaling = hf.get("rope_scaling") or {}
        if not isinstance(rope, dict) or not isinstance(scaling, dict):
            fail("rope_parameters / rope_scaling must be objects")
        for kind in (rope.get("rope_type"), scaling.get("rope_type", scaling.get("type"))):
            if kind not in (None, "default"):
                fail(f"RoPE type {kind!r} is not supported (only plain RoPE)")
        theta = kw.get("rope_theta", rope.get("rope_theta"))
        if theta is None:
            fail("rope_theta is missing (at the top level or in rope_parameters)")
        if not _is(theta, float):
            fail(f"rope_theta must be a number, got {theta!r}")
        if "head_dim" not in kw:                                 # HF's default
            if kw["n_head"] < 1 or kw["n_embd"] % kw["n_head"]:
                fail(f"no head_dim, and hidden_size {kw['n_embd']} is not a multiple of "
                     f"num_attention_heads {kw['n_head']}")
            kw["head_dim"] = kw["n_embd"] // kw["n_head"]
        kw.update(rope_theta=float(theta), block_sizes=tuple(kw.get("block_sizes", ())),
                  tie_embeddings=kw.get("tie_embeddings", False),     # HF Qwen3's default
                  eos_token_id=kw.get("eos_token_id", 151643),        # Qwen's <|endoftext|>
                  stop_ids=tuple(stops) if len(stops) > 1 else ())
        try:
            return cls(**kw)
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def to_hf(self):
        hf = {theirs: getattr(self, ours) for ours, theirs in HF_KEYS.items()}
        hf["eos_token_id"] = list(self.stop_ids) or self.eos_token_id
        return dict(hf, model_type="sdar", architectures=["SDARForCausalLM"], hidden_act="silu",
                    attention_bias=False, block_sizes=list(self.block_sizes))


HF_KEYS = dict(vocab_size="vocab_size", n_layer="num_hidden_layers", n_head="num_attention_heads",
               n_kv_head="num_key_value_heads", n_embd="hidden_size", head_dim="head_dim",
               intermediate_size="intermediate_size", rope_theta="rope_theta",
               norm_eps="rms_norm_eps", tie_embeddings="tie_word_embeddings",
               block_size="block_size", block_sizes="block_sizes", mask_token_id="mask_token_id",
               eos_token_id="eos_token_id", max_seq_len="max_position_embeddings")
# what config.json may leave out (rope_theta: checked apart, it may sit in rope_parameters)
OPTIONAL = {"head_dim", "tie_embeddings", "block_sizes", "eos_token_id", "max_seq_len", "rope_theta"}
FIELD_TYPES = dict(rope_theta=float, norm_eps=float, tie_embeddings=bool, block_sizes=list)  # else int
JSON_TYPES = {int: "an integer", float: "a number", bool: "true or false", list: "a list of integers"}


def _is(value, kind):
    """config.json's types: bools are not numbers, floats are not integers."""
    if kind is list:
        return type(value) is list and all(type(v) is int for v in value)
    return type(value) in ((int, float) if kind is float else (kind,))


SDAR = dict(vocab_size=151936, rope_theta=1e6, mask_token_id=151669, eos_token_id=151643,
            max_seq_len=32768, head_dim=128)
PRESETS = {
    "sdar-1.7b": dict(SDAR, n_layer=28, n_embd=2048, n_head=16, n_kv_head=8,
                      intermediate_size=6144, tie_embeddings=True),
    "sdar-4b": dict(SDAR, n_layer=36, n_embd=2560, n_head=32, n_kv_head=8,
                    intermediate_size=9728, tie_embeddings=True),
    "sdar-8b": dict(SDAR, n_layer=36, n_embd=4096, n_head=32, n_kv_head=8,
                    intermediate_size=12288, tie_embeddings=False),
    "tiny": dict(vocab_size=97, n_layer=2, n_embd=64, n_head=4, n_kv_head=2, head_dim=16,
                 intermediate_size=128, mask_token_id=3, eos_token_id=2, max_seq_len=1024),
    # SDAR's vocabulary on a tiny trunk: the head is most of a forward (sol.py)
    "qwen-vocab-2l": dict(SDAR, n_layer=2, n_embd=256, n_head=4, n_kv_head=2, head_dim=64,
                          intermediate_size=768, tie_embeddings=True),
}


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):  # normalise in fp32, as Qwen3 does
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)


def rope(x, cos, sin):
    """Rotate-half RoPE. x: (b, heads, T, hd); cos, sin: (b, 1, T, hd/2)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class KVCache(nn.Module):
    def __init__(self, batch, n_kv_head, max_len, head_dim, dtype, device):
        super().__init__()
        shape = (batch, n_kv_head, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, start, k, v):
        """Write k, v (b, n_kv, T, hd) at rows [start, start + T); -> the keys and values to
        attend to: rows [0, start + T), or the whole cache when start is a device tensor
        (static shapes: the mask hides the rows past start + T)."""
        if torch.is_tensor(start):
            rows = start + torch.arange(k.shape[2], device=k.device)
            self.k.index_copy_(2, rows, k)
            self.v.index_copy_(2, rows, v)
            return self.k, self.v
        end = start + k.shape[2]
        self.k[:, :, start:end], self.v[:, :, start:end] = k, v
        return self.k[:, :, :end], self.v[:, :, :end]


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = c.n_head, c.n_kv_head, c.head_dim
        self.wq = nn.Linear(c.n_embd, c.n_head * c.head_dim, bias=False)
        self.wk = nn.Linear(c.n_embd, c.n_kv_head * c.head_dim, bias=False)
        self.wv = nn.Linear(c.n_embd, c.n_kv_head * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_head * c.head_dim, c.n_embd, bias=False)
        self.q_norm, self.k_norm = RMSNorm(c.head_dim, c.norm_eps), RMSNorm(c.head_dim, c.norm_eps)
        self.cache = None

    def forward(self, x, cos, sin, mask, start):
        b, T, _ = x.shape
        q = self.q_norm(self.wq(x).view(b, T, self.n_head, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.wk(x).view(b, T, self.n_kv_head, self.head_dim)).transpose(1, 2)
        v = self.wv(x).view(b, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)  # (b, nh, T, hd), (b, nkv, T, hd)
        if start is not None:
            if self.cache is None:
                raise ValueError("a cached forward (start given) needs model.setup_cache first")
            k, v = self.cache.update(start, k, v)     # (b, nkv, start + T, hd)
        if isinstance(mask, BlockMask):
            y = flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(b, T, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate = nn.Linear(c.n_embd, c.intermediate_size, bias=False)
        self.up = nn.Linear(c.n_embd, c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, c.n_embd, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(c.n_embd, c.norm_eps), Attention(c)
        self.mlp_norm, self.mlp = RMSNorm(c.n_embd, c.norm_eps), MLP(c)

    def forward(self, x, cos, sin, mask, start):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, start)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.n_embd)
        self.layers = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.n_embd, c.norm_eps)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.attn_impl = None  # "flex" or "sdpa"; None: flex compiled on CUDA, else SDPA (faster)
        self.static_trunk = None  # compile_decoding: the trunk compiled for static shapes
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def setup_cache(self, max_len, batch=1):
        """Allocate the static KV cache: max_len rows = committed blocks + scratch. A cache
        allocated before is kept if it has room, so one cache serves every prompt of a run;
        lengths round up to a power of two, so that a compiled forward sees few cache shapes."""
        p, old = self.embed.weight, self.layers[0].attn.cache
        max_len = max(256, 1 << (max_len - 1).bit_length())
        if old is not None and old.k.shape[0] == batch and old.k.shape[2] >= max_len \
                and old.k.dtype == p.dtype and old.k.device == p.device:
            return
        for layer in self.layers:
            layer.attn.cache = KVCache(batch, self.config.n_kv_head, max_len,
                                       self.config.head_dim, p.dtype, p.device)

    def forward(self, idx, pos=None, start=None, mask=None, keep=None, rows=None):
        """idx: (b, T) token ids. pos: (b, T) or (T,) RoPE positions (default start + arange).
        start: None for a cache-free forward, else the cache row the queries are written to.
        mask: a mask_mod, BlockMask or dense bool mask over keys [0, start + T); default
        block-causal. keep: compute logits for the last `keep` rows only; rows: (M,) indices
        into those: for these only. -> (b, keep or M, vocab)"""
        if torch.is_tensor(start):
            raise TypeError("forward takes start as an int; static shapes go through decode.Session")
        T, off = idx.shape[1], start or 0
        if pos is None:
            pos = torch.arange(off, off + T, device=idx.device)
        x = self.trunk(idx, pos, start, masks.block_causal(self.config.block_size, off) if mask is None else mask)
        x = x if keep is None else x[:, T - keep:]
        return self.head(x if rows is None else x[:, rows])

    def trunk(self, idx, pos, start, mask):
        """Embedding, layers and final norm -> (b, T, n_embd). With `start` a device tensor the
        shapes are static (keys: the whole cache), as compile_decoding needs."""
        T = idx.shape[1]
        if callable(mask) and not isinstance(mask, BlockMask):
            flex = self.attn_impl == "flex" or (self.attn_impl is None and idx.is_cuda
                                               and torch.compiler.is_compiling())
            kv_len = self.layers[0].attn.cache.k.shape[2] if torch.is_tensor(start) else (start or 0) + T
            mask = (masks.block_mask if flex else masks.dense_mask)(mask, T, kv_len, idx.device)
        hd = self.config.head_dim
        inv_freq = self.config.rope_theta ** -(torch.arange(0, hd, 2, device=idx.device).float() / hd)
        angles = pos.view(-1, 1, T, 1).float() * inv_freq    # (b or 1, 1, T, hd/2)
        cos, sin = angles.cos(), angles.sin()
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, start)
        return self.norm(x)

    def head(self, x):
        """Logits (fp32). On a CPU with 4-15 rows, as (W @ x^T)^T: the same product, but MKL's
        x @ W^T is slow in that band at a large vocabulary (at 151,936 x 256, 10 rows take
        twice as long as 16; docs/results.md, `python docs/rows.py`)."""
        w, rows = self.lm_head.weight, x.shape[:-1].numel()
        if x.is_cuda or not 4 <= rows < 16:
            return F.linear(x, w).float()
        return (w @ x.reshape(rows, -1).T).T.contiguous().view(*x.shape[:-1], -1).float()

    def compile_decoding(self, **options):
        """Compile the decode forwards with static shapes: decode.Session pads the queries to
        a few bucket lengths and passes the cache row as a device tensor, and attention spans
        the whole cache, so each bucket compiles once; with mode="reduce-overhead" on CUDA
        each is replayed as a CUDA graph. The mask (a BlockMask on CUDA) is built inside.
        Changes nothing process-wide: the graphs-per-function limit is raised to 64 (room for
        a graph per bucket (5) and mask kind (3); dynamo's default is 8) only while this
        trunk runs, which is when dynamo compiles it."""
        cfg = torch._dynamo.config
        name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        # unbound (called with the model), so that a deep copy runs its own weights and cache
        trunk = torch.compile(type(self).trunk, dynamic=False, **options)
        self.static_trunk = cfg.patch(**{name: max(getattr(cfg, name), 64)})(trunk)

    # ---- checkpoints: the HF layout of real SDAR checkpoints ----
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
    }

    @staticmethod
    def rename(name, to_local=True):
        """HF weight name -> ours (or back), through HF_NAMES with the layer index as {i}."""
        table = Transformer.HF_NAMES if to_local else {v: k for k, v in Transformer.HF_NAMES.items()}
        prefix = "model.layers." if to_local else "layers."
        m = re.match(re.escape(prefix) + r"(\d+)\.(.*)", name)
        key = f"{prefix}{{i}}.{m.group(2)}" if m else name
        if key not in table:
            raise ValueError(f"unexpected weight in checkpoint: {name}")
        return table[key].replace("{i}", m.group(1) if m else "")

    @classmethod
    def from_pretrained(cls, path, device=None, dtype=None):
        """Load an HF-format SDAR/Qwen3 directory, one shard at a time straight onto `device`
        (the model is built on the meta device, so weights never exist twice in memory).
        Bad files raise a one-line ValueError (FileNotFoundError if missing) naming them."""
        from safetensors import SafetensorError, safe_open
        path = Path(path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no config.json in checkpoint directory {path}")
        generation = path / "generation_config.json"   # the stop ids of chat checkpoints
        config = ModelConfig.from_hf(read_json(path / "config.json"), source=path / "config.json",
                                     generation=read_json(generation) if generation.is_file() else None)
        index = path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = read_json(index).get("weight_map")
            if not (isinstance(weight_map, dict) and weight_map
                    and all(isinstance(s, str) for s in weight_map.values())):
                raise ValueError(f"{index}: no weight_map (weight name -> shard file)")
            shards = sorted(set(weight_map.values()))
            for shard in shards:
                if not (path / shard).is_file():
                    raise FileNotFoundError(f"shard {shard} listed in {index} not found")
        elif (path / "model.safetensors").is_file():
            shards = ["model.safetensors"]
        else:
            raise FileNotFoundError(f"no model.safetensors(.index.json) in {path}")
        with torch.device("meta"):
            model = cls(config)
        expected = {k: v.shape for k, v in model.state_dict().items()}
        loaded = set()
        for shard in shards:
            try:
                with safe_open(path / shard, framework="pt", device=str(device or "cpu")) as f:
                    for hf_name in f.keys():
                        name = cls.rename(hf_name)
                        if name not in expected:
                            raise ValueError(f"unexpected weight in checkpoint: {hf_name} (the "
                                             f"config has {config.n_layer} layers)")
                        if name == "lm_head.weight" and config.tie_embeddings:
                            continue  # some tied checkpoints store the head too: it is the embedding
                        t = f.get_tensor(hf_name)
                        if t.shape != expected[name]:
                            raise ValueError(f"shape mismatch for {hf_name}: checkpoint "
                                             f"{tuple(t.shape)}, model {tuple(expected[name])}")
                        model.load_state_dict({name: t.to(dtype or t.dtype)}, strict=False, assign=True)
                        loaded.add(name)
            except SafetensorError as e:  # truncated or not safetensors at all
                raise ValueError(f"{path / shard} is not a readable safetensors file: {e}") from None
        missing = set(expected) - loaded - ({"lm_head.weight"} if config.tie_embeddings else set())
        if missing:
            names = ", ".join(sorted(cls.rename(n, to_local=False) for n in missing))
            raise ValueError(f"checkpoint {path} lacks weight(s): {names}")
        if config.tie_embeddings:
            model.lm_head.weight = model.embed.weight
        return model.eval()

    def save_pretrained(self, path, dtype=torch.bfloat16):
        """Write config.json and model.safetensors, each replaced whole (util.atomic_write)."""
        from safetensors.torch import save_file
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {self.rename(name, to_local=False): t.detach().to(dtype).contiguous().cpu()
                 for name, t in self.state_dict().items()
                 if not (name == "lm_head.weight" and self.config.tie_embeddings)}
        with atomic_write(path / "model.safetensors") as tmp:
            save_file(state, tmp, metadata={"format": "pt"})
        with atomic_write(path / "config.json") as tmp:
            tmp.write_text(json.dumps(self.config.to_hf(), indent=2) + "\n")
