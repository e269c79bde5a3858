"""The Hydra configs of ``sota-implementations/configs``: each composes, with every env group."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from marlkit.record import read_metrics
from marlkit.train.config import ConfigError, check_config, register_resolvers

from ._scripts import SCRIPTS, run, script, summary
from .test_mappo_ippo import BUDGET

CONFIGS = SCRIPTS / "configs"
TOP = sorted(p.stem for p in CONFIGS.glob("*.yaml"))
ENVS = sorted(
    str(p.relative_to(CONFIGS / "env").with_suffix("")) for p in CONFIGS.glob("env/**/*.yaml")
)


def _compose(name: str, overrides: list[str] | None = None):
    register_resolvers()  # as the scripts do at import
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name=name, overrides=overrides or [])


@pytest.mark.parametrize("name", TOP)
def test_every_config_composes_with_every_env(name):
    for env in ENVS:
        cfg = _compose(name, [f"env={env}"])
        assert cfg.env.name == OmegaConf.load(CONFIGS / "env" / f"{env}.yaml").name
        assert cfg.collector.frames_per_batch > 0 and cfg.collector.total_frames > 0
        assert cfg.seed == 0 and "run_dir" in cfg


def test_the_fast_recipe_changes_the_budget_and_networks_only():
    base, fast = _compose("mappo_ippo"), _compose("mappo_fast")
    assert (fast.policy.num_cells, fast.critic.num_cells) == (64, 64)
    assert (fast.env.num_envs, fast.collector.frames_per_batch, fast.collector.total_frames) == (
        120,
        12000,
        216000,
    )
    assert (fast.train.epochs, fast.train.minibatch_size, fast.train.lr) == (15, 1200, 3e-3)
    # everything else is TorchRL's tutorial recipe, as in mappo_ippo.yaml
    assert fast.loss == base.loss and fast.critic.centralised and fast.policy.share_params
    assert fast.train.max_grad_norm == base.train.max_grad_norm


def test_the_fast_recipe_runs(tmp_path):
    run_dir = tmp_path / "run"
    out = run("mappo_ippo", run_dir, BUDGET, config="mappo_fast").stdout
    assert "iteration 2: frames 800" in out
    assert [r["step"] for r in read_metrics(run_dir / "metrics.csv")] == [1, 2]
    assert summary(run_dir)["env"] == "navigation"


def test_the_mpe_qmix_recipe_changes_replay_and_exploration_only():
    base, mpe = _compose("qmix_vdn"), _compose("qmix_mpe")
    assert mpe.env.name == "pettingzoo/mpe2.simple_spread_v3" and mpe.env.num_envs == 40
    assert (mpe.buffer.capacity, mpe.collector.total_frames) == (60000, 240000)
    assert (mpe.exploration.eps_init, mpe.exploration.eps_end) == (1.0, 0.05)
    assert mpe.exploration.annealing_fraction == 0.3 and mpe.loss.double_dqn
    for section in ("policy", "train"):
        assert mpe[section] == base[section]
    assert {k: v for k, v in mpe.loss.items() if k != "double_dqn"} == {
        k: v for k, v in base.loss.items() if k != "double_dqn"
    }


def test_the_mpe_qmix_recipe_runs(tmp_path):
    run_dir = tmp_path / "run"
    budget = (
        "env.num_envs=4",
        "collector.frames_per_batch=200",  # 4 envs x 50 steps: two MPE episodes each
        "collector.total_frames=400",
        "buffer.capacity=400",
        "train.epochs=1",
        "train.minibatch_size=100",
        "policy.num_cells=16",
        "loss.mixing_embed_dim=4",
        "eval.num_envs=2",
        "eval.video=false",
    )
    out = run("qmix_vdn", run_dir, budget, config="qmix_mpe").stdout
    assert "iteration 2: frames 400" in out
    info = summary(run_dir)
    assert info["env"] == "pettingzoo/mpe2.simple_spread_v3" and info["frames"] == 400
    assert info["trained"]["episode_length"] == 25.0


def test_the_demo_recipe_evaluates_64_envs_and_films_4(tmp_path):
    """``make demo``'s config, on the tiny budget: the summary's evaluation covers 64 envs,
    ``rollout.mp4`` tiles the first 4 of them."""
    import marlkit
    from marlkit.record import read_video
    from marlkit.train import evaluate

    cfg = _compose("demo")
    assert (cfg.eval.num_envs, cfg.eval.video_envs, cfg.env.kwargs.n_agents) == (64, 4, 4)
    # mappo_fast's recipe for twice its frames (about three minutes on 2 cores)
    assert (cfg.policy.num_cells, cfg.train.lr, cfg.collector.total_frames) == (64, 3e-3, 432000)
    run_dir = tmp_path / "run"
    demo_eval = ("eval.every=0", "eval.num_envs=64")  # TINY's eval.num_envs=2 undone
    out = run("mappo_ippo", run_dir, (*BUDGET, *demo_eval), config="demo").stdout
    assert f"outputs in {run_dir}/ (metrics.csv, reward.png, rollout.mp4, summary.json)" in out
    info = summary(run_dir)
    assert info["algorithm"] == "demo" and info["frames"] == 800
    assert info["trained"]["episode_length"] == 25.0 and info["eval_episodes"] == 64
    assert (
        read_metrics(run_dir / "metrics.csv")[-1]["eval/agents/episode_reward"]
        == (info["trained"]["agents/episode_reward"])
    )
    four = evaluate(
        marlkit.make("navigation", num_envs=4, n_agents=4, seed=0),
        None,
        steps=1,
        video=tmp_path / "four.mp4",
        env_indices="all",
        tile=True,
    ).video
    frames, _ = read_video(run_dir / "rollout.mp4")
    assert frames.shape[0] == 27  # the reset, 25 steps, the auto-reset after the last
    assert frames.shape[1:] == read_video(four)[0].shape[1:]


def _rules(name: str) -> dict:
    """The ``RULES`` of ``sota-implementations/<name>/<name>.py`` (imported as a module: its
    Hydra entry point is defined, not run)."""
    spec = importlib.util.spec_from_file_location(f"_rules_{name}", script(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.RULES


#: which script runs each top config
SCRIPT_OF = {
    "demo": "mappo_ippo",
    "mappo_fast": "mappo_ippo",
    "mappo_ippo": "mappo_ippo",
    "qmix_vdn": "qmix_vdn",
    "qmix_mpe": "qmix_vdn",
    "iql": "iql",
    "maddpg_iddpg": "maddpg_iddpg",
    "masac_isac": "masac_isac",
}


@pytest.mark.parametrize("name", TOP)
def test_every_config_passes_its_scripts_checks(name):
    check_config(_compose(name), _rules(SCRIPT_OF[name]))


@pytest.mark.parametrize(
    ("name", "override", "message"),
    [
        # the string "no" is true for Python: it trained MAPPO for an IPPO run
        (
            "mappo_ippo",
            "critic.centralised=no",
            r"critic.centralised must be a bool, got str: 'no'",
        ),
        ("qmix_vdn", "loss.double_dqn=no", r"loss.double_dqn must be a bool, got str: 'no'"),
        ("masac_isac", "loss.fixed_alpha=yes", r"loss.fixed_alpha must be a bool, got str"),
        # torch's TypeError, after the first batch, named no key
        ("mappo_ippo", "train.lr=abc", r"train.lr must be a number, got str: 'abc'"),
        ("mappo_ippo", "train.max_grad_norm=abc", r"train.max_grad_norm must be a number"),
        ("iql", "train.minibatch_size=abc", r"train.minibatch_size must be an int >= 1, got str"),
        # a negative norm flips every update; zero epochs or updates trained nothing
        (
            "mappo_ippo",
            "train.max_grad_norm=-1",
            r"train.max_grad_norm must be a finite number > 0",
        ),
        ("mappo_ippo", "train.epochs=0", r"train.epochs must be an int >= 1, got 0"),
        ("qmix_vdn", "train.epochs=1.5", r"train.epochs must be an int >= 1, got float: 1.5"),
        ("maddpg_iddpg", "train.num_updates=0", r"train.num_updates must be an int >= 1, got 0"),
        # -1 ran forever in MAPPO and was refused in QMIX
        ("mappo_ippo", "collector.total_frames=-1", r"collector.total_frames must be an int >= 1"),
        ("mappo_ippo", "loss.entropy_coef=-0.1", r"loss.entropy_coef must be a finite number >= 0"),
        ("qmix_vdn", "buffer.capacity=0", r"buffer.capacity must be an int >= 1, got 0"),
        ("mappo_ippo", "threads=abc", r"threads must be an int >= 1 or None, got str"),
    ],
)
def test_a_bad_value_is_refused_with_its_key(name, override, message):
    with pytest.raises(ConfigError, match=message):
        check_config(_compose(name, [override]), _rules(SCRIPT_OF[name]))


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        # it sampled minibatches of 64 with replacement from 10 transitions
        (
            "maddpg_iddpg",
            ["buffer.size=10"],
            r"train.minibatch_size \(256\) is larger than buffer.size \(10\)",
        ),
        (
            "qmix_vdn",
            ["buffer.capacity=50"],
            r"train.minibatch_size \(400\) is larger than buffer.capacity \(50\)",
        ),
    ],
)
def test_a_minibatch_larger_than_the_buffer_is_refused_before_anything_runs(
    tmp_path, name, overrides, message
):
    run_dir = tmp_path / "run"
    with pytest.raises(AssertionError, match=message):
        run(name, run_dir, overrides)
    assert not (run_dir / "metrics.csv").exists()  # refused before the first batch


def test_a_script_refuses_a_bad_value_before_collecting(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(AssertionError, match=r"critic.centralised must be a bool, got str: 'no'"):
        run("mappo_ippo", run_dir, (*BUDGET, "critic.centralised=no"))
    assert not (run_dir / "metrics.csv").exists()


def test_resume_true_without_a_folder_is_refused_before_hydra_makes_one(tmp_path):
    # resume=true made Hydra create a folder True/ for the run (run_dir: ${run_folder:...})
    # before failing in the script with a bare TypeError; now the resolver refuses it
    cfg = _compose("mappo_ippo", ["resume=true"])
    with pytest.raises(Exception, match=r"resume takes the folder of the run to go on with"):
        _ = cfg.run_dir
    assert _compose("mappo_ippo", ["resume=runs/x"]).run_dir == "runs/x"
    assert str(_compose("mappo_ippo").run_dir).startswith("runs/mappo_ippo/")
    argv = [sys.executable, str(script("mappo_ippo")), "resume=true"]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "resume takes the folder" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no True/ (nor any run folder)
