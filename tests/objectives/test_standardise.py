"""``marlkit.objectives.standardise``: EPyMARL's running reward statistics and the standardiser
the Q-learning scripts put before their losses (``loss.standardise_rewards``)."""

from __future__ import annotations

import doctest

import pytest
import torch
from tensordict import TensorDict

import marlkit.objectives.standardise as standardise_module
from marlkit.objectives.standardise import RewardStandardiser, RunningMeanStd

REWARD = ("next", "agents", "reward")


def _epymarl_update(mean, var, count, batch):
    """EPyMARL's ``RunningMeanStd.update`` (components/standarize_stream.py), as written there."""
    arr = batch.reshape(-1, batch.size(-1))
    batch_mean, batch_var, n = arr.mean(0), arr.var(0), arr.shape[0]
    delta = batch_mean - mean
    tot = count + n
    m2 = var * count + batch_var * n + delta.square() * count * n / (count + n)
    return mean + delta * n / tot, m2 / tot, tot


def test_the_statistics_are_epymarls_batch_after_batch():
    torch.manual_seed(0)
    stats = RunningMeanStd()
    mean, var, count = torch.zeros(1), torch.ones(1), 1e-4
    for size in (7, 1600, 3, 50):
        batch = torch.randn(size, 2, 1) * 3 + 1  # [N, n_agents, 1]: the agents pooled
        stats.update(batch)
        mean, var, count = _epymarl_update(mean, var, count, batch)
        torch.testing.assert_close(stats.mean, mean)
        torch.testing.assert_close(stats.var, var)
        assert float(stats.count) == pytest.approx(count)


def test_merged_batches_give_the_moments_of_all_values():
    torch.manual_seed(1)
    values = torch.rand(3000, 1) * 5
    stats = RunningMeanStd(epsilon=1e-8)
    for chunk in values.split(700):
        stats.update(chunk)
    torch.testing.assert_close(stats.mean, values.mean(0), rtol=1e-5, atol=1e-6)
    # each batch's variance is the unbiased one (EPyMARL's torch.var): 1/700 above the whole's
    torch.testing.assert_close(stats.var, values.var(0, correction=0), rtol=3e-3, atol=1e-5)
    z = stats.normalise(values)
    assert abs(float(z.mean())) < 1e-4 and float(z.std()) == pytest.approx(1.0, rel=3e-3)


def test_a_rare_reward_becomes_large_as_epymarls_does():
    """LBF's case: one rewarded step among thousands of zeros is standardised far above 1."""
    stats = RunningMeanStd()
    for _ in range(20):
        stats.update(torch.zeros(1600, 1))
    rewards = torch.zeros(1600, 1)
    rewards[0] = 0.5
    stats.update(rewards)
    assert float(stats.normalise(torch.tensor([[0.5]]))) > 50.0


def test_state_dict_carries_the_statistics():
    stats = RunningMeanStd()
    stats.update(torch.tensor([[1.0], [2.0], [4.0]]))
    again = RunningMeanStd()
    again.load_state_dict(stats.state_dict())
    for name in ("mean", "var", "count"):
        assert torch.equal(getattr(again, name), getattr(stats, name)), name
    assert again.count.dtype == torch.float64


def test_bad_values_are_refused_naming_what_was_wrong():
    stats = RunningMeanStd()
    with pytest.raises(TypeError, match=r"floating-point tensor, got torch\.int64"):
        stats.update(torch.ones(3, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"\[N, \.\.\., 1\] \(trailing \(1,\)\), got \(3, 2\)"):
        stats.update(torch.ones(3, 2))
    with pytest.raises(ValueError, match="NaN or infinite"):
        stats.update(torch.tensor([[1.0], [float("nan")]]))
    with pytest.raises(ValueError, match="is empty"):
        stats.update(torch.ones(0, 1))
    with pytest.raises(ValueError, match=r"epsilon must be a finite number > 0, got 0\.0"):
        RunningMeanStd(epsilon=0.0)
    with pytest.raises(ValueError, match="shape must have positive entries"):
        RunningMeanStd(shape=(0,))
    assert float(stats.count) == pytest.approx(1e-4)  # nothing merged by the refused calls


def test_the_standardiser_leaves_its_input_and_other_entries_alone():
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0]).reshape(4, 1, 1).expand(4, 2, 1).clone()
    td = TensorDict(
        {REWARD: rewards, ("agents", "observation"): torch.ones(4, 2, 3)}, batch_size=[4]
    )
    standardise = RewardStandardiser([REWARD, ("next", "reward")])  # no root reward here
    out = standardise(td)
    assert torch.equal(td[REWARD], rewards)  # the buffer's sample is not changed
    assert out["agents", "observation"] is td["agents", "observation"]
    expected = (rewards - 0.5) / standardise.stats.var.sqrt()
    torch.testing.assert_close(out[REWARD], expected, rtol=1e-4, atol=1e-4)
    assert float(standardise.stats.count) == pytest.approx(8 + 1e-4)  # both agents pooled


def test_the_standardiser_refuses_a_batch_without_its_rewards():
    with pytest.raises(ValueError, match="at least one reward entry"):
        RewardStandardiser([])
    standardise = RewardStandardiser([REWARD])
    td = TensorDict({("next", "agents", "rew"): torch.zeros(2, 1, 1)}, batch_size=[2])
    with pytest.raises(KeyError, match=r"none of the reward entries .*reward.*it has .*rew"):
        standardise(td)
    bad = TensorDict({REWARD: torch.zeros(2, 1, 3)}, batch_size=[2])
    with pytest.raises(ValueError, match=r"\('next', 'agents', 'reward'\) must have shape"):
        standardise(bad)


def test_the_examples_run():
    result = doctest.testmod(standardise_module, raise_on_error=False, verbose=False)
    assert result.attempted >= 2 and result.failed == 0, result


def test_a_seed_stack_keeps_each_seeds_statistics_as_its_own_standardiser():
    """Seed k of a SeedRewardStandardiser standardises as a lone RewardStandardiser fed only
    seed k's rewards, batch after batch, and saves/loads in that one's layout."""
    from marlkit.objectives.standardise import SeedRewardStandardiser

    key = ("next", "agents", "reward")
    torch.manual_seed(0)
    stack = SeedRewardStandardiser([key], n_seeds=3)
    alone = [RewardStandardiser([key]) for _ in range(3)]
    for step in range(4):
        scales = torch.tensor([1.0, 10.0, 0.01]).view(3, 1, 1, 1)
        rewards = torch.randn(3, 8, 2, 1) * scales + step
        out = stack(TensorDict({key: rewards}, [3, 8]))[key]
        for k in range(3):
            own = alone[k](TensorDict({key: rewards[k]}, [8]))[key]
            torch.testing.assert_close(out[k], own, rtol=1e-5, atol=1e-6)
    for k in range(3):
        mine = stack.seed_state_dict(k)
        theirs = alone[k].state_dict()
        assert sorted(mine) == sorted(theirs)
        for name in mine:
            torch.testing.assert_close(mine[name], theirs[name].to(mine[name].dtype))
    fresh = SeedRewardStandardiser([key], n_seeds=3)
    fresh.load_seed_state_dict(1, alone[1].state_dict())
    assert torch.equal(fresh.mean[1], stack.mean[1]) and float(fresh.count[0]) == 1e-4


def test_a_seed_stack_names_what_is_wrong_with_a_batch():
    from marlkit.objectives.standardise import SeedRewardStandardiser

    key = ("next", "agents", "reward")
    stack = SeedRewardStandardiser([key], n_seeds=2)
    with pytest.raises(
        ValueError, match=r"must have shape \[2 seeds, \.\.\., 1\], got \(3, 4, 1\)"
    ):
        stack(TensorDict({key: torch.zeros(3, 4, 1)}, [3]))
    with pytest.raises(ValueError, match="NaN or infinite"):
        stack(TensorDict({key: torch.full((2, 4, 1), float("nan"))}, [2]))
    with pytest.raises(TypeError, match="floating-point"):
        stack(TensorDict({key: torch.zeros(2, 4, 1, dtype=torch.int64)}, [2]))
    with pytest.raises(KeyError, match="none of the reward entries"):
        stack(TensorDict({"other": torch.zeros(2, 1)}, [2]))
    with pytest.raises(ValueError, match="n_seeds must be an int >= 1"):
        SeedRewardStandardiser([key], n_seeds=0)
    with pytest.raises(KeyError, match=r"stats\.var"):
        stack.load_seed_state_dict(0, {"stats.mean": torch.zeros(1), "stats.count": 1.0})
    assert float(stack.count[0]) == pytest.approx(1e-4)  # nothing was merged by the bad ones
