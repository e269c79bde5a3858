"""Guide pages whose examples start worker processes: each python block, copied into a file of
its own, runs as a script (``python file.py``), the way a user takes it. tests/test_docs.py runs
the blocks in this process, where ``__name__`` is not ``"__main__"``; here a block's
``if __name__ == "__main__":`` part runs, and the spawned workers import the file again."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
#: Pages whose blocks start processes.
PAGES = ["docs/batched.md", "docs/collectors.md"]


def _blocks() -> list[object]:
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text()
        for m in _BLOCK.finditer(text):
            line = text[: m.start()].count("\n") + 1
            found.append(pytest.param(page, line, m.group(1), id=f"{page}:{line}"))
    return found


@pytest.mark.parametrize(("page", "line", "code"), _blocks())
def test_a_copied_block_runs_as_a_script(
    tmp_path: pathlib.Path, page: str, line: int, code: str
) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    where = f"{page}, the block at line {line}, run as a script"
    assert out.returncode == 0, f"{where} exited {out.returncode}:\n{out.stderr[-4000:]}"
    assert "Traceback" not in out.stderr, f"{where} printed tracebacks:\n{out.stderr[-4000:]}"
