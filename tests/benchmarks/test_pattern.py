"""Every script of benchmarks/ follows one pattern: the common flags of
marlkit.bench.make_parser, spelled the same; its timing through marlkit.bench, never its own
clock; a smoke test here; and its past runs in benchmarks/results/, one JSON file per benchmark
and day."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
from collections.abc import Callable

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: benchmarks/results/<benchmark>[-<section>]-<date>.json
RESULT_NAME = r"(?P<benchmark>[a-z][a-z0-9_]*)(-[\w-]+)?-(?P<date>\d{4}-\d\d-\d\d)"
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
#: The common flags each script has (the others do not apply to it).
COMMON = ("--only", "--rounds", "--round-seconds", "--threads")
FLAGS = {
    "adapters.py": COMMON,
    "adapters_magent2.py": COMMON,
    "adapters_jaxmarl.py": COMMON,
    "collectors.py": COMMON,
    "env_step.py": ("--rounds", "--round-seconds", "--threads"),
    "gpu_check.py": COMMON,
    "losses.py": COMMON,
    "modules.py": COMMON,
    "mpe_reference.py": (),
    "precision.py": COMMON,
    "render.py": ("--rounds", "--round-seconds", "--threads"),
    "replay.py": COMMON,
    "results.py": ("--threads",),
    "scaling.py": ("--threads",),
    "seeds.py": ("--only", "--rounds", "--threads"),
    "segment_tree.py": ("--rounds", "--threads"),
    "smax.py": COMMON,
    "threads.py": ("--rounds", "--round-seconds"),  # it varies the kernels' threads itself
}


def test_every_script_is_listed_and_has_a_smoke_test() -> None:
    assert sorted(FLAGS) == SCRIPTS
    here = pathlib.Path(__file__).parent
    for script in SCRIPTS:
        assert (here / f"test_{script}").exists(), f"no smoke test of benchmarks/{script}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_common_flags_are_spelled_the_same(
    script: str, run_script: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    out = run_script(script, "--help", timeout=120)
    assert out.returncode == 0, out.stderr
    present = tuple(flag for flag in COMMON if re.search(rf"^\s+{flag}\b", out.stdout, re.M))
    assert present == FLAGS[script]
    if "--threads" in present:
        assert "torch and native-kernel threads" in " ".join(out.stdout.split())


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_script_reads_the_clock_itself(script: str) -> None:
    # Timing goes through marlkit.bench (time_steps, seconds_per_call, paired, timed, ...).
    text = (ROOT / "benchmarks" / script).read_text()
    assert not re.search(r"perf_counter|time\.time\(|monotonic", text), script


def test_results_are_json_files_named_by_benchmark_and_date() -> None:
    files = sorted((ROOT / "benchmarks" / "results").iterdir())
    assert files
    names = {script.removesuffix(".py") for script in SCRIPTS}
    for path in files:
        match = re.fullmatch(
            r"(?P<benchmark>[a-z][a-z0-9_]*)(-[\w-]+)?-(?P<date>\d{4}-\d\d-\d\d)", path.stem
        )
        assert path.suffix == ".json" and match, path.name
        data = json.loads(path.read_text())
        assert data["benchmark"] == match["benchmark"] and match["benchmark"] in names, path.name
        # A run printed by a script has the shared header; a transcribed one says so.
        date = data["environment"]["date"] if "environment" in data else data["date"]
        assert date.startswith(match["date"]), path.name
        assert "environment" in data or "transcribed from docs/" in data["source"], path.name
