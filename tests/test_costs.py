"""Cost tables (tools/costs.py) and counts that repeat, CPU:

- a table is measured once, by its command, and written whole (atomically); read back it is the
  same cost model; one made for another device, dtype, model shape or block size, a malformed
  one and an unreadable one are refused with one line naming the file and what is wrong, before
  anything is decoded or printed;
- the decoders never time anything: the same prompt, settings and table give the same tokens,
  forwards and stats on every run (sample.py --spec simsd and --spec spiffy, and a bench row,
  five times each, with a cost table and without); a table that prices copies steeply verifies
  fewer of them than none, and the tokens stay plain decoding's.

Run: python -m pytest tests/test_costs.py -q
"""
import json
import subprocess
import sys

import pytest
import torch

import bench
from loading import checkpoint
from measure import costs
from tools import costs as costs_script
import sample
from conftest import ROOT, make_model

TIMED = ("seconds", "tokens_per_s", "load_s", "wall_s", "warmup_s", "speedup_vs_sdar", "speedup_vs_plain",
         "speedup_vs_threshold")


def tiny_dir(tmp_path, B=4):
    path = tmp_path / "tiny"
    checkpoint.save_pretrained(make_model(n_layer=2, block_size=B), path, dtype=torch.float32)
    return path


def test_a_table_is_measured_written_and_read_back(tmp_path):
    path = tiny_dir(tmp_path)
    costs_script.main(str(path), block_sizes=(4,), repeats=1)
    model = checkpoint.from_pretrained(path, dtype=torch.float32)
    written = costs.table_path(path, model, 4)
    table = json.loads(written.read_text())
    assert table["copies"] == list(costs.COPIES) and table["seconds"] == sorted(table["seconds"])
    assert {k: table[k] for k in ("device", "dtype", "model", "block_size")} == costs.key(model, 4)
    cost, how = costs.find(path, model, 4)
    assert cost(1) == table["seconds"][0] and cost(16) == table["seconds"][-1] and written.name in how
    assert cost(1) <= cost(3) <= cost(4) <= cost(20)


def test_an_interrupted_write_leaves_the_old_table_whole(tmp_path, monkeypatch):
    path = tiny_dir(tmp_path)
    costs_script.main(str(path), block_sizes=(4,), repeats=1)
    model = checkpoint.from_pretrained(path, dtype=torch.float32)
    before = costs.table_path(path, model, 4).read_text()

    def broken(obj, **kw):
        raise KeyboardInterrupt
    monkeypatch.setattr(costs.json, "dumps", broken)
    with pytest.raises(KeyboardInterrupt):
        costs_script.main(str(path), block_sizes=(4,), repeats=1)
    assert costs.table_path(path, model, 4).read_text() == before
    assert sorted(p.name for p in path.iterdir() if p.name.startswith("cost")) == [costs.table_path(path, model, 4).name]


def good_table(model, B):
    return dict(costs.key(model, B), copies=[1, 2, 4, 8, 16], seconds=[1.0, 1.5, 2.0, 3.0, 5.0], date="today")


@pytest.mark.parametrize("change, words", [
    (dict(device="cuda: NVIDIA H200"), "measured for device 'cuda: NVIDIA H200'"),
    (dict(dtype="bfloat16"), "measured for dtype 'bfloat16'"),
    (dict(model="36 layers"), "measured for model '36 layers'"),
    (dict(block_size=32), "measured for block_size 32"),
    (dict(seconds=[2.0, 1.0, 3.0, 4.0, 5.0]), "malformed cost table"),
    (dict(copies=[1, 2]), "malformed cost table"),
    (dict(seconds="fast"), "malformed cost table"),
])
def test_a_table_for_something_else_is_refused_with_one_line(tmp_path, change, words):
    model = make_model(block_size=4)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(dict(good_table(model, 4), **change)))
    with pytest.raises(ValueError) as e:
        costs.load(path, model, 4)
    assert words in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_broken_or_unreadable_table_is_refused(tmp_path):
    model = make_model(block_size=4)
    (tmp_path / "bad.json").write_text("{not json")
    for path, words in ((tmp_path / "bad.json", "malformed cost table"), (tmp_path, "cannot be read"),
                        (tmp_path / "missing.json", "cannot be read")):
        with pytest.raises(ValueError, match=words):
            costs.load(path, model, 4)


def test_a_table_for_another_device_next_to_the_weights_is_not_used(tmp_path):
    model = make_model(block_size=4)
    path = costs.table_path(tmp_path, model, 4)
    path.write_text(json.dumps(dict(good_table(model, 4), device="cuda: NVIDIA H200")))
    cost, how = costs.find(tmp_path, model, 4)
    assert cost is None and "cuda: NVIDIA H200" in how
    assert costs.find(tmp_path / "nowhere", model, 4)[0] is None


def test_the_tables_of_several_devices_sit_side_by_side(tmp_path, monkeypatch):
    """One file a device: a table measured on another machine is kept, named when this one has
    none, and never used here; this machine's own table is found among them."""
    path = tiny_dir(tmp_path)
    model = checkpoint.from_pretrained(path, dtype=torch.float32)
    here = costs.device_name("cpu")
    monkeypatch.setattr(costs, "device_name", lambda device: "cpu: Another CPU, 2 threads")
    costs_script.main(str(path), block_sizes=(4,), repeats=1)
    theirs = costs.table_path(path, model, 4)
    monkeypatch.setattr(costs, "device_name", lambda device: here)
    cost, how = costs.find(path, model, 4)
    assert cost is None and theirs.name in how and "every copy verified" in how
    costs_script.main(str(path), block_sizes=(4,), repeats=1)
    cost, how = costs.find(path, model, 4)
    assert cost is not None and costs.table_path(path, model, 4).name in how and theirs.is_file()
    assert theirs.name == "cost_b4_float32_cpu-another-cpu-2-threads.json"


def test_sample_refuses_a_bad_table_before_printing(tmp_path):
    (tmp_path / "bad.json").write_text("[]")
    run = subprocess.run([sys.executable, "sample.py", "--spec", "spiffy", "--cost-table", str(tmp_path / "bad.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode != 0 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: malformed cost table")
    run = subprocess.run([sys.executable, "sample.py", "--spec", "none", "--cost-table", "x.json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.stderr.startswith("error: --cost-table does nothing with --spec none") and run.stdout == ""


def counts(stats):
    """Everything a run reports but its clocks."""
    return {k: v for k, v in stats.items() if k not in TIMED}


def test_cost_table_none_verifies_every_copy(tmp_path, steep_table, capsys):
    """--cost-table none, as the help says: no table, even where one sits next to the weights;
    the text a cost table gives, in fewer forwards than a steep table's."""
    model = make_model(block_size=4)
    costs.table_path(tmp_path, model, 4).write_text(json.dumps(good_table(model, 4)))
    assert costs.cost_model(tmp_path, model, 4)[0] is not None            # one is there,
    assert costs.cost_model(tmp_path, model, 4, "none")[0] is None        # and not used
    (out, st), (every, st_every) = (sample.main(spec="simsd", cost_table=t, as_json=True)
                                    for t in (steep_table, "none"))
    capsys.readouterr()
    assert every == out and st_every["nfe"] < st["nfe"]


@pytest.fixture(scope="module")
def steep_table(tmp_path_factory):
    """A table for the embedded target on this machine whose copies cost steeply: sizing cuts."""
    model = checkpoint.from_pretrained(ROOT / "models" / "target", dtype=torch.float32)
    path = tmp_path_factory.mktemp("cost") / "steep.json"
    path.write_text(json.dumps(dict(good_table(model, 4), seconds=[1.0, 4.0, 16.0, 64.0, 256.0])))
    return str(path)


@pytest.mark.parametrize("spec, kw", [("simsd", {}), ("spiffy", dict(strategy="low_confidence_static"))])
def test_sample_repeats_its_counts_exactly(spec, kw, steep_table, capsys):
    """Five runs of `python sample.py --spec SPEC` (the README's front door; Spiffy one token a
    step, where its drafts are verified): identical tokens, forwards and stats, without a table
    and with one; the steep table verifies fewer copies a forward, in more forwards."""
    runs = {}
    for table in (None, steep_table):
        got = [sample.main(spec=spec, cost_table=table, as_json=True, **kw) for _ in range(5)]
        assert all(out == got[0][0] and counts(st) == counts(got[0][1]) for out, st in got), table
        runs[table] = got[0]
    capsys.readouterr()
    assert runs[None][0] == runs[steep_table][0]                  # the same text either way
    rows = {t: sum(n * k for n, k in st["rows"].items()) / st["nfe"] for t, (_, st) in runs.items()}
    assert rows[steep_table] < rows[None] and runs[steep_table][1]["nfe"] > runs[None][1]["nfe"]


def test_a_bench_row_repeats_its_counts_exactly(capsys):
    argv = ["--methods", "simsd,spiffy", "--prompts", "2", "--max-new-tokens", "24"]
    rows = []
    for _ in range(5):
        bench.main(**bench.parse_args(argv))
        rows.append([counts(r) for r in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"]])
    assert all(r == rows[0] for r in rows)


def test_bad_table_flags_are_refused_by_the_bench(tmp_path):
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(ValueError, match="malformed cost table"):
        bench.main(**bench.parse_args(["--methods", "spiffy", "--prompts", "1", "--cost-table", str(tmp_path / "t.json")]))
