"""Train a small block-diffusion LM with the BD3-LM / SDAR objective (design notes, section 5).

Each batch holds random windows of L clean tokens x_0 from the corpus. A block size B is
drawn per batch from {4, 8, 32}, so one checkpoint decodes at all three; in every block of B
tokens each token is masked with probability t ~ U(eps, 1) (one t per block), giving x_t.
The model reads [x_t ; x_0] (2L tokens, both halves at positions 0..L-1) under the BD3-LM
mask (mask.bd3lm_training): noisy block b sees itself and the clean blocks before it, which is
exactly what it sees when decoding block b against a KV cache of clean blocks. The loss is the
cross-entropy on the masked positions of x_t.

On CPU the attention is SDPA with the dense mask (CPU FlexAttention has no backward) under
bf16 autocast; on CUDA the model is compiled, FlexAttention with it. Every flag and input
file is checked before anything is printed or written; checkpoints and outputs are written
to a temporary file and renamed, so an interrupted save leaves the previous checkpoint whole.

    python prepare.py                      # builds data/ (corpus + tokenizer), once
    python train.py --preset target        # -> models/target (config.json, weights, tokenizer)
    python train.py --preset drafter       # -> models/drafter
    python train.py --report                   # held-out loss, accuracy, drafter agreement
    python train.py --preset target --resume   # continue from out/target/ckpt.pt
                                               # (training checkpoints live in out/<preset>)
"""
import argparse
import json
import math
import shutil
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import mask as masks
import util
from model import ModelConfig, Transformer
from sample import check_device, load
from tokenizer import load_tokenizer

# model shapes and schedules; the drafter is ~5x smaller than the target, same tokenizer
PRESETS = {
    "target": dict(model=dict(n_layer=4, n_embd=256, n_head=4, n_kv_head=2, head_dim=64,
                              intermediate_size=768), iters=2500, lr=1.5e-3),
    "drafter": dict(model=dict(n_layer=2, n_embd=128, n_head=2, n_kv_head=1, head_dim=64,
                               intermediate_size=384), iters=1200, lr=3e-3),
    "tiny": dict(model=dict(n_layer=1, n_embd=32, n_head=2, n_kv_head=1, head_dim=16,
                            intermediate_size=64), iters=40, lr=3e-3),
}
BLOCK_SIZES = (4, 8, 32)


class Batches:
    """Random windows of `seq_len` tokens from a uint16 token file (documents joined by EOS)."""

    def __init__(self, path, seq_len, seed, vocab_size=None):
        path = Path(path)
        if not path.is_file() or path.stat().st_size == 0:
            raise FileNotFoundError(f"corpus file {path} is missing or empty (run prepare.py)")
        if path.stat().st_size % 2:
            raise ValueError(f"corpus file {path} is not uint16 tokens (odd size)")
        self.data = np.fromfile(path, dtype=np.uint16)
        if len(self.data) < seq_len + 1:
            raise ValueError(f"corpus file {path} is shorter than one window of {seq_len}")
        if vocab_size is not None and self.data.max() >= vocab_size:
            raise ValueError(f"corpus file {path} holds token id {self.data.max()}, outside the "
                             f"vocabulary of {vocab_size}")
        self.seq_len, self.rng = seq_len, np.random.default_rng(seed)

    def __call__(self, batch_size):
        idx = self.rng.integers(0, len(self.data) - self.seq_len, batch_size)
        x = np.stack([self.data[i:i + self.seq_len] for i in idx]).astype(np.int64)
        return torch.from_numpy(x)


def noise(x0, block_size, mask_id, generator, eps=1e-3):
    """x_t: mask each token of each block with that block's t ~ U(eps, 1). The draws are made
    on x0's device, so `generator` must live there too."""
    b, L = x0.shape
    if L % block_size:
        raise ValueError(f"sequence length {L} is not a multiple of the block size {block_size}")
    t = torch.rand(b, L // block_size, 1, generator=generator, device=x0.device) * (1 - eps) + eps
    t = t.expand(-1, -1, block_size).reshape(b, L)
    masked = torch.rand(b, L, generator=generator, device=x0.device) < t
    return torch.where(masked, mask_id, x0), masked


def bd3lm_loss(model, x0, block_size, generator):
    """Mean cross-entropy on the masked positions of x_t, with the [x_t ; x_0] input."""
    L = x0.shape[1]
    xt, masked = noise(x0, block_size, model.config.mask_token_id, generator)
    pos = torch.arange(L, device=x0.device).repeat(2)
    to_mask = masks.block_mask if x0.is_cuda else masks.dense_mask  # CPU flex has no backward
    mask = to_mask(masks.bd3lm_training(block_size, L), 2 * L, 2 * L, x0.device)
    logits = model(torch.cat([xt, x0], 1), pos, mask=mask)[:, :L]   # (b, L, V): x_t rows
    return F.cross_entropy(logits[masked], x0[masked])


@torch.no_grad()
def evaluate(model, splits, seq_len, batch_size, n_batches, seed=0):
    """Held-out masked-token loss per (split, block size), with fixed windows and noise."""
    model.eval()
    out = {}
    for name, path in splits.items():
        batches = Batches(path, seq_len, seed)
        xs = [batches(batch_size) for _ in range(n_batches)]
        for B in BLOCK_SIZES:
            g = torch.Generator(device_of(model)).manual_seed(seed)
            with autocast(model):
                out[f"{name}/B{B}"] = sum(bd3lm_loss(model, x.to(device_of(model)), B, g).item()
                                          for x in xs) / n_batches
    model.train()
    return out


def device_of(model):
    return model.embed.weight.device


def autocast(model):
    dev = device_of(model).type
    return torch.autocast(dev, dtype=torch.bfloat16, enabled=dev in ("cpu", "cuda"))


@torch.no_grad()
def agreement(target, drafter, path, block_size, seq_len=256, n=16, seed=0):
    """Greedy agreement of drafter and target on the first denoising step of each block (the
    whole block masked, clean blocks before it): per token, and whole blocks."""
    x0 = Batches(path, seq_len, seed)(n)
    xt = torch.full_like(x0, target.config.mask_token_id)
    mask = masks.dense_mask(masks.bd3lm_training(block_size, seq_len), 2 * seq_len, 2 * seq_len)
    pos = torch.arange(seq_len).repeat(2)
    guess = [m(torch.cat([xt, x0], 1), pos, mask=mask)[:, :seq_len].argmax(-1) for m in (target, drafter)]
    same = (guess[0] == guess[1]).view(n, -1, block_size)
    return same.float().mean().item(), same.all(-1).float().mean().item()


def report(target_dir="models/target", drafter_dir="models/drafter", data_dir="data", n_problems=200):
    """The quality figures in the README: held-out masked-token loss, greedy accuracy of plain
    decoding on held-out problems, and drafter/target agreement, at B = 4, 8 and 32."""
    from decode import DecodeRule, generate
    from prepare import extract_answer, problems
    (target, tok), (drafter, _) = load(target_dir), load(drafter_dir)
    models = dict(target=target, drafter=drafter)
    val = {s: Path(data_dir) / f"{s}.bin" for s in ("val_text", "val_arith")}
    for path in val.values():
        Batches(path, 256, 0, target.config.vocab_size)  # checked before the first figure
    tasks = [(tok.encode(f"Question: {p['question']}\nAnswer:"), p["result"])
             for p in problems(n_problems, "test")]
    for name, m in models.items():
        print(name, " ".join(f"{k}={v:.3f}" for k, v in evaluate(m, val, 256, 16, 8).items()))
        for B in BLOCK_SIZES:
            rule = DecodeRule(m.config.mask_token_id, B)
            ok = sum(extract_answer(tok.decode(generate(m, ids, 64, rule, eos_id=tok.eos_id)[0])) == a
                     for ids, a in tqdm(tasks, desc=f"{name} B={B}", leave=False))
            print(f"{name} greedy accuracy B={B}: {ok}/{len(tasks)} = {ok / len(tasks):.1%}")
    for B in BLOCK_SIZES:
        for split, path in val.items():
            tok_agree, block_agree = agreement(models["target"], models["drafter"], path, B)
            print(f"agreement B={B} {split}: per token {tok_agree:.3f}, whole block {block_agree:.3f}")


def lr_at(it, iters, lr, warmup):
    """Linear warm-up, then cosine decay to 10%."""
    if it < warmup:
        return lr * (it + 1) / warmup
    progress = (it - warmup) / max(1, iters - warmup)
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def check_args(preset, iters, batch_size, seq_len, lr, warmup, eval_every, eval_batches,
               threads, device):
    """Every flag, before any file is read."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    util.check_positive(iters=iters, batch_size=batch_size, seq_len=seq_len, eval_every=eval_every,
                        eval_batches=eval_batches, threads=threads)
    step = math.lcm(*BLOCK_SIZES)
    if seq_len % step:
        raise ValueError(f"--seq-len must be a multiple of {step}, so that every block size "
                         f"{BLOCK_SIZES} tiles it; got {seq_len}")
    if lr is not None and not lr > 0:
        raise ValueError(f"--lr must be > 0, got {lr}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    check_device(device)


def check_data(data_dir, seq_len):
    """prepare.py's output: meta.json, the tokenizer (copied next to the model at the end) and
    the three token files, checked before training, not at the first evaluation. -> meta"""
    meta_file = Path(data_dir) / "meta.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"{meta_file} not found: run `python prepare.py` first")
    meta = util.read_json(meta_file)
    for key in ("vocab_size", "mask_id", "eos_id"):
        if type(meta.get(key)) is not int:
            raise ValueError(f"{meta_file}: {key} must be an integer, got {meta.get(key)!r}")
    if not (Path(data_dir) / "tokenizer.model").is_file():
        raise FileNotFoundError(f"no tokenizer.model in {data_dir} (run prepare.py)")
    tok = load_tokenizer(data_dir)
    if tok.vocab_size > meta["vocab_size"]:
        raise ValueError(f"{data_dir}: tokenizer has {tok.vocab_size} ids, meta.json's "
                         f"vocab_size is {meta['vocab_size']}")
    for split in ("train", "val_text", "val_arith"):
        Batches(Path(data_dir) / f"{split}.bin", seq_len, 0, meta["vocab_size"])
    return meta


def save_checkpoint(path, model, opt, it, config, log):
    """Through a temporary file: a save interrupted half-way leaves the previous one whole."""
    with util.atomic_write(path) as tmp:
        torch.save(dict(model=model.state_dict(), optimizer=opt.state_dict(), iter=it,
                        config=asdict(config), log=log), tmp)


def load_checkpoint(path, config, iters, device):
    """A checkpoint to --resume from: readable, of this model config, and not yet finished."""
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}")
    try:
        with warnings.catch_warnings():    # a foreign pickle warns before failing
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location=device)
    except Exception as e:  # torch.load fails in many ways on a damaged file
        raise ValueError(f"--resume: cannot read {path} ({type(e).__name__})") from None
    if not (isinstance(ckpt, dict) and {"model", "optimizer", "iter", "config", "log"} <= set(ckpt)):
        raise ValueError(f"--resume: {path} is not a training checkpoint")
    if ckpt["config"] != asdict(config):
        raise ValueError(f"--resume: {path} was trained with another model config")
    if ckpt["iter"] >= iters:
        raise ValueError(f"--resume: {path} has already done {ckpt['iter']} of {iters} iterations")
    return ckpt


def main(preset="target", data_dir="data", out_dir=None, iters=None, batch_size=16, seq_len=256,
         lr=None, warmup=200, weight_decay=0.1, grad_clip=1.0, eval_every=500, eval_batches=4,
         seed=1337, resume=False, device="cpu", threads=None, ckpt_dir=None):
    check_args(preset, iters, batch_size, seq_len, lr, warmup, eval_every, eval_batches, threads,
               device)
    p = PRESETS[preset]
    iters, lr = iters or p["iters"], lr or p["lr"]
    data_dir, out_dir = Path(data_dir), Path(out_dir or f"models/{preset}")
    ckpt_file = Path(ckpt_dir or f"out/{preset}") / "ckpt.pt"
    meta = check_data(data_dir, seq_len)
    util.check_writable(out_dir, "--out-dir", folder=True)
    util.check_writable(ckpt_file.parent, "checkpoint directory", folder=True)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    try:
        config = ModelConfig(vocab_size=meta["vocab_size"], mask_token_id=meta["mask_id"],
                             eos_token_id=meta["eos_id"], block_size=4, block_sizes=BLOCK_SIZES,
                             max_seq_len=4096, **p["model"])
    except ValueError as e:
        raise ValueError(f"{data_dir / 'meta.json'}: {e}") from None
    model = Transformer(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95),
                            weight_decay=weight_decay, fused=model.embed.weight.is_cuda)
    start, log = 0, []
    if resume:
        ckpt = load_checkpoint(ckpt_file, config, iters, device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        start, log = ckpt["iter"], ckpt["log"]
    if model.embed.weight.is_cuda:
        model.compile()  # FlexAttention is only fast compiled; the state_dict keeps its names
    train = Batches(data_dir / "train.bin", seq_len, seed + start, meta["vocab_size"])
    val = {s: data_dir / f"{s}.bin" for s in ("val_text", "val_arith")}
    g = torch.Generator(device_of(model)).manual_seed(seed + start)  # draws on the data's device
    n_params = sum(t.numel() for t in model.parameters())
    print(f"{preset}: {n_params / 1e6:.2f}M parameters, {iters} iterations of "
          f"{batch_size}x{seq_len} tokens, block sizes {BLOCK_SIZES}")
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_file.parent.mkdir(parents=True, exist_ok=True)
    bar, t0, tokens = tqdm(range(start, iters), initial=start, total=iters), time.time(), 0
    for it in bar:
        # evaluate and save every eval_every; not again at the iteration a resume starts from
        if (it % eval_every == 0 or it == iters - 1) and not (log and log[-1]["iter"] == it):
            log.append(dict(iter=it, seconds=time.time() - t0, **evaluate(model, val, seq_len, batch_size, eval_batches)))
            bar.write(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in log[-1].items()))
            save_checkpoint(ckpt_file, model, opt, it, config, log)
        for group in opt.param_groups:
            group["lr"] = lr_at(it, iters, lr, warmup)
        B = BLOCK_SIZES[torch.randint(len(BLOCK_SIZES), (1,), generator=g, device=g.device).item()]
        with autocast(model):
            loss = bd3lm_loss(model, train(batch_size).to(device), B, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        tokens += batch_size * seq_len
        bar.set_postfix(loss=f"{loss.item():.3f}", B=B, tok_s=f"{tokens / (time.time() - t0):.0f}")
    save_checkpoint(ckpt_file, model, opt, iters, config, log)
    model.save_pretrained(out_dir, dtype=torch.float16)
    with util.atomic_write(out_dir / "tokenizer.model") as tmp:
        shutil.copy(data_dir / "tokenizer.model", tmp)
    with util.atomic_write(out_dir / "train_log.json") as tmp:
        tmp.write_text(json.dumps(log, indent=1) + "\n")
    print(f"saved {out_dir} after {time.time() - t0:.0f} s")


if __name__ == "__main__":
    ap = util.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="target", choices=list(PRESETS))
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--out-dir", default=None, help="default models/<preset>")
    ap.add_argument("--iters", type=int, default=None, help="default from the preset")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=256, help=f"a multiple of {math.lcm(*BLOCK_SIZES)}")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--report", action="store_true",
                    help="print the quality figures of models/target and models/drafter, no training")
    a = ap.parse_args()
    if a.report:
        util.run(lambda: report(data_dir=a.data_dir))
    else:
        util.run(lambda: main(preset=a.preset, data_dir=a.data_dir, out_dir=a.out_dir, iters=a.iters,
                              batch_size=a.batch_size, seq_len=a.seq_len, lr=a.lr,
                              eval_every=a.eval_every, seed=a.seed, resume=a.resume,
                              device=a.device, threads=a.threads))
