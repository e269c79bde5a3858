"""Several seeds' networks in one module: ``K`` independent copies of a policy or critic (each
initialised as its own seed's run would be) whose parameters are stacked on a leading seed dim
and computed in one batched call per layer, and sampling that draws each seed's actions from its
own random stream.

:func:`stack_seeds` turns ``K`` modules of one architecture into one that reads ``[K, *B, ...]``
(seed ``k``'s data at index ``k``): every :class:`~marlkit.modules.MultiAgentMLP` becomes a
:class:`SeedStackedMLP` holding the ``K`` networks' parameters as ``[K * stacks, ...]``
(seed-major: seed ``k``'s are the ``k``-th slice of ``unflatten(0, (K, -1))``), so a loss summed
over the seeds gives each seed the gradient its own loss would, and an elementwise optimiser
(Adam) keeps each seed's state in its slice; each ``nn.Linear`` of a
:class:`~marlkit.modules.Mixer` (QMIX's hypernetworks) becomes a :class:`SeedStackedLinear`
(``[K, in, out]``). :func:`seedwise_sampling` makes the stacked actors draw seed ``k``'s
actions under seed ``k``'s random state (:class:`SeedStreams`; an ``EGreedy`` becomes a
:class:`SeedwiseEGreedy`), so a seed inside a stack samples the very numbers it samples alone.

Used by :mod:`marlkit.train.seeds` (``seeds_in_process`` of the training scripts).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import torch
from tensordict.nn import ProbabilisticTensorDictModule
from torch import nn

from marlkit.modules.mixers import Mixer
from marlkit.modules.mlp import MultiAgentMLP, StackedLinear
from marlkit.modules.qvalue import EGreedy

__all__ = [
    "SeedStackedLinear",
    "SeedStackedMLP",
    "SeedStreams",
    "SeedwiseEGreedy",
    "copy_seed_",
    "load_seed_",
    "seed_parameters",
    "seedwise_sampling",
    "stack_seeds",
]


def _architecture(mlp: MultiAgentMLP) -> tuple[Any, ...]:
    layers = [cast(StackedLinear, layer) for layer in mlp.layers]
    return (
        mlp.n_agent_inputs,
        mlp.n_agent_outputs,
        mlp.n_agents,
        mlp.centralised,
        mlp.share_params,
        tuple((layer.in_features, layer.out_features) for layer in layers),
        tuple(type(a) for a in mlp.activations),
    )


class SeedStackedMLP(nn.Module):
    """``K`` :class:`~marlkit.modules.MultiAgentMLP` networks of one architecture (``K``
    seeds' copies of one network) computed together: one batched matmul per layer for every
    seed and agent.

    Layer ``i``'s parameters are ``layers[i].weight`` ``[K * S, in, out]`` and ``.bias``
    ``[K * S, 1, out]`` (``S``: the networks' stacks, 1 with shared parameters, else
    ``n_agents``), seed ``k``'s at ``[k * S:(k + 1) * S]``; :meth:`seed_state` and
    :meth:`load_seed_state` read and write one seed's in the ``MultiAgentMLP``'s own
    ``state_dict`` layout.

    Args:
        mlps: the seeds' networks, seed ``k``'s at index ``k``; their parameters are copied.

    Shapes:
        input ``[K, *B, n_agents, n_agent_inputs]`` -> ``[K, *B, n_agents, n_agent_outputs]``.

    Raises:
        ValueError: no networks, or networks of different architectures; at call time, an
            input whose leading dim is not ``K`` or whose last two are not
            ``[n_agents, n_agent_inputs]``.
    """

    def __init__(self, mlps: Sequence[MultiAgentMLP]):
        super().__init__()
        if not mlps:
            raise ValueError("SeedStackedMLP needs at least one network")
        first = mlps[0]
        for k, mlp in enumerate(mlps):
            if not isinstance(mlp, MultiAgentMLP):
                raise TypeError(f"mlps[{k}] must be a MultiAgentMLP, got {type(mlp).__name__}")
            if _architecture(mlp) != _architecture(first):
                raise ValueError(
                    f"mlps[{k}] has another architecture than mlps[0]: "
                    f"{_architecture(mlp)} != {_architecture(first)}"
                )
        self.n_seeds = len(mlps)
        self.n_agents, self.n_stacks = first.n_agents, first.n_stacks
        self.n_agent_inputs, self.n_agent_outputs = first.n_agent_inputs, first.n_agent_outputs
        self.centralised = first.centralised
        self.layers = nn.ModuleList()
        for i, module in enumerate(first.layers):
            layer = cast(StackedLinear, module)
            device = layer.weight.device
            stacked = StackedLinear(
                self.n_seeds * self.n_stacks, layer.in_features, layer.out_features, device
            )
            same = [cast(StackedLinear, m.layers[i]) for m in mlps]
            with torch.no_grad():
                stacked.weight.copy_(torch.cat([m.weight for m in same]))
                stacked.bias.copy_(torch.cat([m.bias for m in same]))
            self.layers.append(stacked)
        self.activations = copy.deepcopy(first.activations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[K, *B, n_agents, n_agent_inputs]`` -> ``[K, *B, n_agents, n_outputs]``."""
        K, n, F, S = self.n_seeds, self.n_agents, self.n_agent_inputs, self.n_stacks
        if x.dim() < 3 or x.shape[0] != K or tuple(x.shape[-2:]) != (n, F):
            raise ValueError(
                f"SeedStackedMLP input: expected a tensor of shape [K={K}, *B, n_agents={n}, "
                f"{F}] (each seed's data at its index of the leading dim), got {list(x.shape)}"
            )
        batch = x.shape[1:-2]
        flat = x.reshape(K, -1, n, F)
        R = flat.shape[1]
        if self.centralised:  # every agent reads all agents' inputs
            h = flat.reshape(K, 1, R, n * F).expand(K, S, R, n * F).reshape(K * S, R, n * F)
        elif S == 1:  # one network for every agent: the agents are rows
            h = flat.reshape(K, R * n, F)
        else:
            h = flat.transpose(1, 2).reshape(K * n, R, F)
        activations = list(self.activations)
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i < len(activations):
                h = activations[i](h)
        out_dim = self.n_agent_outputs
        if self.centralised and S == 1:  # one output, the same for every agent
            out = h.reshape(K, R, 1, out_dim).expand(K, R, n, out_dim)
        elif S == 1:
            out = h.reshape(K, R, n, out_dim)
        else:
            out = h.reshape(K, n, R, out_dim).transpose(1, 2)
        return out.reshape(K, *batch, n, out_dim)

    def seed_state(self, k: int) -> dict[str, torch.Tensor]:
        """Seed ``k``'s parameters in a ``MultiAgentMLP``'s ``state_dict`` layout (copies)."""
        self._check_seed(k)
        S = self.n_stacks
        state = {}
        for i, module in enumerate(self.layers):
            layer = cast(StackedLinear, module)
            state[f"layers.{i}.weight"] = layer.weight.detach()[k * S : (k + 1) * S].clone()
            state[f"layers.{i}.bias"] = layer.bias.detach()[k * S : (k + 1) * S].clone()
        return state

    def load_seed_state(self, k: int, state: Mapping[str, torch.Tensor]) -> None:
        """Write a ``MultiAgentMLP``'s ``state_dict`` into seed ``k``'s slice."""
        self._check_seed(k)
        S = self.n_stacks
        with torch.no_grad():
            for i, module in enumerate(self.layers):
                layer = cast(StackedLinear, module)
                layer.weight[k * S : (k + 1) * S].copy_(state[f"layers.{i}.weight"])
                layer.bias[k * S : (k + 1) * S].copy_(state[f"layers.{i}.bias"])

    def _check_seed(self, k: int) -> None:
        _check_index(k, self.n_seeds)

    def extra_repr(self) -> str:
        return (
            f"n_seeds={self.n_seeds}, n_agents={self.n_agents}, centralised={self.centralised}, "
            f"share_params={self.n_stacks == 1}"
        )


class SeedStackedLinear(nn.Module):
    """``K`` ``nn.Linear`` layers of one shape (``K`` seeds' copies of one layer of a mixer's
    hypernetworks) computed together in one batched matmul, for a module that flattens its
    ``[K, *B, ...]`` input into rows: the rows are read seed-major (seed ``k``'s are the
    ``k``-th of ``K`` equal parts), as a flattened ``[K, *B, in]`` is.

    ``weight`` is ``[K, in, out]`` and ``bias`` ``[K, 1, out]`` (seed-major on their first
    dim); :meth:`seed_state` and :meth:`load_seed_state` read and write one seed's in the
    ``nn.Linear``'s own ``state_dict`` layout.

    Args:
        linears: the seeds' layers, seed ``k``'s at index ``k``; their parameters are copied.

    Shapes:
        input ``[R, in]`` (or ``[*R, in]``), ``R`` a multiple of ``K`` -> ``[R, out]``.

    Raises:
        ValueError: no layers, layers of different shapes or without a bias; at call time, rows
            that are not a multiple of ``K``.
    """

    def __init__(self, linears: Sequence[nn.Linear]):
        super().__init__()
        if not linears:
            raise ValueError("SeedStackedLinear needs at least one layer")
        first = linears[0]
        for k, layer in enumerate(linears):
            if not isinstance(layer, nn.Linear) or layer.bias is None:
                raise TypeError(f"linears[{k}] must be an nn.Linear with a bias, got {layer!r}")
            if layer.weight.shape != first.weight.shape:
                raise ValueError(
                    f"linears[{k}] is {tuple(layer.weight.shape)}, linears[0] "
                    f"{tuple(first.weight.shape)} ([out, in])"
                )
        self.n_seeds = len(linears)
        self.in_features, self.out_features = first.in_features, first.out_features
        with torch.no_grad():
            weight = torch.stack([layer.weight.detach().t() for layer in linears])
            bias = torch.stack([cast(torch.Tensor, layer.bias).detach() for layer in linears])
        self.weight = nn.Parameter(weight.contiguous())
        self.bias = nn.Parameter(bias.unsqueeze(1).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[R, in]`` (seed-major rows) -> ``[R, out]``."""
        K = self.n_seeds
        rows = x.shape[:-1]
        total = x.numel() // max(1, self.in_features)
        if x.shape[-1] != self.in_features or total % K:
            raise ValueError(
                f"SeedStackedLinear input: expected [R, {self.in_features}] with R a multiple of "
                f"K={K} (each seed's rows in turn), got {list(x.shape)}"
            )
        out = torch.baddbmm(self.bias, x.reshape(K, -1, self.in_features), self.weight)
        return out.reshape(*rows, self.out_features)

    def seed_state(self, k: int) -> dict[str, torch.Tensor]:
        """Seed ``k``'s layer in an ``nn.Linear``'s ``state_dict`` layout (copies)."""
        _check_index(k, self.n_seeds)
        return {
            "weight": self.weight.detach()[k].t().clone(),
            "bias": self.bias.detach()[k, 0].clone(),
        }

    def load_seed_state(self, k: int, state: Mapping[str, torch.Tensor]) -> None:
        """Write an ``nn.Linear``'s ``state_dict`` into seed ``k``'s slice."""
        _check_index(k, self.n_seeds)
        with torch.no_grad():
            self.weight[k].copy_(state["weight"].t())
            self.bias[k, 0].copy_(state["bias"])

    def extra_repr(self) -> str:
        return f"n_seeds={self.n_seeds}, in={self.in_features}, out={self.out_features}"


def _check_index(k: int, n_seeds: int) -> None:
    if not 0 <= k < n_seeds:
        raise IndexError(f"seed index must be in [0, {n_seeds}), got {k}")


#: The stacked modules: each holds every seed's copy of one network or layer, seed-major.
_STACKED = (SeedStackedMLP, SeedStackedLinear)


def _mixer_linears(module: nn.Module) -> Iterator[tuple[str, nn.Module, str]]:
    """Every ``nn.Linear`` inside a :class:`~marlkit.modules.Mixer` of ``module`` (QMIX's
    hypernetworks, which read the state's rows flattened seed-major): (its qualified name,
    parent, attribute)."""
    for name, child in list(module.named_modules()):
        if not isinstance(child, Mixer):
            continue
        for sub, layer in list(child.named_modules()):
            if isinstance(layer, nn.Linear) and sub:
                full = f"{name}.{sub}" if name else sub
                parent_name, _, attr = full.rpartition(".")
                yield full, module.get_submodule(parent_name), attr


def _mlps(module: nn.Module) -> Iterator[tuple[str, nn.Module, str, MultiAgentMLP]]:
    """Every ``MultiAgentMLP`` inside ``module``: (its qualified name, parent, attribute, it)."""
    for name, child in list(module.named_modules()):
        if isinstance(child, MultiAgentMLP) and name:
            parent_name, _, attr = name.rpartition(".")
            yield name, module.get_submodule(parent_name), attr, child


def stack_seeds(modules: Sequence[nn.Module]) -> nn.Module:
    """One module computing every seed's copy of a network: a copy of ``modules[0]`` in which
    each :class:`~marlkit.modules.MultiAgentMLP` is a :class:`SeedStackedMLP` of the ``K``
    modules' networks at the same place, and each ``nn.Linear`` of a
    :class:`~marlkit.modules.Mixer` (QMIX's hypernetworks) a :class:`SeedStackedLinear`. It
    reads ``[K, *B, ...]`` where the modules read ``[*B, ...]``. ``modules`` are left as they
    are (seed ``k``'s plain network: see :func:`copy_seed_`).

    Raises:
        ValueError: no modules; modules of different structures; a parameter outside every
            ``MultiAgentMLP`` (an encoder or memory that cannot be stacked yet: the message
            names it).
    """
    if not modules:
        raise ValueError("stack_seeds needs at least one module")
    stacked = copy.deepcopy(modules[0])
    for name, parent, attr, _ in list(_mlps(stacked)):
        try:
            mlps = [cast(MultiAgentMLP, m.get_submodule(name)) for m in modules]
        except AttributeError:
            raise ValueError(f"the modules differ: not every one has {name!r}") from None
        setattr(parent, attr, SeedStackedMLP(mlps))
    for name, parent, attr in list(_mixer_linears(stacked)):
        try:
            linears = [cast(nn.Linear, m.get_submodule(name)) for m in modules]
        except AttributeError:
            raise ValueError(f"the modules differ: not every one has {name!r}") from None
        setattr(parent, attr, SeedStackedLinear(linears))
    seed_parameters(stacked)  # every parameter is a seed-stacked one
    return stacked


def seed_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``module`` (of :func:`stack_seeds`), each seed-major on its first dim.

    Raises:
        ValueError: a parameter outside every :class:`SeedStackedMLP` and
            :class:`SeedStackedLinear` (named).
    """
    inside = {id(p) for m in module.modules() if isinstance(m, _STACKED) for p in m.parameters()}
    for name, param in module.named_parameters():
        if id(param) not in inside:
            raise ValueError(
                f"parameter {name!r} ({type(module).__name__}) is not in a MultiAgentMLP or a "
                "mixer: only MultiAgentMLP networks and mixers' linear layers are stacked over "
                "seeds so far (model.kind=mlp without memory)"
            )
    return list(module.parameters())


def copy_seed_(stacked: nn.Module, plain: nn.Module, k: int) -> nn.Module:
    """Copy seed ``k``'s parameters of ``stacked`` (of :func:`stack_seeds`) into ``plain``, a
    module of the structure stacked (seed ``k``'s own network); returns ``plain``."""
    for name, module in stacked.named_modules():
        if isinstance(module, _STACKED):
            plain.get_submodule(name).load_state_dict(module.seed_state(k))
    return plain


def load_seed_(stacked: nn.Module, plain: nn.Module, k: int) -> nn.Module:
    """The inverse of :func:`copy_seed_`: ``plain``'s parameters into seed ``k``'s slices of
    ``stacked``; returns ``stacked``."""
    for name, module in stacked.named_modules():
        if isinstance(module, _STACKED):
            module.load_seed_state(k, plain.get_submodule(name).state_dict())
    return stacked


class SeedStreams:
    """One random stream per seed: the global CPU generator's state that seed ``k``'s run
    would have, swapped in while seed ``k`` draws (:meth:`use`) and kept between draws.

    Args:
        states: each seed's ``torch.get_rng_state()``.
    """

    def __init__(self, states: Sequence[torch.Tensor]):
        if not states:
            raise ValueError("SeedStreams needs at least one state")
        self.states = [s.clone() for s in states]

    @property
    def n_seeds(self) -> int:
        return len(self.states)

    @contextlib.contextmanager
    def use(self, k: int) -> Iterator[None]:
        """Run the block on seed ``k``'s stream (the global generator is given back after)."""
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states[k])
        try:
            yield
        finally:
            self.states[k] = torch.get_rng_state()
            torch.set_rng_state(outer)

    def state_dict(self) -> dict[str, Any]:
        return {"states": [s.clone() for s in self.states]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        states = list(state["states"])
        if len(states) != self.n_seeds:
            raise ValueError(f"{len(states)} streams for {self.n_seeds} seeds")
        self.states = [torch.as_tensor(s, dtype=torch.uint8).clone() for s in states]


_SEEDWISE: dict[tuple[type, tuple[str, ...]], type] = {}


def _seedwise_class(base: type, params: tuple[str, ...]) -> type:
    """``base`` whose ``sample``/``rsample`` draw seed ``k``'s slice (index ``k`` of the leading
    dim of the ``params`` arguments) on seed ``k``'s stream, as ``base`` over that slice does.
    The streams are read from the instance's ``_seed_streams`` (set by the class attribute
    that :func:`seedwise_sampling` gives each module's copy)."""

    class Seedwise(base):
        _seed_streams: SeedStreams

        def __init__(self, *args: Any, **kwargs: Any):
            if args:
                raise TypeError(f"{base.__name__} per seed: pass the parameters by name")
            super().__init__(**kwargs)
            self._seed_kwargs = kwargs

        def _draw(self, how: str, sample_shape: Any) -> torch.Tensor:
            shape = torch.Size(sample_shape)
            outs, pres = [], []
            for k in range(self._seed_streams.n_seeds):
                part = base(
                    **{
                        name: value[k] if name in params and torch.is_tensor(value) else value
                        for name, value in self._seed_kwargs.items()
                    }
                )
                with self._seed_streams.use(k):
                    outs.append(getattr(part, how)(shape))
                pres.append(getattr(part, "_pre", None))
            out = torch.stack(outs, len(shape))
            pre = [p for p in pres if p is not None]
            if len(pre) == len(pres):  # TanhNormal: its log-prob of the sample reads them
                self._sampled, self._pre = out, torch.stack(pre, len(shape))
            return out

        def sample(self, sample_shape: Any = ()) -> torch.Tensor:
            return self._draw("sample", sample_shape)

        def rsample(self, sample_shape: Any = ()) -> torch.Tensor:
            return self._draw("rsample", sample_shape)

    Seedwise.__name__ = Seedwise.__qualname__ = f"Seedwise{base.__name__}"
    return Seedwise


class SeedwiseEGreedy(EGreedy):
    """:class:`~marlkit.modules.EGreedy` of a stack of seeds: its random numbers for seed
    ``k`` (index ``k`` of the leading dim) drawn on seed ``k``'s stream, of the shape and in the
    order seed ``k``'s own run draws them (:func:`seedwise_sampling` turns a stack's
    ``EGreedy`` into one). One draw per seed per call: a loop over the seeds, in collection
    only."""

    _seed_streams: SeedStreams

    def _draws(
        self, lead: tuple[int, ...], n: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        streams = self._seed_streams
        if not lead or lead[0] != streams.n_seeds:
            raise ValueError(
                f"SeedwiseEGreedy: expected actions [K={streams.n_seeds}, *B, n], got batch "
                f"dims {list(lead)}"
            )
        scores, uniforms = [], []
        for k in range(streams.n_seeds):
            with streams.use(k):
                score, uniform = super()._draws(lead[1:], n, device)
            scores.append(score)
            uniforms.append(uniform)
        return torch.stack(scores), torch.stack(uniforms)


def seedwise_sampling(module: nn.Module, streams: SeedStreams) -> nn.Module:
    """Make every sampling module inside ``module`` (of :func:`stack_seeds`) draw seed ``k``'s
    samples (index ``k`` of the leading dim) on ``streams``' seed ``k``: one draw per seed, of
    the shape a seed's own run draws, so a seed samples the numbers it samples alone. Log-probs,
    entropies and modes are the distribution's own; an :class:`~marlkit.modules.EGreedy`
    becomes a :class:`SeedwiseEGreedy`. Returns ``module``."""
    for sub in module.modules():
        if isinstance(sub, EGreedy):
            sub.__class__ = SeedwiseEGreedy
            cast(SeedwiseEGreedy, sub)._seed_streams = streams
            continue
        if isinstance(sub, ProbabilisticTensorDictModule):
            base = sub.distribution_class
            base = getattr(base, "_seedwise_base", base)
            params = tuple(sub.dist_keys)
            key = (base, params)
            if key not in _SEEDWISE:
                _SEEDWISE[key] = _seedwise_class(base, params)
            cls = type(
                _SEEDWISE[key].__name__,
                (_SEEDWISE[key],),
                {"_seed_streams": streams, "_seedwise_base": base},
            )
            sub.distribution_class = cls
    return module
