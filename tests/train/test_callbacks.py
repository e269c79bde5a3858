"""Callbacks of a training run (``marlkit.train.callbacks``): the hooks a ``TrainingRun`` calls,
in order and with what they need, custom metrics, early stopping (a clean end: checkpoint and
summary), a callback that raises (named, the run's files released), callbacks from a config."""

from __future__ import annotations

import pathlib

import pytest

import marlkit
from marlkit.collectors import Collector
from marlkit.envs import Compose, RewardSum, StepCounter, TransformedEnv
from marlkit.record import read_metrics
from marlkit.train import Checkpointer, TrainingRun
from marlkit.train.callbacks import (
    HOOKS,
    Callback,
    CallbackError,
    EarlyStopping,
    MetricRatio,
    check_callbacks,
    make_callbacks,
)
from marlkit.train.config import ConfigError


def nav(num_envs=2, max_steps=5):
    env = marlkit.make("navigation", num_envs=num_envs, n_agents=3, seed=0)
    return TransformedEnv(env, Compose(StepCounter(max_steps), RewardSum()))


class Recorder(Callback):
    """Records every hook's call with what it got."""

    def __init__(self):
        self.calls: list[tuple] = []

    def on_setup(self, run):
        self.calls.append(("on_setup", run.iteration, run.run_dir))

    def on_batch_collected(self, run, batch):
        self.calls.append(("on_batch_collected", run.iteration, tuple(batch.batch_size)))

    def on_train_step(self, run, batch, metrics):
        self.calls.append(("on_train_step", run.iteration, run.frames, metrics["train/loss"]))
        metrics["custom/frames_k"] = run.frames / 1000  # a custom metric

    def on_evaluation_end(self, run, metrics):
        self.calls.append(
            ("on_evaluation_end", run.iteration, "eval/agents/episode_reward" in metrics)
        )

    def on_checkpoint(self, run, path):
        self.calls.append(("on_checkpoint", run.iteration, pathlib.Path(path).is_dir()))

    def on_train_end(self, run, summary):
        self.calls.append(("on_train_end", run.iteration, summary["iterations"]))


def loop(folder, callbacks, *, total=4, resume=False, eval_every=2, checkpoint_every=2):
    """A real run of random actions ("training": a loss that counts down), ``total`` batches
    of 10 frames."""
    env = nav()
    collector = Collector(env, None, frames_per_batch=10, total_frames=10 * total)
    run = TrainingRun(
        folder,
        resume=resume,
        eval_env=nav(),
        eval_steps=5,
        eval_every=eval_every,
        video=False,
        checkpoint_every=checkpoint_every,
        backends=["csv"],
        callbacks=callbacks,
    )
    state = run.restore()
    if state is not None:
        collector.load_state_dict(state["collector"])
    for batch in run.batches(collector):
        run.end_iteration(
            batch,
            {"train/loss": 10.0 - run.iteration},
            policy=None,
            state=lambda: {"collector": collector.state_dict()},
            frames=collector.frames,
        )
    summary = run.finish(None, info={"what": "test"})
    collector.shutdown()
    return run, summary


def test_every_hook_is_called_in_order_with_the_run_s_state(tmp_path):
    recorder = Recorder()
    loop(tmp_path, [recorder], total=2, eval_every=2, checkpoint_every=1)
    assert recorder.calls == [
        ("on_setup", 0, tmp_path),
        ("on_batch_collected", 0, (2, 5)),
        ("on_train_step", 1, 10, 10.0),
        ("on_checkpoint", 1, True),
        ("on_batch_collected", 1, (2, 5)),
        ("on_train_step", 2, 20, 9.0),
        ("on_evaluation_end", 2, True),
        ("on_checkpoint", 2, True),
        ("on_train_end", 2, 2),
    ]
    # the metric the callback added is logged with the others
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [r["custom/frames_k"] for r in rows] == [0.01, 0.02]


def test_metric_ratio_is_a_custom_metric_in_metrics_csv(tmp_path):
    loop(tmp_path, [MetricRatio("train_share", "training_time", "collection_time")], total=2)
    rows = read_metrics(tmp_path / "metrics.csv")
    assert [r["train_share"] for r in rows] == pytest.approx(
        [r["training_time"] / r["collection_time"] for r in rows]
    )


def test_early_stopping_ends_the_run_cleanly_with_checkpoint_and_summary(tmp_path):
    # the loss counts down 10, 9, 8, ...: in "max" mode it never improves on its first value
    stopper = EarlyStopping("train/loss", patience=2, mode="max")
    run, summary = loop(tmp_path, [stopper], total=8, checkpoint_every=5)
    assert run.iteration == 3  # values 10 (best), 9 (wait 1), 8 (wait 2: stop)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.csv")] == [1, 2, 3]
    assert "did not improve on 10 for 2 values" in summary["stopped"]
    assert summary["iterations"] == 3 and (tmp_path / "summary.json").exists()
    # the stopping iteration is checkpointed (checkpoint_every=5 would not have), with the
    # callback's state, and evaluated as a last iteration
    state = Checkpointer(tmp_path / "checkpoints").load()
    assert state["iteration"] == 3
    assert state["callbacks"] == {"0:EarlyStopping": {"best": 10.0, "wait": 2}}
    assert "eval/agents/episode_reward" in read_metrics(tmp_path / "metrics.csv")[-1]
    # the folder is released: a resumed run opens it, restores the callback's state
    again = EarlyStopping("train/loss", patience=5)
    resumed = TrainingRun(
        tmp_path,
        resume=True,
        eval_env=nav(),
        eval_steps=5,
        video=False,
        backends=["csv"],
        callbacks=[again],
    )
    resumed.restore()
    resumed.close()
    assert (again.best, again.wait) == (10.0, 2)
    # resumed as a whole, the stopped run trains no more: it writes its summary again
    run, summary = loop(tmp_path, [EarlyStopping("train/loss", patience=2)], total=8, resume=True)
    assert run.iteration == 3 and summary["stopped"].startswith("EarlyStopping: train/loss")
    assert len(read_metrics(tmp_path / "metrics.csv")) == 3


def test_early_stopping_on_an_evaluation_metric_and_a_threshold(tmp_path):
    on_eval = EarlyStopping("eval/agents/episode_reward", threshold=-1e9)  # reached at once
    run, summary = loop(tmp_path / "a", [on_eval], total=6, eval_every=2)
    assert run.iteration == 2 and "reached the threshold" in summary["stopped"]
    minimum = EarlyStopping("train/loss", mode="min", threshold=8.0)
    run, summary = loop(tmp_path / "b", [minimum], total=6)
    assert run.iteration == 3 and summary["stopped"].startswith("EarlyStopping: train/loss = 8")


class Raises(Callback):
    def __init__(self, hook):
        self.hook = hook

    def __getattribute__(self, name):
        if name in HOOKS and name == object.__getattribute__(self, "hook"):

            def boom(*args):
                raise ZeroDivisionError("the user's bug")

            return boom
        return object.__getattribute__(self, name)

    def __repr__(self):
        return f"Raises({self.hook!r})"


@pytest.mark.parametrize("hook", HOOKS)
def test_a_callback_that_raises_is_named_and_the_run_is_released(tmp_path, hook):
    with pytest.raises(
        CallbackError, match=rf"callback 1:Raises \(Raises\('{hook}'\)\) raised in {hook}"
    ) as info:
        loop(tmp_path, [Callback(), Raises(hook)], total=2, eval_every=1, checkpoint_every=1)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert "the user's bug" in str(info.value)
    # nothing left held: the folder's lock is free (a second run opens it) and the metrics file
    # is closed (its rows are on disk)
    again = TrainingRun(
        tmp_path, resume=True, eval_env=nav(), eval_steps=5, video=False, backends=["csv"]
    )
    again.close()
    if hook in ("on_checkpoint", "on_train_end"):  # after the first row was logged
        assert read_metrics(tmp_path / "metrics.csv")


def test_training_run_refuses_what_is_not_a_callback(tmp_path):
    with pytest.raises(
        TypeError,
        match=r"callbacks\[0\] must be a marlkit.train.callbacks.Callback, got builtin_function",
    ):
        TrainingRun(tmp_path, eval_env=nav(), eval_steps=5, video=False, callbacks=[print])
    with pytest.raises(TypeError, match="reason must be a str"):
        run = TrainingRun(
            tmp_path / "r", eval_env=nav(), eval_steps=5, video=False, backends=["csv"]
        )
        try:
            run.stop(3)  # type: ignore[arg-type]
        finally:
            run.close()


def test_early_stopping_checks_its_arguments():
    with pytest.raises(ValueError, match="patience must be an int >= 1, got 0"):
        EarlyStopping("x", patience=0)
    with pytest.raises(ValueError, match="mode must be one of"):
        EarlyStopping("x", mode="maximum")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="metric must be a metric's name, got ''"):
        EarlyStopping("")
    with pytest.raises(ValueError, match="min_delta"):
        EarlyStopping("x", min_delta=float("nan"))


# ------------------------------------------------------------------------- from a config
def test_callbacks_from_config_entries():
    built = make_callbacks(
        [
            {"_target_": "EarlyStopping", "metric": "eval/agents/episode_reward", "patience": 2},
            {
                "_target_": "marlkit.train.callbacks.MetricRatio",
                "name": "r",
                "numerator": "a",
                "denominator": "b",
            },
            "marlkit.train.callbacks.Callback",
        ]
    )
    assert [type(c).__name__ for c in built] == ["EarlyStopping", "MetricRatio", "Callback"]
    assert built[0].patience == 2
    assert make_callbacks(None) == [] and make_callbacks([]) == []


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (
            ["EarlyStoping"],
            r"callbacks\[0\]: unknown callback 'EarlyStoping'.*Did you mean: EarlyStopping\?",
        ),
        (
            ["nosuchpackage.Thing"],
            r"callbacks\[0\]: unknown callback 'nosuchpackage.Thing': module 'nosuchpackage' "
            "does not import",
        ),
        (
            ["marlkit.train.callbacks.EarlyStoping"],
            r"module 'marlkit.train.callbacks' has no 'EarlyStoping'.*Did you mean: EarlyStopping",
        ),
        (
            ["marlkit.train.TrainingRun"],
            r"'marlkit.train.TrainingRun' is not a marlkit.train.callbacks.Callback",
        ),
        (
            ["marlkit.train.callbacks.HOOKS"],
            r"'marlkit.train.callbacks.HOOKS' is a tuple, not a callback class",
        ),
        (
            [{"metric": "x"}],
            r"callbacks\[0\]: a mapping names its callback with _target_.*got keys \['metric'\]",
        ),
        (
            [{"_target_": "EarlyStopping", "metric": "x", "patiense": 2}],
            r"callbacks\[0\]: EarlyStopping\(metric='x', patiense=2\): got an unexpected "
            "keyword argument 'patiense'",
        ),
        (
            [{"_target_": "EarlyStopping"}],
            r"EarlyStopping\(\): missing a required argument: 'metric'",
        ),
        ([3], r"callbacks\[0\] must be a dotted name or a mapping with _target_, got int: 3"),
        ("EarlyStopping", r"callbacks must be a list"),
    ],
)
def test_bad_callback_entries_are_config_errors(entries, message):
    with pytest.raises(ConfigError, match=message):
        check_callbacks(entries)
    with pytest.raises(ConfigError, match=message):
        make_callbacks(entries)


def test_a_constructor_that_refuses_its_values_is_a_config_error():
    check_callbacks([{"_target_": "EarlyStopping", "metric": "x", "patience": 0}])  # binds
    with pytest.raises(
        ConfigError, match=r"callbacks\[0\]: EarlyStopping: patience must be an int >= 1, got 0"
    ):
        make_callbacks([{"_target_": "EarlyStopping", "metric": "x", "patience": 0}])
