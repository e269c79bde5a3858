"""Value-decomposition mixers: :class:`VDNMixer` (sum) and :class:`QMixer` (monotonic
hypernetwork mixing, Rashid et al. 2018), as TensorDict modules.

Both read the agents' chosen action values ``(group, "chosen_action_value")`` ``[*B, n, 1]``
and write the team value ``"chosen_action_value"`` ``[*B, 1]`` at the root.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from marlkit._checks import check_int, check_ints, check_real
from marlkit.data.keys import CHOSEN_ACTION_VALUE, DEFAULT_GROUP, STATE, NestedKey, join_key
from marlkit.modules._checks import check_trailing, get_tensor

__all__ = ["Mixer", "QMixer", "VDNMixer"]


class Mixer(TensorDictModuleBase):
    """The common part of mixers: keys, reading and checking the agents' values.

    Subclasses implement :meth:`mix` on tensors.

    Args:
        n_agents: agents in the group.
        group: the agent group.
        local_value_key: default ``(group, "chosen_action_value")``, ``[*B, n, 1]``.
        global_value_key: default ``"chosen_action_value"`` (root), ``[*B, 1]``.
    """

    def __init__(
        self,
        n_agents: int,
        *,
        group: str = DEFAULT_GROUP,
        local_value_key: NestedKey | None = None,
        global_value_key: NestedKey = CHOSEN_ACTION_VALUE,
    ):
        super().__init__()
        self.n_agents = check_int("n_agents", n_agents, low=1, owner=f"{type(self).__name__}")
        self.group = group
        self.local_value_key = local_value_key or join_key(group, CHOSEN_ACTION_VALUE)
        self.global_value_key = global_value_key
        in_keys: list[Any] = [self.local_value_key]
        out_keys: list[Any] = [self.global_value_key]
        self.in_keys, self.out_keys = in_keys, out_keys

    def _local_values(self, tensordict: TensorDictBase) -> torch.Tensor:
        name = str(type(self).__name__)
        expected = f"[*B, {self.n_agents}, 1]"
        values = get_tensor(tensordict, self.local_value_key, name, expected)
        check_trailing(values, self.local_value_key, (self.n_agents, 1), name, expected)
        return values

    def mix(self, local_values: torch.Tensor, tensordict: TensorDictBase) -> torch.Tensor:
        """The team value ``[*B, 1]`` of the agents' values ``[*B, n, 1]``."""
        raise NotImplementedError

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write ``global_value_key`` ``[*B, 1]`` into ``tensordict``."""
        tensordict.set(self.global_value_key, self.mix(self._local_values(tensordict), tensordict))
        return tensordict


class VDNMixer(Mixer):
    """VDN (Sunehag et al. 2017): the team value is the sum of the agents' values.

    Args:
        n_agents, group, local_value_key, global_value_key: see :class:`Mixer`.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from marlkit.modules import VDNMixer
        >>> td = TensorDict({("agents", "chosen_action_value"): torch.ones(4, 3, 1)}, [4])
        >>> VDNMixer(3)(td)["chosen_action_value"].squeeze(-1)
        tensor([3., 3., 3., 3.])
    """

    def mix(self, local_values: torch.Tensor, tensordict: TensorDictBase) -> torch.Tensor:
        return local_values.sum(-2)


class QMixer(Mixer):
    """QMIX's monotonic mixing network (Rashid et al. 2018).

    ``Q_tot = w2(s) . elu(W1(s) q + b1(s)) + V(s)`` with ``W1 = |hyper_w1(s)|`` and ``w2 =
    |hyper_w2(s)|``: non-negative weights, so ``dQ_tot / dq_i >= 0`` for every agent.

    The weight hypernetworks ``hyper_w1`` and ``hyper_w2`` are one linear layer of the state
    (``hypernet_layers=1``, PyMARL's QMixer), or two with a ReLU between them
    (``hypernet_layers=2``: ``Linear(state, hypernet_embed) -> ReLU -> Linear``, EPyMARL's
    default, ``hypernet_layers: 2, hypernet_embed: 64`` in its ``algs/qmix.yaml``). The bias
    ``b1(s)`` is one linear layer and ``V(s)`` two (``Linear -> ReLU -> Linear``) either way.

    The hypernetworks read ``state_key`` (``[*B, *state_shape]``, flattened, divided by
    ``state_scale``): the root
    ``"state"`` by default; where the env has no state, pass ``state_key=(group,
    "observation")`` and ``state_shape=(n_agents, obs_dim)`` to condition on the agents'
    observations concatenated.

    Args:
        state_shape: the shape of one sample of ``state_key`` (``[state_dim]``).
        mixing_embed_dim: the mixing layer's width.
        n_agents: agents in the group.
        group, local_value_key, global_value_key: see :class:`Mixer`.
        state_key: what the hypernetworks read (default ``"state"``).
        hypernet_layers: layers of the weight hypernetworks, 1 or 2.
        hypernet_embed: the hidden width of the 2-layer weight hypernetworks (unused with
            ``hypernet_layers=1``).
        state_scale: the hypernetworks read the state divided by this (default 1: as it
            comes). A state of raw counts or coordinates (LBF's observations, 0 to 7) gives
            hypernetwork outputs, and a team value, of tens at initialisation; its largest
            value brings them to the agents' scale (``docs/results.md``, QMIX on LBF).

    Raises:
        ValueError: a bad shape, width or number of hypernetwork layers; when called, a state
            or values of the wrong shape (the message names the key and the expected shape).
        KeyError: a missing key (when called).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from marlkit.modules import QMixer
        >>> mixer = QMixer([10], 32, n_agents=3)
        >>> td = TensorDict({("agents", "chosen_action_value"): torch.randn(4, 3, 1),
        ...                  "state": torch.randn(4, 10)}, [4])
        >>> mixer(td)["chosen_action_value"].shape
        torch.Size([4, 1])
        >>> QMixer([10], 32, n_agents=3, hypernet_layers=2, hypernet_embed=64).hyper_w_1
        Sequential(
          (0): Linear(in_features=10, out_features=64, bias=True)
          (1): ReLU()
          (2): Linear(in_features=64, out_features=96, bias=True)
        )
    """

    def __init__(
        self,
        state_shape: Sequence[int] | int,
        mixing_embed_dim: int,
        n_agents: int,
        *,
        group: str = DEFAULT_GROUP,
        state_key: NestedKey = STATE,
        local_value_key: NestedKey | None = None,
        global_value_key: NestedKey = CHOSEN_ACTION_VALUE,
        hypernet_layers: int = 1,
        hypernet_embed: int = 64,
        state_scale: float = 1.0,
    ):
        super().__init__(
            n_agents,
            group=group,
            local_value_key=local_value_key,
            global_value_key=global_value_key,
        )
        self.state_shape = check_ints("state_shape", state_shape, low=1, owner="QMixer")
        if not self.state_shape:
            raise ValueError(
                "QMixer: state_shape must be an int or a sequence of ints >= 1, got ()"
            )
        self.state_dim = math.prod(self.state_shape)
        self.embed_dim = check_int("mixing_embed_dim", mixing_embed_dim, low=1, owner="QMixer")
        self.hypernet_layers = check_int(
            "hypernet_layers", hypernet_layers, low=1, high=2, owner="QMixer"
        )
        self.hypernet_embed = check_int("hypernet_embed", hypernet_embed, low=1, owner="QMixer")
        self.state_scale = check_real("state_scale", state_scale, low=0.0, owner="QMixer")
        self.state_key = state_key
        in_keys: list[Any] = [*self.in_keys, state_key]
        self.in_keys = in_keys
        s, e = self.state_dim, self.embed_dim
        # created in this order whatever the layers, so hypernet_layers=1 draws the same weights
        # from the same seed as the 1-layer QMixer always did
        self.hyper_w_1 = self._hypernet(s, e * n_agents)
        self.hyper_w_final = self._hypernet(s, e)
        self.hyper_b_1 = nn.Linear(s, e)
        self.V = nn.Sequential(nn.Linear(s, e), nn.ReLU(), nn.Linear(e, 1))

    def _hypernet(self, state_dim: int, out: int) -> nn.Module:
        if self.hypernet_layers == 1:
            return nn.Linear(state_dim, out)
        h = self.hypernet_embed
        return nn.Sequential(nn.Linear(state_dim, h), nn.ReLU(), nn.Linear(h, out))

    def mix(self, local_values: torch.Tensor, tensordict: TensorDictBase) -> torch.Tensor:
        expected = f"[*B, {', '.join(map(str, self.state_shape))}]"
        state = get_tensor(tensordict, self.state_key, "QMixer", expected)
        check_trailing(state, self.state_key, self.state_shape, "QMixer", expected)
        lead = local_values.shape[:-2]
        if tuple(state.shape[: state.dim() - len(self.state_shape)]) != tuple(lead):
            raise ValueError(
                f"QMixer: {self.state_key!r} has batch dims "
                f"{tuple(state.shape[: state.dim() - len(self.state_shape)])}, the agents' "
                f"values {tuple(lead)}; expected {expected} with the same B"
            )
        return self.mix_tensors(local_values, state)

    def mix_tensors(self, local_values: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """The team value ``[*B, 1]`` of ``local_values`` ``[*B, n, 1]`` in ``state``
        ``[*B, *state_shape]`` (no key checks)."""
        lead = local_values.shape[:-2]
        q = local_values.reshape(-1, 1, self.n_agents)
        s = state.reshape(-1, self.state_dim).to(q.dtype)
        if self.state_scale != 1.0:
            s = s / self.state_scale
        w1 = self.hyper_w_1(s).abs().view(-1, self.n_agents, self.embed_dim)
        b1 = self.hyper_b_1(s).view(-1, 1, self.embed_dim)
        hidden = nn.functional.elu(torch.bmm(q, w1) + b1)
        w_final = self.hyper_w_final(s).abs().view(-1, self.embed_dim, 1)
        v = self.V(s).view(-1, 1, 1)
        return (torch.bmm(hidden, w_final) + v).reshape(*lead, 1)
