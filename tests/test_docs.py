"""Run every ```python block of README.md and docs/*.md, in order, one namespace per file."""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    """``(line number, code)`` of each python block of a Markdown file."""
    text = path.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(1)) for m in _BLOCK.finditer(text)]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_doc_code_runs(
    path: pathlib.Path, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = python_blocks(path)
    if not blocks:
        pytest.skip(f"{path.name} has no python blocks")
    monkeypatch.chdir(tmp_path)  # blocks that write files write them here
    namespace: dict[str, object] = {"__name__": f"doc_{path.stem}"}
    for line, code in blocks:
        # Pad so that tracebacks give the line number in the Markdown file.
        compiled = compile("\n" * line + code, str(path), "exec")
        exec(compiled, namespace)


def test_readme_names_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme


def test_every_doc_page_has_code_or_is_data() -> None:
    # Every user guide page carries executed examples (benchmarks.md and results.md record
    # figures instead).
    for path in DOCS:
        if path.name in {"benchmarks.md", "results.md"}:
            continue
        assert python_blocks(path), f"{path.name} has no executed ```python example"
