"""gpu_check.sh before a GPU ever runs it: its --dry-run goes through the same phases, in the
same order, on the CPU (fp32, one prompt, the tiny-moe preset, torch.compile disabled), so its
flow, flags and the summary it reads back from its own JSON files are tested here. The dry run
has no time boxes (on a busy machine its phases take what they take); the time box itself is
tested on a phase made to overrun. The subprocess timeout only stops a hung run: the dry run
takes 45 s alone and about 2 minutes beside a two-core CPU hog. PHASES=a,b runs the named phases only."""
import json
import os
import subprocess
import sys

from conftest import ROOT

PHASES = ["lockstep", "exact", "costs", "profile", "batch", "bench", "summary"]


def gpu_check(*flags, **env):
    return subprocess.run(["bash", str(ROOT / "gpu_check.sh"), *flags], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "PYTHON": sys.executable, **env})


def test_the_dry_run_goes_through_every_phase_and_summarises_its_files(tmp_path):
    run = gpu_check("--dry-run", OUT=str(tmp_path))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    done = [line.split()[1].rstrip(":") for line in run.stdout.splitlines()
            if line.startswith("=== ") and ": exit 0 after" in line]
    assert done == PHASES
    assert run.stdout.rstrip().endswith("gpu_check: every phase passed")
    for name in ("gpu_exact_fp32.json", "gpu_bench.json", "costs_tiny-moe.json", "profile_tiny-moe.txt", "gpu_batch.jsonl"):
        assert (tmp_path / name).stat().st_size > 0
    summary = run.stdout.split("=== summary (")[1]
    assert "B=4  spiffy+threshold " in summary and "1.00x threshold" in summary   # rows read back
    assert "B=4  spiffy+threshold compiled" in summary and "x eager" in summary
    assert summary.count("lossless ok: True") == 2 and summary.count("attention sdpa") == 2
    assert summary.count("100% = eager") == 6                  # 3 methods compiled, fp32 and bf16
    assert summary.count("= fp32 eager (1 prompts)") == 3      # bf16 eager against fp32 eager
    costs = json.loads((tmp_path / "costs_tiny-moe.json").read_text())
    assert [r["rows"] for r in costs["rows"]] == [4, 16] and costs["sync_s"] > 0
    assert {"cache_len", "dtype", "device", "torch", "floor_s"} <= set(costs)
    many = json.loads(summary.split("batch: ")[1].splitlines()[0])   # static shapes' buckets, 2 prompts
    assert (many["prompts"], many["tokens"]) == (2, 16) and many["target_forwards"] > 0 and many["buckets"]
    assert "costs tiny-moe (cpu, torch " in summary and "tiny-moe, 4 rows, cache 64" in summary   # profile
    lockstep = (tmp_path / "gpu_lockstep.txt").read_text()
    assert "eager-flex: " in lockstep and " 0 differ" in lockstep
    assert "8 of 8 decoders write eager's tokens" in lockstep


def test_a_failed_phase_is_named_and_fails_the_check(tmp_path):
    """Every phase fails at once (an interpreter that passes the import check, then exits 7):
    each is still run, in order, and each is named in the last line."""
    failing = tmp_path / "python"
    failing.write_text('#!/bin/sh\ncase "$1" in -c) exit 0;; esac\nexit 7\n')
    failing.chmod(0o755)
    run = gpu_check("--dry-run", OUT=str(tmp_path), PYTHON=str(failing))
    assert run.returncode == 1
    assert [line.split()[1].rstrip(":") for line in run.stdout.splitlines()
            if line.startswith("=== ") and ": exit 7 after" in line] == PHASES
    assert run.stdout.rstrip().endswith("gpu_check: 7 phase(s) failed: " + " ".join(f"{p} (exit 7)" for p in PHASES))


def test_a_phase_past_its_time_box_is_stopped_and_named(tmp_path):
    """An interpreter that passes the import check, then sleeps: with PHASE_LIMIT=1 every phase
    is stopped after its second (exit 124) and named as timed out."""
    sleepy = tmp_path / "python"
    sleepy.write_text('#!/bin/sh\ncase "$1" in -c) exit 0;; esac\nexec sleep 60\n')
    sleepy.chmod(0o755)
    run = gpu_check("--dry-run", OUT=str(tmp_path), PYTHON=str(sleepy), PHASE_LIMIT="1")
    assert run.returncode == 1 and "=== lockstep (at most 1 s)" in run.stdout
    assert run.stdout.rstrip().endswith("gpu_check: 7 phase(s) failed: " + " ".join(
        f"{p} (exit 124, timed out)" for p in PHASES))


def test_the_dry_run_has_no_time_box(tmp_path):
    failing = tmp_path / "python"
    failing.write_text('#!/bin/sh\ncase "$1" in -c) exit 0;; esac\nexit 7\n')
    failing.chmod(0o755)
    run = gpu_check("--dry-run", OUT=str(tmp_path), PYTHON=str(failing))
    assert "=== bench (no time box)" in run.stdout and "at most" not in run.stdout


def test_the_time_boxes_fit_a_rerun_in_one_lease():
    """The boxes add up to at most 420 s (the script refuses to run otherwise), so that the
    check and a rerun fit a 15-minute GPU slot with the machine's start."""
    text = (ROOT / "gpu_check.sh").read_text()
    boxes = text.split("BOXES=(")[1].split(")")[0].split()
    assert [b.split(":")[0] for b in boxes] == PHASES
    assert sum(int(b.split(":")[1]) for b in boxes) <= 420


def test_phases_runs_only_the_named_phases_in_their_order(tmp_path):
    failing = tmp_path / "python"
    failing.write_text('#!/bin/sh\ncase "$1" in -c) exit 0;; esac\nexit 7\n')
    failing.chmod(0o755)
    run = gpu_check("--dry-run", OUT=str(tmp_path), PYTHON=str(failing), PHASES="summary,costs")
    assert [line.split()[1] for line in run.stdout.splitlines() if line.startswith("=== ")
            and "exit" not in line] == ["costs", "summary"]
    assert run.stdout.rstrip().endswith("gpu_check: 2 phase(s) failed: costs (exit 7) summary (exit 7)")


def test_bad_input_is_one_line(tmp_path):
    bare = tmp_path / "python"              # an interpreter without the packages
    bare.write_text("#!/bin/sh\nexit 1\n")
    bare.chmod(0o755)
    for flags, env, words in [(["--fast"], {}, "unknown flag --fast"),
                              (["--dry-run"], {"PYTHON": "/nonexistent/python"}, "no Python interpreter"),
                              (["--dry-run"], {"PYTHON": str(bare)}, "cannot import torch"),
                              (["--dry-run"], {"PHASE_LIMIT": "soon"}, "PHASE_LIMIT must be"),
                              (["--dry-run"], {"PHASES": "costs,sol"}, "unknown phase 'sol'"),
                              (["--dry-run"], {"ATTENTION": "math"}, "ATTENTION must be flex or sdpa")]:
        run = gpu_check(*flags, **env)
        assert run.returncode == 2 and run.stdout == ""
        assert run.stderr.count("\n") == 1 and run.stderr.startswith("error: ") and words in run.stderr


def test_the_cost_sweep_smoke_writes_one_json_a_shape(tmp_path, capsys):
    """tools/gpu_costs.py's SMOKE (the tiny shape, eager, on the CPU): a row a query-row count,
    the sync's cost and what a cost table needs; --profile: the forward by op."""
    from tools import gpu_costs
    gpu_costs.main(gpu_costs.SMOKE.split() + ["--out", str(tmp_path)])
    c = json.loads((tmp_path / "costs_tiny.json").read_text())
    assert [r["rows"] for r in c["rows"]] == [4, 16] and all(r["seconds"] > 0 for r in c["rows"])
    assert (c["cache_len"], c["dtype"], c["device"], c["attention"]) == (64, "float32", "cpu", "sdpa")
    assert c["sync_s"] > 0 and c["floor_s"] == c["weight_bytes"] / c["bandwidth_bytes_s"]
    gpu_costs.main(gpu_costs.SMOKE.split() + ["--out", str(tmp_path), "--profile", "--attention", "flex"])
    profile = (tmp_path / "profile_tiny.txt").read_text()
    assert profile.startswith("tiny, 4 rows, cache 64, float32, cpu") and "flex" in profile.splitlines()[0]
    assert "aten::mm" in profile


def test_the_cost_sweep_bad_input_is_one_line(tmp_path):
    for flags, words in [(["--shapes", "sdar-9b"], "unknown shape 'sdar-9b'"),
                         (["--rows", "4,x"], "--rows must be comma-separated integers"),
                         (["--iters", "0"], "--iters must be >= 1")]:
        run = subprocess.run([sys.executable, str(ROOT / "tools/gpu_costs.py"), "--device", "cpu", *flags,
                              "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 1 and run.stderr.count("\n") == 1 and words in run.stderr, run.stderr
