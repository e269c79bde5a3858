"""``Transform``, ``Compose`` and ``TransformedEnv``.

A transform sees three moments: the specs (once, when attached), each reset output and each
step output; transforms that rename or cast entries also map the inputs back to what the inner
env expects (``inv`` for a step input, ``inv_reset`` for a partial reset's input). Every
transform updates the specs it changes, so ``check_env_specs`` holds on the transformed env.

In a :class:`Compose`, each transform reads the input as the transforms after it mapped it
back (its own names and dtypes): a ``RewardSum`` followed by a ``RenameKeys`` of its sums finds
them under the name it wrote. A transform belongs to one env: attaching one that already has a
parent is refused (make a new one, or :meth:`Transform.clone` it).

``TransformedEnv`` reaches its inner env through the wrapper API of
:mod:`marlkit.envs.common` only (``_wrapped_reset``, ``_wrapped_step``, ``illegal_actions``,
``_rng``) and its public methods.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase

from marlkit.data.composite import Composite
from marlkit.envs.common import EnvBase, IllegalActions

__all__ = ["Compose", "EnvSpecs", "Transform", "TransformedEnv"]


@dataclass
class EnvSpecs:
    """The five spec Composites of an env, handed to :meth:`Transform.transform_specs`."""

    observation: Composite
    state: Composite
    action: Composite
    reward: Composite
    done: Composite

    def clone(self) -> EnvSpecs:
        return EnvSpecs(
            self.observation.clone(),
            self.state.clone(),
            self.action.clone(),
            self.reward.clone(),
            self.done.clone(),
        )


class Transform:
    """Base class: override what the transform changes; the defaults pass data through."""

    #: The env the transform is attached to (set by :meth:`set_parent`), ``None`` before.
    parent: EnvBase | None = None
    #: Whether :meth:`step` may change done flags (``StepCounter`` does). The inner env's step
    #: output already follows the done rule; ``TransformedEnv`` applies it again only when a
    #: transform may have changed a flag. ``True`` unless a transform says otherwise.
    changes_done_flags: bool = True
    #: Whether an env built for training (:func:`marlkit.train.builders.make_env`) places it
    #: before its step counter and episode sums rather than after them: a transform that
    #: changes rewards (``CommonReward``), so that ``episode_reward`` sums what is trained on.
    before_episode_sums: bool = False

    def set_parent(self, env: EnvBase) -> None:
        """Called by ``TransformedEnv`` when the transform is attached to ``env`` (after its
        inner env is set), for transforms that need the env itself (e.g. to render it)."""
        self.parent = env

    def clone(self) -> Transform:
        """A new copy of this transform with the same settings, attached to no env."""
        # The parent (and its simulator) is not copied: the memo maps it to None.
        memo = {} if self.parent is None else {id(self.parent): None}
        return copy.deepcopy(self, memo)

    def close(self) -> None:
        """Release what the transform holds (files, processes); called when its env closes."""

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        """Update (in place or anew) and return the specs; called when the env is built."""
        return specs

    def reset(
        self,
        tensordict: TensorDictBase | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        """Transform a reset output. ``tensordict`` is the reset input (may be ``None``);
        ``env_mask`` ``[*B]`` bool selects the envs that were reset (``None`` = all). A
        transform that carries entries keeps the input's for the envs not reset, and refuses a
        partial reset whose input lacks them (``MissingCarriedError``) rather than guess."""
        return tensordict_reset

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        """Transform the ``"next"`` entries of a step; ``tensordict`` is the step input."""
        return next_tensordict

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Map a step input (actions) back to what the inner env expects. Must not modify the
        caller's TensorDict in place: return a shallow copy when changing it."""
        return tensordict

    def inv_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Map a reset input (the current observations and ``"_reset"`` masks of a partial
        reset) back to the inner env's keys and dtypes, so that envs that are not reset can
        report what they reported before. Same rule as :meth:`inv`: never in place."""
        return tensordict

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Compose(Transform):
    """Apply transforms in order (``inv`` in reverse order)."""

    def __init__(self, *transforms: Transform):
        for t in transforms:
            if not isinstance(t, Transform):
                raise TypeError(f"Compose takes Transforms, got {type(t).__name__}")
        self.transforms: list[Transform] = list(transforms)

    def set_parent(self, env: EnvBase) -> None:
        super().set_parent(env)
        for t in self.transforms:
            t.set_parent(env)

    def clone(self) -> Compose:
        return Compose(*(t.clone() for t in self.transforms))

    @property
    def changes_done_flags(self) -> bool:  # type: ignore[override]
        return any(t.changes_done_flags for t in self.transforms)

    def close(self) -> None:
        # Close every transform even if one fails; the first error is raised afterwards.
        errors = []
        for t in self.transforms:
            try:
                t.close()
            except Exception as err:  # re-raised below, after the others are closed
                errors.append(err)
        if errors:
            raise errors[0]

    def transform_specs(self, specs: EnvSpecs) -> EnvSpecs:
        for t in self.transforms:
            specs = t.transform_specs(specs)
        return specs

    def reset(
        self,
        tensordict: TensorDictBase | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        views = None if tensordict is None else self._views(tensordict, reset=True)[0]
        return self._reset_views(views, tensordict_reset, env_mask)

    def step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        return self._step_views(self._views(tensordict, reset=False)[0], next_tensordict)

    def inv(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._views(tensordict, reset=False)[1]

    def inv_reset(self, tensordict: TensorDictBase) -> TensorDictBase:
        return self._views(tensordict, reset=True)[1]

    def _views(
        self, tensordict: TensorDictBase, *, reset: bool
    ) -> tuple[list[TensorDictBase], TensorDictBase]:
        """``(views, inner)``: the input as each transform reads it (mapped back by the
        transforms after it, by ``inv_reset`` for a reset, ``inv`` for a step) and as the
        inner env gets it (mapped back by all of them)."""
        views: list[TensorDictBase] = [tensordict] * len(self.transforms)
        for i in range(len(self.transforms) - 1, -1, -1):
            views[i] = tensordict
            t = self.transforms[i]
            tensordict = t.inv_reset(tensordict) if reset else t.inv(tensordict)
        return views, tensordict

    def _reset_views(
        self,
        views: list[TensorDictBase] | None,
        tensordict_reset: TensorDictBase,
        env_mask: torch.Tensor | None,
    ) -> TensorDictBase:
        for i, t in enumerate(self.transforms):
            tensordict_reset = t.reset(
                None if views is None else views[i], tensordict_reset, env_mask
            )
        return tensordict_reset

    def _step_views(
        self, views: list[TensorDictBase], next_tensordict: TensorDictBase
    ) -> TensorDictBase:
        for t, view in zip(self.transforms, views):
            next_tensordict = t.step(view, next_tensordict)
        return next_tensordict

    def _flat(self) -> list[Transform]:
        """This Compose and every transform in it, nested Composes included."""
        out: list[Transform] = [self]
        for t in self.transforms:
            out.extend(t._flat() if isinstance(t, Compose) else [t])
        return out

    def append(self, transform: Transform) -> None:
        if not isinstance(transform, Transform):
            raise TypeError(f"Compose takes Transforms, got {type(transform).__name__}")
        self.transforms.append(transform)

    def __getitem__(self, index: int) -> Transform:
        return self.transforms[index]

    def __len__(self) -> int:
        return len(self.transforms)

    def __iter__(self) -> Iterator[Transform]:
        return iter(self.transforms)

    def __repr__(self) -> str:
        inner = ",\n    ".join(repr(t) for t in self.transforms)
        return f"Compose(\n    {inner})" if self.transforms else "Compose()"


class TransformedEnv(EnvBase):
    """An env seen through a transform.

    Args:
        env: the inner env (it may itself be a ``TransformedEnv``).
        transform: a transform, a sequence of them (composed), or ``None``.
        validate_actions: check actions against the *transformed* action spec; defaults to the
            inner env's setting. Validation happens here, once, with the inner env's masking
            policy (``illegal_actions``); the inner env does not validate again.

    Examples:
        >>> import marlkit
        >>> from marlkit.envs import TransformedEnv, StepCounter, RewardSum
        >>> env = TransformedEnv(
        ...     marlkit.make("navigation", num_envs=8, n_agents=3),
        ...     [StepCounter(max_steps=50), RewardSum()],
        ... )
        >>> env.rollout(10).batch_size
        torch.Size([8, 10])
    """

    def __init__(
        self,
        env: EnvBase,
        transform: Transform | Sequence[Transform] | None = None,
        *,
        validate_actions: bool | None = None,
    ):
        if not isinstance(env, EnvBase):
            raise TypeError(f"TransformedEnv wraps an EnvBase, got {type(env).__name__}")
        super().__init__(
            batch_size=env.batch_size,
            device=env.device,
            validate_actions=env.validate_actions if validate_actions is None else validate_actions,
        )
        self.base_env = env
        self.group_map = env.group_map
        # Random actions come from the inner env's generator, which its seed already set (e.g.
        # make(..., seed=0)): a fresh generator here would make wrapped rollouts irreproducible.
        self._rng = env._rng
        if transform is None:
            transform = Compose()
        elif not isinstance(transform, Transform):
            transform = Compose(*transform)
        elif not isinstance(transform, Compose):
            transform = Compose(transform)
        _check_unattached(transform._flat())
        self.transform: Compose = transform
        self._refresh_specs()
        transform.set_parent(self)

    def _refresh_specs(self) -> None:
        base = self.base_env
        specs = EnvSpecs(
            base.observation_spec.clone(),
            base.state_spec.clone(),
            base.action_spec.clone(),
            base.reward_spec.clone(),
            base.done_spec.clone(),
        )
        specs = self.transform.transform_specs(specs)
        for name in self._SPEC_NAMES:
            self._set_spec(name, getattr(specs, name))

    def append_transform(self, transform: Transform) -> TransformedEnv:
        """Add a transform at the end and recompute the specs; returns ``self``."""
        if not isinstance(transform, Transform):
            raise TypeError(f"append_transform takes a Transform, got {type(transform).__name__}")
        flat = transform._flat() if isinstance(transform, Compose) else [transform]
        _check_unattached([*self.transform._flat(), *flat], skip=len(self.transform._flat()))
        self.transform.append(transform)
        self._refresh_specs()
        transform.set_parent(self)
        return self

    def _check_open(self) -> None:
        # The hooks below reach the inner env through its wrapper API, past its own check.
        super()._check_open()
        if self.base_env.is_closed:
            raise RuntimeError(
                f"{type(self.base_env).__name__} is closed (inside this TransformedEnv); create "
                "a new env"
            )

    @property
    def illegal_actions(self) -> IllegalActions:  # type: ignore[override]
        """The inner env's masking policy (validation here follows it)."""
        return self.base_env.illegal_actions

    @property
    def seed_range(self) -> tuple[int, int] | None:
        return self.base_env.seed_range

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        views, inner = None, None
        if tensordict is not None:
            views, inner = self.transform._views(tensordict, reset=True)
        out = self.base_env._wrapped_reset(inner, env_mask)
        return self.transform._reset_views(views, out, env_mask)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        views, inner = self.transform._views(tensordict, reset=False)
        next_td = self.base_env._wrapped_step(inner)
        return self.transform._step_views(views, next_td)

    def _apply_done_rule(
        self, next_td: TensorDictBase, tensordict: TensorDictBase | None = None
    ) -> None:
        # The inner env applied the rule to its output; again only if a transform changed flags.
        if self.transform.changes_done_flags:
            super()._apply_done_rule(next_td, tensordict)

    def _set_seed(self, seed: int) -> int:
        return self.base_env.set_seed(seed)

    def _close(self) -> None:
        try:
            self.transform.close()
        finally:
            self.base_env.close()

    @property
    def render_modes(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.base_env.render_modes

    def _render(self, env_index: int) -> object:
        return self.base_env.render(env_index)

    def __getattr__(self, name: str) -> object:
        # Scenario attributes (n_agents, render, ...) stay reachable through the wrapper.
        if name.startswith("_") or name == "base_env":
            raise AttributeError(name)
        return getattr(self.base_env, name)

    def __repr__(self) -> str:
        inner = repr(self.base_env).replace("\n", "\n    ")
        transform = repr(self.transform).replace("\n", "\n    ")
        return f"TransformedEnv(\n    env={inner},\n    transform={transform})"


def _check_unattached(transforms: list[Transform], skip: int = 0) -> None:
    """Refuse to attach a transform that already belongs to an env (or appears twice): it keeps
    state from its env's specs (batch size, keys), so a second env would silently break the
    first. The first ``skip`` transforms are the env's own, already attached."""
    seen: set[int] = set()
    for i, t in enumerate(transforms):
        if id(t) in seen:
            raise ValueError(
                f"{t!r} appears twice in the transforms; a transform holds its env's state: "
                "make a new instance (or transform.clone()) for each place"
            )
        seen.add(id(t))
        if i >= skip and t.parent is not None:  # its state, not the argument: as VideoRecorder
            raise RuntimeError(
                f"{t!r} is already attached to another env (a {type(t.parent).__name__}); a "
                "transform belongs to one env (it keeps state from that env's specs): make a "
                "new instance for this env, or pass transform.clone()"
            )
