"""Bad input the losses and estimators refuse with a message naming the key, where it used to
be reinterpreted silently (a [B, 1] weight broadcast to [B, B], a float mask read as True, a
flattened batch run as one long trajectory) or fail deep inside torch."""

from __future__ import annotations

import re

import pytest
import torch

import marlkit
from marlkit.collectors import Collector
from marlkit.modules import ValueNorm, VDNMixer
from marlkit.objectives import GAE, DQNLoss, QMixerLoss, gae

from ._helpers import identity_actor, random_batch

B, N, OBS, A = 6, 2, 3, 3


def _losses() -> dict[str, torch.nn.Module]:
    return {
        "DQNLoss": DQNLoss(identity_actor(A)),
        "QMixerLoss": QMixerLoss(identity_actor(A), VDNMixer(n_agents=N)),
    }


@pytest.mark.parametrize("name", ["DQNLoss", "QMixerLoss"])
def test_importance_weights_must_be_one_per_sample(name: str) -> None:
    loss = _losses()[name]
    batch = random_batch((B,), N, OBS, A)
    batch["priority_weight"] = torch.rand(B)
    loss(batch.clone())  # [B]: fine
    batch["priority_weight"] = torch.rand(B, 1)  # would broadcast into [B, B]
    with pytest.raises(ValueError, match=rf"{name}: 'priority_weight' \(importance weights\) "):
        loss(batch)


@pytest.mark.parametrize("name", ["DQNLoss", "QMixerLoss"])
@pytest.mark.parametrize(
    "key, value",
    [
        (("agents", "mask"), torch.ones(B, N)),
        (("agents", "mask"), torch.ones(B, N, dtype=torch.long)),
        (("next", "agents", "terminated"), torch.zeros(B, N, 1)),
        (("next", "agents", "action_mask"), torch.ones(B, N, A)),
    ],
)
def test_masks_and_flags_must_be_bool(name: str, key: tuple[str, ...], value: torch.Tensor) -> None:
    batch = random_batch((B,), N, OBS, A)
    batch.set(key, value)
    with pytest.raises(ValueError, match=rf"{name}: .*'{key[-1]}'\) must be a bool tensor, got"):
        _losses()[name](batch)


@pytest.mark.parametrize("name", ["DQNLoss", "QMixerLoss"])
@pytest.mark.parametrize("action", [A, -1])
def test_out_of_range_actions_name_the_key_and_n_actions(name: str, action: int) -> None:
    batch = random_batch((B,), N, OBS, A)
    batch["agents", "action"] = torch.full((B, N), action)
    with pytest.raises(ValueError, match=rf"in \[0, {A}\) \(n_actions={A}\), got \[{action}\]"):
        _losses()[name](batch)


def test_a_team_reward_per_agent_is_refused() -> None:
    batch = random_batch((B,), N, OBS, A)
    batch["next", "reward"] = torch.randn(B, N, 1)  # a root reward must be [*B, 1]
    with pytest.raises(ValueError, match=r"\(the team reward\) must have shape \(6, 1\)"):
        _losses()["QMixerLoss"](batch)


def _collected() -> marlkit.envs.EnvBase:
    env = marlkit.make("navigation", num_envs=4, n_agents=2, seed=0)
    batch = Collector(env, None, frames_per_batch=40).next()  # [4, 10]
    for key in (("agents", "state_value"), ("next", "agents", "state_value")):
        batch[key] = torch.zeros(*batch.batch_size, 2, 1)
    return batch


def test_the_estimator_refuses_a_flattened_batch_and_a_time_dim_out_of_range() -> None:
    batch = _collected()
    GAE(0.9, 0.9)(batch.clone())  # [*B, T]: fine
    with pytest.raises(ValueError, match=r"changes without a done step .* flattened or shuffled"):
        GAE(0.9, 0.9)(batch.reshape(-1))
    with pytest.raises(ValueError, match=r"time_dim=2 is not a batch dim of the batch \[4, 10\]"):
        GAE(0.9, 0.9, time_dim=2)(batch.clone())
    with pytest.raises(TypeError, match=r"time_dim must be an int or None, got float: 1\.5"):
        GAE(0.9, 0.9, time_dim=1.5)  # type: ignore[arg-type]


def test_the_functional_estimators_want_bool_flags() -> None:
    v = torch.zeros(2, 5, 1)
    flags = torch.zeros(2, 5, 1, dtype=torch.bool)
    gae(0.9, 0.9, v, v, v, flags, flags)
    with pytest.raises(ValueError, match=r"done must be a bool tensor, got torch\.float32"):
        gae(0.9, 0.9, v, v, v, flags.float(), flags)


def test_value_norm_refuses_nan_and_keeps_its_statistics() -> None:
    norm = ValueNorm(1)
    norm.update(torch.tensor([[1.0], [3.0]]))
    before = norm.mean_var()
    with pytest.raises(ValueError, match="1 of 2 target rows are NaN or infinite"):
        norm.update(torch.tensor([[float("nan")], [2.0]]))
    for a, b in zip(before, norm.mean_var()):
        torch.testing.assert_close(a, b)


def test_constructor_values_are_checked_up_front() -> None:
    from marlkit.modules import QValueActor
    from marlkit.objectives import ClipPPOLoss

    from .test_ppo import make
    from .test_sac_loss import _loss as sac_loss

    for bad in (0, -1):
        with pytest.raises(ValueError, match=f"entropy_samples must be an int >= 1, got {bad}"):
            ClipPPOLoss(*make(), entropy_samples=bad)
        with pytest.raises(ValueError, match=f"n_actions must be an int >= 1, got {bad}"):
            QValueActor(torch.nn.Linear(3, 3), n_actions=bad)
    for bad in ("Auto", None, float("nan")):
        with pytest.raises(ValueError, match="target_entropy must be 'auto' or finite"):
            sac_loss(target_entropy=bad)


def test_the_estimator_names_a_group_the_batch_does_not_have() -> None:
    # A KeyError naming the group, before the critic runs: the batch is left untouched.
    batch = _collected()
    with pytest.raises(KeyError, match=r"the batch has no group 'agent' \(its entries: \["):
        GAE(0.9, 0.9, group="agent")(batch)
    assert batch.get("agent", None) is None


@pytest.mark.parametrize(
    "key",
    [("next", "agents", "reward"), ("agents", "state_value"), ("next", "agents", "state_value")],
)
def test_the_estimator_refuses_nan_and_inf(key: tuple[str, ...]) -> None:
    # A NaN or inf reward or value is refused naming the key and how many entries hold one
    # (one NaN would make every advantage, and so every loss of the batch, NaN).
    batch = _collected()
    batch[key][1, 3, 0, 0] = float("nan")
    batch[key][2, 5, 1, 0] = float("inf")
    with pytest.raises(ValueError, match=re.escape(f"{key!r} holds NaN or inf at 2 of 80 entries")):
        GAE(0.9, 0.9)(batch)


def test_next_step_keys_are_named_with_next() -> None:
    batch = random_batch((B,), N, OBS, A).exclude(("next", "agents", "reward"))
    with pytest.raises(KeyError, match=r"DQNLoss: the input has no key \('next', 'agents', 'rew"):
        _losses()["DQNLoss"](batch)


def test_coefficients_that_would_make_nan_or_flip_a_loss_are_refused() -> None:
    from marlkit.objectives import ClipPPOLoss

    from .test_ppo import make

    with pytest.raises(ValueError, match=r"entropy_coef must be a finite number >= 0, got nan"):
        ClipPPOLoss(*make(), entropy_coef=float("nan"))
    with pytest.raises(ValueError, match=r"critic_coef must be a finite number >= 0, got -1"):
        ClipPPOLoss(*make(), critic_coef=-1.0)
    ClipPPOLoss(*make(), entropy_coef=0.0)  # no entropy bonus: fine
    # epsilon 0 divided by zero before the first update: NaN advantages
    with pytest.raises(ValueError, match=r"ValueNorm: epsilon must be a finite number > 0"):
        ValueNorm(1, epsilon=0.0)
    with pytest.raises(ValueError, match=r"ValueNorm: shape must be an int >= 1, got 0"):
        ValueNorm(0)
