"""``RayCollector``: the collector interface on Ray actors, one remote :class:`Collector` per env
factory, on one machine or a cluster.

Ray is an optional dependency (``pip install "marlkit[ray]"``), imported only when a
``RayCollector`` is built. Every actor asked something has its own deadline, ``timeout`` seconds
after it was asked; an actor that raises, dies or is silent past its deadline (even while the
others keep answering, with ``sync=False``) is a :class:`~marlkit.envs.batched.WorkerError`
naming the worker, and the collector kills the remaining actors.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import nn

from marlkit._checks import check_int, check_real
from marlkit._utils import import_optional
from marlkit.collectors._base import (
    CollectorBase,
    Policy,
    PostProc,
    check_env_fns,
    check_worker_batches,
    seed_rngs,
    split_random_frames,
    split_workers,
    tag_worker,
)
from marlkit.collectors._single import Collector, _device
from marlkit.collectors._weights import Weights, WeightsLayout, policy_tensors
from marlkit.data._fast import stack_tensordicts
from marlkit.data.exploration import Exploration
from marlkit.envs import EnvBase, WorkerError

__all__ = ["RayCollector"]

EnvFactory = Callable[[], EnvBase]

#: How long :meth:`RayCollector.shutdown` lets the actors close their envs before killing them.
_CLOSE_GRACE_S = 3.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _import_ray() -> ModuleType:
    return import_optional("ray", extra="ray", purpose="RayCollector")


class _RemoteCollector:
    """What each Ray actor holds: the env its factory builds, then a :class:`Collector` on it.

    Built in two steps so that the parent can check the env batches (and refuse them with a
    ``ValueError``) before any collector exists.
    """

    def __init__(self, factory: EnvFactory):
        seed_rngs(None)  # a process Ray may have forked: fresh generators for the policy
        self._env = Collector._resolve_env(factory)
        self._collector: Collector | None = None

    def env_batch(self) -> tuple[int, ...]:
        return tuple(self._env.batch_size)

    def hello(self) -> tuple[tuple[int, ...], int, str, str]:
        """The env batch, and where this actor runs: its pid, node id and node address."""
        ray = _import_ray()
        node = ray.get_runtime_context().get_node_id()
        return self.env_batch(), os.getpid(), node, ray.util.get_node_ip_address()

    def start(self, policy: Policy | None, kwargs: dict[str, Any]) -> None:
        self._collector = Collector(self._env, policy, **kwargs)

    @property
    def collector(self) -> Collector:
        if self._collector is None:
            raise RuntimeError("the remote collector was not started")
        return self._collector

    def next(self) -> TensorDictBase:
        return self.collector.next()

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.collector.update_policy_weights_(weights)  # checked again, copied in place

    def reset(self) -> None:
        self.collector.reset()

    def set_seed(self, seed: int) -> int:
        return self.collector.set_seed(seed)

    def state_dict(self) -> dict[str, Any]:
        return self.collector.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.collector.load_state_dict(state)

    def close(self) -> None:
        if self._collector is not None:
            self._collector.shutdown()
        self._env.close()


class RayCollector(CollectorBase):
    """Batches from ``len(create_env_fns)`` remote collectors, one Ray actor each.

    Actor ``w`` builds its env with ``create_env_fns[w]()`` and runs a single-process
    :class:`Collector` over it with a copy of ``policy``; factories and policy are sent with
    cloudpickle (lambdas and closures are fine; marlkit must be importable on every node).
    Every batch of worker ``w`` goes through :func:`tag_worker`: its trajectory ids are unique
    across workers and ``("collector", "worker")`` says which worker collected each step.

    * ``sync=True``: each iteration asks every actor for ``frames_per_batch / W`` frames and
      stacks their batches ``[*B, T]`` along a new leading dim: ``[W, *B, T]`` (every worker's env
      batch must be the same).
    * ``sync=False``: every actor collects ``frames_per_batch`` frames at its own pace; the
      iterator yields each batch ``[*B, T]`` as it comes and at once asks that actor for its
      next one (so each actor has one batch in flight).

    ``split_trajs`` and ``postproc`` are applied here, to the stacked (or single) batch.

    If Ray is not initialised, the collector calls ``ray.init(**ray_init_kwargs)`` and
    :meth:`shutdown` stops Ray again; a running Ray (``ray.init(address=...)`` to a cluster, say)
    is used as it is and left running.

    Args:
        create_env_fns: one env factory per actor.
        policy: the policy (a ``TensorDictModule``, say, or any cloudpickle-able callable);
            ``None`` samples the action spec.
        frames_per_batch: frames per yielded batch (with ``sync=True`` a multiple of ``W``, and
            each share a multiple of the env batch; with ``sync=False`` a multiple of the env
            batch).
        total_frames: stop after this many frames (rounded up to whole batches); ``-1``: never.
        sync: stack one batch of every actor per iteration (True) or yield them as they come.
        init_random_frames: frames collected with random actions before the policy is used,
            over all actors: each takes ``init_random_frames / num_workers`` of them, rounded
            up, as in :class:`MultiSyncCollector`.
        max_frames_per_traj: truncate trajectories at this many steps (see :class:`Collector`).
        reset_at_each_iter: every actor starts every batch from a reset.
        split_trajs: yield ``[n_trajectories, T_max]`` batches (:func:`split_trajectories`).
        device: where each actor's policy runs (see :class:`Collector`).
        storing_device: where each actor stores its batches (see :class:`Collector`).
        exploration: the exploration mode of the policies (``"random"`` or
            ``"deterministic"``).
        postproc: applied to every batch before it is yielded.
        progress: show a progress bar (frames, frames/s) on stderr.
        replay_buffer: write every batch into it, in this process (see :class:`Collector`).
        num_cpus_per_actor: the CPUs Ray reserves for each actor (fractions allowed).
        ray_init_kwargs: the arguments of ``ray.init`` when the collector starts Ray itself.
        timeout: seconds an actor may be silent once asked (for a batch, a call, its start)
            before it is reported hung; each actor's clock runs from when it was asked, so with
            ``sync=False`` a hung actor is reported while the others keep answering.

    Raises:
        ImportError: Ray is not installed (``pip install "marlkit[ray]"``).
        ValueError: no factory, frames that do not split over the workers or the env batch,
            workers with different env batches (``sync=True``), a bad count, number, mode or
            device.
        TypeError: factories that are not a sequence of callables, a policy that is not
            callable, a number of the wrong type.
        WorkerError: an actor failed to start (its factory raised, say) or did not start within
            ``timeout`` (a cluster without the CPUs asked for, say); from iteration, an actor
            that raised, died or hung (named with its pid, its node and how long it was silent).

    Examples:
        >>> import ray
        >>> import marlkit
        >>> from marlkit.collectors import RayCollector
        >>> ray.init(num_cpus=2, include_dashboard=False)  # doctest: +SKIP
        >>> make = lambda: marlkit.make("navigation", num_envs=4, n_agents=2)
        >>> with RayCollector([make, make], None, frames_per_batch=64, total_frames=128) as c:
        ...     [tuple(batch.batch_size) for batch in c]  # doctest: +SKIP
        [(2, 4, 8), (2, 4, 8)]
    """

    def __init__(
        self,
        create_env_fns: Sequence[EnvFactory],
        policy: Policy | None,
        frames_per_batch: int,
        total_frames: int = -1,
        *,
        sync: bool = True,
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
        num_cpus_per_actor: float = 1,
        ray_init_kwargs: Mapping[str, Any] | None = None,
        timeout: float = 120.0,
    ):
        # First: shutdown() (and __del__) must work whatever fails below.
        self._actors: list[Any] = []
        self._started = False  # whether every actor built its env (and can be asked to close it)
        self._owns_ray = False
        #: Async mode, per worker: the batch requested, the loads submitted before it, when.
        self._inflight: dict[int, tuple[Any, list[Any], float]] = {}
        #: Per worker, where its actor runs: ``(pid, node id, node address)``.
        self._where: list[tuple[int, str, str]] = []
        #: Workers reported silent past their deadline: killed at shutdown without a close.
        self._hung: set[int] = set()
        super().__init__(
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            exploration=exploration,
            split_trajs=split_trajs,
            postproc=postproc,
            progress=progress,
            replay_buffer=replay_buffer,
        )
        factories = check_env_fns(create_env_fns)
        self.num_workers = len(factories)
        self.sync = bool(sync)
        #: Frames each actor collects per request.
        self.worker_frames = (
            split_workers(self.frames_per_batch, self.num_workers)
            if self.sync
            else self.frames_per_batch
        )
        if policy is not None and not callable(policy):
            raise TypeError(f"policy must be callable or None, got {type(policy).__name__}")
        worker_kwargs: dict[str, Any] = {
            "frames_per_batch": self.worker_frames,
            "init_random_frames": split_random_frames(init_random_frames, self.num_workers),
            "max_frames_per_traj": check_int(
                "max_frames_per_traj", max_frames_per_traj, low=1, allow_none=True
            ),
            "reset_at_each_iter": bool(reset_at_each_iter),
            "device": _device(device, "device"),
            "storing_device": _device(storing_device, "storing_device"),
            "exploration": exploration,
        }
        self.num_cpus_per_actor = check_real("num_cpus_per_actor", num_cpus_per_actor, strict=False)
        self.timeout = check_real("timeout", timeout)
        if ray_init_kwargs is not None and not isinstance(ray_init_kwargs, Mapping):
            raise TypeError(
                f"ray_init_kwargs must be a mapping or None, got {type(ray_init_kwargs).__name__}"
            )
        self._policy = policy
        #: What update_policy_weights_ checks weights against (None: not an nn.Module).
        self._weights_layout = WeightsLayout(policy) if isinstance(policy, nn.Module) else None
        #: Per worker: the weight loads not yet confirmed (async mode does not wait for them).
        self._acks: list[list[Any]] = [[] for _ in factories]
        self._ray = _import_ray()
        if not self._ray.is_initialized():
            self._ray.init(**dict(ray_init_kwargs or {}))
            self._owns_ray = True
        try:
            self._start(factories, policy, worker_kwargs)
        except BaseException:
            self.shutdown()
            raise

    # ------------------------------------------------------------------ start
    def _start(
        self, factories: list[EnvFactory], policy: Policy | None, kwargs: dict[str, Any]
    ) -> None:
        remote = self._ray.remote(_RemoteCollector).options(
            num_cpus=self.num_cpus_per_actor, max_restarts=0
        )
        self._actors = [remote.remote(factory) for factory in factories]
        hello = self._gather(
            {w: actor.hello.remote() for w, actor in enumerate(self._actors)},
            "start (building its env)",
        )
        answers = [hello[w] for w in range(self.num_workers)]
        self._where = [(pid, node, ip) for _, pid, node, ip in answers]
        self._started = True
        check_worker_batches(
            [tuple(batch) for batch, *_ in answers],
            self.frames_per_batch,
            stacked=self.sync,
            hint="sync=False yields each worker's batch on its own",
        )
        policy_ref = self._ray.put(policy)
        self._gather(
            {w: actor.start.remote(policy_ref, kwargs) for w, actor in enumerate(self._actors)},
            "start (building its collector)",
        )

    # ------------------------------------------------------------------ waiting on actors
    @property
    def worker_pids(self) -> list[int]:
        """The actors' process ids, each on its own node (empty before they start and once
        shut down)."""
        return [pid for pid, _, _ in self._where] if self._actors else []

    def _late(self, late: Mapping[int, float], what: str) -> WorkerError:
        """Shut the collector down and return the error naming the workers silent past their
        deadline (``{worker: seconds silent}``), to raise."""
        self._hung.update(late)
        self.shutdown()
        workers = sorted(late)
        who = ", ".join(
            f"{w} (pid {self._where[w][0]} on {self._where[w][2]})" if self._where else str(w)
            for w in workers
        )
        silent = ", ".join(f"{late[w]:.1f} s" for w in workers)
        why = (
            ""
            if self._where
            else f"; an actor that Ray cannot place, for want of num_cpus_per_actor="
            f"{self.num_cpus_per_actor:g} free CPUs, waits too"
        )
        return WorkerError(
            f"worker{'s' if len(workers) > 1 else ''} {who} did not answer {what} within "
            f"{self.timeout:g} s (silent for {silent} since asked{why}); the RayCollector is "
            "shut down",
            worker=workers[0],
        )

    def _fail(self, worker: int, what: str, err: BaseException) -> WorkerError:
        """Shut the collector down and return the error that says why (to raise)."""
        self.shutdown()
        exceptions = self._ray.exceptions
        closed = "the RayCollector is shut down"
        text = _ANSI.sub("", str(err)).strip()
        remote_tb = text if 'File "' in text else None
        if isinstance(err, exceptions.RayTaskError):
            cause = getattr(err, "cause", None)
            summary = f"{type(cause).__name__}: {cause}" if cause is not None else "it raised"
            message = f"worker {worker} failed during {what}: {summary}; {closed}"
        elif isinstance(err, exceptions.RayActorError):
            how = "failed to start" if remote_tb else "died"
            message = f"worker {worker} (its Ray actor) {how} during {what}; {closed}"
            if not remote_tb:
                message += f"\n{text}"
        else:
            message = f"worker {worker} failed during {what}: {text}; {closed}"
        if remote_tb:
            message += f"\n--- traceback in worker {worker} ---\n{remote_tb}"
        error = WorkerError(message, worker=worker, remote_traceback=remote_tb)
        error.__cause__ = err
        return error

    def _get(self, worker: int, ref: Any, what: str) -> Any:
        """The value of a ``ref`` that :func:`ray.wait` found ready."""
        try:
            return self._ray.get(ref, timeout=self.timeout)
        except self._ray.exceptions.GetTimeoutError:
            raise self._late({worker: self.timeout}, what) from None
        except self._ray.exceptions.RayError as err:
            raise self._fail(worker, what, err) from err

    def _gather(
        self, refs: Mapping[int, Any], what: str, asked: Mapping[int, float] | None = None
    ) -> dict[int, Any]:
        """Wait for one answer per worker (``{worker: ref}``), each within ``timeout`` of when
        it was asked (``asked``; default: now); the first failure is raised as soon as it
        comes, whatever the others do."""
        now = time.monotonic()
        since = {w: (asked or {}).get(w, now) for w in refs}
        waiting = {ref: worker for worker, ref in refs.items()}
        answers: dict[int, Any] = {}
        while waiting:
            for ref in self._first_ready(waiting, since, what):
                worker = waiting.pop(ref)
                answers[worker] = self._get(worker, ref, what)
        return answers

    def _first_ready(
        self, waiting: Mapping[Any, int], asked: Mapping[int, float], what: str
    ) -> list[Any]:
        """The refs of ``waiting`` (``{ref: worker}``) with an answer, once one has one.

        Raises:
            WorkerError: a worker silent ``timeout`` seconds after it was asked (``asked``),
                whether or not the others answered.
        """
        while True:
            due = min(asked[w] for w in waiting.values()) + self.timeout
            left = max(0.0, due - time.monotonic())
            ready, _ = self._ray.wait(list(waiting), num_returns=1, timeout=left)
            now = time.monotonic()
            late = [
                r for r, w in waiting.items() if r not in ready and now - asked[w] >= self.timeout
            ]
            if late:  # wait() returns one ready ref: ask again about these
                answered, late = self._ray.wait(late, num_returns=len(late), timeout=0)
                ready = [*ready, *answered]
            if late:
                raise self._late({waiting[r]: now - asked[waiting[r]] for r in late}, what)
            if ready:
                return ready

    def _call(self, method: str, *args: Any) -> dict[int, Any]:
        """Call ``method`` on every actor and wait for all of them."""
        refs = {w: getattr(actor, method).remote(*args) for w, actor in enumerate(self._actors)}
        return self._gather(refs, f"{method}()")

    # ------------------------------------------------------------------ collecting
    def _collect(self) -> TensorDictBase:
        if not self.sync:
            return self._collect_async()
        answers = self._call("next")
        batches = [tag_worker(answers[w], w, self.num_workers) for w in range(self.num_workers)]
        return stack_tensordicts(batches, 0)

    def _request(self, worker: int) -> None:
        prior, self._acks[worker] = self._acks[worker], []
        ref = self._actors[worker].next.remote()
        self._inflight[worker] = (ref, prior, time.monotonic())

    def _collect_async(self) -> TensorDictBase:
        for worker in range(self.num_workers):
            if worker not in self._inflight:
                self._request(worker)
        waiting = {ref: worker for worker, (ref, _, _) in self._inflight.items()}
        asked = {worker: when for worker, (_, _, when) in self._inflight.items()}
        ready = self._first_ready(waiting, asked, "collecting a batch")
        worker = waiting[ready[0]]
        ref, prior, _ = self._inflight.pop(worker)
        batch = self._get(worker, ref, "collecting a batch")
        for load in prior:  # sent before this request, so done: confirm them (raise if failed)
            self._gather({worker: load}, "update_policy_weights_()")
        self._request(worker)
        return tag_worker(batch, worker, self.num_workers)

    def _drain(self) -> None:
        """Async mode: wait for the batches in flight and drop them, so that what follows
        (a reset, a seed, a state) applies to every batch yielded from now on."""
        pending = {w: ref for w, (ref, _, _) in self._inflight.items()}
        asked = {w: when for w, (_, _, when) in self._inflight.items()}
        self._inflight.clear()
        self._gather(pending, "collecting a batch", asked)

    # ------------------------------------------------------------------ control
    def update_policy_weights_(self, weights: Weights | None = None) -> None:
        """Send new policy weights to every actor.

        Without ``weights``, broadcast the user's policy's current parameters and buffers; with
        a ``state_dict`` or a TensorDict of parameters and buffers, broadcast those, once checked
        here, in the driver, against the policy's names, shapes and dtypes (every parameter and
        persistent buffer; a non-persistent buffer left out keeps its value on the actors).
        They are put in Ray's object store once and every actor copies them into its policy's
        own tensors. Every batch requested after this returns uses them; with ``sync=False`` the
        batch each actor has in flight finishes with the old weights (a load that failed is
        raised at that actor's next batch). A policy without weights (``None``, a function, a
        module without parameters or buffers) makes the call without ``weights`` a no-op.

        Raises:
            TypeError: ``weights`` for a policy that is not an ``nn.Module``, or weights that are
                neither a mapping nor a TensorDict of tensors.
            KeyError, ValueError: ``weights`` that do not match the policy's names, or its
                shapes and dtypes (nothing is sent).
            WorkerError: an actor failed to load them (it died, say); with ``sync=True`` at
                once, with ``sync=False`` at that actor's next batch.
        """
        self._check_open()
        policy, layout = self._policy, self._weights_layout
        if not isinstance(policy, nn.Module) or layout is None:
            if weights is not None:
                raise TypeError(
                    f"update_policy_weights_(weights) needs an nn.Module policy, got {policy!r}"
                )
            return
        if weights is None:
            if not layout:  # a module without parameters or buffers
                return
            weights = policy_tensors(policy)
        checked = layout.check(weights)
        ref = self._ray.put({name: value.detach().to("cpu") for name, value in checked.items()})
        refs = {w: actor.load_weights.remote(ref) for w, actor in enumerate(self._actors)}
        if self.sync:
            self._gather(refs, "update_policy_weights_()")
        else:
            for worker, load in refs.items():
                self._acks[worker].append(load)

    def reset(self) -> None:
        """Reset every actor's envs now (async mode: dropping the batches in flight); the next
        batches start from there, with new trajectory ids."""
        self._check_open()
        self._drain()
        self._call("reset")

    def set_seed(self, seed: int) -> int:
        """Seed the actors in turn: actor ``w`` gets the next unused seed actor ``w - 1``
        returned, so that no two envs share a seed. Each actor seeds its env and its process's
        global generators (torch's, NumPy's, ``random``: see :meth:`Collector.set_seed`), so the
        actors' policies draw different noise. Their envs restart at the next batch (async
        mode: the batches in flight are dropped), so the same seed gives the same batches
        (with ``sync=False`` in the same per-worker order; the arrival order may differ).

        Returns:
            The next seed the last actor did not use.
        """
        self._check_open()
        check_int("seed", seed, low=0)
        self._drain()
        for worker, actor in enumerate(self._actors):
            seed = self._gather({worker: actor.set_seed.remote(seed)}, "set_seed()")[worker]
        return seed

    def state_dict(self) -> dict[str, Any]:
        """This collector's frames and batches, and ``"workers"``: each actor's
        :meth:`Collector.state_dict` (with ``sync=False``, after the batch it has in flight)."""
        self._check_open()
        states = self._call("state_dict")
        return {**self._counters(), "workers": [states[w] for w in range(self.num_workers)]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (async mode: dropping the batches in flight);
        every actor restarts its envs from a reset.

        Raises:
            KeyError: a key is missing.
            ValueError: the state is of a different number of workers.
        """
        self._check_open()
        state = dict(state)
        if "workers" not in state:
            raise KeyError(f"the RayCollector state has no 'workers'; keys: {sorted(state)}")
        workers = list(state["workers"])
        if len(workers) != self.num_workers:
            raise ValueError(
                f"the state holds {len(workers)} workers' states, this RayCollector has "
                f"{self.num_workers} workers"
            )
        self._load_counters(state)
        self._drain()
        self._gather(
            {w: a.load_state_dict.remote(workers[w]) for w, a in enumerate(self._actors)},
            "load_state_dict()",
        )

    # ------------------------------------------------------------------ closing
    def _shutdown(self) -> None:
        actors, self._actors = self._actors, []
        self._inflight.clear()
        if actors and self._started:
            # A hung actor would close after what it is stuck in: killed at once; the others
            # may close their envs, briefly. Then this node's actors are resumed: a stopped
            # one (SIGSTOP) acts on neither the close nor the kill until it runs again.
            for actor in [a for w, a in enumerate(actors) if w in self._hung]:
                with contextlib.suppress(Exception):
                    self._ray.kill(actor)
            closing: list[Any] = []
            with contextlib.suppress(Exception):
                closing = [a.close.remote() for w, a in enumerate(actors) if w not in self._hung]
            self._resume_local()
            with contextlib.suppress(Exception):
                if closing:
                    self._ray.wait(closing, num_returns=len(closing), timeout=_CLOSE_GRACE_S)
            for actor in actors:
                with contextlib.suppress(Exception):
                    self._ray.kill(actor)
        if self._owns_ray:
            self._owns_ray = False
            with contextlib.suppress(Exception):
                self._ray.shutdown()

    def _resume_local(self) -> None:
        """SIGCONT the actors on this node: a stopped one (SIGSTOP) acts on no close and no
        ``ray.kill`` until it runs again (a running one ignores it)."""
        sigcont = getattr(signal, "SIGCONT", None)
        with contextlib.suppress(Exception):  # a driver that is no node (Ray Client), say
            here = self._ray.get_runtime_context().get_node_id()
            for pid, node, _ in self._where:
                if sigcont is not None and node == here:
                    with contextlib.suppress(OSError):
                        os.kill(pid, sigcont)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.shutdown()

    def __repr__(self) -> str:
        return (
            f"RayCollector(num_workers={self.num_workers}, sync={self.sync}, "
            f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames}, "
            f"frames={self.frames})"
        )
