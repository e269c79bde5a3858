"""The peer side of ``benchmarks/results.py mappo-vmas``: TorchRL's multi-agent PPO tutorial recipe.

Runs under a Python that has TorchRL (0.14) and VMAS installed, not marlkit's venv:

    /path/to/torchrl-venv/bin/python benchmarks/peers/torchrl_mappo.py --seed 0

The recipe is the one of TorchRL's ``multiagent_ppo`` tutorial (VMAS navigation, 3 agents, 60 envs
x 100 steps per batch, 10 batches, 30 epochs of minibatches of 400, lr 3e-4, clip 0.2, gamma 0.99,
lambda 0.9, entropy 1e-4, 2 x 256 Tanh with shared parameters, centralised critic, smooth-L1
critic loss, no advantage normalisation, gradient norm clipped at 1), which marlkit's
``configs/mappo_ippo.yaml`` copies. Prints one JSON line: the last batch's mean episode reward,
the wall-clock seconds (imports excluded on both sides: from the env's construction to the
end), and the time spent collecting and updating.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from tensordict.nn import TensorDictModule
from tensordict.nn.distributions import NormalParamExtractor
from torch import nn
from torchrl.collectors import Collector
from torchrl.data.replay_buffers import ReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.data.replay_buffers.storages import LazyTensorStorage
from torchrl.envs import RewardSum, TransformedEnv
from torchrl.envs.libs.vmas import VmasEnv
from torchrl.modules import MultiAgentMLP, ProbabilisticActor, TanhNormal
from torchrl.objectives import ClipPPOLoss, ValueEstimators


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    frames_per_batch, minibatch, epochs = 6000, 400, 30
    env = VmasEnv(
        scenario="navigation",
        num_envs=60,
        continuous_actions=True,
        max_steps=100,
        device="cpu",
        seed=args.seed,
        n_agents=3,
    )
    env = TransformedEnv(
        env, RewardSum(in_keys=[env.reward_key], out_keys=[("agents", "episode_reward")])
    )
    obs = env.observation_spec["agents", "observation"].shape[-1]
    spec = env.full_action_spec_unbatched[env.action_key]
    n_act = spec.shape[-1]
    policy_net = nn.Sequential(
        MultiAgentMLP(
            n_agent_inputs=obs,
            n_agent_outputs=2 * n_act,
            n_agents=3,
            centralised=False,
            share_params=True,
            depth=2,
            num_cells=256,
            activation_class=nn.Tanh,
        ),
        NormalParamExtractor(),
    )
    policy = ProbabilisticActor(
        module=TensorDictModule(
            policy_net,
            in_keys=[("agents", "observation")],
            out_keys=[("agents", "loc"), ("agents", "scale")],
        ),
        spec=env.full_action_spec_unbatched,
        in_keys=[("agents", "loc"), ("agents", "scale")],
        out_keys=[env.action_key],
        distribution_class=TanhNormal,
        distribution_kwargs={"low": spec.space.low, "high": spec.space.high},
        return_log_prob=True,
    )
    critic = TensorDictModule(
        MultiAgentMLP(
            n_agent_inputs=obs,
            n_agent_outputs=1,
            n_agents=3,
            centralised=True,
            share_params=True,
            depth=2,
            num_cells=256,
            activation_class=nn.Tanh,
        ),
        in_keys=[("agents", "observation")],
        out_keys=[("agents", "state_value")],
    )
    collector = Collector(
        env,
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=frames_per_batch * args.batches,
    )
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(frames_per_batch),
        sampler=SamplerWithoutReplacement(),
        batch_size=minibatch,
    )
    loss = ClipPPOLoss(
        actor_network=policy,
        critic_network=critic,
        clip_epsilon=0.2,
        entropy_coeff=1e-4,
        normalize_advantage=False,
    )
    loss.set_keys(
        reward=env.reward_key,
        action=env.action_key,
        value=("agents", "state_value"),
        done=("agents", "done"),
        terminated=("agents", "terminated"),
    )
    loss.make_value_estimator(ValueEstimators.GAE, gamma=0.99, lmbda=0.9)
    gae = loss.value_estimator
    # The parameter list built once, as marlkit's script does (not a module walk per step).
    params = list(loss.parameters())
    optim = torch.optim.Adam(params, 3e-4)
    collect_s = train_s = 0.0
    reward, curve = float("nan"), []
    tick = time.perf_counter()
    for batch in collector:
        collect_s += time.perf_counter() - tick
        tick = time.perf_counter()
        shape = batch.get_item_shape(("next", env.reward_key))
        for flag in ("done", "terminated"):
            batch.set(
                ("next", "agents", flag), batch.get(("next", flag)).unsqueeze(-1).expand(shape)
            )
        with torch.no_grad():
            gae(
                batch,
                params=loss.critic_network_params,
                target_params=loss.target_critic_network_params,
            )
        buffer.extend(batch.reshape(-1))
        for _ in range(epochs):
            for _ in range(frames_per_batch // minibatch):
                terms = loss(buffer.sample())
                total = terms["loss_objective"] + terms["loss_critic"] + terms["loss_entropy"]
                total.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optim.step()
                optim.zero_grad()
        collector.update_policy_weights_()
        done = batch.get(("next", "agents", "done"))
        reward = batch.get(("next", "agents", "episode_reward"))[done].mean().item()
        curve.append(reward)
        train_s += time.perf_counter() - tick
        tick = time.perf_counter()
    collector.shutdown()
    print(
        json.dumps(
            {
                "side": "torchrl",
                "seed": args.seed,
                "final_episode_reward": reward,
                "curve": [[frames_per_batch * (i + 1), r] for i, r in enumerate(curve)],
                "seconds": time.perf_counter() - start,
                "collection_s": collect_s,
                "training_s": train_s,
                "does": "VMAS navigation (VMAS's own done at 100 steps), GAE, 30 epochs x 15 "
                "minibatches of ClipPPOLoss per batch; nn.Tanh, "
                "torch.optim.Adam with its defaults (per-parameter on CPU)",
            }
        )
    )


if __name__ == "__main__":
    main()
