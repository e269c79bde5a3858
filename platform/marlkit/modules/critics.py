"""State-value critics (local for IPPO, centralised for MAPPO) and ``ValueNorm``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from marlkit._checks import check_int, check_real
from marlkit.data.keys import DEFAULT_GROUP, OBSERVATION, STATE, STATE_VALUE, NestedKey
from marlkit.modules._checks import get_tensor
from marlkit.modules.activations import Tanh
from marlkit.modules.mlp import MultiAgentMLP

__all__ = ["StateValueCritic", "StateWithAgentId", "ValueNorm"]


class StateWithAgentId(nn.Module):
    """The global state given to each of ``n_agents`` agents with the agent's one-hot index:
    ``state`` ``[*B, state_dim]`` -> ``[*B, n_agents, state_dim + n_agents]``, agent ``i``'s
    row ``cat(state, eye(n_agents)[i])``. The input of JaxMARL's MAPPO critic (its
    ``world_state`` wrapper) and EPyMARL's ``cv_critic``: a network shared by the agents gives
    each its own value of the one state.

    Args:
        n_agents: agents in the group.

    Examples:
        >>> StateWithAgentId(3)(torch.zeros(5, 4)).shape
        torch.Size([5, 3, 7])
    """

    def __init__(self, n_agents: int):
        super().__init__()
        self.n_agents = check_int("n_agents", n_agents, low=1)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        n, lead = self.n_agents, state.shape[:-1]
        ids = torch.eye(n, dtype=state.dtype, device=state.device).expand(*lead, n, n)
        return torch.cat([state.unsqueeze(-2).expand(*lead, n, state.shape[-1]), ids], dim=-1)


class _FromState(nn.Module):
    """``state`` ``[*B, state_dim]`` -> ``[*B, n_agents, 1]`` through a per-agent MLP fed the
    same global state (with ``agent_id``, joined with each agent's one-hot index:
    :class:`StateWithAgentId`)."""

    def __init__(self, mlp: MultiAgentMLP, agent_id: bool = False):
        super().__init__()
        self.mlp = mlp
        self.with_id = StateWithAgentId(mlp.n_agents) if agent_id else None
        self.state_dim = mlp.n_agent_inputs - (mlp.n_agents if agent_id else 0)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        if state.shape[-1] != self.state_dim:
            raise ValueError(
                f"StateValueCritic: expected a state of shape [*B, {self.state_dim}], "
                f"got {list(state.shape)}"
            )
        if self.with_id is not None:
            return self.mlp(self.with_id(state))
        shape = (*state.shape[:-1], self.mlp.n_agents, state.shape[-1])
        return self.mlp(state.unsqueeze(-2).expand(shape))


class StateValueCritic(TensorDictModule):
    """A state-value critic writing ``(group, "state_value")`` ``[*B, n_agents, 1]``.

    Three inputs, chosen by the arguments:

    * local (IPPO, the default): each agent's value from its own observation
      ``(group, "observation")`` ``[*B, n_agents, obs_dim]``;
    * ``centralised=True`` (MAPPO): each agent's value from all agents' observations;
    * ``state_dim=...`` (MAPPO with a global state): from the root ``"state"``
      ``[*B, state_dim]``, the same input for every agent; with ``agent_id=True`` joined with
      the agent's one-hot index, ``[*B, n_agents, state_dim + n_agents]``
      (:class:`StateWithAgentId`: JaxMARL's and EPyMARL's MAPPO critics), so that a shared
      network gives each agent its own value.

    Args:
        n_agents: agents in the group.
        obs_dim: observation features per agent (ignored with ``state_dim``).
        group: the group whose keys are read and written.
        centralised: feed every agent all agents' observations.
        state_dim: read the root state of this size instead of observations.
        agent_id: with ``state_dim``, each agent reads the state and its one-hot index.
        share_params: one network for every agent (the usual choice for critics).
        depth, num_cells, activation: the MLP (see :class:`MultiAgentMLP`).
        obs_key, state_key, value_key: the keys read and written.
        device: where the parameters live.

    Raises:
        ValueError: ``centralised`` with ``state_dim`` (choose one input); ``agent_id``
            without ``state_dim``.
    """

    def __init__(
        self,
        n_agents: int,
        obs_dim: int | None = None,
        *,
        group: str = DEFAULT_GROUP,
        centralised: bool = False,
        state_dim: int | None = None,
        agent_id: bool = False,
        share_params: bool = True,
        depth: int = 2,
        num_cells: int | Sequence[int] = 256,
        activation: type[nn.Module] = Tanh,
        obs_key: NestedKey | None = None,
        state_key: NestedKey = STATE,
        value_key: NestedKey | None = None,
        device: torch.device | str | None = None,
    ):
        if state_dim is not None and centralised:
            raise ValueError("StateValueCritic: pass centralised=True or state_dim, not both")
        if agent_id and state_dim is None:
            raise ValueError("StateValueCritic: agent_id=True joins the state: pass state_dim")
        width = state_dim if state_dim is not None else obs_dim
        if width is None:
            raise ValueError("StateValueCritic needs obs_dim (or state_dim for a state critic)")
        mlp = MultiAgentMLP(
            width + (n_agents if agent_id else 0),
            1,
            n_agents,
            centralised=centralised,
            share_params=share_params,
            depth=depth,
            num_cells=num_cells,
            activation=activation,
            device=device,
        )
        module: nn.Module
        if state_dim is not None:
            module, in_key = _FromState(mlp, agent_id), state_key
        else:
            module, in_key = mlp, obs_key if obs_key is not None else (group, OBSERVATION)
        out = value_key if value_key is not None else (group, STATE_VALUE)
        super().__init__(module, in_keys=[in_key], out_keys=[out])
        self.group = group

    def value(self, tensordict: TensorDictBase) -> torch.Tensor:
        """The values ``[*B, n_agents, 1]`` for ``tensordict``, not written into it: what
        calling the critic writes at its out key. A loss calls this at every update; it skips
        the module's key bookkeeping unless hooks are registered on it.

        Raises:
            KeyError: ``tensordict`` lacks the critic's input.
        """
        who = f"StateValueCritic (group {self.group!r})"
        x = get_tensor(tensordict, self.in_keys[0], who, "that the critic reads")
        if self._forward_hooks or self._forward_pre_hooks:
            return self(tensordict.select(*self.in_keys)).get(self.out_keys[0])
        return self.module(x)


class ValueNorm(nn.Module):
    """Running normalisation of value targets (MAPPO's ``ValueNorm``): a debiased exponential
    moving average of the mean and of the mean square, kept in buffers (saved with
    ``state_dict``).

    The critic predicts normalised values: the value estimator :meth:`denormalize` s them
    before computing advantages, the loss compares the prediction with :meth:`normalize` d
    targets, and the training loop calls :meth:`update` on each batch's targets.

    Args:
        shape: the feature shape normalised (``1`` for values ``[*B, n_agents, 1]``).
        beta: the moving average's decay per update.
        epsilon: floor of the debiasing term and of the variance.
        device: where the buffers live.

    Examples:
        >>> import torch
        >>> norm = ValueNorm()
        >>> norm.update(torch.tensor([[1.0], [3.0]]))
        >>> norm.denormalize(norm.normalize(torch.tensor([[2.0]])))
        tensor([[2.]])
    """

    running_mean: torch.Tensor
    running_mean_sq: torch.Tensor
    debiasing_term: torch.Tensor

    def __init__(
        self,
        shape: int = 1,
        beta: float = 0.99999,
        epsilon: float = 1e-5,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if not 0.0 < beta < 1.0:
            raise ValueError(f"ValueNorm: beta must be in (0, 1), got {beta}")
        # 0 divides by zero before the first update: NaN advantages, no error anywhere
        epsilon = check_real("ValueNorm: epsilon", epsilon, low=0.0)
        shape = check_int("ValueNorm: shape", shape, low=1)
        self.beta, self.epsilon, self.shape = float(beta), epsilon, shape
        self.register_buffer("running_mean", torch.zeros(shape, device=device))
        self.register_buffer("running_mean_sq", torch.zeros(shape, device=device))
        self.register_buffer("debiasing_term", torch.zeros((), device=device))

    def _check(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.shape:
            raise ValueError(
                f"ValueNorm: expected values of shape [*B, {self.shape}], got {list(x.shape)}"
            )

    def mean_var(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The debiased running mean and variance, each ``[shape]``."""
        debias = self.debiasing_term.clamp(min=self.epsilon)
        mean = self.running_mean / debias
        var = (self.running_mean_sq / debias - mean**2).clamp(min=1e-2)
        return mean, var

    @torch.no_grad()
    def update(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Fold the targets ``x`` ``[*B, shape]`` into the statistics (only the rows where
        ``mask`` ``[*B]`` is True, if given).

        Raises:
            ValueError: NaN or infinite targets among the rows folded in (the statistics are
                left as they were: one NaN would make every later value NaN).
        """
        self._check(x)
        flat = x.reshape(-1, self.shape).to(self.running_mean.dtype)
        if mask is not None:
            flat = flat[mask.reshape(-1).to(torch.bool)]
        if flat.shape[0] == 0:
            return
        if not bool(torch.isfinite(flat).all()):
            bad = int((~torch.isfinite(flat)).any(-1).sum())
            raise ValueError(
                f"ValueNorm.update: {bad} of {flat.shape[0]} target rows are NaN or infinite; "
                "the statistics were not updated"
            )
        b = self.beta
        self.running_mean.mul_(b).add_(flat.mean(0) * (1 - b))
        self.running_mean_sq.mul_(b).add_((flat**2).mean(0) * (1 - b))
        self.debiasing_term.mul_(b).add_(1 - b)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / std``, ``x`` ``[*B, shape]``."""
        self._check(x)
        mean, var = self.mean_var()
        return (x - mean) / var.sqrt()

    def denormalize(self, x: torch.Tensor) -> torch.Tensor:
        """``x * std + mean``, ``x`` ``[*B, shape]``."""
        self._check(x)
        mean, var = self.mean_var()
        return x * var.sqrt() + mean
