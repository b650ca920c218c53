"""The conftest guard: a test that leaves torch._dynamo.config changed fails, and the tests
after it see torch's own settings again. Run as a pytest of its own, in a subprocess, so that
the leaks below stay inside it."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

INNER = '''
import torch
cfg = torch._dynamo.config
NAME = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
DEFAULT = getattr(cfg, NAME)

def test_a_leak_by_assignment():
    setattr(cfg, NAME, 2)

def test_the_old_monkeypatch(monkeypatch):   # pytest >= 9.2 deletes the entry on undo
    monkeypatch.setattr(cfg, NAME, 2)

def test_a_scoped_patch():
    with cfg.patch(**{NAME: 2}):
        assert getattr(cfg, NAME) == 2

def test_later_tests_see_the_default():
    assert getattr(cfg, NAME) == DEFAULT
'''


def test_the_guard_fails_a_test_that_leaks_a_compiler_setting(tmp_path):
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(INNER)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                          "test_inner.py"], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))   # the copied conftest imports model
    report = {line.split()[1].split("::")[1]: line.split()[0] for line in run.stdout.splitlines()
              if line.startswith(("PASSED ", "ERROR "))}
    assert report["test_a_leak_by_assignment"] == "ERROR", run.stdout
    assert "left torch._dynamo.config changed" in run.stdout
    old_deletes = pytest.version_tuple >= (9, 2)
    assert report["test_the_old_monkeypatch"] == ("ERROR" if old_deletes else "PASSED"), run.stdout
    assert report["test_a_scoped_patch"] == "PASSED", run.stdout
    assert report["test_later_tests_see_the_default"] == "PASSED", run.stdout
