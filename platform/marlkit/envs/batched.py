"""``SerialEnv`` and ``ParallelEnv``: many copies of an env as one batch ``[num_workers, *B]``.

``SerialEnv`` steps its copies one after the other in this process; ``ParallelEnv`` runs each copy
in a worker process and exchanges data through shared memory (one buffer for the inputs, one for
the outputs, allocated once from the specs), with a pipe per worker for commands. Both expose the
same API and specs as any env: every spec gains a leading ``num_workers`` dimension.

Partial resets reach only the workers whose envs are selected, each with its own mask. Actions
are validated once, in the parent. A worker that raises sends its traceback back and the parent
raises :class:`WorkerError` naming the worker; a worker that dies (killed, segfault) is detected
while the parent waits, the remaining workers are shut down and the env is closed, so nothing is
left hanging.
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.multiprocessing as mp
from tensordict import TensorDictBase

from marlkit.data.composite import Composite
from marlkit.data.keys import NEXT, RESET, NestedKey
from marlkit.envs.common import EnvBase

__all__ = ["ParallelEnv", "SerialEnv", "WorkerError"]

EnvFactory = Callable[..., EnvBase]


class WorkerError(RuntimeError):
    """A worker of a ParallelEnv raised or died; the message names the worker and the cause."""


def _as_factories(
    num_workers: int,
    create_env_fn: EnvFactory | Sequence[EnvFactory],
    create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None,
) -> list[tuple[EnvFactory, dict[str, Any]]]:
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
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


class _BatchedEnv(EnvBase):
    """What SerialEnv and ParallelEnv share: specs, splitting inputs and stacking outputs."""

    def __init__(self, num_workers: int, sub_specs: dict[str, Composite], meta: dict[str, Any]):
        sub_batch = torch.Size(meta["batch_size"])
        super().__init__(
            batch_size=(num_workers, *sub_batch),
            device=meta["device"],
            validate_actions=True,
        )
        self.num_workers = num_workers
        self.sub_batch_size = sub_batch
        self.group_map = meta["group_map"]
        self.render_modes = tuple(meta["render_modes"])  # type: ignore[misc]
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
        self._reset_keys: list[NestedKey] = [
            k for k in self._next_keys if k not in set(self.reward_spec.keys(True, True))
        ]
        self._root_spec, self._next_spec = root, out

    def _sub_reset_input(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None, w: int
    ) -> TensorDictBase | None:
        """What worker ``w`` resets with: its slice of the input and its own root mask."""
        if env_mask is None:
            return None
        sub = (
            tensordict[w].select(*self._root_keys, strict=False)
            if tensordict is not None
            else self._root_spec.zero()[w]
        )
        sub.set(RESET, env_mask[w].reshape(*self.sub_batch_size, 1).clone())
        return sub

    def _split_env_index(self, env_index: int) -> tuple[int, int]:
        per = max(1, self.sub_batch_size.numel())
        return env_index // per, env_index % per


class SerialEnv(_BatchedEnv):
    """``num_workers`` envs stepped one after the other in this process.

    Args:
        num_workers: how many envs.
        create_env_fn: a callable returning an :class:`EnvBase` (or one callable per worker).
        create_env_kwargs: keyword arguments for the callable (or one mapping per worker).

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
    ):
        factories = _as_factories(num_workers, create_env_fn, create_env_kwargs)
        self.envs = [fn(**kw) for fn, kw in factories]
        for env in self.envs:
            if not isinstance(env, EnvBase):
                raise TypeError(f"create_env_fn returned {type(env).__name__}, not an EnvBase")
            env.validate_actions = False  # validated once, by this env
        first = self.envs[0]
        super().__init__(num_workers, _specs_of(first), _meta_of(first))
        for i, env in enumerate(self.envs[1:], start=1):
            if _specs_of(env) != _specs_of(first):
                raise ValueError(f"env {i} has other specs than env 0; a batch needs equal specs")

    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        outs = [
            env.reset(self._sub_reset_input(tensordict, env_mask, w)).select(
                *self._reset_keys, strict=False
            )
            for w, env in enumerate(self.envs)
        ]
        return torch.stack(outs, 0)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        outs = []
        for w, env in enumerate(self.envs):
            sub = tensordict[w].select(*self._root_keys, strict=False)
            outs.append(env.step(sub).get(NEXT))
        return torch.stack(outs, 0)

    def _set_seed(self, seed: int) -> None:
        for w, env in enumerate(self.envs):
            env.set_seed(seed + w)

    def _render(self, env_index: int) -> Any:
        w, i = self._split_env_index(env_index)
        return self.envs[w].render(i)

    def _close(self) -> None:
        for env in self.envs:
            env.close()


def _specs_of(env: EnvBase) -> dict[str, Composite]:
    return {name: env._specs[name].clone() for name in EnvBase._SPEC_NAMES}


def _meta_of(env: EnvBase) -> dict[str, Any]:
    return {
        "batch_size": tuple(env.batch_size),
        "device": str(env.device),
        "group_map": {g: list(a) for g, a in env.group_map.items()},
        "render_modes": tuple(env.render_modes),
    }


# ---------------------------------------------------------------------- ParallelEnv


def _worker(
    index: int,
    fn: EnvFactory,
    kwargs: dict[str, Any],
    conn: multiprocessing.connection.Connection,
    torch_threads: int,
) -> None:
    """Worker loop: build the env, then answer commands until ``close``."""
    torch.set_num_threads(torch_threads)
    try:
        env = fn(**kwargs)
        if not isinstance(env, EnvBase):
            raise TypeError(f"create_env_fn returned {type(env).__name__}, not an EnvBase")
        env.validate_actions = False
        conn.send(("ok", (_specs_of(env), _meta_of(env))))
        shared_in, shared_out = conn.recv()
        my_in, my_out = shared_in[index], shared_out[index]
    except BaseException as err:  # report anything, the parent decides
        conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
        return
    while True:
        try:
            cmd, arg = conn.recv()
        except EOFError:  # the parent went away
            return
        try:
            if cmd == "step":
                out = env.step(my_in.clone()).get(NEXT)
                my_out.update_(out.select(*arg, strict=False))
                conn.send(("ok", None))
            elif cmd == "reset":
                sub = None
                if arg is not None:
                    sub = my_in.clone()
                    sub.set(RESET, arg)
                out = env.reset(sub)
                keys = [k for k in my_out.keys(True, True) if k in out.keys(True, True)]
                my_out.update_(out.select(*keys))
                conn.send(("ok", keys))
            elif cmd == "seed":
                conn.send(("ok", env.set_seed(arg)))
            elif cmd == "render":
                conn.send(("ok", env.render(arg)))
            elif cmd == "close":
                env.close()
                conn.send(("ok", None))
                return
            else:
                conn.send(("error", f"unknown command {cmd!r}"))
        except BaseException as err:
            conn.send(("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


class ParallelEnv(_BatchedEnv):
    """``num_workers`` envs, each in its own process, exchanging data through shared memory.

    Args:
        num_workers: how many worker processes (one env each).
        create_env_fn: a picklable callable returning an :class:`EnvBase` (e.g. ``marlkit.make``
            or a module-level function; not a lambda with the default ``"spawn"`` start), or one
            per worker.
        create_env_kwargs: keyword arguments for the callable, or one mapping per worker.
        start_method: ``"spawn"`` (default, safe with threads), ``"forkserver"`` or ``"fork"``.
        timeout: seconds to wait for a worker's answer before declaring it stuck.
        torch_threads: torch threads inside each worker.
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
    ):
        factories = _as_factories(num_workers, create_env_fn, create_env_kwargs)
        ctx = mp.get_context(start_method)
        self._timeout = float(timeout)
        self._procs: list[Any] = []
        self._conns: list[multiprocessing.connection.Connection] = []
        self._closed = False  # _shutdown may run before EnvBase.__init__
        try:
            for i, (fn, kw) in enumerate(factories):
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=_worker, args=(i, fn, kw, child, torch_threads), daemon=True
                )
                proc.start()
                child.close()
                self._procs.append(proc)
                self._conns.append(parent)
            answers = [self._receive(i, "start") for i in range(num_workers)]
        except BaseException:
            self._shutdown()
            raise
        specs, meta = answers[0]
        for i, (other, _) in enumerate(answers[1:], start=1):
            if other != specs:
                self._shutdown()
                raise ValueError(f"worker {i}'s env has other specs than worker 0's")
        super().__init__(num_workers, specs, meta)
        self._shared_in = self._root_spec.zero().share_memory_()
        self._shared_out = self._next_spec.zero().share_memory_()
        for i in range(num_workers):
            self._send(i, (self._shared_in, self._shared_out), "start")

    # -------------------------------------------------------------- plumbing
    def _receive(self, i: int, what: str) -> Any:
        conn, proc = self._conns[i], self._procs[i]
        waited = 0.0
        while not conn.poll(0.05):
            waited += 0.05
            if not proc.is_alive():
                code = proc.exitcode
                self._shutdown()
                raise WorkerError(
                    f"worker {i} (pid {proc.pid}) died with exit code {code} during {what}; "
                    "the ParallelEnv is closed"
                )
            if waited > self._timeout:
                self._shutdown()
                raise WorkerError(
                    f"worker {i} (pid {proc.pid}) did not answer {what} within "
                    f"{self._timeout:.0f} s; the ParallelEnv is closed"
                )
        try:
            status, payload = conn.recv()
        except (EOFError, ConnectionError) as err:
            self._shutdown()
            raise WorkerError(f"worker {i} lost its pipe during {what}: {err}") from err
        if status != "ok":
            raise WorkerError(f"worker {i} failed during {what}: {payload}")
        return payload

    def _send(self, i: int, message: tuple[str, Any], what: str) -> None:
        try:
            self._conns[i].send(message)
        except (BrokenPipeError, ConnectionError, OSError) as err:
            proc = self._procs[i]
            proc.join(timeout=1)
            code = proc.exitcode
            self._shutdown()
            raise WorkerError(
                f"worker {i} (pid {proc.pid}) died with exit code {code} before {what}; "
                "the ParallelEnv is closed"
            ) from err

    def _broadcast(self, cmd: str, args: Sequence[Any], what: str) -> list[Any]:
        for i, arg in enumerate(args):
            self._send(i, (cmd, arg), what)
        answers, first_error = [], None
        for i in range(self.num_workers):
            try:
                answers.append(self._receive(i, what))
            except WorkerError as err:
                if self._closed:  # a dead worker: everything is shut down already
                    raise
                first_error = first_error or err  # collect the others' answers first
                answers.append(None)
        if first_error is not None:
            raise first_error
        return answers

    def _shutdown(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):  # a dead worker's pipe
                conn.send(("close", None))
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
        self._closed = True

    # -------------------------------------------------------------- hooks
    def _reset(
        self, tensordict: TensorDictBase | None, env_mask: torch.Tensor | None
    ) -> TensorDictBase:
        if tensordict is not None:
            self._shared_in.update_(tensordict.select(*self._root_keys, strict=False))
        args = [
            None if env_mask is None else env_mask[w].reshape(*self.sub_batch_size, 1).clone()
            for w in range(self.num_workers)
        ]
        self._broadcast("reset", args, "reset")
        return self._shared_out.select(*self._reset_keys).clone()

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._shared_in.update_(tensordict.select(*self._root_keys, strict=False))
        self._broadcast("step", [self._next_keys] * self.num_workers, "step")
        return self._shared_out.clone()

    def _set_seed(self, seed: int) -> None:
        self._broadcast("seed", [seed + w for w in range(self.num_workers)], "set_seed")

    def _render(self, env_index: int) -> Any:
        w, i = self._split_env_index(env_index)
        self._send(w, ("render", i), "render")
        return self._receive(w, "render")

    def _close(self) -> None:
        self._shutdown()

    def __del__(self) -> None:
        if getattr(self, "_procs", None):
            self._shutdown()
