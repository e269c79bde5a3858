"""AdditiveGaussian, StateActionValueCritic and TanhBounds."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from marlkit.data.exploration import set_exploration
from marlkit.modules import AdditiveGaussian, StateActionValueCritic, TanhBounds


def group_td(obs: int = 5, act: int = 2, n: int = 3, b: int = 64) -> TensorDict:
    agents = TensorDict(
        {"observation": torch.randn(b, n, obs), "action": torch.zeros(b, n, act)}, [b, n]
    )
    return TensorDict({"agents": agents}, [b])


def test_tanh_bounds_maps_into_the_box():
    low, high = torch.tensor([[-1.0, 0.0]]), torch.tensor([[1.0, 4.0]])
    squash = TanhBounds(low, high)
    y = squash(torch.tensor([[[-50.0, -50.0], [0.0, 0.0], [50.0, 50.0]]]))
    torch.testing.assert_close(y[0], torch.tensor([[-1.0, 0.0], [0.0, 2.0], [1.0, 4.0]]))
    with pytest.raises(ValueError, match="need low < high"):
        TanhBounds(1.0, 1.0)
    with pytest.raises(ValueError, match="must be finite"):
        TanhBounds(float("-inf"), 1.0)


def test_additive_gaussian_explores_only_while_collecting_and_anneals_exactly():
    noise = AdditiveGaussian(-1.0, 1.0, sigma_init=0.5, sigma_end=0.0, annealing_num_steps=100)
    td = group_td()
    with set_exploration("deterministic"):
        assert (noise(td.clone())["agents", "action"] == 0).all()
    noisy = noise(td.clone())["agents", "action"]  # "random" outside any block
    assert noisy.abs().max() <= 1.0 and 0.3 < noisy.std() < 0.7
    for _ in range(7):
        noise.step(30)
    assert float(noise.sigma) == 0.0 and int(noise.steps_done) == 210
    assert (noise(td.clone())["agents", "action"] == 0).all()
    other = AdditiveGaussian(-1.0, 1.0, sigma_init=0.5, sigma_end=0.0, annealing_num_steps=100)
    other.load_state_dict(noise.state_dict())
    assert float(other.sigma) == 0.0


def test_additive_gaussian_clamps_and_checks():
    noise = AdditiveGaussian(-0.1, 0.1, sigma_init=10.0)
    out = noise(group_td())["agents", "action"]
    assert out.min() >= -0.1 and out.max() <= 0.1 and (out.abs() == 0.1).any()
    with pytest.raises(
        ValueError, match=r"AdditiveGaussian: sigma_init must be a finite number >= 0, got -1\.0"
    ):
        AdditiveGaussian(-1.0, 1.0, sigma_init=-1.0)
    with pytest.raises(ValueError, match="annealing_num_steps must be an int >= 1"):
        AdditiveGaussian(-1.0, 1.0, annealing_num_steps=0)
    with pytest.raises(KeyError, match="prey"):
        AdditiveGaussian(-1.0, 1.0, action_key=("prey", "action"))(group_td())


@pytest.mark.parametrize("centralised", [False, True])
def test_state_action_value_critic(centralised):
    critic = StateActionValueCritic(3, 5, 2, centralised=centralised, num_cells=16)
    td = critic(group_td(b=4))
    value = td["agents", "state_action_value"]
    assert value.shape == (4, 3, 1)
    # A local critic's value of agent 0 ignores agent 1's action; a centralised one does not.
    moved = group_td(b=4)
    moved["agents", "observation"] = td["agents", "observation"]
    moved["agents", "action"][:, 1] = 1.0
    changed = critic(moved)["agents", "state_action_value"][:, 0]
    assert torch.allclose(changed, value[:, 0]) != centralised
    bad = group_td(act=3, b=4)
    with pytest.raises(ValueError, match=r"expected actions \[\*B, n, 2\]"):
        critic(bad)


def test_env_batched_bounds_are_refused() -> None:
    from marlkit.modules import TanhBounds

    low, high = -torch.ones(4, 3, 2), torch.ones(4, 3, 2)  # a batch of 4 envs' spec bounds
    with pytest.raises(ValueError, match=r"broadcast to one env's \[n_agents, act_dim\]"):
        TanhBounds(low, high)
    TanhBounds(low[0], high[0])


def test_additive_gaussian_names_an_action_that_does_not_fit() -> None:
    noise = AdditiveGaussian(torch.full((3, 2), -1.0), torch.full((3, 2), 1.0))
    wrong_size = TensorDict({("agents", "action"): torch.zeros(5, 3, 3)}, [5])
    with set_exploration("random"):
        # torch's "The size of tensor a (3) must match the size of tensor b (2)" before
        with pytest.raises(ValueError, match=r"of shape \[5, 3, 3\] does not fit the bounds of"):
            noise(wrong_size)
        discrete = TensorDict({("agents", "action"): torch.zeros(5, 3, 2, dtype=torch.long)}, [5])
        with pytest.raises(
            ValueError, match=r"must be continuous \(a float tensor\), got torch.int64"
        ):
            noise(discrete)
