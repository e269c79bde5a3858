"""``SerialEnv`` and ``ParallelEnv``: many copies of an env as one batch ``[num_workers, *B]``.

``SerialEnv`` steps its copies one after the other in this process; ``ParallelEnv`` runs each copy
in a worker process and exchanges data through shared memory (one buffer for the inputs, one for
the outputs, one for what an auto-reset returns, allocated once from the specs), with a pipe per
worker for commands. Both expose the same API and specs as any env: every spec gains a leading
``num_workers`` dimension.

* Factories are serialised with cloudpickle, so lambdas, closures and functions defined in
  ``__main__`` or a notebook cell work with every start method.
* Seeds are chained: worker ``w`` is seeded with the seed worker ``w - 1`` did not use, so no two
  env instances of any nesting share a seed (see :meth:`EnvBase.set_seed`).
* Partial resets reach only the workers whose envs are selected, each with its own mask and
  its part of the input; the other workers report what they last returned (their current
  state). A worker sees only the keys the input holds: ``ParallelEnv`` tells its workers which
  keys the input lacks, so none reads a value its shared buffer kept from an earlier call.
* Actions are validated once, in the parent, with the workers' masking policy.
* ``ParallelEnv.step_and_maybe_reset`` is one command per worker: each worker steps, then resets
  its own done envs at once, as :meth:`EnvBase.step_and_maybe_reset` would, and the parent merges
  the reset workers' outputs into the next root. A done env costs no second round trip.
* A worker that raises sends its exception and traceback back and the parent raises
  :class:`WorkerError` naming the worker; a worker that dies (killed, segfault) is detected while
  the parent waits, the remaining workers are shut down and the env is closed, so nothing is left
  hanging. A worker output that lacks a key is an error naming the key and the worker.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from marlkit._checks import check_int
from marlkit._utils import get_logger
from marlkit.data._fast import stack_tensordicts
from marlkit.data.composite import Composite
from marlkit.data.keys import DONE, NEXT, RESET, NestedKey
from marlkit.envs._shared import BufferLeaves
from marlkit.envs._workers import WorkerCpus, WorkerError, WorkerPool, serialise_setup
from marlkit.envs.common import EnvBase

__all__ = ["ParallelEnv", "SerialEnv", "WorkerError"]

EnvFactory = Callable[..., EnvBase]

_log = get_logger("envs.batched")


def _as_factories(
    num_workers: int,
    create_env_fn: EnvFactory | Sequence[EnvFactory],
    create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
) -> list[tuple[EnvFactory, dict[str, Any]]]:
    check_int("num_workers", num_workers, low=1)
    fns = (
        list(create_env_fn)
        if isinstance(create_env_fn, Sequence)
        else [create_env_fn] * num_workers
    )
    if create_env_kwargs is None or isinstance(create_env_kwargs, Mapping):
        kwargs = [dict(create_env_kwargs or {}) for _ in range(num_workers)]
    else:
        kwargs = [dict(k) for k in create_env_kwargs]
    if len(fns) != num_workers or len(kwargs) != num_workers:
        raise ValueError(
            f"{num_workers} workers need as many factories and kwargs, got {len(fns)} factories "
            f"and {len(kwargs)} kwargs"
        )
    for fn in fns:
        if not callable(fn):
            raise TypeError(f"create_env_fn must be callable, got {type(fn).__name__}")
    return list(zip(fns, kwargs))


def _specs_of(env: EnvBase) -> dict[str, Composite]:
    return {name: getattr(env, f"{name}_spec").clone() for name in EnvBase._SPEC_NAMES}


def _meta_of(env: EnvBase) -> dict[str, Any]:
    return {
        "batch_size": tuple(env.batch_size),
        "device": str(env.device),
        "group_map": {g: list(a) for g, a in env.group_map.items()},
        "render_modes": tuple(env.render_modes),
        "illegal_actions": env.illegal_actions,
        "seed_range": env.seed_range,
    }


def _select(out: TensorDictBase, keys: list[NestedKey], worker: int, what: str) -> TensorDictBase:
    """``out`` restricted to ``keys``, or a KeyError naming the keys the worker's env left out."""
    try:
        return out.select(*keys)
    except KeyError:
        have = set(out.keys(True, True))
        raise _missing_error([k for k in keys if k not in have], worker, what) from None


def _missing_error(missing: Sequence[NestedKey], worker: int, what: str) -> KeyError:
    return KeyError(
        f"worker {worker}'s env returned no {', '.join(map(repr, missing))} from {what}(); "
        "a batched env needs every observation, state, done (and, from step, reward) key of "
        "the specs in every output"
    )


def _overlapping(ranges: Sequence[tuple[int, int] | None]) -> tuple[int, int] | None:
    """Two workers whose seed ranges overlap (their indices), or None."""
    seeded = sorted((r, w) for w, r in enumerate(ranges) if r is not None)
    for (first, w_first), (second, w_second) in itertools.pairwise(seeded):
        if second[0] < first[1]:
            return (min(w_first, w_second), max(w_first, w_second))
    return None


class _BatchedEnv(EnvBase):
    """What SerialEnv and ParallelEnv share: specs, seeds, splitting inputs, stacking outputs."""

    def __init__(
        self,
        num_workers: int,
        sub_specs: dict[str, Composite],
        meta: dict[str, Any],
        validate_actions: bool,
    ):
        sub_batch = torch.Size(meta["batch_size"])
        super().__init__(
            batch_size=(num_workers, *sub_batch),
            device=meta["device"],
            validate_actions=validate_actions,
        )
        self.num_workers = num_workers
        self.sub_batch_size = sub_batch
        self.group_map = meta["group_map"]
        self.render_modes = tuple(meta["render_modes"])
        self.illegal_actions = meta["illegal_actions"]
        for name in self._SPEC_NAMES:
            self._set_spec(name, sub_specs[name].expand(num_workers, *sub_batch))
        root = Composite(shape=self.batch_size, device=self.device)
        for name in ("observation", "state", "done", "action"):
            root.update(self._specs[name])
        out = Composite(shape=self.batch_size, device=self.device)
        for name in ("observation", "state", "done", "reward"):
            out.update(self._specs[name])
        # Entries crossing to and from the workers: the root a step reads, what a step writes.
        self._root_keys: list[NestedKey] = root.keys(True, True)
        self._next_keys: list[NestedKey] = out.keys(True, True)
        rewards = set(self.reward_spec.keys(True, True))
        self._reset_keys: list[NestedKey] = [k for k in self._next_keys if k not in rewards]
        self._root_spec, self._next_spec = root, out

    def _reseed_if_overlapping(self, ranges: Sequence[tuple[int, int] | None]) -> None:
        """Workers built with overlapping seeds (the same factory with ``seed=0``) would replay
        one another: re-seed them in a chain from the lowest seed given."""
        clash = _overlapping(ranges)
        if clash is None:
            return
        start = min(r[0] for r in ranges if r is not None)
        a, b = clash
        _log.info(
            "workers %d and %d of %s were built with overlapping seeds (%s and %s); re-seeding "
            "every worker in a chain from %d",
            a,
            b,
            type(self).__name__,
            ranges[a],
            ranges[b],
            start,
        )
        self.set_seed(start)

    def _worker_masks(self, env_mask: torch.Tensor) -> list[torch.Tensor | None]:
        """Each worker's root ``"_reset"`` mask ``[*sub_B, 1]``, ``None`` where none is selected."""
        per_worker = env_mask.reshape(self.num_workers, -1)
        selected = per_worker.any(-1).tolist()
        return [
            per_worker[w].reshape(*self.sub_batch_size, 1).clone() if selected[w] else None
            for w in range(self.num_workers)
        ]

    def _apply_done_rule(
        self, next_td: TensorDictBase, tensordict: TensorDictBase | None = None
    ) -> None:
        # Each worker's env applied the done rule to its own output (its masks are the slices
        # of ours); their stack follows it already: a second pass would redo the same work.
        pass

    def _split_env_index(self, env_index: int) -> tuple[int, int]:
        per = max(1, self.sub_batch_size.numel())
        return env_index // per, env_index % per


class SerialEnv(_BatchedEnv):
    """``num_workers`` envs stepped one after the other in this process.

    Args:
        num_workers: how many envs.
        create_env_fn: a callable returning an :class:`EnvBase` (or one callable per worker).
        create_env_kwargs: keyword arguments for the callable (or one mapping per worker).
        validate_actions: check actions against the batched action spec (once, here).

    Examples:
        >>> import marlkit
        >>> from marlkit.envs import SerialEnv
        >>> env = SerialEnv(3, marlkit.make, {"name": "navigation", "num_envs": 4})
        >>> env.batch_size
        torch.Size([3, 4])
    """

    def __init__(
        self,
        num_workers: int,
        create_env_fn: EnvFactory | Sequence[EnvFactory],
        create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        validate_actions: bool = True,
    ):
        factories = _as_factories(num_workers, create_env_fn, create_env_kwargs)
        self.envs: list[EnvBase] = []
        try:
            for fn, kw in factories:
                env = fn(**kw)
                if not isinstance(env, EnvBase):
                    if callable(getattr(env, "close", None)):
                        env.close()
                    raise TypeError(f"create_env_fn returned {type(env).__name__}, not an EnvBase")
                env.validate_actions = False  # validated once, by this env
                self.envs.append(env)
            first = self.envs[0]
            super().__init__(num_workers, _specs_of(first), _meta_of(first), validate_actions)
            for i, env in enumerate(self.envs[1:], start=1):
                if _specs_of(env) != _specs_of(first):
                    raise ValueError(
                        f"env {i} has other specs than env 0; a batch needs equal specs"
                    )
        except BaseException:  # nothing left behind: the envs made so far are closed
            with contextlib.suppress(Exception):  # the refusal is the error to see
                _close_all(self.envs)
            raise
        # Each worker's last output (reset or step): what it reports when a partial reset
        # leaves it alone, as a ParallelEnv worker's slice of the output buffer does.
        self._last: list[TensorDictBase | None] = [None] * num_workers
        self._reseed_if_overlapping([env.seed_range for env in self.envs])

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        masks = None if env_mask is None else self._worker_masks(env_mask)
        outs = []
        for w, env in enumerate(self.envs):
            out = env.reset() if masks is None else self._reset_worker(w, tensordict, masks[w])
            out = _select(out, self._reset_keys, w, "reset")
            self._last[w] = out  # as it goes: a later worker that raises leaves these current
            outs.append(out)
        return stack_tensordicts(outs, 0)

    def _reset_worker(
        self, w: int, tensordict: TensorDictBase | None, mask: torch.Tensor | None
    ) -> TensorDictBase:
        """Worker ``w``'s part of a partial reset: reset when selected (with its part of the
        input), else its last output (asked from the env if it has none yet)."""
        last = self._last[w]
        if mask is None and last is not None:
            return last
        if mask is None:
            mask = torch.zeros(*self.sub_batch_size, 1, dtype=torch.bool, device=self.device)
        if tensordict is None:  # only the mask: the worker's env refuses what it cannot guess
            inner = TensorDict(batch_size=self.sub_batch_size, device=self.device)
        else:
            inner = tensordict[w].select(*self._root_keys, strict=False)
        inner.set(RESET, mask)
        return self.envs[w].reset(inner)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        outs = []
        for w, env in enumerate(self.envs):
            sub = tensordict[w].select(*self._root_keys, strict=False)
            out = _select(env.step(sub).get(NEXT), self._next_keys, w, "step")
            self._last[w] = out  # as it goes: a later worker that raises leaves these current
            outs.append(out)
        return stack_tensordicts(outs, 0)

    def _set_seed(self, seed: int) -> int:
        # every worker's seeds must fit, or none is seeded (a refused seed changes nothing);
        # a worker takes as many as at its last seeding (one if it was never seeded)
        widths = [r[1] - r[0] if (r := env.seed_range) is not None else 1 for env in self.envs]
        last = seed + sum(widths) - 1
        if last >= 2**63:
            largest = seed - (last - 2**63 + 1)
            raise ValueError(
                f"seed {seed} is too large for {self.num_workers} workers: they take seeds "
                f"{seed} to {last}, past 2**63 - 1; use a seed of at most {largest}"
            )
        for env in self.envs:
            seed = env.set_seed(seed)
        return seed

    def _render(self, env_index: int) -> Any:
        w, i = self._split_env_index(env_index)
        return self.envs[w].render(i)

    def _close(self) -> None:
        _close_all(self.envs)


def _close_all(envs: Sequence[EnvBase]) -> None:
    """Close every env, even if some raise; the first error is raised after."""
    error: BaseException | None = None
    for env in envs:
        try:
            env.close()
        except BaseException as err:  # raised once the others are closed
            error = error or err
    if error is not None:
        raise error


# ---------------------------------------------------------------------- ParallelEnv


class _EnvServer:
    """What a ParallelEnv worker serves: its env, stepped in the shared buffers."""

    def __init__(self, index: int, fn: EnvFactory, kwargs: dict[str, Any]):
        env = fn(**kwargs)
        if not isinstance(env, EnvBase):
            raise TypeError(f"create_env_fn returned {type(env).__name__}, not an EnvBase")
        env.validate_actions = False  # validated once, by the parent
        self.index = index
        self.env = env
        # The worker's slices of the shared buffers: what a step reads, what step and reset write.
        self._in: BufferLeaves | None = None
        self._out: BufferLeaves | None = None
        self._reset_out: BufferLeaves | None = None
        self._after_reset: BufferLeaves | None = None

    @classmethod
    def setup(
        cls, index: int, fn: EnvFactory, kwargs: dict[str, Any]
    ) -> tuple[_EnvServer, tuple[dict[str, Composite], dict[str, Any]]]:
        server = cls(index, fn, kwargs)
        return server, (_specs_of(server.env), _meta_of(server.env))

    def handle(self, cmd: str, arg: Any) -> Any:
        env = self.env
        if cmd == "buffers":
            shared_in, shared_out, shared_after, next_keys, reset_keys = arg
            mine = shared_in[self.index]
            self._in = BufferLeaves(mine, mine.keys(True, True))
            self._out = BufferLeaves(shared_out[self.index], next_keys)
            self._reset_out = BufferLeaves(shared_out[self.index], reset_keys)
            self._after_reset = BufferLeaves(shared_after[self.index], reset_keys)
            return None
        if cmd == "seed":
            return env.set_seed(arg)
        if cmd == "render":
            return env.render(arg)
        my_in, my_out, my_reset = self._in, self._out, self._reset_out
        if my_in is None or my_out is None or my_reset is None:
            raise RuntimeError(f"{cmd!r} before the shared buffers arrived")
        # The env reads its input straight from the shared buffer (no copies), as SerialEnv's
        # envs read views of the caller's TensorDict; the parent writes it again only with the
        # next command.
        if cmd in ("step", "step_reset"):  # arg: the keys the parent's input lacked (stale)
            sub = my_in.view()
            if arg:
                sub = sub.exclude(*arg)
            stepped = env.step(sub)
            next_td = stepped.get(NEXT)
            self._write(my_out, next_td, "step")
            if cmd == "step":
                return None
            return self._reset_done(stepped, next_td.get(DONE))

        if cmd == "reset":  # arg: None (reset every env), or (mask, the keys the input lacked)
            given: TensorDictBase | None = None
            if arg is not None:
                mask, missing = arg
                given = my_in.view()
                if missing:
                    given = given.exclude(*missing)
                given.set(RESET, mask)
            self._write(my_reset, env.reset(given), "reset")
            return None
        raise ValueError(f"unknown command {cmd!r}")

    def _reset_done(self, stepped: TensorDictBase, done: torch.Tensor) -> bool | None:
        """Reset the envs ``done`` marks, as :meth:`EnvBase.step_and_maybe_reset` does, into the
        auto-reset buffer; ``True`` when any was (``None``, the cheap answer, when none)."""
        if not bool(done.any()):
            return None
        if self._after_reset is None:  # pragma: no cover - set with the other buffers
            raise RuntimeError("step_reset before the shared buffers arrived")
        root = self.env._step_mdp(stepped)
        root.set(RESET, done.clone())
        self._write(self._after_reset, self.env.reset(root), "the reset after a step")
        return True

    def _write(self, leaves: BufferLeaves, out: TensorDictBase, what: str) -> None:
        missing = leaves.write(out)
        if missing:
            raise _missing_error(missing, self.index, what)

    def close(self) -> None:
        self.env.close()


class ParallelEnv(_BatchedEnv):
    """``num_workers`` envs, each in its own process, exchanging data through shared memory.

    Args:
        num_workers: how many worker processes (one env each).
        create_env_fn: a callable returning an :class:`EnvBase` (or one per worker). It is
            serialised with cloudpickle: ``marlkit.make``, a lambda, a closure or a function
            defined in ``__main__`` or a notebook cell all work.
        create_env_kwargs: keyword arguments for the callable, or one mapping per worker.
        start_method: ``"spawn"`` (default, safe with threads), ``"forkserver"`` or ``"fork"``.
        timeout: seconds a worker may take to answer a command before it is reported hung
            (``WorkerError`` naming it, its pid and how long it was silent; the env is closed).
            Starting (the process, its imports, the env) may take up to ``START_TIMEOUT``
            (60 s) when that is longer.
        torch_threads: torch threads inside each worker.
        worker_cpus: where the workers run: ``None`` (default: the OS places them), ``"auto"``
            (worker ``i`` pinned to the ``i``-th CPU this process may use), or one CPU index,
            or set of them, per worker. Pinning pays in lock-step on a machine the run has to
            itself, with no more workers than cores (see ``docs/batched.md``); two runs that
            both pin ``"auto"`` on one machine share the same first CPUs.
        busy_wait: seconds a worker polls for its next command before it sleeps, while its
            commands come in quick succession (lock-step stepping); ``0`` makes every worker
            sleep at once. Off when the workers and this process's torch threads (at
            construction) outnumber the CPUs by more than one.
        validate_actions: check actions against the batched action spec (once, in the parent).

    Raises:
        TypeError: a factory cloudpickle cannot serialise (the message names it).
        WorkerError: a worker failed to start (its factory could not be loaded, raised, or did
            not return an env): the worker's exception is the cause, its traceback in the message.
    """

    def __init__(
        self,
        num_workers: int,
        create_env_fn: EnvFactory | Sequence[EnvFactory],
        create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        *,
        start_method: str = "spawn",
        timeout: float = 120.0,
        torch_threads: int = 1,
        worker_cpus: WorkerCpus = None,
        busy_wait: float = 0.002,
        validate_actions: bool = True,
    ):
        factories = [
            _serialise(i, fn, kw)
            for i, (fn, kw) in enumerate(
                _as_factories(num_workers, create_env_fn, create_env_kwargs)
            )
        ]
        self._closed = False  # close() may run before EnvBase.__init__
        self._pool = WorkerPool(
            "the ParallelEnv",
            factories,
            start_method=start_method,
            timeout=timeout,
            torch_threads=torch_threads,
            worker_cpus=worker_cpus,
            busy_wait=busy_wait,
        )
        answers = self._pool.hello
        specs, meta = answers[0]
        for i, (other, _) in enumerate(answers[1:], start=1):
            if other != specs:
                self._pool.shutdown()
                raise ValueError(f"worker {i}'s env has other specs than worker 0's")
        super().__init__(num_workers, specs, meta, validate_actions)
        self._shared_in = self._root_spec.zero().share_memory_()
        self._shared_out = self._next_spec.zero().share_memory_()
        # What the workers' own resets return inside step_and_maybe_reset (reset keys only).
        self._shared_after = self._next_spec.zero().share_memory_()
        self._inputs = BufferLeaves(self._shared_in, self._root_keys)
        self._outputs = BufferLeaves(self._shared_out, self._next_keys)
        self._reset_outputs = BufferLeaves(self._shared_out, self._reset_keys)
        self._after_reset = BufferLeaves(self._shared_after, self._reset_keys)
        buffers = (
            self._shared_in,
            self._shared_out,
            self._shared_after,
            self._next_keys,
            self._reset_keys,
        )
        self._call({i: ("buffers", buffers) for i in range(num_workers)}, "start")
        # "step", or "step_reset" while step_and_maybe_reset runs; the workers that reset.
        self._step_command = "step"
        self._reset_by_step: list[int] = []
        # Workers whose slice of the output buffer holds an output (reported as they are when
        # a partial reset leaves them alone); the others are asked, with an all-false mask.
        self._has_output = [False] * num_workers
        self._reseed_if_overlapping([m["seed_range"] for _, m in answers])

    def _call(self, calls: Mapping[int, tuple[str, Any]], what: str) -> dict[int, Any]:
        try:
            return self._pool.call(calls, what)
        except WorkerError:
            if self._pool.closed:  # a worker died or hung: the env is closed with its pool
                self._closed = True
            raise

    # -------------------------------------------------------------- hooks
    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        # The keys the input lacks keep stale values in the buffer: the workers leave them out.
        missing = self._root_keys if tensordict is None else self._inputs.write(tensordict)
        calls: dict[int, tuple[str, Any]]
        if env_mask is None:
            calls = {w: ("reset", None) for w in range(self.num_workers)}
        else:  # only the workers with a selected env; the others' outputs are current already
            calls = {}
            for w, mask in enumerate(self._worker_masks(env_mask)):
                if mask is None and not self._has_output[w]:
                    mask = torch.zeros(
                        *self.sub_batch_size, 1, dtype=torch.bool, device=self.device
                    )
                if mask is not None:
                    calls[w] = ("reset", (mask, tuple(missing)))
        self._call(calls, "reset")
        for w in calls:
            self._has_output[w] = True
        return self._reset_outputs.read()

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        # The workers leave out what the input lacks (rare: stale in the buffer).
        missing = tuple(self._inputs.write(tensordict)) or None
        cmd = self._step_command
        calls = {w: (cmd, missing) for w in range(self.num_workers)}
        try:
            answers = self._call(calls, "step" if cmd == "step" else "step (and auto-reset)")
        except WorkerError as err:
            # The workers that answered stepped (and reset, when they say so): their buffers
            # hold their current state once the resets are copied in. A failed worker's state
            # is unknown, so a later partial reset that leaves it alone asks it.
            done = [w for w, reset in err.answers.items() if reset]
            self._keep_reset_outputs(done)
            self._has_output = [w in err.answers for w in range(self.num_workers)]
            raise
        self._reset_by_step = [w for w, reset in answers.items() if reset]
        self._has_output = [True] * self.num_workers
        return self._outputs.read()

    def _keep_reset_outputs(self, workers: list[int]) -> None:
        """Copy what ``workers`` returned from their auto-resets into the output buffer, which
        holds each worker's current state (what a partial reset that leaves it alone reports)."""
        if len(workers) == self.num_workers:
            torch._foreach_copy_(self._reset_outputs.leaves, self._after_reset.leaves)
        elif workers:
            torch._foreach_copy_(
                [leaf[w] for leaf in self._reset_outputs.leaves for w in workers],
                [leaf[w] for leaf in self._after_reset.leaves for w in workers],
            )

    def step_and_maybe_reset(
        self, tensordict: TensorDictBase
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, then reset the envs that are done, in one command per worker: each worker
        resets its own done envs right after its step (:meth:`EnvBase.step_and_maybe_reset`
        makes a second round trip to the workers for that).

        Returns:
            ``(transition, next_root)``, as :meth:`EnvBase.step_and_maybe_reset`.
        """
        self._step_command = "step_reset"
        try:
            tensordict = self.step(tensordict)
        finally:
            self._step_command = "step"
        root = self._step_mdp(tensordict)
        if self._reset_by_step:
            # The output buffer then holds every worker's current state: the step's output
            # where none reset (as the root has it), the reset output where one did.
            self._keep_reset_outputs(self._reset_by_step)
            root.update(self._reset_outputs.read())
        return tensordict, root

    def _set_seed(self, seed: int) -> int:
        for w in range(self.num_workers):  # a chain: each worker starts where the last stopped
            seed = self._call({w: ("seed", seed)}, "set_seed")[w]
        return seed

    def _render(self, env_index: int) -> Any:
        w, i = self._split_env_index(env_index)
        return self._call({w: ("render", i)}, "render")[w]

    def _close(self) -> None:
        self._pool.shutdown()

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown()


def _serialise(worker: int, fn: EnvFactory, kwargs: dict[str, Any]) -> bytes:
    return serialise_setup(
        _EnvServer.setup,
        (fn, kwargs),
        f"the factory of worker {worker} ({fn!r} with kwargs {sorted(kwargs)})",
    )
