"""``check_env_specs``: run a real short rollout and compare every entry with its spec."""

from __future__ import annotations

import re

from tensordict import TensorDictBase

from marlkit.data.composite import Composite
from marlkit.data.keys import DONE, NEXT, NestedKey
from marlkit.envs.common import EnvBase

__all__ = ["SpecCheckError", "check_env_specs", "spec_problems"]


class SpecCheckError(AssertionError):
    """The data an env produced disagrees with its specs; the message lists every key."""


# The element a spec's explanation points at: "... at index [i, j, ...] ...".
_AT_INDEX = re.compile(r"at index \[([0-9, ]*)\]")


def _whose(env: EnvBase, path: tuple[str, ...], reason: str) -> str:
    """The suffix " (env e, agent 'name')" for a group entry whose explanation names an element."""
    agents = env.group_map.get(path[0]) if len(path) > 1 else None
    found = _AT_INDEX.search(reason)
    if not agents or found is None:
        return ""
    index = [int(i) for i in found.group(1).split(",") if i.strip()]
    b = len(env.batch_size)
    if len(index) <= b or index[b] >= len(agents):
        return ""
    where = f"env {index[0] if b == 1 else index[:b]}, " if b else ""
    return f" ({where}agent {agents[index[b]]!r})"


def _check(
    env: EnvBase,
    where: str,
    td: TensorDictBase,
    spec: Composite,
    problems: list[str],
    prefix: tuple[str, ...] = (),
) -> None:
    for key, reason in spec.explain(td):
        path = (key,) if isinstance(key, str) else key
        full: NestedKey = (*prefix, *path) if prefix else key
        problems.append(f"{where}: {full!r}: {reason}{_whose(env, path, reason)}")


def spec_problems(env: EnvBase, *, steps: int = 5, seed: int | None = 0) -> list[str]:
    """Every disagreement between ``env``'s data and its specs over a short random rollout.

    Checks the reset output (observations, state, done flags), then, at each step, the actions
    written by the random policy, the ``"next"`` observations, state, rewards and done flags,
    entries that appear in the data but in no spec, and the output of the partial resets that
    follow done steps.
    """
    if seed is not None:
        env.set_seed(seed)
    problems: list[str] = []
    td = env.reset()
    outputs = Composite(shape=env.batch_size, device=env.device)
    for composite in (env.observation_spec, env.state_spec, env.done_spec):
        outputs.update(composite)
    _check(env, "reset", td, outputs, problems)
    known = set(outputs.keys(True, True))
    for key in td.keys(True, True):
        if key not in known:
            problems.append(f"reset: {key!r}: present in the data but absent from every spec")
    next_spec = outputs.clone().update(env.reward_spec)
    next_known = set(next_spec.keys(True, True))
    for t in range(steps):
        td = env.rand_action(td)
        _check(env, f"step {t} input", td, env.action_spec, problems)
        td, root = env.step_and_maybe_reset(td)
        _check(env, f"step {t}", td.get(NEXT), next_spec, problems, (NEXT,))
        for key in td.get(NEXT).keys(True, True):
            if key not in next_known:
                path = (key,) if isinstance(key, str) else key
                problems.append(
                    f"step {t}: {(NEXT, *path)!r}: present in the data but absent from every spec"
                )
        if bool(td.get((NEXT, DONE)).any()):  # done envs were reset: check what they report
            _check(env, f"step {t} reset", root, outputs, problems)
        td = root
    return problems


def check_env_specs(env: EnvBase, *, steps: int = 5, seed: int | None = 0) -> None:
    """Run a short random rollout on ``env`` and raise if any entry disagrees with its spec.

    Raises:
        SpecCheckError: listing every ``(moment, key, reason)`` found, not only the first.
    """
    problems = spec_problems(env, steps=steps, seed=seed)
    if problems:
        listing = "\n  ".join(problems)
        raise SpecCheckError(
            f"{type(env).__name__}: {len(problems)} disagreement(s) between data and specs:\n  "
            f"{listing}"
        )
