"""Observation transforms (flatten, concatenate, pixels, agent ids) on real envs: MAgent2's grid
images, a simulator of dict observations with ``uint8`` pixels (the custom adapter), LBF, MPE and
VMAS with agent ids, batched envs, and the transforms by name as a config lists them."""

from __future__ import annotations

import functools
import math
import pathlib
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces

import marlkit
from marlkit._utils import has_module
from marlkit.adapters.custom import from_parallel
from marlkit.data.composite import Composite
from marlkit.data.specs import Bounded, Categorical, Unbounded
from marlkit.envs import ParallelEnv, SerialEnv, check_env_specs
from marlkit.envs.transforms import (
    TRANSFORMS,
    AgentIdObservation,
    Compose,
    ConcatObservation,
    FlattenObservation,
    RewardSum,
    StepCounter,
    ToTensorImage,
    TransformedEnv,
    make_transforms,
)
from marlkit.modules import MultiAgentMLP
from marlkit.testing import check_adapter

ROOT = pathlib.Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------ a dict-and-pixels simulator
class Scout:
    """Two agents, each seeing a ``uint8`` camera image ``[6, 8, 3]``, its ammunition (a
    ``Discrete(4)``) and its position (a ``Box``): MeltingPot's layout in small."""

    possible_agents = ["scout_0", "scout_1"]

    def __init__(self) -> None:
        self.agents: list[str] = []
        self.t = 0
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent: str) -> Any:
        return spaces.Dict(
            {
                "rgb": spaces.Box(0, 255, (6, 8, 3), np.uint8),
                "ammo": spaces.Discrete(4),
                "pos": spaces.Box(-1, 1, (2,), np.float32),
            }
        )

    def action_space(self, agent: str) -> Any:
        return spaces.Discrete(3)

    def reset(self, seed: int | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        return self._obs(), {}

    def _obs(self) -> dict:
        return {
            a: {
                "rgb": self.rng.integers(0, 256, (6, 8, 3), dtype=np.uint8),
                "ammo": int(self.rng.integers(0, 4)),
                "pos": self.rng.uniform(-1, 1, 2).astype(np.float32),
            }
            for a in self.agents
        }

    def step(self, actions: dict) -> tuple:
        self.t += 1
        flags = dict.fromkeys(self.agents, False)
        return self._obs(), dict.fromkeys(self.agents, 1.0), flags, flags, {}


def scouts(num_envs: int = 2) -> Any:
    return from_parallel(Scout, num_envs=num_envs, seed=0)


def test_pixels_then_concat_give_one_vector_per_agent():
    env = TransformedEnv(scouts(), Compose(ToTensorImage(), ConcatObservation()))
    rgb = env.observation_spec  # the nested image became CHW float in [0, 1], then joined
    spec = rgb["agents", "observation"]
    assert isinstance(spec, Bounded) and spec.shape == (2, 2, 3 * 6 * 8 + 1 + 2)
    assert spec.dtype == torch.float32
    concat = env.transform[1]  # the entries in the spec's order (Gymnasium sorts a Dict's keys)
    assert [(k, tuple(f)) for k, f, _ in concat.layout[("agents", "observation")]] == [
        ("ammo", ()),
        ("pos", (2,)),
        ("rgb", (3, 6, 8)),
    ]
    assert spec.high[0, 0, 0] == 3 and spec.low[0, 0, 1:3].tolist() == [-1.0, -1.0]
    assert spec.low[0, 0, 3:].min() == 0.0 and spec.high[0, 0, 3:].max() == 1.0  # pixels
    raw = scouts()
    td, td_raw = env.rollout(3), raw.rollout(3)  # the same seeds and random actions
    obs, nested = td["agents", "observation"], td_raw["agents", "observation"]
    assert obs.shape == (2, 3, 2, 147)
    assert torch.equal(obs[..., 0], nested["ammo"].float())
    assert torch.equal(obs[..., 1:3], nested["pos"])
    rgb_chw = nested["rgb"].permute(0, 1, 2, 5, 3, 4).float() / 255
    assert torch.equal(obs[..., 3:], rgb_chw.flatten(-3))
    check_env_specs(env)
    check_adapter(env)  # partial resets map the observations back to the simulator's layout


def test_pixels_alone_scale_uint8_and_keep_the_dict():
    env = TransformedEnv(scouts(), ToTensorImage(layout="HWC"))
    spec = env.observation_spec["agents", "observation"]
    assert isinstance(spec, Composite)
    assert spec["rgb"] == Bounded(0.0, 1.0, (2, 2, 6, 8, 3))
    assert spec["ammo"] == Categorical(4, (2, 2))  # left alone: not an image
    td = env.reset()
    assert td["agents", "observation", "rgb"].dtype == torch.float32
    assert (
        0
        <= td["agents", "observation", "rgb"].min()
        <= td["agents", "observation", "rgb"].max()
        <= 1
    )


def test_a_partial_reset_round_trips_the_pixels_exactly():
    env = TransformedEnv(scouts(), Compose(ToTensorImage(), ConcatObservation()))
    td = env.step(env.rand_action(env.reset()))["next"]
    td["_reset"] = torch.tensor([[True], [False]])
    out = env.reset(td)
    # env 1 was not reset: it reports exactly what it reported, through uint8 and back
    assert torch.equal(out["agents", "observation"][1], td["agents", "observation"][1])
    assert not torch.equal(out["agents", "observation"][0], td["agents", "observation"][0])


def test_batched_envs_the_transform_outside_and_inside():
    make = functools.partial(from_parallel, Scout, num_envs=2, seed=0)
    outside = TransformedEnv(SerialEnv(2, make), ConcatObservation())
    assert outside.observation_spec["agents", "observation"].shape == (2, 2, 2, 3 * 6 * 8 + 3)
    assert outside.rollout(2)["agents", "observation"].shape == (2, 2, 2, 2, 147)
    check_env_specs(outside)
    inside = SerialEnv(2, lambda: TransformedEnv(make(), ConcatObservation()))
    assert inside.rollout(2)["agents", "observation"].shape == (2, 2, 2, 2, 147)


@pytest.mark.slow  # two worker processes start (~20 s on a loaded 2-CPU VM)
def test_around_a_parallel_env_of_worker_processes():
    pytest.importorskip("magent2")
    make = functools.partial(marlkit.make, "magent2/battle_v4", map_size=12, num_envs=2, seed=0)
    env = TransformedEnv(ParallelEnv(2, make), FlattenObservation())
    try:
        assert env.rollout(2)["red", "observation"].shape == (2, 2, 2, 2, 845)
        td = env.step(env.rand_action(env.reset()))["next"]
        td["_reset"] = torch.tensor([[[True], [False]], [[False], [True]]])
        out = env.reset(td)  # the shared buffers get the simulator's layout back
        assert torch.equal(out["blue", "observation"][0, 1], td["blue", "observation"][0, 1])
        assert torch.equal(out["state"][1, 0], td["state"][1, 0])
    finally:
        env.close()


# ---------------------------------------------------------------- a real pixel env (PettingZoo)
def test_pixels_of_pettingzoo_knights_archers_zombies():
    pytest.importorskip("pettingzoo.butterfly")
    name = "pettingzoo/pettingzoo.butterfly.knights_archers_zombies_v11"
    kwargs = {"num_envs": 2, "seed": 0, "obs_method": "image", "num_archers": 1, "num_knights": 1}
    env = TransformedEnv(marlkit.make(name, **kwargs), ToTensorImage())
    assert env.observation_spec["agents", "observation"] == Bounded(0.0, 1.0, (2, 2, 3, 512, 512))
    td = env.reset()
    raw = marlkit.make(name, **kwargs).reset()["agents", "observation"]  # uint8 [2, 2, 512, 512, 3]
    assert torch.equal(td["agents", "observation"], raw.movedim(-1, -3).float() / 255)
    td = env.step(env.rand_action(td))["next"]
    assert env.observation_spec["agents", "observation"].is_in(td["agents", "observation"])
    td["_reset"] = torch.tensor([[False], [True]])
    out = env.reset(td)  # env 0 reports its pixels again, through uint8 and back, exactly
    assert torch.equal(out["agents", "observation"][0], td["agents", "observation"][0])


def test_meltingpot_dict_observations_into_one_vector_and_its_world_view_channels_first():
    if not (has_module("meltingpot") and has_module("dmlab2d")):
        pytest.skip("dm-meltingpot is not installed (see docs/adapters.md)")
    make = functools.partial(  # two players, a 40x40 view and vectors; builds in ~0.2 s
        marlkit.make, "meltingpot/prisoners_dilemma_in_the_matrix__repeated", num_envs=1, seed=0
    )
    raw_env = make()
    nested = raw_env.observation_spec["agents", "observation"]
    assert nested["RGB"].shape == (1, 2, 40, 40, 3) and nested["RGB"].dtype == torch.uint8
    env = TransformedEnv(make(), [ToTensorImage(), ConcatObservation()])
    sizes = [
        math.prod(features) for _, features, _ in env.transform[1].layout[("agents", "observation")]
    ]
    spec = env.observation_spec["agents", "observation"]
    assert spec.shape == (1, 2, sum(sizes)) and 3 * 40 * 40 in sizes
    assert env.state_spec["state"].shape == (1, 3, 120, 184)  # WORLD.RGB, channels first
    # MeltingPot does not replay a seed: the transforms are applied to the raw env's own output
    raw_td = raw_env.reset()
    obs = env.transform.reset(None, raw_td.clone(), None)["agents", "observation"]
    raw = raw_td["agents", "observation"]
    start = 0
    for sub, features, _ in env.transform[1].layout[("agents", "observation")]:
        part = obs[..., start : start + math.prod(features)]
        want = raw[sub].movedim(-1, -3).float() / 255 if sub == "RGB" else raw[sub].float()
        assert torch.equal(part, want.reshape(part.shape)), sub
        start += math.prod(features)
    stepped = env.step(env.rand_action(env.reset()))["next"]
    assert spec.is_in(stepped["agents", "observation"])
    assert env.state_spec["state"].is_in(stepped["state"])
    raw_env.close()
    env.close()


# ------------------------------------------------------------------------------------ MAgent2
magent2_reason = "magent2 not installed"


@pytest.fixture
def battle():
    pytest.importorskip("magent2")
    env = marlkit.make("magent2/battle_v4", map_size=12, num_envs=2, seed=0, max_cycles=20)
    yield env
    env.close()


def test_flatten_every_group_and_the_state_of_magent2(battle):
    env = TransformedEnv(battle, FlattenObservation())
    for group in ("red", "blue"):
        spec = env.observation_spec[group, "observation"]
        assert spec == Bounded(0.0, 2.0, (2, 2, 845))
    assert env.state_spec["state"].shape == (2, 720)
    assert env.transform[0].in_keys == [("red", "observation"), ("blue", "observation"), "state"]
    raw = marlkit.make("magent2/battle_v4", map_size=12, num_envs=2, seed=0, max_cycles=20)
    td, td_raw = (
        env.rollout(25, break_when_any_done=False),
        raw.rollout(25, break_when_any_done=False),
    )
    raw.close()
    assert torch.equal(td["red", "observation"], td_raw["red", "observation"].flatten(-3))
    assert torch.equal(td["next", "state"], td_raw["next", "state"].flatten(-3))
    check_adapter(env, steps=4)


def test_pixels_on_magent2_grids_are_channels_first_not_scaled(battle):
    env = TransformedEnv(battle, ToTensorImage(in_keys=[("red", "observation")]))
    assert env.observation_spec["red", "observation"] == Bounded(0.0, 2.0, (2, 2, 5, 13, 13))
    assert env.observation_spec["blue", "observation"].shape == (2, 2, 13, 13, 5)
    td = env.reset()
    raw = marlkit.make("magent2/battle_v4", map_size=12, num_envs=2, seed=0, max_cycles=20)
    assert torch.equal(td["red", "observation"], raw.reset()["red", "observation"].movedim(-1, -3))
    raw.close()


def test_an_mlp_runs_on_flattened_magent2_through_the_episodic_stack(battle):
    env = TransformedEnv(battle, [StepCounter(5), RewardSum()])
    env.append_transform(FlattenObservation())
    td = env.rollout(6, break_when_any_done=False)
    assert td["blue", "observation"].shape == (2, 6, 2, 845)
    mlp = MultiAgentMLP(845, 21, 2, share_params=True, depth=1, num_cells=8)
    assert mlp(td["blue", "observation"]).shape == (2, 6, 2, 21)


def test_an_mlp_given_magent2_images_names_the_transform_that_fixes_it(battle):
    obs = battle.reset()["red", "observation"]  # [2, 2, 13, 13, 5]
    # What a script did before: the MLP sized by the spec's last dim.
    mlp = MultiAgentMLP(obs.shape[-1], 21, 2, share_params=True, depth=1, num_cells=8)
    match = (
        r"MultiAgentMLP input: expected a tensor of shape \[\*B, n_agents=2, 5\], got "
        r"\[2, 2, 13, 13, 5\]: more dims than \[\*B, n_agents, features\] after the agents' "
        r"dim \(an image or grid observation\?\); flatten them with env\.transforms: "
        r"\[flatten_observation\] \(FlattenObservation\), or use the convolutional model "
        r"\(model=cnn\)"
    )
    with pytest.raises(ValueError, match=match):
        mlp(obs)


# ------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("transform", "error", "match"),
    [
        (
            lambda: FlattenObservation(in_keys=[("agents", "obsrvation")]),
            KeyError,
            r"FlattenObservation: \('agents', 'obsrvation'\) is neither an observation nor a "
            r"state key.*Did you mean",
        ),
        (
            lambda: FlattenObservation(in_keys=[("agents", "observation", "pos")]),
            ValueError,
            r"'pos'\) \[2, 2, 2\] has 1 feature dim after its batch dims \[2, 2\]: there is "
            "nothing to flatten",
        ),
        (
            lambda: FlattenObservation(in_keys=[("agents", "observation")]),
            ValueError,
            r"is a nested observation .*ConcatObservation",
        ),
        (
            lambda: ConcatObservation(in_keys=[("agents", "observation", "rgb")]),
            ValueError,
            r"'rgb'\) is a single entry \[2, 2, 6, 8, 3\], not a nested observation",
        ),
        (
            lambda: ToTensorImage(in_keys=[("agents", "observation", "pos")]),
            ValueError,
            r"ToTensorImage: \('agents', 'observation', 'pos'\) is not an image \[\.\.\., H, W, "
            r"C\] \(it is \[2, 2, 2\]: 1 feature dims",
        ),
    ],
)
def test_keys_a_transform_cannot_take_are_named(transform, error, match):
    with pytest.raises(error, match=match):
        TransformedEnv(scouts(), transform())


def test_nothing_to_transform_by_default_is_refused():
    flat = marlkit.make("navigation", num_envs=2, n_agents=2)
    with pytest.raises(
        ValueError,
        match=r"FlattenObservation: the env has no observation or "
        r"state with more than one feature dim to transform .*'agents', "
        r"'observation'\) \[2, 2, \d+\]",
    ):
        TransformedEnv(flat, FlattenObservation())
    with pytest.raises(ValueError, match="ConcatObservation: the env has no nested observation"):
        TransformedEnv(flat, ConcatObservation())
    with pytest.raises(ValueError, match=r"ToTensorImage: the env has no image entry"):
        TransformedEnv(flat, ToTensorImage())


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: FlattenObservation(in_keys=[]), ValueError, "in_keys is empty"),
        (lambda: FlattenObservation(in_keys="observation"), TypeError, "single key"),
        (lambda: ConcatObservation(in_keys=[("agents", "mask")]), ValueError, "cannot touch"),
        (lambda: ToTensorImage(layout="CWH"), ValueError, r"layout must be one of \['CHW'"),
        (lambda: ToTensorImage(dtype="int64"), TypeError, "dtype must be a float dtype"),
        (lambda: ToTensorImage(dtype="floaty"), TypeError, "got None"),
    ],
)
def test_bad_arguments_are_refused(build, error, match):
    with pytest.raises(error, match=match):
        build()


# -------------------------------------------------------------------------- by name (configs)
def test_transforms_by_name_as_a_config_lists_them():
    built = make_transforms(
        [
            "flatten_observation",
            {"name": "pixels", "layout": "HWC", "dtype": "float64"},
            {"name": "concat_observation", "in_keys": [["agents", "observation"]]},
        ]
    )
    assert [type(t) for t in built] == [FlattenObservation, ToTensorImage, ConcatObservation]
    assert built[1].layout == "HWC" and built[1].dtype == torch.float64
    env = TransformedEnv(scouts(), built[1:])  # a YAML list key became a nested key
    assert env.observation_spec["agents", "observation"].dtype == torch.float64
    assert set(TRANSFORMS) >= {"flatten_observation", "concat_observation", "pixels"}
    assert make_transforms(["pixels"])[0] is not make_transforms(["pixels"])[0]  # new each time


@pytest.mark.parametrize(
    ("entries", "error", "match"),
    [
        (
            ["flaten_observation"],
            ValueError,
            r"transforms\[0\]: unknown transform 'flaten_observation'; known: "
            r"agent_id, common_reward, concat_observation, double_to_float, "
            r"flatten_observation, pixels, truncation_as_termination\. "
            "Did you mean: "
            "flatten_observation",
        ),
        (
            ["pixels", {"name": "pixels", "layot": "HWC"}],
            TypeError,
            r"transforms\[1\]: transform 'pixels' got an unexpected keyword argument 'layot' "
            r"\(did you mean 'layout'\?\)",
        ),
        ([{"layout": "HWC"}], ValueError, r"transforms\[0\]: a transform entry needs a 'name'"),
        ([3], TypeError, r"transforms\[0\]: a transform entry is a name or a mapping"),
        ("pixels", TypeError, "transforms takes a list of entries"),
        ([{"name": "pixels", "layout": "CWH"}], ValueError, r"transforms\[0\]: .*layout"),
    ],
)
def test_bad_entries_name_the_entry(entries, error, match):
    with pytest.raises(error, match=match):
        make_transforms(entries)


def test_the_env_config_checks_its_transforms_and_make_env_applies_them():
    pytest.importorskip("omegaconf")
    from marlkit.train.builders import make_env
    from marlkit.train.config import ConfigError, env_config

    section = {"name": "navigation", "num_envs": 2, "max_steps": 5}
    assert env_config(section).transforms == []
    checked = env_config({**section, "transforms": ["double_to_float"]})
    env = make_env(checked.name, transforms=checked.transforms, num_envs=2, max_steps=5)
    assert [type(t).__name__ for t in env.transform] == [
        "StepCounter",
        "RewardSum",
        "DoubleToFloat",
    ]
    with pytest.raises(
        ConfigError,
        match=r"env\.transforms\[1\]: unknown transform 'pixel'.*"
        "Did you mean: pixels",
    ):
        env_config({**section, "transforms": ["double_to_float", "pixel"]})
    with pytest.raises(
        ConfigError,
        match=r"env\.transforms\[0\]: transform 'pixels' got an "
        r"unexpected keyword argument 'layot'",
    ):
        env_config({**section, "transforms": [{"name": "pixels", "layot": "HWC"}]})
    with pytest.raises(ConfigError, match=r"env\.transforms: .*not a ListConfig, list or tuple"):
        env_config({**section, "transforms": "flatten_observation"})


def test_make_env_places_common_reward_before_the_episode_sums():
    """The MAPPO MPE recipe's transforms: the team reward (EPyMARL's common_reward, sum) goes
    before RewardSum, so the logged return is the team's, every agent's the same."""
    pytest.importorskip("mpe2")
    from marlkit.train.builders import make_env

    kwargs = {"num_envs": 2, "max_steps": 25, "seed": 0, "N": 3, "max_cycles": 25}
    env = make_env(
        "pettingzoo/mpe2.simple_spread_v3", transforms=["common_reward", "agent_id"], **kwargs
    )
    assert [type(t).__name__ for t in env.transform] == [
        "CommonReward",
        "StepCounter",
        "RewardSum",
        "AgentIdObservation",
    ]
    plain = make_env("pettingzoo/mpe2.simple_spread_v3", **kwargs)
    moves = torch.randint(0, 5, (25, 2, 3), generator=torch.Generator().manual_seed(0))
    actions = iter([*moves, *moves])  # one sequence for each env, the same

    def act(td):
        return td.set(("agents", "action"), next(actions))

    common, own = env.rollout(25, act), plain.rollout(25, act)
    team = own["next", "agents", "reward"].sum(-2, keepdim=True)
    assert torch.allclose(common["next", "agents", "reward"], team.expand(-1, -1, 3, -1))
    returns = common["next", "agents", "episode_reward"][:, -1]  # [E, n, 1]: the team's return
    assert torch.allclose(returns, team.sum(1).expand(-1, 3, -1))
    env.close()
    plain.close()


def test_truncation_as_termination_on_mpe_ends_bootstrapping_at_the_time_limit():
    """The QMIX MPE recipe of EPyMARL's: after the step counter, the 25th step's cut is a
    termination at every level; the episodes, rewards and observations are the plain env's."""
    pytest.importorskip("mpe2")
    from marlkit.train.builders import make_env

    kwargs = {"num_envs": 2, "max_steps": 25, "seed": 0, "N": 3, "max_cycles": 25}
    names = ["common_reward", "agent_id"]
    env = make_env(
        "pettingzoo/mpe2.simple_spread_v3",
        transforms=[*names, "truncation_as_termination"],
        **kwargs,
    )
    assert [type(t).__name__ for t in env.transform][-2:] == [
        "AgentIdObservation",
        "TruncationAsTermination",
    ]
    plain = make_env("pettingzoo/mpe2.simple_spread_v3", transforms=names, **kwargs)
    moves = torch.randint(0, 5, (30, 2, 3), generator=torch.Generator().manual_seed(1))

    def play(e):
        actions = iter(moves)
        return e.rollout(
            30, lambda td: td.set(("agents", "action"), next(actions)), break_when_any_done=False
        )

    ended, cut = play(env), play(plain)
    for key in [("next", "agents", "observation"), ("next", "agents", "reward")]:
        assert torch.equal(ended[key], cut[key]), key
    for prefix in [(), ("agents",)]:
        done = cut[("next", *prefix, "done")]
        assert torch.equal(ended[("next", *prefix, "done")], done), prefix
        assert done[:, 24].all() and done.sum() == done[:, 24].sum(), prefix  # the 25th step
        assert cut[("next", *prefix, "truncated")][:, 24].all(), prefix
        assert torch.equal(ended[("next", *prefix, "terminated")], done), prefix
        assert not ended[("next", *prefix, "truncated")].any(), prefix
    env.close()
    plain.close()


def test_every_magent2_env_config_gives_flat_observations():
    pytest.importorskip("magent2")
    omegaconf = pytest.importorskip("omegaconf")
    from marlkit.train.builders import make_env
    from marlkit.train.config import env_config

    folder = ROOT / "sota-implementations" / "configs" / "env" / "magent2"
    files = sorted(folder.glob("*.yaml"))
    assert {f.stem for f in files} == {
        "adversarial_pursuit_v4",
        "battle_v4",
        "combined_arms_v6",
        "gather_v5",
        "tiger_deer_v4",
    }
    for path in files:
        cfg = env_config(omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.load(path)))
        assert cfg.name == f"magent2/{path.stem}" and cfg.transforms == ["flatten_observation"]
        env = make_env(
            cfg.name, transforms=cfg.transforms, num_envs=1, max_steps=2, seed=0, **cfg.kwargs
        )
        td = env.rollout(2)
        for group in env.group_map:  # [*B, T, n, features]: what an MLP reads
            spec = env.observation_spec[group, "observation"]
            assert spec.ndim == 3 and td[group, "observation"].shape[-1] == spec.shape[-1]
        env.close()


# ------------------------------------------------------------------------- agent ids (EPyMARL)
LBF = "lbforaging/Foraging-8x8-2p-2f-coop-v3"


def _ids_of(obs: torch.Tensor, n: int) -> torch.Tensor:
    """The one-hot columns every batch entry of ``obs`` ``[*B, n, f + n]`` should end with."""
    return torch.eye(n).expand(*obs.shape[:-1], n)


def test_agent_ids_on_lbf_follow_the_observation_and_its_bounds():
    env = TransformedEnv(marlkit.make(LBF, num_envs=2, seed=0), AgentIdObservation())
    raw = marlkit.make(LBF, num_envs=2, seed=0)
    inner = raw.observation_spec["agents", "observation"]  # Bounded [2, 2, 12]
    spec = env.observation_spec["agents", "observation"]
    assert isinstance(spec, Bounded) and spec.shape == (2, 2, 14) and spec.dtype == torch.float32
    assert torch.equal(spec.low[..., :12], inner.low) and torch.equal(
        spec.high[..., :12], inner.high
    )
    assert spec.low[..., 12:].eq(0).all() and spec.high[..., 12:].eq(1).all()
    td, td_raw = env.rollout(5), raw.rollout(5)  # the same seed, the same random actions
    obs = td["next", "agents", "observation"]
    assert obs.shape == (2, 5, 2, 14)
    assert torch.equal(obs[..., :12], td_raw["next", "agents", "observation"])
    assert torch.equal(obs[..., 12:], _ids_of(obs, 2))  # agent i: a 1 at column 12 + i
    check_env_specs(env)
    check_adapter(env)  # partial resets take the ids off again


def test_agent_ids_strip_off_for_a_partial_reset():
    env = TransformedEnv(marlkit.make(LBF, num_envs=2, seed=0), AgentIdObservation())
    td = env.step(env.rand_action(env.reset()))["next"]
    td["_reset"] = torch.tensor([[True], [False]])
    seen = []
    inner_reset = env.base_env._wrapped_reset

    def spy(tensordict, env_mask):  # what the inner env is handed: its own layout
        seen.append(tensordict["agents", "observation"].shape)
        return inner_reset(tensordict, env_mask)

    env.base_env._wrapped_reset = spy
    out = env.reset(td)
    assert seen == [(2, 2, 12)]
    assert torch.equal(out["agents", "observation"][1], td["agents", "observation"][1])
    assert torch.equal(
        out["agents", "observation"][..., 12:], _ids_of(td["agents", "observation"], 2)
    )
    bad = td.clone()
    bad["agents", "observation"] = td["agents", "observation"][..., :13]
    with pytest.raises(
        ValueError,
        match=r"AgentIdObservation: \('agents', 'observation'\) of a partial reset's input has 13 "
        r"features, expected 14 \(12 of the env's observation and 2 id columns\)",
    ):
        env.reset(bad)


def test_agent_ids_per_group_of_mpe_simple_tag():
    pytest.importorskip("mpe2")
    make = functools.partial(
        marlkit.make, "pettingzoo/mpe2.simple_tag_v3", num_envs=2, seed=0, max_cycles=10
    )
    env, raw = TransformedEnv(make(), AgentIdObservation()), make()
    # three adversaries and one agent: each group its own ids; the state is left alone
    assert env.observation_spec["adversary", "observation"] == Unbounded((2, 3, 16 + 3))
    assert env.observation_spec["agent", "observation"] == Unbounded((2, 1, 14 + 1))
    assert env.state_spec["state"] == raw.state_spec["state"]
    td, td_raw = env.rollout(4), raw.rollout(4)
    for group, f, n in (("adversary", 16, 3), ("agent", 14, 1)):
        obs = td["next", group, "observation"]
        assert torch.equal(obs[..., :f], td_raw["next", group, "observation"])
        assert torch.equal(obs[..., f:], _ids_of(obs, n))
    assert td["next", "agent", "observation"][..., -1].eq(1).all()  # one agent: ones
    check_env_specs(env)
    env.close()
    raw.close()


def test_agent_ids_on_vmas_and_around_batched_native_navigation():
    pytest.importorskip("vmas")
    env = TransformedEnv(
        marlkit.make("vmas/navigation", num_envs=2, n_agents=2, seed=0), AgentIdObservation()
    )
    assert env.observation_spec["agents", "observation"].shape == (2, 2, 18 + 2)
    obs = env.rollout(3)["next", "agents", "observation"]
    assert torch.equal(obs[..., 18:], _ids_of(obs, 2))
    check_env_specs(env)
    make = functools.partial(marlkit.make, "navigation", num_envs=2, n_agents=3, seed=0)
    batched = TransformedEnv(SerialEnv(2, make), AgentIdObservation())  # batch [2, 2]
    assert batched.observation_spec["agents", "observation"].shape == (2, 2, 3, 10 + 3)
    obs = batched.rollout(3)["next", "agents", "observation"]
    assert obs.shape == (2, 2, 3, 3, 13) and torch.equal(obs[..., 10:], _ids_of(obs, 3))
    check_env_specs(batched)
    check_adapter(batched)


class Counts:
    """Two agents seeing integer counts (a ``Box`` of ``int64``): a flat non-float observation."""

    possible_agents = ["counter_0", "counter_1"]

    def __init__(self) -> None:
        self.agents: list[str] = []
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent: str) -> Any:
        return spaces.Box(0, 9, (3,), np.int64)

    def action_space(self, agent: str) -> Any:
        return spaces.Discrete(2)

    def reset(self, seed: int | None = None) -> tuple[dict, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        return self._obs(), {}

    def _obs(self) -> dict:
        return {a: self.rng.integers(0, 10, 3) for a in self.agents}

    def step(self, actions: dict) -> tuple:
        flags = dict.fromkeys(self.agents, False)
        return self._obs(), dict.fromkeys(self.agents, 0.0), flags, flags, {}


def test_agent_ids_cast_an_integer_observation_to_float_and_back():
    env = TransformedEnv(from_parallel(Counts, num_envs=2, seed=0), AgentIdObservation())
    spec = env.observation_spec["agents", "observation"]
    assert spec == Bounded(
        torch.tensor([0.0, 0, 0, 0, 0]), torch.tensor([9.0, 9, 9, 1, 1]), (2, 2, 5), torch.float32
    )
    td, td_raw = env.rollout(3), from_parallel(Counts, num_envs=2, seed=0).rollout(3)
    obs = td["next", "agents", "observation"]
    assert obs.dtype == torch.float32
    assert torch.equal(obs[..., :3], td_raw["next", "agents", "observation"].float())
    check_env_specs(env)
    check_adapter(env)
    td = env.step(env.rand_action(env.reset()))["next"]
    td["_reset"] = torch.tensor([[False], [True]])
    seen = []
    inner_reset = env.base_env._wrapped_reset

    def spy(tensordict, env_mask):  # a partial reset's input goes back to int64, exactly
        seen.append(tensordict["agents", "observation"])
        return inner_reset(tensordict, env_mask)

    env.base_env._wrapped_reset = spy
    env.reset(td)
    assert seen[0].dtype == torch.int64
    assert torch.equal(seen[0], td["agents", "observation"][..., :3].long())


def test_agent_ids_by_name_and_after_flattening_magent2(battle):
    (built,) = make_transforms(["agent_id"])
    assert isinstance(built, AgentIdObservation)
    lbf = TransformedEnv(marlkit.make(LBF, num_envs=2, seed=0), built)
    assert lbf.observation_spec["agents", "observation"].shape == (2, 2, 14)
    with pytest.raises(
        ValueError,
        match=r"AgentIdObservation: \('red', 'observation'\) \[2, 2, 13, 13, 5\] has 3 feature "
        r"dims .*flatten them first: env\.transforms: \[flatten_observation, agent_id\]",
    ):
        TransformedEnv(battle, make_transforms(["agent_id"]))
    env = TransformedEnv(battle, make_transforms(["flatten_observation", "agent_id"]))
    for group in ("red", "blue"):  # two agents a team at map_size 12
        assert env.observation_spec[group, "observation"] == Bounded(
            0.0, torch.tensor([2.0] * 845 + [1.0] * 2), (2, 2, 847)
        )
    assert env.state_spec["state"].shape == (2, 720)  # flattened, no ids
    obs = env.rollout(3)["next", "blue", "observation"]
    assert torch.equal(obs[..., 845:], _ids_of(obs, 2))
    check_env_specs(env)


@pytest.mark.parametrize(
    ("in_keys", "error", "match"),
    [
        (
            [("agents", "obsrvation")],
            KeyError,
            r"AgentIdObservation: \('agents', 'obsrvation'\) is neither an observation nor a "
            r"state key.*Did you mean",
        ),
        (
            None,  # the default: the scouts' observation is a dict
            ValueError,
            r"AgentIdObservation: \('agents', 'observation'\) is a nested observation .*"
            r"env\.transforms: \[concat_observation, agent_id\]",
        ),
        (
            [("agents", "observation", "rgb")],
            ValueError,
            r"AgentIdObservation: \('agents', 'observation', 'rgb'\) \[2, 2, 6, 8, 3\] has 3 "
            r"feature dims after its batch dims \[2, 2\], not one; flatten them first",
        ),
        (
            [("agents", "observation", "ammo")],
            ValueError,
            r"AgentIdObservation: \('agents', 'observation', 'ammo'\) \[2, 2\] has 0 feature "
            "dims after its batch dims",
        ),
    ],
)
def test_entries_agent_ids_cannot_take_are_named(in_keys, error, match):
    with pytest.raises(error, match=match):
        TransformedEnv(scouts(), AgentIdObservation(in_keys=in_keys))


def test_agent_ids_refuse_the_root_state():
    nav = functools.partial(marlkit.make, "navigation", num_envs=2, n_agents=2)
    with pytest.raises(
        ValueError,
        match=r"AgentIdObservation: 'state' \[2, 12\] is not a group's entry \(no agents' dim "
        r"after the env's batch dims \[2\]\)",
    ):
        TransformedEnv(nav(), AgentIdObservation(in_keys=["state"]))
