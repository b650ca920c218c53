"""Where compiled decoding on CUDA parts from eager (docs/results.md, "The first GPU run"): on a
GPU, fp32, TF32 off, the tiny test model at B = 8.
  1. one Session forward after a prefilled prompt, compiled (dynamic shapes, and static shapes
     with CUDA graphs, its first call), against eager: the largest logit difference;
  2. the same static forward called again and again (CUDA-graph replays), each against eager;
  3. plain decoding of three prompts compiled (dynamic, static) against eager: the first token
     that differs, if any.
On 2026-12-04 (H200, torch 2.11.0+cu130) step 1 agreed to 2e-5 for flex and SDPA, dynamic and
static, while compiled decoding differed from its first token on (tests/test_cuda.py); steps 2
and 3 are what the next GPU run should read.

    python docs/cuda_compile.py
"""
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]
import fast  # noqa: E402
import mask as masks  # noqa: E402
from conftest import make_model  # noqa: E402
from decode import DecodeRule, Session, generate  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
B, MASK_ID = 8, 3


def forwards(model, n):
    """n forwards of one block after a prefilled prompt of two blocks -> their logits."""
    sess = Session(model, B, 64)
    sess.prefill(torch.arange(4, 4 + 2 * B, device="cuda"))
    block = torch.arange(40, 40 + B, device="cuda")
    out = []
    for _ in range(n):
        sess.committed = 2 * B
        out.append(sess.forward(block, torch.arange(2 * B, 3 * B, device="cuda"),
                                lambda c, k: masks.block_causal(B, c), keep=B))
    return out


def compiled(how, impl="flex"):
    model = make_model(block_size=B).cuda()
    model.attn_impl = impl
    fast.compile_dynamic(model) if how == "dynamic" else fast.compile_static(model, mode="reduce-overhead")
    return model


def main():
    eager = forwards(make_model(block_size=B).cuda(), 1)[0]
    for how in ("dynamic", "static"):
        for impl in ("flex", "sdpa"):
            torch._dynamo.reset()
            diffs = [(x - eager).abs().max().item() for x in forwards(compiled(how, impl), 4)]
            print(f"1-2. {how:<7} {impl}: max |logit diff| over 4 calls: {', '.join(f'{d:.1e}' for d in diffs)}")
    prompts = [torch.randint(4, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist()
               for n in (3, B, 2 * B + 5)]
    rule = DecodeRule(MASK_ID, B)
    reference = [generate(make_model(block_size=B).cuda(), p, 24, rule, eos_id=-1)[0] for p in prompts]
    for how in ("dynamic", "static"):
        torch._dynamo.reset()
        model = compiled(how)
        for p, ref in zip(prompts, reference):
            out = generate(model, p, 24, rule, eos_id=-1)[0]
            first = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), None)
            print(f"3. {how:<7} prompt of {len(p):>2}: " + ("equal" if first is None else f"differs from token {first}"))


if __name__ == "__main__":
    main()
