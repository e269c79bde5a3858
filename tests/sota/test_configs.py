"""The Hydra configs of ``sota-implementations/configs``: each composes with every env group
into its script's schema (``marlkit.train.config``), gives the values it gave before the
schemas, and refuses a value of the wrong type or range, naming its key."""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import shutil
import subprocess
import sys
import tarfile
import types

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import _forked
from marlkit.record import read_metrics
from marlkit.train.config import ConfigError, RunConfig, check_config, register_resolvers

from ._scripts import ROOT, SCRIPTS, command, run, script, summary
from ._scripts import env as script_env
from .test_mappo_ippo import BUDGET

CONFIGS = SCRIPTS / "configs"
#: the top configs (``run.yaml`` is the section they share, not one of them)
TOP = sorted(p.stem for p in CONFIGS.glob("*.yaml") if p.stem != "run")
ENVS = sorted(
    str(p.relative_to(CONFIGS / "env").with_suffix("")) for p in CONFIGS.glob("env/**/*.yaml")
)

#: which script runs each top config (its schema)
SCRIPT_OF = {
    "demo": "mappo_ippo",
    "mappo_fast": "mappo_ippo",
    "mappo_ippo": "mappo_ippo",
    "mappo_smax": "mappo_ippo",
    "ippo_smax": "mappo_ippo",
    "mappo_lbf": "mappo_ippo",
    "mappo_mpe": "mappo_ippo",
    "mappo_battle": "mappo_ippo",
    "qmix_vdn": "qmix_vdn",
    "qmix_mpe": "qmix_vdn",
    "qmix_lbf": "qmix_vdn",
    "qmix_mpe_epymarl": "qmix_vdn",
    "qmix_smax": "qmix_vdn",
    "iql": "iql",
    "maddpg_iddpg": "maddpg_iddpg",
    "masac_isac": "masac_isac",
}


@functools.cache
def _script_module(name: str) -> types.ModuleType:
    """``sota-implementations/<name>/<name>.py`` imported as a module: its schema is stored in
    Hydra's ConfigStore, its Hydra entry point defined, not run."""
    spec = importlib.util.spec_from_file_location(f"_script_{name}", script(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compose(name: str, overrides: list[str] | None = None, config_dir=CONFIGS, **kwargs):
    _script_module(SCRIPT_OF[name])  # its schema, as the script stores it at import
    register_resolvers()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return compose(config_name=name, overrides=overrides or [], **kwargs)


def test_the_top_configs_are_those_the_scripts_run():
    assert sorted(SCRIPT_OF) == TOP


@pytest.mark.parametrize("name", TOP)
def test_every_config_composes_with_every_env_and_passes_its_checks(name):
    for env in ENVS:
        cfg = _compose(name, [f"env={env}"])
        assert issubclass(OmegaConf.get_type(cfg), RunConfig)  # the script's schema
        check_config(cfg)
        assert cfg.env.name == OmegaConf.load(CONFIGS / "env" / f"{env}.yaml").name
        assert cfg.collector.frames_per_batch > 0 and cfg.collector.total_frames > 0
        assert cfg.seed == 0 and "run_dir" in cfg
        # run.yaml's default; the EPyMARL recipes evaluate sampled too, as its MAPPO tests act
        epymarl = name in ("mappo_lbf", "mappo_mpe")
        assert cfg.eval.exploration == ("both" if epymarl else "deterministic")


@pytest.mark.parametrize("env", ENVS)
def test_every_env_config_takes_transforms_from_the_command_line(env):
    """``env.transforms=[...]`` works on every env (no ``++``): run.yaml gives the key (empty),
    an env file its own."""
    own = OmegaConf.load(CONFIGS / "env" / f"{env}.yaml").get("transforms", [])
    assert list(_compose("mappo_ippo", [f"env={env}"]).env.transforms) == list(own)
    cfg = _compose("mappo_ippo", [f"env={env}", "env.transforms=[agent_id,double_to_float]"])
    assert list(cfg.env.transforms) == ["agent_id", "double_to_float"]
    check_config(cfg)


#: The last commit whose configs had no schema and no run.yaml: what each config gave then.
BEFORE_SCHEMAS = "75da1eb92fda8e51252e0218cadba96f8763e847"


@pytest.fixture(scope="module")
def configs_before_schemas(tmp_path_factory) -> pathlib.Path:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    found = subprocess.run(
        [git, "-C", str(ROOT), "cat-file", "-e", f"{BEFORE_SCHEMAS}^{{commit}}"],
        capture_output=True,
    )
    if found.returncode != 0:
        pytest.skip(f"commit {BEFORE_SCHEMAS} is not in this clone (a shallow one?)")
    out = tmp_path_factory.mktemp("before")
    archive = subprocess.run(
        [git, "-C", str(ROOT), "archive", BEFORE_SCHEMAS, "sota-implementations/configs"],
        capture_output=True,
        check=True,
    ).stdout
    (out / "configs.tar").write_bytes(archive)
    with tarfile.open(out / "configs.tar") as tar:
        tar.extractall(out, filter="data")
    return out / "sota-implementations" / "configs"


def _values(cfg) -> dict:
    """The composed config (interpolations left as written) and the Hydra keys it sets."""
    out = OmegaConf.to_container(cfg, resolve=False)
    hydra = out.pop("hydra")
    out["hydra"] = {
        "run.dir": hydra["run"]["dir"],
        "output_subdir": hydra["output_subdir"],
        "job.chdir": hydra["job"]["chdir"],
    }
    return out


@pytest.mark.parametrize("name", TOP)
def test_every_config_gives_the_values_it_gave_before_the_schemas(name, configs_before_schemas):
    """The shared run.yaml and the schemas change no value: each top config with each env
    composes to what it did at ``BEFORE_SCHEMAS`` (plain YAML), plus ``eval.exploration``.
    (``eval.fps`` is now a float: 20.0 where the YAML said 20.)"""
    if not (configs_before_schemas / f"{name}.yaml").exists():
        pytest.skip(f"configs/{name}.yaml was added since (issue 37): nothing to compare with")
    for env in ENVS:
        if not (configs_before_schemas / "env" / f"{env}.yaml").exists():
            continue  # an env config added since (magent2, issue 36): nothing to compare with
        now = _values(_compose(name, [f"env={env}"], return_hydra_config=True))
        with initialize_config_dir(config_dir=str(configs_before_schemas), version_base="1.3"):
            before = _values(compose(name, [f"env={env}"], return_hydra_config=True))
        assert now["eval"].pop("exploration") == "deterministic"
        # issue 39: devices, callbacks and precision, whose defaults are the runs as before
        assert now.pop("device") == "cpu" and now.pop("callbacks") == []
        assert now["env"].pop("device") is None and now["collector"].pop("device") is None
        assert now["env"].pop("transforms") == []  # issue 36: there to be set on the command line
        assert now["env"].pop("workers") == 1  # issue 37: the envs in the training process
        assert now["train"].pop("precision", "fp32") == "fp32"
        assert now["train"].pop("anneal_lr", False) is False  # PPO's lr schedule (issue 38)
        assert now["train"].pop("clip_per_network", False) is False  # PPO's clipping together
        assert now["train"].pop("adam_eps") == 1e-8  # torch's Adam eps (issue 38)
        assert now.pop("seeds_in_process", 1) == 1  # one seed per process unless asked
        # issue 37: EPyMARL's reward standardisation, off unless a config turns it on
        if "loss" in now:
            assert now["loss"].pop("standardise_rewards", False) is False
            # and QMIX's hypernetworks: one layer (PyMARL's) unless a config asks for two
            assert now["loss"].pop("hypernet_layers", 1) == 1
            assert now["loss"].pop("hypernet_embed", 64) == 64
            assert now["loss"].pop("mixer_state_scale", 1.0) == 1.0
            # issue 38: MAPPO's GAE per agent unless a config reads the team's episode
            assert now["loss"].pop("team_episodes", False) is False
            assert now["loss"].pop("clip_value", None) is None  # and no value clipping
            # issue 37: EPyMARL's n-step estimator, target critic and refreshed advantages: off
            assert now["loss"].pop("estimator", "gae") == "gae"
            assert now["loss"].pop("nstep", 5) == 5
            assert now["loss"].pop("target_critic_tau", None) is None
            assert now["loss"].pop("refresh_advantage", False) is False
            # issue 37: EPyMARL's hard target copies (Q-learning), off: soft updates by tau
            assert now["loss"].pop("hard_update_interval", 0) == 0
            # issue 37: DDPG's options against a saturated tanh actor, off (TorchRL's DDPG)
            # but for the pre-tanh penalty of MADDPG's recipe (docs/results.md, balance)
            penalty = 0.1 if name == "maddpg_iddpg" else 0.0
            assert now["loss"].pop("actor_preact_penalty", 0.0) == penalty
            assert now["loss"].pop("target_policy_noise", 0.0) == 0.0
            assert now["loss"].pop("target_noise_clip", 0.5) == 0.5
            assert now["loss"].pop("actor_delay", 1) == 1
        if "critic" in now:  # issue 38: the critic reads observations unless told the state
            assert now["critic"].pop("input", "observations") == "observations"
        # issue 37: the networks' activation, marlkit's Tanh unless a config asks for another
        for net in ("policy", "critic"):
            if net in now:
                assert now[net].pop("activation") == "tanh"
        if "model" in now:  # model (issue 37): no memory, the networks as before
            model = now.pop("model")
            assert model["memory"] == "none" and model.get("kind", "mlp") == "mlp"
            # issue 38: no hidden layers after a cell (a linear head) unless a config asks
            assert model.get("head_depth", 0) == 0 and model.get("head_cells") is None
            # issue 38: torch's initialisation unless a config asks for the orthogonal one
            assert model.get("init", "default") == "default"
            assert model.get("init_head_gain") is None
        assert now == before, (name, env)


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


def _refusal(name: str, override: str) -> str:
    """What refuses ``override``: Hydra while composing (a wrong type, an unknown key: its
    message and its cause's, which names the key as ``full_key``), or else the range checks
    (:func:`check_config`)."""
    try:
        cfg = _compose(name, [override])
    except Exception as err:  # hydra.errors.ConfigCompositionException
        return f"{err}\n{err.__cause__}"
    with pytest.raises(ConfigError) as refused:
        check_config(cfg)
    return str(refused.value)


def test_env_workers_are_refused_beside_worker_collectors_and_seed_stacks():
    cfg = _compose("mappo_lbf", ["env.workers=2", "collector=multisync"])
    with pytest.raises(ConfigError, match=r"env.workers \(2\) needs collector.kind=single, got"):
        check_config(cfg)
    check_config(_compose("mappo_lbf", ["env.workers=2"]))  # alone, accepted
    cfg = _compose("mappo_ippo", ["env.workers=2", "env.device=cuda"])
    import marlkit.train.config as config_module

    # the device taken as present (without CUDA its own check refuses first)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config_module, "check_device", lambda *args, **kwargs: None)
        with pytest.raises(ConfigError, match=r"env.workers \(2\) steps CPU envs .* 'cuda'"):
            check_config(cfg)
    from marlkit.train.seeds import check_seeds_config

    with pytest.raises(ConfigError, match=r"env\.workers"):
        check_seeds_config(_compose("mappo_lbf", ["env.workers=2", "seeds_in_process=2"]))


@pytest.mark.parametrize(
    ("name", "override", "messages"),
    [
        # a wrong type of each kind, refused by OmegaConf while composing, the key named
        (
            "mappo_ippo",
            "train.lr=abc",  # a float: torch's TypeError after the first batch named no key
            ["Value 'abc' of type 'str' could not be converted to Float", "full_key: train.lr"],
        ),
        (
            "qmix_vdn",
            "train.epochs=1.5",  # an int
            ["Value '1.5' of type 'float' could not be converted to Integer", "train.epochs"],
        ),
        ("iql", "train.minibatch_size=abc", ["to Integer", "full_key: train.minibatch_size"]),
        (
            "mappo_ippo",
            "critic.centralised=maybe",  # a bool: true, false, yes, no, on, off
            ["Value 'maybe' is not a valid bool", "full_key: critic.centralised"],
        ),
        ("mappo_ippo", "threads=abc", ["to Integer", "full_key: threads"]),  # an optional int
        # a choice (a string among a few), refused by its range check
        ("qmix_vdn", "loss.mixer=qmx", ["loss.mixer must be one of ['qmix', 'vdn'], got 'qmx'"]),
        ("qmix_vdn", "loss.mixer=1", ["loss.mixer must be one of ['qmix', 'vdn'], got '1'"]),
        # a section replaced by a value
        (
            "qmix_vdn",
            "loss=vdn",
            ["Invalid type assigned: str is not a subclass of QmixVdnLossConfig", "full_key: loss"],
        ),
        (
            "mappo_ippo",
            "eval.exploration=greedy",
            ["eval.exploration must be one of ['deterministic', 'random', 'both'], got 'greedy'"],
        ),
        # env is checked as an EnvConfig by check_config (kept a mapping for '~env.kwargs')
        (
            "mappo_ippo",
            "env.num_envs=abc",
            ["env.num_envs: Value 'abc' of type 'str' could not be converted to Integer"],
        ),
        ("mappo_ippo", "+env.seed=1", ["env.seed: Key 'seed' not in 'EnvConfig'"]),
        # a key the schema does not declare, as Hydra refuses it in struct mode
        ("mappo_ippo", "train.lrr=1", ["Could not override 'train.lrr'", "Key 'lrr' not in"]),
        (  # Hydra adds it (+): check_config refuses it
            "mappo_ippo",
            "+train.lrr=1",
            ["train.lrr is not a key of PPOTrainConfig (its keys: minibatch_size, lr,"],
        ),
        ("mappo_ippo", "collector.init_random_frames=0", ["init_random_frames"]),  # off-policy's
        # a range per section
        ("mappo_ippo", "seed=-1", ["seed must be an int >= 0, got -1"]),
        ("mappo_ippo", "threads=0", ["threads must be an int >= 1 or None, got 0"]),
        ("mappo_ippo", "env.num_envs=0", ["env.num_envs must be an int >= 1, got 0"]),
        (
            "mappo_ippo",
            "env.actions=discret",
            ["env.actions must be one of ['discrete', 'continuous', None], got 'discret'"],
        ),
        # -1 ran forever in MAPPO and was refused in QMIX: a training run ends
        ("mappo_ippo", "collector.total_frames=-1", ["collector.total_frames must be an int >= 1"]),
        ("mappo_ippo", "collector.kind=multi", ["collector.kind must be one of ['single'"]),
        # model: memory in the networks (issue 37)
        ("mappo_ippo", "model.memory=rnn", ["model.memory must be one of ['none', 'gru', 'lstm']"]),
        ("qmix_vdn", "model.seq_len=0", ["model.seq_len must be an int >= 1, got 0"]),
        ("iql", "model.burn_in=-1", ["model.burn_in must be an int >= 0, got -1"]),
        ("mappo_ippo", "model.critic_memory=maybe", ["full_key: model.critic_memory"]),
        # issue 38: hidden layers between the cell and the output layer (JaxMARL's SMAX nets)
        ("mappo_smax", "model.head_depth=-1", ["model.head_depth must be an int >= 0, got -1"]),
        (
            "qmix_smax",
            "model.head_cells=0",
            ["model.head_cells must be an int >= 1 or None, got 0"],
        ),
        ("iql", "model.head_depth=1.5", ["to Integer", "full_key: model.head_depth"]),
        (  # without a cell there is nothing to put layers after: the MLP's depth does that
            "mappo_ippo",
            "model.head_depth=1",
            [
                "model.head_depth=1 adds hidden layers between the recurrent cell and the output "
                "layer: it needs model.memory (gru or lstm), got none"
            ],
        ),
        ("qmix_vdn", "model.head_depth=2", ["model.head_depth=2 adds", "policy.depth"]),
        (
            "mappo_ippo",
            "model.kind=transformer",
            ["model.kind must be one of ['mlp', 'cnn', 'deepsets', 'attention', 'gnn']"],
        ),
        ("mappo_ippo", "policy.depth=-1", ["policy.depth must be an int >= 0, got -1"]),
        ("mappo_ippo", "critic.num_cells=0", ["critic.num_cells must be an int >= 1, got 0"]),
        # a negative norm flips every update; zero epochs or updates trained nothing
        (
            "mappo_ippo",
            "train.max_grad_norm=-1",
            ["train.max_grad_norm must be a finite number > 0, got -1.0"],
        ),
        ("mappo_ippo", "train.lr=inf", ["train.lr must be a finite number > 0, got inf"]),
        ("qmix_vdn", "train.adam_eps=0", ["train.adam_eps must be a finite number > 0, got 0"]),
        ("masac_isac", "train.adam_eps=-1e-5", ["train.adam_eps must be a finite number > 0"]),
        # issue 38: the PPO references' orthogonal initialisation
        (
            "mappo_smax",
            "model.init=xavier",
            ["model.init must be one of ['default', 'orthogonal'], got 'xavier'"],
        ),
        ("mappo_smax", "model.init_head_gain=0", ["model.init_head_gain must be a finite"]),
        (
            "mappo_smax",
            "model.init_head_gain=2",
            [
                "model.init_head_gain=2.0 is the orthogonal initialisation's gain after the "
                "recurrent cell: it needs model.init=orthogonal, got 'default'"
            ],
        ),
        ("mappo_ippo", "train.epochs=0", ["train.epochs must be an int >= 1, got 0"]),
        ("maddpg_iddpg", "train.num_updates=0", ["train.num_updates must be an int >= 1, got 0"]),
        ("mappo_ippo", "eval.num_envs=0", ["eval.num_envs must be an int >= 1, got 0"]),
        ("mappo_ippo", "checkpoint.keep=0", ["checkpoint.keep must be an int >= 1, got 0"]),
        (
            "mappo_ippo",
            "logger.backends=[csv,tensorbord]",
            ["logger.backends must be one of ['csv', 'tensorboard', 'wandb'], got 'tensorbord'"],
        ),
        (
            "mappo_ippo",
            "loss.entropy_coef=-0.1",
            ["loss.entropy_coef must be a finite number >= 0"],
        ),
        ("mappo_ippo", "loss.gamma=1.5", ["loss.gamma must be a finite number in [0, 1], got 1.5"]),
        ("mappo_ippo", "loss.clip_value=0", ["loss.clip_value must be a finite number > 0"]),
        ("qmix_vdn", "buffer.capacity=0", ["buffer.capacity must be an int >= 1, got 0"]),
        ("maddpg_iddpg", "buffer.size=0", ["buffer.size must be an int >= 1, got 0"]),
        ("maddpg_iddpg", "loss.actor_preact_penalty=-1", ["loss.actor_preact_penalty must be"]),
        ("maddpg_iddpg", "loss.target_policy_noise=-0.2", ["loss.target_policy_noise must be"]),
        ("maddpg_iddpg", "loss.target_noise_clip=nan", ["loss.target_noise_clip must be"]),
        ("maddpg_iddpg", "loss.actor_delay=0", ["loss.actor_delay must be an int >= 1, got 0"]),
        (
            "iql",
            "exploration.eps_init=2",
            ["exploration.eps_init must be a finite number in [0, 1]"],
        ),
        ("maddpg_iddpg", "exploration.sigma_end=-1", ["exploration.sigma_end must be a finite"]),
        ("qmix_vdn", "loss.mixing_embed_dim=0", ["loss.mixing_embed_dim must be an int >= 1"]),
        ("qmix_vdn", "loss.hypernet_layers=3", ["loss.hypernet_layers must be an int in [1, 2]"]),
        ("qmix_vdn", "loss.mixer_state_scale=0", ["loss.mixer_state_scale must be a finite"]),
        ("masac_isac", "loss.num_qvalue_nets=0", ["loss.num_qvalue_nets must be an int >= 1"]),
        ("masac_isac", "loss.tau=0", ["loss.tau must be a finite number in (0, 1], got 0.0"]),
        ("masac_isac", "loss.loss_function=l3", ["loss.loss_function must be one of ['l2'"]),
        # issue 38: the MAPPO critic's input; MADDPG's and MASAC's critics have no such key
        (
            "mappo_ippo",
            "critic.input=states",
            ["critic.input must be one of ['observations', 'state'], got 'states'"],
        ),
        ("maddpg_iddpg", "critic.input=state", ["Key 'input' not in 'CriticConfig'"]),
        # issue 37: env worker processes
        ("mappo_ippo", "env.workers=0", ["env.workers must be an int >= 1, got 0"]),
        (
            "mappo_lbf",
            "env.workers=3",
            ["env.num_envs (10) must be a multiple of workers (3): each worker steps"],
        ),
        ("masac_isac", "+critic.input=state", ["critic.input is not a key of CriticConfig"]),
    ],
)
def test_a_bad_value_is_refused_with_its_key(name, override, messages):
    refusal = _refusal(name, override)
    for message in messages:
        assert message in refusal, refusal


@pytest.mark.parametrize(
    ("name", "override", "key", "value"),
    [
        # YAML 1.2 leaves no and yes strings, which Python's bool() reads as true: it trained
        # MAPPO for an IPPO run. A bool key of the schema reads them as what they say.
        ("mappo_ippo", "critic.centralised=no", "critic.centralised", False),
        ("qmix_vdn", "loss.double_dqn=no", "loss.double_dqn", False),
        ("masac_isac", "loss.fixed_alpha=yes", "loss.fixed_alpha", True),
        ("mappo_ippo", "train.lr=1", "train.lr", 1.0),  # an int where a float goes
        ("mappo_ippo", "threads=null", "threads", None),
        ("masac_isac", "loss.target_entropy=-2", "loss.target_entropy", -2),
        ("mappo_ippo", "eval.exploration=both", "eval.exploration", "both"),
    ],
)
def test_a_value_is_read_as_its_keys_type(name, override, key, value):
    cfg = _compose(name, [override])
    check_config(cfg)
    got = OmegaConf.select(cfg, key)
    assert got == value and type(got) is type(value)


def test_critic_centralised_no_trains_ippo(tmp_path):
    """``critic.centralised=no`` is an IPPO run (the string ``"no"`` once trained MAPPO)."""
    assert _compose("mappo_ippo", ["critic.centralised=no"]).critic.centralised is False
    run_dir = tmp_path / "run"
    run("mappo_ippo", run_dir, (*BUDGET, "critic.centralised=no", "eval.video=false"))
    assert summary(run_dir)["variant"] == "IPPO"


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


@pytest.mark.parametrize(
    ("override", "message"),
    [
        # a wrong type, refused by Hydra while composing: the script never starts
        ("train.lr=abc", r"Value 'abc' of type 'str' could not be converted to Float"),
        # a value out of range, refused by marlkit.train.scripts.start
        ("train.epochs=0", r"ConfigError: train.epochs must be an int >= 1, got 0"),
    ],
)
def test_a_script_refuses_a_bad_value_before_collecting(tmp_path, override, message):
    run_dir = tmp_path / "run"
    with pytest.raises(AssertionError, match=message):
        run("mappo_ippo", run_dir, (*BUDGET, override))
    assert not (run_dir / "metrics.csv").exists()


def test_the_script_prints_its_config_and_help():
    argv = [sys.executable, str(script("qmix_vdn"))]
    job = subprocess.run([*argv, "--cfg", "job"], capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stderr
    printed = OmegaConf.create(job.stdout)
    assert printed.loss.mixer == "qmix" and printed.eval.exploration == "deterministic"
    helped = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert "collector: multisync, ray, single" in helped.stdout  # the groups
    assert "mixing_embed_dim: 32" in helped.stdout


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


@pytest.mark.slow  # two tiny runs in one process, ~20 s
def test_hydra_multirun_trains_one_run_per_job_in_the_run_dir_each_names(tmp_path):
    """Hydra's ``-m`` (docs/experiments.md): a sweep over seeds, each job's run in the folder
    its ``run_dir`` names, Hydra's sweep folder where ``hydra.sweep.dir`` says."""
    argv = command("mappo_ippo", tmp_path / "seed_${seed}", BUDGET)
    argv[2:2] = ["-m"]  # Hydra's flags before the overrides
    argv += ["seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}", "eval.video=false"]
    proc = _forked.run(argv, cwd=ROOT, env=script_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = summary(tmp_path / "seed_0"), summary(tmp_path / "seed_1")
    assert first["trained"] != second["trained"]  # two seeds, two runs
    assert {p.name for p in (tmp_path / "sweep").iterdir()} >= {"0", "1", "multirun.yaml"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed_0", "seed_1", "sweep"]


def test_mappo_reads_smax_unit_lists_through_an_entity_encoder():
    """``model.kind=deepsets model.inputs=[entities,own] model.entity_mask=entity_mask``
    (issue 37 on issue 38's SMAX): the actor and the critic read the unit list as a set, and
    the sampled actions are ones the action mask allows."""
    from marlkit.modules.entities import DeepSets
    from marlkit.train.scripts import env_factory

    overrides = [
        "env=smax/3m",
        "model.kind=deepsets",
        "model.inputs=[entities,own]",
        "model.entity_mask=entity_mask",
    ]
    cfg = _compose("mappo_ippo", overrides)
    check_config(cfg)
    module = _script_module("mappo_ippo")
    env = env_factory(cfg, 4, seed=0)()
    policy = module.make_policy(env, cfg)
    critic = module.make_critic(env, "ally", cfg.critic, cfg.model)
    assert any(isinstance(m, DeepSets) for m in policy.modules())
    assert ("ally", "entity_mask") in critic.in_keys
    assert ("ally", "observation") not in critic.in_keys
    td = env.reset()
    for _ in range(5):
        td = policy(td)
        allowed = td["ally", "action_mask"].gather(-1, td["ally", "action"][..., None])
        assert allowed.all()
        assert critic(td)["ally", "state_value"].shape == (4, 3, 1)
        td = env.step(td)["next"]
    with pytest.raises(KeyError, match=r"model.inputs names 'unit'"):
        module.make_policy(env, _compose("mappo_ippo", [*overrides[:2], "model.inputs=[unit]"]))
