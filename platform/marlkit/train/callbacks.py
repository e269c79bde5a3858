"""Callbacks: code of the user's that a :class:`~marlkit.train.TrainingRun` calls at the events
of every training script, without editing the script.

A callback subclasses :class:`Callback` and overrides the hooks it needs; each hook gets the run
(``run.run_dir``, ``run.iteration``, ``run.frames``, ``run.device``, ``run.logger``) and what the
event has:

==========================  ===================================================================
hook                        when, and what it gets
==========================  ===================================================================
``on_setup(run)``           once, after the run restored its checkpoint (if any), before the
                            first batch
``on_batch_collected``      each batch, ``(run, batch)``, on the training device (``[*B, T]``)
``on_train_step``           after the algorithm's update, ``(run, batch, metrics)``: ``metrics``
                            (losses, frame counts, episode rewards) is the dict about to be
                            logged; entries a callback adds are logged too (custom metrics)
``on_evaluation_end``       after each periodic evaluation, ``(run, metrics)``: the
                            ``eval/...`` entries of ``metrics``, the dict about to be logged
``on_checkpoint``           after each checkpoint, ``(run, path)``: its folder
``on_train_end``            once, after ``summary.json`` is written, ``(run, summary)``
==========================  ===================================================================

A callback stops the run with ``run.stop(reason)``: the iteration in progress is the last one
(evaluated, logged, checkpointed), the batches end, and the script writes its summary as after
its last batch (:class:`EarlyStopping`). A callback that raises stops the run too: the error
(a :class:`CallbackError`) names the callback and the hook, and the run's loggers and folder
lock are released first.

A callback with ``state_dict()``/``load_state_dict()`` is saved with each checkpoint and
restored on resume (:class:`EarlyStopping`'s best value and patience count).

In a config (``callbacks:`` of ``configs/run.yaml``), each entry is a dotted name
(``marlkit.train.callbacks.EarlyStopping``; the callbacks of this module by their bare name) or
a mapping ``{_target_: <dotted name>, **keyword arguments}``, as Hydra's ``instantiate`` reads
it; :func:`check_callbacks` resolves the names and checks the arguments before anything runs,
:func:`make_callbacks` builds them.
"""

from __future__ import annotations

import importlib
import inspect
import math
import pathlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from marlkit._checks import check_int, check_one_of, check_real, did_you_mean
from marlkit.train.config import ConfigError

if TYPE_CHECKING:
    from tensordict import TensorDictBase

    from marlkit.train.run import TrainingRun

__all__ = [
    "HOOKS",
    "Callback",
    "CallbackError",
    "EarlyStopping",
    "MetricRatio",
    "check_callbacks",
    "make_callbacks",
]

#: The hooks a :class:`Callback` may override, in the order a run calls them.
HOOKS = (
    "on_setup",
    "on_batch_collected",
    "on_train_step",
    "on_evaluation_end",
    "on_checkpoint",
    "on_train_end",
)


class CallbackError(RuntimeError):
    """A callback raised: the message names the callback and the hook; ``__cause__`` is the
    error it raised."""


class Callback:
    """A hook set on a training run; every hook does nothing unless overridden (see the module's
    table for when each is called and what it gets)."""

    def on_setup(self, run: TrainingRun) -> None:
        """Once, before the first batch, after the run restored its checkpoint."""

    def on_batch_collected(self, run: TrainingRun, batch: TensorDictBase) -> None:
        """Each collected batch ``[*B, T]``, on the training device, before the update."""

    def on_train_step(
        self, run: TrainingRun, batch: TensorDictBase, metrics: MutableMapping[str, Any]
    ) -> None:
        """After the update; entries added to ``metrics`` are logged."""

    def on_evaluation_end(self, run: TrainingRun, metrics: MutableMapping[str, Any]) -> None:
        """After a periodic evaluation (its ``eval/...`` entries are in ``metrics``)."""

    def on_checkpoint(self, run: TrainingRun, path: pathlib.Path) -> None:
        """After a checkpoint is written into ``path``."""

    def on_train_end(self, run: TrainingRun, summary: Mapping[str, Any]) -> None:
        """After the summary is written (``summary.json``)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def callback_name(callback: Callback, index: int) -> str:
    """How errors and checkpoints name the ``index``-th callback: ``"0:EarlyStopping"``."""
    return f"{index}:{type(callback).__name__}"


# ------------------------------------------------------------------------------ shipped
class EarlyStopping(Callback):
    """Stop the run when ``metric`` has not improved by more than ``min_delta`` for
    ``patience`` of its values in a row, or as soon as it reaches ``threshold``.

    Args:
        metric: a logged metric; an ``eval/...`` one is read after each evaluation, any other
            after each update (``agents/episode_reward``, ``train/agents/loss_critic``).
        patience: values without an improvement before the run stops (>= 1).
        mode: ``"max"`` (rewards) or ``"min"`` (losses).
        min_delta: an improvement is a change beyond this, in ``mode``'s direction.
        threshold: stop once the metric is at least (``"max"``) / at most (``"min"``) this.

    Raises:
        TypeError, ValueError: a bad argument, named.

    A metric absent from an iteration's metrics (an ``eval/`` one between evaluations) is not
    counted there; ``NaN`` counts as no improvement.
    """

    def __init__(
        self,
        metric: str,
        patience: int = 3,
        mode: Literal["max", "min"] = "max",
        min_delta: float = 0.0,
        threshold: float | None = None,
    ):
        if not isinstance(metric, str) or not metric:
            raise TypeError(f"metric must be a metric's name, got {metric!r}")
        self.metric = metric
        self.patience = check_int("patience", patience, low=1)
        self.mode = check_one_of("mode", mode, ("max", "min"))
        self.min_delta = check_real("min_delta", min_delta, low=0.0, strict=False)
        self.threshold = (
            None if threshold is None else check_real("threshold", threshold, low=-math.inf)
        )
        #: The best value so far (``None`` before the first).
        self.best: float | None = None
        #: Values in a row without an improvement.
        self.wait = 0
        #: Why the run was stopped (``None``: not stopped by this callback).
        self.reason: str | None = None

    def on_train_step(
        self, run: TrainingRun, batch: TensorDictBase, metrics: MutableMapping[str, Any]
    ) -> None:
        if not self.metric.startswith("eval"):
            self._see(run, metrics)

    def on_evaluation_end(self, run: TrainingRun, metrics: MutableMapping[str, Any]) -> None:
        if self.metric.startswith("eval"):
            self._see(run, metrics)

    def _see(self, run: TrainingRun, metrics: Mapping[str, Any]) -> None:
        if self.metric not in metrics:
            return
        value = float(metrics[self.metric])
        sign = 1.0 if self.mode == "max" else -1.0
        if self.best is None or sign * (value - self.best) > self.min_delta:
            self.best, self.wait = value, 0
        else:
            self.wait += 1
        if self.threshold is not None and sign * (value - self.threshold) >= 0:
            self.reason = f"{self.metric} = {value:g} reached the threshold {self.threshold:g}"
        elif self.wait >= self.patience:
            self.reason = (
                f"{self.metric} did not improve on {self.best:g} for {self.wait} values "
                f"(patience {self.patience})"
            )
        if self.reason is not None:
            run.stop(f"EarlyStopping: {self.reason}")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.best = None if state["best"] is None else float(state["best"])
        self.wait = int(state["wait"])

    def __repr__(self) -> str:
        return (
            f"EarlyStopping({self.metric!r}, patience={self.patience}, mode={self.mode!r}, "
            f"min_delta={self.min_delta}, threshold={self.threshold})"
        )


class MetricRatio(Callback):
    """A custom metric: ``name = numerator / denominator`` of each iteration's metrics, logged
    with them (e.g. the critic's loss per unit of the policy's, or the training time per unit
    of collection time: ``MetricRatio("train_per_collect", "training_time",
    "collection_time")``).

    Args:
        name: the new metric's name.
        numerator, denominator: metrics the iteration logs (a missing one: the metric is not
            added that iteration; a zero denominator gives ``nan``).
    """

    def __init__(self, name: str, numerator: str, denominator: str):
        for what, value in (("name", name), ("numerator", numerator), ("denominator", denominator)):
            if not isinstance(value, str) or not value:
                raise TypeError(f"{what} must be a metric's name, got {value!r}")
        self.name, self.numerator, self.denominator = name, numerator, denominator

    def on_train_step(
        self, run: TrainingRun, batch: TensorDictBase, metrics: MutableMapping[str, Any]
    ) -> None:
        if self.numerator in metrics and self.denominator in metrics:
            low = float(metrics[self.denominator])
            metrics[self.name] = float(metrics[self.numerator]) / low if low else math.nan

    def __repr__(self) -> str:
        return f"MetricRatio({self.name!r}, {self.numerator!r}, {self.denominator!r})"


#: The callbacks a config may name by their bare name.
SHIPPED: dict[str, type[Callback]] = {"EarlyStopping": EarlyStopping, "MetricRatio": MetricRatio}


# ------------------------------------------------------------------------------ from a config
def _resolve(target: str, where: str) -> Callable[..., Any]:
    """The class (or factory) a dotted name or a shipped name stands for."""
    if target in SHIPPED:
        return SHIPPED[target]
    module_name, _, attribute = target.rpartition(".")
    if not module_name:
        raise ConfigError(
            f"{where}: unknown callback {target!r}: give a dotted name "
            f"(package.module.Class) or one of {sorted(SHIPPED)}"
            f"{did_you_mean(target, SHIPPED)}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            f"{where}: unknown callback {target!r}: module {module_name!r} does not import ({err})"
        ) from None
    found = getattr(module, attribute, None)
    if found is None:
        names = [n for n in dir(module) if not n.startswith("_")]
        raise ConfigError(
            f"{where}: unknown callback {target!r}: module {module_name!r} has no "
            f"{attribute!r}{did_you_mean(attribute, names)}"
        )
    if not callable(found):
        raise ConfigError(f"{where}: {target!r} is a {type(found).__name__}, not a callback class")
    return found


def _entry(entry: Any, where: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The factory and keyword arguments of one config entry, its arguments checked against
    the factory's signature."""
    if isinstance(entry, str):
        target, kwargs = entry, {}
    elif isinstance(entry, Mapping):
        if "_target_" not in entry:
            raise ConfigError(
                f"{where}: a mapping names its callback with _target_ "
                f"({{_target_: marlkit.train.callbacks.EarlyStopping, ...}}), got keys "
                f"{sorted(map(str, entry))}"
            )
        target = entry["_target_"]
        if not isinstance(target, str):
            raise ConfigError(f"{where}._target_ must be a dotted name, got {target!r}")
        kwargs = {str(k): v for k, v in entry.items() if k != "_target_"}
    else:
        raise ConfigError(
            f"{where} must be a dotted name or a mapping with _target_, got "
            f"{type(entry).__name__}: {entry!r}"
        )
    factory = _resolve(target, where)
    if isinstance(factory, type) and not issubclass(factory, Callback):
        raise ConfigError(
            f"{where}: {target!r} is not a marlkit.train.callbacks.Callback (subclass it)"
        )
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as err:
        raise ConfigError(f"{where}: {target}({_args(kwargs)}): {err}") from None
    except ValueError:  # no signature to read: the call itself will say
        pass
    return factory, kwargs


def _args(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _entries(entries: Any) -> Sequence[Any]:
    if entries is None:
        return ()
    if isinstance(entries, (str, Mapping)) or not isinstance(entries, Sequence):
        raise ConfigError(
            f"callbacks must be a list of dotted names or {{_target_: ...}} mappings, got "
            f"{type(entries).__name__}: {entries!r}"
        )
    return entries


def check_callbacks(entries: Any) -> None:
    """Resolve every entry of a config's ``callbacks`` and check its keyword arguments against
    its signature, building none (nothing runs before the checks).

    Raises:
        ConfigError: e.g. ``"callbacks[0]: unknown callback 'EarlyStoping': ... Did you mean:
            EarlyStopping?"`` or ``"callbacks[0]: EarlyStopping(patiense=2): got an unexpected
            keyword argument 'patiense'"``.
    """
    for index, entry in enumerate(_entries(entries)):
        _entry(entry, f"callbacks[{index}]")


def make_callbacks(entries: Any) -> list[Callback]:
    """The callbacks of a config's ``callbacks`` (see :func:`check_callbacks`), built.

    Raises:
        ConfigError: what :func:`check_callbacks` refuses; a constructor that refuses its
            values (``EarlyStopping(patience=0)``); a factory that returns no
            :class:`Callback`.

    Examples:
        >>> make_callbacks([{"_target_": "EarlyStopping", "metric": "eval/agents/episode_reward"}])
        [EarlyStopping('eval/agents/episode_reward', patience=3, mode='max', min_delta=0.0, \
threshold=None)]
    """
    built: list[Callback] = []
    for index, entry in enumerate(_entries(entries)):
        where = f"callbacks[{index}]"
        factory, kwargs = _entry(entry, where)
        try:
            callback = factory(**kwargs)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{where}: {getattr(factory, '__name__', factory)}: {err}") from None
        if not isinstance(callback, Callback):
            raise ConfigError(
                f"{where}: {factory!r} returned a {type(callback).__name__}, not a Callback"
            )
        built.append(callback)
    return built
