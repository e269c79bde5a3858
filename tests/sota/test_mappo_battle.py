"""``configs/mappo_battle.yaml`` (IPPO with a CNN on MAgent2 battle, both teams learning) and
``benchmarks/analysis/battle_eval.py``, the evaluation of its trained team against a random and
a still opponent: a run of two tiny iterations, then the evaluation of its folder."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from marlkit.train import Checkpointer
from marlkit.train.config import ConfigError, check_config

from ._scripts import ROOT, run
from .test_configs import _compose

pytest.importorskip("magent2")


def _battle_eval():
    path = ROOT / "benchmarks" / "analysis" / "battle_eval.py"
    spec = importlib.util.spec_from_file_location("_battle_eval", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mappo_battle_is_ippo_with_a_cnn_on_a_small_battle():
    cfg = _compose("mappo_battle")
    assert cfg.env.name == "magent2/battle_v4" and cfg.env.kwargs.map_size == 16
    assert list(cfg.env.transforms) == ["pixels"]  # [9, 13, 13] images (minimap_mode)
    assert cfg.env.kwargs.minimap_mode and cfg.env.kwargs.attack_penalty == 0
    assert cfg.model.kind == "cnn" and not cfg.critic.centralised
    assert (list(cfg.model.cnn_cells), cfg.model.kernel_size, cfg.model.stride) == ([16, 16], 3, 2)
    assert cfg.env.max_steps == cfg.env.kwargs.max_cycles


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.cnn_cells=[16,0]", "model.cnn_cells must be an int >= 1, got 0"),
        ("model.cnn_cells=[]", "model.cnn_cells must name at least one conv layer, got []"),
        ("model.stride=0", "model.stride must be an int >= 1, got 0"),
        ("model.padding=-1", "model.padding must be an int >= 0, got -1"),
    ],
)
def test_the_cnn_keys_are_checked_by_name(override, message):
    with pytest.raises(ConfigError) as refused:
        check_config(_compose("mappo_battle", [override]))
    assert message in str(refused.value)


def test_still_is_magent2s_no_op():
    import marlkit

    ev = _battle_eval()
    env = marlkit.make("magent2/battle_v4", map_size=12, num_envs=1, seed=0, state=False)
    td = env.reset()
    for action, moves in ((ev.STILL, False), (ev.STILL + 1, True)):  # 7: one cell east
        for g in ("red", "blue"):
            td[g, "action"] = torch.full((1, 2), action)
        after = env.step(td)["next"]
        for g in ("red", "blue"):
            assert torch.equal(after[g, "observation"], td[g, "observation"]) is not moves
            assert float(after[g, "reward"].sum()) == pytest.approx(-0.005 * 2)  # no attack
        td = env.reset()
    env.close()


def test_survivors_are_the_agents_that_see_themselves():
    import marlkit

    ev = _battle_eval()
    env = marlkit.make("magent2/battle_v4", map_size=12, num_envs=2, seed=0, state=False)
    td = env.rollout(30, break_when_any_done=False)
    obs = td["next", "red", "observation"]  # [2, 30, 2, 13, 13, 5]
    alive = ev.own_presence(obs, obs.shape[-3:])
    assert alive.all()  # nobody dies in 30 random steps on this map: every agent sees itself
    chw = obs.permute(0, 1, 2, 5, 3, 4)
    flat = obs.flatten(-3)
    assert torch.equal(ev.own_presence(chw, obs.shape[-3:]), alive)
    assert torch.equal(ev.own_presence(flat, obs.shape[-3:]), alive)
    assert not ev.own_presence(torch.zeros_like(obs), obs.shape[-3:]).any()  # a dead agent's
    with pytest.raises(ValueError, match=r"observations \(2, 7\) are not MAgent2's"):
        ev.own_presence(torch.zeros(2, 7), obs.shape[-3:])
    env.close()


@pytest.mark.slow  # ~60 s
def test_mappo_battle_runs_and_its_team_is_evaluated_against_random_and_still(tmp_path):
    run_dir = tmp_path / "run"
    budget = (
        "env.num_envs=2",
        "env.max_steps=20",
        "env.kwargs.max_cycles=20",
        "collector.frames_per_batch=40",  # 2 envs x 20 steps
        "collector.total_frames=80",
        "train.minibatch_size=20",
        "train.epochs=1",
        "eval.every=0",
        "eval.video=false",
    )
    out = run("mappo_ippo", run_dir, budget, config="mappo_battle").stdout
    assert "iteration 2: frames 80" in out
    weights = Checkpointer(run_dir / "checkpoints").load()["policy"]
    convs = [tuple(v.shape) for k, v in weights.items() if v.dim() == 4]
    assert convs[:2] == [(16, 9, 3, 3), (16, 16, 3, 3)]  # red's actor: 9 -> 16 -> 16, 3 x 3

    ev = _battle_eval()
    # the run trained without the attack penalty; MAgent2's own (-0.1) in the evaluation
    out = ev.evaluate_run(
        run_dir, episodes=4, num_envs=2, seed=0, env_kwargs={"attack_penalty": -0.1}
    )
    assert out["env_kwargs"]["attack_penalty"] == -0.1 and out["env_kwargs"]["minimap_mode"]
    assert out["training"]["env_kwargs"]["attack_penalty"] == 0.0  # what it trained with
    assert out["training"]["config_name"] == "mappo_battle"
    assert out["training"]["frames"] == 80 and out["training"]["iterations"] == 2
    res = out["pairings"]
    assert sorted(res) == sorted(
        f"{s}_vs_{o}" for s in ("greedy", "sampled", "random", "still") for o in ("random", "still")
    )
    still = res["still_vs_still"]
    # standing still costs step_reward (-0.005) a step and nothing else; nobody dies
    assert still["return_per_agent"] == pytest.approx(-0.005 * 20)
    assert (still["survivors"], still["opponent_survivors"], still["draw_rate"]) == (6, 6, 1.0)
    # a random team attacks empty cells (attack_penalty -0.1) about 8 steps in 21
    assert res["random_vs_random"]["return_per_agent"] < still["return_per_agent"] - 0.3
    assert res["still_vs_random"]["opponent_return_per_agent"] < -0.3
    with pytest.raises(ValueError, match="only the rewards may differ"):
        ev.evaluate_run(run_dir, episodes=2, num_envs=2, env_kwargs={"map_size": 20})
    for figures in res.values():
        assert figures["episodes"] == 4 and figures["agents_per_team"] == [6, 6]
        assert 0 <= figures["survivors"] <= 6 and 0 <= figures["opponent_survivors"] <= 6
        rates = figures["win_rate"] + figures["draw_rate"] + figures["loss_rate"]
        assert rates == pytest.approx(1.0)
