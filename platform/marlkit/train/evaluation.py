"""Evaluate a policy with exploration off, optionally filming it.

:func:`evaluate` runs one rollout of an env (usually a separate evaluation env) under
``set_exploration("deterministic")`` and ``torch.no_grad``, and reports each group's mean
first-episode return (:func:`~marlkit.train.episodes.episode_returns`); with ``video`` it
films the rollout through :class:`~marlkit.record.VideoRecorder`; with ``seed`` it seeds the
env first, so that evaluations play the same episodes. :func:`summarise_run` ends a training
run: the trained policy next to a random one, the curve, ``summary.json``.

Envs whose root holds a ``"won"`` flag ``[*B, 1]`` (native SMAX) get a win rate too:
``"won"`` in :attr:`Evaluation.metrics` (each env's first episode) and, for a training
batch, :func:`episode_wins` (the episodes that ended in it). Envs without one log nothing more.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
from tensordict import TensorDictBase

from marlkit._checks import check_int
from marlkit.data.exploration import Exploration, set_exploration
from marlkit.data.keys import DONE, NEXT
from marlkit.envs import EnvBase, TransformedEnv
from marlkit.record.recorder import VideoRecorder
from marlkit.train.episodes import episode_returns, reward_groups

__all__ = [
    "EVAL_EXPLORATIONS",
    "WON",
    "EvalExploration",
    "Evaluation",
    "episode_wins",
    "eval_modes",
    "evaluate",
    "summarise_run",
]

#: The root flag ``[*B, 1]`` bool an env sets on the step that ends an episode it won (native
#: SMAX: the allies wiped the enemy out): its mean over episodes is the win rate.
WON = "won"

Policy = Callable[[TensorDictBase], TensorDictBase]

#: How a training run evaluates its policy: ``"deterministic"`` (the greedy or mean action),
#: ``"random"`` (the policy's own sampled or exploring actions: what a stochastic strategy
#: needs), or ``"both"``.
EvalExploration = Literal["deterministic", "random", "both"]
EVAL_EXPLORATIONS: tuple[EvalExploration, ...] = ("deterministic", "random", "both")


def eval_modes(exploration: str) -> tuple[Exploration, ...]:
    """The exploration modes an evaluation setting runs, the reported one first:
    ``"both"`` is ``("deterministic", "random")``.

    Raises:
        ValueError: not one of :data:`EVAL_EXPLORATIONS`.
    """
    if exploration not in EVAL_EXPLORATIONS:
        raise ValueError(
            f"eval exploration must be one of {list(EVAL_EXPLORATIONS)}, got {exploration!r}"
        )
    if exploration == "both":
        return ("deterministic", "random")
    return (exploration,)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What :func:`evaluate` measured.

    Attributes:
        metrics: ``{"<group>/episode_reward": mean first-episode return over the envs and the
            group's agents}``, plus ``"episode_length"`` (mean steps to the first ``done``,
            ``steps`` for an env that did not finish) and, for an env with a root ``"won"``
            flag, ``"won"`` (the fraction of envs whose first episode was won; one that did
            not finish counts as not won).
        returns: ``{group: [*B] first-episode returns}``.
        video: the video file, when one was recorded.
        steps: the rollout's length.
    """

    metrics: dict[str, float]
    returns: dict[str, torch.Tensor]
    video: pathlib.Path | None
    steps: int


def evaluate(
    env: EnvBase,
    policy: Policy | None,
    *,
    steps: int,
    exploration: Exploration = "deterministic",
    video: str | os.PathLike[str] | None = None,
    env_indices: int | Sequence[int] | str = (0,),
    tile: bool = False,
    fps: float = 30.0,
    seed: int | None = None,
) -> Evaluation:
    """Run ``steps`` steps of ``env`` (from a reset; done envs are reset and go on) with
    ``policy`` and measure each env's first episode.

    Args:
        env: the env (not closed; filming wraps it in a ``TransformedEnv`` for this call).
        policy: reads the root TensorDict and writes the actions; random actions when ``None``
            (a random-policy baseline).
        steps: rollout length; at least the episode length, so that every env finishes one.
        exploration: ``"deterministic"`` (the default: the greedy or mean action) or
            ``"random"``.
        video: film the rollout into this ``.mp4``/``.gif`` (needs the ``video`` extra).
        env_indices, tile, fps: see :class:`~marlkit.record.VideoRecorder`.
        seed: seed ``env`` (:meth:`~marlkit.envs.EnvBase.set_seed`) and torch's CPU generator
            (within the evaluation only) with it before the rollout: evaluations with the same
            seed play the same episodes (the same starts; the same random actions for
            ``policy=None``), so they compare. ``None``: the env goes on from its current
            random state.

    Raises:
        TypeError: ``seed`` that is not an int (nor ``None``).
        ValueError: ``steps < 1``, a negative ``seed``.

    torch's global RNG is the same afterwards as before: evaluating does not change what a
    training run draws next.
    """
    steps = check_int("steps", steps, low=1)
    seed = check_int("seed", seed, low=0, allow_none=True)
    recorder = None
    run: EnvBase = env
    if video is not None:
        recorder = VideoRecorder(video, env_indices=env_indices, tile=tile, fps=fps)
        run = TransformedEnv(env, recorder)
    try:
        # On a fork of torch's global RNG: simulators that draw from it (VMAS's resets) and
        # sampling policies leave the training's random stream as it was.
        with torch.random.fork_rng(devices=[]), torch.no_grad(), set_exploration(exploration):
            if seed is not None:
                # the wrapper that films has a random-action generator of its own: seed it too
                run.set_seed(seed)
                torch.random.default_generator.manual_seed(seed)  # CPU only: CUDA not forked
            rollout = run.rollout(steps, policy, break_when_any_done=False)
    finally:
        if recorder is not None:
            recorder.close()
    returns = {g: episode_returns(rollout, g) for g in reward_groups(rollout)}
    metrics = {f"{g}/episode_reward": float(r.mean()) for g, r in returns.items()}
    done = rollout.get(("next", "done")).reshape(rollout.shape)
    first = torch.where(done.any(-1), done.float().argmax(-1) + 1, torch.tensor(steps))
    metrics["episode_length"] = float(first.float().mean())
    won = _first_episode_won(rollout, done)
    if won is not None:
        metrics[WON] = float(won.float().mean())
    path = recorder.paths[-1] if recorder is not None and recorder.paths else None
    return Evaluation(metrics, returns, path, int(rollout.shape[-1]))


def _won_flag(batch: TensorDictBase) -> torch.Tensor | None:
    """``("next", "won")`` as ``[*B, T]`` bool, or ``None`` where the env has no such flag.

    Raises:
        ValueError: a ``won`` that is not one flag per env and step.
    """
    key = (NEXT, WON)
    if key not in batch.keys(True, True):
        return None
    won = batch.get(key)
    if won.numel() != batch.numel():
        raise ValueError(
            f"('next', {WON!r}) must hold one flag per env and step, [*B, T, 1] = "
            f"{[*batch.shape, 1]}; got {list(won.shape)}"
        )
    return won.reshape(batch.shape).bool()


def _first_episode_won(rollout: TensorDictBase, done: torch.Tensor) -> torch.Tensor | None:
    """Whether each env's first episode in ``rollout`` ``[*B, T]`` was won: ``[*B]`` bool
    (``won`` at its first ``done``; ``False`` for an env that did not finish), or ``None``
    without a ``won`` flag."""
    won = _won_flag(rollout)
    if won is None:
        return None
    done = done.bool()
    before = done.long().cumsum(-1) - done.long()  # dones before each step
    return (won & done & (before == 0)).any(-1)


def episode_wins(batch: TensorDictBase) -> dict[str, float]:
    """The win rate of the episodes that ended in a collector batch ``[*B, T]``: ``{"won":
    the mean of ("next", "won") over the steps with ("next", "done")}``; ``{}`` for an env
    without a root ``won`` flag or a batch in which no episode ended (as
    :func:`~marlkit.train.episodes.episode_metrics` leaves out the rewards then).

    Raises:
        KeyError: a ``won`` flag but no ``("next", "done")``.
        ValueError: a ``won`` that is not ``[*B, T, 1]``.
    """
    won = _won_flag(batch)
    if won is None:
        return {}
    if (NEXT, DONE) not in batch.keys(True, True):
        raise KeyError("the batch has no ('next', 'done') [*B, T, 1] to end its episodes")
    done = batch.get((NEXT, DONE)).reshape(batch.shape).bool()
    if not bool(done.any()):
        return {}
    return {WON: float(won[done].float().mean())}


def _filmed_envs(env: EnvBase, video_envs: int | None) -> list[int] | str:
    """The ``env_indices`` that film the first ``video_envs`` envs of ``env`` (all of them
    when it has fewer); ``"all"`` for ``None``.

    Raises:
        TypeError: ``video_envs`` that is not an int (nor ``None``).
        ValueError: ``video_envs`` below 1.
    """
    count = check_int("video_envs", video_envs, low=1, allow_none=True)
    if count is None:
        return "all"
    return list(range(min(count, env.batch_size.numel())))


def summarise_run(
    run_dir: str | os.PathLike[str],
    env: EnvBase,
    policy: Policy,
    *,
    steps: int,
    rows: Sequence[Mapping[str, float]],
    video: bool = True,
    video_envs: int | None = None,
    fps: float = 30.0,
    info: Mapping[str, Any] | None = None,
    trained: Evaluation | None = None,
    seed: int | None = None,
    exploration: EvalExploration = "deterministic",
    trained_random: Evaluation | None = None,
) -> dict[str, Any]:
    """The end of a training run: the trained policy next to a random one, the training curve.

    Evaluates ``policy`` (in ``exploration``'s first mode, filmed into ``run_dir/rollout.mp4``
    with every env of ``env`` tiled when ``video``) and a random policy on ``env``, draws each
    group's mean episode reward over the frames from the logged ``rows`` into
    ``run_dir/reward.png``, and writes ``run_dir/summary.json``.

    Args:
        run_dir: the run's folder.
        env: the evaluation env (at most 64 envs when filmed).
        policy: the trained policy.
        steps: evaluation rollout length (the episode length).
        rows: the metrics logged so far (``CSVLogger.rows()``), with ``"frames"`` and
            ``"<group>/episode_reward"`` columns.
        video: film the trained policy.
        video_envs: film only the first this many envs (:func:`_filmed_envs`); the metrics
            cover every env.
        fps: the video's frames per second.
        info: more entries for the summary (the algorithm, the env, the frames, ...).
        trained: an evaluation of ``policy`` on ``env`` already made (a run's last iteration
            evaluates it): reported instead of a new rollout, and its video, when it has one,
            copied to ``rollout.mp4``. Without one (or filming but given one without a video),
            ``policy`` is evaluated here.
        seed: seed each evaluation with it (:func:`evaluate`): the trained and the random
            policy then play the same episodes (give ``trained`` only when it was evaluated
            with the same seed).
        exploration: how ``policy`` is evaluated (:data:`EvalExploration`):
            ``"deterministic"`` (its greedy or mean action), ``"random"`` (its own sampled or
            exploring actions: a policy that learned a stochastic strategy is judged by
            these), or ``"both"`` (``"trained"`` deterministic, ``"trained_random"`` sampled).
        trained_random: with ``"both"``, an evaluation of ``policy`` in ``"random"`` mode
            already made (as ``trained``).

    Returns:
        the summary: ``info``, ``"exploration"``, ``"trained"`` and ``"random"`` (each
        :attr:`Evaluation.metrics`; ``"random"`` is a uniformly random policy),
        ``"improvement"`` (trained minus random, per metric); with ``"both"``,
        ``"trained_random"`` and ``"improvement_random"`` too; ``"eval_episodes"`` (the
        episodes each evaluation averages: one per env of ``env``), ``"video"`` and ``"curve"``
        (paths or ``None``), ``"files"`` (the names of those of ``metrics.csv``,
        ``reward.png``, ``rollout.mp4`` and ``summary.json`` that describe this run: a video
        or curve an earlier run left in ``run_dir`` is not listed unless this call wrote it).
    """
    from marlkit.record.plot import plot_curves

    filmed = _filmed_envs(env, video_envs)  # checked before anything is written
    modes = eval_modes(exploration)
    seed = check_int("seed", seed, low=0, allow_none=True)
    folder = pathlib.Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    rollout = folder / "rollout.mp4"
    if trained is not None and video and trained.video is not None:
        shutil.copyfile(trained.video, rollout)
        trained = dataclasses.replace(trained, video=rollout)
    elif trained is None or video:
        trained = evaluate(
            env,
            policy,
            steps=steps,
            video=rollout if video else None,
            env_indices=filmed,
            tile=True,
            fps=fps,
            seed=seed,
            exploration=modes[0],
        )
    if len(modes) > 1 and trained_random is None:
        trained_random = evaluate(env, policy, steps=steps, exploration="random", seed=seed)
    random = evaluate(env, None, steps=steps, exploration="random", seed=seed)
    curves = list(dict.fromkeys(k for row in rows for k in row if _is_training_reward(k)))
    curve = None
    if curves and any("frames" in row for row in rows):
        curve = plot_curves(rows, folder / "reward.png", x="frames", y=curves, title="training")

    def improvement(metrics: Mapping[str, float]) -> dict[str, float]:
        return {
            k: v - random.metrics[k]
            for k, v in metrics.items()
            if k.endswith("episode_reward") and k in random.metrics
        }

    summary = {
        **dict(info or {}),
        "exploration": exploration,
        "trained": trained.metrics,
        "random": random.metrics,
        "improvement": improvement(trained.metrics),
    }
    if len(modes) > 1 and trained_random is not None:
        summary["trained_random"] = trained_random.metrics
        summary["improvement_random"] = improvement(trained_random.metrics)
    summary.update(
        {
            "eval_episodes": env.batch_size.numel(),  # one per env, for each policy
            "video": None if trained.video is None else str(trained.video),
            "curve": None if curve is None else str(curve),
        }
    )
    # what this summary describes: a rollout.mp4 or reward.png left in the folder by an
    # earlier run (resumed here without filming) is not this run's, so it is not listed
    current = {
        "metrics.csv": (folder / "metrics.csv").exists(),
        "reward.png": curve is not None,
        "rollout.mp4": trained.video == rollout,
    }
    summary["files"] = [*(n for n, written in current.items() if written), "summary.json"]
    (folder / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _is_training_reward(key: str) -> bool:
    return key.endswith("/episode_reward") and not key.startswith("eval/")
