"""Cost tables (tools/costs.py) and counts that repeat, CPU:

- a table is measured once, by its command, and written whole (atomically); read back it is the
  same cost model, for any number of rows (straight lines between the measured ones, the last
  slope past them); one made for another device, dtype, model shape or block size, a malformed
  one and an unreadable one are refused with one line naming the file and what is wrong, before
  anything is decoded or printed; a model shape's tables (no weights) sit in one folder;
- a table measured on other code (its code hash) is named stale in one line by sample.py and
  bench.py, and still used; a table from before rows is read as it was, and called stale;
- the decoders never time anything: the same prompt, settings and table give the same tokens,
  forwards and stats on every run (sample.py --spec simsd and --spec spiffy, and a bench row,
  five times each, with a cost table and without); a table that prices copies steeply verifies
  fewer of them than none, and the tokens stay plain decoding's.

Run: python -m pytest tests/test_costs.py -q
"""
import ast
import bisect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bench
from loading import checkpoint
from measure import costs
from tools import costs as costs_script
import sample
from conftest import ROOT, make_model

TIMED = ("seconds", "tokens_per_s", "load_s", "wall_s", "pass_wall_s", "warmup_s", "speedup_vs_sdar", "speedup_vs_plain",
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
    assert table["rows"] == [4 * n for n in costs.COPIES] and table["seconds"] == sorted(table["seconds"])
    assert {k: table[k] for k in ("device", "dtype", "model", "block_size")} == costs.key(model, 4)
    assert (table["cache_len"], table["sync_s"], table["torch"]) == (8, None, torch.__version__)
    assert table["code"] == costs.code_hash() and table["target"] == str(path)
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
    return dict(costs.key(model, B), rows=[B * n for n in (1, 2, 4, 8, 16)], seconds=[1.0, 1.5, 2.0, 3.0, 5.0],
                cache_len=2 * B, code=costs.code_hash(), date="today")


@pytest.mark.parametrize("change, words", [
    (dict(device="cuda: NVIDIA H200"), "measured for device 'cuda: NVIDIA H200'"),
    (dict(dtype="bfloat16"), "measured for dtype 'bfloat16'"),
    (dict(model="36 layers"), "measured for model '36 layers'"),
    (dict(block_size=32), "measured for block_size 32"),
    (dict(seconds=[2.0, 1.0, 3.0, 4.0, 5.0]), "malformed cost table"),
    (dict(rows=[4, 8]), "malformed cost table"),
    (dict(rows=[4, 8, 8, 16, 32]), "malformed cost table"),
    (dict(seconds="fast"), "malformed cost table"),
    (dict(cache_len=None), "malformed cost table"),
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


def test_a_table_is_read_for_any_rows_by_interpolation():
    """Between two measured row counts the straight line; past the last, the last slope; below
    the first, the first's seconds; cost(n copies) is the table at n x B rows."""
    t = dict(block_size=4, rows=[4, 8, 16, 64], seconds=[1.0, 2.0, 4.0, 10.0])
    assert [costs.seconds_at(t, r) for r in (4, 6, 8, 12, 16, 40, 64)] == [1.0, 1.5, 2.0, 3.0, 4.0, 7.0, 10.0]
    assert costs.seconds_at(t, 112) == 16.0 and costs.seconds_at(t, 2) == 1.0
    assert [costs.cost_of(t)(n) for n in (1, 3, 10, 28)] == [1.0, 3.0, 7.0, 16.0]


def test_a_sweeps_json_with_the_key_added_is_a_table(tmp_path):
    """A GPU sweep's JSON (rows 4/16/64/256 at one cache length, a sync's seconds) with the key
    fields and the code hash added reads as a table, fresh."""
    model = make_model(block_size=4)
    sweep = dict(rows=[4, 16, 64, 256], seconds=[7e-3, 7.5e-3, 9e-3, 2e-2], cache_len=1024, dtype="float32",
                 device=costs.device_name("cpu"), torch="2.13.0", sync_s=2e-4)
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(dict(sweep, model=costs.model_shape(model.config), block_size=4,
                                    code=costs.code_hash())))
    cost = costs.load(path, model, 4)
    assert (cost(1), cost(4), cost(16), cost(10)) == (7e-3, 7.5e-3, 9e-3, 7.5e-3 + 1.5e-3 * 24 / 48)
    assert cost.stale is None and cost.table["sync_s"] == 2e-4 and cost.path == str(path)


def test_a_model_shape_with_no_weights_gets_its_tables_in_one_folder(tmp_path, monkeypatch):
    """tools/costs.py --target tiny: a random model of the preset's shape measured (repeats=1)
    into SHAPES/tiny/, or --out, and read back by --cost-table PATH for a model of that shape,
    refused for another shape; the command that measures it again is the one that wrote it."""
    monkeypatch.setattr(costs, "SHAPES", tmp_path / "shapes")
    costs_script.main("tiny", block_sizes=(4, 8), repeats=1)
    costs_script.main("tiny", block_sizes=(4,), repeats=1, out=tmp_path / "mine", cache_len=16)
    model = make_model(block_size=8)
    path = costs.table_path(tmp_path / "shapes" / "tiny", model, 8)
    cost = costs.load(path, model, 8)
    assert cost.table["rows"] == [8 * n for n in costs.COPIES] and cost(16) == cost.table["seconds"][-1]
    assert cost.table["target"] == "tiny" and cost.table["cache_len"] == 16 and cost.stale is None
    assert costs.remeasure(cost.table, path) == "python tools/costs.py --target tiny --block-size 8 --device cpu --dtype float32"
    mine = costs.table_path(tmp_path / "mine", model, 4)
    assert costs.remeasure(costs.read_table(mine), mine) == (
        f"python tools/costs.py --target tiny --out {tmp_path / 'mine'} --block-size 4 --cache-len 16 "
        "--device cpu --dtype float32")
    with pytest.raises(ValueError, match="was measured for model '2 layers"):
        costs.load(path, make_model(n_layer=3, block_size=8), 8)


def test_a_table_from_before_rows_is_read_as_before_and_called_stale(tmp_path):
    """A table of the format before rows (copies, no cache_len, no code hash) gives the very
    costs it gave before (so the decoders' counts do not move), and a warning that says how to
    measure it again."""
    for B, seconds in ((4, [4.07e-3, 4.5e-3, 5.1e-3, 6.0e-3, 7.37e-3]),
                       (32, [6.13e-3, 8.9e-3, 13.2e-3, 21.0e-3, 39.06e-3])):
        old = dict(device="cpu: AMD EPYC, 2 threads", dtype="float32", model="4 layers", block_size=B,
                   copies=[1, 2, 4, 8, 16], seconds=seconds, torch="2.13.0+cpu", date="2026-12-03")
        path = tmp_path / f"cost_b{B}_float32_old.json"
        path.write_text(json.dumps(old))
        t = costs.read_table(path)
        ns, ts = old["copies"], old["seconds"]
        for n in range(1, 41):      # the reading by copies that the tables were made for
            i = min(max(bisect.bisect_left(ns, n), 1), len(ns) - 1)
            assert costs.cost_of(t)(n) == ts[i - 1] + (ts[i] - ts[i - 1]) * (n - ns[i - 1]) / (ns[i] - ns[i - 1])
        assert t["cache_len"] == 2 * B
        assert costs.stale(t, path) == (
            f"warning: cost table {path} was measured on other code (hash none kept != {costs.code_hash()}): "
            f"re-measure with python tools/costs.py --target {path.parent} --block-size {B} "
            "--device cpu --dtype float32")


def test_the_code_hash_follows_the_code_not_its_words(tmp_path, monkeypatch):
    """A comment or a docstring edited, or a function moved to another file the hash reads, leaves
    the hash (and the tables) as they were; a changed constant or a renamed function does not."""
    was = costs.code_hash()
    for name in costs.CODE:
        (tmp_path / name).write_text((ROOT / name).read_text())
    monkeypatch.setattr(costs, "ROOT", tmp_path)
    assert costs.code_hash() == was
    fast = tmp_path / "fast.py"
    text = fast.read_text()
    fast.write_text(text.replace('"""Speed devices', '"""The speed devices', 1) + "# a comment\n")
    assert costs.code_hash() == was
    speculate = tmp_path / "speculate.py"                                  # a function moved
    moved = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "pays")
    lines, before = text.splitlines(keepends=True), speculate.read_text()
    fast.write_text("".join(lines[:moved.lineno - 1] + lines[moved.end_lineno:]))
    speculate.write_text(before + "\n\n" + "".join(lines[moved.lineno - 1:moved.end_lineno]))
    assert costs.code_hash() == was
    speculate.write_text(before)
    fast.write_text(text.replace("MARGIN = 1.1", "MARGIN = 1.2", 1))
    assert costs.code_hash() != was
    fast.write_text(text.replace("def pays(", "def worth_it(", 1))                # renamed
    assert costs.code_hash() != was


@pytest.fixture(scope="module")
def stale_table(steep_table):
    """The steep table, said to be measured on other code."""
    path = Path(steep_table).with_name("stale.json")
    path.write_text(json.dumps(dict(json.loads(Path(steep_table).read_text()), code="0123456789ab")))
    return str(path)


def test_a_table_measured_on_other_code_is_named_stale_and_still_used(steep_table, stale_table, capsys):
    """sample.py prints one line naming the file, both hashes and the command that measures it
    again; it decodes by the table as ever: the tokens and counts of the same table fresh."""
    model = checkpoint.from_pretrained(ROOT / "models" / "target", dtype=torch.float32)
    warning = costs.load(stale_table, model, 4).stale
    assert costs.load(steep_table, model, 4).stale is None and "\n" not in warning
    assert warning == (f"warning: cost table {stale_table} was measured on other code (hash 0123456789ab != "
                       f"{costs.code_hash()}): re-measure with python tools/costs.py --target "
                       f"{Path(stale_table).parent} --block-size 4 --device cpu --dtype float32")
    fresh = sample.main(spec="simsd", cost_table=steep_table, as_json=True)
    assert "warning" not in capsys.readouterr().err
    stale = sample.main(spec="simsd", cost_table=stale_table, as_json=True)
    assert capsys.readouterr().err == warning + "\n"
    assert stale[0] == fresh[0] and counts(stale[1]) == counts(fresh[1])


def test_a_bench_row_names_its_table_and_whether_it_is_stale(steep_table, stale_table, capsys):
    for table, stale in ((steep_table, False), (stale_table, True)):
        bench.main(**bench.parse_args(["--methods", "simsd,spiffy", "--prompts", "1", "--max-new-tokens", "8",
                                       "--cost-table", table]))
        out = capsys.readouterr()
        rows = {r["method"]: r for r in json.loads(out.out.strip().splitlines()[-1])["results"]}
        for m in ("simsd-lossless+threshold", "spiffy+threshold"):
            assert (rows[m]["cost_table"], rows[m]["cost_table_stale"]) == (table, stale)
        assert "cost_table" not in rows["threshold"]                # plain decoding sizes nothing
        assert out.err.count("warning: cost table") == stale


def test_a_mixture_of_experts_is_another_shape_than_the_dense_model_of_its_dimensions():
    """An MoE forward reads only the experts its rows route to: a dense model's table (same
    layers, widths and vocabulary) must not price it."""
    from model import ModelConfig
    dense = dict(n_layer=2, n_embd=64, n_head=4, n_kv_head=2, head_dim=16, intermediate_size=128)
    assert costs.model_shape(ModelConfig(**dense)) != costs.model_shape(
        ModelConfig(**dense, n_experts=8, top_k=2, moe_intermediate_size=64))
