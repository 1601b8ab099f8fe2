"""Small models for tests, importable as factories (``tinymodels:NAME``)."""

from __future__ import annotations

import time

import torch
from torch import nn


def tiny_cnn() -> nn.Module:
    """Conv-BN-ReLU stack with a residual add and a classifier: streams in 7 units."""
    torch.manual_seed(0)
    return TinyCNN()


class TinyCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.conv3 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)
        with torch.no_grad():
            for bn in (self.bn1, self.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.1, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = y + torch.relu(self.bn2(self.conv2(y)))
        y = self.pool(torch.relu(self.conv3(y))).flatten(1)
        return self.fc(y)


class TiedLM(nn.Module):
    """Embedding tied to the output head, with a position parameter on the root."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.randn(1, 8, 16) * 0.1)
        self.embed = nn.Embedding(50, 16)
        self.block = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) + self.pos[:, : ids.shape[1]]
        h = h + self.block(h)
        return self.head(self.norm(h))


def tied_lm() -> nn.Module:
    torch.manual_seed(1)
    return TiedLM()


class _Table(nn.Module):
    """Returns a view of its own parameter beside its result."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x @ self.w.t(), self.w[:2]


class _Holder(nn.Module):
    """Owns a parameter but is never called: the parent reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.rand(16) + 0.5)


class OutsideReads(nn.Module):
    """Weights used while their module is not running (all must stay resident).

    ``head`` multiplies by ``embed.weight`` outside ``embed``'s call, ``table`` returns a
    view of its weight that the parent uses after ``mid`` ran, ``holder`` never runs,
    and the output includes ``fc.bias`` itself.
    """

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.table = _Table()
        self.mid = nn.Linear(16, 16)
        self.holder = _Holder()
        self.fc = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor):
        h = torch.relu(self.embed(x))
        h, rows = self.table(h)
        h = self.mid(h) * self.holder.scale
        y = self.fc(h) + x @ self.embed.weight.t()
        return y, rows * 2, rows, self.fc.bias


def outside_reads() -> nn.Module:
    torch.manual_seed(4)
    return OutsideReads()


class WeightView(nn.Module):
    """Returns a view of a child's weight (and nothing reads it outside the child)."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.table = _Table()

    def forward(self, x: torch.Tensor):
        return self.table(self.pre(x))


def weight_view() -> nn.Module:
    torch.manual_seed(5)
    return WeightView()


def no_weights() -> nn.Module:
    """No parameters at all: nothing to stream."""
    return nn.Sequential(nn.ReLU(), nn.Flatten(), nn.Softmax(dim=-1))


class _Pause(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x * 2


def pause(seconds: float) -> nn.Module:
    """No parameters; the forward pass takes ``seconds``."""
    return _Pause(seconds)


class _OnlyOutsideReads(nn.Module):
    """Every weight is read outside its module (a holder that never runs): all resident."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.proj.weight.t() + self.proj.bias)


def all_resident() -> nn.Module:
    torch.manual_seed(6)
    return _OnlyOutsideReads()


def not_a_module() -> int:
    return 3


class SlowLinear(nn.Linear):
    """A linear layer whose kernel takes at least ``delay`` seconds (stage-duration tests)."""

    def __init__(self, n_in: int, n_out: int, delay: float) -> None:
        super().__init__(n_in, n_out)
        self.delay = delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(self.delay)
        return super().forward(x)


def long_names() -> nn.Module:
    """Linear layers nested under long names, as a deep Hugging Face model's units are
    (``model.decoder.layers.0.self_attn.q_proj``): what a table must print whole."""
    torch.manual_seed(3)
    block = nn.Sequential()
    block.add_module("attention_query_projection_of_the_first_decoder_layer", nn.Linear(8, 8))
    block.add_module("attention_output_projection_of_the_first_decoder_layer", nn.Linear(8, 8))
    model = nn.Sequential()
    model.add_module("transformer_decoder_stack", nn.Sequential())
    model.transformer_decoder_stack.add_module("layer_zero", block)
    return model


def chain(widths: list[int], delays: list[float] | None = None) -> nn.Module:
    """Linear layers of the given widths: units of arbitrary sizes."""
    torch.manual_seed(2)
    delays = delays or [0.0] * (len(widths) - 1)
    layers: list[nn.Module] = []
    for a, b, d in zip(widths, widths[1:], delays, strict=False):
        layers += [SlowLinear(a, b, d), nn.Tanh()]
    return nn.Sequential(*layers)


class Pause(nn.Module):
    """A parameterless op that takes at least ``delay`` seconds: work between two units."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import time

        time.sleep(self.delay)
        return x


def chain_with_pauses(widths: list[int], pause: float) -> nn.Module:
    """Linear layers, each followed by a :class:`Pause`: time between units, and after the last."""
    torch.manual_seed(2)
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:], strict=False):
        layers += [nn.Linear(a, b), Pause(pause)]
    return nn.Sequential(*layers)


def tiny_gpt2() -> nn.Module:
    """A two-layer Hugging Face GPT-2 built from a config (no download), tied head."""
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    torch.manual_seed(3)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
        bos_token_id=0, eos_token_id=0, use_cache=False,
    )
    return GPT2LMHeadModel(config).eval()


def tiny_llama() -> nn.Module:
    """A two-layer Hugging Face Llama (rotary positions, grouped-query attention, RMSNorm,
    untied head) built from a config (no download)."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    torch.manual_seed(5)
    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, max_position_embeddings=64, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


SAVED_LLAMA = "LAYERFIT_TEST_SAVED_LLAMA"
"""The environment variable naming a folder ``tiny_llama`` was saved to (save_pretrained)."""


def pretrained_llama() -> nn.Module:
    """``tiny_llama`` loaded back from its saved folder: a factory that loads its own
    weights (from_pretrained), which cannot rebuild a skeleton on the meta device."""
    import os

    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(os.environ[SAVED_LLAMA]).eval()


def llama_from_saved_config() -> nn.Module:
    """A Llama built from the config in ``tiny_llama``'s saved folder (AutoConfig's
    from_pretrained reads the config only): a factory that rebuilds on the meta device."""
    import os

    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(5)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(os.environ[SAVED_LLAMA])).eval()


class _EncodesOutsideForward(nn.Module):
    """Like an encoder-decoder's ``generate``: runs its encoder directly, then calls itself."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(8, 8)
        self.decoder = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None) -> torch.Tensor:
        return self.decoder(self.encoder(x) if memory is None else memory)

    def generate(self, x: torch.Tensor) -> torch.Tensor:
        return self(x, memory=self.encoder(x))


class _Iterates(nn.Module):
    """A model whose own ``generate`` feeds its output back ``steps`` times."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def generate(self, x: torch.Tensor, steps: int = 3) -> list[torch.Tensor]:
        out = [x]
        for _ in range(steps):
            out.append(self(out[-1]))
        return out


def iterates() -> nn.Module:
    torch.manual_seed(0)
    return _Iterates().eval()


class _LastToken(nn.Module):
    """A head on a slice of a batched hidden state, as a language model's ``logits_to_keep``."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(32, 32)
        self.head = nn.Linear(32, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x)[:, -1:, :])


def last_token() -> nn.Module:
    torch.manual_seed(0)
    return _LastToken().eval()


def encodes_outside_forward() -> nn.Module:
    torch.manual_seed(0)
    return _EncodesOutsideForward().eval()


def needs_width(width: int) -> nn.Module:
    """A factory with a required argument: called without it, it raises TypeError."""
    return nn.Linear(width, width)


class _RaisesInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("this model refuses every input")


def raises_in_forward() -> nn.Module:
    return _RaisesInForward()


class _WithUnused(nn.Module):
    """A module that never runs beside one that does (its tensors are not stored)."""

    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.spare = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def with_unused() -> nn.Module:
    torch.manual_seed(3)
    return _WithUnused()


class _ScaledTinyCNN(TinyCNN):
    """tiny_cnn with one more parameter: a factory that changed after prepare."""

    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(self.pre(x))


def scaled_tiny_cnn() -> nn.Module:
    torch.manual_seed(0)
    return _ScaledTinyCNN()


# --- unusual models (tests/engine/test_unusual_models.py) -------------------------------


class _Branch(nn.Module):
    """Runs ``opt`` only where the input's first element is positive."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.opt = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if x[0, 0] > 0:
            h = self.opt(h)
        return self.b(h)


def branch() -> nn.Module:
    torch.manual_seed(11)
    return _Branch()


class _InputLoop(nn.Module):
    """Runs ``step`` once per positive element of the input's first row (at least once)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.step = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        for _ in range(max(1, int((x[0] > 0).sum()))):
            h = torch.tanh(self.step(h))
        return self.b(h)


def input_loop() -> nn.Module:
    torch.manual_seed(12)
    return _InputLoop()


class _CounterLeaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))
        self.scale = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * self.scale * self.calls


class _RunningState(nn.Module):
    """Buffers the forward pass writes: a counter (in place), a running sum (in place)
    and a state replaced by a new tensor (``self.state = self.state + 1``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.count = _CounterLeaf()
        self.b = nn.Linear(8, 8)
        self.register_buffer("total", torch.zeros(8))
        self.register_buffer("state", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.count(self.a(x))
        self.total.add_(h.mean(0))
        self.state = self.state + 1
        return self.b(h) + self.total + self.state


def running_state() -> nn.Module:
    torch.manual_seed(13)
    return _RunningState()


class _DeviceProbe(nn.Module):
    """Makes a tensor on ``b.weight``'s device while ``b`` is not running (``self.device``)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.b.weight
        bias = torch.ones(x.shape[0], 8, device=w.device, dtype=w.dtype)
        return self.b(self.a(x) + bias)


def device_probe() -> nn.Module:
    torch.manual_seed(14)
    return _DeviceProbe()


class _Layouts(nn.Module):
    """A channels-last convolution and a linear layer whose weight is a transposed tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3).to(memory_format=torch.channels_last)
        self.conv2 = nn.Conv2d(4, 4, 3)
        self.fc = nn.Linear(16, 8)
        self.fc.weight = nn.Parameter(torch.randn(16, 8).t())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv2(self.conv(x)).flatten(1))


def layouts() -> nn.Module:
    torch.manual_seed(15)
    return _Layouts()


class _Outputs(nn.Module):
    """Returns a dict holding a list, a tuple with None and a number."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> dict:
        h = self.a(x)
        return {"out": self.b(h), "all": [h, (h * 2, None)], "n": 3}


def outputs() -> nn.Module:
    torch.manual_seed(16)
    return _Outputs()


class _PlainTensor(nn.Module):
    """Reads a tensor held in a plain attribute (neither parameter nor buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.offset = torch.randn(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.offset


def plain_tensor() -> nn.Module:
    torch.manual_seed(17)
    return _PlainTensor()


class _Scripted(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.s = torch.jit.script(nn.Linear(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.s(self.a(x))


def scripted() -> nn.Module:
    torch.manual_seed(18)
    return _Scripted()


class _Complex(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.w = nn.Parameter(torch.randn(8, dtype=torch.complex64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.a(x) * self.w).abs()


def complex_weights() -> nn.Module:
    torch.manual_seed(19)
    return _Complex()


class _Noise(nn.Module):
    """Adds a fresh random draw on every call (``torch.randn(8)``: constant arguments)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + torch.randn(8)


def noise() -> nn.Module:
    torch.manual_seed(20)
    return _Noise()


class _Reads(nn.Module):
    """Returns a number computed with ``.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor):
        h = self.a(x)
        return h * h.abs().max().item()


def item_read() -> nn.Module:
    torch.manual_seed(21)
    return _Reads()


def many_linear(n: int) -> nn.Module:
    """``n`` tiny linear layers in a row."""
    torch.manual_seed(22)
    return nn.Sequential(*[nn.Linear(4, 4) for _ in range(n)])


class _PythonCounter(nn.Module):
    """Counts its calls in a Python attribute and scales its output by the count."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.a(x) * self.calls


def python_counter() -> nn.Module:
    torch.manual_seed(23)
    return _PythonCounter()


# --- common architectures, small (tests/engine/test_architectures.py) -------------------


class _Recurrent(nn.Module):
    """A two-layer LSTM then a bidirectional GRU (flat RNN weights, read by one kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16)
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.gru = nn.GRU(32, 16, batch_first=True, bidirectional=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.proj(x))
        h, _ = self.gru(h)
        return self.head(h[:, -1])


def recurrent() -> nn.Module:
    torch.manual_seed(24)
    return _Recurrent()


def transformer_encoder() -> nn.Module:
    """nn.TransformerEncoder: in eval mode PyTorch takes its fused fast path."""
    torch.manual_seed(25)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return nn.Sequential(nn.Linear(8, 32), encoder, nn.Linear(32, 3))


class _Attention(nn.Module):
    """nn.MultiheadAttention, which reads its out_proj's weight from its own forward."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.att = nn.MultiheadAttention(32, 4, batch_first=True)
        self.out = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        a, weights = self.att(h, h, h)
        return self.out(a).sum(1) + weights.sum()


def attention() -> nn.Module:
    torch.manual_seed(26)
    return _Attention()


class _PatchTokens(nn.Module):
    """ViT-style: patch embedding, class token and position embedding on the root."""

    def __init__(self) -> None:
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 16))
        self.pos = nn.Parameter(torch.randn(1, 5, 16))
        self.patch = nn.Conv2d(3, 16, 4, 4)
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), p], 1) + self.pos
        return self.fc(self.norm(h)[:, 0])


def patch_tokens() -> nn.Module:
    torch.manual_seed(27)
    return _PatchTokens()


def weight_normed() -> nn.Module:
    """Weights computed on every call from parametrizations (weight_g, weight_v)."""
    torch.manual_seed(28)
    wn = nn.utils.parametrizations.weight_norm
    return nn.Sequential(wn(nn.Conv2d(3, 8, 3)), nn.ReLU(), nn.Flatten(), wn(nn.Linear(8 * 6 * 6, 10)))


def conv_zoo() -> nn.Module:
    """Grouped and transposed convolutions, batch / instance norm, PReLU, in-place ReLU."""
    torch.manual_seed(29)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 16, 3, padding=1, groups=4), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.ConvTranspose2d(16, 8, 2, stride=2), nn.PReLU(), nn.InstanceNorm2d(8, affine=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5),
    )  # fmt: skip


class _Embeddings(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.bag = nn.EmbeddingBag(50, 16, mode="mean")
        self.fc = nn.Linear(32, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.embed(ids).mean(1), self.bag(ids)], 1))


def embeddings() -> nn.Module:
    torch.manual_seed(30)
    return _Embeddings()


def bfloat16_mlp() -> nn.Module:
    torch.manual_seed(31)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).to(torch.bfloat16)


class _MixedDtypes(nn.Module):
    """float64 and float32 layers, with float64, bool and int64 buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16).double()
        self.register_buffer("scale", torch.tensor([2.0], dtype=torch.float64))
        self.b = nn.Linear(16, 4)
        self.b.register_buffer("mask", torch.tensor([1, 0, 1, 1], dtype=torch.bool))
        self.b.register_buffer("steps", torch.tensor(3, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = (self.a(x.double()) * self.scale).float()
        return self.b(h) * self.b.mask * self.b.steps


def mixed_dtypes() -> nn.Module:
    torch.manual_seed(32)
    return _MixedDtypes()


class _Unrolled(nn.Module):
    """Two layers applied three times in turn, as an unrolled recurrence."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.tanh(self.b(self.a(x)))
        return x


def unrolled() -> nn.Module:
    torch.manual_seed(33)
    return _Unrolled()


class _Scaled(nn.Module):
    """A leaf with one parameter, applied as many times as its parent calls it."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * self.gain)


class _WeightRow(nn.Module):
    """Returns a view of its own weight, which its parent then uses."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, width))

    def forward(self) -> torch.Tensor:
        return self.weight[1]


class NestedBlock(nn.Module):
    """A block whose tensors are used where its children's modules do not run, in every
    way ``spec`` turns on: ``scale`` (the block owns a parameter next to its children's),
    ``reuse`` (calls ``act`` that many times), ``reads`` (uses ``lin.weight`` in its own
    forward, as nn.MultiheadAttention uses ``out_proj.weight``), ``row`` (a child returns
    a view of its weight), ``borrow`` (runs the module its caller passes in) and
    ``inner`` (a nested block's spec)."""

    def __init__(self, width: int, spec: dict) -> None:
        super().__init__()
        self.spec = spec
        self.lin = nn.Linear(width, width)
        if spec.get("scale"):
            self.scale = nn.Parameter(torch.rand(width) + 0.5)
        if spec.get("reuse"):
            self.act = _Scaled(width)
        if spec.get("row"):
            self.row = _WeightRow(width)
        if spec.get("inner"):
            self.inner = NestedBlock(width, spec["inner"])

    def forward(self, x: torch.Tensor, lender: nn.Module | None = None) -> torch.Tensor:
        h = self.lin(x)
        if self.spec.get("borrow") and lender is not None:
            h = lender(h)
        if self.spec.get("reads"):
            h = h + 0.5 * nn.functional.linear(x, self.lin.weight)
        if self.spec.get("scale"):
            h = h * self.scale
        for _ in range(self.spec.get("reuse", 0)):
            h = self.act(h)
        if self.spec.get("row"):
            h = h + self.row()
        if self.spec.get("inner"):
            h = self.inner(h, lender)
        return h


def nested_blocks(width: int, specs: list[dict], reused_head: int = 0, head_width: int | None = None) -> nn.Module:
    """A stack of :class:`NestedBlock` with a head (``head_width`` outputs, ``width`` by
    default); with ``reused_head`` the root calls the head that many times, so its
    weights can only stay resident (then it must keep ``width``)."""
    torch.manual_seed(31)

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(NestedBlock(width, s) for s in specs)
            self.lender = nn.LayerNorm(width)  # run by the blocks that ``borrow`` it
            self.head = nn.Linear(width, head_width or width)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x
            for block in self.blocks:
                h = block(h, self.lender)
            for _ in range(max(1, reused_head)):
                h = self.head(h)
            return h

    return Stack()


class _BorrowingBlock(nn.Module):
    """Owns a scale beside its layer, and calls a module its caller passes in."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 16))
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        return norm(self.lin(x)) * self.scale


class _Lender(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _BorrowingBlock()
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(x, self.norm))


def borrowed_module() -> nn.Module:
    """A block that runs its parent's ``norm`` inside its own call: it cannot be one unit
    (``norm`` is a unit of its own, and units never nest)."""
    torch.manual_seed(32)
    return _Lender()


class _TokenTable(nn.Module):
    """An untied token embedding large enough to be read by rows: 5000 ids x 100 fp32
    (400-byte rows straddle 4 KiB pages, 2 MB span two scan pieces), a padding id, then
    a norm and a head. ``by_keyword`` calls the embedding as ``embed(input=ids)``."""

    def __init__(self, by_keyword: bool = False, max_norm: float | None = None) -> None:
        super().__init__()
        self.by_keyword = by_keyword
        self.embed = nn.Embedding(5000, 100, padding_idx=3, max_norm=max_norm)
        self.norm = nn.LayerNorm(100)
        self.head = nn.Linear(100, 40)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input=ids) if self.by_keyword else self.embed(ids)
        return self.head(self.norm(x))


def token_table(by_keyword: bool = False, max_norm: float | None = None) -> nn.Module:
    torch.manual_seed(31)
    return _TokenTable(by_keyword, max_norm).eval()


# --- encoder-decoders and skipped units (tests/engine/test_encoder_decoder.py) ----------


def tiny_bart() -> nn.Module:
    """A Hugging Face BART of two encoder and two decoder layers, built from a config (no
    download): its generate calls the encoder once, then the model with the encoder's
    output, whose decoder steps skip the cached cross-attention projections."""
    import transformers
    from transformers import BartConfig, BartForConditionalGeneration

    transformers.logging.set_verbosity_error()
    torch.manual_seed(5)
    config = BartConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
    )
    return BartForConditionalGeneration(config).eval()


class _SkipsLayers(nn.Module):
    """Layer k of ``before`` and ``after`` runs only where the input's element [0, k]
    (of ``after``: [1, k]) is not zero; between them an embedding table (read by rows)
    looks up ids made from the input."""

    def __init__(self) -> None:
        super().__init__()
        self.before = nn.ModuleList(nn.Linear(8, 8) for _ in range(5))
        self.table = nn.Embedding(5000, 100)
        self.head = nn.Linear(100, 8)
        self.after = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for k, layer in enumerate(self.before):
            if x[0, k] != 0:
                h = h + layer(h)
        ids = x.abs().mul(1000).long() % 5000
        h = h + self.head(self.table(ids).mean(1))
        for k, layer in enumerate(self.after):
            if x[1, k] != 0:
                h = h + layer(h)
        return h


def skips_layers() -> nn.Module:
    torch.manual_seed(13)
    return _SkipsLayers()


class _Outer(nn.Module):
    def __init__(self, interleave: bool) -> None:
        super().__init__()
        self.x = nn.Linear(8, 8)
        self.y = nn.Linear(8, 8)
        self.interleave = interleave

    def forward(self, h: torch.Tensor, helper: nn.Module) -> torch.Tensor:
        if self.interleave:  # the helper's layer runs between its own
            return self.y(helper(self.x(h)))
        return helper(self.y(self.x(h)))


class _Borrows(nn.Module):
    """``outer`` runs a module it is handed (``mid``) after its own layers or between them."""

    def __init__(self, interleave: bool) -> None:
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.outer = _Outer(interleave)
        self.mid = nn.Linear(8, 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.outer(self.first(h), self.mid)


def borrows(interleave: bool = False) -> nn.Module:
    torch.manual_seed(17)
    return _Borrows(interleave)


def tiny_whisper() -> nn.Module:
    """A Hugging Face Whisper of two encoder and two decoder layers on 8 mel bins and 32
    frames, built from a config (no download). Its forward needs decoder_input_ids too, so
    it is prepared with an example of both."""
    import transformers
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    transformers.logging.set_verbosity_error()
    torch.manual_seed(5)
    config = WhisperConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
        max_source_positions=16, max_target_positions=32, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=0,
    )
    return WhisperForConditionalGeneration(config).eval()


def tiny_t5() -> nn.Module:
    """A Hugging Face T5 (relative position buckets, an untied head) of two encoder and
    two decoder layers, built from a config; prepared with an example of both inputs."""
    import transformers
    from transformers import T5Config, T5ForConditionalGeneration

    transformers.logging.set_verbosity_error()
    torch.manual_seed(5)
    config = T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )
    return T5ForConditionalGeneration(config).eval()


def tiny_marian() -> nn.Module:
    """A Hugging Face Marian translation model of two encoder and two decoder layers."""
    import transformers
    from transformers import MarianConfig, MarianMTModel

    transformers.logging.set_verbosity_error()
    torch.manual_seed(5)
    config = MarianConfig(
        vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=1, eos_token_id=2, decoder_start_token_id=1, forced_eos_token_id=None,
    )
    return MarianMTModel(config).eval()
