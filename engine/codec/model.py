"""`CodecDecoder`: codes [B, 16, T] -> 24 kHz waveform [B, T * 1920], whole-sequence or one chunk at a time.

Composition only (blocks in `layers.py`, dequantizer in `quantizer.py`); `state_dict()` keys are the official
`speech_tokenizer/model.safetensors` `decoder.*` keys without the `decoder.` prefix. Data flow (full codec):

    codes [B,16,T] -> quantizer [B,512,T] -> pre_conv k3 [B,1024,T] -> pre_transformer (8 layers, window 72)
    -> upsample x2 (transposed conv k2 + ConvNeXt) x2 [B,1024,4T] -> decoder.0 k7 [B,1536,4T]
    -> decoder.1..4 (x8, x5, x4, x3) [B,96,1920T] -> SnakeBeta -> decoder.6 k7 [B,1,1920T] -> clamp [-1, 1]

`decode` runs that once over the whole sequence (positions from 0); `decode_official` replicates the released
package's 300-frame chunks with 25 frames of fresh left context; `forward_stream` decodes N new frames per
stream given each stream's carried state (see `state_layout.py`), which `stream.py` stores and batches.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from engine.codec.config import CodecConfig
from engine.codec.layers import (
    CausalConv1d,
    CausalTransposedConv1d,
    ConvNeXtBlock,
    DecoderBlock,
    RMSNorm,
    SnakeBeta,
    TransformerLayer,
    rope_tables,
)
from engine.codec.quantizer import SplitResidualVectorQuantizer

OFFICIAL_CHUNK_FRAMES = 300
OFFICIAL_LEFT_CONTEXT_FRAMES = 25


def real_frames(valid: Tensor, n: int) -> Tensor:
    """valid [B] -> [B, n] bool: which of a ragged batch's n new frames are real in each row."""
    return torch.arange(n, device=valid.device)[None, :] < valid[:, None]


def ring_update(k_ring: Tensor, v_ring: Tensor, k: Tensor, v: Tensor, slots: Tensor,
                real: Tensor | None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """New (k, v) rings [B, H_kv, W-1, D] after a step's keys k, v [B, H_kv, N, D] (`stream_layout`'s slots
    [B, keep]: the newest keep keys' ring entries). `real` [B, N] (a ragged batch, keep == N): a padding frame's
    entry keeps its old key."""
    batch, heads, n, dim = k.shape
    keep = slots.shape[1]
    index = slots[:, None, :, None].expand(batch, heads, keep, dim)
    k_new, v_new = k[:, :, n - keep :], v[:, :, n - keep :]
    if real is not None:
        mask = real[:, None, :, None]
        k_new = torch.where(mask, k_new, k_ring.gather(2, index))
        v_new = torch.where(mask, v_new, v_ring.gather(2, index))
    return k_ring.scatter(2, index, k_new), v_ring.scatter(2, index, v_new)


class PreTransformer(nn.Module):
    """input_proj -> sliding-window causal layers -> final RMSNorm -> output_proj, on [B, N, latent_dim]."""

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.window = config.sliding_window
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta
        self.layers = nn.ModuleList(
            TransformerLayer(
                config.hidden_size,
                config.num_attention_heads,
                config.num_key_value_heads,
                config.head_dim,
                config.intermediate_size,
                config.rms_norm_eps,
                config.layer_scale_initial_scale,
            )
            for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)

    def inv_freq(self, device: torch.device) -> Tensor:
        # Always fp32, never a module buffer: a buffer would be down-cast with the weights by `.to(bf16)`.
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64, device=device).to(torch.float32)
        return 1.0 / (self.rope_theta ** (exponents / self.head_dim))

    def forward(self, x: Tensor) -> Tensor:
        x = self.input_proj(x)
        positions = torch.arange(x.shape[1], device=x.device)[None]
        cos, sin = rope_tables(positions, self.inv_freq(x.device), x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin, self.window)
        return self.output_proj(self.norm(x))

    def stream_layout(
        self, positions: Tensor, n: int, dtype: torch.dtype
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """What every layer of a streaming step shares, for positions [B] and n new frames: RoPE cos, sin
        [B, n, head_dim] in `dtype`, the attention mask allowed [B, n, W-1+n] over (ring, new keys), and the ring
        slots [B, keep] the newest keep = min(n, W-1) keys overwrite (their positions mod W-1)."""
        device = positions.device
        ring_len = self.window - 1
        offsets = torch.arange(n, device=device)
        query_pos = positions[:, None] + offsets[None, :]  # [B, N] absolute frame positions
        cos, sin = rope_tables(query_pos, self.inv_freq(device), dtype)

        # Absolute position held by each ring entry (negative: never written), [B, W-1].
        newest = positions[:, None] - 1
        ring_pos = newest - torch.remainder(newest - torch.arange(ring_len, device=device)[None, :], ring_len)
        ring_allowed = (ring_pos[:, None, :] >= 0) & (
            ring_pos[:, None, :] > query_pos[:, :, None] - self.window
        )
        new_allowed = (offsets[None, :] <= offsets[:, None]) & (
            offsets[None, :] > offsets[:, None] - self.window
        )
        allowed = torch.cat([ring_allowed, new_allowed[None].expand(positions.shape[0], n, n)], dim=-1)

        # Only the newest W-1 keys can be seen again; they overwrite the ring at their positions mod W-1.
        keep = min(n, ring_len)
        slots = torch.remainder(query_pos[:, n - keep :], ring_len)  # [B, keep], distinct per row
        return cos, sin, allowed, slots

    def forward_stream(
        self, x: Tensor, positions: Tensor, rings: list[tuple[Tensor, Tensor]], valid: Tensor | None = None
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """x [B, N, latent]; positions [B] int64 = frames each stream decoded so far; rings per layer (k, v)
        [B, H_kv, W-1, D] with the key of absolute frame p at ring index p % (W-1).
        Returns y [B, N, latent] and the updated rings.

        `valid` [B]: only row b's first valid[b] frames are real (a ragged batch, N <= W-1). Their keys enter
        the ring; a padding frame's ring entry keeps its old key (the N new positions map to N distinct
        entries, so nothing else is touched). Causal attention keeps real outputs blind to the padding.
        """
        x = self.input_proj(x)
        n = x.shape[1]
        if valid is not None and n > self.window - 1:
            raise ValueError(f"a ragged codec step decodes at most {self.window - 1} frames, got {n}")
        cos, sin, allowed, slots = self.stream_layout(positions, n, x.dtype)
        real = None if valid is None else real_frames(valid, n)
        new_rings = []
        for layer, (k_ring, v_ring) in zip(self.layers, rings, strict=True):
            x, k, v = layer.forward_stream(x, cos, sin, k_ring, v_ring, allowed)
            new_rings.append(ring_update(k_ring, v_ring, k, v, slots, real))
        return self.output_proj(self.norm(x)), new_rings


class CodecDecoder(nn.Module):
    """The 12 Hz speech-tokenizer decoder (parameter names of the official `decoder.*` tensors)."""

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.config = config
        self.quantizer = SplitResidualVectorQuantizer(
            config.num_quantizers, config.codebook_dim, config.codebook_size
        )
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, kernel_size=3)
        self.pre_transformer = PreTransformer(config)
        self.upsample = nn.ModuleList(
            nn.ModuleList(
                [
                    CausalTransposedConv1d(config.latent_dim, config.latent_dim, ratio, ratio),
                    ConvNeXtBlock(config.latent_dim),
                ]
            )
            for ratio in config.upsampling_ratios
        )
        blocks: list[nn.Module] = [CausalConv1d(config.latent_dim, config.decoder_dim, kernel_size=7)]
        for index, rate in enumerate(config.upsample_rates):
            in_dim, out_dim = config.decoder_dim // 2**index, config.decoder_dim // 2 ** (index + 1)
            blocks.append(DecoderBlock(in_dim, out_dim, rate))
        blocks += [SnakeBeta(config.output_dim), CausalConv1d(config.output_dim, 1, kernel_size=7)]
        self.decoder = nn.ModuleList(blocks)

    @property
    def samples_per_frame(self) -> int:
        return self.config.samples_per_frame

    # ------------------------------------------------------------------ whole sequence

    def forward(self, codes: Tensor) -> Tensor:
        """codes [B, K, T] int64 (validated by the caller) -> wav [B, 1, T * samples_per_frame], model dtype."""
        hidden = self.pre_conv(self.quantizer.decode(codes)).transpose(1, 2)
        hidden = self.pre_transformer(hidden).permute(0, 2, 1)
        for transposed, convnext in self.upsample:
            hidden = convnext(transposed(hidden))
        for block in self.decoder:
            hidden = block(hidden)
        return hidden.clamp(min=-1, max=1)

    @torch.no_grad()
    def decode(self, codes: Tensor) -> Tensor:
        """Full decode in one forward: codes [B, 16, T] -> wav [B, T * 1920] in [-1, 1] (`output_dtype`)."""
        self.check_codes(codes)
        if codes.shape[-1] == 0:
            return torch.zeros(codes.shape[0], 0, device=self.device, dtype=self.output_dtype)
        return self(codes.to(self.device, torch.int64)).squeeze(1).to(self.output_dtype)

    @torch.no_grad()
    def decode_official(self, codes: Tensor) -> Tensor:
        """The released package's decode: 300-frame chunks, each re-decoded from scratch (positions from 0) with
        up to 25 frames of left context whose audio is dropped. Equals `decode` for T <= 300 frames.
        """
        self.check_codes(codes)
        codes = codes.to(self.device, torch.int64)
        total, pieces, start = codes.shape[-1], [], 0
        while start < total:
            end = min(start + OFFICIAL_CHUNK_FRAMES, total)
            context = OFFICIAL_LEFT_CONTEXT_FRAMES if start > OFFICIAL_LEFT_CONTEXT_FRAMES else start
            wav = self(codes[..., start - context : end])
            pieces.append(wav[..., context * self.samples_per_frame :])
            start = end
        if not pieces:
            return torch.zeros(codes.shape[0], 0, device=self.device, dtype=self.output_dtype)
        return torch.cat(pieces, dim=-1).squeeze(1).to(self.output_dtype)

    # ------------------------------------------------------------------ streaming

    def forward_stream(
        self, codes: Tensor, positions: Tensor, state: dict[str, Tensor], frames: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """N new frames per stream: codes [B, K, N], positions [B] int64 (frames already decoded), state as named
        in `codec_state_layout` with a leading batch dimension. Returns (wav [B, 1, N * 1920] in the model dtype,
        the new state). Pure: the input state tensors are not modified.

        Ragged batch: `frames` [B] int64 in 1..N says how many of row b's N frames are real; the rest are
        padding. The new state is then the state after row b's real frames only, and wav[b] past
        frames[b] * 1920 samples is meaningless. Each row equals that stream decoding its real frames alone.
        """
        new: dict[str, Tensor] = {}
        valid = frames  # real samples per row at the current stage's rate (None: every row is whole)
        hidden, new["pre_conv"] = self.pre_conv.forward_stream(
            self.quantizer.decode(codes), state["pre_conv"], valid
        )
        names = [
            (f"pre_transformer.layers.{i}.k", f"pre_transformer.layers.{i}.v")
            for i in range(len(self.pre_transformer.layers))
        ]
        rings = [(state[k], state[v]) for k, v in names]
        hidden, rings = self.pre_transformer.forward_stream(hidden.transpose(1, 2), positions, rings, valid)
        for (k_name, v_name), (k_ring, v_ring) in zip(names, rings, strict=True):
            new[k_name], new[v_name] = k_ring, v_ring
        hidden = hidden.permute(0, 2, 1)
        for stage, (transposed, convnext) in enumerate(self.upsample):
            name = f"upsample.{stage}.1.dwconv"
            hidden = transposed(hidden)  # k == stride: no overlap, stateless
            valid = None if valid is None else valid * transposed.stride
            hidden, new[name] = convnext.forward_stream(hidden, state[name], valid)
        hidden, new["decoder.0"] = self.decoder[0].forward_stream(hidden, state["decoder.0"], valid)
        for index in range(1, len(self.config.upsample_rates) + 1):
            block_names = [f"decoder.{index}.block.1"] + [
                f"decoder.{index}.block.{u}.conv1" for u in (2, 3, 4)
            ]
            block = self.decoder[index]
            hidden, block_states = block.forward_stream(hidden, [state[n] for n in block_names], valid)
            valid = None if valid is None else valid * block.block[1].stride
            new.update(zip(block_names, block_states, strict=True))
        final = len(self.config.upsample_rates) + 2
        hidden = self.decoder[final - 1](hidden)  # SnakeBeta
        hidden, new[f"decoder.{final}"] = self.decoder[final].forward_stream(
            hidden, state[f"decoder.{final}"], valid
        )
        return hidden.clamp(min=-1, max=1), new

    # ------------------------------------------------------------------ helpers

    @property
    def device(self) -> torch.device:
        return self.pre_conv.conv.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.pre_conv.conv.weight.dtype

    @property
    def output_dtype(self) -> torch.dtype:
        """Waveforms leave in float32 (bf16 models too, as the official), float64 models keep float64."""
        return torch.promote_types(self.dtype, torch.float32)

    def check_codes(self, codes: Tensor, *, check_values: bool = True) -> None:
        """Raise ValueError unless codes is an integer [B, num_quantizers, T] tensor of ids < codebook_size."""
        if not isinstance(codes, Tensor):
            raise TypeError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
        if codes.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
            raise ValueError(f"codes must be an integer tensor, got {codes.dtype}")
        if codes.dim() != 3 or codes.shape[1] != self.config.num_quantizers:
            raise ValueError(
                f"codes must have shape [batch, {self.config.num_quantizers}, frames], got {tuple(codes.shape)}"
            )
        if check_values and codes.numel():
            low, high = int(codes.min()), int(codes.max())
            if low < 0 or high >= self.config.codebook_size:
                raise ValueError(
                    f"codes must lie in [0, {self.config.codebook_size}); got values in [{low}, {high}] "
                    "(strip EOS/padding before decoding)"
                )
