"""The documentation holds together: every relative link in the README, data/README.md, docs/ and
experiments/results/ points at a file that exists, and every ``#anchor`` into a Markdown file at one of its
headings; every dotted code name they cite (``coqe.omniglot.nets.CoQEClassifier``) exists; the README stays short
and keeps the set-up commands CI runs."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "data/README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("experiments/results/*.md")]
)
CODE_BLOCK = re.compile(r"```.*?```", flags=re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A code name the docs cite, with or without the package: `coqe.regression.nets.CoQERegressor`, `lit_icl.core.figures`.
PACKAGES = ("callbacks", "cli", "coqe", "core", "i2cl", "icssl", "metrics", "mmca", "report")
CODE_NAME = re.compile(rf"`(?:lit_icl\.)?((?:{'|'.join(PACKAGES)})(?:\.\w+)+)`")


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.*)$", CODE_BLOCK.sub("", page.read_text()), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(CODE_BLOCK.sub("", page.read_text())):
        if re.match(r"[a-z]+://|mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page.resolve()
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def resolve(dotted: str) -> bool:
    """Whether ``lit_icl.<dotted>`` names a module or an attribute reached from the longest importable module."""
    parts = f"lit_icl.{dotted}".split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_code_name_exists(page: Path) -> None:
    missing = sorted({name for name in CODE_NAME.findall(page.read_text()) if not resolve(name)})
    assert not missing, f"{page.relative_to(ROOT)} cites code that does not exist: {missing}"


def test_readme_is_short_and_keeps_the_set_up_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    assert "## Set up" in text
    assert "pip install -e '.[test]' && python -m pytest" in text  # the command .ci/run executes
    assert "python -m lit_icl fit --config configs/coqe_omniglot.yaml" in text  # the main job, offline default
