"""``MultiSyncCollector`` and ``MultiAsyncCollector``: one :class:`Collector` per worker process.

How data and weights travel:

* Each worker builds its env from its factory (cloudpickled, so lambdas and notebook functions
  work) and runs a single-process :class:`Collector` on it.
* Batches cross through shared memory: a worker writes each batch into a shared TensorDict it
  sent the parent once (and sends a new one only when the batch's layout changes, e.g. when
  ``init_random_frames`` ends and the policy's outputs appear); the pipes carry small messages.
* Policy weights live in shared memory. :meth:`update_policy_weights_` writes them there and
  bumps a version counter; each worker loads them into its policy when it starts a batch and
  the version has changed. The write is guarded like a seqlock (odd version: being written), so
  a worker never loads half-written weights.
* Random numbers: each worker seeds its torch, NumPy and ``random`` generators from fresh OS
  entropy when it starts (forked workers would otherwise share their parent's), and from its
  own seed of the chain at :meth:`~_MultiCollector.set_seed`.

Faults: a worker that raises, dies or hangs makes the parent raise :class:`WorkerError` naming
it, and every worker is shut down (see :mod:`marlkit.envs._workers`); a Ctrl-C shuts them down
too, and workers exit by themselves when the parent dies. A worker hangs when it is silent
``timeout`` seconds after it was asked for its batch, counted for each worker on its own: the
asynchronous collector reports it while the other workers keep answering.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import cloudpickle
import torch
from tensordict import TensorDictBase
from torch import nn

from marlkit._checks import check_int
from marlkit.collectors._base import (
    CollectorBase,
    Policy,
    PostProc,
    check_env_fns,
    check_worker_batches,
    seed_rngs,
    split_random_frames,
    split_workers,
)
from marlkit.collectors._base import tag_worker as _tag_worker
from marlkit.collectors._single import Collector, _device
from marlkit.collectors._weights import Weights, WeightsLayout, load_weights_, policy_tensors
from marlkit.data._fast import stack_tensordicts
from marlkit.data.exploration import Exploration
from marlkit.envs import EnvBase
from marlkit.envs._workers import (
    WorkerCpus,
    WorkerError,
    WorkerPool,
    serialise,
    serialise_setup,
)

__all__ = ["MultiAsyncCollector", "MultiSyncCollector"]

EnvFactory = Callable[[], EnvBase]
_Layout = dict[Any, tuple[torch.Size, torch.dtype]]


def _layout(td: TensorDictBase) -> _Layout:
    return {k: (v.shape, v.dtype) for k, v in td.items(True, True)}


class _SharedWeights:
    """The policy's parameters and buffers in shared memory, by ``state_dict`` name, with a
    version counter (odd while being written)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]):
        self.tensors = {
            name: tensor.detach().to("cpu").clone().share_memory_()
            for name, tensor in tensors.items()
        }
        self.version = torch.zeros(1, dtype=torch.int64).share_memory_()

    def write(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy ``weights`` in (checked by :meth:`WeightsLayout.check`: the names are these, or
        all of them but non-persistent buffers, which keep their values)."""
        self.version += 1
        try:
            with torch.no_grad():
                for name, value in weights.items():
                    self.tensors[name].copy_(value)
        finally:
            self.version += 1

    def read_into(self, policy: nn.Module, seen: int, tries: int = 100) -> int:
        """Load the weights into ``policy`` if their version is newer than ``seen``; returns
        the version loaded (``seen`` when there was nothing new, or no consistent read)."""
        for _ in range(tries):
            version = int(self.version)
            if version == seen:
                return seen
            if version % 2:  # being written right now
                continue
            snapshot = {name: tensor.clone() for name, tensor in self.tensors.items()}
            if int(self.version) == version:
                load_weights_(policy, snapshot)
                return version
        return seen


class _CollectorServer:
    """What a collector worker serves: a single-process Collector writing into shared memory."""

    def __init__(self, index: int, num_workers: int, env_fn: EnvFactory):
        self.index = index
        self.num_workers = num_workers
        # A forked worker starts with its parent's generators, the same in every worker: draw
        # the policy's noise from fresh ones (set_seed makes them reproducible).
        seed_rngs(None)
        env = env_fn()
        if not isinstance(env, EnvBase):
            raise TypeError(f"the env factory returned {type(env).__name__}, not an EnvBase")
        self.env = env
        self.collector: Collector | None = None
        self.weights: _SharedWeights | None = None
        self.version = 0
        self.buffer: TensorDictBase | None = None
        self.layout: _Layout = {}

    @classmethod
    def setup(
        cls, index: int, num_workers: int, env_fn: EnvFactory
    ) -> tuple[_CollectorServer, tuple[tuple[int, ...], str]]:
        server = cls(index, num_workers, env_fn)
        return server, (tuple(server.env.batch_size), str(server.env.device))

    def _start(self, arg: tuple[Any, ...]) -> None:
        policy_blob, weights, kwargs = arg
        policy = cloudpickle.loads(policy_blob)
        self.weights = weights
        self.collector = Collector(self.env, policy, total_frames=-1, **kwargs)
        self._sync_weights()

    def _sync_weights(self) -> None:
        policy = self.collector.policy if self.collector is not None else None
        if self.weights is not None and isinstance(policy, nn.Module):
            self.version = self.weights.read_into(policy, self.version)

    def _collect(self) -> TensorDictBase | None:
        """One batch into the shared buffer; returns the buffer when it is a new one."""
        collector = self._collector()
        self._sync_weights()
        batch = _tag_worker(collector.next(), self.index, self.num_workers)
        layout = _layout(batch)
        if self.buffer is not None and layout == self.layout:
            self.buffer.update_(batch)
            return None
        self.buffer, self.layout = batch.share_memory_(), layout
        return self.buffer

    def _collector(self) -> Collector:
        if self.collector is None:
            raise RuntimeError("a command before the collector was started")
        return self.collector

    def handle(self, cmd: str, arg: Any) -> Any:
        if cmd == "start":
            return self._start(arg)
        if cmd == "collect":
            return self._collect()
        if cmd == "reset":
            return self._collector().reset()
        if cmd == "seed":
            return self._collector().set_seed(arg)
        if cmd == "state_dict":
            return self._collector().state_dict()
        if cmd == "load_state_dict":
            return self._collector().load_state_dict(arg)
        raise ValueError(f"unknown command {cmd!r}")

    def close(self) -> None:
        if self.collector is not None:
            self.collector.shutdown()
        self.env.close()


class _MultiCollector(CollectorBase):
    """What the sync and async collectors share: the workers, weights, and control commands."""

    _sync: bool = True

    def __init__(
        self,
        create_env_fns: Sequence[EnvFactory],
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
        start_method: str = "spawn",
        timeout: float = 120.0,
        torch_threads: int = 1,
        worker_cpus: WorkerCpus = None,
        busy_wait: float = 0.002,
    ):
        self._pool: WorkerPool | None = None
        super().__init__(
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            exploration=exploration,
            split_trajs=split_trajs,
            postproc=postproc,
            progress=progress,
            replay_buffer=replay_buffer,
        )
        fns = check_env_fns(create_env_fns)
        if policy is not None and not callable(policy):
            raise TypeError(f"policy must be callable or None, got {type(policy).__name__}")
        self.num_workers = len(fns)
        per_worker = (
            split_workers(self.frames_per_batch, self.num_workers)
            if self._sync
            else self.frames_per_batch
        )
        self.storing_device = _device(storing_device, "storing_device") or torch.device("cpu")
        worker_device = _device(device, "device")
        kwargs = {
            "frames_per_batch": per_worker,
            "init_random_frames": split_random_frames(init_random_frames, self.num_workers),
            "max_frames_per_traj": check_int(
                "max_frames_per_traj", max_frames_per_traj, low=1, allow_none=True
            ),
            "reset_at_each_iter": bool(reset_at_each_iter),
            "device": worker_device,
            "storing_device": "cpu",  # batches cross through (CPU) shared memory
            "exploration": exploration,
        }
        self._source_policy = policy
        self._module = policy if isinstance(policy, nn.Module) else None
        #: What update_policy_weights_ checks weights against (None: not an nn.Module).
        self._weights_layout = WeightsLayout(self._module) if self._module is not None else None
        self._weights = (
            _SharedWeights(policy_tensors(self._module))
            if self._module is not None and self._weights_layout
            else None
        )
        payloads = [
            serialise_setup(
                _CollectorServer.setup, (self.num_workers, fn), f"the env factory {fn!r}"
            )
            for fn in fns
        ]
        # The policy travels cloudpickled (a lambda works); its shared weights through torch's
        # pickler (shared memory), with the start command.
        policy_blob = serialise(policy, f"the policy {policy!r}")
        name = f"the {type(self).__name__}"
        self._pool = WorkerPool(
            name,
            payloads,
            start_method=start_method,
            timeout=timeout,
            torch_threads=torch_threads,
            worker_cpus=worker_cpus,
            busy_wait=busy_wait,
        )
        try:
            check_worker_batches(
                [tuple(b) for b, _ in self._pool.hello],
                self.frames_per_batch,
                stacked=self._sync,
                hint="MultiAsyncCollector yields each worker's batch on its own",
            )
            start = ("start", (policy_blob, self._weights, kwargs))
            self._pool.call({w: start for w in range(self.num_workers)}, "start")
        except BaseException:
            self._pool.shutdown()
            raise
        self._buffers: list[TensorDictBase | None] = [None] * self.num_workers
        #: Workers collecting a batch right now (async), and batches received but not yielded.
        self._busy: list[int] = []
        self._ready: list[tuple[int, TensorDictBase]] = []

    # ------------------------------------------------------------------ construction checks
    # ------------------------------------------------------------------ plumbing
    @property
    def pool(self) -> WorkerPool:
        pool = self._pool
        if pool is None or pool.closed:
            raise RuntimeError(f"{type(self).__name__} is shut down; create a new one")
        return pool

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids (empty once shut down)."""
        return [] if self._pool is None else self._pool.pids

    def _guard(self, work: Callable[[], Any]) -> Any:
        """Run ``work``; a worker fault or a Ctrl-C shuts every worker down, then propagates."""
        try:
            return work()
        except (WorkerError, KeyboardInterrupt):
            self.shutdown()
            raise

    def _take(self, w: int, answer: TensorDictBase | None) -> TensorDictBase:
        """Worker ``w``'s batch, from the buffer it shares (a new one when ``answer`` is)."""
        if answer is not None:
            self._buffers[w] = answer
        buffer = self._buffers[w]
        if buffer is None:
            raise RuntimeError(f"worker {w} answered a batch before sharing its buffer")
        return buffer

    def _finish(self, batch: TensorDictBase) -> TensorDictBase:
        if batch.device != self.storing_device:
            batch = batch.to(self.storing_device)
        return batch

    def _drain(self, keep: bool) -> None:
        """Wait for the batches in flight; keep them to yield next, or drop them."""
        for w in self._busy:
            batch = self._take(w, self.pool.receive(w, "collect"))
            if keep:
                self._ready.append((w, batch.clone()))
        self._busy = []
        if not keep:
            self._ready = []

    def _control(self, cmd: str, arg: Any = None, *, keep: bool = False) -> dict[int, Any]:
        """Send every worker ``cmd`` (after the batches in flight)."""
        self._check_open()

        def run() -> dict[int, Any]:
            self._drain(keep)
            return self.pool.call({w: (cmd, arg) for w in range(self.num_workers)}, cmd)

        result: dict[int, Any] = self._guard(run)
        return result

    # ------------------------------------------------------------------ control
    def update_policy_weights_(self, weights: Weights | None = None) -> None:
        """Publish new policy weights to every worker.

        Without ``weights``, the user's policy's current parameters and buffers; with them, a
        ``state_dict`` or a TensorDict of the policy's parameters and buffers, checked here
        against the policy's names, shapes and dtypes first (every parameter and persistent
        buffer; a non-persistent buffer left out keeps its value). Every batch a worker starts
        after this returns uses them (a synchronous collector's next batch; an asynchronous
        one's batches in flight finish with the weights they started with). Each worker copies
        them into its policy's own tensors. A policy without weights (``None``, a function, a
        module without parameters or buffers) makes the call without ``weights`` a no-op.

        Raises:
            TypeError: ``weights`` for a policy that is not an ``nn.Module``, or weights that are
                neither a mapping nor a TensorDict of tensors.
            KeyError, ValueError: ``weights`` that do not match the policy's names, or its
                shapes and dtypes (nothing is published).
        """
        self._check_open()
        module, layout = self._module, self._weights_layout
        if module is None or layout is None:
            if weights is not None:
                raise TypeError(
                    "update_policy_weights_(weights) needs an nn.Module policy, got "
                    f"{self._source_policy!r}"
                )
            return
        if weights is None:
            if self._weights is None:  # a module without parameters or buffers
                return
            weights = policy_tensors(module)
        checked = layout.check(weights)
        if self._weights is not None:
            self._weights.write(checked)

    def reset(self) -> None:
        """Reset every worker's envs now; batches in flight are dropped."""
        self._control("reset")

    def set_seed(self, seed: int) -> int:
        """Seed the workers in a chain (worker ``w`` starts where worker ``w - 1`` stopped) and
        restart their envs at the next batch; batches in flight are dropped. Each worker seeds
        its env and its process's global generators (torch's, NumPy's, ``random``: see
        :meth:`Collector.set_seed`) from its own seed, so the workers draw different noise and
        the same seed gives the same batches. Returns the next unused seed."""
        self._check_open()
        check_int("seed", seed, low=0)

        def run() -> int:
            self._drain(keep=False)
            following = seed
            for w in range(self.num_workers):
                following = self.pool.call({w: ("seed", following)}, "set_seed")[w]
            return following

        result: int = self._guard(run)
        return result

    def state_dict(self) -> dict[str, Any]:
        """Frames and batches so far, and every worker's collector state (see
        :meth:`Collector.state_dict`); batches in flight are received first and yielded next."""
        workers = self._control("state_dict", keep=True)
        return {**self._counters(), "workers": [workers[w] for w in range(self.num_workers)]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; every worker restarts from a reset."""
        self._check_open()
        state = dict(state)
        workers = state.get("workers")
        if not isinstance(workers, list) or len(workers) != self.num_workers:
            raise ValueError(
                f"the state holds {len(workers) if isinstance(workers, list) else 'no'} worker "
                f"states; this collector has {self.num_workers} workers"
            )
        counters = self._checked_counters(state)  # set once the workers took their states
        for w, worker in enumerate(workers):  # checked here: a worker's error shuts all down
            if not isinstance(worker, Mapping) or "traj_counter" not in worker:
                raise ValueError(
                    f"worker state {w} is not a collector state (a mapping with "
                    f"'traj_counter', as state_dict() writes), got {worker!r:.80}; nothing loaded"
                )

        def run() -> None:
            self._drain(keep=False)
            self.pool.call(
                {w: ("load_state_dict", workers[w]) for w in range(self.num_workers)},
                "load_state_dict",
            )

        self._guard(run)
        self.frames, self.batches = counters

    def _shutdown(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown()
        self._busy, self._ready = [], []
        self._buffers = [None] * getattr(self, "num_workers", 0)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            if getattr(self, "_pool", None) is not None:
                self._closed = True
                self._shutdown()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_workers={self.num_workers}, "
            f"frames_per_batch={self.frames_per_batch}, total_frames={self.total_frames}, "
            f"frames={self.frames})"
        )


class MultiSyncCollector(_MultiCollector):
    """Batches gathered from one :class:`Collector` per worker process, in step.

    Each iteration asks every worker for ``frames_per_batch / num_workers`` frames and yields
    their batches stacked: ``[num_workers, *B, T]``, with ``("collector", "traj_ids")`` unique
    across workers (``id * num_workers + worker``) and ``("collector", "worker")``. Workers wait
    between iterations, so every batch after :meth:`update_policy_weights_` uses the new weights.

    Args:
        create_env_fns: one env factory per worker (cloudpickled: lambdas work); with a
            synchronous collector their envs must have equal batch sizes.
        policy: reads the root TensorDict and writes the actions; copied into every worker, its
            weights shared with them (``None``: random actions).
        frames_per_batch: frames per yielded batch, over all workers (a multiple of
            ``num_workers``, each share a multiple of the env batch).
        total_frames: stop after this many frames (rounded up to whole batches); ``-1``: never.
        init_random_frames: frames collected with random actions before the policy is used,
            over all workers: each worker's :class:`Collector` takes ``init_random_frames /
            num_workers`` of them, rounded up (a worker decides batch by batch, so an
            asynchronous collector yields at least one random batch per worker).
        max_frames_per_traj, reset_at_each_iter, exploration: each worker's :class:`Collector`.
        split_trajs: regroup each batch by trajectory (in this process, after stacking).
        device: where each worker runs its policy (default: the policy's parameters' device).
        storing_device: where yielded batches live (default: CPU; they cross as CPU shared
            memory).
        postproc: applied to every batch before it is yielded.
        progress: show a progress bar (frames, frames/s) on stderr.
        replay_buffer: write every batch into it, in this process (see :class:`Collector`).
        start_method: ``"spawn"`` (default), ``"forkserver"`` or ``"fork"``.
        timeout: seconds a worker may be silent once asked for its batch (or anything else)
            before it is reported hung; each worker's clock runs from when it was asked, so a
            hung worker is reported while the others keep answering. Starting (the process,
            its imports, the env) may take up to ``START_TIMEOUT`` (60 s) when that is longer.
        torch_threads: torch threads in each worker.
        worker_cpus: ``None`` (default: the OS places the workers), ``"auto"`` (worker ``i``
            pinned to the ``i``-th CPU this process may use) or one CPU, or set of CPUs, per
            worker, as :class:`~marlkit.envs.ParallelEnv`'s.
        busy_wait: seconds a worker polls for its next command before it sleeps, as
            :class:`~marlkit.envs.ParallelEnv`'s (a worker that waited longer for its last
            batch command sleeps at once).

    Raises:
        TypeError: ``create_env_fns`` that is not a list of callables, a policy that is not
            callable, or one cloudpickle cannot serialise.
        ValueError: no factories, frames that do not split over workers and env batches, envs
            of different batch sizes.
        WorkerError: a worker failed to start (its traceback in the message); from iteration,
            a worker that raised, died or hung (every worker is then shut down).

    Examples:
        >>> import marlkit
        >>> from marlkit.collectors import MultiSyncCollector
        >>> make = lambda: marlkit.make("navigation", num_envs=4, n_agents=2)
        >>> with MultiSyncCollector([make, make], None, frames_per_batch=64) as collector:
        ...     batch = collector.next()
        >>> batch.batch_size
        torch.Size([2, 4, 8])
    """

    _sync = True

    def _collect(self) -> TensorDictBase:
        def run() -> TensorDictBase:
            answers = self.pool.call(
                {w: ("collect", None) for w in range(self.num_workers)}, "collect"
            )
            return stack_tensordicts(
                [self._take(w, answers[w]) for w in range(self.num_workers)], 0
            )

        batch: TensorDictBase = self._guard(run)
        return self._finish(batch)


class MultiAsyncCollector(_MultiCollector):
    """Batches from one :class:`Collector` per worker process, yielded as each comes.

    Every worker collects ``frames_per_batch`` frames at a time without waiting for the others;
    each yielded batch is one worker's ``[*B, T]``, tagged with ``("collector", "worker")``, its
    trajectory ids unique across workers. A worker starts its next batch as soon as the parent
    has taken its last one, so collection overlaps training. Weights published by
    :meth:`update_policy_weights_` are picked up by each worker at the start of its next batch
    (the batch in flight finishes with the weights it started with).

    Takes the same arguments as :class:`MultiSyncCollector`, except that ``frames_per_batch`` is
    the size of each worker's batch, and the workers' envs may have different batch sizes.
    """

    _sync = False

    def _collect(self) -> TensorDictBase:
        if self._ready:
            return self._finish(self._ready.pop(0)[1])

        def run() -> TensorDictBase:
            pool = self.pool
            for w in range(self.num_workers):
                if w not in self._busy:
                    pool.send(w, ("collect", None), "collect")
                    self._busy.append(w)
            w = pool.first_ready(self._busy, "collect")
            batch = self._take(w, pool.receive(w, "collect")).clone()
            self._busy.remove(w)
            pool.send(w, ("collect", None), "collect")  # its next batch, while this one is used
            self._busy.append(w)
            return batch

        batch: TensorDictBase = self._guard(run)
        return self._finish(batch)
