"""HybridModel: a Qwen3.5-style hybrid of gated-delta-net (GDN) and full-attention layers.

Layers repeat as three GDN layers then one grouped-query attention layer. Every layer is a
pre-norm residual block (RMSNorm) with a SwiGLU MLP.

Why the forward pass is computed on a fixed grid
------------------------------------------------
The server calls `forward` on arbitrary sub-ranges of a prompt (ubatch boundaries, checkpoint
positions, restore re-entry points) and must produce the same greedy tokens as one cold pass.
Floating-point results depend on the *shape* of each kernel call (BLAS blocking, vector/scalar
tails of elementwise loops), not only on the values. So every call is broken into tiles of
`chunk_size` rows aligned to ABSOLUTE positions: positions [k*C, (k+1)*C) are always computed as
the same C-row tile, at the same row offsets, with the same key range for attention. Rows of a
tile that the call does not own hold padding whose values are never mixed into owned rows
(causal masks multiply them by exact zeros). The gated delta rule keeps its state at the tile's
grid start plus the per-token inputs of the tokens already seen in the tile, and recomputes the
whole tile each time, so a token's numbers never depend on where a call began or ended.
Result: for calls of two or more tokens the logits are bit-identical however the prompt is
split or restored (tests/engine/test_model.py). Decode calls (one token) take the recurrent form
of the rule for that token's output; it agrees with the chunked form to ~1e-15 because the GDN
math and states are float64, so after rounding back to float32 the logits are in practice
identical too (the test allows 1e-4 and checks the greedy tokens). The end state of a chunk is
always computed by the chunked form, however its tokens arrived.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor, nn

from .config import ModelConfig
from .modelfile import read_config, sha256_file

F64 = torch.float64


# ---------------------------------------------------------------------------------------------
# the gated delta rule (pure functions; tests compare them with a naive recurrence)
# ---------------------------------------------------------------------------------------------

def chunk_gated_delta(s0: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                      last: int) -> tuple[Tensor, Tensor]:
    """Chunked (parallel) gated delta rule over one chunk.

    s0: [H, Dk, Dv] state before the chunk; q, k: [H, C, Dk]; v: [H, C, Dv]; g (log decay, <= 0)
    and beta: [H, C]. Returns the outputs [H, C, Dv] and the state after row `last`. Row i of the
    outputs depends only on rows <= i, so rows after `last` may hold any finite padding.
    The UT transform turns the C sequential rank-one updates into one triangular solve.
    """
    C = q.shape[-2]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    gcum = g.cumsum(-1)
    # decay[i, j] = exp(gcum_i - gcum_j) for j <= i; masked before exp so it never overflows
    decay = torch.exp((gcum[..., :, None] - gcum[..., None, :]).masked_fill(~causal, 0)).masked_fill(~causal, 0)
    kb = k * beta[..., None]
    strict = (kb @ k.transpose(-1, -2) * decay).masked_fill(~causal.tril(-1), 0)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    u = torch.linalg.solve_triangular(eye + strict, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(eye + strict, kb * gcum.exp()[..., None], upper=False, unitriangular=True)
    v_new = u - w @ s0
    o = (q * gcum.exp()[..., None]) @ s0 + (q @ k.transpose(-1, -2) * decay) @ v_new
    after = torch.arange(C, device=q.device) > last
    tail = torch.exp((gcum[..., last:last + 1] - gcum).masked_fill(after, 0)).masked_fill(after, 0)
    s = s0 * gcum[..., last].exp()[..., None, None] + (k * tail[..., None]).transpose(-1, -2) @ v_new
    return o, s


def recurrent_gated_delta_step(s: Tensor, q: Tensor, k: Tensor, v: Tensor, g: Tensor,
                               beta: Tensor) -> tuple[Tensor, Tensor]:
    """One token of the recurrent form: S <- a S (I - b k k^T) + b v k^T (stored transposed,
    [H, Dk, Dv]); o = S q. q, k: [H, Dk]; v: [H, Dv]; g, beta: [H]."""
    s = s * g.exp()[:, None, None]
    recalled = (k[:, None, :] @ s)[:, 0]
    s = s + k[:, :, None] * ((v - recalled) * beta[:, None])[:, None, :]
    return (q[:, None, :] @ s)[:, 0], s


# ---------------------------------------------------------------------------------------------
# per-sequence state
# ---------------------------------------------------------------------------------------------

@dataclass
class GDNState:
    s0: Tensor     # [H, Dk, Dv] state at the grid start of the current chunk (float64)
    s: Tensor      # [H, Dk, Dv] state at n_past, what a decode step continues from
    rows: Tensor   # [C, H, 3D+2] q, k, v, g, beta of the chunk's tokens seen so far
    conv: Tensor   # [K-1, 3*H*D] conv inputs of the last K-1 tokens

    def tensors(self) -> tuple[Tensor, ...]:
        return self.s0, self.s, self.rows, self.conv


@dataclass
class KVCache:
    # [capacity, Hkv, head_dim]: position-major, so the keys [0, end) a tile reads are a prefix
    # of the buffer with the same strides whatever the capacity (n_ctx) is
    k: Tensor
    v: Tensor


@dataclass
class SeqState:
    n_ctx: int
    layers: list[GDNState | KVCache]
    n_past: int = 0   # position the recurrent state is at (tokens processed)
    n_kv: int = 0     # attention KV holds positions [0, n_kv)


@dataclass
class KVPrefix:
    """A copy of the attention KV of positions [0, n_tokens): with a checkpoint at or below
    n_tokens it is all a restore needs (the retention store keeps one per entry)."""
    n_tokens: int
    layers: list[tuple[Tensor, Tensor]] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer)


@dataclass
class RecurrentSnapshot:
    n_past: int
    layers: list[tuple[Tensor, ...]] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for layer in self.layers for t in layer)


@dataclass
class Tile:
    """Rows [lo, hi) of the C-row tile starting at absolute position `start` belong to this call."""
    start: int
    lo: int
    hi: int
    decode: bool
    cos: Tensor
    sin: Tensor
    future: Tensor   # [C, C]: key start + j is in the future of row r (j > r), masked


# ---------------------------------------------------------------------------------------------
# modules
# ---------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.to(x.dtype)


class FeedForward(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(c.d_model, c.d_ff, bias=False)   # gate
        self.w3 = nn.Linear(c.d_model, c.d_ff, bias=False)   # up
        self.w2 = nn.Linear(c.d_ff, c.d_model, bias=False)   # down

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def _l2norm(x: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


class GatedDeltaNet(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.n_heads, self.head_dim, self.kernel = c.gdn_n_heads, c.gdn_head_dim, c.conv_kernel
        hd = c.gdn_dim
        self.in_proj_qkvz = nn.Linear(c.d_model, 4 * hd, bias=False)
        self.in_proj_ba = nn.Linear(c.d_model, 2 * c.gdn_n_heads, bias=False)
        self.conv = nn.Parameter(torch.zeros(3 * hd, c.conv_kernel))   # depthwise taps, last = current token
        self.A_log = nn.Parameter(torch.zeros(c.gdn_n_heads))
        self.dt_bias = nn.Parameter(torch.zeros(c.gdn_n_heads))
        # Not in Qwen3-Next: lets a random model own slow-writing, long-memory heads.
        self.beta_bias = nn.Parameter(torch.zeros(c.gdn_n_heads))
        self.norm = RMSNorm(c.gdn_head_dim, c.norm_eps)
        self.out_proj = nn.Linear(hd, c.d_model, bias=False)

    def new_state(self, c: ModelConfig, device: torch.device) -> GDNState:
        H, D = self.n_heads, self.head_dim
        return GDNState(
            s0=torch.zeros(H, D, D, dtype=F64, device=device),
            s=torch.zeros(H, D, D, dtype=F64, device=device),
            rows=torch.zeros(c.chunk_size, H, 3 * D + 2, dtype=F64, device=device),
            conv=torch.zeros(self.kernel - 1, 3 * H * D, device=device),
        )

    def _causal_conv(self, x: Tensor, st: GDNState, lo: int, hi: int) -> Tensor:
        """Depthwise causal conv over rows [lo, hi); earlier inputs come from the conv state."""
        K, C = self.kernel, x.shape[0]
        buf = x.new_zeros(C + K - 1, x.shape[1])
        buf[lo:lo + K - 1] = st.conv
        buf[lo + K - 1:hi + K - 1] = x[lo:hi]
        st.conv = buf[hi:hi + K - 1].clone()
        out = buf[0:C] * self.conv[:, 0]
        for i in range(1, K):
            out = out + buf[i:i + C] * self.conv[:, i]
        return out

    def forward(self, x: Tensor, st: GDNState, tile: Tile) -> Tensor:
        C, H, D = x.shape[0], self.n_heads, self.head_dim
        lo, hi = tile.lo, tile.hi
        qkv, z = self.in_proj_qkvz(x).split([3 * H * D, H * D], -1)
        b, a = self.in_proj_ba(x).split(H, -1)
        qkv = F.silu(self._causal_conv(qkv, st, lo, hi)).to(F64).view(C, 3, H, D)
        q, k, v = _l2norm(qkv[:, 0]) * D ** -0.5, _l2norm(qkv[:, 1]), qkv[:, 2]
        beta = torch.sigmoid((b + self.beta_bias).to(F64))
        g = -self.A_log.to(F64).exp() * F.softplus((a + self.dt_bias).to(F64))
        new_rows = torch.cat([q, k, v, g[..., None], beta[..., None]], -1)
        st.rows[lo:hi] = new_rows[lo:hi]
        q, k, v, g, beta = st.rows.transpose(0, 1).split([D, D, D, 1, 1], -1)   # [H, C, ...]
        g, beta = g[..., 0], beta[..., 0]
        if tile.decode:
            o_row, st.s = recurrent_gated_delta_step(st.s, q[:, lo], k[:, lo], v[:, lo], g[:, lo], beta[:, lo])
            o = torch.zeros(H, C, D, dtype=F64, device=x.device)
            o[:, lo] = o_row
            if hi == C:   # chunk complete: its end state comes from the chunked form, like a prefill's
                _, st.s = chunk_gated_delta(st.s0, q, k, v, g, beta, C - 1)
        else:
            o, st.s = chunk_gated_delta(st.s0, q, k, v, g, beta, hi - 1)
        if hi == C:
            st.s0 = st.s
        o = self.norm(o.transpose(0, 1)) * F.silu(z.view(C, H, D).to(F64))
        return self.out_proj(o.reshape(C, H * D).to(x.dtype))


def _rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, -1)
    cos, sin = cos[:, None], sin[:, None]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.head_dim
        self.wq = nn.Linear(c.d_model, c.n_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.d_model, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.d_model, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.norm_eps)

    def new_state(self, capacity: int, device: torch.device) -> KVCache:
        shape = (capacity, self.n_kv_heads, self.head_dim)
        return KVCache(torch.zeros(shape, device=device), torch.zeros(shape, device=device))

    def forward(self, x: Tensor, kv: KVCache, tile: Tile) -> Tensor:
        C, Hkv, hd = x.shape[0], self.n_kv_heads, self.head_dim
        G = self.n_heads // Hkv
        q = _rope(self.q_norm(self.wq(x).view(C, self.n_heads, hd)), tile.cos, tile.sin)
        k = _rope(self.k_norm(self.wk(x).view(C, Hkv, hd)), tile.cos, tile.sin)
        v = self.wv(x).view(C, Hkv, hd)
        a, b = tile.start + tile.lo, tile.start + tile.hi
        kv.k[a:b] = k[tile.lo:tile.hi]
        kv.v[a:b] = v[tile.lo:tile.hi]
        end = tile.start + C   # fixed per tile; keys past the call are masked (exact zeros)
        q = (q * hd ** -0.5).view(C, Hkv, G, hd).permute(1, 2, 0, 3).reshape(Hkv, G * C, hd)
        scores = q @ kv.k[:end].permute(1, 2, 0)
        # keys before the tile are visible to every row: only the tile's own block needs a mask
        scores[..., tile.start:].masked_fill_(tile.future.repeat(G, 1), float("-inf"))
        out = torch.softmax(scores, -1) @ kv.v[:end].transpose(0, 1)
        return self.wo(out.view(Hkv, G, C, hd).permute(2, 0, 1, 3).reshape(C, self.n_heads * hd))


class Block(nn.Module):
    def __init__(self, c: ModelConfig, layer: int):
        super().__init__()
        self.attention_norm = RMSNorm(c.d_model, c.norm_eps)
        self.mixer: Attention | GatedDeltaNet = Attention(c) if c.is_attention(layer) else GatedDeltaNet(c)
        self.ffn_norm = RMSNorm(c.d_model, c.norm_eps)
        self.ffn = FeedForward(c)

    def forward(self, x: Tensor, st: GDNState | KVCache, tile: Tile) -> Tensor:
        x = x + self.mixer(self.attention_norm(x), st, tile)
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """The parameters; weights.py draws them by name, HybridModel runs them."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.d_model)
        self.layers = nn.ModuleList(Block(c, i) for i in range(c.n_layers))
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.output = None if c.tie_embeddings else nn.Linear(c.d_model, c.vocab_size, bias=False)

    def head(self, h: Tensor) -> Tensor:
        w = self.tok_embeddings.weight if self.output is None else self.output.weight
        return F.linear(self.norm(h), w)


# ---------------------------------------------------------------------------------------------
# the engine-facing API
# ---------------------------------------------------------------------------------------------

class HybridModel:
    def __init__(self, config: ModelConfig, net: Transformer, device: torch.device,
                 weights_sha256: str = "", path: Path | None = None):
        self.config, self.net, self.device = config, net, device
        self.weights_sha256, self.path = weights_sha256, path
        hd = config.head_dim
        C = config.chunk_size
        self._future = torch.ones(C, C, dtype=torch.bool, device=device).triu(1)
        self._inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, hd, 2, dtype=F64, device=device) / hd)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> "HybridModel":
        path = Path(path)
        config = read_config(path)
        tensors = {}
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
        net = Transformer(config)
        net.load_state_dict(tensors, strict=True)
        net.requires_grad_(False).eval()
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but torch {torch.__version__} sees no CUDA device; use --device cpu")
        net.to(dev)
        dev = net.norm.weight.device   # the device actually used ("cuda" -> "cuda:0")
        return cls(config, net, dev, sha256_file(path), path)

    def new_state(self, n_ctx: int) -> SeqState:
        C = self.config.chunk_size
        capacity = -(-n_ctx // C) * C
        layers = [b.mixer.new_state(capacity, self.device) if isinstance(b.mixer, Attention)
                  else b.mixer.new_state(self.config, self.device) for b in self.net.layers]
        return SeqState(n_ctx=n_ctx, layers=layers)

    def _tile(self, start: int, lo: int, hi: int, decode: bool) -> Tile:
        C = self.config.chunk_size
        rows = torch.arange(start, start + C, device=self.device)
        angles = rows.to(F64)[:, None] * self._inv_freq[None, :]
        return Tile(start, lo, hi, decode, angles.cos().float(), angles.sin().float(), self._future)

    @torch.inference_mode()
    def forward(self, state: SeqState, tokens: list[int], pos: int) -> Tensor:
        """Process `tokens` at positions pos.. and return the float32 logits of the last one."""
        n, C = len(tokens), self.config.chunk_size
        if n == 0:
            raise ValueError("forward needs at least one token")
        if pos != state.n_past or state.n_kv < pos:
            raise ValueError(f"state is at {state.n_past} (KV holds {state.n_kv}), asked to continue at {pos}")
        if pos + n > state.n_ctx:
            raise ValueError(f"positions up to {pos + n} exceed the context size {state.n_ctx}")
        if min(tokens) < 0 or max(tokens) >= self.config.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})")
        ids = torch.tensor(tokens, device=self.device)
        emb = self.net.tok_embeddings.weight
        done = 0
        while done < n:
            p = pos + done
            start = p - p % C
            lo, hi = p - start, min(C, p - start + n - done)
            tile = self._tile(start, lo, hi, decode=n == 1)
            x = emb.new_zeros(C, emb.shape[1])
            x[lo:hi] = emb[ids[done:done + hi - lo]]
            for block, st in zip(self.net.layers, state.layers):
                x = block(x, st, tile)
            done += hi - lo
        state.n_past = state.n_kv = pos + n
        return self.net.head(x[hi - 1:hi])[0].float().cpu()

    def snapshot(self, state: SeqState) -> RecurrentSnapshot:
        layers = [tuple(t.clone() for t in st.tensors()) for st in state.layers if isinstance(st, GDNState)]
        return RecurrentSnapshot(state.n_past, layers)

    def restore(self, state: SeqState, snap: RecurrentSnapshot) -> None:
        if state.n_kv < snap.n_past:
            raise ValueError(f"KV holds {state.n_kv} tokens, the snapshot needs {snap.n_past}")
        gdn = [st for st in state.layers if isinstance(st, GDNState)]
        for st, (s0, s, rows, conv) in zip(gdn, snap.layers, strict=True):
            st.s0, st.s, st.rows, st.conv = s0.clone(), s.clone(), rows.clone(), conv.clone()
        state.n_past = snap.n_past

    def perturb(self, state: SeqState, seed: int, scale: float) -> None:
        """Fault injection only (faults.py split-noise / nondeterministic): add noise drawn
        from `seed`, `scale` times the state's mean magnitude, to every recurrent state."""
        gen = torch.Generator().manual_seed(seed)
        for st in state.layers:
            if isinstance(st, GDNState):
                noise = torch.randn(st.s.shape, generator=gen, dtype=F64).to(st.s.device)
                delta = scale * st.s.abs().mean() * noise
                st.s, st.s0 = st.s + delta, st.s0 + delta

    def save_kv(self, state: SeqState, n_tokens: int) -> KVPrefix:
        if n_tokens > state.n_kv:
            raise ValueError(f"KV holds {state.n_kv} tokens, asked to save {n_tokens}")
        layers = [(st.k[:n_tokens].clone(), st.v[:n_tokens].clone()) for st in state.layers
                  if isinstance(st, KVCache)]
        return KVPrefix(n_tokens, layers)

    def load_kv(self, state: SeqState, prefix: KVPrefix) -> None:
        """Make the KV hold exactly `prefix`; the recurrent state is stale until `restore`."""
        kv = [st for st in state.layers if isinstance(st, KVCache)]
        for st, (k, v) in zip(kv, prefix.layers, strict=True):
            st.k[:prefix.n_tokens] = k
            st.v[:prefix.n_tokens] = v
        state.n_kv = prefix.n_tokens

    @property
    def kv_bytes_per_token(self) -> int:
        c = self.config
        n_attention = sum(c.is_attention(i) for i in range(c.n_layers))
        return n_attention * 2 * c.n_kv_heads * c.head_dim * torch.empty(0).element_size()  # k and v

    def trim_kv(self, state: SeqState, n_tokens: int) -> None:
        """Keep the first n_tokens of attention KV. Entries past it are left in memory: a query
        only ever reads keys at or before its own position, and those are rewritten first."""
        state.n_kv = min(state.n_kv, max(0, n_tokens))
