"""What every training script of ``sota-implementations/`` does, run end to end on a tiny budget
(subprocesses): the table of scripts and what each logs is ``_scripts.ALGORITHMS``; what is one
algorithm's own is in its ``test_<script>.py``."""

from __future__ import annotations

import pytest

from marlkit.record import read_metrics, read_video
from marlkit.train import Checkpointer

from ._scripts import (
    ALGORITHMS,
    activation_types,
    copy_run,
    finished,
    kill_after,
    run,
    summary,
)

NAMES = sorted(ALGORITHMS)

#: The columns every script's metrics hold.
COLUMNS = (
    "frames",
    "frames_per_s",
    "collection_time",
    "training_time",
    "agents/episode_reward",
    "episode_length",
    "eval/agents/episode_reward",
)


def _columns(rows: list[dict], key: str) -> list:
    return [r[key] for r in rows]


@pytest.mark.parametrize("name", NAMES)
def test_native_navigation_end_to_end(tmp_path_factory, name):
    algorithm = ALGORITHMS[name]
    done = finished(name, tmp_path_factory)
    run_dir = done.run_dir
    assert "iteration 2: frames 800" in done.stdout
    rows = read_metrics(run_dir / "metrics.csv")
    assert _columns(rows, "step") == [1, 2]
    train = [f"train/agents/{term}" for term in (*algorithm.losses, *algorithm.logged)]
    for key in (*COLUMNS, *algorithm.columns, *train):
        assert key in rows[-1], key
    assert rows[-1]["frames"] == 800
    assert rows[-1]["episode_length"] == 25
    for key, expected in algorithm.two_iterations.items():
        assert _columns(rows, key) == expected, key
    info = summary(run_dir)
    assert info["frames"] == 800 and info["env"] == "navigation"
    assert info["algorithm"] == name and info["variant"] == algorithm.variant
    assert set(info["trained"]) == set(info["random"]) >= {"agents/episode_reward"}
    for file in ("rollout.mp4", "reward.png", "videos/eval-0001.mp4", "checkpoints/latest"):
        assert (run_dir / file).stat().st_size > 0, file
    frames, _ = read_video(run_dir / "rollout.mp4")
    assert frames.shape[0] == 27  # the reset, 25 steps, the auto-reset after the last
    if algorithm.checkpoint_replay is not None:
        latest = Checkpointer(run_dir / "checkpoints").latest()
        assert latest is not None and (latest / algorithm.checkpoint_replay).exists()


@pytest.mark.parametrize("name", NAMES)
def test_a_finished_run_resumes_to_its_summary(tmp_path_factory, tmp_path, name):
    done = finished(name, tmp_path_factory)
    first = summary(done.run_dir)
    run_dir = copy_run(done.run_dir, tmp_path / "run")
    out = run(name, run_dir, (*ALGORITHMS[name].budget, f"resume={run_dir}")).stdout
    assert "iteration" not in out
    assert len(read_metrics(run_dir / "metrics.csv")) == 2
    # the evaluation env is seeded before each evaluation: the resumed run's first evaluation
    # of the same policy plays the episodes of the first run's last one
    again = summary(run_dir)
    assert again["trained"] == first["trained"] and again["random"] == first["random"]
    # Hydra's copy of the first run's config is kept; the resumed run's goes next to it
    assert "resume=" not in (run_dir / ".hydra" / "overrides.yaml").read_text()
    (resumed,) = run_dir.glob(".hydra-resumed-*")
    assert f"resume={run_dir}" in (resumed / "overrides.yaml").read_text()


@pytest.mark.parametrize("name", NAMES)
def test_heterogeneous_groups_get_a_loss_each(tmp_path, name):
    algorithm = ALGORITHMS[name]
    run_dir = tmp_path / "run"
    # train.adam_eps (issue 38) reaches each group's optimiser in every script
    run(name, run_dir, (*algorithm.budget, "env=predator_prey", "eval.video=false",
                        "train.adam_eps=1e-6"))  # fmt: skip
    optims = Checkpointer(run_dir / "checkpoints").load()["optims"]
    assert set(optims) == {"predator", "prey"}
    assert {g["eps"] for o in optims.values() for g in o["param_groups"]} == {1e-6}
    last = read_metrics(run_dir / "metrics.csv")[-1]
    for group in ("predator", "prey"):
        for term in algorithm.losses:
            assert f"train/{group}/{term}" in last
        if algorithm.group_replay is not None:  # a buffer each
            assert last[f"replay/{group}/size"] == algorithm.group_replay
        assert f"eval/{group}/episode_reward" in last


@pytest.mark.slow
@pytest.mark.parametrize("collector", ["multisync", "ray"])
@pytest.mark.parametrize("name", [n for n in NAMES if ALGORITHMS[n].other_collectors])
def test_multiprocess_and_ray_collectors(tmp_path, name, collector):
    algorithm = ALGORITHMS[name]
    run_dir = tmp_path / "run"
    run(name, run_dir, (*algorithm.budget, f"collector={collector}", "eval.video=false"))
    rows = read_metrics(run_dir / "metrics.csv")
    assert _columns(rows, "frames") == [400, 800]
    if "replay/agents/size" in algorithm.two_iterations:
        expected = algorithm.two_iterations["replay/agents/size"]
        assert _columns(rows, "replay/agents/size") == expected


@pytest.mark.parametrize("name", NAMES)
def test_a_killed_run_resumes_where_its_checkpoint_left_off(tmp_path, name):
    """One ``metrics.csv`` over the kill, the rows before the checkpoint kept as they were, and
    what the checkpoint carries (replay buffers, exploration, learned coefficients) going on
    from the saved values."""
    algorithm = ALGORITHMS[name]
    run_dir = tmp_path / "run"
    budget = (
        *algorithm.budget,
        "collector.total_frames=2000",  # five iterations
        *algorithm.resume_budget,
        "checkpoint.every=1",
        "eval.every=0",
        "eval.video=false",
    )
    kill_after(name, run_dir, budget, "iteration 3:")
    before = read_metrics(run_dir / "metrics.csv")
    assert 3 <= len(before) < 5
    run(name, run_dir, (*budget, f"resume={run_dir}"))
    rows = read_metrics(run_dir / "metrics.csv")
    assert _columns(rows, "step") == [1, 2, 3, 4, 5]
    assert _columns(rows, "frames") == [400, 800, 1200, 1600, 2000]
    assert rows[:3] == before[:3]  # the rows before the checkpoint are kept as they were
    for key, expected in algorithm.resumed.items():
        assert _columns(rows, key) == expected, key
    assert summary(run_dir)["frames"] == 2000


@pytest.mark.parametrize("name", [n for n in NAMES if ALGORITHMS[n].wrong_actions])
def test_the_wrong_kind_of_actions_is_refused(tmp_path, name):
    algorithm = ALGORITHMS[name]
    assert algorithm.wrong_actions is not None
    override, message = algorithm.wrong_actions
    with pytest.raises(AssertionError, match=message):
        run(name, tmp_path / "run", (*algorithm.budget, override))


@pytest.mark.parametrize("name", NAMES)
def test_an_unknown_env_is_named(tmp_path, name):
    with pytest.raises(AssertionError, match=r"no env registered as .no_such_env."):
        run(name, tmp_path / "run", (*ALGORITHMS[name].budget, "env.name=no_such_env"))


@pytest.mark.slow
def test_mappo_trains_on_magent2_images_by_config_alone(tmp_path):
    """``env=magent2/battle_v4``: its config's ``transforms: [flatten_observation]`` makes the
    grid images ``[13, 13, 5]`` vectors for the MLPs, in the training and evaluation envs; with
    no transform the MLP's error names the one that fixes it (issue 36)."""
    pytest.importorskip("magent2")
    budget = (
        "env=magent2/battle_v4",
        "env.num_envs=2",
        "env.max_steps=25",
        "env.kwargs.map_size=12",  # 2 agents a team
        "collector.frames_per_batch=50",
        "collector.total_frames=100",
        "train.epochs=1",
        "train.minibatch_size=50",
        "policy.num_cells=16",
        "critic.num_cells=16",
        "eval.num_envs=1",
        "eval.video=false",
    )
    run("mappo_ippo", tmp_path / "run", budget)
    info = summary(tmp_path / "run")
    assert info["env"] == "magent2/battle_v4" and info["frames"] == 100
    assert {"red/episode_reward", "blue/episode_reward"} <= set(info["trained"])
    match = r"got \[2, 2, 13, 13, 5\].*env\.transforms: \[flatten_observation\]"
    with pytest.raises(AssertionError, match=match):
        run("mappo_ippo", tmp_path / "bare", (*budget, "env.transforms=[]"))


@pytest.mark.slow  # a training run and two rollouts: about 45 s on 2 loaded cores
def test_mappo_trains_on_smax_from_its_env_config(tmp_path):
    """``env=smax/3m`` (issue 38): MAPPO trains on the native SMAX scenario from its config,
    and its policy, sampling or greedy, only picks actions ``("ally", "action_mask")``
    allows (dead allies may only stop)."""
    from omegaconf import OmegaConf

    from marlkit.train.scripts import env_factory

    from .test_trained_policy import _module

    run_dir = tmp_path / "run"
    budget = (*ALGORITHMS["mappo_ippo"].budget, "env=smax/3m", "eval.video=false")
    assert "iteration 2: frames 800" in run("mappo_ippo", run_dir, budget).stdout
    info = summary(run_dir)
    assert info["env"] == "smax/3m" and "ally/episode_reward" in info["trained"]
    cfg = OmegaConf.create(Checkpointer(run_dir / "checkpoints").load()["config"])
    env = env_factory(cfg, 8, seed=1)()
    dead = 0
    for exploration in ("random", "deterministic"):
        policy = _module("mappo_ippo").trained_policy(env, run_dir, exploration)
        td = env.reset()
        for _ in range(60):
            td = policy(td)
            action, allowed = td["ally", "action"], td["ally", "action_mask"]
            assert allowed.gather(-1, action.unsqueeze(-1)).all(), exploration
            dead += int((~td["ally", "mask"]).sum())
            _, td = env.step_and_maybe_reset(td)
    assert dead > 0  # the rollouts had dead allies, whose only allowed action is stop


def test_an_unknown_transform_is_named_before_anything_runs(tmp_path):
    with pytest.raises(
        AssertionError,
        match=r"env\.transforms\[0\]: unknown transform "
        r"'flaten_observation'.*Did you mean: flatten_observation",
    ):
        run(
            "mappo_ippo",
            tmp_path / "run",
            (*ALGORITHMS["mappo_ippo"].budget, "+env.transforms=[flaten_observation]"),
        )


#: Networks with memory (issue 37): (script, overrides) on the script's tiny budget.
MEMORY = [
    ("mappo_ippo", ("model.memory=gru", "model.memory_hidden=8", "model.seq_len=5")),
    pytest.param(
        "mappo_ippo",
        (
            "model.memory=lstm",
            "model.memory_hidden=8",
            "model.seq_len=4",
            "model.burn_in=2",
            "model.critic_memory=false",  # EPyMARL's feed-forward critic
            "critic.centralised=false",  # IPPO
        ),
        marks=pytest.mark.slow,
    ),
    pytest.param(  # PyMARL's recurrent agents: targets from the unrolled target network
        "qmix_vdn",
        ("model.memory=gru", "model.memory_hidden=8", "model.seq_len=10", "model.burn_in=2"),
        marks=pytest.mark.slow,
    ),
    pytest.param(
        "iql",
        ("model.memory=lstm", "model.memory_hidden=8", "model.seq_len=25"),
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize(
    ("name", "overrides"), MEMORY, ids=["gru", "lstm-ippo-burn-in", "qmix-gru", "iql-lstm"]
)
def test_networks_with_memory_train_evaluate_and_read_back(tmp_path, name, overrides):
    """The recurrent run trains on sequences, evaluates (its envs flag episode starts for the
    state) and its checkpoint gives back a recurrent policy; a window longer than the batch's
    time steps is refused, naming both."""
    from omegaconf import OmegaConf

    from marlkit.train.scripts import env_factory

    from .test_trained_policy import _module

    run_dir = tmp_path / "run"
    budget = (*ALGORITHMS[name].budget, *overrides, "eval.video=false")
    out = run(name, run_dir, budget).stdout
    assert "iteration 2: frames 800" in out
    last = read_metrics(run_dir / "metrics.csv")[-1]
    for term in ALGORITHMS[name].losses:
        assert abs(last[f"train/agents/{term}"]) < float("inf"), term
    assert "eval/agents/episode_reward" in last
    cfg = OmegaConf.create(Checkpointer(run_dir / "checkpoints").load()["config"])
    env = env_factory(cfg, 3, seed=1)()
    policy = _module(name).trained_policy(env, run_dir)
    td = policy(env.reset())
    assert td["agents", "rnn_state"].shape[:2] == (3, 3)  # the state travels in the TensorDict
    with pytest.raises(AssertionError, match=r"burn_in \+ seq_len = 0 \+ 200 = 200 steps"):
        run(name, tmp_path / "long", (*budget, "model.seq_len=200", "model.burn_in=0"))


@pytest.mark.slow  # two script runs (one refused at build): about 35 s on 2 loaded cores
def test_mappo_chooses_its_encoder_by_config(tmp_path):
    """``model.kind=gnn`` (issue 37): the actor and the critic read navigation's observations
    through build_model's GNN, here with a GRU each (their states apart), train, and the
    checkpoint gives back that policy; a kind the observations do not fit is refused, naming
    the shape it reads and the one it got."""
    from omegaconf import OmegaConf

    from marlkit.modules.graph import MultiAgentGNN
    from marlkit.train.scripts import env_factory

    from .test_trained_policy import _module

    run_dir = tmp_path / "run"
    model = ("model.kind=gnn", "model.memory=gru", "model.memory_hidden=8", "model.seq_len=5")
    budget = (*ALGORITHMS["mappo_ippo"].budget, *model, "eval.video=false")
    assert "iteration 2: frames 800" in run("mappo_ippo", run_dir, budget).stdout
    last = read_metrics(run_dir / "metrics.csv")[-1]
    assert abs(last["train/agents/loss_critic"]) < float("inf")
    cfg = OmegaConf.create(Checkpointer(run_dir / "checkpoints").load()["config"])
    assert cfg.model.kind == "gnn"
    env = env_factory(cfg, 3, seed=1)()
    built = _module("mappo_ippo").make_policy(env, cfg)  # the architecture the run trained
    assert any(isinstance(m, MultiAgentGNN) for m in built.modules())
    policy = _module("mappo_ippo").trained_policy(env, run_dir)
    td = policy(env.reset())
    assert td["agents", "rnn_state"].shape[:2] == (3, 3)
    match = r"model=cnn expects observations \[\*B, n, C, H, W\]; got observation \[\*B, 3, "
    with pytest.raises(AssertionError, match=match):
        run("mappo_ippo", tmp_path / "cnn", (*ALGORITHMS["mappo_ippo"].budget, "model.kind=cnn"))


@pytest.mark.slow  # a training run on a Python simulator: about 20 s on 2 loaded cores
def test_an_epymarl_task_trains_from_its_env_config(tmp_path):
    """Level-Based Foraging through ``env=lbforaging/...`` (issue 36): the config's env, its
    common reward, and evaluation videos of LBF's frames, drawn headless."""
    run_dir = tmp_path / "run"
    overrides = (*ALGORITHMS["mappo_ippo"].budget, "env=lbforaging/foraging_8x8_2p_2f_coop")
    assert "iteration 2: frames 800" in run("mappo_ippo", run_dir, overrides).stdout
    assert summary(run_dir)["env"] == "lbforaging/Foraging-8x8-2p-2f-coop-v3"
    frames, _ = read_video(run_dir / "videos" / "eval-0001.mp4")
    assert frames.shape[-1] == 3 and frames.shape[1] >= 409 and frames.std() > 0


def test_mappo_takes_agent_ids_as_epymarl_does(tmp_path):
    """``env.transforms=[agent_id]`` (EPyMARL's ``obs_agent_id``): one batch of MAPPO on LBF, its
    policy shared by the two agents reading the 12 features and 2 id columns."""
    budget = (
        "env=lbforaging/foraging_8x8_2p_2f_coop",
        "+env.transforms=[agent_id]",
        "env.num_envs=2",
        "env.max_steps=25",
        "collector.frames_per_batch=100",
        "collector.total_frames=100",
        "train.epochs=1",
        "train.minibatch_size=100",
        "policy.num_cells=16",
        "critic.num_cells=16",
        "eval.num_envs=1",
        "eval.video=false",
    )
    assert "iteration 1: frames 100" in run("mappo_ippo", tmp_path / "run", budget).stdout
    state = Checkpointer(tmp_path / "run" / "checkpoints").load()
    assert state["config"]["env"]["transforms"] == ["agent_id"]
    first = [v for k, v in state["policy"].items() if k.endswith("layers.0.weight")]
    assert [tuple(w.shape) for w in first] == [(1, 12 + 2, 16)]  # one network, shared


@pytest.mark.parametrize("name", NAMES)
def test_every_scripts_networks_take_the_configs_activation(name):
    """``policy.activation`` and ``critic.activation`` (issue 37: EPyMARL's agents and critics
    use ReLU) reach each script's policy and critic: ReLU layers and no Tanh; by default
    marlkit's Tanh, as before. (Memory, encoders and the state critic: the scripts' own
    tests.)"""
    from torch import nn

    from marlkit.modules import Tanh
    from marlkit.train.builders import q_critic
    from marlkit.train.scripts import env_factory

    from .test_configs import _compose, _script_module

    module = _script_module(name)
    has_critic = "critic" in _compose(name)
    sizes = ["policy.num_cells=8", *(["critic.num_cells=8"] if has_critic else [])]
    relu = ["policy.activation=relu", *(["critic.activation=relu"] if has_critic else [])]
    for overrides, expected in ((relu, nn.ReLU), ([], Tanh)):
        cfg = _compose(name, [*sizes, *overrides])
        env = env_factory(cfg, 2, seed=0)()
        assert activation_types(module.make_policy(env, cfg)) == {expected}
        if not has_critic:
            continue
        if hasattr(module, "make_critic"):  # MAPPO's state-value critic
            critic = module.make_critic(env, "agents", cfg.critic, cfg.model)
        else:  # MADDPG's and MASAC's Q(o, a)
            critic = q_critic(env, "agents", cfg.critic)
        assert activation_types(critic) == {expected}
