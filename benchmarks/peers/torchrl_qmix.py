"""The peer side of ``benchmarks/results.py qmix-vmas``: TorchRL's ``qmix_vdn`` recipe.

Runs under a Python that has TorchRL (0.14) and VMAS installed, not marlkit's venv:

    /path/to/torchrl-venv/bin/python benchmarks/peers/torchrl_qmix.py --seed 0

TorchRL's ``sota-implementations/multiagent/qmix_vdn.py`` at a CPU budget, as the issue sets it
and marlkit's ``configs/qmix_vdn.yaml`` copies: VMAS navigation with discrete actions, 3 agents,
60 envs x 100 steps per batch, 20 batches, a buffer of one batch sampled without replacement,
10 epochs of minibatches of 400, lr 3e-4, gamma 0.9 (TD(0)), soft target updates (tau 0.005),
epsilon 0.3 -> 0 over half the frames, a shared 2 x 256 Tanh Q-network, a QMixer (embedding 32)
over the agents' observations, gradient norm clipped at 10. At the end, one greedy rollout of
100 steps on 60 fresh envs; the reported reward is each env's episode return (mean over the
agents), averaged over the envs. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import SamplerWithoutReplacement
from torchrl.data.replay_buffers.storages import LazyTensorStorage
from torchrl.envs import RewardSum, TransformedEnv
from torchrl.envs.libs.vmas import VmasEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import EGreedyModule, MultiAgentMLP, QMixer, QValueModule, SafeSequential
from torchrl.objectives import QMixerLoss, SoftUpdate, ValueEstimators


def make_env(num_envs: int, seed: int) -> TransformedEnv:
    env = VmasEnv(
        scenario="navigation",
        num_envs=num_envs,
        continuous_actions=False,
        max_steps=100,
        device="cpu",
        seed=seed,
        n_agents=3,
    )
    return TransformedEnv(
        env, RewardSum(in_keys=[env.reward_key], out_keys=[("agents", "episode_reward")])
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    frames_per_batch, minibatch, epochs = 6000, 400, 10
    total_frames = frames_per_batch * args.batches
    env = make_env(60, args.seed)
    obs_shape = env.observation_spec["agents", "observation"].shape[-1:]
    n_actions = env.full_action_spec_unbatched[env.action_key].space.n
    net = MultiAgentMLP(
        n_agent_inputs=obs_shape[-1],
        n_agent_outputs=n_actions,
        n_agents=3,
        centralised=False,
        share_params=True,
        depth=2,
        num_cells=256,
        activation_class=nn.Tanh,
    )
    qnet = SafeSequential(
        TensorDictModule(
            net, in_keys=[("agents", "observation")], out_keys=[("agents", "action_value")]
        ),
        QValueModule(
            action_value_key=("agents", "action_value"),
            out_keys=[
                env.action_key,
                ("agents", "action_value"),
                ("agents", "chosen_action_value"),
            ],
            spec=env.full_action_spec_unbatched,
            action_space=None,
        ),
    )
    explore = TensorDictSequential(
        qnet,
        EGreedyModule(
            eps_init=0.3,
            eps_end=0.0,
            annealing_num_steps=total_frames // 2,
            action_key=env.action_key,
            spec=env.full_action_spec_unbatched,
        ),
    )
    mixer = TensorDictModule(
        QMixer(state_shape=(3, *obs_shape), mixing_embed_dim=32, n_agents=3, device="cpu"),
        in_keys=[("agents", "chosen_action_value"), ("agents", "observation")],
        out_keys=["chosen_action_value"],
    )
    collector = Collector(
        env, explore, frames_per_batch=frames_per_batch, total_frames=total_frames
    )
    buffer = TensorDictReplayBuffer(
        storage=LazyTensorStorage(frames_per_batch),
        sampler=SamplerWithoutReplacement(),
        batch_size=minibatch,
    )
    loss = QMixerLoss(qnet, mixer, delay_value=True)
    loss.set_keys(
        action_value=("agents", "action_value"),
        local_value=("agents", "chosen_action_value"),
        global_value="chosen_action_value",
        action=env.action_key,
    )
    loss.make_value_estimator(ValueEstimators.TD0, gamma=0.9)
    updater = SoftUpdate(loss, eps=1 - 0.005)
    # The parameter list built once, as marlkit's script does (not a module walk per step).
    params = list(loss.parameters())
    optim = torch.optim.Adam(params, 3e-4)
    collect_s = train_s = 0.0
    curve = []
    tick = time.perf_counter()
    for batch in collector:
        collect_s += time.perf_counter() - tick
        tick = time.perf_counter()
        # The team reward at the root, the mean of the agents' (as marlkit's QMixerLoss does).
        batch.set(("next", "reward"), batch.get(("next", env.reward_key)).mean(-2))
        del batch["next", env.reward_key]
        done = batch.get(("next", "done")).squeeze(-1)
        curve.append(batch.get(("next", "agents", "episode_reward")).mean(-2)[done].mean().item())
        batch.set(
            ("next", "episode_reward"), batch.get(("next", "agents", "episode_reward")).mean(-2)
        )
        del batch["next", "agents", "episode_reward"]
        buffer.extend(batch.reshape(-1))
        for _ in range(epochs):
            for _ in range(frames_per_batch // minibatch):
                terms = loss(buffer.sample())
                terms["loss"].backward()
                torch.nn.utils.clip_grad_norm_(params, 10.0)
                optim.step()
                optim.zero_grad()
                updater.step()
        explore[1].step(frames=batch.numel())
        collector.update_policy_weights_()
        train_s += time.perf_counter() - tick
        tick = time.perf_counter()
    collector.shutdown()
    test_env = make_env(60, args.seed + 10_000)
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        rollout = test_env.rollout(100, qnet, break_when_any_done=False)
    reward = rollout.get(("next", "agents", "reward")).mean(-2).sum(1).mean().item()
    print(
        json.dumps(
            {
                "side": "torchrl",
                "seed": args.seed,
                "final_episode_reward": reward,
                "seconds": time.perf_counter() - start,
                "collection_s": collect_s,
                "training_s": train_s,
                "curve": [[frames_per_batch * (i + 1), r] for i, r in enumerate(curve)],
                "does": "VMAS navigation (discrete), 20 batches, 10 epochs x 15 minibatches of "
                "QMixerLoss (TD(0)) with a soft target update after each, then one greedy "
                "100-step rollout of 60 envs; nn.Tanh, "
                "torch.optim.Adam with its defaults (per-parameter on CPU)",
            }
        )
    )


if __name__ == "__main__":
    main()
