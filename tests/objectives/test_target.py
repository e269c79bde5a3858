"""SoftUpdate and HardUpdate move the target networks, and only them."""

from __future__ import annotations

import pytest
import torch

from marlkit.modules import QMixer, QValueActor
from marlkit.objectives import DQNLoss, HardUpdate, QMixerLoss, SoftUpdate

from ._helpers import identity_actor


def _qmix() -> QMixerLoss:
    torch.manual_seed(0)
    return QMixerLoss(QValueActor(torch.nn.Linear(4, 3), n_actions=3), QMixer([6], 8, 2))


def _shift_online(loss: QMixerLoss) -> None:
    with torch.no_grad():
        for p in loss.online_parameters():
            p.add_(1.0)


def test_soft_update_is_polyak_averaging() -> None:
    loss = _qmix()
    updater = SoftUpdate(loss, tau=0.25)
    before = [p.clone() for p in loss.target_mixer_network.parameters()]
    _shift_online(loss)
    updater.step()
    for old, new, online in zip(
        before, loss.target_mixer_network.parameters(), loss.mixer_network.parameters()
    ):
        torch.testing.assert_close(new, 0.75 * old + 0.25 * online)


def test_hard_update_copies_every_interval() -> None:
    loss = _qmix()
    updater = HardUpdate(loss, value_network_update_interval=2)
    _shift_online(loss)
    online = loss.local_value_network.module.module.weight
    target = loss.target_local_value_network.module.module.weight
    updater.step()
    assert not torch.equal(online, target)
    updater.step()
    assert torch.equal(online, target) and target is not online


def test_updaters_need_target_networks() -> None:
    with pytest.raises(ValueError, match="delay_value=True"):
        SoftUpdate(DQNLoss(identity_actor(3), delay_value=False))
    with pytest.raises(ValueError, match=r"SoftUpdate: tau must be a finite number in \(0, 1\]"):
        SoftUpdate(DQNLoss(identity_actor(3)), tau=0.0)
    with pytest.raises(ValueError, match="value_network_update_interval"):
        HardUpdate(DQNLoss(identity_actor(3)), value_network_update_interval=0)
    with pytest.raises(TypeError, match="needs a value loss"):
        SoftUpdate(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def test_soft_update_of_module_pairs() -> None:
    # a PPO critic's target copy (NStepTD's value network): no loss holds it
    import copy

    torch.manual_seed(0)
    critic = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    target = copy.deepcopy(critic)
    updater = SoftUpdate([(critic, target)], tau=0.1)
    before = [t.clone() for t in target.state_dict().values() if t.is_floating_point()]
    with torch.no_grad():
        for p in critic.parameters():
            p.add_(1.0)
    critic.train()(torch.randn(5, 3))  # moves the running statistics (buffers)
    updater.step()
    after = [t for t in target.state_dict().values() if t.is_floating_point()]
    online = [t for t in critic.state_dict().values() if t.is_floating_point()]
    for old, new, o in zip(before, after, online):
        torch.testing.assert_close(new, 0.9 * old + 0.1 * o)
    with pytest.raises(ValueError, match=r"does not have the online Linear's parameters"):
        SoftUpdate([(torch.nn.Linear(3, 4), torch.nn.Linear(3, 5))])
    with pytest.raises(TypeError, match=r"or a sequence of \(online, target\) module pairs"):
        SoftUpdate([(critic,)])  # type: ignore[list-item]


@pytest.mark.parametrize("updater", ["soft", "hard"])
def test_updaters_follow_a_loss_converted_after_them(updater: str) -> None:
    # loss.to(device) / loss.double() rebind each parameter's .data: the updater follows the
    # loss's current tensors, not the ones it saw when built.
    loss = _qmix()
    step = (
        SoftUpdate(loss, tau=0.5)
        if updater == "soft"
        else HardUpdate(loss, value_network_update_interval=1)
    )
    loss.double()
    _shift_online(loss)
    before = [p.clone() for p in loss.target_mixer_network.parameters()]
    step.step()
    for old, new, online in zip(
        before, loss.target_mixer_network.parameters(), loss.mixer_network.parameters()
    ):
        assert new.dtype == torch.float64
        expected = 0.5 * (old + online) if updater == "soft" else online
        torch.testing.assert_close(new, expected)
