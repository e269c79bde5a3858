"""``MultiAgentGRU`` and ``MultiAgentLSTM``: a recurrent cell per agent (or shared) whose state
lives in the TensorDict.

How the state travels (checked against :func:`marlkit.data.step_mdp` and ``EnvBase.step``):
``env.step`` replaces the whole ``"next"`` entry with what the simulator returned, so a key
a policy writes under ``"next"`` is lost; ``step_mdp`` keeps every *root* entry that ``"next"``
does not overwrite. The module therefore writes the state after the step at the root,
``(group, "rnn_state")`` ``[*B, n_agents, state]`` (the LSTM keeps ``h`` and ``c`` there side by
side, ``state = 2 * hidden``), and ``step_mdp`` hands it to the next
step, where the module reads it back. The state the step started from (zeroed where
``is_init`` is True) is written too, as ``(group, "rnn_state_in")``: the collected batch keeps
it, and training sequences (a batch ``[*B, T]`` or ``SliceSampler`` slices) start from the
first step's ``rnn_state_in``.

Two modes: step by step (the default; a rollout or a collector), and over whole sequences
inside :class:`set_recurrent_mode` ``(True)`` (training: the last batch dim is time, the
state is zeroed wherever ``is_init`` is True, also in the middle of a sequence). Both give
the same outputs for the same data. A GRU shared by its agents runs a batch of few sequences
on the CPU through ``torch.gru`` (its C++ loop and backward: 1.3-1.5x faster forward +
backward than the cell unrolled in Python for EPyMARL's 10 LBF episodes at 128 units,
``benchmarks/modules.py --only gru``); larger batches (where the arithmetic, not the per-op
overhead, sets the time), other cells, independent agents, autocast and ``torch.compile``
unroll :meth:`_cell` step by step.
"""

from __future__ import annotations

import contextvars
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar, cast

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from torch import nn

from marlkit._checks import check_int, check_ints
from marlkit.data.keys import (
    DEFAULT_GROUP,
    IS_INIT,
    OBSERVATION,
    RNN_STATE,
    NestedKey,
    join_key,
)
from marlkit.data.trajectories import check_time_order
from marlkit.modules.activations import Tanh
from marlkit.modules.mlp import (
    MultiAgentMLP,
    StackedLinear,
    check_agent_input,
    from_stacks,
    to_stacks,
)

__all__ = [
    "MEMORIES",
    "MultiAgentGRU",
    "MultiAgentLSTM",
    "carry_states",
    "recurrent_mode",
    "recurrent_modules",
    "recurrent_network",
    "set_recurrent_mode",
]

#: The recurrent cells :func:`recurrent_network` builds (``model.memory`` of the scripts).
MEMORIES = ("gru", "lstm")

_RECURRENT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "marlkit_recurrent_mode", default=False
)
F = TypeVar("F", bound=Callable[..., Any])


def recurrent_mode() -> bool:
    """Whether recurrent modules read whole sequences (the last batch dim is time)."""
    return _RECURRENT.get()


class set_recurrent_mode:
    """Run recurrent modules over whole sequences (``True``) or one step (``False``) inside a
    ``with`` block or a decorated function; blocks nest.

    Args:
        mode: ``True`` for sequences ``[*B, T]``, ``False`` for single steps.
    """

    def __init__(self, mode: bool = True):
        self.mode = bool(mode)
        self._tokens: list[contextvars.Token[bool]] = []

    def __enter__(self) -> set_recurrent_mode:
        self._tokens.append(_RECURRENT.set(self.mode))
        return self

    def __exit__(self, *exc: object) -> None:
        _RECURRENT.reset(self._tokens.pop())

    def __call__(self, fn: F) -> F:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with set_recurrent_mode(self.mode):
                return fn(*args, **kwargs)

        return cast(F, wrapped)


class _MultiAgentRNN(TensorDictModuleBase):
    """What the GRU and the LSTM share: keys, the state's journey, step and sequence modes.

    Subclasses set ``_gates`` (gate blocks per cell) and ``_state_factor`` (state width over
    ``hidden_size``) and implement :meth:`_cell`; the output is the state's first
    ``hidden_size`` features.
    """

    _gates = 1
    _state_factor = 1
    #: torch's whole-sequence op for the cell (``torch.gru``'s signature), where its outputs
    #: are every step's whole state (a GRU's; an LSTM's ``c`` per step is not among them)
    _sequence_op: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    #: the fused sequence only where a step's hidden-state matmul (``2 N 3H H`` floating-point
    #: operations, ``N`` rows x agents) is at most this: there the unrolled cell's per-op
    #: overhead outweighs the arithmetic; above it the unrolled cell is as fast or faster (and
    #: restarts cut ``torch.gru`` into many short calls). Crossover measured at ``N`` 32-48
    #: with 128 units on a 2-vCPU EPYC (``benchmarks/modules.py --only gru``)
    fused_max_step_flops: float = 4e6

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        n_agents: int,
        *,
        group: str = DEFAULT_GROUP,
        share_params: bool = False,
        in_key: NestedKey | None = None,
        out_key: NestedKey | None = None,
        init_key: str = IS_INIT,
        state_key: NestedKey | None = None,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        self.input_size = check_int("input_size", input_size, low=1)
        self.hidden_size = check_int("hidden_size", hidden_size, low=1)
        self.n_agents = check_int("n_agents", n_agents, low=1)
        self.group, self.init_key = group, init_key
        self.n_stacks = 1 if share_params else n_agents
        self.in_key = in_key if in_key is not None else (group, OBSERVATION)
        self.out_key = out_key if out_key is not None else (group, "rnn_output")
        self.state_key = state_key if state_key is not None else join_key(group, RNN_STATE)
        path = (self.state_key,) if isinstance(self.state_key, str) else tuple(self.state_key)
        # (group, "rnn_state") -> (group, "rnn_state_in"): RNN_STATE_IN for the default key
        self.state_in_key = join_key(path[:-1], f"{path[-1]}_in")
        # rnn_state_in is read in recurrent mode (a sequence's first state): listed, so that
        # a loss's in_keys (what a buffer stores) keep it
        self.in_keys = cast(
            Any,
            [self.in_key, self.state_key, self.state_in_key, join_key(group, init_key), init_key],
        )
        self.out_keys = cast(Any, [self.out_key, self.state_key, self.state_in_key])
        self.state_size = self._state_factor * hidden_size
        gates = self._gates * hidden_size
        self.input_gates = StackedLinear(self.n_stacks, input_size, gates, device)
        self.hidden_gates = StackedLinear(self.n_stacks, hidden_size, gates, device)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw new weights, uniform in ``±1/sqrt(hidden_size)`` (torch's ``GRUCell`` /
        ``LSTMCell`` initialisation)."""
        bound = self.hidden_size**-0.5
        with torch.no_grad():
            for p in self.parameters():
                p.uniform_(-bound, bound)

    # ------------------------------------------------------------------ maths
    def _cell(self, gx: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """One step in the stacked layout: ``gx`` ``[S, N, gates * H]`` (input gates),
        ``state`` ``[S, N, state]``; returns the new state."""
        raise NotImplementedError

    def _reset_flag(self, td: TensorDictBase, shape: tuple[int, ...]) -> torch.Tensor:
        """The episode-start flag broadcast to ``[*shape, n_agents, 1]``: the group's
        ``[*B, n_agents, 1]``, else the root's ``[*B, 1]``."""
        key: NestedKey = join_key(self.group, self.init_key)
        flag = td.get(key, None)
        root = flag is None  # no group flag: the root's, one for every agent
        if root:
            key = self.init_key
            flag = td.get(key, None)
            if flag is None:
                flags = f"{(self.group, self.init_key)!r} or {self.init_key!r}"
                raise KeyError(
                    f"{type(self).__name__} needs the episode-start flag {flags} (add "
                    "marlkit.envs.InitTracker to the env)"
                )
        if flag.dtype != torch.bool:
            raise ValueError(
                f"{type(self).__name__}: the episode-start flag {key!r} must be a bool tensor, "
                f"got {flag.dtype}"
            )
        wanted = (*shape, 1) if root else (*shape, self.n_agents, 1)
        if tuple(flag.shape) != wanted:
            expected = "[*B, 1]" if root else f"[*B, {self.n_agents}, 1]"
            raise ValueError(
                f"{type(self).__name__}: the episode-start flag {key!r} must be {expected} "
                f"{list(wanted)}, got {list(flag.shape)}"
            )
        if root:
            flag = flag.unsqueeze(-2)
        return flag.expand(*shape, self.n_agents, 1)

    def _state(self, td: TensorDictBase, key: NestedKey, batch: tuple[int, ...], x: torch.Tensor):
        h = td.get(key, None)
        if h is None:
            return x.new_zeros(*batch, self.n_agents, self.state_size)
        name = type(self).__name__
        check_agent_input(h, self.n_agents, self.state_size, f"{name} state {key!r}")
        return h

    # ------------------------------------------------------------------ forward
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Step by step (``[*B]``) or, in recurrent mode, over sequences (``[*B, T]``)."""
        name = type(self).__name__
        x = tensordict.get(self.in_key, None)
        if x is None:
            raise KeyError(f"{name}: missing input {self.in_key!r}")
        batch = check_agent_input(x, self.n_agents, self.input_size, f"{name} {self.in_key!r}")
        if recurrent_mode():
            return self._sequence(tensordict, x, batch)
        reset = self._reset_flag(tensordict, batch)
        h_in = self._state(tensordict, self.state_key, batch, x).masked_fill(reset, 0.0)
        rows = x.reshape(-1, self.n_agents, self.input_size)
        h_rows = h_in.reshape(-1, self.n_agents, self.state_size)
        gx = self.input_gates(to_stacks(rows, self.n_stacks))
        h = from_stacks(self._cell(gx, to_stacks(h_rows, self.n_stacks)), self.n_agents)
        h = h.reshape(*batch, self.n_agents, self.state_size)
        tensordict.set(self.out_key, h[..., : self.hidden_size])
        tensordict.set(self.state_in_key, h_in)
        tensordict.set(self.state_key, h)
        return tensordict

    def _sequence(
        self, tensordict: TensorDictBase, x: torch.Tensor, batch: tuple[int, ...]
    ) -> TensorDictBase:
        if len(batch) < 1:
            raise ValueError(
                f"{type(self).__name__} in recurrent mode needs a time dim: inputs [*B, T, "
                f"n_agents, {self.input_size}], got {list(x.shape)}"
            )
        *lead, steps = batch
        n, hid = self.n_agents, self.state_size
        reset = self._reset_flag(tensordict, batch)  # [*B, T, n, 1]
        starts = reset.any(-2).squeeze(-1)  # [*B, T]: a step that starts an episode
        check_time_order(
            tensordict,
            torch.cat([starts[..., 1:], torch.ones_like(starts[..., :1])], -1),
            len(batch) - 1,
            f"{type(self).__name__} in recurrent mode",
            f"an episode start ({self.init_key!r})",
            "Sample whole sequences (SliceSampler), or leave recurrent mode for single steps.",
        )
        first = tensordict.get(self.state_in_key, None)
        h = first[..., 0, :, :] if first is not None else x.new_zeros(*lead, n, hid)
        check_agent_input(h, n, hid, f"{type(self).__name__} state {self.state_in_key!r}")
        seq = x.reshape(-1, steps, n, self.input_size)
        rows = seq.shape[0]
        resets = reset.reshape(rows, steps, n, 1)
        h_rows = h.reshape(rows, n, hid)
        if self._fusable(x):
            out = self._fused_sequence(seq, h_rows, resets)
        else:
            out = self._unrolled_sequence(seq, h_rows, resets)
        out = out.reshape(*lead, steps, n, hid)
        tensordict.set(self.out_key, out[..., : self.hidden_size])
        tensordict.set(self.state_key, out)  # the state after each step, as stepping writes it
        return tensordict

    def _fusable(self, x: torch.Tensor) -> bool:
        """Whether :meth:`_fused_sequence` computes this call: a cell with a whole-sequence op
        in torch, shared by the agents (one weight), few sequences
        (:attr:`fused_max_step_flops`), on the CPU, in the parameters' float dtype,
        outside autocast (whose casts the unrolled cell's matmuls take) and ``torch.compile``.
        Elsewhere the unrolled cell, the same maths."""
        weight = self.input_gates.weight
        steps = x.shape[-3] if x.dim() >= 3 else 1
        sequences = x.numel() // max(1, steps * self.input_size)
        step_flops = 2 * sequences * self._gates * self.hidden_size * self.hidden_size
        return (
            self._sequence_op is not None
            and self.n_stacks == 1
            and step_flops <= self.fused_max_step_flops
            and x.device.type == "cpu"
            and x.dtype == weight.dtype
            and x.dtype in (torch.float32, torch.float64)
            and x.numel() > 0
            and not torch.is_autocast_enabled(x.device.type)
            and not torch.compiler.is_compiling()  # dynamo traces the unrolled cell
        )

    def _fused_sequence(
        self, seq: torch.Tensor, h: torch.Tensor, resets: torch.Tensor
    ) -> torch.Tensor:
        """``seq`` ``[rows, T, n, in]`` from the state ``h`` ``[rows, n, H]``, zeroed where
        ``resets`` ``[rows, T, n, 1]``: the states after each step ``[rows, T, n, H]``, by
        :func:`_gru_sequence` (torch's own sequence op; the same maths as :meth:`_cell`)."""
        rows, steps, n, _ = seq.shape
        out = _gru_sequence(
            seq.transpose(1, 2).reshape(rows * n, steps, self.input_size),
            h.reshape(rows * n, self.state_size),
            resets.squeeze(-1).transpose(1, 2).reshape(rows * n, steps),
            # torch's layout ([3H, in], [3H, H], [3H], [3H]): views of the stacked parameters
            self.input_gates.weight.squeeze(0).t(),
            self.hidden_gates.weight.squeeze(0).t(),
            self.input_gates.bias.reshape(-1),
            self.hidden_gates.bias.reshape(-1),
        )
        return out.reshape(rows, n, steps, self.state_size).transpose(1, 2)

    def _unrolled_sequence(
        self, seq: torch.Tensor, h_rows: torch.Tensor, resets: torch.Tensor
    ) -> torch.Tensor:
        """:meth:`_fused_sequence`'s result, by :meth:`_cell` step by step (any cell, stacked
        agents, any dtype)."""
        rows, steps, n, _ = seq.shape
        gates = self._gates * self.hidden_size  # input-gate width (0-size batches need it)
        # Input gates for every step in one call: [S, rows * T, 3H].
        gx_all = self.input_gates(
            to_stacks(seq.reshape(rows * steps, n, self.input_size), self.n_stacks)
        )
        gx_all = (
            gx_all.reshape(gx_all.shape[0], rows, steps, gates)
            if self.n_stacks > 1
            else (gx_all.reshape(1, rows, steps, n, gates))
        )
        outs = []
        # unbind, not gx_all[:, :, t]: the backward of each slice fills a zero tensor the size
        # of gx_all and adds it up (T of them, quadratic in T); unbind's stacks the T gradients
        # once (at T = 20, 128 units: 40 % of a training step's time was those fills)
        gx_steps = gx_all.unbind(2)
        for t in range(steps):
            h_rows = h_rows.masked_fill(resets[:, t], 0.0)
            gx = gx_steps[t]
            if self.n_stacks == 1:
                gx = gx.reshape(1, rows * n, gates)
            h_rows = from_stacks(self._cell(gx, to_stacks(h_rows, self.n_stacks)), n)
            outs.append(h_rows)
        return torch.stack(outs, 1)


def _gru_sequence(
    x: torch.Tensor,
    h0: torch.Tensor,
    resets: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor,
    b_hh: torch.Tensor,
) -> torch.Tensor:
    """A shared GRU cell over sequences ``x`` ``[N, T, in]`` from ``h0`` ``[N, H]``, the state
    zeroed before each step where ``resets`` ``[N, T]`` (bool) says so: every step's state
    ``[N, T, H]``, by ``torch.gru`` (its C++ loop forward, its own autograd backward), one call
    per stretch of steps in which no row restarts. The weights in torch's layout (``[3H, in]``,
    ``[3H, H]``) are made contiguous first: views of another layout cost torch's backward a
    copy per call (about a third more time with 20 restarts in 128 steps)."""
    steps = x.shape[1]
    cuts = [0, *(resets[:, 1:].any(0).nonzero().flatten() + 1).tolist(), steps]
    params = [w_ih.contiguous(), w_hh.contiguous(), b_ih, b_hh]
    state, outs = h0.unsqueeze(0), []
    for begin, end in itertools.pairwise(cuts):
        state = state.masked_fill(resets[None, :, begin, None], 0.0)
        out, state = torch.gru(
            x[:, begin:end], state, params, True, 1, 0.0, torch.is_grad_enabled(), False, True
        )
        outs.append(out)
    return outs[0] if len(outs) == 1 else torch.cat(outs, 1)


class MultiAgentGRU(_MultiAgentRNN):
    """A GRU cell per agent (``torch.nn.GRUCell`` maths, gates ``r, z, n``), all agents in one
    batched matmul.

    Reads ``in_key`` ``[*B, n_agents, input_size]``, the carried state ``(group, "rnn_state")``
    (zeros where absent) and the episode-start flag (``(group, "is_init")`` ``[*B, n, 1]``,
    else the root ``"is_init"`` ``[*B, 1]``, as :class:`marlkit.envs.InitTracker` writes them).
    Writes ``out_key`` ``[*B, n_agents, hidden_size]`` (the new hidden state, the input of the
    layers after it) and ``(group, "rnn_state")`` (the state after each step); step by step,
    ``(group, "rnn_state_in")`` too.

    Args:
        input_size: input features per agent.
        hidden_size: state features per agent.
        n_agents: agents in the group.
        group: the group whose keys are read and written.
        share_params: one cell for every agent.
        in_key: the input (default ``(group, "observation")``).
        out_key: the output (default ``(group, "rnn_output")``).
        init_key: the name of the episode-start flag at each level.
        state_key: where the state after the step goes (default ``(group, "rnn_state")``;
            the state the step started from goes next to it, its name with ``_in`` added).
            Two recurrent modules of one group (a recurrent actor and a recurrent critic)
            need two keys.
        device: where the parameters live.

    Raises:
        KeyError: at call time, no ``is_init`` flag (add ``InitTracker`` to the env).
        ValueError: at call time, an input or state of another shape.
    """

    _gates = 3
    _sequence_op = staticmethod(torch.gru)

    def _cell(self, gx: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """One step in the stacked layout: ``gx`` ``[S, N, 3H]`` (input gates), ``h``
        ``[S, N, H]``."""
        gh = self.hidden_gates(h)
        xr, xz, xn = gx.chunk(3, -1)
        hr, hz, hn = gh.chunk(3, -1)
        r = torch.sigmoid(xr + hr)
        z = torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        return n + z * (h - n)


class MultiAgentLSTM(_MultiAgentRNN):
    """An LSTM cell per agent (``torch.nn.LSTMCell`` maths, gates ``i, f, g, o``), all agents in
    one batched matmul, with the keys, modes and arguments of :class:`MultiAgentGRU`.

    The state ``(group, "rnn_state")`` ``[*B, n_agents, 2 * hidden_size]`` holds ``h`` then
    ``c``; ``out_key`` gets ``h`` ``[*B, n_agents, hidden_size]``.
    """

    _gates = 4
    _state_factor = 2

    def _cell(self, gx: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        h, c = state.split(self.hidden_size, -1)
        i, f, g, o = (gx + self.hidden_gates(h)).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.cat([torch.sigmoid(o) * torch.tanh(c), c], -1)


# ---------------------------------------------------------------------- networks with memory
def recurrent_network(
    input_size: int,
    output_size: int,
    n_agents: int,
    *,
    memory: Literal["gru", "lstm"] = "gru",
    hidden_size: int = 128,
    group: str = DEFAULT_GROUP,
    in_key: NestedKey | None = None,
    out_keys: Sequence[NestedKey] = (),
    name: str = "rnn",
    centralised: bool = False,
    share_params: bool = False,
    depth: int = 0,
    num_cells: int | Sequence[int] = 64,
    activation: type[nn.Module] = Tanh,
    head_depth: int = 0,
    head_cells: int | Sequence[int] | None = None,
    head: nn.Module | None = None,
    preprocess: nn.Module | None = None,
    device: torch.device | str | None = None,
) -> TensorDictSequential:
    """A per-agent network with memory, EPyMARL's ``RNNAgent`` in marlkit's keys: an encoder
    (a :class:`MultiAgentMLP` of ``depth`` hidden layers to ``hidden_size`` features, then
    ``activation``), a :class:`MultiAgentGRU` or :class:`MultiAgentLSTM` cell, and a head to
    ``output_size`` features (then ``head``, a :class:`NormalParamExtractor` say): a
    :class:`MultiAgentMLP` of ``head_depth`` hidden layers of ``head_cells``, each followed by
    ``activation``, linear with ``head_depth=0``. ``depth=0`` is EPyMARL's agent (``fc1``, the
    cell, ``fc2``); ``depth=0, head_depth=1`` with ``activation=nn.ReLU`` JaxMARL's SMAX actor
    (``Dense``-ReLU, the GRU, ``Dense``-ReLU, ``Dense``).

    Keys under ``group``: the encoder writes ``(group, f"{name}_input")``, the cell
    ``(group, f"{name}_output")`` and its state ``(group, f"{name}_state")`` (and ``_in``):
    ``name="rnn"`` gives the layout's ``(group, "rnn_state")``; a second network of the group
    (a recurrent critic next to a recurrent actor) takes another name.

    Args:
        input_size: input features per agent (``in_key`` ``[*B, n_agents, input_size]``).
        output_size: the head's features per agent.
        n_agents: agents in the group.
        memory: ``"gru"`` or ``"lstm"``.
        hidden_size: the encoder's output and the cell's state (128: EPyMARL's default).
        group: the group whose keys are read and written.
        in_key: the input (default ``(group, "observation")``; with ``preprocess``, what it
            reads).
        out_keys: where the head's outputs go (one key per tensor it returns).
        name: the prefix of the network's own keys.
        centralised: the encoder reads every agent's input (a MAPPO critic).
        share_params: one network for every agent.
        depth, num_cells, activation: the encoder (see :class:`MultiAgentMLP`); the
            activation follows the head's hidden layers too.
        head_depth: hidden layers between the cell and the output layer (0: a linear head,
            the cell's output read by the output layer).
        head_cells: their width, an int for every layer or one per layer (``None``:
            ``hidden_size``, the cell's width).
        head: a module after the output layer (``None``: its output).
        preprocess: a module before the encoder, turning ``in_key``'s tensor into the
            ``[*B, n_agents, input_size]`` the encoder reads (a
            :class:`~marlkit.modules.StateWithAgentId` of the root ``"state"``, say).
        device: where the parameters live.

    Raises:
        ValueError: an unknown ``memory``, no ``out_keys``, a size below 1 or a
            ``head_depth`` below 0.

    Examples:
        >>> net = recurrent_network(4, 3, 2, hidden_size=8, out_keys=[("agents", "logits")])
        >>> [k for k in net.out_keys if k[1] == "logits" or k[1].endswith("state")]
        [('agents', 'rnn_state'), ('agents', 'logits')]
    """
    if memory not in MEMORIES:
        raise ValueError(f"recurrent_network: memory must be one of {MEMORIES}, got {memory!r}")
    if not out_keys:
        raise ValueError("recurrent_network: out_keys must name where the head's outputs go")
    hidden_size = check_int("hidden_size", hidden_size, low=1)
    head_depth = check_int("head_depth", head_depth, low=0, owner="recurrent_network")
    head_widths = check_ints(
        "head_cells",
        hidden_size if head_cells is None else head_cells,
        low=1,
        length=head_depth,
        owner="recurrent_network",
    )
    encoder = MultiAgentMLP(
        input_size,
        hidden_size,
        n_agents,
        centralised=centralised,
        share_params=share_params,
        depth=depth,
        num_cells=num_cells,
        activation=activation,
        device=device,
    )
    enc_key, out_key = (group, f"{name}_input"), (group, f"{name}_output")
    cell_cls = MultiAgentGRU if memory == "gru" else MultiAgentLSTM
    cell = cell_cls(
        hidden_size,
        hidden_size,
        n_agents,
        group=group,
        share_params=share_params,
        in_key=enc_key,
        out_key=out_key,
        state_key=(group, f"{name}_state"),
        device=device,
    )
    # head_depth=0: one linear layer, the parameters (and the draws) of the head before the
    # key existed
    linear: nn.Module = MultiAgentMLP(
        hidden_size,
        output_size,
        n_agents,
        share_params=share_params,
        depth=head_depth,
        num_cells=head_widths,
        activation=activation,
        device=device,
    )
    if head is not None:
        linear = nn.Sequential(linear, head)
    return TensorDictSequential(
        TensorDictModule(
            nn.Sequential(*([preprocess] if preprocess is not None else []), encoder, activation()),
            in_keys=[in_key if in_key is not None else (group, OBSERVATION)],
            out_keys=[enc_key],
        ),
        cell,
        TensorDictModule(linear, in_keys=[out_key], out_keys=list(out_keys)),
    )


def recurrent_modules(module: nn.Module) -> list[_MultiAgentRNN]:
    """The :class:`MultiAgentGRU` and :class:`MultiAgentLSTM` cells inside ``module`` (an
    actor, a critic, a policy), in order; empty for a network without memory."""
    return [m for m in module.modules() if isinstance(m, _MultiAgentRNN)]


def carry_states(
    module: nn.Module, sequence: TensorDictBase, following: TensorDictBase
) -> TensorDictBase:
    """Hand the states ``module``'s cells reached at each step of ``sequence`` (a batch run
    through ``module`` in recurrent mode) to ``following``, the batch of the observations
    that come next (``sequence["next"]``), with the episode-start flags False: ``module``
    called on ``following`` step by step then gives, for every step at once, its output on
    the next observation, in the same episode (a recurrent critic's value of the next
    observation, the one the value estimator bootstraps from, also at a time limit and at the
    batch's last step). Returns ``following``, changed in place.

    Raises:
        KeyError: ``sequence`` lacks a cell's state (run ``module`` on it in recurrent mode
            first).
    """
    for cell in recurrent_modules(module):
        state = sequence.get(cell.state_key, None)
        if state is None:
            raise KeyError(
                f"carry_states: the sequence has no {cell.state_key!r}: run the module over it "
                "inside set_recurrent_mode(True) first"
            )
        following.set(cell.state_key, state)
        group_flag = join_key(cell.group, cell.init_key)
        for key in (group_flag, cell.init_key):
            flag = following.get(key, None)
            if flag is not None:
                following.set(key, torch.zeros_like(flag))
        if following.get(cell.init_key, None) is None:
            shape = (*following.batch_size, 1)
            following.set(cell.init_key, torch.zeros(shape, dtype=torch.bool, device=state.device))
    return following
