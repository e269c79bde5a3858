"""ModelConfig and build_model: every kind with every memory, keys read and written, actors
on top, step and sequence modes agreeing, centralised heads, separate actor and critic states,
and errors that name the config key and the shape expected."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict

import marlkit
from marlkit.collectors import Collector
from marlkit.data import Composite, Unbounded
from marlkit.envs import InitTracker, TransformedEnv
from marlkit.modules import (
    ModelConfig,
    NormalParamExtractor,
    ProbabilisticActor,
    TanhNormal,
    build_model,
    set_recurrent_mode,
)

N, B = 3, 4
SMALL = {"num_cells": 16, "embed_dim": 8, "num_heads": 2, "hidden_size": 8}
CNN = {"cnn_cells": [4, 4], "kernel_size": 3, "stride": 2}


def _spec(**entries: tuple[int, ...]) -> Composite:
    """A group ``agents`` of N agents whose observation holds ``entries`` (``*_mask``: bool)."""
    obs = {
        name: Unbounded(
            shape=(B, N, *trailing),
            dtype=torch.bool if name.endswith("_mask") else torch.float32,
        )
        for name, trailing in entries.items()
    }
    return Composite(
        agents=Composite(observation=Composite(**obs, shape=(B, N)), shape=(B, N)), shape=(B,)
    )


def _vector_spec(features: int = 9) -> Composite:
    return Composite(
        agents=Composite(observation=Unbounded(shape=(B, N, features)), shape=(B, N)),
        shape=(B,),
    )


SPECS = {
    "mlp": (_vector_spec(), {}),
    "cnn": (_spec(image=(3, 12, 12), extra=(4,)), CNN),
    "deepsets": (_spec(units=(6, 5), units_mask=(6,), own=(4,)), {}),
    "attention": (_spec(units=(6, 5), units_mask=(6,)), {}),
    "gnn": (_spec(features=(7,), pos=(2,)), {"position_key": "pos", "edge_radius": 0.5}),
}


def _data(spec: Composite) -> TensorDict:
    torch.manual_seed(1)
    td = spec.rand()
    td["is_init"] = torch.ones(B, 1, dtype=torch.bool)
    return td


@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("memory", ["none", "gru", "lstm"])
def test_every_kind_and_memory_builds_and_runs(kind: str, memory: str) -> None:
    spec, extra = SPECS[kind]
    cfg = ModelConfig(kind=kind, memory=memory, share_params=False, **SMALL, **extra)
    net = build_model(cfg, spec, group="agents", n_outputs=5, out_keys=[("agents", "logits")])
    td = _data(spec)
    out = net(td)
    assert out["agents", "logits"].shape == (B, N, 5)
    assert torch.isfinite(out["agents", "logits"]).all()
    assert all(k[0] == "agents" for k in net.in_keys if isinstance(k, tuple))
    if memory != "none":
        state = 8 if memory == "gru" else 16
        assert out["agents", "rnn_state"].shape == (B, N, state)
    out["agents", "logits"].sum().backward()
    for name, p in net.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


def test_reads_exactly_the_observation_entries() -> None:
    spec, _ = SPECS["deepsets"]
    net = build_model(
        ModelConfig(kind="deepsets", **SMALL), spec, group="agents", n_outputs=2,
        out_keys=[("agents", "out")],
    )  # fmt: skip
    obs = ("agents", "observation")
    assert net.in_keys == [(*obs, "units"), (*obs, "units_mask"), (*obs, "own")]
    td = _data(spec)
    y = net(td.clone())["agents", "out"]
    td["agents", "observation", "units"][~td["agents", "observation", "units_mask"]] = 1e6
    torch.testing.assert_close(net(td)["agents", "out"], y)  # masked units change nothing


def test_probabilistic_actor_on_a_cnn_model() -> None:
    spec, extra = SPECS["cnn"]
    net = build_model(
        ModelConfig(kind="cnn", **SMALL, **extra),
        spec,
        group="agents",
        n_outputs=2 * 2,
        out_keys=[("agents", "loc"), ("agents", "scale")],
        postprocess=NormalParamExtractor(),
    )
    actor = ProbabilisticActor(net, group="agents", distribution_class=TanhNormal)
    out = actor(_data(spec))
    assert out["agents", "action"].shape == (B, N, 2)
    assert out["agents", "action_log_prob"].shape == (B, N)


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_centralised_head_reads_every_agent(kind: str) -> None:
    spec, extra = SPECS[kind]
    td = _data(spec)
    key = next(k for k in td.keys(True, True) if k[:2] == ("agents", "observation"))
    for centralised in (False, True):
        cfg = ModelConfig(kind=kind, centralised=centralised, **SMALL, **extra)
        net = build_model(cfg, spec, group="agents", n_outputs=1, out_keys=[("agents", "v")])
        before = net(td.clone())["agents", "v"]
        td2 = td.clone()
        td2[key][:, 0] += 1.0
        changed = (net(td2)["agents", "v"] - before).abs().amax(dim=(0, 2)) > 1e-6
        assert changed.tolist() == ([True] * N if centralised else [True, False, False])


def test_step_by_step_equals_the_sequence() -> None:
    spec, _ = SPECS["mlp"]
    cfg = ModelConfig(memory="gru", share_params=False, **SMALL)
    net = build_model(cfg, spec, group="agents", n_outputs=3, out_keys=[("agents", "q")])
    steps = 5
    torch.manual_seed(0)
    obs = torch.randn(B, steps, N, 9)
    init = torch.zeros(B, steps, 1, dtype=torch.bool)
    init[:, 0] = True
    init[1, 3] = True  # an episode starting mid-sequence
    outs, carried = [], None
    first_state = None
    for t in range(steps):
        td = TensorDict({"agents": {"observation": obs[:, t]}, "is_init": init[:, t]}, [B])
        if carried is not None:
            td["agents", "rnn_state"] = carried
        td = net(td)
        if t == 0:
            first_state = td["agents", "rnn_state_in"]
        carried = td["agents", "rnn_state"]
        outs.append(td["agents", "q"])
    seq = TensorDict({"agents": {"observation": obs}, "is_init": init}, [B, steps])
    seq["agents", "rnn_state_in"] = torch.stack([first_state] * steps, 1)
    with set_recurrent_mode(True):
        out = net(seq)["agents", "q"]
    torch.testing.assert_close(out, torch.stack(outs, 1), rtol=1e-5, atol=1e-5)


def test_actor_and_critic_keep_separate_states() -> None:
    spec, _ = SPECS["mlp"]
    cfg = ModelConfig(memory="lstm", **SMALL)
    actor = build_model(cfg, spec, group="agents", n_outputs=2, out_keys=[("agents", "logits")])
    critic = build_model(
        cfg, spec, group="agents", n_outputs=1, out_keys=[("agents", "v")], name="critic"
    )
    td = critic(actor(_data(spec)))
    assert td["agents", "rnn_state"].shape == td["agents", "critic_rnn_state"].shape
    assert ("agents", "critic_rnn_state") in critic.out_keys
    assert ("agents", "rnn_state") not in critic.out_keys
    assert not torch.equal(td["agents", "rnn_state"], td["agents", "critic_rnn_state"])


def test_shared_and_independent_parameter_counts() -> None:
    spec, _ = SPECS["attention"]

    def count(share: bool) -> int:
        cfg = ModelConfig(kind="attention", share_params=share, **SMALL)
        net = build_model(cfg, spec, group="agents", n_outputs=2, out_keys=[("agents", "o")])
        return sum(p.numel() for p in net.parameters())

    assert count(False) == N * count(True)


def _build(kind: str, spec: Composite, **kwargs: Any) -> Any:
    cfg = ModelConfig(kind=kind, **{**SMALL, **kwargs})
    return build_model(cfg, spec, group="agents", n_outputs=2, out_keys=[("agents", "o")])


def test_observations_that_do_not_fit_the_kind() -> None:
    with pytest.raises(
        ValueError,
        match=r"model=cnn expects observations \[\*B, n, C, H, W\]; got observation \[\*B, 3, 9\]",
    ):
        _build("cnn", _vector_spec())
    with pytest.raises(
        ValueError,
        match=r"model=mlp expects vector observations \[\*B, n, F\]; got image "
        r"\[\*B, 3, 3, 12, 12\], extra \[\*B, 3, 4\] \(images: model=cnn\)",
    ):
        _build("mlp", SPECS["cnn"][0])
    with pytest.raises(ValueError, match=r"model=deepsets expects entity observations"):
        _build("deepsets", _vector_spec())
    with pytest.raises(ValueError, match=r"\(entity sets: model=deepsets or attention\)"):
        _build("gnn", SPECS["attention"][0])
    with pytest.raises(ValueError, match=r"model=attention expects .*entry 'vid' is \[\*B, 3, 2, "):
        _build("attention", _spec(vid=(2, 3, 8, 8)))
    with pytest.raises(ValueError, match=r"model=cnn: the images 'image' \[\*B, 3, 3, 4, 4\] are "):
        _build("cnn", _spec(image=(3, 4, 4)), cnn_cells=[4, 4], kernel_size=3, stride=1)
    with pytest.raises(ValueError, match=r"mask 'units_mask' must be \[\*B, n, k\] \[\*B, 3, 6\]"):
        _build("deepsets", _spec(units=(6, 5), units_mask=(5,)))
    with pytest.raises(TypeError, match=r"model=cnn: observation entry 'image' is torch.uint8"):
        spec = _spec(image=(3, 12, 12))
        spec["agents", "observation", "image"] = Unbounded(
            shape=(B, N, 3, 12, 12), dtype=torch.uint8
        )
        _build("cnn", spec)
    with pytest.raises(KeyError, match=r"model.position_key='where': no such entry"):
        _build("gnn", _vector_spec(), position_key="where")
    with pytest.raises(KeyError, match="observation spec has no group 'others'"):
        build_model(ModelConfig(), _vector_spec(), group="others", n_outputs=1, out_keys=["o"])


@pytest.mark.parametrize("memory", ["none", "gru"])
def test_the_heads_activation_is_the_configs(memory: str) -> None:
    """``ModelConfig.activation`` (a script's ``policy``/``critic.activation``) follows each
    hidden layer of the head; the encoder keeps its own (the GNN's Tanh)."""
    from marlkit.modules import MultiAgentGNN, MultiAgentMLP, Tanh

    spec, extra = SPECS["gnn"]
    for name, cls in (("tanh", Tanh), ("relu", torch.nn.ReLU)):
        net = _build("gnn", spec, memory=memory, depth=2, activation=name, **extra)
        gnn = next(m for m in net.modules() if isinstance(m, MultiAgentGNN))
        inside = {id(m) for m in gnn.modules()}
        (head,) = [m for m in net.modules() if isinstance(m, MultiAgentMLP) and id(m) not in inside]
        assert [type(a) for a in head.activations] == [cls, cls]
    assert ModelConfig().activation == "tanh"  # the networks as before


def test_config_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"model.activation must be one of \['tanh', 'relu'"):
        ModelConfig(activation="sigmoid")
    with pytest.raises(ValueError, match=r"model must be one of .*got 'cnnn'. Did you mean: cnn"):
        ModelConfig(kind="cnnn")
    with pytest.raises(ValueError, match=r"model.memory must be one of \['none', 'gru', 'lstm'\]"):
        ModelConfig(memory="rnn")
    with pytest.raises(ValueError, match=r"model.num_cells must be an int >= 1, got 0"):
        ModelConfig(num_cells=0)
    with pytest.raises(ValueError, match=r"model.embed_dim must be a multiple of model.num_heads"):
        ModelConfig(embed_dim=10, num_heads=4)
    with pytest.raises(ValueError, match=r"model.edge_radius needs model.position_key"):
        ModelConfig(kind="gnn", edge_radius=1.0)
    with pytest.raises(ValueError, match=r"model: unknown keys \['layers'\]"):
        ModelConfig.from_mapping({"kind": "mlp", "layers": 3})
    assert ModelConfig.from_mapping({"kind": "gnn", "memory": "gru"}).memory == "gru"
    with pytest.raises(TypeError, match="config must be a ModelConfig, got dict"):
        build_model({"kind": "mlp"}, _vector_spec(), group="agents", n_outputs=1, out_keys=["o"])  # type: ignore[arg-type]


def test_a_recurrent_gnn_actor_in_a_collector_replays_in_training() -> None:
    env = TransformedEnv(marlkit.make("navigation", num_envs=2, n_agents=3, seed=0), InitTracker())
    cfg = ModelConfig(kind="gnn", memory="gru", num_cells=16, hidden_size=8, embed_dim=8)
    net = build_model(
        cfg,
        env.observation_spec,
        group="agents",
        n_outputs=4,
        out_keys=[("agents", "loc"), ("agents", "scale")],
        postprocess=NormalParamExtractor(),
    )
    actor = ProbabilisticActor(net, group="agents")
    collector = Collector(env, actor, frames_per_batch=2 * 8, total_frames=2 * 8)
    batch = next(iter(collector))
    assert batch["agents", "rnn_state_in"].shape == (2, 8, 3, 8)
    replay = batch.select(*net.in_keys, "is_init", ("agents", "rnn_state_in")).clone()
    with set_recurrent_mode(True):
        loc = net(replay)["agents", "loc"]
    torch.testing.assert_close(loc, batch["agents", "loc"], rtol=1e-5, atol=1e-5)


def _smax_spec() -> tuple[Any, Composite]:
    from marlkit.scenarios.smax import SmaxEnv

    env = SmaxEnv("2s3z", 4, seed=0)
    return env, env.observation_spec


def test_inputs_read_named_entries_of_the_group_with_their_entity_mask() -> None:
    """SMAX's ``entities`` (a set per agent), ``own`` (a vector) and ``entity_mask``: a
    DeepSets or attention encoder reads them through ``inputs`` and ``entity_mask``, and an
    entity the mask hides changes nothing, whatever its features hold."""
    env, spec = _smax_spec()
    td = env.reset()
    for kind in ("deepsets", "attention"):
        cfg = ModelConfig(kind=kind, inputs=["entities", "own"], entity_mask="entity_mask", **SMALL)
        net = build_model(cfg, spec, group="ally", n_outputs=7, out_keys=[("ally", "q")])
        assert set(net.in_keys) == {("ally", "entities"), ("ally", "entity_mask"), ("ally", "own")}
        out = net(td.clone())["ally", "q"]
        assert out.shape == (4, 5, 7) and torch.isfinite(out).all()
        hidden = td.clone()
        mask = hidden["ally", "entity_mask"]
        assert (~mask).any()  # some entity slots are out of sight at the start
        hidden["ally", "entities"][~mask] = float("nan")
        torch.testing.assert_close(net(hidden)["ally", "q"], out)
        shown = td.clone()
        shown["ally", "entities"][mask] += 1.0
        assert not torch.allclose(net(shown)["ally", "q"], out)


def test_inputs_and_entity_mask_errors_name_the_key() -> None:
    _, spec = _smax_spec()

    def build(**kw: Any) -> Any:
        return build_model(
            ModelConfig(**{**SMALL, **kw}), spec, group="ally", n_outputs=3, out_keys=["q"]
        )

    with pytest.raises(KeyError, match=r"model.inputs names 'entites'.*Did you mean: entities"):
        build(kind="deepsets", inputs=["entites", "own"])
    with pytest.raises(TypeError, match=r"model.entity_mask 'own' must be a bool entry"):
        build(kind="deepsets", inputs=["entities"], entity_mask="own")
    with pytest.raises(ValueError, match=r"model.entity_mask masks entity sets.*model=mlp"):
        build(kind="mlp", inputs=["own"], entity_mask="entity_mask")
    with pytest.raises(ValueError, match=r"model=deepsets expects entity observations"):
        build(kind="deepsets", inputs=["own"])
    with pytest.raises(TypeError, match=r"model.inputs must be a list"):
        ModelConfig(inputs="entities")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"model.inputs must name each entry once"):
        ModelConfig(inputs=["own", "own"])
