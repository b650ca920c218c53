"""Train a small block-diffusion LM with the BD3-LM / SDAR objective (docs/design.md, section 5).

Each batch holds random windows of L clean tokens x_0 from the corpus. A block size B is
drawn per batch from {4, 8, 32}, so one checkpoint decodes at all three; in every block of B
tokens each token is masked with probability t ~ U(eps, 1) (one t per block), giving x_t.
The model reads [x_t ; x_0] (2L tokens, both halves at positions 0..L-1) under the BD3-LM
mask (mask.bd3lm_training): noisy block b sees itself and the clean blocks before it, which is
exactly what it sees when decoding block b against a KV cache of clean blocks. The loss is the
cross-entropy on the masked positions of x_t.

Two stages. The first applies that objective to every token, from random weights. The second
(--finetune) starts from the first's model and keeps the question of every arithmetic document
clean, noising only its answer (and the text, as before): at decoding the prompt is never
masked, so the second stage spends the whole arithmetic signal on what decoding asks for. Each
answer is followed by 31 more EOS (SDAR's fine-tuning pads responses with EOS the same way), so
that decoding fills the rest of an answer's last block at once.

On CPU the attention is SDPA with the dense mask (CPU FlexAttention has no backward) under
bf16 autocast; on CUDA the model is compiled, FlexAttention with it. Every flag and input
file is checked before anything is printed or written; checkpoints and outputs are written
to a temporary file and renamed, so an interrupted save leaves the previous checkpoint whole.

    python prepare.py                      # builds data/ (corpus + tokenizer), once
    python train.py --preset target        # -> models/target (config.json, weights, tokenizer)
    python train.py --preset drafter       # -> models/drafter
    python train.py --preset target --finetune    # stage two, models/target in place
    python train.py --preset drafter --finetune
    python train.py --report                   # held-out loss, accuracy, drafter agreement
    python train.py --preset target --resume   # continue from out/target/ckpt.pt
                                               # (training checkpoints live in out/<preset>,
                                               # out/<preset>-finetune for stage two)
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

# model shapes and schedules; the drafter is ~5x smaller than the target, same tokenizer.
# finetune: the second stage (--finetune), from the first stage's model, answers only
PRESETS = {
    "target": dict(model=dict(n_layer=4, n_embd=256, n_head=4, n_kv_head=2, head_dim=64,
                              intermediate_size=768), iters=2500, lr=1.5e-3, warmup=200,
                   finetune=dict(iters=1400, lr=5e-4, warmup=50)),
    "drafter": dict(model=dict(n_layer=2, n_embd=128, n_head=2, n_kv_head=1, head_dim=64,
                               intermediate_size=384), iters=1200, lr=3e-3, warmup=200,
                    finetune=dict(iters=2000, lr=2e-3, warmup=50)),
    "tiny": dict(model=dict(n_layer=1, n_embd=32, n_head=2, n_kv_head=1, head_dim=16,
                            intermediate_size=64), iters=40, lr=3e-3, warmup=200,
                 finetune=dict(iters=20, lr=3e-3, warmup=5)),
}
BLOCK_SIZES = (4, 8, 32)


class Batches:
    """Random windows of `seq_len` tokens from a uint16 token file (documents joined by EOS).
    Calls return (x, prompt): with answer_ids, prompt marks the question of each arithmetic
    document (through "Answer:"), which stage two never masks (mark_prompts)."""

    def __init__(self, path, seq_len, seed, vocab_size=None, answer_ids=(), eos_id=None, pad=0):
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
        self.prompt = np.zeros(len(self.data), bool)
        if answer_ids:
            self.data, self.prompt = mark_prompts(self.data, answer_ids, eos_id, pad)

    def __call__(self, batch_size):
        idx = self.rng.integers(0, len(self.data) - self.seq_len, batch_size)
        x = np.stack([self.data[i:i + self.seq_len] for i in idx]).astype(np.int64)
        prompt = np.stack([self.prompt[i:i + self.seq_len] for i in idx])
        return torch.from_numpy(x), torch.from_numpy(prompt)


def mark_prompts(data, answer_ids, eos_id, pad=0):
    """-> (data, prompt): prompt is True from the start of each document that holds
    `answer_ids` through those ids. With pad, `pad` more EOS follow each such document, as
    SDAR's fine-tuning pads a response with EOS: decoding then reveals the rest of an answer's
    last block (all EOS) at once instead of guessing the next document there."""
    n = len(answer_ids)
    hits = np.flatnonzero(np.all([data[i:len(data) - n + 1 + i] == a
                                  for i, a in enumerate(answer_ids)], 0))
    eos = np.flatnonzero(data == eos_id)
    doc = np.searchsorted(eos, hits)                   # the EOS ending each hit's document
    starts = np.concatenate([[0], eos + 1])[doc]
    edges = np.zeros(len(data) + 1, np.int32)
    np.add.at(edges, starts, 1)
    np.add.at(edges, hits + n, -1)
    prompt = np.cumsum(edges[:-1]) > 0
    at = np.repeat(eos[doc[doc < len(eos)]] + 1, pad)
    return np.insert(data, at, eos_id), np.insert(prompt, at, False)


def noise(x0, block_size, mask_id, generator, keep=None, eps=1e-3):
    """x_t: mask each token of each block with that block's t ~ U(eps, 1), never where `keep`
    is True. The draws are made on x0's device, so `generator` must live there too."""
    b, L = x0.shape
    if L % block_size:
        raise ValueError(f"sequence length {L} is not a multiple of the block size {block_size}")
    t = torch.rand(b, L // block_size, 1, generator=generator, device=x0.device) * (1 - eps) + eps
    t = t.expand(-1, -1, block_size).reshape(b, L)
    masked = torch.rand(b, L, generator=generator, device=x0.device) < t
    if keep is not None:
        masked &= ~keep
    return torch.where(masked, mask_id, x0), masked


def bd3lm_loss(model, x0, block_size, generator, keep=None):
    """Mean cross-entropy on the masked positions of x_t, with the [x_t ; x_0] input."""
    L = x0.shape[1]
    xt, masked = noise(x0, block_size, model.config.mask_token_id, generator, keep)
    pos = torch.arange(L, device=x0.device).repeat(2)
    to_mask = masks.block_mask if x0.is_cuda else masks.dense_mask  # CPU flex has no backward
    mask = to_mask(masks.bd3lm_training(block_size, L), 2 * L, 2 * L, x0.device)
    logits = model(torch.cat([xt, x0], 1), pos, mask=mask)[:, :L]   # (b, L, V): x_t rows
    return F.cross_entropy(logits[masked], x0[masked])


@torch.no_grad()
def evaluate(model, splits, seq_len, batch_size, n_batches, seed=0):
    """Held-out masked-token loss per (split, block size), with fixed windows and noise.
    splits: name -> (token file, ids that end a prompt; () to noise every token)."""
    model.eval()
    out, dev = {}, device_of(model)
    for name, (path, answer_ids) in splits.items():
        batches = Batches(path, seq_len, seed, answer_ids=answer_ids, eos_id=model.config.eos_token_id)
        xs = [batches(batch_size) for _ in range(n_batches)]
        for B in BLOCK_SIZES:
            g = torch.Generator(dev).manual_seed(seed)
            with autocast(model):
                out[f"{name}/B{B}"] = sum(bd3lm_loss(model, x.to(dev), B, g, keep.to(dev)).item()
                                          for x, keep in xs) / n_batches
    model.train()
    return out


def device_of(model):
    return model.embed.weight.device


def autocast(model):
    dev = device_of(model).type
    return torch.autocast(dev, dtype=torch.bfloat16, enabled=dev in ("cpu", "cuda"))


@torch.no_grad()
def agreement(target, drafter, path, block_size, answer_ids=(), seq_len=256, n=16, seed=0):
    """Greedy agreement of drafter and target on the first denoising step of each block (the
    block masked, clean blocks before it), per token and whole blocks. With answer_ids, the
    question of each arithmetic document stays clean and only answer positions count, as
    when decoding an answer."""
    x0, prompt = Batches(path, seq_len, seed, answer_ids=answer_ids, eos_id=target.config.eos_token_id)(n)
    xt = torch.where(prompt, x0, target.config.mask_token_id)
    mask = masks.dense_mask(masks.bd3lm_training(block_size, seq_len), 2 * seq_len, 2 * seq_len)
    pos = torch.arange(seq_len).repeat(2)
    guess = [m(torch.cat([xt, x0], 1), pos, mask=mask)[:, :seq_len].argmax(-1) for m in (target, drafter)]
    same, counted = (guess[0] == guess[1]).view(-1, block_size), ~prompt.view(-1, block_size)
    blocks = counted.any(-1)
    return (same[counted].float().mean().item(),
            (same | ~counted).all(-1)[blocks].float().mean().item())


class AfterAnswer:
    """A DecodeRule that counts its steps taken once the answer is complete: the block holds
    EOS and no mask before it, so only positions after the EOS are left to fill."""

    def __init__(self, rule, eos_id):
        self.rule, self.eos_id, self.steps = rule, eos_id, 0

    def __getattr__(self, name):
        return getattr(self.rule, name)

    def __call__(self, logits, block, step, generator=None):
        b = block.tolist()
        self.steps += self.eos_id in b and self.mask_id not in b[:b.index(self.eos_id)]
        return self.rule(logits, block, step, generator)


def report(target_dir="models/target", drafter_dir="models/drafter", data_dir="data", n_problems=200):
    """The quality figures in the README: held-out masked-token loss; greedy accuracy on
    held-out problems of plain decoding (one token a step) and of the threshold rule (0.9),
    with its tokens per forward and the share of its forwards spent after the answer was
    complete; drafter/target agreement; at B = 4, 8 and 32."""
    from decode import DecodeRule, generate
    from prepare import extract_answer, problems
    (target, tok), (drafter, _) = load(target_dir), load(drafter_dir)
    models = dict(target=target, drafter=drafter)
    val = val_splits(data_dir, tok)
    for path, _ in val.values():
        Batches(path, 256, 0, target.config.vocab_size)  # checked before the first figure
    tasks = [(tok.encode(f"Question: {p['question']}\nAnswer:"), p["result"])
             for p in problems(n_problems, "test")]
    for name, m in models.items():
        print(name, " ".join(f"{k}={v:.3f}" for k, v in evaluate(m, val, 256, 16, 8).items()))
        for B in BLOCK_SIZES:
            for kind, kw in (("one token a step", {}),
                             ("threshold 0.9", dict(strategy="low_confidence_dynamic", threshold=0.9))):
                rule, ok, tokens, nfe = AfterAnswer(DecodeRule(m.config.mask_token_id, B, **kw), tok.eos_id), 0, 0, 0
                for ids, a in tqdm(tasks, desc=f"{name} B={B} {kind}", leave=False):
                    out, st = generate(m, ids, 64, rule, eos_id=tok.eos_id)
                    ok, tokens, nfe = ok + (extract_answer(tok.decode(out)) == a), tokens + len(out), nfe + st["nfe"]
                print(f"{name} greedy B={B} {kind}: accuracy {ok}/{len(tasks)} = {ok / len(tasks):.1%}, "
                      f"{tokens / nfe:.2f} tokens per forward, {rule.steps / nfe:.1%} of forwards after the answer")
    for B in BLOCK_SIZES:
        for split, (path, answer_ids) in val.items():
            tok_agree, block_agree = agreement(models["target"], models["drafter"], path, B, answer_ids)
            print(f"agreement B={B} {split}: per token {tok_agree:.3f}, whole block {block_agree:.3f}")


def val_splits(data_dir, tok):
    """The held-out splits `evaluate` scores: text, arithmetic, and arithmetic answers alone."""
    d = Path(data_dir)
    return dict(val_text=(d / "val_text.bin", ()), val_arith=(d / "val_arith.bin", ()),
                val_answer=(d / "val_arith.bin", tuple(tok.encode("Answer:"))))


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
    if warmup is not None and warmup < 0:
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
    return meta, tok


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


def load_stage_one(path, config):
    """The first stage's model in `path`, of this preset's shape, and its training log."""
    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"--finetune: no model in {path}; train it first (without --finetune)")
    model, _ = load(path)
    shape = lambda c: {k: v for k, v in asdict(c).items() if k not in ("max_seq_len", "block_size")}
    if shape(model.config) != shape(config):
        raise ValueError(f"--finetune: the model in {path} is not of this preset's shape")
    log = Path(path) / "train_log.json"
    log = util.read_json(log, list) if log.is_file() else []
    return model, [r for r in log if r.get("stage") != "finetune"]


def main(preset="target", data_dir="data", out_dir=None, iters=None, batch_size=16, seq_len=256,
         lr=None, warmup=None, weight_decay=0.1, grad_clip=1.0, eval_every=250, eval_batches=4,
         seed=1337, resume=False, device="cpu", threads=None, ckpt_dir=None, finetune=False):
    """Stage one, or with finetune stage two from stage one's model in out_dir (module doc)."""
    check_args(preset, iters, batch_size, seq_len, lr, warmup, eval_every, eval_batches,
               threads, device)
    stage = PRESETS[preset]["finetune"] if finetune else PRESETS[preset]
    iters, lr = iters or stage["iters"], lr or stage["lr"]
    warmup = stage["warmup"] if warmup is None else warmup
    data_dir, out_dir = Path(data_dir), Path(out_dir or f"models/{preset}")
    ckpt_file = Path(ckpt_dir or f"out/{preset}{'-finetune' if finetune else ''}") / "ckpt.pt"
    meta, tok = check_data(data_dir, seq_len)
    util.check_writable(out_dir, "--out-dir", folder=True)
    util.check_writable(ckpt_file.parent, "checkpoint directory", folder=True)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    try:
        config = ModelConfig(vocab_size=meta["vocab_size"], mask_token_id=meta["mask_id"],
                             eos_token_id=meta["eos_id"], block_size=4, block_sizes=BLOCK_SIZES,
                             max_seq_len=4096, **PRESETS[preset]["model"])
    except ValueError as e:
        raise ValueError(f"{data_dir / 'meta.json'}: {e}") from None
    model, stage_one_log = Transformer(config).to(device), []
    if finetune:
        first, stage_one_log = load_stage_one(out_dir, config)
        model.load_state_dict(first.state_dict())
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
    val = val_splits(data_dir, tok)
    train = Batches(data_dir / "train.bin", seq_len, seed + start, meta["vocab_size"],
                    val["val_answer"][1] if finetune else (), tok.eos_id, max(BLOCK_SIZES) - 1)
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
            log.append(dict(stage="finetune", iter=it) if finetune else dict(iter=it))
            log[-1].update(seconds=time.time() - t0, **evaluate(model, val, seq_len, batch_size, eval_batches))
            bar.write(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in log[-1].items()))
            save_checkpoint(ckpt_file, model, opt, it, config, log)
        for group in opt.param_groups:
            group["lr"] = lr_at(it, iters, lr, warmup)
        B = BLOCK_SIZES[torch.randint(len(BLOCK_SIZES), (1,), generator=g, device=g.device).item()]
        with autocast(model):
            x0, keep = train(batch_size)
            loss = bd3lm_loss(model, x0.to(device), B, g, keep.to(device))
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
        tmp.write_text(json.dumps(stage_one_log + log, indent=1) + "\n")
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
    ap.add_argument("--warmup", type=int, default=None, help="lr warm-up iterations (default from the preset)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--finetune", action="store_true",
                    help="stage two: from the model in --out-dir, noise only the answers of the "
                         "arithmetic documents, EOS-padded (checkpoints in out/<preset>-finetune)")
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
                              warmup=a.warmup, eval_every=a.eval_every, seed=a.seed, resume=a.resume,
                              device=a.device, threads=a.threads, finetune=a.finetune))
