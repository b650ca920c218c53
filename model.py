"""A block-diffusion transformer (SDAR / Qwen3 architecture) in one file; decoding is in decode.py.

A Qwen3 decoder (GQA attention, RMSNorm on q and k before rotate-half RoPE, SwiGLU or Qwen3-MoE's
experts, tied or untied head), made a block-diffusion LM by SDAR with nothing but the attention
mask (mask.py) and a mask token; the logits at position i predict token i. Attention runs on
FlexAttention (a BlockMask) or SDPA (a dense mask), both from one mask_mod; positions are an
input, since SimSD copies them. The static KV cache (as in gpt-fast): a forward writes its
keys at [start, start + T) and attends to [0, start + T); scratch rows (drafts, copies) above
the committed blocks are overwritten by the next forward, so a rejected draft needs no rollback.
"""
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

import mask as masks


@dataclass
class ModelConfig:   # plain data: checkpoint.check_config refuses one that cannot run
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
    n_experts: int = 0           # a mixture of experts (SDAR-30B-A3B) if > 0 (Block: which layers)
    top_k: int = 8               # experts a row is routed to
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = False  # renormalise the top-k probabilities to sum to 1
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple = ()


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):  # normalise in fp32, as Qwen3 does (in fp32: one fused op, the same bits)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)


def rope(x, cos, sin):
    """Rotate-half RoPE. x: (b, heads, T, hd); cos, sin: (b, 1, T, hd), each angle twice. As
    x * cos + rotate_half(x) * sin (HF's form), which is (x1 cos - x2 sin, x2 cos + x1 sin) to
    the bit, in five ops."""
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat((-x2, x1), dim=-1) * sin).to(x.dtype)


class KVCache(nn.Module):
    """One layer's keys and values: views into the model's one cache tensor (setup_cache)."""
    def __init__(self, k, v):
        super().__init__()
        self.register_buffer("k", k, persistent=False)
        self.register_buffer("v", v, persistent=False)

    def update(self, start, k, v):
        """Write k, v (b, n_kv, T, hd) at rows [start, start + T); -> the keys and values to
        attend to: rows [0, start + T), or all when start is a device tensor (static shapes: a
        row, or each query's own: serve/batch.py)."""
        if torch.is_tensor(start):
            rows = start + torch.arange(k.shape[2], device=k.device) if start.dim() == 0 else start
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
        k, v = (k, v) if start is None else self.cache.update(start, k, v)   # (b, nkv, start+T, hd)
        y, group = [], self.n_head // self.n_kv_head   # a list of masks: packed requests (serve/),
        for rows, keys, m in mask if isinstance(mask, list) else [(None, None, mask)]:  # one each
            qkv = (q, k, v) if rows is None else (q[:, :, rows], k[:, :, keys], v[:, :, keys])
            if isinstance(m, BlockMask):
                opts = flex_kernel_options(qkv[0].shape[2], group) if q.is_cuda else None
                y.append(flex_attention(*qkv, block_mask=m, enable_gqa=True, kernel_options=opts))
            else:
                y.append(F.scaled_dot_product_attention(*qkv, attn_mask=m, enable_gqa=True))
        return self.wo((y[0] if len(y) == 1 else torch.cat(y, 2)).transpose(1, 2).reshape(b, T, -1))


def flex_kernel_options(rows, group):
    """Flex decoding (< 128 query rows), tiled next_pow2(rows x group), fails past 128 (2.13)."""
    return {"FORCE_USE_FLEX_ATTENTION": True} if rows < 128 and rows * group > 128 else None


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate = nn.Linear(c.n_embd, c.intermediate_size, bias=False)
        self.up = nn.Linear(c.n_embd, c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, c.n_embd, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class SparseMLP(nn.Module):
    """Qwen3-MoE's: a router picks top_k experts (SwiGLUs) a row; their outputs, weighted, sum."""
    def __init__(self, c):
        super().__init__()
        self.top_k, self.norm_topk_prob = c.top_k, c.norm_topk_prob
        E, D, inner = c.n_experts, c.n_embd, c.moe_intermediate_size
        self.router = nn.Linear(D, E, bias=False)
        self.gate, self.up = (nn.Parameter(0.02 * torch.randn(E, inner, D)) for _ in "gu")
        self.down = nn.Parameter(0.02 * torch.randn(E, D, inner))

    def forward(self, x):
        probs = F.softmax(self.router(x), dim=-1, dtype=torch.float32).flatten(0, 1)  # (N, E)
        weights, experts = probs.topk(self.top_k, dim=-1)                         # (N, k)
        weights = weights / weights.sum(-1, keepdim=True) if self.norm_topk_prob else weights
        experts, weights = experts.sort(-1).values, weights.gather(-1, experts.argsort(-1))
        form = self.by_row if torch.compiler.is_compiling() else self.by_expert  # static shapes:
        return form(x.flatten(0, 1), experts, weights.to(x.dtype)).view_as(x)   # few rows only

    def by_row(self, x, experts, weights):
        """gpt-fast's form, each row's k experts gathered (N k, inner, D): a product a row, whose
        bits ignore the other rows, as copies need (F.linear's change with the row count)."""
        e, x = experts.flatten(), x.repeat_interleave(experts.shape[1], 0)[:, None]  # (N k, 1, D)
        h = F.silu(x @ self.gate[e].mT) * (x @ self.up[e].mT)                     # (N k, 1, inner)
        y = (h @ self.down[e].mT).view(*experts.shape, -1) * weights[..., None]    # (N, k, D)
        return sum(y.unbind(1))   # by slot, so by ascending expert: HF's order, and by_expert's

    def by_expert(self, x, experts, w):   # by_row, an expert hit at a time (a host sync)
        out = torch.zeros_like(x)
        for rows, j in (torch.where(experts == e) for e in experts.unique().tolist()):
            out.index_add_(0, rows, self.by_row(x[rows], experts[rows, j, None], w[rows, j, None]))
        return out


class Block(nn.Module):
    def __init__(self, c, i):   # the i-th layer
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(c.n_embd, c.norm_eps), Attention(c)
        sparse = c.n_experts and (i + 1) % c.decoder_sparse_step == 0 and i not in c.mlp_only_layers
        self.mlp_norm, self.mlp = RMSNorm(c.n_embd, c.norm_eps), (SparseMLP if sparse else MLP)(c)

    def forward(self, x, cos, sin, mask, start):
        x = x + self.attn(self.attn_norm(x), cos, sin, mask, start)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.n_embd)
        self.layers = nn.ModuleList(Block(c, i) for i in range(c.n_layer))
        self.norm = RMSNorm(c.n_embd, c.norm_eps)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.attn_impl = None  # flex, sdpa (cli.attention); None: flex compiled on CUDA, else SDPA
        self.kv = None  # setup_cache: every layer's keys and values, one tensor
        self.apply(self._init_weights)

    def _init_weights(self, m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def setup_cache(self, max_len, batch=1):
        """Allocate the static KV cache: max_len rows = committed blocks + scratch. A cache
        allocated before is kept if it has room, so one cache serves every prompt of a run;
        lengths round up to a power of two, so that a compiled forward sees few cache shapes."""
        p, old, c = self.embed.weight, self.kv, self.config
        max_len = max(256, 1 << (max_len - 1).bit_length())
        if old is not None and self.layers[0].attn.cache is not None and old.shape[2] == batch \
                and old.shape[4] >= max_len and old.dtype == p.dtype and old.device == p.device:
            return
        self.kv = torch.zeros(c.n_layer, 2, batch, c.n_kv_head, max_len, c.head_dim,
                              dtype=p.dtype, device=p.device)   # (layer, k or v, b, nkv, row, hd)
        for layer, (k, v) in zip(self.layers, self.kv):   # detached views: writable under grad too
            layer.attn.cache = KVCache(k.detach(), v.detach())

    def forward(self, idx, pos=None, start=None, mask=None, keep=None, rows=None):
        """idx: (b, T) token ids; pos: (b, T) or (T,) RoPE positions (default start + arange);
        start: None (no cache), else the cache row the queries are written to; mask: a mask_mod,
        BlockMask or dense bool mask over keys [0, start + T) (default block-causal); keep: logits
        for the last `keep` rows, or for rows (M,) of those only. -> (b, keep or M, V)"""
        if torch.is_tensor(start):
            raise TypeError("forward takes start as an int (static shapes: decode.Session)")
        T, off = idx.shape[1], start or 0
        if pos is None:
            pos = torch.arange(off, off + T, device=idx.device)
        if mask is None:   # (the offset on the queries' device: a compiled kernel reads it)
            mask = masks.block_causal(self.config.block_size, torch.tensor(off, device=idx.device))
        x = self.trunk(idx, pos, start, mask)
        x = x if keep is None else x[:, T - keep:]
        return self.head(x if rows is None else x[:, rows])

    def trunk(self, idx, pos, start, mask):
        """Embedding, layers and final norm -> (b, T, n_embd). With `start` a device tensor the
        shapes are static (keys: the whole cache), as fast.compile_static needs."""
        T = idx.shape[1]
        if callable(mask) and not isinstance(mask, BlockMask):
            flex = self.attn_impl == "flex" or (self.attn_impl is None and idx.is_cuda
                                               and torch.compiler.is_compiling())
            kv_len = self.layers[0].attn.cache.k.shape[2] if torch.is_tensor(start) else \
                (start or 0) + T
            mask = (masks.block_mask if flex else masks.dense_mask)(mask, T, kv_len, idx.device)
        hd = self.config.head_dim
        inv_freq = self.config.rope_theta ** -(torch.arange(0, hd, 2, device=idx.device) / hd)
        angles = pos.view(-1, 1, T, 1).float() * inv_freq    # (b or 1, 1, T, hd/2)
        angles = torch.cat((angles, angles), dim=-1)         # (b or 1, 1, T, hd): each half's
        cos, sin = angles.cos(), angles.sin()
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask, start)
        return self.norm(x)

    def head(self, x):
        """Logits, in fp32."""
        return F.linear(x, self.lm_head.weight).float()
