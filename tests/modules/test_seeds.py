"""marlkit.modules.seeds: K seeds' networks stacked compute what each computes alone; each
seed samples on its own stream the numbers it samples alone."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from marlkit.modules import (
    Categorical,
    MultiAgentGRU,
    MultiAgentMLP,
    NormalParamExtractor,
    ProbabilisticActor,
    TanhNormal,
)
from marlkit.modules.seeds import (
    SeedStackedMLP,
    SeedStreams,
    copy_seed_,
    load_seed_,
    seedwise_sampling,
    stack_seeds,
)

K, N, OBS = 3, 2, 5


def mlps(centralised: bool, share: bool, out: int = 4) -> list[MultiAgentMLP]:
    nets = []
    for seed in range(K):
        torch.manual_seed(seed)
        nets.append(
            MultiAgentMLP(OBS, out, N, centralised=centralised, share_params=share, num_cells=8)
        )
    return nets


@pytest.mark.parametrize("centralised", [False, True])
@pytest.mark.parametrize("share", [False, True])
def test_each_seed_computes_what_its_network_computes(centralised: bool, share: bool) -> None:
    nets = mlps(centralised, share)
    stacked = SeedStackedMLP(nets)
    x = torch.randn(K, 6, 7, N, OBS)
    out = stacked(x)
    assert out.shape == (K, 6, 7, N, 4)
    for k, net in enumerate(nets):
        torch.testing.assert_close(out[k], net(x[k]), atol=1e-6, rtol=1e-5)
    # each seed's gradient is that of its own network
    out.pow(2).sum().backward()
    for k, net in enumerate(nets):
        net(x[k]).pow(2).sum().backward()
        for i, layer in enumerate(net.layers):
            S = layer.weight.shape[0]
            grad = stacked.layers[i].weight.grad[k * S : (k + 1) * S]
            torch.testing.assert_close(grad, layer.weight.grad, atol=1e-5, rtol=1e-4)


def test_seed_state_round_trips_in_the_networks_layout() -> None:
    nets = mlps(False, False)
    stacked = SeedStackedMLP(nets)
    for k, net in enumerate(nets):
        state = stacked.seed_state(k)
        assert state.keys() == net.state_dict().keys()
        for name, value in net.state_dict().items():
            torch.testing.assert_close(state[name], value)
    stacked.load_seed_state(1, nets[0].state_dict())
    torch.testing.assert_close(stacked.seed_state(1), stacked.seed_state(0))
    with pytest.raises(IndexError, match=r"seed index must be in \[0, 3\), got 3"):
        stacked.seed_state(3)


def test_bad_inputs_and_networks_are_named() -> None:
    nets = mlps(False, True)
    stacked = SeedStackedMLP(nets)
    with pytest.raises(ValueError, match=r"expected a tensor of shape \[K=3, \*B, n_agents=2, 5\]"):
        stacked(torch.zeros(2, 4, N, OBS))
    other = MultiAgentMLP(OBS, 4, N, share_params=True, num_cells=16)
    with pytest.raises(ValueError, match=r"mlps\[1\] has another architecture"):
        SeedStackedMLP([nets[0], other])
    with pytest.raises(ValueError, match="at least one"):
        SeedStackedMLP([])


def actor(seed: int, dist: type) -> ProbabilisticActor:
    torch.manual_seed(seed)
    if dist is TanhNormal:
        net = torch.nn.Sequential(MultiAgentMLP(OBS, 4, N, num_cells=8), NormalParamExtractor())
    else:
        net = MultiAgentMLP(OBS, 4, N, num_cells=8)
    return ProbabilisticActor(net, group="agents", distribution_class=dist)


def obs(batch: tuple[int, ...]) -> TensorDict:
    x = torch.randn(*batch, N, OBS, generator=torch.Generator().manual_seed(7))
    return TensorDict(
        {"agents": TensorDict({"observation": x}, batch_size=[*batch, N])}, batch_size=batch
    )


@pytest.mark.parametrize("dist", [Categorical, TanhNormal])
def test_each_seed_samples_on_its_stream_what_it_samples_alone(dist: type) -> None:
    actors = [actor(k, dist) for k in range(K)]
    states = []
    for k in range(K):
        torch.manual_seed(100 + k)
        states.append(torch.get_rng_state())
    stacked = seedwise_sampling(stack_seeds(actors), SeedStreams(states))
    td = obs((K, 6))
    before = torch.get_rng_state()
    out = stacked(td.clone())
    out2 = stacked(td.clone())  # the streams go on
    torch.testing.assert_close(torch.get_rng_state(), before)  # the global one is left alone
    for k, alone in enumerate(actors):
        torch.manual_seed(100 + k)
        first, second = alone(td[k].clone()), alone(td[k].clone())
        for got, want in ((out[k], first), (out2[k], second)):
            key = ("agents", "action")
            torch.testing.assert_close(got[key], want[key], atol=1e-6, rtol=1e-5)
            lp = ("agents", "action_log_prob")
            torch.testing.assert_close(got[lp], want[lp], atol=1e-5, rtol=1e-5)


def test_a_parameter_outside_the_mlps_is_named() -> None:
    grus = []
    for seed in range(2):
        torch.manual_seed(seed)
        grus.append(torch.nn.Sequential(MultiAgentGRU(OBS, 8, N), MultiAgentMLP(8, 2, N)))
    with pytest.raises(ValueError, match=r"parameter '0\.\S+' .* is not in a MultiAgentMLP"):
        stack_seeds(grus)


def test_copy_and_load_one_seed() -> None:
    actors = [actor(k, Categorical) for k in range(K)]
    stacked = stack_seeds(actors)
    plain = actor(50, Categorical)
    copy_seed_(stacked, plain, 2)
    for (name, a), b in zip(plain.state_dict().items(), actors[2].state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    load_seed_(stacked, actor(60, Categorical), 0)
    copy_seed_(stacked, plain, 0)
    for a, b in zip(plain.state_dict().values(), actor(60, Categorical).state_dict().values()):
        torch.testing.assert_close(a, b)
