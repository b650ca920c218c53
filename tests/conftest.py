"""Shared test helpers: the repo root on sys.path (so `import model` works from tests/) and a
tiny random Transformer that is "peaky".

Also: torch runs single-threaded here, and every test must leave torch's compiler settings
(`torch._dynamo.config`) as it found them: a test that changes one does so through torch's own
scoped `torch._dynamo.config.patch(...)`, and `dynamo_config_unchanged` fails any test that
does not. (pytest's `monkeypatch` is not safe here: from pytest 9.2 its undo deletes the entry,
and torch then hides it from every later caller, FlexAttention included.)

Torch runs single-threaded here. The test tensors are tiny, and with several threads on
cores shared with other jobs every op waits on a thread barrier (about 300x slower measured).

Why peaky: with the default init (std 0.02) a random model's logits are nearly uniform and
every position decodes to the same token, so decoding tests would pass vacuously. Re-drawing
the weights with a fan-in scaled std gives varied greedy outputs and spread-out confidences.
"""
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from model import ModelConfig, SparseMLP, Transformer  # noqa: E402
from loading.checkpoint import PRESETS  # noqa: E402
from training.tasks import problems  # noqa: E402

torch.set_num_threads(1)


SLOWEST = ("test_inductor_flex.py", "test_inductor.py", "test_gpu_check.py", "test_errors.py",
           "test_scripts.py", "test_attention.py", "test_parallel.py")   # a minute or more each, cold


def pytest_collection_modifyitems(items):
    """The slowest files first (pytest.ini keeps xdist from reordering by test count): each
    worker starts on one and the short ones fill in after, so none runs alone at the end."""
    rank = {name: i for i, name in enumerate(SLOWEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))   # (a stable sort)


def pytest_configure(config):
    # eager flex_attention on CPU warns on every first call that it is not compiled: expected here
    config.addinivalue_line(
        "filterwarnings", "ignore:flex_attention called without torch.compile:UserWarning")


def dynamo_config():
    """Every entry of torch._dynamo.config as a caller sees it; a hidden (deleted) entry reads
    as DELETED."""
    cfg, out = torch._dynamo.config, {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)   # reading a deprecated entry warns
        for name in cfg.get_config_copy():
            try:
                out[name] = getattr(cfg, name)
            except AttributeError:
                out[name] = DELETED
    return out


DELETED = "<deleted>"


def config_changes(before):
    """{name: (before, now)} for each entry of torch._dynamo.config that differs from `before`."""
    now = dynamo_config()
    return {k: (v, now.get(k, DELETED)) for k, v in before.items() if now.get(k, DELETED) != v}


@pytest.fixture(autouse=True)
def dynamo_config_unchanged():
    """Fail a test that leaves torch._dynamo.config changed, then put it back, so that the
    tests after it see torch's own settings."""
    before = dynamo_config()
    yield
    changed = config_changes(before)
    for name in changed:
        setattr(torch._dynamo.config, name, before[name])   # setattr also un-hides a deleted one
    if changed:
        pytest.fail("the test left torch._dynamo.config changed (use torch._dynamo.config.patch): "
                    + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items()), pytrace=False)


def make_model(n_layer=2, vocab=97, block_size=4, seed=0, gain=3.0, embed_std=1.0, **overrides):
    """A tiny fp32 Transformer in eval mode (the "tiny" preset plus overrides), re-initialised
    so that its logits are far from uniform: Linear weights ~ N(0, (gain / sqrt(fan_in))^2),
    embedding ~ N(0, embed_std^2), RMSNorm weights ~ 1 + U(-0.2, 0.2) (so a missed norm weight
    changes the logits)."""
    config = ModelConfig(**{**PRESETS["tiny"], "n_layer": n_layer, "vocab_size": vocab,
                            "block_size": block_size, **overrides})
    g = torch.Generator().manual_seed(seed)
    model = Transformer(config)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.Embedding):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * embed_std)
            elif isinstance(m, nn.Linear) and m.weight is not model.embed.weight:
                std = gain / math.sqrt(m.weight.shape[1])
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * std)
            elif isinstance(m, SparseMLP):   # the experts, stacked: fan-in is the last dim
                for p in (m.gate, m.up, m.down):
                    p.copy_(torch.randn(p.shape, generator=g) * gain / math.sqrt(p.shape[-1]))
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.4 * (torch.rand(p.shape, generator=g) - 0.5))
    return model.float().eval()


@pytest.fixture
def tiny_model():
    """Factory fixture: tiny_model(**kwargs) -> make_model(**kwargs)."""
    return make_model


def tiny_corpus(tmp_path):
    """A small data dir in tools/prepare.py's layout, tokenised with the shipped tokenizer."""
    target = ROOT / "models" / "target"
    sp = spm.SentencePieceProcessor(model_file=str(target / "tokenizer.model"))
    data = tmp_path / "data"
    data.mkdir()
    splits = {"train": problems(400, "train"), "val_text": problems(40, "test"),
              "val_arith": problems(40, "test")[::-1]}
    for split, ps in splits.items():
        ids = [i for p in ps for i in sp.encode(f"Question: {p['question']}\nAnswer: {p['answer']}") + [2]]
        np.array(ids, dtype=np.uint16).tofile(data / f"{split}.bin")
    (data / "meta.json").write_text(json.dumps(dict(vocab_size=sp.get_piece_size(), eos_id=2, mask_id=3)))
    (data / "tokenizer.model").write_bytes((target / "tokenizer.model").read_bytes())
    return data


# A process that imports what the scripts import, once, then forks a child per command. The
# child becomes `python <script>.py <args>`: its own directory, argv, stdout and stderr files,
# the script's __main__ block run by runpy, and the interpreter's own handling of SystemExit and
# of an uncaught exception (the traceback). Only imports are shared: torch's take 1.5 s, and
# torch's lazy ones for the first model built on the meta device (from_pretrained) 2 s more.
FORKER = """
import gc, json, os, runpy, signal, sys
sys.path[0] = sys.argv[1]
import bench, sample, spiffy, train, torch, model
from tools import calibrate
from tools import prepare
with torch.device("meta"):
    model.Transformer(model.ModelConfig())
if sys.argv[2] == "one-thread":  # whatever a script asks: threads on shared cores wait on each other
    torch.set_num_threads(1)
    torch.set_num_threads = lambda n: None
gc.freeze()  # else each child's exit walks (and so copies) the whole shared heap: 1 s
print("ready", flush=True)
for line in sys.stdin:
    case = json.loads(line)
    pid = os.fork()
    if pid == 0:
        signal.alarm(case["alarm"])  # a script that hangs (or starts its real work) is stopped
        os.chdir(case["cwd"])
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(case[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.stdin, sys.argv = open(os.devnull), case["argv"]
        runpy.run_path(sys.argv[0], run_name="__main__")
        sys.exit(0)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class Forker:
    """FORKER as a process: run(argv, cwd, stdout, stderr) -> the exit status; close() checks
    that the shared imports printed nothing. threads: "one-thread" pins torch to one."""

    def __init__(self, threads="", env=None, alarm=120):
        self.alarm = alarm
        self.proc = subprocess.Popen([sys.executable, "-c", FORKER, str(ROOT), threads],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout.readline() == "ready\n"

    def run(self, argv, cwd, stdout, stderr):
        self.proc.stdin.write(json.dumps(dict(cwd=str(cwd), argv=argv, stdout=str(stdout),
                                              stderr=str(stderr), alarm=self.alarm)) + "\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=900) == 0 and self.proc.stderr.read() == "", "the imports printed"
