"""The grids checked in under ``sota-implementations/grids/``: each expands into runs whose
configs compose and pass their checks (a typo in a grid fails here, not hours into a run)."""

from __future__ import annotations

import pytest

from marlkit.train.config import check_config
from marlkit.train.experiment import Grid

from ._scripts import SCRIPTS
from .test_configs import SCRIPT_OF, _compose

GRIDS = sorted((SCRIPTS / "grids").glob("*.yaml"))


@pytest.mark.parametrize("path", GRIDS, ids=lambda p: p.stem)
def test_every_run_of_a_checked_in_grid_composes_and_passes_its_checks(path):
    grid = Grid.from_yaml(path)
    runs = [r for r in grid.runs() if r.seed == grid.seeds[0]]
    assert runs
    for run in runs:
        assert SCRIPT_OF[run.config] == run.script.stem, run.name
        cfg = _compose(run.config, [*run.args, f"seed={run.seed}"])
        check_config(cfg)
        assert (cfg.algorithm, cfg.seed) == (run.algorithm, run.seed), run.name


def test_the_results_grid_covers_the_table():
    """Issue 39's table: six algorithms (MASAC where the actions are continuous) on six tasks,
    three seeds, each algorithm one name in the report whatever its recipe per task."""
    grid = Grid.from_yaml(SCRIPTS / "grids" / "results.yaml")
    runs = grid.runs()
    assert grid.seeds == (0, 1, 2) and len(runs) == (5 * 6 + 3) * 3
    assert {r.algorithm for r in runs} == {"mappo", "ippo", "qmix", "vdn", "iql", "masac"}
    recipe = {(r.algorithm, r.task): r.config for r in runs}
    assert recipe["mappo", "smax/3m"] == "mappo_smax" and recipe["ippo", "smax/3m"] == "ippo_smax"
    assert recipe["qmix", "lbforaging/foraging_8x8_2p_2f_coop"] == "qmix_lbf"
    assert recipe["mappo", "vmas/balance"] == "mappo_ippo"
