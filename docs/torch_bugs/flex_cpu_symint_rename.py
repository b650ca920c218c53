"""Inductor's CPU flex template renames its own size arguments (`ks2` -> `cur_kvSplitSize`, ...)
by a plain text replace, so a symbol of ours whose name starts the same way is mangled: a
Python int closed over by a mask_mod becomes, under dynamic=True, the symbol s25 (named from a
hash of its source, L['mask'].__closure__[0].cell_contents), kernel argument `ks25`, and the
C++ reads `cur_kvSplitSize5`, which nothing declares. Seen on torch 2.13.0+cpu; upstream,
a symbolic size captured by a mask_mod is pytorch issue 136914. Avoided in mask.py (the block
size a 0-d tensor) and fast.compile_dynamic (mark_static on a mask's tables).
    python docs/torch_bugs/flex_cpu_symint_rename.py   # "reproduced", exit 0; fixed: exit 1"""
import re

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def causal_blocks(size):                 # `size` a Python int: the construct mask.py avoids
    return lambda b, h, q_idx, kv_idx: q_idx // size >= kv_idx // size


@torch.compile(dynamic=True)
def attend(q, k, v, mask):
    return flex_attention(q, k, v, block_mask=create_block_mask(mask, None, None, q.shape[2],
                                                                k.shape[2], device="cpu"))


q = k = v = torch.randn(1, 2, 24, 16)
try:
    attend(q, k, v, causal_blocks(8))
except Exception as e:                   # inductor's C++ build error, whatever its class
    mangled = re.search(r"cur_\w+SplitSize\d+", str(e))
    if not mangled:
        raise
    print(f"reproduced on torch {torch.__version__}: the C++ reads {mangled[0]}, undeclared")
    raise SystemExit(0)
print(f"not reproduced: torch {torch.__version__} compiles it; mask.py's workaround may go")
raise SystemExit(1)
