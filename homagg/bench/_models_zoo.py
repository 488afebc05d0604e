"""The models of ``homagg bench models``: NCF, an LSTM language model, VGG19, BERT-base and a char-LSTM.

Every model is built in plain torch from its architecture, randomly initialised; every batch is
synthetic, drawn from a :class:`torch.Generator` (nothing is downloaded).  ``quick=True`` gives
scaled-down variants (small vocabularies, widths and depths) for smoke tests.

==========  =====================================================================================
``ncf``     NeuMF (He et al. 2017): GMF + MLP towers, each with its own user and item embedding.
            Full: MovieLens-20M scale, 138,493 users x 26,744 items (31.7M parameters, 97% of them
            embedding rows).  Users and items are drawn uniformly (real data is skewed, which
            makes ranks' rows overlap more; uniform is the pessimistic case for a union).
``lstm``    2-layer LSTM language model, untied input embedding and output (softmax) embedding,
            vocabulary 100,000, trained with a *sampled* softmax (Jean et al. 2015: the logits of
            the batch's targets plus ``samples`` uniformly drawn words), so only the looked-up rows
            of both embeddings get gradients.
``lstm-full`` the same with a full softmax (``nn.Linear(hidden, vocab)``): the softmax weight's
            gradient is dense (every row gets ``p - y`` terms), so about half the model is dense.
``vgg19``   VGG19 (configuration E, no batch norm) for 32x32 inputs and 10 classes (the CIFAR
            variant, 20M parameters; the ImageNet one's 224x224 convolutions are far too slow on
            a 2-core CPU).  Every gradient is dense.
``bert``    BERT-base: vocabulary 30,522, hidden 768, 12 layers, 12 heads, FFN 3072,
            ``nn.TransformerEncoder``, masked-LM head tied to the word embedding (no NSP head).
            The tied decoder makes the word-embedding gradient dense too.
``charlstm`` a small dense model: character-level LSTM language model (:class:`LSTMLM` with a full
            softmax), 96 characters (printable ASCII and newline), embedding 32, 2 x 224 LSTM,
            ``nn.Linear(224, 96)``: 659,040 parameters, every gradient dense, trained with Adam
            (the others with plain SGD, :attr:`ModelSpec.optimizer`).
==========  =====================================================================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .._errors import ConfigError

__all__ = ["MODELS", "ModelSpec", "spec", "density", "NCF", "LSTMLM", "VGG19", "Bert"]

#: models of the default sweep (``lstm-full`` is available by name)
MODELS = ("ncf", "lstm", "vgg19", "bert", "charlstm")
Batch = tuple[Tensor, ...]


def _sgd(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.01)


@dataclass(frozen=True)
class ModelSpec:
    """How to build one model, draw a batch and compute its loss."""

    name: str
    build: Callable[[bool], nn.Module]  #: ``build(sparse)``: sparse=True -> sparse embedding grads
    batch: Callable[[torch.Generator, int], Batch]  #: ``batch(generator, batch_size)``
    loss: Callable[[nn.Module, Batch], Tensor]
    batch_size: int  #: default samples per rank and iteration
    has_embeddings: bool  #: a ``sparse=True`` variant makes sense
    summary: str
    #: ``optimizer(parameters)``: the training step's optimiser (plain SGD, lr 0.01, unless the model says)
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] = _sgd


def density(grad: Tensor) -> float:
    """Fraction of nonzero elements of a dense or sparse COO gradient (0.0 for an empty tensor)."""
    numel = grad.numel()
    if numel == 0:
        return 0.0
    if grad.is_sparse:
        values = grad.coalesce().values()
        return int(torch.count_nonzero(values)) / numel
    return int(torch.count_nonzero(grad)) / numel


# ---------------------------------------------------------------------------------------------- NCF
class NCF(nn.Module):
    """NeuMF: ``sigmoid(h^T [gmf_u * gmf_i, MLP(mlp_u ++ mlp_i)])`` (returns logits)."""

    def __init__(self, users: int, items: int, gmf_dim: int, mlp_dim: int, layers: list[int], sparse: bool) -> None:
        super().__init__()
        self.gmf_user = nn.Embedding(users, gmf_dim, sparse=sparse)
        self.gmf_item = nn.Embedding(items, gmf_dim, sparse=sparse)
        self.mlp_user = nn.Embedding(users, mlp_dim, sparse=sparse)
        self.mlp_item = nn.Embedding(items, mlp_dim, sparse=sparse)
        mlp: list[nn.Module] = []
        width = 2 * mlp_dim
        for size in layers:
            mlp += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.mlp = nn.Sequential(*mlp)
        self.out = nn.Linear(gmf_dim + width, 1)
        for emb in (self.gmf_user, self.gmf_item, self.mlp_user, self.mlp_item):
            nn.init.normal_(emb.weight, std=0.01)

    def forward(self, users: Tensor, items: Tensor) -> Tensor:
        gmf = self.gmf_user(users) * self.gmf_item(items)
        mlp = self.mlp(torch.cat([self.mlp_user(users), self.mlp_item(items)], dim=-1))
        return self.out(torch.cat([gmf, mlp], dim=-1)).squeeze(-1)


def _ncf(quick: bool) -> ModelSpec:
    users, items, gmf, mlp, layers = (20_000, 5_000, 16, 32, [64, 32, 16]) if quick else \
        (138_493, 26_744, 64, 128, [256, 128, 64])

    def batch(gen: torch.Generator, n: int) -> Batch:
        return (torch.randint(0, users, (n,), generator=gen), torch.randint(0, items, (n,), generator=gen),
                torch.randint(0, 2, (n,), generator=gen).float())

    def loss(model: nn.Module, b: Batch) -> Tensor:
        return nn.functional.binary_cross_entropy_with_logits(model(b[0], b[1]), b[2])

    return ModelSpec("ncf", lambda sparse: NCF(users, items, gmf, mlp, layers, sparse), batch, loss,
                     256 if quick else 1024, True, f"NeuMF {users:,} users x {items:,} items, GMF {gmf}, MLP {mlp}")


# ---------------------------------------------------------------------------------------------- LSTM
class LSTMLM(nn.Module):
    """LSTM language model; ``samples > 0``: sampled softmax over output-embedding rows."""

    def __init__(self, vocab: int, emb: int, hidden: int, layers: int, samples: int, sparse: bool) -> None:
        super().__init__()
        self.vocab, self.samples = vocab, samples
        self.embed = nn.Embedding(vocab, emb, sparse=sparse)
        self.lstm = nn.LSTM(emb, hidden, layers, batch_first=True)
        if samples:
            self.proj = nn.Linear(hidden, emb)
            self.out_embed = nn.Embedding(vocab, emb, sparse=sparse)  #: softmax weight rows
            self.out_bias = nn.Embedding(vocab, 1, sparse=sparse)
            nn.init.normal_(self.out_embed.weight, std=0.05)
            nn.init.zeros_(self.out_bias.weight)
        else:
            self.decoder = nn.Linear(hidden, vocab)  #: full softmax: dense weight gradient
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)

    def forward(self, tokens: Tensor, targets: Tensor, sampled: Tensor) -> Tensor:
        """Mean cross-entropy of next-token prediction (the loss, not logits)."""
        hidden, _ = self.lstm(self.embed(tokens))
        hidden = hidden.reshape(-1, hidden.shape[-1])
        flat = targets.reshape(-1)
        if not self.samples:
            return nn.functional.cross_entropy(self.decoder(hidden), flat)
        candidates, inverse = torch.unique(torch.cat([flat, sampled]), return_inverse=True)
        logits = self.proj(hidden) @ self.out_embed(candidates).t() + self.out_bias(candidates).t()
        return nn.functional.cross_entropy(logits, inverse[: flat.numel()])


def _lstm(quick: bool, full_softmax: bool) -> ModelSpec:
    vocab, emb, hidden, layers, seq, samples = (10_000, 64, 64, 1, 16, 256) if quick else \
        (100_000, 256, 512, 2, 35, 4096)
    samples = 0 if full_softmax else samples
    name = "lstm-full" if full_softmax else "lstm"

    def batch(gen: torch.Generator, n: int) -> Batch:
        text = torch.randint(0, vocab, (n, seq + 1), generator=gen)
        return text[:, :-1], text[:, 1:], torch.randint(0, vocab, (samples,), generator=gen)

    def loss(model: nn.Module, b: Batch) -> Tensor:
        return model(*b)

    softmax = "full softmax" if full_softmax else f"sampled softmax ({samples} samples)"
    return ModelSpec(name, lambda sparse: LSTMLM(vocab, emb, hidden, layers, samples, sparse), batch, loss,
                     8 if quick else 32, True,
                     f"LSTM LM vocab {vocab:,}, emb {emb}, hidden {hidden} x {layers}, seq {seq}, {softmax}")


def _charlstm(quick: bool) -> ModelSpec:
    """Character-level LSTM LM: a small dense model (no sparse variant: its embedding is 96 x 32)."""
    vocab, emb, hidden, layers, seq = (96, 16, 32, 1, 16) if quick else (96, 32, 224, 2, 100)

    def batch(gen: torch.Generator, n: int) -> Batch:
        text = torch.randint(0, vocab, (n, seq + 1), generator=gen)  # uniform: every row of the embedding used
        return text[:, :-1], text[:, 1:], torch.zeros(0, dtype=torch.int64)

    def loss(model: nn.Module, b: Batch) -> Tensor:
        return model(*b)

    def adam(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=2e-3)

    return ModelSpec("charlstm", lambda sparse: LSTMLM(vocab, emb, hidden, layers, 0, False), batch, loss,
                     8 if quick else 16, False,
                     f"char-LSTM LM vocab {vocab}, emb {emb}, hidden {hidden} x {layers}, seq {seq}, full softmax, "
                     "Adam", adam)


# ---------------------------------------------------------------------------------------------- VGG19
_VGG19 = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]


class VGG19(nn.Module):
    """VGG19 (configuration E) for 32x32 inputs; ``width`` divides every channel count."""

    def __init__(self, width: int = 1, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for v in _VGG19:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
            else:
                out = int(v) // width
                layers += [nn.Conv2d(channels, out, 3, padding=1), nn.ReLU(inplace=True)]
                channels = out
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(channels, channels), nn.ReLU(True), nn.Linear(channels, channels),
                                        nn.ReLU(True), nn.Linear(channels, classes))
        for m in self.modules():  # torchvision's VGG initialisation (keeps activations alive)
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x).flatten(1))


def _vgg19(quick: bool) -> ModelSpec:
    width = 8 if quick else 1

    def batch(gen: torch.Generator, n: int) -> Batch:
        return torch.randn(n, 3, 32, 32, generator=gen), torch.randint(0, 10, (n,), generator=gen)

    def loss(model: nn.Module, b: Batch) -> Tensor:
        return nn.functional.cross_entropy(model(b[0]), b[1])

    return ModelSpec("vgg19", lambda sparse: VGG19(width), batch, loss, 4, False,
                     f"VGG19 (E, no BN) 32x32 input, 10 classes, channels / {width}")


# ---------------------------------------------------------------------------------------------- BERT
class Bert(nn.Module):
    """BERT encoder (post-LN, GELU) + masked-LM head tied to the word embedding."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, ffn: int, max_len: int) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_len, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=1e-12)
        layer = nn.TransformerEncoderLayer(hidden, heads, ffn, dropout=0.1, activation="gelu", batch_first=True,
                                           layer_norm_eps=1e-12)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden, eps=1e-12))
        self.decoder_bias = nn.Parameter(torch.zeros(vocab))
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens: Tensor, labels: Tensor) -> Tensor:
        """Masked-LM loss (``labels == -100``: not predicted)."""
        pos = torch.arange(tokens.shape[1])
        x = self.norm(self.word(tokens) + self.position(pos) + self.token_type(torch.zeros_like(tokens)))
        h = self.head(self.encoder(x))
        logits = h @ self.word.weight.t() + self.decoder_bias
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _bert(quick: bool) -> ModelSpec:
    vocab, hidden, layers, heads, ffn, seq = (2_000, 64, 2, 2, 128, 16) if quick else (30_522, 768, 12, 12, 3072, 64)

    def batch(gen: torch.Generator, n: int) -> Batch:
        tokens = torch.randint(0, vocab, (n, seq), generator=gen)
        masked = torch.rand(n, seq, generator=gen) < 0.15
        masked[:, 0] = True  # at least one prediction per sequence
        return tokens, torch.where(masked, tokens, torch.full_like(tokens, -100))

    def loss(model: nn.Module, b: Batch) -> Tensor:
        return model(*b)

    return ModelSpec("bert", lambda sparse: Bert(vocab, hidden, layers, heads, ffn, seq), batch, loss,
                     4 if quick else 2, False,
                     f"BERT vocab {vocab:,}, hidden {hidden}, {layers} layers, {heads} heads, FFN {ffn}, seq {seq}")


def spec(name: str, quick: bool = False) -> ModelSpec:
    """The :class:`ModelSpec` of ``name`` (one of :data:`MODELS` or ``lstm-full``)."""
    builders: dict[str, Callable[[], ModelSpec]] = {
        "ncf": lambda: _ncf(quick), "lstm": lambda: _lstm(quick, False), "lstm-full": lambda: _lstm(quick, True),
        "vgg19": lambda: _vgg19(quick), "bert": lambda: _bert(quick), "charlstm": lambda: _charlstm(quick)}
    if name not in builders:
        raise ConfigError(f"bench models: unknown model {name!r}; choose from {sorted(builders)}")
    return builders[name]()
