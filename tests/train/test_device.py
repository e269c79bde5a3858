"""Devices of a training run: ``device`` (training), ``env.device``, ``collector.device``.

This machine has no GPU: these tests run the code that moves data between devices on the cpu
(``device="cpu"`` given explicitly, batches that arrive with no device, ``meta`` where only the
move is checked), check that each batch is moved once and no minibatch is, and pin the errors
for devices the machine lacks. ``gpu`` tests run the real moves where CUDA is present."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import marlkit
from marlkit.collectors import Collector
from marlkit.envs import Compose, RewardSum, StepCounter, TransformedEnv
from marlkit.modules import Categorical as CategoricalDist
from marlkit.modules import MultiAgentMLP, ProbabilisticActor, StateValueCritic, TanhNormal
from marlkit.objectives import GAE, ClipPPOLoss
from marlkit.replay import SamplerWithoutReplacement
from marlkit.train import TrainingRun, adam_per_group, update_groups
from marlkit.train.config import ConfigError, check_device
from marlkit.train.run import _on_device
from marlkit.train.scripts import _env_device, group_buffers, to_training_device

NO_CUDA = not torch.cuda.is_available()


def nav(num_envs=4, max_steps=10, **kwargs):
    env = marlkit.make("navigation", num_envs=num_envs, n_agents=3, seed=0, **kwargs)
    return TransformedEnv(env, Compose(StepCounter(max_steps), RewardSum()))


# ------------------------------------------------------------------------------ config
def test_check_device_accepts_the_devices_this_machine_has():
    assert check_device("device", "cpu") == "cpu"
    assert check_device("env.device", None, allow_none=True) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("gpu", r"device must be a torch device \(cpu, cuda, cuda:<index>, mps\), got 'gpu'"),
        ("cuda:x", r"device must be a torch device .*got 'cuda:x'"),
        ("meta", r"device=meta: training and simulation run on cpu, cuda or mps"),
        (0, r"device must be a device name \(a str\), got int"),
        (None, r"device must be a device name \(a str\), got NoneType"),
    ],
)
def test_a_bad_device_is_a_config_error(value, message):
    with pytest.raises(ConfigError, match=message):
        check_device("device", value)


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
@pytest.mark.parametrize("value", ["cuda", "cuda:0"])
def test_cuda_without_cuda_says_so(value):
    with pytest.raises(
        ConfigError,
        match=rf"device={value}: CUDA is not available on this machine \(torch.cuda.is_available"
        r"\(\) is False; torch .*\): use device=cpu",
    ):
        check_device("device", value)


def test_the_env_device_goes_to_envs_that_take_one_and_is_refused_by_others():
    # navigation (and VMAS, the native scenarios) take a device argument
    assert _env_device("navigation", "cpu", {}) == {"device": "cpu"}
    assert _env_device("vmas/balance", "cpu", {}) == {"device": "cpu"}
    assert _env_device("navigation", None, {}) == {}
    with pytest.raises(ConfigError, match=r"env.device=cpu and env.kwargs.device=meta disagree"):
        _env_device("navigation", "cpu", {"device": "meta"})
    # an env without one simulates on the cpu: env.device=cpu is what it does anyway
    marlkit.register(
        "test_device_free_env",
        lambda num_envs=1, seed=None: marlkit.make("navigation", num_envs=num_envs, seed=seed),
        override=True,
    )
    assert _env_device("test_device_free_env", "cpu", {}) == {}
    with pytest.raises(
        ConfigError,
        match=r"env.device=mps: env 'test_device_free_env' takes no device argument \(it "
        r"simulates on the cpu\): leave env.device out",
    ):
        _env_device("test_device_free_env", "mps", {})


def test_to_training_device_moves_every_module():
    policy, loss = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    assert to_training_device({"device": "meta"}, policy, loss) == torch.device("meta")
    assert policy.weight.device.type == "meta" and loss.bias.device.type == "meta"
    assert to_training_device({}, torch.nn.Linear(1, 1)) == torch.device("cpu")


def test_to_training_device_moves_the_bounds_a_distribution_holds():
    # per-agent bounds (not one number) are tensors of the distribution's fixed arguments, which
    # nn.Module.to does not move: a TanhNormal on cuda would meet bounds on the cpu
    actor = ProbabilisticActor(
        MultiAgentMLP(4, 4, 2, depth=0),
        group="agents",
        distribution_class=TanhNormal,
        distribution_kwargs={"low": -torch.ones(2, 2), "high": torch.ones(2, 2)},
    )
    to_training_device({"device": "meta"}, torch.nn.ModuleList([actor]))
    (sampler,) = [m for m in actor.modules() if hasattr(m, "distribution_kwargs")]
    assert {v.device.type for v in sampler.distribution_kwargs.values()} == {"meta"}


# ------------------------------------------------------------------------------ TrainingRun
def test_training_run_refuses_a_bad_device(tmp_path):
    with pytest.raises(ValueError, match="device 'gpu' is not a torch device"):
        TrainingRun(tmp_path, eval_env=nav(), eval_steps=5, video=False, device="gpu")
    with pytest.raises(TypeError, match=r"device must be a str or a torch.device, got int"):
        TrainingRun(tmp_path, eval_env=nav(), eval_steps=5, video=False, device=0)  # type: ignore[arg-type]


class _DeviceLess:
    """The batches of a real collector as they come from a source that does not say where they
    are (``device=None``): a run with a ``device`` must move each one (on the cpu here)."""

    def __init__(self, collector):
        self.collector = collector
        self.num_batches = collector.num_batches
        self.frames_per_batch = collector.frames_per_batch
        self.total_frames = collector.total_frames

    @property
    def frames(self):
        return self.collector.frames

    def __iter__(self):
        for batch in self.collector:
            yield batch.clear_device_()


def _ppo_objective(terms):
    return terms["loss_objective"] + terms["loss_critic"] + terms["loss_entropy"]


def _mappo_parts(env):
    group = "agents"
    n = len(env.group_map[group])
    obs = env.observation_spec[group, "observation"].shape[-1]
    spec = env.action_spec[group, "action"]
    actor = ProbabilisticActor(
        MultiAgentMLP(obs, spec.n, n, share_params=True, depth=1, num_cells=16),
        group=group,
        distribution_class=CategoricalDist,
    )
    critic = StateValueCritic(n, obs, group=group, centralised=True, depth=1, num_cells=16)
    loss = ClipPPOLoss(actor, critic, group=group)
    gae = GAE(0.99, 0.9, value_network=critic, group=group)
    return actor, torch.nn.ModuleDict({group: loss}), gae


def test_each_batch_moves_once_and_no_minibatch_moves(tmp_path, monkeypatch):
    """A real MAPPO loop (GAE, a buffer per group, 3 epochs x 4 minibatches) on a run with
    ``device="cpu"`` fed batches that carry no device: the run moves each batch once (a
    counting hook on TensorDict.to), the buffers take it on the run's device, and the update's
    minibatches are drawn there with no move."""
    env = nav(continuous_actions=False)
    policy, losses, gae = _mappo_parts(env)
    device = to_training_device({"device": "cpu"}, policy, losses, gae)
    optims = adam_per_group(losses, 1e-3)
    collector = _DeviceLess(Collector(env, policy, frames_per_batch=40, total_frames=120))
    run = TrainingRun(
        tmp_path,
        eval_env=nav(continuous_actions=False),
        eval_steps=10,
        video=False,
        backends=["csv"],
        device=device,
    )
    buffers = group_buffers(["agents"], 40, SamplerWithoutReplacement, 10)
    moves: list[str] = []
    original = TensorDict.to

    def counting(self, *args, **kwargs):
        moves.append(phase)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TensorDict, "to", counting)
    phase = "collect"
    for batch in run.batches(collector):
        assert batch.device == device
        phase = "update"
        with torch.no_grad():
            gae(batch)
        buffers.empty()
        buffers.extend(batch.reshape(-1))
        metrics = update_groups(
            losses, optims, buffers, 12, max_grad_norm=1.0, objective=_ppo_objective
        )
        run.end_iteration(batch, metrics, policy=policy, state=lambda: {}, frames=collector.frames)
        phase = "collect"
    run.finish(policy)
    assert run.batches_moved == 3
    assert moves.count("collect") == 3 and moves.count("update") == 0
    assert buffers["agents"].sample().device == device  # minibatches are drawn there


def test_batches_already_on_the_device_are_not_moved(tmp_path):
    env = nav()
    collector = Collector(env, None, frames_per_batch=40, total_frames=80)
    run = TrainingRun(
        tmp_path, eval_env=nav(), eval_steps=10, video=False, backends=["csv"], device="cpu"
    )
    for batch in run.batches(collector):
        run.end_iteration(batch, {}, policy=None, state=lambda: {}, frames=collector.frames)
    run.finish(None)
    assert run.batches_moved == 0


def test_the_evaluated_policy_runs_on_the_training_device_and_answers_on_the_env_s():
    seen = []

    def policy(td):
        seen.append(td.device)
        return TensorDict({}, batch_size=td.batch_size, device=td.device)

    moved = _on_device(policy, torch.device("meta"))
    out = moved(TensorDict({"x": torch.zeros(3)}, batch_size=[3], device="cpu"))
    assert seen == [torch.device("meta")] and out.device == torch.device("cpu")


def test_a_run_on_the_env_s_device_evaluates_the_policy_itself(tmp_path):
    run = TrainingRun(tmp_path, eval_env=nav(), eval_steps=5, video=False, device="cpu")
    try:
        assert run._evaluated_policy(print) is print
    finally:
        run.close()


# ------------------------------------------------------------------------------ envs
def test_native_scenarios_pick_their_twin_by_device():
    """cpu: the C++ kernels (when built), or the torch twin on request; the torch twin is
    what any other device runs (the gpu test below; meta is no device to simulate on)."""
    assert nav().base_env.device == torch.device("cpu")
    assert marlkit.make("navigation", num_envs=2, device="cpu", backend="torch").backend == "torch"
    with pytest.raises(ValueError, match="device 'meta' is not available here"):
        marlkit.make("navigation", num_envs=2, device="meta")


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs CUDA")
def test_vmas_and_the_native_twin_step_on_cuda():
    for name, kwargs in (("navigation", {}), ("vmas/balance", {})):
        env = marlkit.make(name, num_envs=4, seed=0, device="cuda", **kwargs)
        assert env.device.type == "cuda"
        if name == "navigation":
            assert env.backend == "torch"
        td = env.rollout(3, break_when_any_done=False)
        assert td.device.type == "cuda"
        env.close()


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs CUDA")
def test_a_run_on_cuda_with_the_env_on_cpu(tmp_path):
    env = nav(continuous_actions=False)
    policy, losses, gae = _mappo_parts(env)
    device = to_training_device({"device": "cuda"}, policy, losses, gae)
    optims = adam_per_group(losses, 1e-3)
    collector = Collector(env, policy, frames_per_batch=40, total_frames=80, device="cpu")
    run = TrainingRun(
        tmp_path,
        eval_env=nav(continuous_actions=False),
        eval_steps=10,
        video=False,
        backends=["csv"],
        device=device,
    )
    buffers = group_buffers(["agents"], 40, SamplerWithoutReplacement, 10)
    for batch in run.batches(collector):
        with torch.no_grad():
            gae(batch)
        buffers.empty()
        buffers.extend(batch.reshape(-1))
        metrics = update_groups(
            losses, optims, buffers, 4, max_grad_norm=1.0, objective=_ppo_objective
        )
        collector.update_policy_weights_()
        run.end_iteration(batch, metrics, policy=policy, state=lambda: {}, frames=collector.frames)
    run.finish(policy)
    assert run.batches_moved == 2
