"""tools/harness.py, the lm-evaluation-harness model, end to end through lm-eval on the embedded pair:
a local task of five arithmetic problems (a JSONL file and a task YAML in tmp_path), offline.
The outputs must be sample.py's own decoding of the same prompts, cut at the `until` strings,
and the score must be computed from them."""
import contextlib
import functools
import io
import json
import re
import runpy
import sys

import pytest
import torch

import cli
import sample
from loading import util
from training.tasks import problems
from loading.tokenizer import load_tokenizer

PROBLEMS = problems(5, "test")
MAX_GEN_TOKS = 48
CUT = " Then"   # the until string that cuts most answers ("... pears. Then 15-2=13. #### 13")


@pytest.fixture
def harness(monkeypatch):
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from tools import harness
    return harness


def write_tasks(folder):
    """Two tasks on the same five problems: `arith` (until "Question:", never reached) and
    `arith_cut` (until CUT); exact match of the `#### N` answer."""
    data = folder / "arith.jsonl"
    data.write_text("".join(json.dumps(dict(question=p["question"], answer=p["answer"])) + "\n"
                            for p in PROBLEMS))
    strict = [dict(function="regex", regex_pattern=r"#### (\-?[0-9]+)"), dict(function="take_first")]
    for name, until in (("arith", ["Question:"]), ("arith_cut", [CUT, "Question:"])):
        task = dict(task=name, dataset_path="json", output_type="generate_until", test_split="test",
                    dataset_kwargs=dict(data_files=dict(test=str(data)), cache_dir=str(folder / "cache")),
                    doc_to_text="Question: {{question}}\nAnswer:",
                    doc_to_target="{{answer.split('#### ')[-1]}}",
                    generation_kwargs=dict(until=until, max_gen_toks=MAX_GEN_TOKS, do_sample=False,
                                           temperature=0.0),
                    metric_list=[dict(metric="exact_match", aggregation="mean", higher_is_better=True)],
                    filter_list=[dict(name="strict", filter=strict)], metadata=dict(version=1.0))
        (folder / f"{name}.yaml").write_text(json.dumps(task))   # JSON is YAML


@pytest.fixture(scope="module")
def sample_outputs():
    """sample.py's text for each problem's prompt, {spec: texts}: the threshold rule (SimSD's
    default) for both."""
    tok, texts = load_tokenizer(cli.DEFAULT_TARGET), {}
    for spec in ("none", "simsd"):
        for p in PROBLEMS:
            with contextlib.redirect_stdout(io.StringIO()):
                out, _ = sample.main(spec=spec, prompt=f"Question: {p['question']}\nAnswer:", as_json=True,
                                     max_new_tokens=MAX_GEN_TOKS, threshold=0.9 if spec == "none" else None)
            texts.setdefault(spec, []).append(tok.decode(out))
    return texts


def score(texts):
    """The strict exact match, computed here from the outputs."""
    found = [re.search(r"#### (\-?[0-9]+)", t) for t in texts]
    return sum(m is not None and m.group(1) == str(p["result"]) for m, p in zip(found, PROBLEMS)) / len(texts)


@pytest.mark.parametrize("spec", ["none", "simsd"])
def test_lm_eval_scores_sample_py_outputs_cut_at_until(spec, harness, tmp_path, sample_outputs):
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager
    write_tasks(tmp_path)
    args = f"spec={spec},device=cpu,max_new_tokens=64" + (",threshold=0.9" if spec == "none" else "")
    lm = get_model("sdar-spec").create_from_arg_string(args)
    stops, decode = [], lm.decode

    def recording(*a, **kw):   # why each request's decoding ended
        out, stats = decode(*a, **kw)
        stops.append(stats["stop"])
        return out, stats

    lm.decode = recording
    tasks = TaskManager(include_path=str(tmp_path), include_defaults=False)   # only these: fast
    results = lm_eval.simple_evaluate(model=lm, tasks=["arith", "arith_cut"], task_manager=tasks,
                                      log_samples=True, random_seed=None, numpy_random_seed=None,
                                      torch_random_seed=None)   # (None: the global seeds left alone)
    outputs = {name: [s["resps"][0][0] for s in sorted(results["samples"][name], key=lambda s: s["doc_id"])]
               for name in ("arith", "arith_cut")}
    want = sample_outputs[spec]
    assert want == sample_outputs["simsd" if spec == "none" else "none"]   # lossless SimSD
    assert outputs["arith"] == want
    assert outputs["arith_cut"] == [t[:t.index(CUT)] if CUT in t else t for t in want]
    assert sum(CUT in t for t in want) >= 3 and stops.count("on_block") >= 3   # cut, and stopped there
    scores = {name: results["results"][name]["exact_match,strict"] for name in outputs}
    assert all(isinstance(x, float) and x == score(outputs[name]) for name, x in scores.items())
    assert scores["arith"] > scores["arith_cut"]


def test_gen_kwargs_and_generation_only(harness):
    from lm_eval.api.instance import Instance
    lm = harness.SDARSpec(spec="none", device="cpu")
    prompt = f"Question: {PROBLEMS[0]['question']}\nAnswer:"
    request = lambda **g: Instance("generate_until", {}, (prompt, g), 0)   # noqa: E731
    full, short, cut = lm.generate_until([request(), request(max_gen_toks=4), request(until="=")])
    assert len(lm.tok.encode(short)) <= 4 and full.startswith(short) and full.startswith(cut + "=")
    for bad, message in (({"num_beams": 2}, "gen_kwargs num_beams: not supported"),
                         ({"max_gen_toks": "many"}, "gen_kwargs max_gen_toks='many': expected an integer")):
        with pytest.raises(ValueError, match=re.escape(message)):
            lm.generate_until([request(**bad)])
    for method in (lm.loglikelihood, lm.loglikelihood_rolling):
        with pytest.raises(NotImplementedError, match="generation-only"):
            method([])


@pytest.mark.parametrize("args, message", [
    ("block_size=four", "model_args block_size='four': expected an integer"),
    ("threshold=high", "model_args threshold='high': expected a number"),
    ("chat=maybe", "model_args chat='maybe': expected True or False"),
    ("temprature=0.5", "unknown model_args temprature; choose from target,"),
    ("spec=fast", "unknown --spec 'fast'; choose from none, simsd, spiffy"),
    ("spec=none,gamma=2", "--gamma does nothing with --spec none"),
    ("dtype=fp8", "model_args dtype='fp8': choose from float32, bfloat16, float16"),
    ("attention=math", "model_args attention='math': choose from flex, sdpa"),
    ("target=/nonexistent", "checkpoint directory /nonexistent does not exist"),
    ("batch_size=auto", "batch size auto: sdar-spec takes an integer >= 1"),
    ("chat=True", "sentencepiece tokenizer has no chat template"),
])
def test_bad_model_args_are_one_line(args, message, harness):
    from lm_eval.api.registry import get_model
    with pytest.raises((ValueError, OSError)) as e:
        get_model("sdar-spec").create_from_arg_string(f"device=cpu,{args}")
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_the_command_line(harness, tmp_path, monkeypatch, capsys):
    """`python tools/harness.py ARGS` is lm-eval's command line with sdar-spec known; bad input is one line."""
    from lm_eval.tasks import TaskManager
    write_tasks(tmp_path)   # (and only these tasks indexed: lm-eval's own thousands take 10 s)
    monkeypatch.setattr("lm_eval.tasks.TaskManager", functools.partial(TaskManager, include_defaults=False))
    command = ["tools/harness.py", "--model", "sdar-spec", "--tasks", "arith", "--include_path", str(tmp_path),
               "--limit", "2", "--model_args"]
    for args in ("spec=none,device=cpu", "spec=none"):     # no device given: the CPU without a GPU
        if args == "spec=none" and torch.cuda.is_available():
            continue
        monkeypatch.setattr(sys, "argv", command + [args])
        util.run(harness.main)
        assert re.search(r"\|arith\s*\|.*\|strict\s*\|.*\|exact_match\|", capsys.readouterr().out)
    monkeypatch.setattr(sys, "argv", command + ["block_size=four"])
    with pytest.raises(SystemExit) as e:
        util.run(harness.main)
    assert e.value.code == "error: model_args block_size='four': expected an integer"


def test_without_lm_eval_a_one_line_error(monkeypatch):
    for name in [m for m in sys.modules if m == "lm_eval" or m.startswith("lm_eval.")] + ["lm_eval"]:
        monkeypatch.setitem(sys.modules, name, None)   # None: `import lm_eval...` raises ImportError
    path = str(cli.ROOT / "tools" / "harness.py")
    message = "harness.py needs the lm-evaluation-harness: pip install lm-eval"
    with pytest.raises(ImportError, match=f"^{re.escape(message)}$"):
        runpy.run_path(path, run_name="harness")                   # import harness
    with pytest.raises(SystemExit, match=f"^error: {re.escape(message)}$"):
        runpy.run_path(path, run_name="__main__")                  # python tools/harness.py


def test_a_batch_gives_batch_1s_answers(harness):
    """--batch_size 3 decodes the requests together, request i from seed + i (sampled here): the
    answers batch 1 gives, and request 1's is sample.py's with --seed 1 (where this CPU's products
    keep a row's bits: serve.batch.rows_keep_their_bits)."""
    from serve.batch import rows_keep_their_bits
    if not rows_keep_their_bits():
        pytest.skip("this CPU's matrix products round a row by the product's row count: no bitwise promise")
    from lm_eval.api.instance import Instance
    prompts = [f"Question: {p['question']}\nAnswer:" for p in PROBLEMS[:5]]
    requests = [Instance("generate_until", {}, (p, {"until": ["Question:"]}), i) for i, p in enumerate(prompts)]
    one, three = (harness.SDARSpec(batch_size=n, spec="simsd", device="cpu", temperature=0.8, max_new_tokens=24)
                  for n in (1, 3))
    answers = three.generate_until(requests)
    assert answers == one.generate_until(requests) and len(set(answers)) > 1
    with contextlib.redirect_stdout(io.StringIO()):
        out, _ = sample.main(spec="simsd", prompt=prompts[1], seed=1, temperature=0.8, max_new_tokens=24, as_json=True)
    text = one.tok.decode(out)
    assert answers[1] == text[:text.index("Question:")] if "Question:" in text else text
