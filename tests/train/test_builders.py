"""``marlkit.train.builders``: the activation of a ``policy`` or ``critic`` section
(``net_activation``) in the networks the scripts build from it (``q_actor``, ``q_critic``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch import nn

from marlkit.modules import Tanh
from marlkit.train.builders import make_env, net_activation, q_actor, q_critic


def _section(**values):
    """A ``policy``/``critic`` section as a script reads it."""
    return SimpleNamespace(**{"share_params": True, "depth": 2, "num_cells": 8, **values})


def _activations(module: nn.Module) -> set[type]:
    return {type(m) for m in module.modules() if isinstance(m, (nn.Tanh, nn.ReLU, nn.ELU))}


def test_net_activation_names_the_class_tanh_for_a_section_without_the_key():
    assert net_activation(_section(activation="relu")) is nn.ReLU
    assert net_activation(_section(activation="elu")) is nn.ELU
    assert net_activation(_section()) is Tanh  # a checkpoint's config written before the key
    with pytest.raises(ValueError, match=r"critic.activation must be one of \['tanh', 'relu'"):
        net_activation(_section(activation="swish"), "critic.activation")


@pytest.mark.parametrize("centralised", [True, False])
def test_q_actor_and_q_critic_take_their_sections_activation(centralised):
    """IQL/QMIX/VDN's Q-network and MADDPG's/MASAC's Q(o, a) critics: ReLU layers and no Tanh
    with ``activation=relu`` (EPyMARL's, issue 37); marlkit's Tanh by default."""
    discrete = make_env("navigation", num_envs=2, max_steps=5, actions="discrete")
    continuous = make_env("navigation", num_envs=2, max_steps=5)
    for values, expected in (({"activation": "relu"}, nn.ReLU), ({}, Tanh)):
        section = _section(**{**values, "centralised": centralised})
        actor = q_actor(discrete, "agents", section, "QMIX")
        critic = q_critic(continuous, "agents", section)
        assert _activations(actor) == _activations(critic) == {expected}
        td = continuous.reset().update(continuous.action_spec.rand())  # random actions
        assert critic(td)["agents", "state_action_value"].isfinite().all()
