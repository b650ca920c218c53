"""Run by tests/test_parallel.py as `torchrun --nproc-per-node 2 tests/parallel_worker.py OUT`: on
2 ranks (gloo), the split target's logits against the whole model's, with and without one of its
all-reduces, and every lossless decoder's tokens against plain decoding's on the same 2 ranks.
Rank 0 writes the results to OUT (JSON); the test asserts on them."""
import contextlib
import io
import json
import random
import sys
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import mask as masks  # noqa: E402
import parallel  # noqa: E402
import sample  # noqa: E402
from conftest import make_model  # noqa: E402
from loading.checkpoint import from_pretrained, save_pretrained  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from serve.batch import decode_all  # noqa: E402

DECODERS = {"simsd": ("simsd", {}), "simsd-trajectory": ("simsd", dict(reference="trajectory")),
            "simsd-lookup": ("simsd", dict(reference="lookup")), "spiffy": ("spiffy", {})}
TEXT = ("Question: Max saves 4 dollars a week for 4 weeks and already had 2 dollars. How much does Max "
        "have now?\nAnswer: 4 * 4 = 16. 16 + 2 = 18. The answer is 18.\n\n") * 2


def forwards(model, B=4):
    """The logits of every kind of forward the decoders run: no cache, prefill, a cached block,
    copies of a block (block_copies) and the temporal section (simsd_temporal)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (1, 24), generator=g)
    model.kv = None
    model.setup_cache(64)
    out = [model(ids[:, :12]), model(ids[:, :8], start=0), model(ids[:, 8:12], start=8)]
    copies = torch.randint(4, model.config.vocab_size, (1, 3 * B), generator=g)
    sees = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1]], dtype=torch.bool)
    out.append(model(copies, torch.arange(12, 12 + B).repeat(3), 12, masks.block_copies(12, 0, B, sees)))
    step, is_slot = torch.tensor([0, 1, 1, 2, 1, 2]), torch.tensor([0, 0, 0, 0, 1, 1], dtype=torch.bool)
    out.append(model(copies[:, :6], torch.tensor([12, 13, 14, 15, 13, 15]), 12,
                     masks.simsd_temporal(12, 0, step, is_slot)))
    return out


@torch.no_grad()
def error(whole, split):
    """max |split - whole| / max |whole| over every forward of `forwards`."""
    pairs = list(zip(forwards(whole), forwards(split)))
    return max(float((b - a).abs().max() / a.abs().max()) for a, b in pairs)


def logits_results(tmp):
    """Each model whole and split as loading splits it (parallel.shard: each tensor cut as read)."""
    if parallel.RANK == 0:   # a tiny mixture of experts, written as a checkpoint
        moe = make_model(n_experts=8, top_k=2, moe_intermediate_size=32, norm_topk_prob=True)
        save_pretrained(moe, tmp / "moe", dtype=torch.float32)
    torch.distributed.barrier()
    out = {}
    for name, path in (("target", ROOT / "models/target"), ("moe", tmp / "moe")):
        whole, split = (from_pretrained(path, dtype=torch.float32, split=s) for s in (None, parallel.shard))
        out[name] = error(whole, split)
        if name == "moe":   # the compiled form too (by_row: every slot, another rank's at weight 0)
            with mock.patch("torch.compiler.is_compiling", return_value=True):
                out["moe-by-row"] = error(whole, split)
        split.all_reduces[-1].remove()   # the negative control: the last MLP's sum dropped
        out[name + "-one-sum-dropped"] = error(whole, split)
    return out


def decoder_results():
    """Each lossless decoder against plain decoding (both on 2 ranks), greedy and sampled, and
    batched; -> {name: [tokens equal?, ...], name-multistep: rounds of more than one step}."""
    out, rng = {}, random.Random(0)
    for B, T in ((4, 0.0), (8, 0.8)):
        plain, tok = sample.load("none", block_size=B, temperature=T)
        ids = tok.encode(TEXT)
        prompts = [ids[s:s + n] for s, n in ((rng.randint(0, 20), rng.randint(4, 100)) for _ in range(3))]
        want = [plain(p, 24, torch.Generator().manual_seed(i))[0] for i, p in enumerate(prompts)]
        for name, (spec, flags) in DECODERS.items():
            dec, _ = sample.load(spec, block_size=B, temperature=T, cost_table="none", **flags)
            got = [dec(p, 24, torch.Generator().manual_seed(i)) for i, p in enumerate(prompts)]
            together, _ = decode_all(lambda i, p, t, d: dec(p, 24, torch.Generator().manual_seed(i), models=(t, d)),
                                     prompts, dec.models, 2)
            out.setdefault(name, []).extend([a == w for (a, _), w in zip(got, want)] +
                                            [a == w for (a, _), w in zip(together, want)])
            out[name + "-multistep"] = out.get(name + "-multistep", 0) + sum(multistep(s) for _, s in got)
    return out


def multistep(stats):
    """Rounds that took more than one step: walked through copies, or accepted drafts."""
    return sum(n for k, n in stats.get("steps_per_forward", {}).items() if k > 1) + \
        sum(n for k, n in stats.get("accept_hist", {}).items() if k > 0)


def json_line():
    """sample.py --json on 2 ranks: rank 0's last line (every rank's stdout here)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        sample.main("simsd", max_new_tokens=8, as_json=True)
    return json.loads(out.getvalue().splitlines()[-1])


def failures(tmp):
    """A checkpoint that fails to load on rank 1 only, one whose embedding is twice its shape (a
    whole weight: refused, not cut), and ranks that send different queries (PARALLEL_CHECK=1):
    each rank's error, or None where it went on."""
    if parallel.RANK == 0:
        save_pretrained(make_model(), tmp / "bad", dtype=torch.float32)
        weights = load_file(tmp / "bad/model.safetensors")
        weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"].repeat(2, 1)
        save_file(weights, tmp / "bad/model.safetensors")
    torch.distributed.barrier()
    out = {}
    for name, run in (("load", lambda: sample.cli.load_target("models/target" if parallel.RANK == 0 else "nowhere")),
                      ("bad", lambda: parallel.agree(lambda: from_pretrained(tmp / "bad", split=parallel.shard))),
                      ("diverged", lambda: parallel.split(make_model(), parallel.RANK, 2)(
                          torch.tensor([[5, 6 + parallel.RANK]])))):
        try:
            run()
            out[name] = None
        except (ValueError, RuntimeError) as e:
            out[name] = str(e)
    return out


def main():
    results = dict(ranks=parallel.WORLD, json=json_line(), failed=failures(Path(sys.argv[1]).parent),
                   **logits_results(Path(sys.argv[1]).parent), **decoder_results())
    if parallel.RANK == 0:
        Path(sys.argv[1]).write_text(json.dumps(results))


if __name__ == "__main__":
    parallel.run(main)
