"""The single-process Collector on real envs: batches and trajectory ids, auto-resets, random
and policy actions, exploration, weights, seeds, state, trajectories split, and bad policies."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import ProbabilisticTensorDictModule, TensorDictModule
from torch import nn

import marlkit
from marlkit.collectors import Collector, split_trajectories
from marlkit.data.exploration import exploration_mode, set_exploration
from marlkit.envs import EnvBase, InvalidActionError, MissingActionError, SerialEnv
from marlkit.modules import MultiAgentMLP, NormalParamExtractor, ProbabilisticActor, TanhNormal

ACT = ("agents", "action")
IDS = ("collector", "traj_ids")


def nav(**kwargs):  # type: ignore[no-untyped-def]
    return marlkit.make("navigation", **{"num_envs": 4, "n_agents": 2, "seed": 0, **kwargs})


def constant_policy(value: float):  # type: ignore[no-untyped-def]
    """A policy that writes the same action everywhere (and records its exploration mode)."""
    seen: list[str] = []

    def policy(td):  # type: ignore[no-untyped-def]
        seen.append(exploration_mode())
        td.set(ACT, torch.full((*td.batch_size, 2, 2), value))
        return td

    policy.seen = seen  # type: ignore[attr-defined]
    return policy


# ---------------------------------------------------------------------- batches and ids
def test_batches_have_the_env_batch_then_time_and_the_frames_add_up() -> None:
    collector = Collector(nav(), None, frames_per_batch=24, total_frames=50)
    batches = list(collector)
    assert collector.num_batches == 3 and len(batches) == 3  # 50 frames: three whole batches
    assert all(b.batch_size == (4, 6) for b in batches)
    assert batches[0]["next", "agents", "reward"].shape == (4, 6, 2, 1)
    assert collector.frames == 72 and collector.batches == 3
    assert collector.frames_per_s > 0
    assert next(iter(collector), None) is None  # exhausted


def test_trajectory_ids_are_unique_and_change_exactly_after_a_done() -> None:
    collector = Collector(nav(), None, frames_per_batch=40, total_frames=400, max_frames_per_traj=3)
    seen_ids: set[int] = set()
    last = None
    for batch in collector:
        ids, done = batch[IDS], batch["next", "done"][..., 0]
        if last is not None:  # a batch continues the last one's trajectories
            cont = torch.where(last[1], -1, last[0])
            assert torch.equal(torch.where(cont >= 0, ids[:, 0], -1), cont)
        for e in range(4):
            for t in range(1, 10):
                assert (ids[e, t] != ids[e, t - 1]) == done[e, t - 1]
        owners = {int(i): e for e in range(4) for i in ids[e]}
        assert all(owners[int(i)] == e for e in range(4) for i in ids[e])  # one env per id
        new = set(owners) - (set() if last is None else set(last[0].tolist()))
        assert not new & seen_ids
        seen_ids |= set(owners)
        last = (ids[:, -1], done[:, -1])
    assert len(seen_ids) > 4 * 10  # 3-step trajectories over 100 steps per env


def test_max_frames_per_traj_truncates_through_the_done_rule() -> None:
    batch = next(iter(Collector(nav(), None, frames_per_batch=40, max_frames_per_traj=4)))
    truncated = batch["next", "truncated"][..., 0]
    assert truncated[:, 3].all() and truncated[:, 7].all() and not truncated[:, :3].any()
    assert batch["next", "agents", "truncated"][:, 3].all()  # every agent's flag too
    assert batch["next", "collector", "step_count"][0, :5, 0].tolist() == [1, 2, 3, 4, 1]


def test_reset_at_each_iter_starts_every_batch_afresh() -> None:
    collector = Collector(
        nav(),
        None,
        frames_per_batch=12,
        total_frames=36,
        reset_at_each_iter=True,
        max_frames_per_traj=100,
    )
    for batch in collector:
        assert (batch["collector", "step_count"][:, 0, 0] == 0).all()


def test_split_trajectories_regroups_and_pads() -> None:
    batch = next(iter(Collector(nav(), None, frames_per_batch=40, max_frames_per_traj=4)))
    split = split_trajectories(batch)
    mask = split["collector", "mask"]
    assert split.batch_size == (12, 4) and mask.sum() == 40  # 10 steps per env: 4 + 4 + 2
    collector = Collector(nav(), None, frames_per_batch=40, max_frames_per_traj=4, split_trajs=True)
    split = next(iter(collector))
    assert split["collector", "mask"].sum() == 40
    lengths = split["collector", "mask"].sum(-1).tolist()
    assert lengths == [4, 4, 2] * 4
    assert torch.equal(split[IDS][:, 0].unique(), batch[IDS].unique())
    padded = split["next", "agents", "reward"][2, 2:]
    assert (padded == 0).all()


def test_a_batched_env_gives_batches_of_its_whole_batch() -> None:
    env = SerialEnv(2, marlkit.make, {"name": "navigation", "num_envs": 3, "n_agents": 2})
    batch = next(iter(Collector(env, None, frames_per_batch=30)))
    assert batch.batch_size == (2, 3, 5) and batch[IDS].unique().numel() >= 6


# ---------------------------------------------------------------------- policies
def test_a_tensordict_module_policy_and_init_random_frames() -> None:
    policy = TensorDictModule(
        nn.Sequential(nn.Linear(8, 2), nn.Tanh()),
        in_keys=[("agents", "observation")],
        out_keys=[ACT],
    )
    nn.init.zeros_(policy.module[0].weight), nn.init.zeros_(policy.module[0].bias)
    collector = Collector(
        nav(), policy, frames_per_batch=16, total_frames=48, init_random_frames=16
    )
    first, second, third = list(collector)
    assert first[ACT].abs().sum() > 0  # random while the first 16 frames are collected
    assert (second[ACT] == 0).all() and (third[ACT] == 0).all()


def test_the_policy_runs_under_the_collectors_exploration_mode() -> None:
    for mode in ("random", "deterministic"):
        policy = constant_policy(0.5)
        next(iter(Collector(nav(), policy, frames_per_batch=8, exploration=mode)))
        assert policy.seen == [mode, mode]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"exploration must be one of \['random', 'determin"):
        Collector(nav(), None, frames_per_batch=8, exploration="greedy")  # type: ignore[arg-type]


def test_probabilistic_tensordict_modules_follow_the_mode() -> None:
    # tensordict's own probabilistic modules read the interaction type the mode sets: a Normal
    # around 0 gives exactly 0 in "deterministic" mode and samples in "random" mode.
    actor = ProbabilisticTensorDictModule(
        in_keys={"loc": ("agents", "loc"), "scale": ("agents", "scale")},
        out_keys=[ACT],
        distribution_class=torch.distributions.Normal,
    )

    def act(td):  # type: ignore[no-untyped-def]
        shape = (*td.batch_size, 2, 2)
        td.set(("agents", "loc"), torch.zeros(shape))
        td.set(("agents", "scale"), torch.full(shape, 0.1))
        return actor(td)

    for mode, zero in (("deterministic", True), ("random", False)):
        batch = next(iter(Collector(nav(), act, frames_per_batch=8, exploration=mode)))
        assert bool((batch[ACT] == 0).all()) is zero
    with set_exploration("deterministic"):
        assert exploration_mode() == "deterministic"
    assert exploration_mode() == "random"


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda td: td.exclude(ACT),
            MissingActionError,
            r"the action \('agents', 'action'\) is missing",
        ),
        (lambda td: td.set(ACT, torch.zeros(4, 2, 3)), InvalidActionError, r"shape \[4, 2, 3\]"),
        (
            lambda td: td.set(ACT, torch.zeros(4, 2, 2, dtype=torch.float64)),
            InvalidActionError,
            "float64",
        ),
        (
            lambda td: td.set(ACT, torch.full((4, 2, 2), float("nan"))),
            InvalidActionError,
            "non-finite",
        ),
        (lambda td: torch.zeros(3), TypeError, "returned Tensor, not a TensorDict"),
    ],
)
def test_a_bad_policy_output_names_the_key_and_what_came(make, error, message) -> None:  # type: ignore[no-untyped-def]
    env = nav()
    env.validate_actions = False  # checked by the collector all the same (first step of a batch)
    collector = Collector(env, make, frames_per_batch=8)
    with pytest.raises(error, match=message):
        next(iter(collector))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            lambda t: None if t == 0 else torch.zeros(4, 2),
            r"step 1 of the batch adds \('agents', 'extra'\)",
        ),
        (
            lambda t: torch.zeros(4, 2, t + 1),
            r"'extra'\) has shape \[4, 2, 2\] at step 1 .* \[4, 2, 1\]",
        ),
    ],
)
def test_a_policy_whose_keys_change_between_steps_is_named(extra, message) -> None:  # type: ignore[no-untyped-def]
    # a key written from the second step on, or with another shape: the steps cannot stack
    # into a batch, and the error says which key and step (tensordict's names neither)
    steps = iter(range(100))

    def policy(td: TensorDictBase) -> TensorDictBase:
        value = extra(next(steps))
        if value is not None:
            td.set(("agents", "extra"), value)
        return td.set(ACT, torch.zeros(4, 2, 2))

    collector = Collector(nav(), policy, frames_per_batch=8)
    with pytest.raises(ValueError, match=message):
        next(iter(collector))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(
        ValueError, match=r"frames_per_batch=10 is not a multiple of the 4 envs.*use 8 or 12"
    ):
        Collector(nav(), None, frames_per_batch=10)
    with pytest.raises(ValueError, match="total_frames must be -1"):
        Collector(nav(), None, frames_per_batch=8, total_frames=0)
    with pytest.raises(TypeError, match="policy must be callable or None"):
        Collector(nav(), "policy", frames_per_batch=8)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not an EnvBase"):
        Collector(lambda: object(), None, frames_per_batch=8)  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="storing_device 'nowhere' is not a torch device"):
        Collector(nav(), None, frames_per_batch=8, storing_device="nowhere")
    with pytest.raises(ValueError, match="max_frames_per_traj must be an int >= 1"):
        Collector(nav(), None, frames_per_batch=8, max_frames_per_traj=0)


# ---------------------------------------------------------------------- control and state
def test_update_policy_weights_loads_given_weights() -> None:
    linear = nn.Linear(8, 2)
    policy = TensorDictModule(nn.Sequential(linear, nn.Tanh()), [("agents", "observation")], [ACT])
    collector = Collector(nav(), policy, frames_per_batch=8)
    collector.update_policy_weights_()  # the collector runs this very policy: nothing to do
    zeros = {k: torch.zeros_like(v) for k, v in policy.state_dict().items()}
    collector.update_policy_weights_(zeros)
    assert (next(iter(collector))[ACT] == 0).all()
    weights = TensorDict.from_module(policy).apply(lambda t: torch.full_like(t, 0.01))
    collector.update_policy_weights_(weights)
    assert (next(iter(collector))[ACT] != 0).all()
    with pytest.raises(TypeError, match=r"needs an nn\.Module policy"):
        Collector(nav(), constant_policy(0.1), frames_per_batch=8).update_policy_weights_(zeros)


def linear_policy() -> TensorDictModule:
    return TensorDictModule(
        nn.Sequential(nn.Linear(8, 2), nn.Tanh()), [("agents", "observation")], [ACT]
    )


@pytest.mark.parametrize("form", ["state_dict", "TensorDict"])
def test_update_policy_weights_copies_into_the_policys_own_parameters(form: str) -> None:
    # An optimizer built on policy.parameters() must keep training the policy the collector
    # runs: the weights are copied into its tensors, never swapped in.
    policy = linear_policy()
    weight = policy.module[0].weight
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    collector = Collector(nav(), policy, frames_per_batch=8)
    zeros = TensorDict.from_module(policy).data.clone().zero_()
    collector.update_policy_weights_(
        zeros if form == "TensorDict" else zeros.flatten_keys(".").to_dict()
    )
    assert policy.module[0].weight is weight and isinstance(weight, nn.Parameter)
    assert (weight == 0).all() and weight.requires_grad
    assert (next(iter(collector))[ACT] == 0).all()
    optimizer.zero_grad()
    policy(next(iter(collector))[:, 0].clone())[ACT].sum().backward()
    optimizer.step()
    assert not (weight == 0).all()  # the step reached the policy...
    assert not (next(iter(collector))[ACT] == 0).all()  # ...that the collector runs
    assert (zeros["module", "0", "weight"] == 0).all()  # and left the given weights alone


def test_update_policy_weights_refuses_what_does_not_fit_and_loads_nothing() -> None:
    policy = linear_policy()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    collector = Collector(nav(), policy, frames_per_batch=8)
    weight, bias = torch.zeros(2, 8), torch.zeros(2)
    with pytest.raises(
        ValueError,
        match=r"weight 'module.0.bias' has shape \[1\], the policy's has shape \[2\] "
        r"\(nothing was loaded\)",
    ):
        collector.update_policy_weights_(
            TensorDict({"module": {"0": {"weight": weight, "bias": torch.zeros(1)}}})
        )
    with pytest.raises(
        ValueError,
        match=r"'module.0.weight' has shape \[8, 2\] and dtype torch.float64, the policy's has "
        r"shape \[2, 8\] and dtype torch.float32; weight 'module.0.bias' has dtype torch.int64",
    ):
        collector.update_policy_weights_(
            {
                "module.0.weight": torch.zeros(8, 2, dtype=torch.float64),
                "module.0.bias": torch.zeros(2, dtype=torch.int64),
            }
        )
    with pytest.raises(KeyError, match=r"missing \['module.0.bias'\], unexpected \[\]"):
        collector.update_policy_weights_(TensorDict({"module": {"0": {"weight": weight}}}))
    with pytest.raises(KeyError, match=r"missing \[\], unexpected \['module.1.weight'\]"):
        collector.update_policy_weights_(
            {"module.0.weight": weight, "module.0.bias": bias, "module.1.weight": bias}
        )
    with pytest.raises(TypeError, match=r"weight 'module\.0\.bias' is a float, not a tensor"):
        collector.update_policy_weights_({"module.0.weight": weight, "module.0.bias": 0.0})
    with pytest.raises(TypeError, match="a state_dict or a TensorDict, got list"):
        collector.update_policy_weights_([weight, bias])  # type: ignore[arg-type]
    for name, value in policy.state_dict().items():  # nothing was loaded, not even what fit
        assert torch.equal(value, before[name]), name


class _Scaled(nn.Module):
    """A linear layer scaled by a buffer that state_dict leaves out (persistent=False)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 2)
        self.register_buffer("scale", torch.tensor(0.5), persistent=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(obs)) * self.scale


def test_update_policy_weights_takes_a_state_dict_without_non_persistent_buffers() -> None:
    policy = TensorDictModule(_Scaled(), [("agents", "observation")], [ACT])
    collector = Collector(nav(), policy, frames_per_batch=8)
    state = {k: torch.full_like(v, 0.1) for k, v in policy.state_dict().items()}
    assert "module.scale" not in state
    collector.update_policy_weights_(state)
    assert policy.module.scale.item() == 0.5  # left out: kept
    weights = TensorDict.from_module(policy).data.clone()
    weights["module", "scale"] = torch.tensor(0.25)
    collector.update_policy_weights_(weights)  # given: loaded
    assert policy.module.scale.item() == 0.25
    with pytest.raises(KeyError, match=r"missing \['module.linear.bias'\]"):
        collector.update_policy_weights_({"module.linear.weight": torch.zeros(2, 8)})


def test_update_policy_weights_without_weights_is_a_no_op_without_a_module() -> None:
    for policy in (None, constant_policy(0.1), TensorDictModule(nn.Tanh(), ["x"], ["y"])):
        collector = Collector(nav(), policy, frames_per_batch=8)
        collector.update_policy_weights_()  # nothing to copy, as for every collector
    with pytest.raises(TypeError, match=r"needs an nn\.Module policy, got None"):
        Collector(nav(), None, frames_per_batch=8).update_policy_weights_({})


def _stochastic_actor() -> TensorDictModule:
    net = nn.Sequential(MultiAgentMLP(8, 4, 2, num_cells=8), NormalParamExtractor())
    return ProbabilisticActor(
        net, group="agents", distribution_class=TanhNormal, return_log_prob=True
    )


def test_set_seed_makes_a_stochastic_policy_reproducible() -> None:
    actor = _stochastic_actor()

    def run(seed: int) -> list[TensorDictBase]:
        collector = Collector(
            marlkit.make("navigation", num_envs=2, n_agents=2),
            actor,
            frames_per_batch=8,
            total_frames=16,
            exploration="random",
        )
        collector.set_seed(seed)
        torch.rand(())  # after set_seed, only the seed counts
        return list(collector)

    first, again, other = run(0), run(0), run(1)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a[ACT], b[ACT])
        assert torch.equal(a["agents", "action_log_prob"], b["agents", "action_log_prob"])
    assert not torch.equal(first[0][ACT], other[0][ACT])
    # The global generator is seeded from the seed, not with it: the policy's noise is not the
    # stream of the env's random actions (a torch generator seeded with the seed itself).
    Collector(nav(), None, frames_per_batch=8).set_seed(5)
    assert not torch.equal(torch.rand(4), torch.rand(4, generator=torch.Generator().manual_seed(5)))


def test_the_same_seed_gives_the_same_batches() -> None:
    runs = []
    for _ in range(2):
        collector = Collector(nav(), None, frames_per_batch=16, total_frames=48)
        assert collector.set_seed(7) == 8
        runs.append(list(collector))
    for a, b in zip(*runs):
        assert torch.equal(a[ACT], b[ACT]) and torch.equal(
            a["next", "agents", "observation"], b["next", "agents", "observation"]
        )


def test_state_dict_round_trip_keeps_ids_unique() -> None:
    collector = Collector(nav(), None, frames_per_batch=16, max_frames_per_traj=2)
    first = next(iter(collector))
    state = collector.state_dict()
    assert state["frames"] == 16 and state["batches"] == 1 and state["traj_counter"] > 4
    fresh = Collector(nav(), None, frames_per_batch=16, max_frames_per_traj=2)
    fresh.load_state_dict(state)
    assert fresh.frames == 16
    second = next(iter(fresh))
    assert not set(second[IDS].unique().tolist()) & set(first[IDS].unique().tolist())
    with pytest.raises(KeyError, match="no 'traj_counter'"):
        fresh.load_state_dict({"frames": 1, "batches": 1})


def test_a_resumed_collector_reaches_total_frames_with_another_batch_size() -> None:
    first = Collector(nav(), None, frames_per_batch=16, total_frames=32)
    assert [b.numel() for b in first] == [16, 16]
    state = first.state_dict()
    # the same run, resumed with smaller and with larger batches: it stops at its total
    for frames_per_batch, total, batches in ((8, 64, [8] * 4), (32, 96, [32, 32])):
        resumed = Collector(nav(), None, frames_per_batch=frames_per_batch, total_frames=total)
        resumed.load_state_dict(state)
        assert resumed.num_batches == 2 + len(batches)
        assert [b.numel() for b in resumed] == batches and resumed.frames == total
    done = Collector(nav(), None, frames_per_batch=16, total_frames=16)
    done.load_state_dict(state)  # a total already reached: nothing more
    assert list(done) == [] and done.num_batches == 2


def test_a_resumed_collector_does_not_replay_the_run_s_first_episodes() -> None:
    obs = ("agents", "observation")

    def collector() -> Collector:
        c = Collector(nav(seed=None), None, frames_per_batch=8)
        c.set_seed(3)
        return c

    run = collector()
    starts = [next(iter(run))[obs][:, 0] for _ in range(2)]
    state = run.state_dict()
    assert state["seed"] == 3
    resumed = [collector() for _ in range(2)]
    for c in resumed:
        c.load_state_dict(state)
    again = [next(iter(c))[obs][:, 0] for c in resumed]
    assert not torch.equal(again[0], starts[0])  # not the run's first episodes again
    assert torch.equal(again[0], again[1])  # the same resume gives the same episodes


def test_an_env_built_from_a_factory_is_closed_when_construction_fails() -> None:
    built: list[EnvBase] = []

    def factory() -> EnvBase:
        built.append(nav())
        return built[-1]

    with pytest.raises(ValueError, match="frames_per_batch=7 is not a multiple of the 4 envs"):
        Collector(factory, None, frames_per_batch=7)
    assert len(built) == 1 and built[0].is_closed  # the collector built it, so it closes it
    env = nav()
    with pytest.raises(ValueError, match="frames_per_batch=7 is not a multiple"):
        Collector(env, None, frames_per_batch=7)
    assert not env.is_closed  # the user's env stays open


def test_reset_postproc_progress_and_shutdown(capsys: pytest.CaptureFixture[str]) -> None:
    env = nav()
    collector = Collector(
        env,
        None,
        frames_per_batch=8,
        total_frames=16,
        progress=True,
        postproc=lambda b: b.set("seen", torch.ones(b.batch_size)),
    )
    batches = list(collector)
    assert all((b["seen"] == 1).all() for b in batches)
    assert "frame" in capsys.readouterr().err  # the tqdm bar
    collector.reset()
    collector.shutdown()
    collector.shutdown()  # idempotent
    assert collector.is_shut_down and not env.is_closed  # the user's env stays open
    with pytest.raises(RuntimeError, match="shut down"):
        collector.next()
    with Collector(nav, None, frames_per_batch=8) as owned:  # built from a factory: owned
        inner = owned.env
        next(iter(owned))
    assert inner.is_closed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_policy_env_and_storage_on_different_devices() -> None:
    policy = TensorDictModule(
        nn.Sequential(nn.Linear(8, 2), nn.Tanh()).cuda(), [("agents", "observation")], [ACT]
    )
    collector = Collector(nav(), policy, frames_per_batch=8, storing_device="cpu")
    batch = next(iter(collector))
    assert batch.device == torch.device("cpu") and collector.device.type == "cuda"


def test_a_policy_that_returns_only_its_outputs_keeps_the_observations() -> None:
    # The batch held the policy's new TensorDict alone: transitions without observations.
    env = marlkit.make("navigation", num_envs=4, n_agents=2, seed=0)

    def outputs_only(td: TensorDict) -> TensorDict:
        return TensorDict({("agents", "action"): torch.zeros(4, 2, 2)}, [4])

    batch = Collector(env, outputs_only, frames_per_batch=8).next()
    assert batch["agents", "observation"].shape == (
        4,
        2,
        2,
        env.observation_spec["agents", "observation"].shape[-1],
    )
    assert bool((batch["agents", "action"] == 0).all())
    assert ("next", "agents", "observation") in batch.keys(True)
