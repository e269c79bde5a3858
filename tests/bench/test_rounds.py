"""marlkit.bench.rounds: the clock, alternating rounds, medians, and the command line and JSON
header every script of benchmarks/ shares."""

from __future__ import annotations

import argparse
import json

import pytest

from marlkit.bench import rounds


def test_time_steps_respects_minimums_and_deadline() -> None:
    calls = []
    out = rounds.time_steps(lambda: calls.append(1), min_seconds=0.0, min_steps=5, warmup=2)
    assert out["steps"] == 5 and len(calls) == 7
    # Past the deadline, stops as soon as min_steps are done.
    out = rounds.time_steps(lambda: None, min_seconds=10.0, min_steps=3, deadline=0.0)
    assert out["steps"] == 3


def test_seconds_per_call_counts_warmup_apart() -> None:
    calls = []
    seconds = rounds.seconds_per_call(lambda: calls.append(1), 0.0, min_calls=4, warmup=3)
    assert len(calls) == 7 and seconds > 0


def test_alternate_flips_the_order_every_round() -> None:
    order: list[str] = []
    measure = {name: (lambda name=name: order.append(name) or name) for name in "abc"}
    out = rounds.alternate(measure, 3)
    assert order == [*"abc", *"cba", *"abc"]
    assert out == {"a": ["a"] * 3, "b": ["b"] * 3, "c": ["c"] * 3}


def test_alternate_calls_times_each_side_per_round() -> None:
    calls = {"a": 0, "b": 0}

    def side(name: str) -> None:
        calls[name] += 1

    times = rounds.alternate_calls(
        {"a": lambda: side("a"), "b": lambda: side("b")}, 2, 0.0, min_calls=3, warmup=1
    )
    assert calls == {"a": 8, "b": 8}  # 2 rounds of 1 warm-up and 3 timed calls
    assert [len(t) for t in times.values()] == [2, 2] and min(times["a"]) > 0


def test_paired_alternates_which_side_goes_first() -> None:
    order: list[str] = []
    pairs = rounds.paired(lambda: order.append("a"), lambda: order.append("b"), min_pairs=3)
    assert order == [*"ab", *"ba", *"ab"]
    assert len(pairs) == 3 and all(a > 0 and b > 0 for a, b in pairs)


def test_ratio_and_summary_are_medians_of_per_round_ratios() -> None:
    times = {"slow": [2.0, 4.0, 9.0], "fast": [1.0, 1.0, 3.0]}
    assert rounds.ratio(times, "slow", "fast") == {"median": 3.0, "rounds": [2.0, 4.0, 3.0]}
    out = rounds.summary(times, "slow", "fast")
    assert out == {
        "slow_ms": 4000.0,
        "fast_ms": 1000.0,
        "ratio_slow_over_fast": 3.0,
        "ratio_rounds": [2.0, 4.0, 3.0],
    }


def test_timed_and_stopwatch() -> None:
    result, seconds = rounds.timed(lambda: 42)
    assert result == 42 and seconds >= 0
    watch = rounds.Stopwatch()
    inner = watch.wrap(lambda: sum(range(1000)))
    inner(), inner()
    assert watch.seconds > 0
    with pytest.raises(ZeroDivisionError):  # the time of a call that raises still counts
        watch.wrap(lambda: 1 / 0)()


def test_the_common_flags_are_spelled_the_same() -> None:
    parser = rounds.make_parser(
        "A benchmark.\n\nMore.", sections=["b", "a"], rounds=3, round_seconds=0.5, threads=1
    )
    args = parser.parse_args([])
    assert (args.only, args.rounds, args.round_seconds, args.threads) == (None, 3, 0.5, 1)
    args = parser.parse_args(
        ["--only", "a", "--only", "b", "--rounds", "2", "--round-seconds", "0", "--threads", "2"]
    )
    assert (args.only, args.rounds, args.round_seconds, args.threads) == (["a", "b"], 2, 0.0, 2)
    assert parser.description == "A benchmark."
    bare = rounds.make_parser("Bare.", threads_flag=False).parse_args([])
    assert vars(bare) == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "argument --rounds: must be a finite number > 0, got 0"),
        (["--round-seconds", "-1"], "argument --round-seconds: must be a finite number >= 0"),
        (["--threads", "two"], "argument --threads: expected an int, got 'two'"),
        (["--only", "c"], "argument --only: invalid choice: 'c'"),
    ],
)
def test_bad_common_flags_are_refused_naming_the_flag(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = rounds.make_parser("A benchmark.", sections=["a"], rounds=3, round_seconds=0.5)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_header_and_sections(capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(only=["b"], rounds=2)  # no --threads: start leaves threads be
    header = rounds.start("demo", args)
    assert set(header) == {"benchmark", "environment", "settings"}
    assert header["settings"] == {"only": ["b"], "rounds": 2}
    assert {"date", "torch", "torch_threads", "native_threads", "cpus"} <= set(
        header["environment"]
    )
    sections = {"a": lambda a: {"ran": "a"}, "b": lambda a: {"ran": "b", "rounds": a.rounds}}
    assert rounds.run_sections("demo", sections, args, extra={"note": 1}) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert data["benchmark"] == "demo" and data["note"] == 1
    assert data["b"] == {"ran": "b", "rounds": 2} and "a" not in data
    assert "load_average_end" in data["environment"]
    assert "b: done" in out.err
    assert rounds.finish({"environment": {}}, indent=None) == 0
    assert capsys.readouterr().out.count("\n") == 1  # one line
