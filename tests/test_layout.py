"""The shape of the code a reader meets: imports that point down a table of layers (and no
module imports one that imports it back, even through others; a lazy import inside a function
counts too), and the size budgets of the README. Modules at the root by name (decode), in a
package by path (measure.costs)."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("loading", "measure", "serve", "training", "tools", "experiments")
MODULES = {p.stem: p for p in ROOT.glob("*.py")} | {f"{pkg}.{p.stem}": p for pkg in PACKAGES
                                                    for p in (ROOT / pkg).glob("*.py")}
SCRIPTS = ("tools", "experiments")   # scripts only: a library's short name wins (costs -> measure.costs)
SHORT = {m.rsplit(".", 1)[-1]: m for m in sorted(MODULES, key=lambda m: m.split(".")[0] not in SCRIPTS)}
LAYERS = (   # top to bottom: a module imports its own layer and those below it, never one above
    ("scripts", ("tools", "experiments")),
    ("entry points", ("sample", "bench", "train")),
    ("training's library", ("training",)),
    ("the command lines' commons", ("cli", "compiling")),
    ("the decoder as a value", ("decoder",)),
    ("speed devices, variants, measurements, batching", ("variants", "measure", "fast", "serve")),
    ("the reference", ("speculate", "spiffy", "verify", "decode")),
    ("loading, and splitting over ranks", ("loading", "parallel")),
    ("the model", ("model", "mask")),
)
BUDGETS = {"sample.py": 160, "cli.py": 380, "bench.py": 447, "model.py": 350, "train.py": 350, "speculate.py": 300,
           "spiffy.py": 300, "verify.py": 300, "variants.py": 300, "fast.py": 300,
           "serve/batch.py": 330, "parallel.py": 200}   # the batch path: 350 lines with what it changed in model.py
DECODERS = ("decode", "verify", "speculate", "spiffy", "fast", "variants", "mask", "model")   # lines <= 100 characters


def imports(path, top_level_only=True):
    """The project modules `path` imports (at module level only, unless told otherwise), by
    package path: `from measure import costs` and `from tools.costs import key` both import
    tools.costs."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names & set(MODULES)


def find_cycle(graph):
    """A list of modules forming an import cycle, or None."""
    state = {}

    def visit(m, path):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                return path[path.index(n):] + [n] if n in path else [m, n]
            if n not in state and (cycle := visit(n, path + [n])):
                return cycle
        state[m] = "done"
        return None
    for m in sorted(graph):
        if m not in state and (cycle := visit(m, [m])):
            return cycle
    return None


def layer(module):
    """The index in LAYERS of a module's layer (0 the top)."""
    return next(i for i, (_, members) in enumerate(LAYERS) if module.split(".")[0] in members)


def imports_up(modules=MODULES):
    """Every import that runs from a module to one in a layer above it: [(module, imported)]."""
    return sorted((m, n) for m, p in modules.items() for n in imports(p, top_level_only=False)
                  if layer(n) < layer(m))


def test_every_module_has_a_layer():
    assert [m for m in MODULES if not any(m.split(".")[0] in ms for _, ms in LAYERS)] == []


def test_every_import_points_down():
    assert imports_up() == []


def test_an_import_up_is_found(tmp_path):
    """The check can fail: model.py importing cli is an import up."""
    fake = tmp_path / "model.py"
    fake.write_text("import mask\nimport cli\n")
    assert imports_up({"model": fake}) == [("model", "cli")]


def test_no_import_cycles():
    graph = {m: imports(p, top_level_only=False) for m, p in MODULES.items()}
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_decoders_import_no_command_line():
    """decode, verify, speculate, spiffy, mask, model, checkpoint, tokenizer and objective never
    import the tools above them, not even lazily inside a function."""
    tools = {SHORT[m] for m in ("cli", "sample", "bench", "harness", "sol", "train", "plot", "report",
                                "calibrate", "costs")}
    for m in ("mask", "model", "checkpoint", "decode", "verify", "speculate", "spiffy", "fast",
              "variants", "tokenizer", "objective"):
        assert not imports(MODULES[SHORT[m]], top_level_only=False) & tools, m


def reading_path(*roots):
    """The lines a reader opens to learn `roots`: each module and every project module it
    imports, directly or not (lazily too), plus model.py."""
    return sum(len(MODULES[m].read_text().splitlines()) for m in closure(*roots) | {"model"})


def test_reading_paths_do_not_grow():
    """The reader's paths (2026-12-04: 920, 1,408, 1,910 and 2,197 lines; 2026-12-05, morning:
    771, 1,174, 1,244 and 1,474; evening: 647, 927, 1,063 and 1,200; later: 623, 929, 1,000 and
    1,196, calibration back in spiffy.py; 2026-12-06: 623, 929, 1,000 and 1,194, then with the
    mixture of experts in model.py more; 2026-12-07: 663, 970, 1,040 and 1,234, then with the
    one-sync walk and drafter beside their references more). The budgets, for those twins and the
    proposers to come: 690, 1,070, 1,120 and 1,330. A budget met by moving lines into another
    module the path imports is not met."""
    assert reading_path("decode") <= 690
    assert reading_path("spiffy") <= 1070
    assert reading_path("speculate") <= 1120
    assert reading_path("decode", "spiffy", "speculate") <= 1330


def test_no_line_of_what_the_commands_import_is_packed():
    """No line over 120 characters in sample.py and every module it imports, so that what the
    commands make a reader follow is not kept short by packing."""
    long = [f"{m}:{i + 1}" for m in closure("sample")
            for i, line in enumerate(MODULES[m].read_text().splitlines()) if len(line) > 120]
    assert long == []


def closure(*roots):
    """`roots` and every project module they import, directly or not (lazily too)."""
    seen, todo = set(), list(roots)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += imports(MODULES[m], top_level_only=False)
    return seen


def test_size_budgets():
    for name, budget in BUDGETS.items():
        n = len((ROOT / name).read_text().splitlines())
        assert n <= budget, f"{name} has {n} lines, over its budget of {budget}"
    for path in MODULES.values():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                assert n <= 50, f"{path.name}: {node.name} is {n} lines, over 50"
    for m in DECODERS:
        for i, line in enumerate(MODULES[m].read_text().splitlines()):
            assert len(line) <= 100, f"{m}.py:{i + 1} has {len(line)} characters, over 100"


def test_the_training_recipe_is_a_valid_script_of_train_py_steps():
    """tools/train.sh (the embedded pair from nothing) parses, and each step's flags are its
    script's (train.py's, or tools/distill.py's)."""
    import subprocess
    script = ROOT / "tools" / "train.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    flags = {kind: set(re.findall(r"--[a-z-]+", MODULES[SHORT[name]].read_text()))
             for kind, name in (("step", "train"), ("distil", "distill"))}
    lines = script.read_text().splitlines()
    for line in lines:
        kind = line.split(" ")[0]
        if kind in flags:
            assert set(re.findall(r"--[a-z-]+", line)) <= flags[kind], line
    assert sum(line.startswith("distil ") for line in lines) >= 7


def test_the_core_imports_no_speed_device_and_no_variant():
    """The reference (mask, model, decode, verify, speculate, spiffy) is complete on its own:
    fast.py's speed devices, measure/counts.py's histograms and variants.py's ablations are
    composed by the command lines."""
    for m in ("mask", "model", "decode", "verify", "speculate", "spiffy"):
        devices = {"fast", "variants", "measure.costs", "measure.counts", "measure.pricing", "decoder"}
        assert not imports(MODULES[m], top_level_only=False) & devices, m


def prose():
    """(where, text): the README, docs/design.md, docs/results.md and the shell scripts whole
    (not docs/history.md: it names the files of its day), and every
    docstring, comment and string of the project's Python files (help texts included)."""
    out = [(str(p.relative_to(ROOT)), p.read_text())
           for p in (ROOT / "README.md", ROOT / "docs" / "design.md", ROOT / "docs" / "results.md",
                     ROOT / "gpu_check.sh", ROOT / "tools" / "train.sh")]
    for p in [*ROOT.glob("*.py"), *(p for d in (*PACKAGES, "experiments", "tests", "tests/fixtures")
                                    for p in ROOT.glob(f"{d}/*.py"))]:
        text = p.read_text()
        strings = [n.value for n in ast.walk(ast.parse(text))
                   if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        comments = [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]
        out.append((str(p.relative_to(ROOT)), "\n".join(strings + comments)))
    return out


def test_every_file_and_name_the_docs_point_to_exists():
    """Each Python file the prose mentions is a file of the project: under the path given
    (tools/costs.py), or by its name alone (costs.py), and a command (python tools/costs.py)
    names it by its path from the root, where the commands run. Each `module.name` of a project
    module (backticked in the README and design notes, or in a docstring or help text; the
    module by its name, costs, or its package path, tools.costs) is a name that module defines,
    and each `package.module` is a module."""
    files = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.py") if ".git" not in p.parts}
    others = {"generate.py", "test_inner.py"}   # SDAR's own; one a test writes
    names = files | {Path(f).name for f in files} | others
    suffixes = {"py", "sh", "json", "jsonl", "md", "txt", "png", "model", "safetensors"}
    defined = {m: {n.name for n in ast.walk(ast.parse(MODULES[m].read_text()))
                   if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
               | {t.id for n in ast.parse(MODULES[m].read_text()).body if isinstance(n, ast.Assign)
                  for ts in n.targets for t in getattr(ts, "elts", [ts]) if isinstance(t, ast.Name)}
               for m in MODULES}
    missing = []
    for where, text in prose():
        for f in re.findall(r"(?<![\w/.-])((?:[\w-]+/)*[A-Za-z_]\w*\.py)\b", text):
            if f not in names and not f.startswith(("torch/", "transformers/")):
                missing.append(f"{where}: {f}")
        for f in re.findall(r"\bpython\s+(?:-u\s+)?((?:[\w-]+/)*[A-Za-z_]\w*\.py)\b", text):
            if f not in files | others:
                missing.append(f"{where}: python {f}")
        for m, name in re.findall(r"`((?:\w+\.)?\w+)\.(\w+)[`(]", text):
            module = None if m in ("model", "mask") else m if m in MODULES else SHORT.get(m)
            if module and name not in defined[module] | suffixes:
                missing.append(f"{where}: {m}.{name}")
            elif m in PACKAGES and f"{m}.{name}" not in MODULES:
                missing.append(f"{where}: {m}.{name}")
    assert not missing, "pointers to nothing: " + "; ".join(sorted(set(missing)))


def headings(text):
    """The ## and ### titles of a markdown text, outside its code blocks."""
    titles, fenced = set(), False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (m := re.match(r"#{2,3} (.+)", line)):
            titles.add(m.group(1).strip())
    return titles


def citations(text):
    """(file, title) for each citation of a section in a text: results.md or history.md, an
    optional comma, the title in double quotes; a title broken across lines (or comment lines)
    joined."""
    text = re.sub(r"\s*\n\s*(?:#+\s*)?", " ", text)
    return re.findall(r"\b(results|history)\.md(?:,\s*|\s+)\"([^\"]+)\"", text)


def unresolved(sources, docs):
    """Each citation in sources ({where: text}) whose title is no heading of the file it names
    ({"results": text, "history": text}): the heading itself, or its start cut at a comma, a
    colon or a parenthesis ("SimSD: what loses answers" names "SimSD: what loses answers, and
    what keeps them")."""
    titles = {name: headings(text) for name, text in docs.items()}
    return sorted({f"{where}: {name}.md, \"{title}\"" for where, text in sources.items()
                   for name, title in citations(text)
                   if not any(h == title or re.match(re.escape(title) + r"(,|:| \()", h)
                              for h in titles[name])})


def cited_texts():
    """Every text file of the project that may cite a section: docs, code, scripts."""
    return {str(p.relative_to(ROOT)): p.read_text() for ext in ("md", "py", "sh")
            for p in ROOT.rglob(f"*.{ext}")
            if not any(part.startswith(".") for part in p.relative_to(ROOT).parts)}


def results_docs():
    return {name: (ROOT / "docs" / f"{name}.md").read_text() for name in ("results", "history")}


def test_every_section_the_docs_and_code_cite_exists():
    """A citation by title (docs/results.md, then the title in double quotes) names a heading
    of that file, in the README, the docs, the code and the scripts alike; and each figure with a
    decimal point the citing clause gives stands in the cited section (not in the scripts: a
    clause there runs over the commands' flags)."""
    texts = cited_texts()
    assert unresolved(texts, results_docs()) == []
    assert figures_not_in_section({k: v for k, v in texts.items() if not k.endswith(".sh")}, results_docs()) == []


FIGURE = r"(?<![\w.])(?<!torch )\d+\.\d+(?!\.?\d)"   # 0.78, 2.5x (not a version: 2.13.0)


def section_text(text, title):
    """The text under the ## or ### heading `title` names (as `unresolved` matches it), to the
    next heading of its level or above."""
    out, level, fenced = None, None, False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        m = None if fenced else re.match(r"(#{2,3}) (.+)", line)
        if m and out is not None and len(m.group(1)) <= level:
            break
        if m and out is None and re.fullmatch(re.escape(title) + r"((,|:| \().*)?", m.group(2).strip()):
            out, level = [], len(m.group(1))
        elif out is not None:
            out.append(line)
    return "\n".join(out or [])


def figures_not_in_section(sources, docs):
    """Each citation whose clause (from the sentence's start, at most 300 characters) gives a
    figure the cited section does not hold: [where: title: the figures missing]."""
    found = []
    for where, text in sources.items():
        flat = re.sub(r"\s*\n\s*(?:#+\s*)?", " ", text)
        for m in re.finditer(r"\b(results|history)\.md(?:,\s*|\s+)\"([^\"]+)\"", flat):
            start = max(flat.rfind(". ", 0, m.start()), flat.rfind("; ", 0, m.start()), m.start() - 300, 0)
            section = section_text(docs[m.group(1)], m.group(2))
            if missing := [f for f in re.findall(FIGURE, flat[start:m.start()]) if f not in section]:
                found.append(f"{where}: {m.group(2)}: {', '.join(missing)}")
    return found


def test_a_citation_of_no_section_is_found():
    """The check can fail: a title no heading has, and one cut inside a word."""
    cite, hist = 'docs/results.md, ' + '"', "docs/history" + '.md "'
    docs = {"results": "# R\n## Compiled decoding\n### SimSD: what loses answers, and more\n",
            "history": "## Old\n"}
    text = {"a.sh": cite + 'Compiled decoding"', "b.sh": "# " + cite + "SimSD: what\n# loses answers\"",
            "c.sh": cite + 'Compiled deco"', "d.md": cite + 'No such section"',
            "e.md": hist + '"Old"'}
    found = unresolved(text, docs)
    assert [f.split(":")[0] for f in found] == ["c.sh", "d.md"] and "No such section" in found[1]


def test_a_cited_figure_missing_from_its_section_is_found():
    docs = {"results": "# R\n## Speed\nthreshold ran 0.91x.\n## Other\n0.55 here\n", "history": ""}
    cite = 'docs/results.md, ' + '"'
    good, bad = 'ran at 0.91x (' + cite + 'Speed")', 'ran at 0.55x (' + cite + 'Speed")'
    assert figures_not_in_section({"a.md": good, "b.md": bad}, docs) == ["b.md: Speed: 0.55"]


README_TABLE = "Decoding methods side by side"   # the section of docs/results.md that holds it


def section(text, title):
    """The text under a ## heading, to the next ##."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    return m.group(1) if m else ""


def numbers(text):
    """The numbers in a text: 5.98, 92.5 (of 92.5%), 1,109."""
    return re.findall(r"(?<![\w.,])\d+(?:,\d{3})*(?:\.\d+)?", text)


def readme_table_rows(readme):
    """[(row, its numbers)] of the markdown table under the README's "## Results"."""
    rows = [line for line in section(readme, "Results").splitlines() if line.startswith("|")]
    return [(row.split("|")[1].strip(), numbers(row)) for row in rows[2:]]


def unquoted(readme, results):
    """Each README table row whose numbers do not all stand on one line of results.md's section
    that holds the table: [(row, the numbers missing)]."""
    lines = [set(numbers(line)) for line in section(results, README_TABLE).splitlines()]
    out = []
    for row, nums in readme_table_rows(readme):
        best = min(lines, key=lambda have: len(set(nums) - have), default=set())
        if set(nums) - best:
            out.append((row, sorted(set(nums) - best)))
    return out


def test_the_readme_table_is_in_results():
    """Each number the README's results table quotes (tokens a forward, tokens/s, accuracy...)
    stands in docs/results.md, on the line of the same row, in the section that holds it."""
    readme, results = (ROOT / "README.md").read_text(), (ROOT / "docs" / "results.md").read_text()
    assert len(readme_table_rows(readme)) >= 5
    assert unquoted(readme, results) == []


def test_a_readme_figure_missing_from_results_is_found():
    readme, results = (ROOT / "README.md").read_text(), (ROOT / "docs" / "results.md").read_text()
    changed = readme.replace("5.98 / 5.17 / 6.28", "5.99 / 5.17 / 6.28", 1)
    assert changed != readme
    assert [row for row, missing in unquoted(changed, results) if missing == ["5.99"]]
