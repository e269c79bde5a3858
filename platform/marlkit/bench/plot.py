"""The scaling plots: agent-steps/s against agents per env (log-log), and native's ratios
(:func:`plot_scaling`); for the sweep of any env, throughput, retained throughput and memory of
each sweep (:func:`plot_env_scaling`).

Drawn from the JSON of :meth:`marlkit.bench.ScalingReport.to_dict` (and
:meth:`~marlkit.bench.env_scaling.EnvScalingReport.to_dict`), so a saved ``scaling.json`` can be
plotted again. Needs matplotlib (``pip install 'marlkit[bench]'``), imported on first use
and driven without pyplot (no display, no global state).
"""

from __future__ import annotations

import pathlib
from typing import Any

from marlkit._utils import import_optional

__all__ = ["BACKEND_STYLE", "plot_env_scaling", "plot_scaling"]

#: Colour and marker of each backend's line.
BACKEND_STYLE: dict[str, tuple[str, str]] = {
    "native": ("tab:blue", "o"),
    "torch": ("tab:green", "s"),
    "vmas": ("tab:red", "^"),
}


def _subtitle(data: dict[str, Any]) -> str:
    env = data.get("environment", {})
    sizing = (
        f"{data['envs']} envs per cell"
        if data.get("mode") == "fixed_envs"
        else f"envs x agents ~= {data.get('total_agents'):,}"
    )
    date = str(env.get("date", ""))[:10]
    work = data.get("settings", {}).get("work")
    return (
        f"{data.get('scenario')}: {sizing}; {date}, {env.get('cpus')} cpus, "
        f"torch {env.get('torch')} ({env.get('torch_threads')} threads)"
        + (f"; native work: {work}" if work else "")
    )


def _agents_axis(ax: Any, agents: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(agents, [str(a) for a in agents])
    ticker = import_optional("matplotlib.ticker", extra="bench")
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlabel("agents per env")


def _throughput_panel(ax: Any, data: dict[str, Any]) -> None:
    for backend in data["backends"]:
        color, marker = BACKEND_STYLE.get(backend, ("tab:gray", "x"))
        cells = [c for c in data["cells"] if c["backend"] == backend]
        ok = [c for c in cells if c["status"] == "ok"]
        skipped = [str(c["agents"]) for c in cells if c["status"] != "ok"]
        label = f"{backend} (skipped at {', '.join(skipped)})" if skipped else backend
        ax.plot(  # with no measured cell, an empty line still names the backend in the legend
            [c["agents"] for c in ok],
            [c["agent_steps_per_s"] for c in ok],
            color=color,
            marker=marker,
            label=label,
        )
        estimated = [c for c in cells if c["estimated_agent_steps_per_s"]]
        if estimated:
            ax.scatter(
                [c["agents"] for c in estimated],
                [c["estimated_agent_steps_per_s"] for c in estimated],
                facecolors="none",
                edgecolors=color,
                marker=marker,
                label=f"{backend}: skipped, estimated from one step",
            )
    _agents_axis(ax, data["agents"])
    measured = any(c["status"] == "ok" or c["estimated_agent_steps_per_s"] for c in data["cells"])
    if measured:  # a log axis with no positive point cannot be drawn
        ax.set_yscale("log")
    else:
        ax.text(
            0.5,
            0.5,
            "every cell skipped (reasons in the JSON and the table)",
            ha="center",
            va="center",
            transform=ax.transAxes,
        )
    ax.set_ylabel("agent-steps/s")
    ax.set_title("throughput")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)


def _ratio_panel(ax: Any, data: dict[str, Any]) -> None:
    drawn = False
    for key in [k for k in (data["ratios"][0] if data["ratios"] else {}) if "_over_" in k]:
        peer = key.split("_over_", 1)[1]
        color, marker = BACKEND_STYLE.get(peer, ("tab:gray", "x"))
        points = [(r["agents"], r[key]) for r in data["ratios"] if r[key]]
        if not points:
            continue
        xs, ys = zip(*points)
        ax.plot(xs, ys, color=color, marker=marker, label=key.replace("_over_", " / "))
        for x, y in points:
            ax.annotate(
                f"{y:.0f}x" if y >= 10 else f"{y:.2g}x",
                (x, y),
                fontsize=8,
                textcoords="offset points",
                xytext=(4, 4),
            )
        drawn = True
    natives = {
        c["agents"]: c["agent_steps_per_s"]
        for c in data["cells"]
        if c["backend"] == "native" and c["status"] == "ok"
    }
    if 16 in natives and len(natives) > 1:
        counts = sorted(natives)
        ax.plot(
            counts,
            [natives[x] / natives[16] for x in counts],
            color="tab:blue",
            linestyle="--",
            marker="o",
            label="native / native at 16 agents",
        )
        drawn = True
    for t in data.get("targets", []):
        at = t["numerator"][1]
        if at in data["agents"]:  # a target outside the sweep would only stretch the axis
            ax.scatter([at], [t["threshold"]], marker="_", s=300, color="black")
            ax.annotate(
                f"target {t['threshold']:g}",
                (at, t["threshold"]),
                fontsize=7,
                textcoords="offset points",
                xytext=(-20, -10),
            )
    ax.axhline(1.0, color="gray", linewidth=0.8)
    _agents_axis(ax, data["agents"])
    ax.set_yscale("log")
    ax.set_ylabel("ratio")
    ax.set_title("ratios (black bars: the issue's targets)")
    ax.grid(True, which="both", alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)


def plot_scaling(data: dict[str, Any], path: str | pathlib.Path) -> pathlib.Path:
    """Draw ``data`` (the scaling JSON) as a two-panel PNG at ``path``; returns the path."""
    import_optional("matplotlib", extra="bench", purpose="the scaling plot")
    figure_mod = import_optional("matplotlib.figure", extra="bench")
    fig = figure_mod.Figure(figsize=(11, 4.5), layout="constrained")
    left, right = fig.subplots(1, 2)
    _throughput_panel(left, data)
    _ratio_panel(right, data)
    fig.suptitle(_subtitle(data), fontsize=10)
    path = pathlib.Path(path)
    fig.savefig(path, dpi=110)
    return path


#: Colours of the sweeps of :func:`plot_env_scaling`, in order.
_SWEEP_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")


def _sweep_points(data: dict[str, Any], sweep: dict[str, Any], key: str) -> list[tuple[Any, ...]]:
    """``(agents, figure, value)`` of the sweep's measured cells with a figure under ``key``."""
    return [
        (c["agents"], c[key], c["value"])
        for c in data["cells"]
        if (c["env"], c["param"]) == (sweep["env"], sweep["param"])
        and c["status"] == "ok"
        and c.get(key)
    ]


def plot_env_scaling(data: dict[str, Any], path: str | pathlib.Path) -> pathlib.Path:
    """Draw the JSON of a sweep of any env (``mode: env``) as a three-panel PNG at ``path``:
    agent-steps/s, throughput retained from each sweep's smallest cell, and peak memory, all
    against agents per env (log axes), one line per sweep, each point labelled with its value
    of the swept parameter. Returns the path."""
    import_optional("matplotlib", extra="bench", purpose="the scaling plot")
    figure_mod = import_optional("matplotlib.figure", extra="bench")
    fig = figure_mod.Figure(figsize=(15, 4.8), layout="constrained")
    rate_ax, kept_ax, mem_ax = fig.subplots(1, 3)
    for i, sweep in enumerate(data["sweeps"]):
        colour = _SWEEP_COLOURS[i % len(_SWEEP_COLOURS)]
        label = f"{sweep['env']} ({sweep['param']})"
        skipped = [
            f"{c['param']}={c['value']}"
            for c in data["cells"]
            if (c["env"], c["param"]) == (sweep["env"], sweep["param"]) and c["status"] != "ok"
        ]
        if skipped:
            label += f"; not measured: {', '.join(skipped)}"
        rates = _sweep_points(data, sweep, "agent_steps_per_s")
        if rates:
            xs, ys, _ = zip(*rates)
            rate_ax.plot(xs, ys, color=colour, marker="o", label=label)
            for x, y, v in rates:
                rate_ax.annotate(
                    str(v), (x, y), fontsize=7, textcoords="offset points", xytext=(3, 4)
                )
        kept = [(r["agents"], r["retained"]) for r in sweep.get("retained", [])]
        if kept:
            kept_ax.plot(*zip(*kept), color=colour, marker="o", label=sweep["env"])
            for x, y in kept:
                kept_ax.annotate(
                    f"{y:.0%}", (x, y), fontsize=7, textcoords="offset points", xytext=(3, 4)
                )
        memory = _sweep_points(data, sweep, "peak_rss_mb")
        if memory:
            xs, ys, _ = zip(*memory)
            mem_ax.plot(xs, ys, color=colour, marker="o", label=sweep["env"])
    for ax in (rate_ax, kept_ax, mem_ax):
        ax.set_xscale("log")
        ax.set_xlabel("agents per env (counted from the built env)")
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
            if ax is not mem_ax:  # memory starts at the interpreter's: a linear axis reads it
                ax.set_yscale("log")
    rate_ax.set_ylabel("agent-steps/s")
    rate_ax.set_title("throughput (points: the swept value)", fontsize=10)
    kept_ax.axhline(1.0, color="gray", linewidth=0.8)
    kept_ax.set_ylabel("agent-steps/s / the sweep's smallest cell's")
    kept_ax.set_title("retained throughput", fontsize=10)
    mem_ax.set_ylabel("peak resident memory of the cell's process (MiB)")
    mem_ax.set_title("memory", fontsize=10)
    env = data.get("environment", {})
    fig.suptitle(
        f"scaling of any env: {data.get('envs')} env(s) per cell; {str(env.get('date', ''))[:10]}, "
        f"{env.get('cpus')} cpus, torch {env.get('torch')} ({env.get('torch_threads')} threads)",
        fontsize=10,
    )
    path = pathlib.Path(path)
    fig.savefig(path, dpi=110)
    return path
