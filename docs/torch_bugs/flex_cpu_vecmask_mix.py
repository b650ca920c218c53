"""Inductor's vectorised C++ for create_block_mask, compiled with static shapes on the CPU,
puts VecMask<int> and VecMask<float> on the two sides of one `?:` when a mask_mod combines
a lookup in a bool table with `&` and `|`; the C++ does not build. Seen on torch 2.13.0+cpu
(no upstream issue found). Avoided in fast.padded: one lookup at a clamped index, the
table's extra columns standing for the cache (seen) and past the queries (not).
    python docs/torch_bugs/flex_cpu_vecmask_mix.py   # "reproduced", exit 0; fixed: exit 1"""
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

n, cache = 8, torch.tensor(8)
sees = torch.ones(n, n, dtype=torch.bool).tril()     # how the n queries see each other


def lookup_and_or(b, h, q_idx, kv_idx):              # the construct fast.padded avoids
    key = kv_idx - cache
    return (key < 0) | (sees[q_idx.clamp(0, n - 1), key.clamp(0, n - 1)] & (key < n))


@torch.compile(dynamic=False)
def attend(q, k, v):
    mask = create_block_mask(lookup_and_or, None, None, q.shape[2], k.shape[2], device="cpu")
    return flex_attention(q, k, v, block_mask=mask)


try:
    attend(torch.randn(1, 2, n, 16), *[torch.randn(1, 2, 256, 16)] * 2)
except Exception as e:                   # inductor's C++ build error, whatever its class
    if "VecMask" not in str(e):
        raise
    print(f"reproduced on torch {torch.__version__}: VecMask<int> and VecMask<float> in one ?:")
    raise SystemExit(0)
print(f"not reproduced: torch {torch.__version__} compiles it; fast.padded's workaround may go")
raise SystemExit(1)
