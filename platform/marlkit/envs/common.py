"""``EnvBase``: the env API every simulator is adapted to.

Public methods validate and delegate to subclass hooks (the template method):

* ``_reset(tensordict, env_mask) -> TensorDict``: observations (and state) for the whole batch
  after resetting the envs selected by ``env_mask`` (``[*B]`` bool, ``None`` = all). Envs outside
  the mask keep their state and report it. Done entries may be left out: the base writes them.
* ``_step(tensordict) -> TensorDict``: the ``"next"`` entries (observations, state, rewards, done
  flags) for the actions in ``tensordict``. Done flags are reported per group (``terminated``
  and/or ``truncated`` ``[*B, n, 1]``), or, by simulators that only decide whole envs (VMAS),
  at the root only (``terminated``/``truncated`` ``[*B, 1]``, expanded to every group). A root
  ``done`` may be given to end an episode before every agent is done. The rest is the done rule
  below. Return fresh tensors: rollouts keep references to them.
* ``_set_seed(seed) -> int | None``: seed the simulator from ``seed`` and return the next seed
  it did not use (``None`` means ``seed + 1``: the simulator draws from one stream). A batch of
  ``k`` instances seeded ``seed .. seed + k - 1`` returns ``seed + k``.

**The done rule** (``docs/concepts.md``), applied by :meth:`EnvBase.step` to every output, in
one place (:meth:`EnvBase._apply_done_rule`), for every adapter, scenario, transform and
batched env:

1. per agent, ``done = terminated | truncated``;
2. at the root, ``done`` means the episode is over and the env will be reset: every agent is
   done, or the simulator ended the episode (it gave a root flag), in which case the agents not
   done yet are truncated (the episode was cut short around them);
3. root ``truncated`` is true when the episode is over and at least one agent present at its end
   (its group's ``"mask"`` in the step input, where the group has one; else every agent) was
   truncated without terminating (both at once count as a termination); root
   ``terminated = done & ~truncated``.

**The wrapper API**: what an env wrapping another one (``TransformedEnv``, ``SerialEnv``,
``ParallelEnv``) may use besides the public methods (``set_seed``, ``render``, ``close``, the
specs):

* ``_wrapped_reset(tensordict, env_mask)``: the reset hook plus the reset done flags, without the
  open check or the parsing of ``"_reset"`` masks;
* ``_wrapped_step(tensordict)``: the step hook plus the done rule, without validation;
* ``illegal_actions``: the masking policy of the innermost env (``"raise"`` or ``"mask"``), which
  the outermost layer applies when it validates actions (validation happens once, outside);
* ``_rng``: the random-action generator (``TransformedEnv`` shares its inner env's).
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from marlkit._checks import check_flag, check_int
from marlkit.data._fast import any_true, get_entry, set_leaf, stack_tensordicts
from marlkit.data.composite import Composite
from marlkit.data.keys import (
    ACTION_MASK,
    DONE,
    NEXT,
    RESET,
    NestedKey,
    join_key,
    key_path,
)
from marlkit.data.mdp import step_mdp_fn
from marlkit.data.specs import Categorical, OneHot, TensorSpec, format_shape
from marlkit.envs._done_rule import DonePlan, apply_done_rule, make_done_plan
from marlkit.envs._spec_utils import done_levels, reshape_env_mask

__all__ = ["EnvBase", "IllegalActions", "InvalidActionError", "MissingActionError"]

Policy = Callable[[TensorDictBase], TensorDictBase]

#: What happens to an action its ``action_mask`` forbids: ``"raise"`` refuses it (an
#: :class:`InvalidActionError`), ``"mask"`` lets the simulator replace it by a legal one.
IllegalActions = Literal["raise", "mask"]


class InvalidActionError(ValueError):
    """An action that does not fit the env's action spec (shape, dtype, bounds, mask, NaN)."""


class MissingActionError(InvalidActionError, KeyError):
    """An action key the env needs is absent from the input TensorDict."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def _set_flag(out: TensorDictBase, key: NestedKey, value: torch.Tensor) -> None:
    """``out.set(key, value)`` for a done flag of the done spec's shape, unchecked where its
    place is known to fit (a root flag ``[*B, 1]``, a group's ``[*B, n, 1]`` in the group's
    sub-TensorDict ``[*B, n]``)."""
    if isinstance(key, str):
        set_leaf(out, key, value)
        return
    parent = get_entry(out, key[0] if len(key) == 2 else key[:-1])
    if isinstance(parent, TensorDictBase) and parent.batch_size == value.shape[:-1]:
        set_leaf(parent, key[-1], value)
    else:
        out.set(key, value)  # no sub-TensorDict yet (or another batch): the checked write


class EnvBase(abc.ABC):
    """A batch of environments that reads and writes nested TensorDicts.

    Args:
        batch_size: the env batch ``B`` (``[num_envs]`` for batched simulators, ``[]`` for one).
        device: where the env's tensors live.
        validate_actions: check actions against ``action_spec`` in :meth:`step` (on by default;
            turn off for speed once a policy is known to be right).
    """

    _SPEC_NAMES = ("observation", "state", "action", "reward", "done")

    #: What happens to an action its ``action_mask`` forbids (see :data:`IllegalActions`).
    #: Simulators that replace illegal actions set ``"mask"``; wrappers report their innermost
    #: env's policy, so that validation (done once, by the outermost layer) follows it.
    illegal_actions: IllegalActions = "raise"

    def __init__(
        self,
        *,
        batch_size: torch.Size | tuple[int, ...] | list[int] = (),
        device: str | torch.device = "cpu",
        validate_actions: bool = True,
    ):
        self._batch_size = torch.Size(batch_size)
        try:
            self._device = torch.device(device)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"device {device!r} is not a torch device: {err}") from None
        if self._device.type == "cpu":  # "cpu:0": tensors made there report "cpu"
            self._device = torch.device("cpu")
        self.validate_actions = check_flag("validate_actions", validate_actions)
        self.group_map: dict[str, list[str]] = {}
        try:
            self._rng = torch.Generator(device=self._device)
        except RuntimeError as err:  # e.g. "cuda" with a CPU-only torch
            reason = str(err).split(". ")[0]  # torch goes on for a paragraph
            raise ValueError(f"device {device!r} is not available here: {reason}") from None
        self._rng.seed()
        self._closed = False
        self._specs: dict[str, Composite] = {
            name: Composite(shape=self._batch_size, device=self._device)
            for name in self._SPEC_NAMES
        }
        self._cache: dict[str, Any] = {}
        self._seed_range: tuple[int, int] | None = None

    # ------------------------------------------------------------------ properties
    @property
    def batch_size(self) -> torch.Size:
        """The env batch ``B``; groups add their agent dimension after it."""
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return self._device

    def _get_spec(self, name: str) -> Composite:
        return self._specs[name]

    def _set_spec(self, name: str, spec: Composite) -> None:
        if not isinstance(spec, Composite):
            raise TypeError(f"{name}_spec must be a Composite, got {type(spec).__name__}")
        if spec.shape != self.batch_size:
            raise ValueError(
                f"{name}_spec must have shape == batch_size {format_shape(self.batch_size)}, "
                f"got {format_shape(spec.shape)}"
            )
        self._specs[name] = spec
        self._cache.clear()

    observation_spec = property(
        lambda self: self._get_spec("observation"),
        lambda self, spec: self._set_spec("observation", spec),
        doc="Observations written by reset and step: per group ``(group, 'observation')``, ...",
    )
    state_spec = property(
        lambda self: self._get_spec("state"),
        lambda self, spec: self._set_spec("state", spec),
        doc="The global state (root ``'state'``) for centralised critics; empty when none. "
        "Unlike TorchRL, where state_spec means non-action inputs, this is an output.",
    )
    action_spec = property(
        lambda self: self._get_spec("action"),
        lambda self, spec: self._set_spec("action", spec),
        doc="Actions read by step: ``(group, 'action')`` per group.",
    )
    reward_spec = property(
        lambda self: self._get_spec("reward"),
        lambda self, spec: self._set_spec("reward", spec),
        doc="Rewards under 'next': ``(group, 'reward')`` of shape ``[*B, n, 1]``.",
    )
    done_spec = property(
        lambda self: self._get_spec("done"),
        lambda self, spec: self._set_spec("done", spec),
        doc="Done flags: root ``[*B, 1]`` and per group ``[*B, n, 1]``, all bool.",
    )

    def __getstate__(self) -> dict[str, Any]:
        # The cache holds closures (step_mdp's), which do not pickle; it is rebuilt on demand.
        state = self.__dict__.copy()
        state["_cache"] = {}
        return state

    def _cached(self, name: str, build: Callable[[], Any]) -> Any:
        value = self._cache.get(name)
        if value is None:
            value = build()
            self._cache[name] = value
        return value

    @property
    def groups(self) -> list[str]:
        """Group names, in order."""
        return list(self.group_map)

    @property
    def action_keys(self) -> list[NestedKey]:
        return self._cached("action_keys", lambda: self.action_spec.keys(True, True))

    @property
    def reward_keys(self) -> list[NestedKey]:
        return self._cached("reward_keys", lambda: self.reward_spec.keys(True, True))

    @property
    def done_keys(self) -> list[NestedKey]:
        return self._cached("done_keys", lambda: self.done_spec.keys(True, True))

    @property
    def observation_keys(self) -> list[NestedKey]:
        return self._cached(
            "observation_keys",
            lambda: self.observation_spec.keys(True, True) + self.state_spec.keys(True, True),
        )

    def _action_items(self) -> list[tuple[NestedKey, TensorSpec, NestedKey | None]]:
        """``(key, spec, sibling action-mask key or None)`` for each action leaf."""

        def build() -> list[tuple[NestedKey, TensorSpec, NestedKey | None]]:
            items = []
            for key, spec in self.action_spec.items(True, True):
                mask_key = join_key(key_path(key)[:-1], ACTION_MASK)
                masked = isinstance(spec, (Categorical, OneHot))
                items.append((key, spec, mask_key if masked else None))
            return items

        return self._cached("action_items", build)

    def _done_items(self) -> list[tuple[NestedKey, TensorSpec]]:
        return self._cached("done_items", lambda: list(self.done_spec.items(True, True)))

    def _done_levels(self) -> list[tuple[tuple[str, ...], torch.Size]]:
        return self._cached("done_levels", lambda: done_levels(self.done_spec))

    # ------------------------------------------------------------------ hooks
    @abc.abstractmethod
    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        """See the module docstring."""

    @abc.abstractmethod
    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """See the module docstring."""

    @abc.abstractmethod
    def _set_seed(self, seed: int) -> int | None:
        """Seed the simulator; return the next unused seed (``None``: ``seed + 1``)."""

    def _close(self) -> None:  # noqa: B027  (an optional hook: most simulators hold nothing)
        """Release simulator resources (optional)."""

    # ------------------------------------------------------------------ reset
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed; create a new env")

    def _env_reset_mask(self, tensordict: TensorDictBase | None) -> torch.Tensor | None:
        """Combine root and group ``"_reset"`` masks into one ``[*B]`` env mask (None = all)."""
        if tensordict is None:
            return None
        mask = None
        for prefix, shape in self._done_levels():
            key = (*prefix, RESET) if prefix else RESET
            value = get_entry(tensordict, key)
            if value is None:
                continue
            if not isinstance(value, torch.Tensor) or value.dtype != torch.bool:
                raise TypeError(f"reset mask {key!r} must be a bool tensor, got {value!r}")
            if value.shape != shape:
                raise ValueError(
                    f"reset mask {key!r} has shape {format_shape(value.shape)}, expected "
                    f"{format_shape(shape)} (the shape of the done flags at that level)"
                )
            env = value.reshape(*self.batch_size, -1).any(-1)
            mask = env if mask is None else mask | env
        if mask is None or bool(mask.all()):
            return None
        return mask.to(self.device)

    def _fill_reset_done(
        self, out: TensorDictBase, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> None:
        for key, spec in self._done_items():
            if get_entry(out, key) is not None:  # the hook gave it
                continue
            value = None
            if env_mask is not None and tensordict is not None:
                before = get_entry(tensordict, key)
                if before is not None:
                    value = before & ~reshape_env_mask(env_mask, spec.shape)
            if value is None:
                value = torch.zeros(spec.shape, dtype=torch.bool, device=self.device)
            _set_flag(out, key, value)

    def reset(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Reset all envs, or those selected by ``"_reset"`` masks in ``tensordict``.

        Masks: root ``"_reset"`` ``[*B, 1]`` and ``(group, "_reset")`` ``[*B, n, 1]``, bool;
        an env resets when any of its masks is set. The reset is one vectorised call over the
        whole batch. Returns the observations (and state, done flags) of every env.
        """
        self._check_open()
        return self._wrapped_reset(tensordict, self._env_reset_mask(tensordict))

    def _wrapped_reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        """The wrapper API's reset: the hook, then the done flags of the reset envs (false)."""
        out = self._reset(tensordict, env_mask)
        self._fill_reset_done(out, tensordict, env_mask)
        return out

    # ------------------------------------------------------------------ step
    def check_actions(self, tensordict: TensorDictBase) -> None:
        """Check the actions in ``tensordict`` as :meth:`step` does with ``validate_actions``
        on, whatever that setting, without touching the simulator.

        Raises:
            MissingActionError: an action key is absent (a ``KeyError`` and ``ValueError``).
            InvalidActionError: a wrong shape, dtype or device, an out-of-bounds, masked-out or
                NaN action; the message names the key, the spec and what came.
        """
        self._check_open()
        self._validate_action(tensordict)

    def _validate_action(self, tensordict: TensorDictBase) -> None:
        if not isinstance(tensordict, TensorDictBase):
            raise TypeError(f"step() takes a TensorDict, got {type(tensordict).__name__}")
        for key, spec, mask_key in self._action_items():
            value = tensordict.get(key, None)
            if value is None:
                raise MissingActionError(
                    f"step(): the action {key!r} is missing from the input TensorDict "
                    f"(expected {spec!r}); keys present: "
                    f"{sorted(map(str, tensordict.keys(True, True)))}"
                )
            reason = spec.explain(value)
            if reason is None and mask_key is not None:
                reason = self._explain_masked(tensordict, value, spec, mask_key)
            if reason is not None:
                raise InvalidActionError(
                    f"step(): invalid action at {key!r}: {reason}; expected {spec!r}"
                )

    def _explain_masked(
        self,
        tensordict: TensorDictBase,
        value: torch.Tensor,
        spec: TensorSpec,
        mask_key: NestedKey,
    ) -> str | None:
        if self.illegal_actions == "mask":  # the simulator replaces illegal actions
            return None
        mask = tensordict.get(mask_key, None)
        if mask is None:
            return None
        n = spec.n  # type: ignore[attr-defined]  # Categorical and OneHot both carry n
        expected = (*value.shape[: value.ndim - (1 if isinstance(spec, OneHot) else 0)], n)
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != expected:
            got = (
                f"{format_shape(mask.shape)} {mask.dtype}"
                if isinstance(mask, torch.Tensor)
                else type(mask).__name__
            )
            return f"the action mask {mask_key!r} must be bool {format_shape(expected)}, got {got}"
        index = value.long().argmax(-1) if isinstance(spec, OneHot) else value.long()
        allowed = mask.gather(-1, index.unsqueeze(-1)).squeeze(-1)
        if bool(allowed.all()):
            return None
        where = (~allowed).nonzero()[0].tolist()
        return f"action {index[tuple(where)].item()} at index {where} is masked out by {mask_key!r}"

    def _done_plan(self) -> DonePlan:
        return self._cached(
            "done_plan",
            lambda: make_done_plan(
                self.done_spec, self.observation_spec, self.batch_size, self.device
            ),
        )

    def _apply_done_rule(
        self, next_td: TensorDictBase, tensordict: TensorDictBase | None = None
    ) -> None:
        """Write every done flag of a step output by the done rule (the module docstring).

        Args:
            next_td: what ``_step`` returned (completed in place).
            tensordict: the step input, whose ``(group, "mask")`` says who was present.
        """
        apply_done_rule(self._done_plan(), next_td, tensordict)

    def step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Apply the actions in ``tensordict`` and write the result under ``"next"``.

        With ``validate_actions`` on, a missing action, a wrong shape, dtype or device, an
        out-of-bounds, masked-out or NaN action raises :class:`InvalidActionError` (a
        ``ValueError``) naming the key, the spec and what came, before the simulator is touched.
        """
        self._check_open()
        if self.validate_actions:
            self._validate_action(tensordict)
        next_td = self._wrapped_step(tensordict)
        if tensordict.batch_size == next_td.batch_size and tensordict.device == next_td.device:
            set_leaf(tensordict, NEXT, next_td)  # of its batch and device: nothing to check
        else:
            tensordict.set(NEXT, next_td)  # checked (and refused where it does not fit)
        return tensordict

    def _wrapped_step(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The wrapper API's step: the hook, then the done rule; no validation."""
        next_td = self._step(tensordict)
        self._apply_done_rule(next_td, tensordict)
        return next_td

    def _step_mdp(self, tensordict: TensorDictBase) -> TensorDictBase:
        fn = self._cached(
            "step_mdp",
            lambda: step_mdp_fn(action_keys=self.action_keys, reward_keys=self.reward_keys),
        )
        return fn(tensordict)

    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, then reset the envs that are done.

        Returns:
            ``(transition, next_root)``: the stepped ``tensordict`` (with ``"next"``) and the
            input for the following step, in which done envs are already reset.
        """
        tensordict = self.step(tensordict)
        root = self._step_mdp(tensordict)
        done = get_entry(root, DONE)
        if done is None:
            done = root.get(DONE)  # not found: the public method's KeyError
        if any_true(done):
            root.set(RESET, done.clone())
            reset_out = self.reset(root)
            root = root.exclude(RESET)
            root.update(reset_out)
        return tensordict, root

    # ------------------------------------------------------------------ random actions
    def rand_action(self, tensordict: TensorDictBase | None = None) -> TensorDictBase:
        """Write a random action for every action key, honouring ``(group, "action_mask")``.

        Uses the env's own generator, so a seeded env gives the same random rollout again.
        """
        self._check_open()
        if tensordict is None:
            tensordict = TensorDict(batch_size=self.batch_size, device=self.device)
        items = self._action_items()
        for key, _, _ in items:
            parent = key[:-1] if isinstance(key, tuple) else ()
            if parent and not isinstance(
                tensordict.get(parent[0] if len(parent) == 1 else parent, None), TensorDictBase
            ):
                # Missing group sub-TensorDicts: build them with their batch dims once.
                tensordict.update(self.action_spec.zero())
                break
        for key, spec, mask_key in items:
            mask = tensordict.get(mask_key, None) if mask_key is not None else None
            if mask is not None and isinstance(spec, Categorical):
                value = spec.rand(generator=self._rng, mask=mask)
            elif mask is not None and isinstance(spec, OneHot):
                masked = OneHot(spec.n, spec.shape, spec.dtype, spec.device, mask=mask)
                value = masked.rand(generator=self._rng)
            else:
                value = spec.rand(generator=self._rng)
            tensordict.set(key, value)
        return tensordict

    # ------------------------------------------------------------------ rollout
    def rollout(
        self,
        max_steps: int,
        policy: Policy | None = None,
        *,
        break_when_any_done: bool = True,
        auto_reset: bool = True,
        tensordict: TensorDictBase | None = None,
    ) -> TensorDictBase:
        """Run up to ``max_steps`` steps and stack them: batch ``[*B, T]``.

        Args:
            max_steps: number of steps (``T <= max_steps``).
            policy: reads the root TensorDict and writes actions; random actions when ``None``.
            break_when_any_done: stop after the first step in which any env is done; otherwise
                done envs are reset and the rollout goes on for ``max_steps``.
            auto_reset: reset first (``tensordict`` may carry partial-reset masks); when
                ``False``, ``tensordict`` is the starting point and must be given.
            tensordict: see ``auto_reset``.
        """
        max_steps = check_int("max_steps", max_steps, low=1)  # NumPy ints too, as elsewhere
        if auto_reset:
            td = self.reset(tensordict)
        elif tensordict is None:
            raise ValueError("rollout(auto_reset=False) needs a starting tensordict")
        else:
            td = tensordict
        steps: list[TensorDictBase] = []
        for _ in range(max_steps):
            td = policy(td) if policy is not None else self.rand_action(td)
            if break_when_any_done:
                td = self.step(td)
                steps.append(td)
                if bool(td.get((NEXT, DONE)).any()):
                    break
                td = self._step_mdp(td)
            else:
                transition, td = self.step_and_maybe_reset(td)
                steps.append(transition)
        return stack_tensordicts(steps, len(self.batch_size))

    # ------------------------------------------------------------------ misc
    def set_seed(self, seed: int) -> int:
        """Seed the simulator and the env's random-action generator.

        Every instance of a batch gets its own seed (``seed``, ``seed + 1``, ...) where the
        simulator seeds instances one by one; batched envs chain the seed through their workers.

        Returns:
            The next seed this env did not use (as TorchRL's ``set_seed``): seed another env
            built alongside with it, and no two instances share a seed.
        """
        self._check_open()
        seed = check_int("seed", seed)
        if not -(2**63) <= seed < 2**63:  # what torch's generators take, with room for offsets
            raise ValueError(f"seed must be an int in [-2**63, 2**63), got {seed}")
        following = self._set_seed(seed)  # first: a simulator refusing the seed changes nothing
        self._rng.manual_seed(seed)
        following = seed + 1 if following is None else int(following)
        if following <= seed:
            raise RuntimeError(
                f"{type(self).__name__}._set_seed({seed}) returned {following}; the next unused "
                "seed must be greater than the seed it was given"
            )
        self._seed_range = (seed, following)
        return following

    @property
    def seed_range(self) -> tuple[int, int] | None:
        """``(first, next)``: the seeds the last :meth:`set_seed` used, ``first`` to
        ``next - 1``; ``None`` before any."""
        return self._seed_range

    # ------------------------------------------------------------------ rendering
    #: Render modes this env supports; ``("rgb_array",)`` when :meth:`_render` is implemented.
    render_modes: tuple[str, ...] = ()

    def _render(self, env_index: int) -> Any:
        """Return one frame, ``uint8 [H, W, 3]`` (NumPy or torch), of env ``env_index``."""
        raise NotImplementedError

    def render(self, env_index: int = 0) -> np.ndarray:
        """An RGB frame of one env of the batch, ``uint8 [H, W, 3]``.

        Raises:
            NotImplementedError: the env declares no ``"rgb_array"`` render mode.
            IndexError: ``env_index`` is outside the batch.
            ValueError: the simulator returned something that is not an RGB frame.
        """
        self._check_open()
        if "rgb_array" not in self.render_modes:
            raise NotImplementedError(
                f"{type(self).__name__} does not render (render_modes={self.render_modes})"
            )
        n = self.batch_size.numel()
        env_index = check_int("env_index", env_index)
        if not -n <= env_index < n:
            raise IndexError(f"env_index {env_index} is outside a batch of {n} envs")
        frame = self._render(env_index % n)
        if isinstance(frame, torch.Tensor):
            frame = frame.detach().cpu().numpy()
        frame = np.asarray(frame)
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[-1] != 3:
            raise ValueError(
                f"render({env_index}) of {type(self).__name__}: the simulator's frame is "
                f"{frame.dtype} {list(frame.shape)}, expected an RGB frame, uint8 [H, W, 3]"
            )
        return frame

    def close(self) -> None:
        """Release the simulator; the env cannot be used afterwards."""
        if not self._closed:
            self._closed = True
            self._close()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __enter__(self) -> EnvBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if not hasattr(self, "_batch_size"):  # a subclass failed before EnvBase.__init__ ran
            return f"{type(self).__name__}(<not constructed>)"
        groups = ", ".join(f"{g}: {len(a)}" for g, a in self.group_map.items())
        return (
            f"{type(self).__name__}(batch_size={format_shape(self.batch_size)}, "
            f"device={self.device}, groups={{{groups}}})"
        )
