"""Bad input through every command-line tool: a non-zero exit status, exactly one line on
stderr starting with `error:` (and saying what is wrong), no traceback, nothing on stdout,
and no file written or changed.

Each case runs the tool in its own process and directory, on a copy of the shipped target (or
a data directory, a graph, a data file) with one thing broken. Starting Python and importing
torch takes about 2 s a process, so the processes are forked from one that has done the
imports (conftest.FORKER); a few cases are also run from scratch to show that this changes
nothing. Each case is its own test with its own assertions.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loading import checkpoint
from conftest import Forker, tiny_corpus
from model import ModelConfig, Transformer
from loading.checkpoint import PRESETS

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "models" / "target"
DROP = object()  # a config value that means "remove the key"


def file(d, name, content):
    """Write d/name (bytes or text; None removes it) -> its path."""
    path = d / name
    path.unlink(missing_ok=True)                 # a link to a shipped file is replaced, not written
    if content is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def target(d, config=None, **files):
    """d/target: the shipped target (weights linked, the rest copied); config: key -> new
    value (DROP removes it); files: name -> new content (None removes the file)."""
    t = d / "target"
    t.mkdir()
    for f in TARGET.iterdir():
        if f.name == "model.safetensors":
            (t / f.name).symlink_to(f)
        else:
            shutil.copy(f, t)
    if config:
        cfg = json.loads((t / "config.json").read_text())
        for k, v in config.items():
            cfg.pop(k) if v is DROP else cfg.__setitem__(k, v)
        file(t, "config.json", json.dumps(cfg))
    for name, content in files.items():
        file(t, name, content)
    return t


def weights_without(d):
    """A target whose weights lack one tensor."""
    state = load_file(TARGET / "model.safetensors")
    state.pop("model.layers.3.mlp.up_proj.weight")
    t = target(d, **{"model.safetensors": None})
    save_file(state, t / "model.safetensors")
    return t


def small_model(d):
    """A 97-token model next to the shipped 2048-piece tokenizer."""
    t = d / "small"
    checkpoint.save_pretrained(Transformer(ModelConfig(**PRESETS["tiny"])), t, torch.float32)
    shutil.copy(TARGET / "tokenizer.model", t)
    return t


def data(d, **files):
    """A tools/prepare.py data directory (the tests' tiny corpus) with files replaced or removed."""
    out = tiny_corpus(d)
    for name, content in files.items():
        file(out, name, content)
    return out


def data_and(path, content):
    """A data directory, and a file at `path` (relative to the case's directory)."""
    def setup(d):
        file(d, path, content)
        return data(d)
    return setup


def graph(**changes):
    return json.dumps(dict(json.loads((TARGET / "spiffy_graph_b4_t0.9.json").read_text()), **changes))


WEIGHTS = (TARGET / "model.safetensors").read_bytes()
SAMPLE, BENCH_DATA = "sample.py --target {t}", "bench.py --methods plain --data {t}"
TRAIN, CALIBRATE = "train.py --preset tiny --data-dir {t}", "tools/calibrate.py --target {t}"
# id -> (setup(d) -> a path for {t}, or None; the command; what its one line of stderr must
# say). In the command {d} is the case's directory, the process's working directory too.
CASES = {
    # config.json, index
    "config-is-a-list": (lambda d: target(d, **{"config.json": "[4, 8]"}), SAMPLE,
                         "config.json holds a JSON list"),
    "config-not-json": (lambda d: target(d, **{"config.json": "{"}), SAMPLE, "malformed JSON in"),
    "config-no-hidden-size": (lambda d: target(d, dict(hidden_size=DROP)), SAMPLE,
                              "config.json: hidden_size is missing"),
    "config-layers-a-string": (lambda d: target(d, dict(num_hidden_layers="4")), SAMPLE,
                               "num_hidden_layers must be an integer, got '4'"),
    "config-no-layers": (lambda d: target(d, dict(num_hidden_layers=DROP)), SAMPLE,
                         "num_hidden_layers is missing"),
    "config-negative-heads": (lambda d: target(d, dict(num_attention_heads=-4)), SAMPLE,
                              "num_attention_heads must be >= 1, got -4"),
    "config-heads-do-not-divide": (lambda d: target(d, dict(num_key_value_heads=3)), SAMPLE,
                                   "is not a multiple of num_key_value_heads (3)"),
    "config-odd-head-dim": (lambda d: target(d, dict(head_dim=63)), SAMPLE, "head_dim must be even"),
    "config-rope-parameters-null": (lambda d: target(d, dict(rope_theta=DROP, rope_parameters=None)),
                                    SAMPLE, "rope_theta is missing"),
    "config-rope-scaling": (lambda d: target(d, dict(rope_scaling={"rope_type": "yarn", "factor": 4})),
                            SAMPLE, "RoPE type 'yarn' is not supported"),
    "config-block-sizes-a-string": (lambda d: target(d, dict(block_sizes="4,8")), SAMPLE,
                                    "block_sizes must be a list of integers"),
    "config-no-block-size": (lambda d: target(d, dict(block_size=DROP)), SAMPLE, "block_size is missing"),
    "config-mask-outside-vocab": (lambda d: target(d, dict(mask_token_id=2048)), SAMPLE,
                                  "mask_token_id 2048 is outside the vocabulary"),
    "config-llama": (lambda d: target(d, dict(model_type="llama")), SAMPLE, "model_type 'llama'"),
    "index-without-weight-map": (lambda d: target(d, **{"model.safetensors.index.json": '{"metadata": {}}'}),
                                 SAMPLE, "no weight_map"),
    "index-not-json": (lambda d: target(d, **{"model.safetensors.index.json": "{"}), SAMPLE,
                       "malformed JSON in"),
    "index-missing-shard": (lambda d: target(d, **{"model.safetensors.index.json":
                                                   '{"weight_map": {"lm_head.weight": "model-2.safetensors"}}'}),
                            SAMPLE, "shard model-2.safetensors listed in"),
    # weights
    "weights-truncated": (lambda d: target(d, **{"model.safetensors": WEIGHTS[:len(WEIGHTS) // 2]}),
                          SAMPLE, "is not a readable safetensors file"),
    "weights-garbage": (lambda d: target(d, **{"model.safetensors": b"not safetensors" * 99}), SAMPLE,
                        "is not a readable safetensors file"),
    "weights-empty": (lambda d: target(d, **{"model.safetensors": b""}), SAMPLE,
                      "is not a readable safetensors file"),
    "weights-missing": (lambda d: target(d, **{"model.safetensors": None}), SAMPLE,
                        "no model.safetensors"),
    "weights-lack-a-tensor": (weights_without, SAMPLE, "lacks weight(s): model.layers.3.mlp.up_proj.weight"),
    "weights-other-shape": (lambda d: target(d, dict(intermediate_size=512)), SAMPLE,
                            "shape mismatch for model.layers.0.mlp."),
    # tokenizers
    "tokenizer-garbage": (lambda d: target(d, **{"tokenizer.model": b"\x08\x01garbage"}), SAMPLE,
                          "is not a readable sentencepiece model"),
    "tokenizer-empty": (lambda d: target(d, **{"tokenizer.model": b""}), SAMPLE,
                        "is not a readable sentencepiece model"),
    "tokenizer-missing": (lambda d: target(d, **{"tokenizer.model": None}), SAMPLE, "no tokenizer files"),
    "tokenizer-beyond-the-model": (small_model, "sample.py --spec none --target {t}",
                                   "tokenizer has 2048 ids, the model only 97"),
    "bpe-vocab-not-json": (lambda d: target(d, **{"tokenizer.model": None, "vocab.json": "{"}), SAMPLE,
                           "malformed JSON in"),
    "bpe-tokenizer-json-a-list": (lambda d: target(d, **{"tokenizer.model": None, "tokenizer.json": "[]"}),
                                  SAMPLE, "tokenizer.json holds a JSON list"),
    # draft graphs
    "graph-not-json": (lambda d: file(d, "g.json", "{"), "sample.py --spec spiffy --graph {t}",
                       "malformed draft graph"),
    "graph-bad-node": (lambda d: file(d, "g.json", graph(nodes=[[[0]]])),
                       "sample.py --spec spiffy --graph {t}", "malformed draft graph"),
    "graph-for-another-block-size": (lambda d: file(d, "g.json", graph(block_size=8)),
                                     "sample.py --spec spiffy --graph {t}", "was calibrated for"),
    "graph-missing": (None, "sample.py --spec spiffy --graph {d}/g.json", "not found"),
    "shipped-graph-corrupt": (lambda d: target(d, **{"spiffy_graph_b4_t0.9.json": "[]"}),
                              "sample.py --spec spiffy --target {t}", "malformed draft graph"),
    # bench.py --data
    "data-missing": (None, "bench.py --methods plain --data {d}/q.jsonl", "not found"),
    "data-not-json": (lambda d: file(d, "q.jsonl", "question? 4\n"), BENCH_DATA, "q.jsonl:1: not a JSON object"),
    "data-no-answer": (lambda d: file(d, "q.jsonl", '{"question": "2+2?"}\n'), BENCH_DATA,
                       "with 'question' and 'answer'"),
    "data-empty": (lambda d: file(d, "q.jsonl", ""), BENCH_DATA, "holds no problems"),
    "data-answer-no-number": (lambda d: file(d, "q.jsonl", '{"question": "2+2?", "answer": "four"}\n'),
                              BENCH_DATA, "must hold a number"),
    "data-not-text": (lambda d: file(d, "q.jsonl", b"\xff\xfe\x00"), BENCH_DATA, "is not UTF-8 text"),
    # bench.py flags
    "bench-block-size-0": (None, "bench.py --block-size 4,0", "--block-size must be >= 1, got 0"),
    "bench-block-size-untrained": (None, "bench.py --block-size 16", "not 16"),
    "sample-attention-unknown": (None, "sample.py --attention math", "invalid choice: 'math'"),
    "bench-attention-unknown": (None, "bench.py --attention math --compile both", "invalid choice: 'math'"),
    "bench-block-size-not-numbers": (None, "bench.py --block-size 4,x", "comma-separated integers"),
    "bench-unknown-method": (None, "bench.py --methods plain,medusa", "unknown method 'medusa'"),
    "bench-compile-mode": (None, "bench.py --compile fast", "invalid choice: 'fast'"),
    "bench-compile-drafter-none": (None, "bench.py --methods threshold --compile drafter", "none of --methods runs a drafter"),
    "bench-prompts-0": (None, "bench.py --prompts 0", "--prompts must be >= 1"),
    "bench-unknown-ablation": (None, "bench.py --ablate speed", "unknown --ablate"),
    "bench-sdar-threshold": (None, "bench.py --methods sdar+threshold", "unknown method 'sdar+threshold'"),
    "bench-gate-unused": (None, "bench.py --methods plain,spiffy --gate 0.8", "--gate does nothing"),
    "bench-gate-1.5": (None, "bench.py --methods simsd-gated --gate 1.5", "gate must be in (0, 1]"),
    "bench-unused-draft-budget": (None, "bench.py --methods plain --draft-budget 4",
                                  "--draft-budget does nothing with --methods plain"),
    "bench-unused-sweep": (None, "bench.py --methods plain,spiffy --sweep gamma", "--sweep does nothing"),
    "bench-sweep-gamma-no-drafter": (None, "bench.py --methods simsd-trajectory,simsd-lookup --sweep gamma",
                                     "--sweep does nothing with --methods simsd-trajectory,simsd-lookup"),
    "bench-unused-drafter": (None, "bench.py --methods plain --drafter {d}", "--drafter does nothing"),
    "bench-out-nowhere": (None, "bench.py --out {d}/nowhere/r.json", "no directory"),
    "bench-out-a-directory": (None, "bench.py --out {d}", "is a directory"),
    # sample.py flags
    "spec-unknown": (None, "sample.py --spec medusa", "invalid choice: 'medusa'"),
    "compile-drafter-no-drafter": (None, "sample.py --spec simsd --reference trajectory --compile drafter",
                                   "--compile drafter: this method runs no drafter"),
    "prompts-file-empty": (lambda d: file(d, "p.jsonl", ""), "sample.py --prompts-file {t}", "holds no prompts"),
    "prompts-file-not-json": (lambda d: file(d, "p.jsonl", '{"question": "a"}\n{not json\n'),
                              "sample.py --prompts-file {t}", "p.jsonl:2: not a JSON object with 'question'"),
    "prompts-file-no-question": (lambda d: file(d, "p.jsonl", '{"answer": "4"}\n'), "sample.py --prompts-file {t}",
                                 "p.jsonl:1: not a JSON object with 'question'"),
    "prompts-file-too-long": (lambda d: file(d, "p.jsonl", '{"question": "a"}\n' + json.dumps(dict(question="to be " * 3000))),
                              "sample.py --spec none --prompts-file {t}", "prompt 1 of"),
    "prompts-file-missing": (None, "sample.py --prompts-file {d}/none.jsonl", "not found"),
    "prompt-and-prompts-file": (lambda d: file(d, "p.jsonl", '{"question": "a"}\n'),
                                "sample.py --prompt hi --prompts-file {t}", "--prompt and --prompts-file"),
    "bench-batch-without-1": (None, "bench.py --methods threshold --batch 4,16", "--batch 4,16: give distinct sizes >= 1, 1 among"),
    "batch-0": (lambda d: file(d, "p.jsonl", '{"question": "a"}\n'), "sample.py --prompts-file {t} --batch 0",
                "--batch must be >= 1, got 0"),
    "block-size-0": (None, "sample.py --block-size 0", "--block-size must be >= 1, got 0"),
    "block-size-untrained": (None, "sample.py --block-size 16", "trained for block size(s) [4, 8, 32], not 16"),
    "block-size-untrained-plain": (None, "sample.py --spec none --block-size 16", "target was trained for block size(s)"),
    "block-size-untrained-spiffy": (None, "sample.py --spec spiffy --block-size 16", "target was trained for block size(s)"),
    "block-size-not-a-number": (None, "sample.py --block-size four", "invalid int value: 'four'"),
    "threshold-0": (None, "sample.py --threshold 0", "--threshold must be in (0, 1]"),
    "threshold-1.5": (None, "sample.py --threshold 1.5", "--threshold must be in (0, 1]"),
    "threshold-negative": (None, "sample.py --threshold -1", "--threshold must be in (0, 1]"),
    "gamma-0": (None, "sample.py --gamma 0", "--gamma must be >= 1"),
    "gamma-with-none": (None, "sample.py --spec none --gamma 2", "--gamma does nothing with --spec none"),
    "graph-with-simsd": (None, "sample.py --spec simsd --graph g.json", "--graph does nothing with --spec simsd"),
    "draft-budget-with-none": (None, "sample.py --spec none --draft-budget 4", "--draft-budget does nothing"),
    "drafter-with-spiffy": (None, "sample.py --spec spiffy --drafter models/drafter",
                            "--drafter does nothing with --spec spiffy"),
    "draft-budget-0": (None, "sample.py --spec spiffy --draft-budget 0", "--draft-budget must be >= 1"),
    "lossless-with-temporal": (None, "sample.py --verify temporal --accept lossless",
                               "--verify temporal needs --accept paper (not lossless)"),
    "gated-with-temporal": (None, "sample.py --verify temporal --accept gated",
                            "--verify temporal needs --accept paper (not gated)"),
    "gate-0": (None, "sample.py --gate 0", "--gate must be in (0, 1]"),
    "reference-unknown": (None, "sample.py --reference medusa", "invalid choice: 'medusa'"),
    "lookup-n-0": (None, "sample.py --reference lookup --lookup-n 0", "--lookup-n must be an integer >= 1"),
    "lookup-n-with-drafter": (None, "sample.py --lookup-n 2", "--lookup-n does nothing with --reference drafter"),
    "drafter-with-lookup": (None, "sample.py --reference lookup --drafter models/drafter",
                            "--drafter does nothing with --reference lookup"),
    "draft-stop-with-trajectory": (None, "sample.py --reference trajectory --draft-stop 0.5",
                                   "--draft-stop does nothing with --reference trajectory"),
    "simsd-without-reference": (lambda d: target(d), "sample.py --target {t}",
                                "--spec simsd needs reference tokens for"),
    "reference-drafter-without-one": (lambda d: target(d), "sample.py --target {t} --reference drafter",
                                      "--spec simsd needs reference tokens for"),
    "lookup-with-gated": (None, "sample.py --reference lookup --accept gated",
                          "--reference lookup runs --verify copies --accept lossless"),
    "bench-lookup-n-unused": (None, "bench.py --methods threshold --lookup-n 2", "--lookup-n does nothing"),
    "bench-tasks-unknown": (None, "bench.py --tasks poems", "invalid choice: 'poems'"),
    "gate-with-lossless": (None, "sample.py --accept lossless --gate 0.8", "--gate does nothing with --accept lossless"),
    "gate-by-default": (None, "sample.py --gate 0.8", "--gate does nothing with --accept lossless"),
    "draft-stop-2": (None, "sample.py --draft-stop 2", "--draft-stop must be in (0, 1]"),
    "accept-with-spiffy": (None, "sample.py --spec spiffy --accept paper", "--accept does nothing with --spec spiffy"),
    "unknown-accept": (None, "sample.py --accept strict", "invalid choice: 'strict'"),
    "strategy-with-threshold": (None, "sample.py --strategy sequential --threshold 0.9",
                                "--threshold applies to the threshold rule"),
    "eb-threshold-0": (None, "sample.py --strategy entropy_bounded --eb-threshold 0", "--eb-threshold must be > 0"),
    "temperature-negative": (None, "sample.py --temperature -1", "--temperature must be >= 0"),
    "top-p-2": (None, "sample.py --top-p 2", "--top-p must be in (0, 1]"),
    "top-k-0": (None, "sample.py --top-k 0", "--top-k must be >= 1"),
    "max-new-tokens-0": (None, "sample.py --max-new-tokens 0", "--max-new-tokens must be >= 1"),
    "too-many-tokens": (None, "sample.py --max-new-tokens 5000", "exceeds the context"),
    "empty-prompt": (None, "sample.py --prompt ''", "empty prompt"),
    "chat-without-template": (None, "sample.py --chat", "no chat template"),
    "unknown-device": (None, "sample.py --device tpu", "unknown --device 'tpu'"),
    "target-missing": (None, "sample.py --target {d}/nowhere", "does not exist"),
    "drafter-missing": (None, "sample.py --drafter {d}/nowhere", "does not exist"),
    # train.py
    "train-unknown-preset": (None, "train.py --preset huge", "invalid choice: 'huge'"),
    "train-seq-len-100": (data, TRAIN + " --seq-len 100", "--seq-len must be a multiple of 32"),
    "train-iters-0": (data, TRAIN + " --iters 0", "--iters must be >= 1"),
    "train-lr-negative": (data, TRAIN + " --lr -1", "--lr must be > 0"),
    "train-no-data": (None, "train.py --preset tiny --data-dir {d}/nowhere", "meta.json not found"),
    "train-meta-not-json": (lambda d: data(d, **{"meta.json": "{"}), TRAIN, "malformed JSON in"),
    "train-no-tokenizer": (lambda d: data(d, **{"tokenizer.model": None}), TRAIN, "no tokenizer.model"),
    "train-no-val-file": (lambda d: data(d, **{"val_text.bin": None}), TRAIN, "val_text.bin is missing"),
    "train-odd-token-file": (lambda d: data(d, **{"train.bin": b"\x01" * 999}), TRAIN, "odd size"),
    "train-ids-beyond-vocab": (lambda d: data(d, **{"val_arith.bin": b"\xff\xff" * 400}), TRAIN,
                               "holds token id 65535"),
    "train-resume-nothing": (data, TRAIN + " --resume", "--resume: no checkpoint at out/tiny/ckpt.pt"),
    "train-resume-corrupt": (data_and("out/tiny/ckpt.pt", b"PK\x03\x04 half a zip"), TRAIN + " --resume",
                             "--resume: cannot read"),
    "train-out-dir-a-file": (data_and("f", "not a directory"), TRAIN + " --out-dir {d}/f", "is not a directory"),
    "train-finetune-first": (data, TRAIN + " --finetune --out-dir {d}/m", "--finetune: no model in"),
    # tools/costs.py
    "costs-cache-len-negative": (None, "tools/costs.py --target tiny --device cpu --cache-len -1",
                                 "--cache-len must be >= 0, got -1"),
    "costs-cache-len-overflow": (None, "tools/costs.py --target tiny --device cpu --out {d}/t --block-size 32 "
                                 "--cache-len 1000", "--cache-len 1000 and 16 copies of 32 overflow the context (1024)"),
    "costs-target-unknown": (None, "tools/costs.py --target sdar8b --device cpu",
                             "--target sdar8b is neither a checkpoint directory nor a model shape (sdar-1.7b,"),
    # tools/calibrate.py
    "calibrate-block-size-16-0": (target, CALIBRATE + " --block-size 16,0", "--block-size must be >= 1, got 0"),
    "calibrate-block-size-16": (target, CALIBRATE + " --block-size 4,16", "not 16"),
    "calibrate-block-size-not-numbers": (target, CALIBRATE + " --block-size 4,x", "comma-separated integers"),
    "calibrate-prompts-0": (target, CALIBRATE + " --prompts 0", "--prompts must be >= 1"),
    "calibrate-budget-0": (target, CALIBRATE + " --budget 0", "--budget must be >= 1"),
    "calibrate-target-missing": (None, "tools/calibrate.py --target {d}/nowhere", "does not exist"),
    "calibrate-data-empty": (lambda d: target(d, **{"q.jsonl": ""}), CALIBRATE + " --data {t}/q.jsonl",
                             "holds no prompts"),
    "calibrate-data-no-question": (lambda d: target(d, **{"q.jsonl": '{"prompt": "2+2?"}\n'}),
                                   CALIBRATE + " --data {t}/q.jsonl", "q.jsonl:1: not a JSON object with 'question'"),
    "calibrate-data-missing": (target, CALIBRATE + " --data {d}/q.jsonl", "--data file"),
    "calibrate-chat-without-data": (target, CALIBRATE + " --chat", "--chat needs --data"),
    "calibrate-threshold-with-strategy": (target, CALIBRATE + " --threshold 0.8 --strategy sequential",
                                          "--threshold applies to the threshold rule"),
    # stop ids
    "stop-ids-not-numbers": (None, "sample.py --stop-ids 2,eos", "--stop-ids must be comma-separated integers"),
    "stop-ids-beyond-vocab": (None, "sample.py --stop-ids 2,5000", "--stop-ids: 5000 is not a token id"),
    "stop-ids-the-mask": (None, "sample.py --stop-ids 3", "--stop-ids: 3 is not a token id"),
    "bench-stop-ids-beyond-vocab": (None, "bench.py --methods plain --stop-ids 99999", "--stop-ids: 99999"),
    "config-eos-beyond-vocab": (lambda d: target(d, dict(eos_token_id=[2, 4096])), SAMPLE,
                                "eos_token_id [2, 4096] holds an id outside the vocabulary"),
    "generation-config-eos-text": (lambda d: target(d, **{"generation_config.json": '{"eos_token_id": "</s>"}'}),
                                   SAMPLE, "generation_config.json: eos_token_id must be an id"),
    # tools/prepare.py
    "prepare-arith-fraction": (None, "tools/prepare.py --out_dir {d}/data --arith_fraction 1.5",
                               "--arith_fraction must be in [0, 1)"),
    "prepare-vocab-size-small": (None, "tools/prepare.py --out_dir {d}/data --vocab_size 10", "--vocab_size must be in"),
    "prepare-vocab-size-large": (None, "tools/prepare.py --out_dir {d}/data --vocab_size 70000", "--vocab_size must be in"),
    "prepare-no-problems": (None, "tools/prepare.py --out_dir {d}/data --n_val_arith 0", "--n_val_arith must be >= 1"),
    "prepare-no-questions": (None, "tools/prepare.py --out_dir {d}/data --questions {d}/q.jsonl --n_questions 0",
                             "--n_questions must be >= 1"),
    "prepare-sdist-missing": (None, "tools/prepare.py --out_dir {d}/data --sdist {d}/none.tar.gz", "does not exist"),
    "prepare-sdist-wrong": (lambda d: file(d, "s.tar.gz", b"\x1f\x8b not the sdist"),
                            "tools/prepare.py --out_dir {d}/data --sdist {t}", "sha256 mismatch"),
    "prepare-out-dir-a-file": (lambda d: file(d, "f", "x"), "tools/prepare.py --out_dir {t}", "is not a directory"),
}
if not torch.cuda.is_available():
    CASES["cuda-without-gpu"] = (None, "sample.py --device cuda", "no GPU is available")


def tree(d):
    """path -> (size, mtime) of everything under d (links not followed)."""
    out = {}
    for root, dirs, files in os.walk(d):
        for name in dirs + files:
            st = os.lstat(os.path.join(root, name))
            out[os.path.relpath(os.path.join(root, name), d)] = (st.st_size, st.st_mtime_ns)
    return out


def command(case, d):
    """Set up the case's directory; -> its command line (tool path first)."""
    setup, cmd, _ = CASES[case]
    t = setup(d) if setup else None
    argv = [a.format(t=t, d=d).replace("''", "") for a in cmd.split()]   # '' is an empty argument
    return [str(ROOT / argv[0]), *argv[1:]]


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    """Every selected case: case -> (exit status, stdout, stderr, files before, files after,
    the case's directory)."""
    selected = [item.callspec.params["case"] for item in request.session.items
                if item.module is sys.modules[__name__] and hasattr(item, "callspec")]
    shipped, out = tree(ROOT / "models"), {}
    logs = tmp_path_factory.mktemp("logs")
    forker = Forker()   # (conftest.FORKER: a process a case, forked after the imports)
    for case in selected:
        d = tmp_path_factory.mktemp(case)
        argv = command(case, d)
        before = tree(d)
        stdout, stderr = logs / f"{case}.out", logs / f"{case}.err"
        status = forker.run(argv, d, stdout, stderr)
        out[case] = (status, stdout.read_text(), stderr.read_text(), before, tree(d), d)
    forker.close()
    assert tree(ROOT / "models") == shipped, "a case changed the shipped models"
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_line_and_writes_nothing(case, results):
    status, stdout, stderr, before, after, _ = results[case]
    assert status != 0, stdout[-500:]
    assert stdout == ""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr
    assert CASES[case][2] in lines[0]
    assert after == before, "files written or changed"


@pytest.mark.parametrize("case", ["config-layers-a-string", "threshold-1.5", "train-seq-len-100"])
def test_a_fresh_process_gives_the_same_result(case, results, tmp_path):
    """The forked cases stand for `python <tool>.py ...` started from scratch."""
    r = subprocess.run([sys.executable, *command(case, tmp_path)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    status, stdout, stderr, *_, d = results[case]
    assert (r.returncode, r.stdout, r.stderr.replace(str(tmp_path), str(d))) == (status, stdout, stderr)
