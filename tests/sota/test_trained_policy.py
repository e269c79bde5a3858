"""``trained_policy(env, run_dir)`` of every training script: the run's policy read back from its
latest checkpoint, for an env of the run's kind, greedy or sampled."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from marlkit.train import Checkpointer
from marlkit.train.scripts import env_factory

from . import test_iql, test_maddpg_iddpg, test_mappo_ippo, test_masac_isac, test_qmix_vdn
from ._scripts import run, script

BUDGETS = {
    "iql": test_iql.BUDGET,
    "maddpg_iddpg": test_maddpg_iddpg.BUDGET,
    "mappo_ippo": test_mappo_ippo.BUDGET,
    "masac_isac": test_masac_isac.BUDGET,
    "qmix_vdn": test_qmix_vdn.BUDGET,
}


def _module(name: str):
    spec = importlib.util.spec_from_file_location(f"script_{name}", script(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUDGETS))
def test_every_script_reads_its_trained_policy_back(tmp_path, name):
    run_dir = tmp_path / "run"
    budget = (*BUDGETS[name], "eval.video=false", "eval.every=0")
    run(name, run_dir, budget)
    cfg = Checkpointer(run_dir / "checkpoints").load()["config"]
    from omegaconf import OmegaConf

    env = env_factory(OmegaConf.create(cfg), 3, seed=1)()  # another batch size and seed
    trained_policy = _module(name).trained_policy
    policy = trained_policy(env, run_dir)
    td = env.reset()
    first = policy(td.clone())["agents", "action"]
    assert first.shape[:2] == (3, 3)
    assert torch.equal(policy(td.clone())["agents", "action"], first)  # deterministic
    sampled = trained_policy(env, run_dir, exploration="random")
    actions = [sampled(td.clone())["agents", "action"] for _ in range(4)]
    # explores: samples (PPO, SAC), noise (DDPG), or epsilon-greedy once eps is above 0
    explores = cfg.get("exploration", {}).get("eps_end", 1.0) > 0
    assert any(not torch.equal(a, actions[0]) for a in actions[1:]) == explores
    other = env_factory(OmegaConf.create({**cfg, "env": {**cfg["env"], "kwargs": {}}}), 2, 0)()
    with pytest.raises(
        ValueError, match=r"the run in .* trained on navigation with .*make the env"
    ):
        trained_policy(other, run_dir)  # the scenario's default: 4 agents
