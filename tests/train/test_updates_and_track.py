"""``gradient_steps`` and ``TrainingRun.track``: what every script's loop and checkpoints are
made of."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from marlkit.collectors import Collector
from marlkit.envs import make_episodic
from marlkit.train import TrainingRun, gradient_steps


class _Loss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([3.0]))

    def forward(self, td: TensorDict) -> TensorDict:
        error = self.w * td["x"]
        loss = (error**2).mean()
        return TensorDict(
            {"loss": loss, "w": self.w.detach().clone()[0], "td_error": error.detach()}, []
        )


def test_gradient_steps_step_clip_and_report() -> None:
    loss = _Loss()
    optim = torch.optim.SGD(loss.parameters(), lr=0.1)
    batch = TensorDict({"x": torch.ones(4)}, [4])
    moved: list[float] = []
    last = gradient_steps(
        loss, optim, lambda: batch, 3, max_grad_norm=100.0, after_step=lambda: moved.append(1)
    )
    assert len(moved) == 3 and set(last) == {"loss", "w", "grad_norm"}  # no td_error
    assert last["w"] == pytest.approx(3.0 * 0.8**2)  # w after two steps, as the third saw it
    assert loss.w.item() == pytest.approx(3.0 * 0.8**3)  # d/dw w^2 = 2w; w -= 0.2 w
    loss.w.data.fill_(3.0)
    mean = gradient_steps(loss, optim, lambda: batch, 2, max_grad_norm=100.0, report="mean")
    assert mean["w"] == pytest.approx((3.0 + 2.4) / 2)
    clipped = gradient_steps(loss, optim, lambda: batch, 1, max_grad_norm=0.5)
    assert clipped["grad_norm"] > 0.5  # the norm before clipping is reported
    with pytest.raises(ValueError, match="steps must be an int >= 1, got 0"):
        gradient_steps(loss, optim, lambda: batch, 0, max_grad_norm=1.0)
    with pytest.raises(ValueError, match="report must be 'last' or 'mean'"):
        gradient_steps(loss, optim, lambda: batch, 1, max_grad_norm=1.0, report="max")  # type: ignore[arg-type]


class _TwoNets(torch.nn.Module):
    """An "actor" weight and a "critic" weight whose gradient is 100 times the actor's."""

    def __init__(self) -> None:
        super().__init__()
        self.actor = torch.nn.Parameter(torch.tensor([1.0]))
        self.critic = torch.nn.Parameter(torch.tensor([1.0]))

    def forward(self, td: TensorDict) -> TensorDict:
        return TensorDict({"loss": (self.actor * 3.0 + self.critic * 300.0).sum()}, [])


def test_each_parameter_group_can_be_clipped_on_its_own() -> None:
    """``clip_per_param_group`` (separate actor and critic clipping, as JaxMARL's and EPyMARL's
    PPO): the critic's large gradient no longer shrinks the actor's step."""
    batch = TensorDict({}, [])
    together, apart = _TwoNets(), _TwoNets()
    opt_t = torch.optim.SGD(together.parameters(), lr=1.0)
    opt_a = torch.optim.SGD([{"params": [apart.actor]}, {"params": [apart.critic]}], lr=1.0)
    out_t = gradient_steps(together, opt_t, lambda: batch, 1, max_grad_norm=1.0)
    out_a = gradient_steps(
        apart, opt_a, lambda: batch, 1, max_grad_norm=1.0, clip_per_param_group=True
    )
    # together: the gradient (3, 300) scaled to norm 1, the actor moves by 0.01
    assert 1.0 - together.actor.item() == pytest.approx(3.0 / (3.0**2 + 300.0**2) ** 0.5, rel=1e-4)
    # apart: each clipped to 1 on its own, the actor moves by 1
    assert 1.0 - apart.actor.item() == pytest.approx(1.0)
    assert 1.0 - apart.critic.item() == pytest.approx(1.0)
    # both report the norm of the whole gradient before clipping
    assert (
        out_a["grad_norm"]
        == pytest.approx(out_t["grad_norm"])
        == pytest.approx((3.0**2 + 300.0**2) ** 0.5)
    )


def _run(folder, resume=False) -> tuple[TrainingRun, Collector, torch.nn.Linear]:
    env = make_episodic("navigation", num_envs=2, max_steps=10, seed=0, n_agents=2)
    eval_env = make_episodic("navigation", num_envs=2, max_steps=10, n_agents=2)
    collector = Collector(env, None, frames_per_batch=20, total_frames=60)
    net = torch.nn.Linear(2, 2)
    run = TrainingRun(
        folder, resume=resume, eval_env=eval_env, eval_steps=10, video=False, backends=["csv"]
    )
    run.track({"net": net, "optims": {"agents": torch.optim.SGD(net.parameters(), lr=1.0)},
               "collector": collector}, policy=net)  # fmt: skip
    return run, collector, net


def test_track_saves_and_restores_the_named_parts(tmp_path) -> None:
    run, collector, net = _run(tmp_path)
    assert run.restore() is None
    for batch in run.batches(collector):
        net.weight.data += 1.0  # "training"
        out = run.end_iteration(batch, {}, policy=None, frames=collector.frames)
        assert run.progress(out).startswith(f"iteration {run.iteration}: frames ")
    saved = net.weight.detach().clone()
    run.finish(None)
    again, collector2, net2 = _run(tmp_path, resume=True)
    state = again.restore()
    assert state is not None and set(state) >= {"net", "optims", "collector", "rng", "policy"}
    assert torch.equal(net2.weight, saved) and collector2.frames == 60
    again.close()


def test_track_refuses_what_it_cannot_save(tmp_path) -> None:
    run, _, net = _run(tmp_path)
    with pytest.raises(TypeError, match=r"part 'fn': a function has no state_dict"):
        run.track({"fn": lambda: None})
    with pytest.raises(ValueError, match=r"'rng' is the run's own checkpoint entry"):
        run.track({"rng": net})
    run.close()
