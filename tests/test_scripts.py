"""Every script under experiments/ and tools/ runs at its smallest setting and prints what it
measures: each declares SMOKE (its flags for a run of seconds) and SMOKE_OUTPUT (a regular
expression its stdout and stderr must match), module constants read here without importing
the script. A script lacking either fails. Each runs in its own temporary directory, forked
from one process that has done the imports (conftest.FORKER), with torch on one thread and
torch.compile off (the flow, not the figures: gpu_check.sh's dry run does the same), and
with no network. The shipped models/ must be the same, byte for byte, after every run.

SMOKE's fields, filled in here: {tmp} the case's directory (its working directory too),
{target} a copy of the shipped target there (weights linked), {data} a tiny data directory
in tools/prepare.py's layout, {questions} a JSONL of four problems' "question", {tasks} a
folder with one lm-eval task, `arith`, on those problems, {root} the checkout.
"""
import ast
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import Forker, ROOT, tiny_corpus
from training.tasks import problems

SCRIPTS = sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("experiments/*.py"),
                                                     *ROOT.glob("tools/*.py")])
NEEDS = {"tools/plot.py": "matplotlib",    # not in requirements.txt: the picture only
         "tools/harness.py": "lm_eval"}   # in requirements.txt, marked optional


def declared(path):
    """{SMOKE, SMOKE_OUTPUT: their string values} as the script's module assigns them."""
    out = {}
    for node in ast.parse((ROOT / path).read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in ("SMOKE", "SMOKE_OUTPUT"):
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


def missing_module(path):
    """The module a script needs that this set-up lacks (NEEDS), or None."""
    name = NEEDS.get(path)
    try:
        return name and __import__(name) and None
    except ImportError:
        return name


def hashes(folder):
    """path -> sha256 of every file under folder."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def target_copy(d):
    t = d / "target"
    t.mkdir()
    for f in (ROOT / "models" / "target").iterdir():
        (t / f.name).symlink_to(f) if f.name == "model.safetensors" else shutil.copy(f, t)
    return t


def data_dir(d):
    """tiny_corpus, with the JSONL files the scripts read: train.jsonl (arithmetic records)
    and val_text.jsonl (a text with a speaker's line after 300 characters)."""
    data = tiny_corpus(d)
    (data / "train.jsonl").write_text("".join(json.dumps(dict(
        text=f"Question: {p['question']}\nAnswer: {p['answer']}", source="arith")) + "\n"
        for p in problems(4, "train")))
    text = "Enter the king, and his lords, talking of the weather and the war. " * 6
    (data / "val_text.jsonl").write_text(json.dumps(dict(text=text + "\nROMEO.\nGood morrow.",
                                                         source="shakespeare")) + "\n")
    return data


def questions(d):
    path = d / "questions.jsonl"
    path.write_text("".join(json.dumps(dict(question=f"Question: {p['question']}\nAnswer:",
                                            answer=p["answer"])) + "\n" for p in problems(4, "test")))
    return path


def tasks(d):
    """A folder holding `arith`: exact match of `#### N` on questions(d), 8 tokens a request."""
    folder = d / "tasks"
    folder.mkdir()
    task = dict(task="arith", dataset_path="json", output_type="generate_until",
                test_split="test", dataset_kwargs=dict(data_files=dict(test=str(questions(d))),
                                                       cache_dir=str(d / "cache")),
                doc_to_text="{{question}}", doc_to_target="{{answer.split('#### ')[-1]}}",
                generation_kwargs=dict(until=["Question:"], max_gen_toks=8, do_sample=False),
                metric_list=[dict(metric="exact_match", aggregation="mean", higher_is_better=True)],
                metadata=dict(version=1.0))
    (folder / "arith.yaml").write_text(json.dumps(task))   # JSON is YAML
    return folder


FIELDS = dict(target=target_copy, data=data_dir, questions=questions, tasks=tasks)


def command(path, d):
    """The script's SMOKE with its fields filled in -> argv (the script's path first)."""
    smoke = declared(path)["SMOKE"]
    fields = {k: make(d) for k, make in FIELDS.items() if "{" + k + "}" in smoke}
    return [str(ROOT / path), *(a.format(tmp=d, root=ROOT, **fields) for a in smoke.split())]


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    """Every selected script that can run here: path -> (exit status, stdout, stderr)."""
    selected = [item.callspec.params["path"] for item in request.session.items
                if item.module.__name__ == __name__ and hasattr(item, "callspec")]
    shipped, out = hashes(ROOT / "models"), {}
    env = dict(os.environ, TORCH_COMPILE_DISABLE="1", HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")
    forker = Forker("one-thread", env)
    for path in selected:
        if set(declared(path)) != {"SMOKE", "SMOKE_OUTPUT"} or missing_module(path):
            continue
        d = tmp_path_factory.mktemp(Path(path).stem)
        stdout, stderr = d.parent / f"{d.name}.out", d.parent / f"{d.name}.err"
        status = forker.run(command(path, d), d, stdout, stderr)
        out[path] = (status, stdout.read_text(), stderr.read_text())
        assert hashes(ROOT / "models") == shipped, f"{path} changed the shipped models"
    forker.close()
    return out


@pytest.mark.parametrize("path", SCRIPTS)
def test_every_script_runs_at_its_smallest_setting(path, results):
    assert set(declared(path)) == {"SMOKE", "SMOKE_OUTPUT"}, f"{path} declares no SMOKE and SMOKE_OUTPUT"
    if missing_module(path):
        pytest.skip(f"{path} needs {missing_module(path)}, not installed here (NEEDS)")
    status, stdout, stderr = results[path]
    assert status == 0, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    assert re.search(declared(path)["SMOKE_OUTPUT"], stdout + stderr), stdout[-2000:]


def test_a_script_without_its_smallest_setting_is_found(tmp_path):
    """The check can fail: a script with no SMOKE declares nothing."""
    (tmp_path / "script").write_text('"""doc"""\nimport sys\nN = 3\n')
    assert declared(tmp_path / "script") == {}
