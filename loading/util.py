"""What every script shares: bad input as one line `error: ...`, JSON files read with their
name in every error, and writes that are never left half-done. No torch here:
tools/prepare.py imports it too."""
import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line on stderr, like every other bad input."""

    def error(self, message):
        self.exit(2, f"error: {message}\n")


def run(main):
    """Call main(); bad input (a ValueError or OSError) ends the process with exit status 1
    and one line `error: ...` on stderr, no traceback."""
    try:
        return main()
    except (ValueError, OSError) as e:
        sys.exit("error: " + " ".join(str(e).split()))  # a library's message may span lines


def check_positive(**flags):
    """Every flag given (not None) must be an integer >= 1."""
    for name, value in flags.items():
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


def int_list(text, flag):
    """"4,8,32" -> (4, 8, 32), for flags that take several integers."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None


def read_json(path, kind=dict):
    """The JSON object (or `kind`) in `path`; a file that is not one raises a ValueError naming it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"malformed JSON in {path}: {e}") from None
    if not isinstance(data, kind):
        want = "an object" if kind is dict else "a list"
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not {want}")
    return data


def read_prompts(path, flag, fields=("question",), start=0, stop=None):
    """Records [start:stop] of a JSONL file, each an object whose `fields` are non-empty text
    (the first, the prompt) or, for "answer", anything: -> list of (line number, record).
    Errors name the file, the line and the flag."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{flag} file {path} not found")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise ValueError(f"{flag} file {path} is not UTF-8 text") from None
    records = []
    for k, line in list(enumerate(lines, 1))[start:stop]:
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if not isinstance(rec, dict) or not all(f in rec for f in fields) \
                or not isinstance(rec[fields[0]], str) or not rec[fields[0]]:
            raise ValueError(f"{path}:{k}: not a JSON object with {' and '.join(map(repr, fields))} "
                             f"({fields[0]!r} non-empty text)")
        records.append((k, rec))
    return records


def check_writable(path, flag, folder=False):
    """Fail now, not after a long run, when `path` (a file, or a folder if `folder`) cannot be
    written: of the right kind if it exists, in a directory we may write to (for a folder yet
    to be made, its nearest existing ancestor)."""
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        raise ValueError(f"{flag} {path} is {'not ' if folder else ''}a directory")
    parent = path if folder else path.parent
    while folder and not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag} {path}: no directory {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: cannot write in {parent}")


@contextmanager
def atomic_write(path):
    """Yield a temporary path next to `path` to write to. If the block finishes, one rename
    puts the file in place; if it raises (or is interrupted), the temporary file is removed.
    Readers see the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # same directory: rename is atomic
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
