"""What the repository keeps: results as tidy tables, not run folders, and no absolute path of the machine that
wrote a file (run folders, checkouts, home folders) in any tracked text file."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
#: Where our machines and common clusters keep checkouts, runs and homes. ``/tmp/...`` in an example command is
#: an example; these are where a file was made.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|check|home/\w+|Users/\w+|scratch|mnt)/[\w.-]")


def tracked() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    return subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True,
                          check=True).stdout.strip("\0").split("\0")


def test_results_are_tables_not_run_folders() -> None:
    results = [f for f in tracked() if f.startswith("experiments/results/")]
    assert 0 < len(results) <= 100, f"{len(results)} tracked files under experiments/results/"
    assert all(f.endswith((".md", ".csv")) for f in results), [f for f in results if not f.endswith((".md", ".csv"))]


def test_no_tracked_text_file_names_a_machine_path() -> None:
    found = []
    for name in tracked():
        path = ROOT / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary: the legacy checkpoints keep the folders they were saved in, by design
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
            if MACHINE_PATH.search(line) or str(ROOT) in line:
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


#: Examples with ``{r}`` for the root slash, so that this file does not hold the paths it looks for.
EXAMPLES = [
    ("--out {r}work{r}lab{r}runs{r}x", True), ("save_dir: {r}root/runs", True), ("({r}home/alice/lit_icl)", True),
    ("python bench.py --out {r}tmp/gpu_dry.md", False), ("https://example.org{r}work{r}x", False),
    ("configs{r}work{r}a.yaml", False), ("~{r}work{r}x", False), ("{r}Users/bob/x", True),
]


@pytest.mark.parametrize("line, machine", EXAMPLES)
def test_the_machine_path_pattern(line: str, machine: bool) -> None:
    assert bool(MACHINE_PATH.search(line.format(r="/"))) is machine


#: Lines a data module may have of its own (code, not its docstrings, comments or blank lines): the shared
#: plumbing (batch and set sizes, seeds, workers, loaders, stand-ins built on first use) lives in
#: ``lit_icl.core.data``, so a paper's data module says only how its datasets are made.
DATA_MODULE_LINES = 80


def own_code_lines(source: str, node: ast.ClassDef) -> int:
    """Non-blank, non-comment lines of a class that are not docstrings."""
    docs: set[int] = set()
    for inner in ast.walk(node):
        scope = isinstance(inner, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))
        first = inner.body[0] if scope and inner.body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            docs.update(range(first.lineno, first.end_lineno + 1))
    lines = source.splitlines()[node.lineno - 1: node.end_lineno]
    return sum(1 for number, line in enumerate(lines, start=node.lineno)
               if number not in docs and line.strip() and not line.strip().startswith("#"))


def data_module_sizes() -> dict[str, int]:
    sizes = {}
    for path in sorted((ROOT / "lit_icl").rglob("*.py")):
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ClassDef) and node.name.endswith("DataModule") and any(
                    isinstance(b, (ast.Name, ast.Attribute)) for b in node.bases) and not any(
                    getattr(b, "id", None) == "Protocol" for b in node.bases):
                sizes[f"{path.relative_to(ROOT)}:{node.name}"] = own_code_lines(source, node)
    return sizes


def test_data_modules_state_only_how_their_data_is_made() -> None:
    sizes = data_module_sizes()
    assert len(sizes) >= 8, sorted(sizes)  # every paper's data modules were found
    long = {name: n for name, n in sizes.items() if n > DATA_MODULE_LINES}
    assert not long, f"data modules over {DATA_MODULE_LINES} lines of their own code: {long}"


def test_own_code_lines_leaves_out_docstrings_and_comments() -> None:
    source = 'class A:\n    """Doc\n    more."""\n\n    # why\n    x = 1\n    def f(self):\n        """Doc."""\n        return 2\n'
    node = ast.parse(source).body[0]
    assert own_code_lines(source, node) == 4  # class line, x = 1, def, return


@pytest.mark.parametrize("script", ["lit_icl.coqe.omniglot.glyphs", "lit_icl.i2cl.build", "lit_icl.icssl.build",
                                    "lit_icl.mmca.avmnist.build"])
def test_no_module_imports_a_build_script_at_import_time(script: str) -> None:
    """``python -m <script>`` runs the module as a script after importing its package; had the package (or anything
    it imports) imported the script already, runpy would warn about two copies of it on every build. So the rest of
    lit_icl imports these only inside the functions that build (read from the source, without a fresh interpreter)."""
    import ast

    package = ROOT / "lit_icl"
    own = package.joinpath(*script.split(".")[1:]).with_suffix(".py")
    assert own.is_file()
    eager = []
    for path in package.rglob("*.py"):
        if path == own:
            continue
        for node in ast.parse(path.read_text()).body:  # module level only: imports inside functions are lazy
            names = ([node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                     if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if script in names:
                eager.append(str(path.relative_to(package)))
    assert not eager, f"{script} is imported at module level by {eager}"
