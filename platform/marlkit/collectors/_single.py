"""``Collector``: batches of frames from one env (any batch) in this process."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from marlkit._checks import check_int
from marlkit.collectors._base import (
    CollectorBase,
    Policy,
    PostProc,
    resume_seed,
    seed_rngs,
    split_frames,
)
from marlkit.collectors._weights import Weights, WeightsLayout, load_weights_, policy_tensors
from marlkit.data._fast import stack_tensordicts
from marlkit.data.exploration import Exploration, set_exploration
from marlkit.data.keys import COLLECTOR, DONE, NEXT, TRAJ_IDS
from marlkit.envs import EnvBase, InvalidActionError, StepCounter, TransformedEnv

__all__ = ["Collector"]

#: Where ``max_frames_per_traj`` counts the steps of each trajectory.
TRAJ_STEP_COUNT = (COLLECTOR, "step_count")


def _device(value: str | torch.device | None, what: str) -> torch.device | None:
    if value is None:
        return None
    try:
        return torch.device(value)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{what} {value!r} is not a torch device: {err}") from None


def _parameter_device(policy: Any) -> torch.device | None:
    if isinstance(policy, nn.Module):
        for tensor in (*policy.parameters(), *policy.buffers()):
            return tensor.device
    return None


def _unstackable(steps: list[TensorDictBase], err: RuntimeError) -> Exception:
    """Why the steps of a batch do not stack: the first step whose keys or shapes differ from
    the first step's, named (tensordict's own message names neither)."""
    first = {k: v.shape for k, v in steps[0].items(True, True)}
    for t, step in enumerate(steps[1:], 1):
        here = {k: v.shape for k, v in step.items(True, True)}
        added = ", ".join(sorted(map(repr, here.keys() - first)))
        missing = ", ".join(sorted(map(repr, first.keys() - here.keys())))
        if added or missing:
            parts = [f"adds {added}" if added else "", f"lacks {missing}" if missing else ""]
            change = " and ".join(part for part in parts if part)
            return ValueError(
                f"Collector: step {t} of the batch {change} against its first step: the policy "
                "(and the env) must write the same keys at every step, so that the steps stack "
                "into one batch; write such a key at every step (zeros where it has no value)"
            )
        for key, shape in here.items():
            if shape != first[key]:
                return ValueError(
                    f"Collector: {key!r} has shape {list(shape)} at step {t} of the batch and "
                    f"{list(first[key])} at its first step: a key must keep its shape across "
                    "steps, so that the steps stack into one batch"
                )
    return err


class Collector(CollectorBase):
    """Batches of ``frames_per_batch`` frames from ``env``, as an iterator.

    Each batch is a TensorDict of batch ``[*B, T]`` (``B`` the env batch, ``T =
    frames_per_batch / numel(B)``) holding every transition as :meth:`EnvBase.rollout` stacks
    them, plus ``("collector", "traj_ids")`` ``[*B, T]`` int64: the trajectory each step belongs
    to, unique across batches and resets. Finished envs are reset as they finish
    (``step_and_maybe_reset``) and the next batch continues where the last one stopped.

    Args:
        env: the env, or a callable returning one (then the collector owns it and closes it).
        policy: reads the root TensorDict and writes the actions (a ``TensorDictModule``, say);
            ``None`` samples the action spec (masks honoured).
        frames_per_batch: frames per batch, a multiple of the env batch's size.
        total_frames: stop after this many frames (rounded up to whole batches); ``-1``: never.
        init_random_frames: frames collected with random actions before the policy is used,
            in whole batches (every batch that starts before them is random: a batch never
            mixes random steps, which carry no policy outputs, with policy steps).
        max_frames_per_traj: truncate trajectories at this many steps (the env's done flags say
            so, by the done rule; the count is ``("collector", "step_count")``).
        reset_at_each_iter: start every batch from a reset of every env.
        split_trajs: yield ``[n_trajectories, T_max]`` batches, padded, with
            ``("collector", "mask")`` marking the real steps (:func:`split_trajectories`).
        device: where the policy runs (default: its parameters' device, else the env's); inputs
            go there and its outputs come back to the env's device.
        storing_device: where batches are stored (default: the env's device).
        exploration: the exploration mode the policy runs under (``"random"`` or
            ``"deterministic"``, see :mod:`marlkit.data.exploration`).
        postproc: applied to every batch before it is yielded.
        progress: show a progress bar (frames, frames/s) on stderr.
        replay_buffer: write every batch into it (a :class:`marlkit.replay.ReplayBuffer`), as
            transitions ``batch.reshape(-1)`` (env after env, each env's steps in order); the
            batch is yielded all the same.

    Raises:
        ValueError: ``frames_per_batch`` that does not divide into steps of the batch, a bad
            count, mode or device.
        TypeError: an env that is not an :class:`EnvBase`, a policy that is not callable.

    Examples:
        >>> import marlkit
        >>> from marlkit.collectors import Collector
        >>> env = marlkit.make("navigation", num_envs=8, n_agents=2, seed=0)
        >>> collector = Collector(env, None, frames_per_batch=64, total_frames=128)
        >>> [tuple(batch.batch_size) for batch in collector]
        [(8, 8), (8, 8)]
    """

    def __init__(
        self,
        env: EnvBase | Callable[[], EnvBase],
        policy: Policy | None,
        frames_per_batch: int,
        total_frames: int = -1,
        *,
        init_random_frames: int = 0,
        max_frames_per_traj: int | None = None,
        reset_at_each_iter: bool = False,
        split_trajs: bool = False,
        device: str | torch.device | None = None,
        storing_device: str | torch.device | None = None,
        exploration: Exploration = "random",
        postproc: PostProc | None = None,
        progress: bool = False,
        replay_buffer: Any = None,
    ):
        super().__init__(
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            exploration=exploration,
            split_trajs=split_trajs,
            postproc=postproc,
            progress=progress,
            replay_buffer=replay_buffer,
        )
        self.init_random_frames = check_int("init_random_frames", init_random_frames, low=0)
        self.max_frames_per_traj = check_int(
            "max_frames_per_traj", max_frames_per_traj, low=1, allow_none=True
        )
        self.reset_at_each_iter = bool(reset_at_each_iter)
        if policy is not None and not callable(policy):
            raise TypeError(f"policy must be callable or None, got {type(policy).__name__}")
        storing = _device(storing_device, "storing_device")
        where = _device(device, "device")
        self._owns_env = not isinstance(env, EnvBase)
        self._inner_env = self._resolve_env(env)
        self.env: EnvBase = self._inner_env
        try:
            if self.max_frames_per_traj is not None:
                counter = StepCounter(self.max_frames_per_traj, step_count_key=TRAJ_STEP_COUNT)
                self.env = TransformedEnv(self._inner_env, counter)
            self._steps = split_frames(self.frames_per_batch, self.env.batch_size)
            self.storing_device = storing or self.env.device
            self._source_policy = policy
            self.device = where or _parameter_device(policy) or self.env.device
            self.policy = self._policy_on(policy, self.device)
        except BaseException:
            if self._owns_env:  # built here, for this collector: nobody else can close it
                self._inner_env.close()
            raise
        self._moves = self.device != self.env.device
        self._traj_counter = 0
        self._traj_ids = torch.zeros(self.env.batch_size, dtype=torch.int64, device=self.env.device)
        self._root: TensorDictBase | None = None
        #: The seed of the last set_seed (None: never seeded here), kept by state_dict.
        self._seed: int | None = None

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _resolve_env(env: EnvBase | Callable[[], EnvBase]) -> EnvBase:
        if isinstance(env, EnvBase):
            return env
        if not callable(env):
            raise TypeError(f"env must be an EnvBase or a callable returning one, got {env!r}")
        built = env()
        if not isinstance(built, EnvBase):
            raise TypeError(
                f"the env factory {env!r} returned {type(built).__name__}, not an EnvBase"
            )
        return built

    @staticmethod
    def _policy_on(policy: Policy | None, device: torch.device) -> Policy | None:
        """The policy to call: the user's, or a copy on ``device`` when its parameters live
        elsewhere (kept in step by :meth:`update_policy_weights_`)."""
        if policy is None:
            return None
        where = _parameter_device(policy)
        if where is None or where == device or not isinstance(policy, nn.Module):
            return policy
        return copy.deepcopy(policy).to(device)

    # ------------------------------------------------------------------ collecting
    def _new_ids(self, where: torch.Tensor | None) -> None:
        """Fresh trajectory ids for the envs in ``where`` (``[numel(B)]`` bool; None: all), in a
        new tensor: the steps collected so far hold the old one."""
        ids = self._traj_ids.clone().view(-1)
        count = ids.numel() if where is None else int(where.sum())
        fresh = torch.arange(self._traj_counter, self._traj_counter + count, device=ids.device)
        if where is None:
            ids.copy_(fresh)
        else:
            ids[where] = fresh
        self._traj_counter += count
        self._traj_ids = ids.view(self._traj_ids.shape)

    def _reset_envs(self) -> None:
        self._root = self.env.reset()
        self._new_ids(None)

    def _act(self, root: TensorDictBase, random: bool, check: bool) -> TensorDictBase:
        if self.policy is None or random:
            return self.env.rand_action(root)
        given = root.to(self.device) if self._moves else root
        out = self.policy(given)
        if not isinstance(out, TensorDictBase):
            raise TypeError(
                f"the policy {self.policy!r} returned {type(out).__name__}, not a TensorDict "
                "(a policy writes its actions into the TensorDict it reads and returns it)"
            )
        if out is not given:  # a TensorDict of its outputs: merged into what it read (the
            out = given.update(out)  # batches would have lost the observations)
        if self._moves:
            out = out.to(self.env.device)
        if check:
            try:
                self.env.check_actions(out)
            except InvalidActionError as err:
                raise type(err)(
                    f"Collector: the policy's output is not an action of the env: {err}"
                ) from None
        return out

    def _collect(self) -> TensorDictBase:
        if self._root is None or self.reset_at_each_iter:
            self._reset_envs()
        root = self._root
        assert root is not None  # set by _reset_envs
        per_step = self._traj_ids.numel()
        steps = []
        # Whole batches: a batch of random steps and policy steps would mix key sets.
        random = self.frames < self.init_random_frames
        with set_exploration(self.exploration), torch.no_grad():  # batches hold no graphs
            for t in range(self._steps):
                root = self._act(root, random, check=t == 0)
                root.set(TRAJ_IDS, self._traj_ids)
                transition, root = self.env.step_and_maybe_reset(root)
                steps.append(transition)
                done = transition.get((NEXT, DONE)).reshape(per_step)
                if bool(done.any()):  # those envs were reset: new trajectories from here on
                    self._new_ids(done)
        self._root = root
        try:
            batch = stack_tensordicts(steps, len(self.env.batch_size))
        except RuntimeError as err:
            raise _unstackable(steps, err) from None
        if self.storing_device != self.env.device:
            batch = batch.to(self.storing_device)
        return batch

    # ------------------------------------------------------------------ control
    def update_policy_weights_(self, weights: Weights | None = None) -> None:
        """Bring the collector's policy up to date.

        With ``weights`` (a ``state_dict``, or a TensorDict of parameters and buffers from
        ``TensorDict.from_module``), check them against the policy's names, shapes and dtypes,
        then copy their values into the policy's own tensors (an optimizer built on
        ``policy.parameters()`` keeps training the policy the collector runs). Every parameter
        and persistent buffer must be given; a non-persistent buffer left out keeps its value.

        Without ``weights``: when the collector runs a copy of the user's policy on another
        device, copy the user's parameters and buffers into it; when it runs the user's policy
        itself, or the policy has no weights (``None``, a plain function), nothing happens.

        Raises:
            TypeError: ``weights`` for a policy that is not an ``nn.Module``, or weights that are
                neither a mapping nor a TensorDict of tensors.
            KeyError: a missing parameter or persistent buffer, or a name the policy does not
                have (nothing is loaded).
            ValueError: a shape or dtype that is not the policy's (nothing is loaded).
        """
        self._check_open()
        policy = self.policy
        if not isinstance(policy, nn.Module):
            if weights is not None:
                raise TypeError(
                    f"update_policy_weights_(weights) needs an nn.Module policy, got {policy!r}"
                )
            return
        if weights is None:
            if policy is self._source_policy:
                return
            weights = policy_tensors(self._source_policy)  # type: ignore[arg-type]  # a copy's
        load_weights_(policy, WeightsLayout(policy).check(weights))

    def reset(self) -> None:
        """Reset every env now; the next batch starts from there, with new trajectory ids."""
        self._check_open()
        self._reset_envs()

    def set_seed(self, seed: int) -> int:
        """Seed the env (see :meth:`EnvBase.set_seed`) and this process's global generators, and
        reset the env at the next batch, so that the same seed gives the same batches, also with
        a stochastic policy in ``"random"`` mode.

        The global generators are the ones a policy draws its noise from: torch's (every
        device), NumPy's and Python's ``random`` (see :func:`seed_rngs`: seeded from ``seed``
        through a hash, so that the policy's noise is not the env's random-action stream).

        Returns:
            The next seed the env did not use.
        """
        self._check_open()
        following = self.env.set_seed(seed)
        self._seed = seed
        seed_rngs(seed)
        self._root = None
        return following

    def state_dict(self) -> dict[str, Any]:
        """Frames and batches so far, the trajectory counter, the seed of the last
        :meth:`set_seed`, and the env's own state when it has a ``state_dict``. A collector
        loaded from it restarts its envs from a reset."""
        state = {**self._counters(), "traj_counter": self._traj_counter, "seed": self._seed}
        env_state = getattr(self._inner_env, "state_dict", None)
        if callable(env_state):
            state["env"] = env_state()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; the next batch starts from a reset.

        An env without a state of its own (most simulators: their random streams and
        episodes are not saved) is re-seeded before that reset, from a seed derived from the
        saved seed and the batches done (:func:`resume_seed`; fresh OS entropy when the
        collector was never seeded): a resumed run does not replay the episodes it began with.
        """
        self._check_open()
        state = dict(state)
        self._load_counters(state)
        if "traj_counter" not in state:
            raise KeyError(f"the collector state has no 'traj_counter'; keys: {sorted(state)}")
        self._traj_counter = check_int("traj_counter", state["traj_counter"], low=0)
        seed = state.get("seed")
        self._seed = None if seed is None else check_int("seed", seed, low=0)
        if "env" in state:
            load = getattr(self._inner_env, "load_state_dict", None)
            if not callable(load):
                raise ValueError(
                    f"the state holds an env state but {type(self._inner_env).__name__} has no "
                    "load_state_dict"
                )
            load(state["env"])
        else:
            self.env.set_seed(resume_seed(self._seed, self.batches))
        self._root = None

    def _shutdown(self) -> None:
        if self._owns_env:
            self.env.close()

    def __repr__(self) -> str:
        return (
            f"Collector(env={type(self._inner_env).__name__}{list(self.env.batch_size)}, "
            f"frames_per_batch={self.frames_per_batch}, steps_per_batch={self._steps}, "
            f"total_frames={self.total_frames}, frames={self.frames})"
        )
