"""The off-policy losses' ``in_keys``: a batch cut down to them gives the same loss, the keys the
losses never read (simulator info, episode statistics, the policy's outputs) are dropped, and
the keys follow ``set_keys``."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from marlkit.modules import MultiAgentMLP, QMixer, QValueActor, VDNMixer
from marlkit.objectives import DDPGLoss, DQNLoss, QMixerLoss, SACLoss

from ._helpers import KEYS, OBS, Central, continuous_batch, critic, random_batch

N, OBS_DIM, ACTIONS, STATE = 3, 4, 5, 6
JUNK = [  # what a collector's batch carries besides the transition
    ("agents", "info", "pos_rew"),
    ("agents", "episode_reward"),
    ("agents", "action_value"),
    ("agents", "chosen_action_value"),
    ("collector", "traj_ids"),
    ("next", "agents", "info", "pos_rew"),
    ("next", "step_count"),
]


def _with_junk(td: TensorDict) -> TensorDict:
    lead = td.batch_size
    for key in JUNK:
        width = (N, 1) if key[-2:] != ("agents", "action_value") else (N, ACTIONS)
        shape = (*lead, *width) if "agents" in key else tuple(lead)
        td.set(key, torch.randn(shape))
    return td


def _q_actor() -> QValueActor:
    return QValueActor(
        MultiAgentMLP(OBS_DIM, ACTIONS, N, share_params=True, num_cells=8), n_actions=ACTIONS
    )


def _qmix_state() -> QMixerLoss:
    return QMixerLoss(_q_actor(), QMixer([STATE], 8, N))


def _qmix_observation() -> QMixerLoss:
    return QMixerLoss(_q_actor(), QMixer((N, OBS_DIM), 8, N, state_key=("agents", "observation")))


def _vdn() -> QMixerLoss:
    return QMixerLoss(_q_actor(), VDNMixer(N))


def _dqn() -> DQNLoss:
    return DQNLoss(_q_actor())


def _ddpg() -> DDPGLoss:
    actor = TensorDictModule(nn.Sequential(nn.Linear(OBS_DIM, 2), nn.Tanh()), [OBS], [KEYS])
    return DDPGLoss(actor, critic(Central(N, OBS_DIM, 2)))


class _Gaussian(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(OBS_DIM, 2)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = torch.tanh(self.net(obs))
        noise = torch.randn_like(mean)
        return (mean + 0.1 * noise).clamp(-1, 1), -0.5 * noise.square().sum(-1)


def _sac() -> SACLoss:
    actor = TensorDictModule(_Gaussian(), [OBS], [KEYS, ("agents", "action_log_prob")])
    return SACLoss(actor, critic(Central(N, OBS_DIM, 2)))


DISCRETE: dict[str, Callable[[], QMixerLoss | DQNLoss]] = {
    "qmix_state": _qmix_state,
    "qmix_observation": _qmix_observation,
    "vdn": _vdn,
    "dqn": _dqn,
}
CONTINUOUS: dict[str, Callable[[], DDPGLoss | SACLoss]] = {"ddpg": _ddpg, "sac": _sac}


def _batch(name: str) -> TensorDict:
    torch.manual_seed(1)
    if name in CONTINUOUS:
        td = continuous_batch((7,), N, OBS_DIM, 2)
    else:
        td = random_batch((7,), N, OBS_DIM, ACTIONS, state_dim=STATE)
    td["agents", "mask"] = torch.rand(7, N) < 0.8
    td["priority_weight"] = torch.rand(7)
    return _with_junk(td)


def _run(loss: nn.Module, td: TensorDictBase) -> TensorDict:
    torch.manual_seed(2)  # SAC samples actions
    return loss(td.clone())


@pytest.mark.parametrize("name", [*DISCRETE, *CONTINUOUS])
def test_a_batch_cut_to_in_keys_gives_the_same_loss_without_the_junk(name: str) -> None:
    torch.manual_seed(0)
    loss = {**DISCRETE, **CONTINUOUS}[name]()
    td = _batch(name)
    kept = td.select(*loss.in_keys, strict=False)
    for key in JUNK:
        assert key not in kept.keys(True, True), key
    for key in (OBS, KEYS, ("next", *OBS), ("agents", "mask"), "priority_weight"):
        assert key in kept.keys(True, True), key
    if name == "qmix_state":
        assert "state" in kept and ("next", "state") in kept.keys(True)
    else:
        assert "state" not in kept
    full, cut = _run(loss, td), _run(loss, kept)
    assert set(full.keys()) == set(cut.keys())
    for key in full.keys():  # noqa: SIM118
        torch.testing.assert_close(cut[key], full[key], rtol=0, atol=0)


@pytest.mark.parametrize("name", list(DISCRETE))
def test_discrete_losses_keep_the_next_action_mask_and_the_rewards(name: str) -> None:
    keys = DISCRETE[name]().in_keys
    assert ("next", "agents", "action_mask") in keys
    assert ("next", "agents", "reward") in keys and ("next", "terminated") in keys
    assert ("agents", "action_mask") not in keys  # the loss runs the Q-network, not the actor


def test_in_keys_follow_set_keys() -> None:
    loss = _dqn().set_keys(reward=("agents", "team_reward"), mask=None, priority_weight=None)
    assert ("next", "agents", "team_reward") in loss.in_keys
    assert ("next", "agents", "reward") not in loss.in_keys
    assert ("agents", "mask") not in loss.in_keys and "priority_weight" not in loss.in_keys
