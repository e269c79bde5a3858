"""Sequence minibatches for networks with memory: windows cover every step once, and before any
update the training pass (recurrent mode over windows) gives back what the rollout wrote: the
actor's log-probs, the critic's values, the next values GAE bootstraps from, across episode
starts inside a window and windows cut in the middle of an episode."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictSequential

from marlkit.collectors import Collector
from marlkit.envs import InitTracker, make_episodic
from marlkit.modules import Categorical, NormalParamExtractor, ProbabilisticActor, TanhNormal
from marlkit.modules.rnn import (
    carry_states,
    recurrent_modules,
    recurrent_network,
    set_recurrent_mode,
)
from marlkit.objectives import GAE, ClipPPOLoss
from marlkit.train.sequences import sequence_windows, split_sequences


@pytest.mark.parametrize(("steps", "seq_len", "burn_in"), [(12, 4, 0), (12, 5, 3), (7, 7, 0)])
def test_windows_count_every_step_once(steps: int, seq_len: int, burn_in: int) -> None:
    index, counted = sequence_windows(steps, seq_len, burn_in)
    assert index.shape[1] == seq_len + burn_in
    assert bool((index[:, 1:] - index[:, :-1] == 1).all())  # consecutive steps
    times = torch.bincount(index[counted], minlength=steps)
    assert times.tolist() == [1] * steps
    # a window counts one contiguous run of steps, after its burn-in
    assert bool((counted.sum(1) <= seq_len).all())


def test_split_keeps_the_batch_own_mask_and_refuses_bad_input() -> None:
    x = torch.arange(12.0).reshape(2, 6)
    own = torch.ones(2, 6, dtype=torch.bool)
    own[1, 5] = False  # a padded step stays out of the loss
    batch = TensorDict({"x": x, "collector": TensorDict({"mask": own}, [2, 6])}, [2, 6])
    out = split_sequences(batch, 3)
    assert out.batch_size == (4, 3)
    assert out["x"].reshape(2, 6).equal(x)
    assert out["collector", "mask"].reshape(2, 6).equal(own)
    with pytest.raises(ValueError, match=r"burn_in \+ seq_len = 4 \+ 3 = 7 steps is longer"):
        split_sequences(batch, 3, burn_in=4)
    with pytest.raises(ValueError, match="seq_len must be an int >= 1, got 0"):
        split_sequences(batch, 0)
    with pytest.raises(ValueError, match="burn_in must be an int >= 0, got -1"):
        split_sequences(batch, 2, burn_in=-1)
    with pytest.raises(ValueError, match="needs a time dim"):
        split_sequences(batch[0, 0], 1)
    bad = batch.clone().set(("collector", "mask"), own.float())
    with pytest.raises(ValueError, match=r"\('collector', 'mask'\) must be a bool \[\*B, T\]"):
        split_sequences(bad, 3)


def _recurrent_agents(env, memory: str, continuous: bool, head_depth: int = 0):
    n = len(env.group_map["agents"])
    obs = env.observation_spec["agents", "observation"].shape[-1]
    spec = env.action_spec["agents", "action"]
    if continuous:
        keys, head = [("agents", "loc"), ("agents", "scale")], NormalParamExtractor()
        width, dist = 2 * spec.shape[-1], TanhNormal
    else:
        keys, head, width, dist = [("agents", "logits")], None, spec.n, Categorical
    # head_depth: hidden layers between the cell and the output (JaxMARL's SMAX networks)
    net = recurrent_network(
        obs, width, n, memory=memory, hidden_size=8, out_keys=keys, head=head, head_depth=head_depth
    )
    actor = ProbabilisticActor(net, group="agents", distribution_class=dist)
    critic = recurrent_network(
        obs,
        1,
        n,
        memory=memory,
        hidden_size=6,
        name="critic_rnn",
        centralised=True,
        share_params=True,
        out_keys=[("agents", "state_value")],
        head_depth=head_depth,
        head_cells=5,
    )
    return actor, critic


@pytest.mark.parametrize(
    ("memory", "continuous", "head_depth"),
    [("gru", False, 0), ("lstm", True, 0), ("gru", False, 1), ("lstm", True, 2)],
)
def test_training_pass_gives_back_the_rollout_before_any_update(
    memory: str, continuous: bool, head_depth: int
) -> None:
    torch.manual_seed(0)
    env = make_episodic(
        "navigation", num_envs=3, max_steps=5, seed=0, n_agents=2, continuous_actions=continuous
    ).append_transform(InitTracker())
    actor, critic = _recurrent_agents(env, memory, continuous, head_depth)
    assert sum(1 for name, _ in critic.named_parameters() if "weight" in name) == 4 + head_depth
    assert [c.state_key for c in recurrent_modules(critic)] == [("agents", "critic_rnn_state")]
    # the critic steps with the rollout: its state is collected, as the actor's
    collector = Collector(
        env, TensorDictSequential(actor, critic), frames_per_batch=3 * 8, total_frames=3 * 16
    )
    loss = ClipPPOLoss(actor, critic, entropy_coef=0.0, normalize_advantage=False)
    gae = GAE(0.9, 0.95, value_network=critic)
    for batch in collector:  # the second batch starts in the middle of episodes
        assert bool(batch["is_init"][:, 1:].any())  # episode starts inside the batch
        rollout_values = batch["agents", "state_value"].clone()
        gae(batch)
        # the recurrent critic over the batch's sequences: the rollout's values
        torch.testing.assert_close(batch["agents", "state_value"], rollout_values)
        # the next values: the rollout's value of the next step within an episode
        nxt = batch["next", "agents", "state_value"][:, :-1]
        same_episode = ~batch["next", "done"][:, :-1, None].expand_as(nxt)
        torch.testing.assert_close(nxt[same_episode], rollout_values[:, 1:][same_episode])
        batch.set(("agents", "state_value"), rollout_values)
        keys = [*loss.in_keys, ("agents", "state_value")]
        windows = split_sequences(batch.select(*keys, strict=False), 3, burn_in=2)
        assert bool((~windows["is_init"][:, 0]).any())  # windows cut mid-episode
        assert bool(windows["is_init"][:, 1:].any())  # episode starts inside windows
        with set_recurrent_mode(True):
            dist = actor.get_dist(windows.clone())
            values = critic(windows.clone())["agents", "state_value"]
            terms = loss(windows)
        log_prob = dist.log_prob(windows["agents", "action"])
        tol = {"atol": 1e-4, "rtol": 1e-4} if continuous else {}
        torch.testing.assert_close(log_prob, windows["agents", "action_log_prob"], **tol)
        torch.testing.assert_close(values, windows["agents", "state_value"])
        assert float(terms["kl_approx"]) < 1e-6 and float(terms["clip_fraction"]) == 0.0


def test_carry_states_steps_from_each_state_reached() -> None:
    net = recurrent_network(3, 1, 2, hidden_size=4, out_keys=[("agents", "out")])
    obs = torch.randn(2, 5, 2, 3)
    is_init = torch.zeros(2, 5, 1, dtype=torch.bool)
    is_init[:, 0] = True
    td = TensorDict({"agents": TensorDict({"observation": obs}, [2, 5, 2]), "is_init": is_init})
    td.batch_size = [2, 5]
    nxt = TensorDict({"agents": TensorDict({"observation": obs.roll(-1, 1)}, [2, 5, 2])}, [2, 5])
    with pytest.raises(KeyError, match=r"no \('agents', 'rnn_state'\).*set_recurrent_mode"):
        carry_states(net, td.clone(), nxt.clone())
    with set_recurrent_mode(True):
        out = net(td.clone())
    following = carry_states(net, out, nxt)
    assert not bool(following["is_init"].any())
    stepped = net(following)["agents", "out"]
    torch.testing.assert_close(stepped[:, :-1], out["agents", "out"][:, 1:])


@pytest.mark.parametrize("double_dqn", [False, True])
def test_recurrent_q_targets_come_from_the_unrolled_target_network(double_dqn: bool) -> None:
    """PyMARL's recurrent agents: the online Q-network over windows gives back the rollout's
    action values, and each next value comes from the *target* network unrolled over the window
    and stepped once from the state it reached (checked by moving the online weights after the
    rollout: the target copy keeps the rollout's)."""
    from marlkit.modules import QValueActor
    from marlkit.objectives import DQNLoss

    torch.manual_seed(0)
    env = make_episodic(
        "navigation", num_envs=3, max_steps=5, seed=0, n_agents=2, continuous_actions=False
    ).append_transform(InitTracker())
    spec = env.action_spec["agents", "action"]
    obs = env.observation_spec["agents", "observation"].shape[-1]
    net = recurrent_network(obs, spec.n, 2, hidden_size=8, out_keys=[("agents", "action_value")])
    actor = QValueActor(net, group="agents", spec=spec)
    batch = next(iter(Collector(env, actor, frames_per_batch=3 * 12, total_frames=3 * 12)))
    loss = DQNLoss(actor, delay_value=True, double_dqn=double_dqn)  # the target: a copy
    rollout = batch["agents", "action_value"]
    with torch.no_grad():  # the online network moves on; the target keeps the rollout's weights
        for p in loss.value_network.parameters():
            p.add_(0.3 * torch.randn_like(p))
    rows = split_sequences(batch.select(*loss.in_keys, strict=False), 12)  # whole rows
    with set_recurrent_mode(True):
        td = rows.clone(False)
        online = loss._action_values(td, loss.value_network)
        nxt = loss._next_value(td["next"].clone(False), "value_network", double_dqn, sequence=td)
    assert not torch.allclose(online, rollout)  # the online network did move
    later = rollout[:, 1:]  # the target's values of the next step, as the rollout computed them
    if double_dqn:  # valued by the target at the online network's argmax
        expected = later.gather(-1, online[:, 1:].argmax(-1, keepdim=True))
    else:
        expected = later.max(-1, keepdim=True).values
    same = (~batch["next", "done"][:, :-1, None]).expand_as(expected)  # within an episode
    assert bool(batch["is_init"][:, 1:].any())  # episode starts inside the rows
    torch.testing.assert_close(nxt[:, :-1][same], expected[same])
    windows = split_sequences(batch.select(*loss.in_keys, strict=False), 4, burn_in=2)
    with set_recurrent_mode(True):
        terms = loss(windows.clone())
    assert torch.isfinite(terms["loss"])
    poisoned = windows.clone()  # burn-in and overlap steps weigh nothing in the loss
    poisoned["next", "agents", "reward"][~windows["collector", "mask"]] = 1e6
    with set_recurrent_mode(True):
        torch.testing.assert_close(loss(poisoned)["loss"], terms["loss"])
    with pytest.raises(ValueError, match=r"the Q-network has memory .*set_recurrent_mode\(True\)"):
        loss(windows.clone())
