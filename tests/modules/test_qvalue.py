"""QValueActor and EGreedy: greedy actions honour masks, exploration only in "random" mode."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from marlkit.data.exploration import set_exploration
from marlkit.data.specs import Categorical, OneHot
from marlkit.modules import EGreedy, QValueActor, annealing_steps


class _Fixed(torch.nn.Module):
    """Action values read from the observation itself (obs_dim == n_actions)."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs * 1.0


def _td(obs: torch.Tensor, mask: torch.Tensor | None = None, group: str = "agents") -> TensorDict:
    lead = obs.shape[:-1]
    inner = {"observation": obs}
    if mask is not None:
        inner["action_mask"] = mask
    return TensorDict({group: TensorDict(inner, lead)}, lead[:-1])


def test_greedy_action_value_and_chosen_value() -> None:
    obs = torch.tensor([[[0.0, 3.0, 1.0], [5.0, -1.0, 2.0]]])  # [1, 2, 3]
    out = QValueActor(_Fixed(), n_actions=3)(_td(obs))
    assert out["agents", "action"].tolist() == [[1, 0]]
    assert out["agents", "action"].dtype == torch.int64
    assert out["agents", "chosen_action_value"].tolist() == [[[3.0], [5.0]]]
    assert torch.equal(out["agents", "action_value"], obs)


def test_masked_actions_are_never_chosen() -> None:
    torch.manual_seed(0)
    obs = torch.randn(64, 3, 5)
    mask = torch.rand(64, 3, 5) > 0.5
    mask[..., 2] = True  # at least one allowed action per agent
    out = QValueActor(_Fixed(), n_actions=5)(_td(obs, mask))
    action = out["agents", "action"]
    assert bool(mask.gather(-1, action.unsqueeze(-1)).all())
    best = obs.masked_fill(~mask, -torch.inf).max(-1).values
    assert torch.equal(out["agents", "chosen_action_value"].squeeze(-1), best)


@pytest.mark.parametrize("lead", [(), (4,), (2, 3)])
def test_any_leading_batch_dims(lead: tuple[int, ...]) -> None:
    actor = QValueActor(torch.nn.Linear(6, 4), n_actions=4)
    out = actor(_td(torch.randn(*lead, 3, 6)))
    assert out["agents", "action"].shape == (*lead, 3)
    assert out["agents", "action_value"].shape == (*lead, 3, 4)
    assert out["agents", "chosen_action_value"].shape == (*lead, 3, 1)


def test_one_hot_spec_gives_one_hot_actions() -> None:
    spec = OneHot(4, (2, 3, 4))
    out = QValueActor(_Fixed(), spec=spec)(_td(torch.randn(2, 3, 4)))
    action = out["agents", "action"]
    assert action.shape == (2, 3, 4)
    assert action.dtype == spec.dtype
    assert torch.equal(action.long().argmax(-1), out["agents", "action_value"].argmax(-1))


def test_tensordict_module_q_network_and_other_group() -> None:
    net = TensorDictModule(
        torch.nn.Linear(3, 2), in_keys=[("red", "observation")], out_keys=[("red", "action_value")]
    )
    actor = QValueActor(net, group="red", n_actions=2)
    out = actor(_td(torch.randn(5, 2, 3), group="red"))
    assert out["red", "action"].shape == (5, 2)
    assert ("red", "action_mask") in actor.in_keys


def test_errors_name_the_key_and_shape() -> None:
    with pytest.raises(KeyError, match=r"\('agents', 'observation'\)"):
        QValueActor(torch.nn.Linear(3, 2))(TensorDict({}, [4]))
    with pytest.raises(ValueError, match=r"'action_value'\).*\[\*B, n, 5\] \(n_actions\)"):
        QValueActor(torch.nn.Linear(3, 2), n_actions=5)(_td(torch.randn(4, 2, 3)))
    bad_mask = torch.ones(4, 2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"'action_mask'\) must have shape \[\*B, n, 2\] bool"):
        QValueActor(torch.nn.Linear(3, 2))(_td(torch.randn(4, 2, 3), bad_mask))
    with pytest.raises(TypeError, match="Categorical or OneHot"):
        QValueActor(torch.nn.Linear(3, 2), spec=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"nn\.Module"):
        QValueActor(lambda x: x)  # type: ignore[arg-type]


def test_egreedy_explores_only_in_random_mode_and_within_mask() -> None:
    torch.manual_seed(0)
    obs = torch.randn(2000, 2, 5)
    mask = torch.zeros(2000, 2, 5, dtype=torch.bool)
    mask[..., 1] = mask[..., 3] = True
    policy = EGreedy(
        QValueActor(_Fixed(), n_actions=5), eps_init=1.0, eps_end=0.0, annealing_num_steps=10
    )
    with set_exploration("deterministic"):
        greedy = policy(_td(obs, mask))["agents", "action"]
    assert torch.equal(greedy, obs.masked_fill(~mask, -torch.inf).argmax(-1))
    with set_exploration("random"):
        random = policy(_td(obs, mask))["agents", "action"]
    assert set(random.unique().tolist()) == {1, 3}  # only allowed actions, both drawn
    assert 0.4 < (random == 1).float().mean() < 0.6


def test_egreedy_anneals_linearly_and_acts_with_probability_eps() -> None:
    torch.manual_seed(1)
    policy = EGreedy(
        QValueActor(_Fixed(), n_actions=4), eps_init=1.0, eps_end=0.2, annealing_num_steps=8
    )
    policy.step(4)
    assert float(policy.eps) == pytest.approx(0.6)
    policy.step(100)
    assert float(policy.eps) == pytest.approx(0.2)
    obs = torch.zeros(4000, 1, 4)
    obs[..., 0] = 1.0  # greedy is 0
    with set_exploration("random"):
        action = policy(_td(obs))["agents", "action"]
    # non-greedy with probability eps * 3/4 = 0.15
    assert 0.12 < (action != 0).float().mean() < 0.18


def test_egreedy_with_spec_and_errors() -> None:
    spec = Categorical(3, (5, 2))
    policy = EGreedy(QValueActor(_Fixed(), spec=spec), 0.5, 0.5, 1, spec=spec)
    with set_exploration("random"):
        assert policy(_td(torch.randn(5, 2, 3)))["agents", "action"].shape == (5, 2)
    with pytest.raises(ValueError, match=r"EGreedy: eps_init must be a finite number in \[0, 1\]"):
        EGreedy(QValueActor(_Fixed(), n_actions=3), eps_init=1.5)
    with pytest.raises(ValueError, match="annealing_num_steps"):
        EGreedy(QValueActor(_Fixed(), n_actions=3), annealing_num_steps=0)
    net = TensorDictModule(_Fixed(), in_keys=["o"], out_keys=["a"])
    with pytest.raises(ValueError, match="needs the number of actions"):
        EGreedy(net)


def test_egreedy_lands_exactly_on_eps_end_and_keeps_its_count():

    spec = Categorical(5, (2, 3))
    actor = QValueActor(torch.nn.Linear(4, 5), spec=spec)
    policy = EGreedy(actor, eps_init=0.3, eps_end=0.0, annealing_num_steps=60_000)
    for _ in range(20):
        policy.step(6000)
    assert float(policy.eps) == 0.0  # not 1e-8 of float drift: the greedy fast path applies
    other = EGreedy(actor, eps_init=0.3, eps_end=0.0, annealing_num_steps=60_000)
    policy2 = EGreedy(actor, eps_init=0.3, eps_end=0.0, annealing_num_steps=60_000)
    policy2.step(6000)
    other.load_state_dict(policy2.state_dict())
    other.step(6000)
    assert int(other.steps_done) == 12_000
    assert float(other.eps) == pytest.approx(0.3 - 0.3 * 12_000 / 60_000)


def test_a_mask_row_with_no_allowed_action_is_refused_when_acting() -> None:
    from marlkit.modules import EGreedy, QValueActor

    actor = QValueActor(torch.nn.Linear(3, 3), n_actions=3)
    td = TensorDict({"agents": TensorDict({"observation": torch.randn(2, 2, 3)}, [2, 2])}, [2])
    mask = torch.ones(2, 2, 3, dtype=torch.bool)
    mask[1, 0] = False
    td["agents", "action_mask"] = mask
    with pytest.raises(ValueError, match=r"a row of \('agents', 'action_mask'\) allows no action"):
        actor(td.clone())
    with pytest.raises(ValueError, match=r"must be a bool tensor, got torch\.float32"):
        actor(td.clone().set(("agents", "action_mask"), mask.float()))
    greedy = EGreedy(actor, eps_init=1.0, annealing_num_steps=10)
    for bad, error in ((-5, ValueError), (2.5, TypeError)):
        with pytest.raises(error, match=r"EGreedy\.step frames must be an int >= 0"):
            greedy.step(bad)  # type: ignore[arg-type]
    assert greedy.steps_done == 0


def test_annealing_steps_is_a_fraction_of_the_run() -> None:
    assert annealing_steps(60_000, 0.5) == 30_000
    assert annealing_steps(2_000, 2.0) == 4_000  # the schedule may outlast the run
    assert annealing_steps(100, 0) == 1  # at once
    assert annealing_steps(3, 0.1) == 1
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="annealing fraction must be a finite number >= 0"):
            annealing_steps(100, bad)
    with pytest.raises(TypeError, match="annealing fraction must be a number"):
        annealing_steps(100, "half")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="total_frames must be an int >= 1"):
        annealing_steps(-1, 0.5)
