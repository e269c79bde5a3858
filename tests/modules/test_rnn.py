"""MultiAgentGRU: GRUCell maths, state carried through step_mdp, step mode == sequence mode."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import marlkit
from marlkit.collectors import Collector
from marlkit.data import step_mdp
from marlkit.envs import InitTracker, TransformedEnv
from marlkit.modules import MultiAgentGRU, MultiAgentLSTM, set_recurrent_mode


def group_td(obs: torch.Tensor, is_init: torch.Tensor) -> TensorDict:
    batch = obs.shape[:-2]
    return TensorDict(
        {
            "agents": TensorDict({"observation": obs}, batch_size=obs.shape[:-1]),
            "is_init": is_init,
        },
        batch_size=batch,
    )


@pytest.mark.parametrize("share_params", [False, True])
def test_step_matches_torch_grucell(share_params: bool) -> None:
    torch.manual_seed(0)
    gru = MultiAgentGRU(3, 5, 2, share_params=share_params)
    td = group_td(torch.randn(4, 2, 3), torch.zeros(4, 1, dtype=torch.bool))
    h0 = torch.randn(4, 2, 5)
    td.set(("agents", "rnn_state"), h0)
    out = gru(td)
    for i in range(2):
        s = 0 if share_params else i
        cell = torch.nn.GRUCell(3, 5)
        with torch.no_grad():
            cell.weight_ih.copy_(gru.input_gates.weight[s].T)
            cell.bias_ih.copy_(gru.input_gates.bias[s, 0])
            cell.weight_hh.copy_(gru.hidden_gates.weight[s].T)
            cell.bias_hh.copy_(gru.hidden_gates.bias[s, 0])
        ref = cell(td["agents", "observation"][:, i], h0[:, i])
        torch.testing.assert_close(out["agents", "rnn_state"][:, i], ref)
    torch.testing.assert_close(out["agents", "rnn_state_in"], h0)


@pytest.mark.parametrize("cls", [MultiAgentGRU, MultiAgentLSTM])
@pytest.mark.parametrize("share_params", [False, True])
def test_sequence_mode_equals_step_by_step_with_mid_sequence_reset(cls, share_params: bool) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    B, T, n = 3, 7, 4
    gru = cls(2, 6, n, share_params=share_params)
    obs = torch.randn(B, T, n, 2)
    is_init = torch.zeros(B, T, 1, dtype=torch.bool)
    is_init[:, 0] = True
    is_init[0, 3] = True  # env 0 resets in the middle of the sequence
    is_init[2, 5] = True
    steps = []
    state = None
    for t in range(T):
        td = group_td(obs[:, t], is_init[:, t])
        if state is not None:
            td.set(("agents", "rnn_state"), state)
        td = gru(td)
        state = td["agents", "rnn_state"]
        steps.append(td)
    stepped = torch.stack([s["agents", "rnn_output"] for s in steps], 1)
    states_in = torch.stack([s["agents", "rnn_state_in"] for s in steps], 1)
    seq = group_td(obs, is_init)
    with set_recurrent_mode(True):
        gru(seq)
    torch.testing.assert_close(seq["agents", "rnn_output"], stepped)
    # A sequence cut in the middle of an episode starts from its stored rnn_state_in.
    tail = group_td(obs[:, 4:], is_init[:, 4:])
    tail.set(("agents", "rnn_state_in"), states_in[:, 4:])
    with set_recurrent_mode(True):
        gru(tail)
    torch.testing.assert_close(tail["agents", "rnn_output"], stepped[:, 4:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shared_gru_sequence_by_torch_gru_equals_the_unrolled_cell(dtype: torch.dtype) -> None:
    """A shared GRU's sequence runs through ``torch.gru`` (one call per stretch without a
    restart); its outputs, states and every gradient are the unrolled cell's, with restarts of
    single agents and whole rows mid-sequence, a carried first state and two batch dims."""
    torch.manual_seed(0)
    B, T, n = (2, 3), 9, 3
    gru = MultiAgentGRU(4, 5, n, share_params=True).to(dtype)
    obs = torch.randn(*B, T, n, 4, dtype=dtype)
    is_init = torch.zeros(*B, T, n, 1, dtype=torch.bool)
    is_init[..., 0, :, :] = True
    is_init[0, 1, 3, 1] = True  # one agent of one row restarts
    is_init[1, 2, 6] = True  # a whole row
    is_init[1, 0, 8, 2] = True  # on the last step
    first = torch.randn(*B, T, n, 5, dtype=dtype)

    def run(fused: bool) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        gru.zero_grad()
        x = obs.clone().requires_grad_(True)
        h = first.clone().requires_grad_(True)
        td = TensorDict(
            {
                "agents": TensorDict(
                    {"observation": x, "is_init": is_init, "rnn_state_in": h}, [*B, T, n]
                )
            },
            [*B, T],
        )
        with set_recurrent_mode(True):
            if fused:
                assert gru._fusable(x)
                gru(td)
            else:
                original = MultiAgentGRU._sequence_op
                MultiAgentGRU._sequence_op = None  # the unrolled cell
                try:
                    assert not gru._fusable(x)
                    gru(td)
                finally:
                    MultiAgentGRU._sequence_op = original
        out = td["agents", "rnn_output"]
        torch.testing.assert_close(td["agents", "rnn_state"], out)
        (out * torch.linspace(-1, 1, out.numel(), dtype=dtype).view_as(out)).sum().backward()
        assert x.grad is not None and h.grad is not None
        return out.detach(), x.grad, [h.grad] + [p.grad.clone() for p in gru.parameters()]

    fused_out, fused_dx, fused_grads = run(True)
    loop_out, loop_dx, loop_grads = run(False)
    torch.testing.assert_close(fused_out, loop_out)
    torch.testing.assert_close(fused_dx, loop_dx)
    for a, b in zip(fused_grads, loop_grads, strict=True):
        torch.testing.assert_close(a, b)


def test_gru_sequence_function_passes_gradcheck_with_restarts() -> None:
    """The fused sequence's gradients against finite differences (float64), restarts at the
    first step, mid-sequence for one row, and for every row at once."""
    from marlkit.modules.rnn import _gru_sequence

    torch.manual_seed(1)
    N, T, F, H = 4, 6, 3, 5
    resets = torch.zeros(N, T, dtype=torch.bool)
    resets[:, 0] = resets[1, 2] = resets[3, 5] = True
    resets[:, 4] = True
    inputs = [
        torch.randn(N, T, F, dtype=torch.float64, requires_grad=True),
        torch.randn(N, H, dtype=torch.float64, requires_grad=True),
        resets,
        torch.randn(3 * H, F, dtype=torch.float64, requires_grad=True),
        torch.randn(3 * H, H, dtype=torch.float64, requires_grad=True),
        torch.randn(3 * H, dtype=torch.float64, requires_grad=True),
        torch.randn(3 * H, dtype=torch.float64, requires_grad=True),
    ]
    assert torch.autograd.gradcheck(_gru_sequence, inputs)


def test_gru_sequence_stays_unrolled_where_torch_gru_does_not_fit() -> None:
    x = torch.randn(2, 5, 3, 4)
    assert not MultiAgentGRU(4, 5, 3, share_params=False)._fusable(x)  # a weight per agent
    assert not MultiAgentLSTM(4, 5, 3, share_params=True)._fusable(x)  # c per step needed
    shared = MultiAgentGRU(4, 5, 3, share_params=True)
    assert shared._fusable(x)
    assert not shared._fusable(x.double())  # input and weights of two dtypes
    assert not shared._fusable(x[:0])  # an empty batch
    # 2 x 3 sequences of 5 units: 900 flops a step; the fused path only up to the threshold
    shared.fused_max_step_flops = 899
    assert not shared._fusable(x)
    shared.fused_max_step_flops = 900
    assert shared._fusable(x)
    assert MultiAgentGRU(4, 128, 3, share_params=True)._fusable(torch.randn(4, 50, 3, 4))
    assert not MultiAgentGRU(4, 128, 3, share_params=True)._fusable(torch.randn(32, 50, 3, 4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not shared._fusable(x)


@pytest.mark.parametrize("share_params", [False, True])
def test_lstm_step_matches_torch_lstmcell(share_params: bool) -> None:
    torch.manual_seed(0)
    lstm = MultiAgentLSTM(3, 5, 2, share_params=share_params)
    td = group_td(torch.randn(4, 2, 3), torch.zeros(4, 1, dtype=torch.bool))
    h0, c0 = torch.randn(4, 2, 5), torch.randn(4, 2, 5)
    td.set(("agents", "rnn_state"), torch.cat([h0, c0], -1))
    out = lstm(td)
    assert out["agents", "rnn_state"].shape == (4, 2, 10)
    for i in range(2):
        s = 0 if share_params else i
        cell = torch.nn.LSTMCell(3, 5)
        with torch.no_grad():
            cell.weight_ih.copy_(lstm.input_gates.weight[s].T)
            cell.bias_ih.copy_(lstm.input_gates.bias[s, 0])
            cell.weight_hh.copy_(lstm.hidden_gates.weight[s].T)
            cell.bias_hh.copy_(lstm.hidden_gates.bias[s, 0])
        h, c = cell(td["agents", "observation"][:, i], (h0[:, i], c0[:, i]))
        torch.testing.assert_close(out["agents", "rnn_output"][:, i], h)
        torch.testing.assert_close(out["agents", "rnn_state"][:, i], torch.cat([h, c], -1))
    bad = group_td(torch.randn(4, 2, 3), torch.zeros(4, 1, dtype=torch.bool))
    bad.set(("agents", "rnn_state"), h0)  # h without c
    with pytest.raises(
        ValueError, match=r"MultiAgentLSTM state .*expected .*10\], got \[4, 2, 5\]"
    ):
        lstm(bad)


def test_state_is_carried_by_step_mdp_and_zeroed_at_reset() -> None:
    env = TransformedEnv(marlkit.make("navigation", num_envs=2, n_agents=3, seed=0), InitTracker())
    obs_dim = env.observation_spec["agents", "observation"].shape[-1]
    gru = MultiAgentGRU(obs_dim, 4, 3)

    def policy(td):
        gru(td)
        return env.rand_action(td)

    td = env.reset()
    td = policy(td)
    assert bool((td["agents", "rnn_state_in"] == 0).all())  # the first step starts at zero
    td = env.step(td)
    nxt = step_mdp(td)
    torch.testing.assert_close(nxt["agents", "rnn_state"], td["agents", "rnn_state"])
    nxt = policy(nxt)
    torch.testing.assert_close(nxt["agents", "rnn_state_in"], td["agents", "rnn_state"])
    assert bool((nxt["agents", "rnn_state_in"] != 0).any())


def test_missing_is_init_and_bad_shapes() -> None:
    gru = MultiAgentGRU(2, 3, 2)
    td = TensorDict(
        {"agents": TensorDict({"observation": torch.zeros(4, 2, 2)}, batch_size=[4, 2])},
        batch_size=[4],
    )
    with pytest.raises(KeyError, match="InitTracker"):
        gru(td)
    td.set("is_init", torch.ones(4, 1, dtype=torch.bool))
    td.set(("agents", "rnn_state"), torch.zeros(4, 2, 5))
    with pytest.raises(ValueError, match=r"rnn_state.*expected .*3\], got \[4, 2, 5\]"):
        gru(td)
    with pytest.raises(ValueError, match=r"expected .*n_agents=2, 2\], got \[4, 2, 3\]"):
        gru(group_td(torch.zeros(4, 2, 3), torch.ones(4, 1, dtype=torch.bool)))


def test_collected_batch_replays_in_sequence_mode_across_resets() -> None:
    torch.manual_seed(0)
    env = TransformedEnv(marlkit.make("navigation", num_envs=3, n_agents=2, seed=0), InitTracker())
    obs_dim = env.observation_spec["agents", "observation"].shape[-1]
    gru = MultiAgentGRU(obs_dim, 8, 2)

    def policy(td):
        return env.rand_action(gru(td))

    collector = Collector(
        env, policy, frames_per_batch=3 * 12, total_frames=3 * 24, max_frames_per_traj=5
    )
    batches = list(collector)
    second = batches[1]  # starts mid-episode: its first state comes from rnn_state_in
    assert bool(second["is_init"][:, 1:].any())  # resets inside the sequence
    replay = second.exclude(("agents", "rnn_output"))
    with set_recurrent_mode(True):
        gru(replay)
    torch.testing.assert_close(replay["agents", "rnn_output"], second["agents", "rnn_output"])


def test_slice_sampled_sequences_replay_the_rollout_outputs() -> None:
    """The recurrent state travels with the data: sequences sampled from a replay buffer (cut
    anywhere, never across an episode end) give in sequence mode what the rollout computed."""
    from marlkit.replay import ReplayBuffer, SliceSampler, TensorStorage

    torch.manual_seed(0)
    env = TransformedEnv(marlkit.make("navigation", num_envs=4, n_agents=2, seed=0), InitTracker())
    obs_dim = env.observation_spec["agents", "observation"].shape[-1]
    gru = MultiAgentGRU(obs_dim, 8, 2)

    def policy(td):
        return env.rand_action(gru(td))

    rb = ReplayBuffer(TensorStorage(1000), SliceSampler(6, seed=0))
    collector = Collector(
        env,
        policy,
        frames_per_batch=4 * 20,
        total_frames=4 * 60,
        max_frames_per_traj=9,
        replay_buffer=rb,
    )
    for _ in collector:
        pass
    sequences = rb.sample(60)  # [10, 6]
    assert sequences.batch_size == (10, 6)
    assert bool((~sequences["is_init"][:, 0]).any())  # some start in the middle of an episode
    replay = sequences.exclude(("agents", "rnn_output"))
    with set_recurrent_mode(True):
        gru(replay)
    torch.testing.assert_close(replay["agents", "rnn_output"], sequences["agents", "rnn_output"])


def test_bad_sizes_and_a_shuffled_sequence_are_refused() -> None:
    from marlkit.modules import MultiAgentGRU, set_recurrent_mode

    for kwargs, match in (
        ({"hidden_size": 0}, "hidden_size must be an int >= 1, got 0"),
        ({"input_size": -1}, "input_size must be an int >= 1, got -1"),
        ({"n_agents": 0}, "n_agents must be an int >= 1, got 0"),
    ):
        with pytest.raises(ValueError, match=match):
            MultiAgentGRU(**{"input_size": 3, "hidden_size": 4, "n_agents": 2, **kwargs})
    gru = MultiAgentGRU(3, 4, 2)
    ids = torch.tensor([0, 0, 1, 1, 0, 1])  # two trajectories, shuffled together
    starts = torch.tensor([True, False, True, False, False, False])[:, None]
    td = TensorDict(
        {
            "agents": TensorDict({"observation": torch.randn(6, 2, 3)}, [6, 2]),
            "is_init": starts,
            "collector": TensorDict({"traj_ids": ids}, [6]),
        },
        [6],
    )
    with set_recurrent_mode(True):
        with pytest.raises(ValueError, match=r"changes without an episode start \('is_init'\)"):
            gru(td.clone())
        gru(td[:4].clone())  # in order: fine
        with pytest.raises(
            ValueError, match=r"'is_init' must be a bool tensor, got torch\.float32"
        ):
            gru(td[:4].clone().set("is_init", starts[:4].float()))
    with pytest.raises(ValueError, match=r"'is_init' must be \[\*B, 1\] \[4, 1\], got \[4\]"):
        gru(td[:4].clone().set("is_init", starts[:4, 0]))


@pytest.mark.parametrize("share_params", [False, True])
def test_sequence_mode_takes_an_empty_batch(share_params: bool) -> None:
    m = MultiAgentGRU(4, 5, 3, share_params=share_params)
    group = TensorDict({"observation": torch.randn(0, 6, 3, 4)}, [0, 6, 3])
    td = TensorDict({"agents": group, "is_init": torch.ones(0, 6, 1, dtype=torch.bool)}, [0, 6])
    with set_recurrent_mode(True):
        out = m(td)["agents", "rnn_output"]
    assert out.shape == (0, 6, 3, 5)


@pytest.mark.parametrize("share_params", [False, True])
def test_recurrent_network_head_layers_sit_between_the_cell_and_the_output(
    share_params: bool,
) -> None:
    """``head_depth`` hidden layers of ``head_cells`` (JaxMARL's SMAX actor: Dense-ReLU after
    the GRU), batched over the agents like the encoder; ``head_depth=0`` is the linear head,
    its parameters (and the random draws that make them) those of the network without it."""
    from torch import nn

    from marlkit.modules import MultiAgentMLP
    from marlkit.modules.rnn import recurrent_network

    keys = [("agents", "logits")]
    kwargs = {"hidden_size": 8, "out_keys": keys, "share_params": share_params}
    torch.manual_seed(0)
    linear = recurrent_network(4, 3, 2, **kwargs)
    torch.manual_seed(0)
    explicit = recurrent_network(4, 3, 2, head_depth=0, head_cells=64, **kwargs)
    assert linear.state_dict().keys() == explicit.state_dict().keys()
    for (name, p), q in zip(linear.state_dict().items(), explicit.state_dict().values()):
        assert torch.equal(p, q), name
    net = recurrent_network(
        4, 3, 2, head_depth=2, head_cells=[16, 12], activation=nn.ReLU, **kwargs
    )
    stacks = 1 if share_params else 2
    head = {k: tuple(v.shape) for k, v in net.state_dict().items() if k.startswith("module.2")}
    assert head == {
        "module.2.module.layers.0.weight": (stacks, 8, 16),
        "module.2.module.layers.0.bias": (stacks, 1, 16),
        "module.2.module.layers.1.weight": (stacks, 16, 12),
        "module.2.module.layers.1.bias": (stacks, 1, 12),
        "module.2.module.layers.2.weight": (stacks, 12, 3),
        "module.2.module.layers.2.bias": (stacks, 1, 3),
    }
    td = group_td(torch.randn(5, 2, 4), torch.zeros(5, 1, dtype=torch.bool))
    out = net(td)
    assert out["agents", "logits"].shape == (5, 2, 3)  # the output as without the layers
    mlp = net.module[2].module
    assert isinstance(mlp, MultiAgentMLP) and not mlp.centralised
    for agent in range(2):  # each agent's head: Linear-ReLU-Linear-ReLU-Linear on its cell output
        reference = mlp.agent_network(agent)
        assert [type(m) for m in reference] == [nn.Linear, nn.ReLU] * 2 + [nn.Linear]
        torch.testing.assert_close(
            out["agents", "logits"][:, agent], reference(out["agents", "rnn_output"][:, agent])
        )
    # one width for every layer, the cell's by default
    widths = recurrent_network(4, 3, 2, head_depth=2, **kwargs).module[2].module
    assert [layer.out_features for layer in widths.layers] == [8, 8, 3]


def test_recurrent_network_refuses_a_bad_head() -> None:
    from marlkit.modules.rnn import recurrent_network

    keys = [("agents", "logits")]
    for kwargs, error, match in (
        (
            {"head_depth": -1},
            ValueError,
            r"recurrent_network: head_depth must be an int >= 0, got -1",
        ),
        ({"head_depth": 1.0}, TypeError, r"head_depth must be an int >= 0, got float"),
        ({"head_depth": 1, "head_cells": 0}, ValueError, r"head_cells must be an int or a seq"),
        ({"head_depth": 2, "head_cells": [8]}, ValueError, r"sequence of 2 ints >= 1, got \[8\]"),
    ):
        with pytest.raises(error, match=match):
            recurrent_network(4, 3, 2, hidden_size=8, out_keys=keys, **kwargs)
