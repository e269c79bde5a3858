"""Value estimators against plain Python reference loops, on random data with truncations,
terminations and absent agents; group and root (team) rewards and flags."""

from __future__ import annotations

import doctest
import pathlib
import re

import pytest
import torch
from tensordict import TensorDict

from marlkit.modules import StateValueCritic, ValueNorm
from marlkit.objectives import GAE, TD0, NStepTD, TDLambda, gae, nstep_td, td0, td_lambda
from marlkit.objectives import value as value_module

GAMMA, LMBDA = 0.9, 0.8


def ref_gae(v, nv, r, done, term, present):
    """Scalar loop over ``[T]`` lists."""
    T = len(v)
    adv = [0.0] * T
    nxt = 0.0
    for t in reversed(range(T)):
        if not present[t]:
            adv[t], nxt = 0.0, 0.0
            continue
        delta = r[t] + GAMMA * (0.0 if term[t] else nv[t]) - v[t]
        nxt = delta + GAMMA * LMBDA * (0.0 if done[t] else nxt)
        adv[t] = nxt
    return adv, [a + b for a, b in zip(adv, v)]


def ref_td_lambda(v, nv, r, done, term, present):
    T = len(v)
    g = [0.0] * T
    for t in reversed(range(T)):
        if not present[t]:
            g[t] = v[t]
            continue
        if t == T - 1 or done[t] or not present[t + 1]:
            follow = nv[t]
        else:
            follow = nv[t] + LMBDA * (g[t + 1] - nv[t])
        g[t] = r[t] + (0.0 if term[t] else GAMMA * follow)
    return [a - b for a, b in zip(g, v)], g


def ref_td0(v, nv, r, done, term, present):
    g = [r[t] + (0.0 if term[t] else GAMMA * nv[t]) if present[t] else v[t] for t in range(len(v))]
    return [a - b for a, b in zip(g, v)], g


def ref_nstep(n: int):
    """EPyMARL's n-step sum written as a loop from each start: up to ``n`` rewards, then the
    next value of the last step summed (none at a termination); an episode end, the data's end
    or an absent next agent ends the sum early, bootstrapping there."""

    def ref(v, nv, r, done, term, present):
        T = len(v)
        g = [0.0] * T
        for t in range(T):
            if not present[t]:
                g[t] = v[t]
                continue
            total, discount = 0.0, 1.0
            for step in range(n):
                u = t + step
                total += discount * r[u]
                last = step == n - 1 or done[u] or u == T - 1 or not present[u + 1]
                if last:
                    total += 0.0 if term[u] else discount * GAMMA * nv[u]
                    break
                discount *= GAMMA
            g[t] = total
        return [a - b for a, b in zip(g, v)], g

    return ref


def random_batch(B: int = 3, T: int = 12, n: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(B, T, n, 1, generator=g) < 0.25
    trunc = done & (torch.rand(B, T, n, 1, generator=g) < 0.5)
    return {
        "v": torch.randn(B, T, n, 1, generator=g),
        "nv": torch.randn(B, T, n, 1, generator=g),
        "r": torch.randn(B, T, n, 1, generator=g),
        "done": done,
        "term": done & ~trunc,
        "mask": torch.rand(B, T, n, generator=g) > 0.2,
    }


def reference(fn, d: dict[str, torch.Tensor], use_mask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, n, _ = d["v"].shape
    adv, tgt = torch.zeros(B, T, n, 1), torch.zeros(B, T, n, 1)
    for b in range(B):
        for i in range(n):
            col = {k: d[k][b, :, i].reshape(T).tolist() for k in ("v", "nv", "r", "done", "term")}
            present = d["mask"][b, :, i].tolist() if use_mask else [True] * T
            a, t = fn(col["v"], col["nv"], col["r"], col["done"], col["term"], present)
            adv[b, :, i, 0], tgt[b, :, i, 0] = torch.tensor(a), torch.tensor(t)
    return adv, tgt


CASES = [
    (lambda *a, **k: gae(GAMMA, LMBDA, *a, **k), ref_gae),
    (lambda *a, **k: td_lambda(GAMMA, LMBDA, *a, **k), ref_td_lambda),
    (lambda *a, **k: td0(GAMMA, *a, **k), ref_td0),
    (lambda *a, **k: nstep_td(GAMMA, 1, *a, **k), ref_nstep(1)),
    (lambda *a, **k: nstep_td(GAMMA, 3, *a, **k), ref_nstep(3)),
    (lambda *a, **k: nstep_td(GAMMA, 40, *a, **k), ref_nstep(40)),  # n past the data's T
]


@pytest.mark.parametrize(
    ("fn", "ref"), CASES, ids=["gae", "td_lambda", "td0", "nstep1", "nstep3", "nstep40"]
)
@pytest.mark.parametrize("use_mask", [False, True])
def test_functional_matches_reference_loop(fn, ref, use_mask: bool) -> None:
    d = random_batch()
    mask = d["mask"].unsqueeze(-1) if use_mask else None
    adv, tgt = fn(d["v"], d["nv"], d["r"], d["done"], d["term"], mask=mask, time_dim=-3)
    radv, rtgt = reference(ref, d, use_mask)
    torch.testing.assert_close(adv, radv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tgt, rtgt, rtol=1e-5, atol=1e-5)


def test_nstep_on_whole_episodes_is_epymarls_q_nstep() -> None:
    # EPyMARL's ppo_learner.nstep_returns on a batch of whole episodes (values [B, T + 1], the
    # last one the final observation's; filled rows; add_value_last_step), in its own terms
    gamma, n, B, T = 0.99, 5, 4, 17
    g = torch.Generator().manual_seed(7)
    values, rewards = torch.randn(B, T + 1, generator=g), torch.randn(B, T, generator=g)
    lengths = [17, 17, 9, 3]  # rows 2 and 3 terminated early; rows 0 and 1 hit the time limit
    mask = torch.zeros(B, T)
    for b, length in enumerate(lengths):
        mask[b, :length] = 1.0
    expected = torch.zeros(B, T)
    for t_start in range(T):
        ret = torch.zeros(B)
        for step in range(n + 1):
            t = t_start + step
            if t >= T:
                break
            if step == n:
                ret += gamma**step * values[:, t] * mask[:, t]
            elif t == T - 1:
                ret += gamma**step * rewards[:, t] * mask[:, t]
                ret += gamma ** (step + 1) * values[:, t + 1]
            else:
                ret += gamma**step * rewards[:, t] * mask[:, t]
        expected[:, t_start] = ret
    # the same data as a collected batch: done at each row's last step, terminated where it
    # ended before the time limit (EPyMARL's filled-mask zeroes what follows: no bootstrap)
    done = torch.zeros(B, T, 1, dtype=torch.bool)
    term = torch.zeros(B, T, 1, dtype=torch.bool)
    for b, length in enumerate(lengths):
        done[b, length - 1] = True
        term[b, length - 1] = length < T
    present = mask.bool().unsqueeze(-1)
    r = rewards.unsqueeze(-1) * present
    _, target = nstep_td(
        gamma, n, values[:, :-1, None], values[:, 1:, None], r, done, term, mask=present
    )
    filled = mask.bool()
    torch.testing.assert_close(target[..., 0][filled], expected[filled], rtol=1e-5, atol=1e-5)


def test_truncation_bootstraps_termination_does_not() -> None:
    v, nv, r = torch.zeros(1, 1), torch.full((1, 1), 10.0), torch.ones(1, 1)
    done = torch.ones(1, 1, dtype=torch.bool)
    _, truncated = gae(0.5, 1.0, v, nv, r, done, torch.zeros_like(done))
    _, terminated = gae(0.5, 1.0, v, nv, r, done, done)
    assert truncated.item() == pytest.approx(6.0) and terminated.item() == pytest.approx(1.0)


def test_gae_equals_td_lambda_with_consistent_values() -> None:
    d = random_batch(seed=3)
    nv = torch.cat([d["v"][:, 1:], torch.randn(3, 1, 2, 1)], 1)
    a1, _ = gae(GAMMA, LMBDA, d["v"], nv, d["r"], d["done"], d["term"], time_dim=-3)
    a2, _ = td_lambda(GAMMA, LMBDA, d["v"], nv, d["r"], d["done"], d["term"], time_dim=-3)
    torch.testing.assert_close(a1, a2, rtol=1e-4, atol=1e-4)


def collected(d: dict[str, torch.Tensor], team: bool, root_flags: bool) -> TensorDict:
    B, T, n, _ = d["v"].shape
    agents = TensorDict({"state_value": d["v"], "mask": d["mask"]}, [B, T, n])
    nxt_agents = TensorDict({"state_value": d["nv"]}, [B, T, n])
    nxt = TensorDict({"agents": nxt_agents}, [B, T])
    if team:
        nxt.set("reward", d["r"][:, :, 0])
    else:
        nxt_agents.set("reward", d["r"])
    if root_flags:
        nxt.set("done", d["done"][:, :, 0])
        nxt.set("terminated", d["term"][:, :, 0])
    else:
        nxt_agents.set("done", d["done"])
        nxt_agents.set("terminated", d["term"])
    return TensorDict({"agents": agents, "next": nxt}, [B, T])


@pytest.mark.parametrize("team", [False, True])
@pytest.mark.parametrize("root_flags", [False, True])
@pytest.mark.parametrize(
    ("module", "ref"),
    [
        (GAE(GAMMA, LMBDA), ref_gae),
        (TDLambda(GAMMA, LMBDA), ref_td_lambda),
        (TD0(GAMMA), ref_td0),
        (NStepTD(GAMMA, 5), ref_nstep(5)),
    ],
    ids=["GAE", "TDLambda", "TD0", "NStepTD"],
)
def test_modules_broadcast_root_rewards_and_flags(
    module, ref, team: bool, root_flags: bool
) -> None:
    d = random_batch(seed=1)
    if team:  # one reward for the team
        d["r"] = d["r"][:, :, :1].expand_as(d["r"]).contiguous()
    if root_flags:
        d["done"] = d["done"][:, :, :1].expand_as(d["done"]).contiguous()
        d["term"] = d["term"][:, :, :1].expand_as(d["term"]).contiguous()
    td = module(collected(d, team, root_flags))
    radv, rtgt = reference(ref, d, use_mask=True)
    torch.testing.assert_close(td["agents", "advantage"], radv, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(td["agents", "value_target"], rtgt, rtol=1e-5, atol=1e-5)


def test_leading_batch_dims_and_time_dim() -> None:
    d = random_batch(B=6, seed=2)
    flat = GAE(GAMMA, LMBDA)(collected(d, False, False))
    nested = GAE(GAMMA, LMBDA)(collected(d, False, False).reshape(2, 3, 12))
    torch.testing.assert_close(
        nested["agents", "advantage"].reshape(6, 12, 2, 1), flat["agents", "advantage"]
    )


def test_value_network_and_value_norm() -> None:
    torch.manual_seed(0)
    B, T, n = 2, 5, 3
    critic = StateValueCritic(n, 4, num_cells=8)
    obs, next_obs = torch.randn(B, T, n, 4), torch.randn(B, T, n, 4)
    td = TensorDict(
        {
            "agents": TensorDict({"observation": obs}, [B, T, n]),
            "next": TensorDict(
                {
                    "agents": TensorDict({"observation": next_obs}, [B, T, n]),
                    "reward": torch.randn(B, T, 1),
                    "done": torch.zeros(B, T, 1, dtype=torch.bool),
                    "terminated": torch.zeros(B, T, 1, dtype=torch.bool),
                },
                [B, T],
            ),
        },
        [B, T],
    )
    norm = ValueNorm()
    norm.update(torch.randn(100, 1) * 3 + 1)
    out = GAE(GAMMA, LMBDA, critic, value_norm=norm)(td.clone())
    with torch.no_grad():
        v = norm.denormalize(critic.module(obs))
        nv = norm.denormalize(critic.module(next_obs))
    adv, _ = gae(
        GAMMA,
        LMBDA,
        v,
        nv,
        td["next", "reward"].unsqueeze(-2),
        td["next", "done"].unsqueeze(-2),
        td["next", "terminated"].unsqueeze(-2),
        time_dim=-3,
    )
    torch.testing.assert_close(out["agents", "advantage"], adv)
    assert not out["agents", "advantage"].requires_grad


def test_errors_name_keys_and_shapes() -> None:
    d = random_batch()
    td = collected(d, False, False)
    with pytest.raises(KeyError, match=r"missing state value \('agents', 'state_value'\)"):
        GAE(GAMMA, LMBDA, group="agents").forward(td.exclude(("agents", "state_value")))
    with pytest.raises(KeyError, match="missing reward"):
        GAE(GAMMA, LMBDA).forward(td.exclude(("next", "agents", "reward")))
    bad = td.clone()
    bad["next", "agents"].set("done", torch.zeros(3, 12, 2, 2, dtype=torch.bool), inplace=False)
    with pytest.raises(ValueError, match=r"done .* shape \[3, 12, 2, 2\] does not line up"):
        GAE(GAMMA, LMBDA).forward(bad)
    # a root team reward of [*B, T] (not [*B, T, 1]): named as given, not as reshaped
    bad = td.exclude(("next", "agents", "reward"))
    bad["next", "reward"] = torch.zeros(3, 12)
    with pytest.raises(
        ValueError, match=r"reward \('next', 'reward'\) of shape \[3, 12\] .* \[\*B, T, 1\] at"
    ):
        GAE(GAMMA, LMBDA).forward(bad)
    with pytest.raises(ValueError, match="unknown key name 'values'"):
        GAE(GAMMA, LMBDA).set_keys(values="x")
    with pytest.raises(ValueError, match="must broadcast"):
        gae(
            GAMMA,
            LMBDA,
            torch.zeros(3, 4),
            torch.zeros(3, 5),
            torch.zeros(3, 4),
            torch.zeros(3, 4, dtype=torch.bool),
            torch.zeros(3, 4, dtype=torch.bool),
        )
    with pytest.raises(
        ValueError, match=r"GAE: lmbda must be a finite number in \[0, 1\], got 1\.5"
    ):
        GAE(0.9, 1.5)


def test_the_functions_are_documented_with_executed_examples() -> None:
    # docs/algorithms.md's blocks run in tests/test_docs.py; the docstring's here.
    result = doctest.testmod(value_module, raise_on_error=False, verbose=False)
    assert result.attempted >= 1 and result.failed == 0, result
    guide = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "algorithms.md").read_text()
    blocks = "".join(re.findall(r"^```python\n(.*?)^```", guide, re.S | re.M))
    for call in ("gae(", "td_lambda(", "td0(", "nstep_td(", "time_dim=-3"):
        assert call in blocks, f"docs/algorithms.md has no executed example of {call}"
    for fn in (gae, td_lambda, td0, nstep_td):
        assert "time_dim=-3" in " ".join((fn.__doc__ or "").split()), fn.__name__


@pytest.mark.parametrize("fn", [gae, td_lambda, td0, nstep_td])
def test_functional_time_dim_outside_the_broadcast_shape_is_named(fn) -> None:
    coefficients = {td0: (GAMMA,), nstep_td: (GAMMA, 3)}.get(fn, (GAMMA, LMBDA))
    v, flag = torch.zeros(1, 3, 1), torch.zeros(1, 3, 1, dtype=torch.bool)
    expected = (
        "time_dim=-4 is not a dim of the broadcast shape [1, 3, 1] (time_dim must be in [-3, 2])"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        fn(*coefficients, v, v, v, flag, flag, time_dim=-4)
    with pytest.raises(
        TypeError, match=r"value estimator: time_dim must be an int, got float: 1\.5"
    ):
        fn(*coefficients, v, v, v, flag, flag, time_dim=1.5)
    with pytest.raises(
        TypeError, match=r"value estimator: time_dim must be an int, got bool: True"
    ):
        fn(*coefficients, v, v, v, flag, flag, time_dim=True)


def test_nstep_refuses_n_below_one() -> None:
    v, flag = torch.zeros(1, 3, 1), torch.zeros(1, 3, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"nstep_td: n must be .*>= 1.*got 0"):
        nstep_td(GAMMA, 0, v, v, v, flag, flag)
    with pytest.raises(TypeError, match=r"NStepTD: n must be an int >= 1, got float: 2\.5"):
        NStepTD(GAMMA, 2.5)
