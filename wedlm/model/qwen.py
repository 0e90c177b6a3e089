"""The Qwen/Llama-family causal decoder that WeDLM runs unmodified (docs/method.md, "The model and its checkpoint").

Plain PyTorch. Module names are the checkpoint's contract (`model.layers.N.self_attn.q_proj`
and so on), so a HF state dict loads without renaming. `forward` takes token ids,
explicit logical position ids of any order (Topological Reordering, paper
section 4.1) and explicit attention metadata, and returns logits only at the
flat token indices asked for.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import DenseAttention, PagedAttention
from .config import ModelConfig
from .layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rope

AttentionMetadata = DenseAttention | PagedAttention


class Attention(nn.Module):
    """GQA self-attention; q/k/v bias (Qwen2.5, Llama `attention_bias`), o_proj bias and
    per-head q/k RMSNorm (Qwen3) by config."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim ** -0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.o_proj_bias)
        if config.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionMetadata) -> torch.Tensor:
        """x [..., hidden] -> [..., hidden]; cos/sin [..., head_dim]."""
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attn.attend(self.layer_idx, q, k, v, self.scale)  # [..., heads, head_dim]
        return self.o_proj(out.reshape(*lead, self.num_heads * self.head_dim))


class DecoderLayer(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                attn: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class QwenModel(nn.Module):
    """Embedding, decoder layers and the final norm (`model.*` in the checkpoint)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                attn: AttentionMetadata) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, attn)
        return self.norm(x)


class QwenForCausalLM(nn.Module):
    """Qwen2 / Qwen3 / Llama / Mistral / WeDLM causal LM.

    The same network serves AR and WeDLM decoding: logits at an ordinary token at
    logical position p predict the token at p+1; logits at a [MASK] slot at
    position p predict the token at p (docs/method.md, "The model and its checkpoint").
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = QwenModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor,
                      attn: AttentionMetadata) -> torch.Tensor:
        """Final-norm hidden states [..., hidden_size] for every input token."""
        if input_ids.shape != positions.shape:
            raise ValueError(f"input_ids {tuple(input_ids.shape)} and positions "
                             f"{tuple(positions.shape)} must have the same shape")
        return self.model(input_ids, positions, attn)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                logits_indices: torch.Tensor | None = None) -> torch.Tensor:
        """Logits at the requested tokens.

        Args:
            input_ids: int64 [batch, seq] (DenseAttention) or [num_tokens] (PagedAttention).
            positions: int64, same shape, the logical position of each token (RoPE phase);
                any order is allowed.
            attn: visibility (and KV cache) for this forward.
            logits_indices: int64 [n] indices into the flattened token axis; None = all.

        Returns:
            float logits [n, vocab_size] when `logits_indices` is given, else
            [*input_ids.shape, vocab_size].
        """
        hidden = self.hidden_states(input_ids, positions, attn)
        if logits_indices is not None:
            hidden = hidden.reshape(-1, hidden.shape[-1])[logits_indices]
        return self.lm_head(hidden)

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype
