"""Worker processes that answer commands over a pipe: what ``ParallelEnv`` and the multiprocess
collectors share.

The parent builds a :class:`WorkerPool` from one cloudpickled *setup* per worker: a callable
``setup(index, *args) -> (server, hello)`` run inside the worker, whose ``server`` then answers
commands (``server.handle(cmd, arg)``) until ``close``. Bulk data never crosses the pipes: the
servers and the parent exchange shared-memory TensorDicts once and then only small messages.

What every worker does, whatever it serves:

* it ignores SIGINT: a Ctrl-C reaches the parent, which shuts the workers down (a terminal sends
  SIGINT to the whole process group, and a worker killed mid-message would only hide the
  parent's own ``KeyboardInterrupt``);
* it exits when its parent dies (a watchdog thread sees ``os.getppid()`` change), so a parent
  killed by SIGKILL leaves no child behind;
* it sends any exception, with its traceback, back to the parent, which raises
  :class:`WorkerError` naming the worker.

How the workers wait: a worker whose commands come in quick succession (a ``ParallelEnv``
stepped in lock-step) polls its pipe for up to ``busy_wait`` seconds after each answer, yielding
the CPU meanwhile, before it sleeps: waking a sleeping process costs tens of microseconds per
command (an idle vCPU's wake-up, on a VM). A worker whose last command came later than that
sleeps at once, so a collector's workers, which wait for each batch, never poll; nor do the
workers of a pool whose workers and parent's torch threads would crowd the CPUs. Where they
run: anywhere the OS puts them, or each on CPUs of its own (``worker_cpus``).
``docs/batched.md`` ("How the workers wait, and where they run") has the figures.

What the parent does: every wait also wakes on the worker's process sentinel, so a worker that
dies (killed, segfault, ``os._exit``) is reported at once, without polling; a dead worker closes
the whole pool. Every worker asked something has its own deadline, ``timeout`` seconds after it
was asked (or started): one silent past it is reported as hung, naming it and how long it has
been silent, even while the others keep answering (an asynchronous collector waits on whichever
worker answers first). Shutting down resumes stopped workers (SIGCONT), so that a worker stopped
with SIGSTOP acts on its close, or its SIGTERM, at once instead of after the grace period.
"""

from __future__ import annotations

import contextlib
import functools
import math
import multiprocessing.connection
import numbers
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any, NoReturn, Protocol, cast

import cloudpickle
import torch
import torch.multiprocessing as mp

from marlkit._checks import check_real

__all__ = [
    "Server",
    "WorkerCpus",
    "WorkerError",
    "WorkerPool",
    "resolve_worker_cpus",
    "serialise",
    "serialise_setup",
]

#: What ``worker_cpus`` accepts: ``None``, ``"auto"``, or one CPU (or set of CPUs) per worker.
WorkerCpus = str | Sequence[int | Iterable[int]] | None

#: How often the workers' watchdogs check that the parent is alive.
_PARENT_POLL_S = 0.5


def _encode(message: tuple[str, Any]) -> bytes:
    """``message`` as ``Connection.send`` would pickle it (``Connection.recv`` reads it back)."""
    return bytes(ForkingPickler.dumps(message))


#: The commonest answer, pickled once: most commands answer nothing.
_OK_NONE = _encode(("ok", None))


class WorkerError(RuntimeError):
    """A worker process raised or died.

    The message names the worker, what it was doing and the cause, with the worker's traceback;
    the worker's own exception (when it could be sent back) is ``__cause__``.

    Attributes:
        worker: the index of the worker.
        remote_traceback: the worker's formatted traceback (``None`` when it died silently).
        answers: from :meth:`WorkerPool.call` with the pool still open, what the other workers
            of the call answered (``{worker: answer}``); empty otherwise.
    """

    def __init__(
        self, message: str, *, worker: int | None = None, remote_traceback: str | None = None
    ):
        super().__init__(message)
        self.worker = worker
        self.remote_traceback = remote_traceback
        self.answers: dict[int, Any] = {}


class Server(Protocol):
    """What a worker serves: built by a setup callable, then asked commands until closed."""

    def handle(self, cmd: str, arg: Any) -> Any: ...

    def close(self) -> None: ...


Setup = Callable[..., tuple[Server, Any]]


def serialise_setup(setup: Setup, args: tuple[Any, ...], what: str) -> bytes:
    """``(setup, args)`` as cloudpickle bytes, loaded inside the worker (so a payload that cannot
    be loaded there is reported like any other start failure).

    Raises:
        TypeError: cloudpickle cannot serialise it; the message names ``what``.
    """
    return serialise((setup, args), what)


def serialise(obj: Any, what: str) -> bytes:
    """``obj`` as cloudpickle bytes (lambdas, closures and ``__main__`` functions included).

    Raises:
        TypeError: cloudpickle cannot serialise it; the message names ``what``.
    """
    try:
        return cloudpickle.dumps(obj)
    except Exception as err:
        raise TypeError(
            f"{what} cannot be serialised with cloudpickle: {type(err).__name__}: {err}"
        ) from err


def _usable_cpus() -> int:
    """How many CPUs this process may run on."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return len(getaffinity(0)) if getaffinity is not None else os.cpu_count() or 1


def _room_to_poll(num_workers: int) -> bool:
    """Whether polling workers leave this process its CPUs: one per worker and one per torch
    thread here, less one, since this process's main thread idles while the workers step. A
    torch pool of this process's own (its threads spin between operations) beside polling
    workers on two cores made a lock-step step 12 % slower; one thread and polling, 16 % faster
    than sleeping workers (``docs/batched.md``)."""
    return num_workers + torch.get_num_threads() <= _usable_cpus() + 1


def resolve_worker_cpus(worker_cpus: WorkerCpus, num_workers: int) -> list[set[int]] | None:
    """Each worker's CPU set from a ``worker_cpus`` argument (checked here, in the parent).

    ``None``: no pinning (the OS places the workers). ``"auto"``: worker ``i`` on the ``i``-th
    CPU this process may run on (wrapping around when there are more workers than CPUs). A
    sequence: one CPU index, or a collection of them, per worker.

    Raises:
        ValueError: pinning on a platform without ``os.sched_setaffinity``; a sequence of the
            wrong length; a CPU this process may not run on, or an empty set.
        TypeError: an entry that is neither an int nor a collection of ints.
    """
    if worker_cpus is None:
        return None
    setaffinity = getattr(os, "sched_setaffinity", None)
    getaffinity = getattr(os, "sched_getaffinity", None)
    if setaffinity is None or getaffinity is None:
        raise ValueError(
            f"worker_cpus={worker_cpus!r} needs os.sched_setaffinity, which this platform "
            f"({sys.platform}) lacks; leave worker_cpus=None"
        )
    allowed = sorted(getaffinity(0))
    if isinstance(worker_cpus, str):
        if worker_cpus != "auto":
            raise ValueError(
                f"worker_cpus must be None, 'auto' or one CPU (or set of CPUs) per worker, "
                f"got {worker_cpus!r}"
            )
        return [{allowed[i % len(allowed)]} for i in range(num_workers)]
    try:
        entries = list(worker_cpus)
    except TypeError:
        raise TypeError(
            f"worker_cpus must be None, 'auto' or one CPU (or set of CPUs) per worker, got "
            f"{worker_cpus!r}"
        ) from None
    if len(entries) != num_workers:
        raise ValueError(
            f"worker_cpus has {len(entries)} entries for {num_workers} workers (one CPU, or "
            f"set of CPUs, per worker)"
        )
    resolved: list[set[int]] = []
    for i, entry in enumerate(entries):
        given: list[object]
        if isinstance(entry, numbers.Integral):
            given = [entry]
        else:
            try:
                given = list(cast(Iterable[object], entry))
            except TypeError:
                given = [entry]  # not iterable: refused below, by its type
        if any(isinstance(c, bool) or not isinstance(c, numbers.Integral) for c in given):
            raise TypeError(
                f"worker_cpus[{i}] must be a CPU index or a collection of them, got {entry!r}"
            )
        cpus = [int(cast(numbers.Integral, c)) for c in given]
        if not cpus:
            raise ValueError(f"worker_cpus[{i}] is empty: give worker {i} at least one CPU")
        outside = sorted(set(cpus) - set(allowed))
        if outside:
            raise ValueError(
                f"worker_cpus[{i}] = {entry!r}: CPU {outside} is not one this process may run "
                f"on ({allowed})"
            )
        resolved.append(set(cpus))
    return resolved


# ---------------------------------------------------------------------- the worker side
def _error_payload(err: BaseException) -> tuple[str, str, bytes | None]:
    """``(summary, traceback, pickled exception or None)`` of an error inside a worker."""
    try:
        blob: bytes | None = cloudpickle.dumps(err)
    except Exception:  # an exception holding something unpicklable: its text still travels
        blob = None
    return f"{type(err).__name__}: {err}", traceback.format_exc(), blob


def _watch_parent() -> None:
    """Exit this process as soon as its parent is gone (it is then re-parented: ``getppid``
    changes). The parent is the pool's process, or the forkserver, which exits with it."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(_PARENT_POLL_S)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="marlkit-parent-watchdog", daemon=True).start()


def _serve(
    index: int,
    payload: bytes,
    conn: multiprocessing.connection.Connection,
    torch_threads: int,
    cpus: set[int] | None = None,
    busy_wait: float = 0.0,
) -> None:
    """A worker's life: set up its server, then answer commands until ``close``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _watch_parent()
    try:
        if cpus is not None:  # before anything starts a thread, so its threads inherit it
            os.sched_setaffinity(0, cpus)
        torch.set_num_threads(torch_threads)
        setup, args = cloudpickle.loads(payload)
        server, hello = setup(index, *args)
        conn.send(("ok", hello))
    except BaseException as err:  # report anything, the parent decides
        with contextlib.suppress(OSError):
            conn.send(("error", _error_payload(err)))
        return
    spin = busy_wait > 0
    ready = _pipe_ready(conn)
    answered = time.perf_counter()
    while True:
        try:
            if spin:  # the last command came soon after the answer before it: poll a while
                _poll_briefly(ready, busy_wait)
            cmd, arg = conn.recv()
            # Commands in quick succession (lock-step): poll for the next before sleeping, where
            # a sleeping worker costs a wake-up (an idle vCPU's, on a VM) per command. The gap
            # runs from this worker's last answer, polling included.
            spin = busy_wait > 0 and time.perf_counter() - answered < busy_wait
        except (EOFError, OSError):  # the parent went away
            with contextlib.suppress(Exception):
                server.close()
            return
        try:
            if cmd == "close":
                server.close()
                conn.send(("ok", None))
                return
            answer = server.handle(cmd, arg)
            if answer is None:
                conn.send_bytes(_OK_NONE)
            else:
                conn.send(("ok", answer))
        except BaseException as err:
            try:
                conn.send(("error", _error_payload(err)))
            except (OSError, ValueError):  # the parent went away while we worked
                return
        answered = time.perf_counter()


def _pipe_ready(conn: multiprocessing.connection.Connection) -> Callable[[], object]:
    """A check that ``conn`` has a message: one kept ``poll`` object, one syscall a check
    (``Connection.poll`` builds a selector each time), where the platform has one."""
    if not hasattr(select, "poll"):
        return conn.poll
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return functools.partial(poller.poll, 0)


def _poll_briefly(ready: Callable[[], object], seconds: float) -> None:
    """Return once ``ready()`` or ``seconds`` have passed, yielding the CPU between checks to
    whatever else is runnable on it (the parent, most often)."""
    give_way = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))
    end = time.perf_counter() + seconds
    while not ready() and time.perf_counter() < end:
        give_way()


# ---------------------------------------------------------------------- the parent side
def _load_exception(blob: bytes | None) -> BaseException | None:
    if blob is None:
        return None
    try:
        err = pickle.loads(blob)
    except Exception:  # its class does not exist here, or does not unpickle: the text stays
        return None
    return err if isinstance(err, BaseException) else None


#: The most ``poll`` objects a pool keeps, one per set of workers it waited on.
_MAX_POLLERS = 64


#: Seconds a worker may take to start, at least, whatever the pool's ``timeout``: a process
#: spawned, torch imported and a simulator built take seconds on a loaded machine, where a
#: ``timeout`` of a second or two is meant for commands.
START_TIMEOUT = 60.0


class WorkerPool:
    """Worker processes, one per payload, each answering commands over its own pipe.

    Args:
        owner: what the pool serves, for messages (``"the ParallelEnv"``).
        payloads: one :func:`serialise_setup` payload per worker.
        start_method: ``"spawn"`` (default: safe with threads), ``"forkserver"`` or ``"fork"``.
        timeout: seconds a worker may take to answer once asked before it is reported hung,
            counted for each worker from when it was asked; to start, at least
            :data:`START_TIMEOUT`.
        torch_threads: torch threads inside each worker.
        worker_cpus: ``None`` (the OS places the workers), ``"auto"`` (worker ``i`` on the
            ``i``-th CPU this process may use) or one CPU, or set of CPUs, per worker; see
            :func:`resolve_worker_cpus`.
        busy_wait: seconds a worker polls for its next command before it sleeps, when its
            commands come in quick succession (``0``: always sleep). Off when the workers and
            this process's torch threads (at construction) outnumber its CPUs by more than one.

    Attributes:
        hello: what each worker's setup answered.

    Raises:
        WorkerError: a worker failed to start; every worker is shut down.
    """

    def __init__(
        self,
        owner: str,
        payloads: Sequence[bytes],
        *,
        start_method: str = "spawn",
        timeout: float = 120.0,
        torch_threads: int = 1,
        worker_cpus: WorkerCpus = None,
        busy_wait: float = 0.0,
    ):
        self.owner = owner
        self.timeout = check_real("timeout", timeout, finite=False)  # seconds
        busy = check_real("busy_wait", busy_wait, strict=False, below=self.timeout)
        #: Seconds a worker polls before sleeping (0 where polling would crowd the CPUs).
        self.busy_wait = busy if _room_to_poll(len(payloads)) else 0.0
        #: Each worker's CPU set (``None``: not pinned).
        self.worker_cpus = resolve_worker_cpus(worker_cpus, len(payloads))
        self._procs: list[Any] = []
        self._conns: list[multiprocessing.connection.Connection] = []
        #: Workers with a command sent and not answered yet (busy, or stuck).
        self._pending: set[int] = set()
        #: When each worker awaited (a command sent, or starting) was asked: its deadline is
        #: ``timeout`` seconds later.
        self._asked: dict[int, float] = {}
        #: Each awaited worker's limit when it is not ``timeout`` (starting workers).
        self._limits: dict[int, float] = {}
        self._encoded: dict[str, bytes] = {}
        self._pollers: dict[frozenset[int], tuple[Any, dict[int, tuple[int, bool]]]] = {}
        self.closed = False
        ctx = mp.get_context(start_method)
        try:
            for i, payload in enumerate(payloads):
                parent, child = ctx.Pipe()
                proc = ctx.Process(  # type: ignore[attr-defined]  # a context has Process
                    target=_serve,
                    args=(
                        i,
                        payload,
                        child,
                        torch_threads,
                        None if self.worker_cpus is None else self.worker_cpus[i],
                        self.busy_wait,
                    ),
                    daemon=True,
                    name=f"marlkit-worker-{i}",
                )
                proc.start()
                self._asked[i] = time.monotonic()
                self._limits[i] = max(self.timeout, START_TIMEOUT)
                child.close()
                self._procs.append(proc)
                self._conns.append(parent)
            self.hello: list[Any] = [self.receive(i, "start") for i in range(len(payloads))]
        except BaseException:
            self.shutdown()
            raise

    @property
    def num_workers(self) -> int:
        return len(self._procs)

    @property
    def pids(self) -> list[int]:
        """The workers' process ids (empty once shut down)."""
        return [p.pid for p in self._procs]

    # -------------------------------------------------------------- messages
    def _died(self, i: int, what: str, cause: BaseException | None = None) -> NoReturn:
        proc = self._procs[i]
        proc.join(timeout=1)
        code, pid = proc.exitcode, proc.pid
        self.shutdown()
        raise WorkerError(
            f"worker {i} (pid {pid}) died with exit code {code} during {what} (what it printed "
            f"went to this process's stderr); {self.owner} is shut down",
            worker=i,
        ) from cause

    def send(self, i: int, message: tuple[str, Any], what: str) -> None:
        """Send worker ``i`` a command ``(cmd, arg)``.

        Raises:
            WorkerError: the worker is dead (the pool is then shut down).
        """
        try:
            if message[1] is None:  # an argument-less command, pickled once
                encoded = self._encoded.get(message[0])
                if encoded is None:
                    encoded = self._encoded[message[0]] = _encode(message)
                self._conns[i].send_bytes(encoded)
            else:
                self._conns[i].send(message)
        except (BrokenPipeError, ConnectionError, OSError) as err:
            self._died(i, what, err)
        self._pending.add(i)
        self._asked[i] = time.monotonic()
        self._limits.pop(i, None)

    def receive(self, i: int, what: str) -> Any:
        """Worker ``i``'s answer to its last command.

        Raises:
            WorkerError: the worker raised (its exception is the cause, its traceback in the
                message), died, or did not answer within the pool's ``timeout`` of being asked;
                a dead or hung worker shuts the pool down.
        """
        # returns at once when the answer is there (one poll of the kept poller)
        self._wait([i], what)
        return self._take(i, what)

    def _take(self, i: int, what: str) -> Any:
        """Worker ``i``'s answer, which is waiting in its pipe (see :meth:`receive`)."""
        try:
            status, payload = self._conns[i].recv()
        except (EOFError, ConnectionError, OSError) as err:
            self._died(i, what, err)
        self._pending.discard(i)
        self._asked.pop(i, None)
        self._limits.pop(i, None)
        if status != "ok":
            summary, remote_tb, blob = payload
            message = f"worker {i} failed during {what}: {summary}"
            if remote_tb:
                message += f"\n--- traceback in worker {i} ---\n{remote_tb.rstrip()}"
            raise WorkerError(
                message, worker=i, remote_traceback=remote_tb or None
            ) from _load_exception(blob)
        return payload

    def call(self, calls: Mapping[int, tuple[str, Any]], what: str) -> dict[int, Any]:
        """Send each worker in ``calls`` its command, then gather every answer (the error of the
        first worker, in the order of ``calls``, that failed is raised once all have answered,
        so no answer is left in a pipe, with the other workers' answers as its ``answers``)."""
        for i, message in calls.items():
            self.send(i, message, what)
        answers: dict[int, Any] = {}
        errors: dict[int, WorkerError] = {}
        # Wait on every worker still out at once: a worker that dies while another is still
        # busy is reported as it dies, not once the busy one answers (a whole batch later).
        remaining = list(calls)
        while remaining:
            ready = self._wait(remaining, what)
            for i in [i for i in remaining if i in ready]:
                remaining.remove(i)
                try:
                    answers[i] = self._take(i, what)
                except WorkerError as err:
                    if self.closed:  # a dead worker: everything is shut down already
                        raise
                    errors[i] = err
        if errors:
            first_error = errors[next(i for i in calls if i in errors)]
            first_error.answers = answers  # the caller may need what the others did
            raise first_error
        return answers

    def first_ready(self, workers: Iterable[int], what: str) -> int:
        """The first of ``workers`` (in the order given) with an answer waiting, once one has.

        Raises:
            WorkerError: one of them died, or was silent for the pool's timeout since it was
                asked (even while others answer).
        """
        order = list(workers)
        if not order:
            raise ValueError("first_ready needs at least one worker to wait for")
        ready = self._wait(order, what)
        return next(i for i in order if i in ready)

    def _wait(self, order: list[int], what: str) -> set[int]:
        """Block until one of the workers in ``order`` has an answer waiting (those that have),
        waking as soon as one answers or dies (its process sentinel), or once the first of them
        is due (``timeout`` seconds after it was asked): no polling, so the wait leaves the CPU
        to the workers.

        Raises:
            WorkerError: a worker died, or one of ``order`` is past its deadline without an
                answer, whether or not others answered; the pool is then shut down.
        """
        while True:
            now = time.monotonic()
            due = min(self._asked.get(i, now) + self._limit(i) for i in order)
            ready, dead = self._woken(order, max(0.0, due - now))
            now = time.monotonic()
            late = [
                i
                for i in order
                if i not in ready
                and i not in dead
                and now - self._asked.get(i, now) >= self._limit(i)
            ]
            if ready and not late:  # an answer, even from a worker that died just after it
                return ready
            for i in dead - ready:
                self._died(i, what)
            if late:
                self._hung(late, what, now)

    def _limit(self, i: int) -> float:
        """Seconds worker ``i`` may take to answer what it was last asked."""
        return self._limits.get(i, self.timeout)

    def _hung(self, late: list[int], what: str, now: float) -> NoReturn:
        """Shut the pool down and raise the error that names the ``late`` workers, their pids
        and how long each has been silent."""
        pids = ", ".join(str(self._procs[i].pid) for i in late)
        silent = ", ".join(f"{now - self._asked[i]:.1f} s" for i in late)
        who = (
            f"worker {late[0]} (pid {pids}) did not answer"
            if len(late) == 1
            else f"workers {late} (pids {pids}) did not answer"
        )
        self.shutdown()
        raise WorkerError(
            f"{who} {what} within {self._limit(late[0]):g} s (silent for {silent} since asked); "
            f"{self.owner} is shut down",
            worker=late[0],
        )

    def _woken(self, order: list[int], seconds: float) -> tuple[set[int], set[int]]:
        """Block up to ``seconds`` until one of ``order`` has an answer waiting or has died:
        ``(workers with an answer, workers dead)``. One ``poll`` object per set of workers,
        kept (where the platform has ``select.poll``): a lock-step ``ParallelEnv`` waits twice a
        step, and building a selector each time was a tenth of its own per-step work."""
        if not hasattr(select, "poll"):
            conns = {self._conns[i]: i for i in order}
            sentinels = {self._procs[i].sentinel: i for i in order}
            woke = multiprocessing.connection.wait([*conns, *sentinels], min(seconds, 86_400.0))
            return {conns[c] for c in woke if c in conns}, {
                sentinels[s] for s in woke if s in sentinels
            }
        key = frozenset(order)  # the ready set is unordered: one poller per set, any order
        cached = self._pollers.get(key)
        if cached is None:
            poller, fds = select.poll(), {}
            for i in order:
                for fd, is_answer in (
                    (self._conns[i].fileno(), True),
                    (self._procs[i].sentinel, False),
                ):
                    poller.register(fd, select.POLLIN)
                    fds[fd] = (i, is_answer)
            if len(self._pollers) >= _MAX_POLLERS:  # call() waits on ever smaller sets of
                self._pollers.clear()  # many workers: keep the cache bounded
            cached = self._pollers[key] = (poller, fds)
        poller, fds = cached
        ready: set[int] = set()
        dead: set[int] = set()
        # Any event on a pipe (data, or the hang-up of a dead writer) wakes the wait, as
        # multiprocessing.connection.wait does.
        # At most a day per poll (the caller's loop waits out longer limits): poll() takes a
        # C int of milliseconds.
        for fd, _ in poller.poll(math.ceil(min(seconds, 86_400.0) * 1000)):
            i, is_answer = fds[fd]
            (ready if is_answer else dead).add(i)
        return ready, dead

    # -------------------------------------------------------------- closing
    def shutdown(self, grace: float = 5.0) -> None:
        """Ask every worker to close, wait ``grace`` seconds, then terminate (and at last kill)
        what is left. Workers still working on a command (busy, or stuck) would hear the close
        only after it: they are terminated at once. Every worker is resumed (SIGCONT) after its
        close or SIGTERM: a stopped process (SIGSTOP) acts on neither until it runs again.
        Idempotent."""
        if self.closed:
            return
        self.closed = True
        for i, (conn, proc) in enumerate(zip(self._conns, self._procs)):
            if i in self._pending:
                _terminate(proc)
                continue
            with contextlib.suppress(OSError, ValueError):  # a dead worker's pipe
                conn.send(("close", None))
            _resume(proc)
        deadline = time.monotonic() + grace
        for proc in self._procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                _terminate(proc)
                proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2)
        for conn in self._conns:
            conn.close()
        for proc in self._procs:
            with contextlib.suppress(ValueError, AttributeError):
                proc.close()
        self._conns, self._procs = [], []
        self._pollers.clear()
        self._asked.clear()
        self._limits.clear()


def _resume(proc: Any) -> None:
    """Continue ``proc`` if it is stopped (SIGSTOP, a terminal's Ctrl-Z): a stopped process
    keeps its signals (SIGKILL aside) and its pipe unread until it runs again. A no-op on a
    running process, and on a platform without SIGCONT."""
    sigcont = getattr(signal, "SIGCONT", None)
    if sigcont is None or proc.pid is None:
        return
    with contextlib.suppress(OSError, ValueError):
        if proc.exitcode is None:  # not reaped: the pid is still this worker's
            os.kill(proc.pid, sigcont)


def _terminate(proc: Any) -> None:
    """SIGTERM ``proc``, then resume it, so that it acts on the SIGTERM even if it was stopped."""
    with contextlib.suppress(OSError, ValueError):
        proc.terminate()
    _resume(proc)
