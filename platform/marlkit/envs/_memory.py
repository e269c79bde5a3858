"""How much memory a batch of envs needs, and the refusal of one that would not fit.

An env of the batch holds, at its peak while the batch is made, reset and stepped, several times
what its specs hold (each spec leaf's elements times its dtype's size: the observations, actions,
rewards, flags and state one env exchanges): a reset's output and a step's, the ``"next"`` half,
the simulator's own state, the temporaries of its physics. Measured on CPU (peak resident memory
per env, made, reset and stepped three times; 200,000 envs of the native scenarios, 20,000 of
VMAS scenarios), that multiple was 5.5 (navigation on the C++ kernels), 6.1 (swarm), 6.9
(predator_prey), 8.4 (navigation on the torch twin), 7.7 to 33 (VMAS transport, simple_spread,
balance, navigation, discovery). :data:`SPEC_FACTOR` is below every one of them, with room for
the noise of such measurements and for other allocators, so an estimate ``SPEC_FACTOR * spec
bytes per env * num_envs`` is at most what the batch takes: a batch refused on it would not have
fit (simulators that hold more than their specs say, such as the native scenarios' torch twins
with their dense ``[N, N]`` pair tensors, add their own terms).

:func:`check_batch_memory` compares an estimate with the memory available on the env's device
(Linux's ``MemAvailable`` on cpu, the free memory of a CUDA device) and refuses, with a
``ValueError`` like every bad value, a batch that would not fit: the message names the count, the
estimate, what is available and the most envs that fit. Where the available memory is not known
(another OS, another device), nothing is refused.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable
from typing import Any

import torch

from marlkit.data.keys import DONE_KEYS
from marlkit.envs.common import EnvBase

__all__ = [
    "PROBE_ENVS",
    "SPEC_FACTOR",
    "available_memory",
    "check_batch_memory",
    "check_on_probe",
    "format_bytes",
    "reward_done_bytes",
    "spec_bytes_per_env",
]

#: Peak bytes of an env over the bytes its specs hold: at most this much (see the module notes).
SPEC_FACTOR = 4
#: Batches of more envs than this are sized on a probe before they are made, where the
#: simulator cannot tell its size without building one; up to this many, making the batch
#: costs about what a probe would.
PROBE_ENVS = 64

_MEMINFO = pathlib.Path("/proc/meminfo")
_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB")


def format_bytes(count: float) -> str:
    """``count`` bytes in binary units, e.g. ``"1.5 GiB"``, ``"100 bytes"``."""
    value, unit = float(count), 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value, unit = value / 1024, unit + 1
    return f"{value:.0f} bytes" if unit == 0 else f"{value:.1f} {_UNITS[unit]}"


def _meminfo_available() -> int | None:
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available_memory(device: str | torch.device = "cpu") -> int | None:
    """The bytes that tensors on ``device`` could take now, or None where that is not known.

    cpu: what the kernel could give this process (Linux's ``MemAvailable``); cuda: the device's
    free memory (:func:`torch.cuda.mem_get_info`); other devices, and what is not a device (the
    env reports it), None.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        return None
    if device.type == "cpu":
        return _meminfo_available()
    if device.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return None


def spec_bytes_per_env(env: EnvBase) -> float:
    """The bytes ``env``'s specs (observation, action, reward, done, state) hold per env of its
    batch: each leaf's elements times its dtype's size, over the batch's envs."""
    specs = (env.observation_spec, env.action_spec, env.reward_spec, env.done_spec, env.state_spec)
    total = sum(
        leaf.shape.numel() * leaf.dtype.itemsize
        for spec in specs
        for leaf in spec.values(True, True)
    )
    return total / max(env.batch_size.numel(), 1)


def reward_done_bytes(n_agents: int) -> int:
    """The bytes per env of :func:`~marlkit.envs.make_reward_spec` and
    :func:`~marlkit.envs.make_done_spec` for ``n_agents`` agents (the root flags included): a
    float32 reward and the bool flags per agent, the flags once more at the root."""
    flags = len(DONE_KEYS) * torch.bool.itemsize
    return n_agents * (torch.float32.itemsize + flags) + flags


def check_on_probe(
    owner: str,
    num_envs: int,
    make_probe: Callable[[], EnvBase],
    *,
    own_bytes: Callable[[Any], float] | None = None,
    device: str | torch.device | None = None,
    count: str = "num_envs",
) -> None:
    """Refuse a batch of ``num_envs`` envs of a simulator that cannot tell its size without
    being built: above :data:`PROBE_ENVS` envs, ``make_probe()`` builds one env of it, whose
    spec bytes (times :data:`SPEC_FACTOR`), plus ``own_bytes(probe)`` when given (what the
    simulator holds per env besides), size the batch (:func:`check_batch_memory`); the probe is
    closed afterwards.

    Args:
        device: where the batch will live, when known before the probe: where the memory
            available there is not known, no probe is built.

    Raises:
        ValueError: as :func:`check_batch_memory`.
    """
    if num_envs <= PROBE_ENVS or (device is not None and available_memory(device) is None):
        return
    probe = make_probe()
    try:
        where, spec = probe.device, spec_bytes_per_env(probe)
        own = 0.0 if own_bytes is None else float(own_bytes(probe))
    finally:
        probe.close()
    basis = f"{SPEC_FACTOR} x the {spec:,.0f} bytes its specs hold"
    if own:
        basis += f", and {format_bytes(own)} of the simulator's own"
    basis += ", measured on one env"
    check_batch_memory(owner, num_envs, SPEC_FACTOR * spec + own, where, basis=basis, count=count)


def check_batch_memory(
    owner: str,
    num_envs: int,
    bytes_per_env: float,
    device: str | torch.device = "cpu",
    *,
    basis: str = "",
    count: str = "num_envs",
) -> None:
    """Refuse a batch of ``num_envs`` envs of ``bytes_per_env`` each that would not fit in the
    memory available on ``device`` (:func:`available_memory`).

    Args:
        owner: what is being made, e.g. ``"NavigationEnv(n_agents=4)"``.
        basis: how ``bytes_per_env`` was found, for the message.
        count: the name of the argument that gave ``num_envs`` (``"--envs"`` on the command
            line).

    Raises:
        ValueError: the estimate exceeds the available memory; the message names ``count``, the
            estimate, the memory available and the most envs that fit.
    """
    available = available_memory(device)
    need = bytes_per_env * num_envs
    if available is None or need <= available:
        return
    fit = math.floor(available / bytes_per_env)  # need > available >= 0: bytes_per_env > 0
    place = "" if torch.device(device).type == "cpu" else f" on {device}"
    how = f": {basis}" if basis else ""
    advice = f"at most {fit:,} envs fit" if fit else "not even one env fits"
    raise ValueError(
        f"{owner} with {count}={num_envs} would need at least about {format_bytes(need)} "
        f"({format_bytes(bytes_per_env)} per env{how}), more than the {format_bytes(available)} "
        f"available{place}: {advice}"
    )
