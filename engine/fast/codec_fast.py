"""`FastCodecDecoder`: the codec's incremental step with the vocoder's elementwise work fused, same results as plain.

A drop-in for `CodecDecoder.forward_stream` (same inputs, outputs and state layout, so the two paths share one
`CodecStatePool` and can be mixed stream by stream) and for `engine.codec.stream.decode_incremental`. Most of
the plain decoder's time goes to elementwise passes in the vocoder (h200-codec-cost.md: SnakeBeta as five
kernels, bias and residual adds, the history concatenations), so that is what changes here:

    per residual unit, plain (13 passes over [B, C, L]):          fast (2 passes + 2 convs):
      snake1 (5) -> cat(history) -> conv1 + bias -> snake2 (5)      [snake1 already in conv1's buffer]
      -> conv2 + bias -> + x                                       conv1 -> bias+snake2 -> conv2
                                                                   -> bias+residual+snake1' (writes the
                                                                      residual and the next unit's buffer)

- Every fused kernel rounds where the plain op sequence rounds (`kernels/snake.py`), so bf16 results equal the
  plain bf16 decoder's up to conv algorithm choice; changing the rounding instead costs ~4e-2 relative L2.
- Biases of the vocoder convs go into the following fused kernel (PyTorch adds a conv bias as a separate
  kernel after cuDNN anyway, so the rounding is the same); the transposed convs' overlap-add joins it too.
- Conv histories: the SnakeBeta that feeds a dilated conv writes straight into that conv's input buffer after
  the carried history, so no concatenation copies the activation.
- Dequantizer: entries pre-divided once, one gather-and-sum kernel per codebook group (`kernels/codebook.py`).
- Pre-transformer: `FastPreTransformer` (codec_transformer.py), ~16 kernels a layer instead of ~47: at the
  engine's shapes the step is launch-bound and the plain layers were over half of its ~650 kernels.
- The pre-conv and upsampling stages: the plain modules in NCL; in channels-last the pre-conv with NHWC weights
  and the upsampling transposed convs (k = stride: no overlap) as one product each, because cuDNN's bf16 engines
  for them reformatted their weights to NHWC on every call (~20-50 us a conversion, 80-130 us a step on the
  H200: docs/benchmarks.md, seventeenth session).

Layout (`channels_last`): the vocoder's activations are [B, C, L] either way, in NCL memory as the plain modules
(cuDNN's tensor-core convs then convert every input and weight to NHWC and back, ~40 conversion kernels a step),
or in [B, L, C] memory with the conv weights stored once as NHWC, so cuDNN reads and writes them as they are:

    NCL:            buffer [B, C, history + L]  --F.conv1d-->  [B, C, L]
    channels-last:  memory [B, history + L, C], seen as [B, C, 1, history + L] channels_last
                                                --F.conv2d (1 x k, dilation (1, d))-->  memory [B, L, C]

In channels-last the first (widest) block's transposed conv runs as one product and an overlap-add
(`transposed_by_product`: its [B, L, C_in] input is already the product's row-major operand). The state pool
keeps its NCL layout in both (histories are copied across at each step's edges: a few samples).
Precision is a setting: "bf16" (bf16 weights and activations, the default, as the official examples run the
codec), "tf32" (fp32 weights, TF32 matmuls and convs), "fp32" (fp32, TF32 off). `precision_flags` applies the
TF32 switches around every call and around graph capture, and restores them after.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from engine.codec.config import CodecConfig
from engine.codec.layers import (
    CausalConv1d,
    CausalTransposedConv1d,
    DecoderBlock,
    ResidualUnit,
    SnakeBeta,
    take_window,
    zero_padding,
)
from engine.codec.model import CodecDecoder
from engine.codec.stream import CodecStatePool, decode_incremental
from engine.fast.codec_transformer import FastPreTransformer
from engine.fast.kernels.codebook import codebook_sum, codebook_tables
from engine.fast.kernels.conv_snake import conv_snake, conv_taps
from engine.fast.kernels.snake import snake, snake_params

PRECISIONS = ("bf16", "tf32", "fp32")
# The dtypes a codec may be loaded in for each precision (the first is the one to load it in).
PRECISION_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "bf16": (torch.bfloat16,),
    "tf32": (torch.float32,),
    "fp32": (torch.float32, torch.float64),
}


@contextmanager
def precision_flags(precision: str) -> Iterator[None]:
    """TF32 on (tf32) or off (fp32) for cuBLAS and cuDNN inside the block; bf16 leaves them alone."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown codec precision {precision!r}; choose one of {PRECISIONS}")
    if precision == "bf16":
        yield
        return
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    allow = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow
    torch.backends.cudnn.allow_tf32 = allow
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


# ------------------------------------------------------------------------------------------ folded weights


class _Ncl:
    """Vocoder activations [B, C, L] in NCL memory, weights as the modules hold them (the plain decoder's)."""

    @staticmethod
    def weight(w: Tensor) -> Tensor:
        return w

    @staticmethod
    def empty(batch: int, channels: int, length: int, like: Tensor) -> Tensor:
        return torch.empty(batch, channels, length, device=like.device, dtype=like.dtype)

    @staticmethod
    def conv(x: Tensor, weight: Tensor, bias: Tensor | None = None, dilation: int = 1) -> Tensor:
        return F.conv1d(x, weight, bias, dilation=dilation)

    @staticmethod
    def conv_transpose(x: Tensor, weight: Tensor, stride: int) -> Tensor:
        return F.conv_transpose1d(x, weight, None, stride=stride)


class _ChannelsLast:
    """Vocoder activations [B, C, L] whose memory is [B, L, C]; conv weights [C_out, C_in, 1, k] stored NHWC."""

    @staticmethod
    def weight(w: Tensor) -> Tensor:
        return w.detach().unsqueeze(2).contiguous(memory_format=torch.channels_last)

    @staticmethod
    def empty(batch: int, channels: int, length: int, like: Tensor) -> Tensor:
        return torch.empty(batch, length, channels, device=like.device, dtype=like.dtype).transpose(1, 2)

    @staticmethod
    def conv(x: Tensor, weight: Tensor, bias: Tensor | None = None, dilation: int = 1) -> Tensor:
        # x.unsqueeze(2): [B, C, 1, L] with channels_last strides, so cuDNN runs NHWC without converting
        return F.conv2d(x.unsqueeze(2), weight, bias, dilation=(1, dilation)).squeeze(2)

    @staticmethod
    def conv_transpose(x: Tensor, weight: Tensor, stride: int) -> Tensor:
        return F.conv_transpose2d(x.unsqueeze(2), weight, None, stride=(1, stride)).squeeze(2)


_Layout = type[_Ncl] | type[_ChannelsLast]


@dataclass(frozen=True, slots=True)
class _Snake:
    alpha: Tensor  # [C] exp(log alpha), activation dtype
    inv_beta: Tensor  # [C] 1 / (exp(log beta) + 1e-9)

    @classmethod
    def of(cls, module: SnakeBeta) -> _Snake:
        return cls(*snake_params(module.alpha.detach(), module.beta.detach()))


@dataclass(frozen=True, slots=True)
class _Unit:
    """ResidualUnit: x + conv2_k1(snake2(conv1_k7_d(snake1(x)))); conv1 keeps `history` post-snake1 samples.
    The conv weights are the layout's, or with `taps` the conv-and-SnakeBeta kernel's [k, C_in, C_out]."""

    act1: _Snake
    conv1_weight: Tensor
    conv1_bias: Tensor
    dilation: int
    history: int
    act2: _Snake
    conv2_weight: Tensor
    conv2_bias: Tensor

    @classmethod
    def of(cls, unit: ResidualUnit, layout: _Layout, taps: bool = False) -> _Unit:
        weight = conv_taps if taps else layout.weight
        return cls(
            _Snake.of(unit.act1), weight(unit.conv1.conv.weight), unit.conv1.conv.bias,
            unit.conv1.conv.dilation[0], unit.conv1.history, _Snake.of(unit.act2),
            weight(unit.conv2.conv.weight), unit.conv2.conv.bias,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Block:
    """DecoderBlock: snake -> causal transposed conv (k 2r, stride r) -> residual units."""

    act: _Snake
    up_weight: Tensor  # ConvTranspose1d [C_in, C_out, k] (channels-last: [C_in, C_out, 1, k] NHWC)
    up_bias: Tensor
    stride: int
    overlap: int
    units: tuple[_Unit, ...]
    up_rows: Tensor | None = None  # [C_in, 2r * C_out], tap-major: the transposed conv as a product (see `of`)

    @classmethod
    def of(cls, block: DecoderBlock, layout: _Layout, by_product: bool = False, taps: bool = False) -> _Block:
        """`by_product` (channels-last, k = 2r): the transposed conv as one product and an overlap-add
        (`transposed_by_product`). On the H200 in TF32 that beats cuDNN's transposed conv for the first, widest
        block (1536 -> 768 channels, k 16, a 75 MB fp32 weight: 92 against 300 us at 16 streams x 4 frames) and
        loses for the others (docs/benchmarks.md, thirteenth session)."""
        up: CausalTransposedConv1d = block.block[1]
        if not 0 < up.overlap <= up.stride:
            raise ValueError(
                "fast codec: a decoder block's transposed conv must overlap by 1..stride samples"
            )
        units = tuple(_Unit.of(u, layout, taps) for u in block.block[2:])
        weight = up.conv.weight.detach()  # [C_in, C_out, k]
        rows = None
        if by_product and weight.shape[-1] == 2 * up.stride:
            rows = weight.permute(0, 2, 1).reshape(weight.shape[0], -1).contiguous()
        up_weight = weight if rows is not None else layout.weight(weight)  # (unused when by product: no copy)
        return cls(_Snake.of(block.block[0]), up_weight, up.conv.bias, up.stride, up.overlap, units, rows)


class FastCodecDecoder:
    """Fused incremental decoding over a `CodecDecoder`'s weights (shared, not copied; read at construction)."""

    def __init__(
        self,
        decoder: CodecDecoder,
        precision: str = "bf16",
        fused_attention: bool = False,
        channels_last: bool = False,
        triton_convs: bool = False,
    ):
        """`fused_attention`: each pre-transformer layer's RoPE, attention and ring update as one kernel
        (`FastPreTransformer`). `channels_last`: the vocoder in [B, L, C] memory with NHWC conv weights (module
        docstring; the weights are copied once, ~0.4 GB at full size in fp32). `triton_convs` (channels-last
        only): decoder.0 and the residual units' convs each with the SnakeBeta after it in one Triton kernel
        (`kernels/conv_snake.py`; its weights copied once, tap-major, instead of the NHWC ones)."""
        if not isinstance(decoder, CodecDecoder):
            raise TypeError(f"FastCodecDecoder wraps a CodecDecoder, got {type(decoder).__name__}")
        if precision not in PRECISIONS:
            raise ValueError(f"unknown codec precision {precision!r}; choose one of {PRECISIONS}")
        if decoder.dtype not in PRECISION_DTYPES[precision]:
            raise ValueError(
                f"codec precision {precision!r} needs a decoder in {PRECISION_DTYPES[precision]}, got "
                f"{decoder.dtype}: load the codec with the matching dtype"
            )
        if triton_convs and not channels_last:
            raise ValueError("fast codec: triton_convs reads channels-last activations; set channels_last too")
        self.decoder = decoder
        self.precision = precision
        self.channels_last = channels_last
        self.triton_convs = triton_convs
        layout: _Layout = _ChannelsLast if channels_last else _Ncl
        self._layout = layout
        rates = len(decoder.config.upsample_rates)
        with torch.no_grad():
            quantizer = decoder.quantizer
            self._first_table, self._rest_table = (
                codebook_tables(
                    [layer._codebook.embedding_sum for layer in rvq.vq.layers],
                    [layer._codebook.cluster_usage for layer in rvq.vq.layers],
                )
                for rvq in (quantizer.rvq_first, quantizer.rvq_rest)
            )
            self._first_proj = quantizer.rvq_first.output_proj.weight
            self._rest_proj = quantizer.rvq_rest.output_proj.weight
            self._blocks = tuple(
                _Block.of(decoder.decoder[i], layout, by_product=channels_last and i == 1, taps=triton_convs)
                for i in range(1, rates + 1)
            )
            self._final_act = _Snake.of(decoder.decoder[rates + 1])
            self._conv0: CausalConv1d = decoder.decoder[0]
            self._final_conv: CausalConv1d = decoder.decoder[rates + 2]
            self._conv0_weight = (conv_taps if triton_convs else layout.weight)(self._conv0.conv.weight)
            self._final_weight = layout.weight(self._final_conv.conv.weight)
            # Channels-last: the pre-conv with NHWC weights and the k = stride upsampling convs as products, so
            # no cuDNN conversion kernel reformats their weights on every call (module docstring).
            self._pre_conv_weight = layout.weight(decoder.pre_conv.conv.weight) if channels_last else None
            self._upsample_rows = tuple(
                _stride_rows(transposed) if channels_last and transposed.overlap == 0 else None
                for transposed, _ in decoder.upsample
            )
        self._pre_transformer = FastPreTransformer(decoder.pre_transformer, fused_attention)
        self._final_name = f"decoder.{rates + 2}"

    # ------------------------------------------------------------------ the plain decoder's surface

    @property
    def config(self) -> CodecConfig:
        return self.decoder.config

    @property
    def device(self) -> torch.device:
        return self.decoder.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.dtype

    @property
    def output_dtype(self) -> torch.dtype:
        return self.decoder.output_dtype

    @property
    def samples_per_frame(self) -> int:
        return self.decoder.samples_per_frame

    def check_codes(self, codes: Tensor, *, check_values: bool = True) -> None:
        self.decoder.check_codes(codes, check_values=check_values)

    # ------------------------------------------------------------------ the step

    @torch.no_grad()
    def forward_stream(
        self, codes: Tensor, positions: Tensor, state: dict[str, Tensor], frames: Tensor | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """codes [B, K, N] int64, positions [B] int64, state per `codec_state_layout` -> (wav [B, 1, N * 1920]
        in the model dtype, new state). Same contract as `CodecDecoder.forward_stream`, ragged batches
        (`frames`) included; pure."""
        with precision_flags(self.precision):
            return self._forward_stream(codes, positions, state, frames)

    def _forward_stream(
        self, codes: Tensor, positions: Tensor, state: dict[str, Tensor], frames: Tensor | None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        d = self.decoder
        new: dict[str, Tensor] = {}
        valid = frames  # real samples per row at the current stage's rate (None: every row is whole)
        latent = F.conv1d(codebook_sum(self._first_table, codes[:, :1]), self._first_proj) + F.conv1d(
            codebook_sum(self._rest_table, codes[:, 1:]), self._rest_proj
        )  # [B, codebook_dim, N], as the plain quantizer
        if self._pre_conv_weight is None:
            hidden, new["pre_conv"] = d.pre_conv.forward_stream(latent, state["pre_conv"], valid)
        else:
            hidden, new["pre_conv"] = self._pre_conv(latent, state["pre_conv"], valid)
        names = [
            (f"pre_transformer.layers.{i}.k", f"pre_transformer.layers.{i}.v")
            for i in range(len(d.pre_transformer.layers))
        ]
        rings = [(state[k], state[v]) for k, v in names]
        hidden, rings = self._pre_transformer.forward_stream(hidden.transpose(1, 2), positions, rings, valid)
        for (k_name, v_name), (k_ring, v_ring) in zip(names, rings, strict=True):
            new[k_name], new[v_name] = k_ring, v_ring
        hidden = hidden.permute(0, 2, 1)
        for stage, (transposed, convnext) in enumerate(d.upsample):
            name = f"upsample.{stage}.1.dwconv"
            valid = None if valid is None else valid * transposed.stride
            rows = self._upsample_rows[stage]
            if rows is None:
                hidden = transposed(hidden)
            else:
                hidden = stride_transposed_by_product(hidden, rows, transposed.conv.bias, transposed.stride)
            hidden, new[name] = convnext.forward_stream(hidden, state[name], valid)

        # decoder.0 (k7, bias folded into block 1's SnakeBeta)
        layout = self._layout
        history0 = self._conv0.history
        if layout is _Ncl:
            padded = torch.cat([state["decoder.0"], hidden], dim=-1)
        else:
            padded = _after_history(layout, state["decoder.0"], hidden)
        new["decoder.0"] = _history(padded, history0, valid)
        x = self._conv_snake(padded, self._conv0_weight, 1, self._blocks[0].act, bias=self._conv0.conv.bias)

        for index, block in enumerate(self._blocks, start=1):
            following = self._blocks[index].act if index < len(self._blocks) else self._final_act
            x = self._block(index, block, x, following, state, new, valid)
            valid = None if valid is None else valid * block.stride
        # x: the final conv's input buffer [B, 96, 6 + N * 1920], history first
        return layout.conv(x, self._final_weight, self._final_conv.conv.bias).clamp(min=-1, max=1), new

    def _pre_conv(self, latent: Tensor, history: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor]:
        """`CausalConv1d.forward_stream` of the pre-conv in channels-last: latent [B, C_in, N] is copied after the
        carried history into a [B, history + N, C_in] buffer -> ([B, C_out, N] in [B, N, C_out] memory: the
        pre-transformer's row-major input, as a view), the next history)."""
        conv = self.decoder.pre_conv
        padded = _after_history(self._layout, history, latent)
        return self._layout.conv(padded, self._pre_conv_weight, conv.conv.bias), _history(padded, conv.history, valid)

    def _block(
        self,
        index: int,
        block: _Block,
        x: Tensor,
        following: _Snake,
        state: dict[str, Tensor],
        new: dict[str, Tensor],
        valid: Tensor | None,
    ) -> Tensor:
        """x: this block's post-SnakeBeta input [B, C_in, L] (`valid` [B]: its real samples per row, a ragged
        batch). Returns the next SnakeBeta's output: the next block's input, or (last block) the final conv's
        buffer with its history in front."""
        prefix = f"decoder.{index}.block"
        layout = self._layout
        if valid is not None:  # padding adds nothing to the tail the next call overlaps
            x = zero_padding(x, valid) if layout is _Ncl else _zero_padding_into(layout.empty(*x.shape, x), x, valid)
        if block.up_rows is not None:
            raw = transposed_by_product(x, block.up_rows, block.stride)  # [B, C, L*r + overlap]
        else:
            raw = layout.conv_transpose(x, block.up_weight, block.stride)
        emitted = x.shape[-1] * block.stride
        # Bias-free tail the next call overlaps: where the real output ends (overlap <= stride, see _Block); a row
        # with no real frame (a later part of a split ragged call) keeps the tail it carried, which `raw` lacks.
        if valid is None:
            new[f"{prefix}.1"] = raw[..., emitted:]
        else:
            tail = take_window(raw, valid * block.stride, block.overlap)
            new[f"{prefix}.1"] = torch.where((valid == 0)[:, None, None], state[f"{prefix}.1"], tail)
        valid = None if valid is None else valid * block.stride
        batch, channels = raw.shape[0], raw.shape[1]

        def conv_buffer(unit_index: int) -> tuple[Tensor, Tensor]:
            """The unit's conv1 input [B, C, history + L] with the carried history copied in front."""
            history = block.units[unit_index].history
            buffer = layout.empty(batch, channels, history + emitted, raw)
            buffer[..., :history].copy_(state[f"{prefix}.{unit_index + 2}.conv1"])
            return buffer, buffer[..., history:]

        buffer, body = conv_buffer(0)
        residual = layout.empty(batch, channels, emitted, raw)
        first = block.units[0].act1
        snake(
            raw[..., :emitted], first.alpha, first.inv_beta,
            head=state[f"{prefix}.1"], bias=block.up_bias, out=body, sum_out=residual,
        )  # fmt: skip
        for unit_index, unit in enumerate(block.units):
            new[f"{prefix}.{unit_index + 2}.conv1"] = _history(buffer, unit.history, valid)
            h = self._conv_snake(buffer, unit.conv1_weight, unit.dilation, unit.act2, bias=unit.conv1_bias)
            if unit_index + 1 < len(block.units):
                buffer, body = conv_buffer(unit_index + 1)
                skip = layout.empty(batch, channels, emitted, raw)
                self._conv_snake(h, unit.conv2_weight, 1, block.units[unit_index + 1].act1, bias=unit.conv2_bias,
                                 residual=residual, out=body, sum_out=skip)  # fmt: skip
                residual = skip
                continue
            if index < len(self._blocks):
                return self._conv_snake(h, unit.conv2_weight, 1, following, bias=unit.conv2_bias, residual=residual)
            history = self._final_conv.history
            final = layout.empty(batch, channels, history + emitted, raw)
            final[..., :history].copy_(state[self._final_name])
            self._conv_snake(h, unit.conv2_weight, 1, following, bias=unit.conv2_bias, residual=residual,
                             out=final[..., history:])  # fmt: skip
            new[self._final_name] = _history(final, history, valid)
            return final
        raise AssertionError("a decoder block has at least one residual unit")

    def _conv_snake(
        self, x: Tensor, weight: Tensor, dilation: int, act: _Snake, *, bias: Tensor | None,
        residual: Tensor | None = None, out: Tensor | None = None, sum_out: Tensor | None = None,
    ) -> Tensor:  # fmt: skip
        """A vocoder conv (bias-free) of the buffer x [B, C_in, H + L], then [bias +] [residual +] SnakeBeta into
        `out` (new if None), the pre-activation sum into `sum_out`: one kernel (`triton_convs`), or the layout's
        conv and the SnakeBeta kernel."""
        if self.triton_convs:
            return conv_snake(x, weight, dilation, act.alpha, act.inv_beta, bias=bias, residual=residual, out=out,
                              sum_out=sum_out, tf32=self.precision == "tf32")  # fmt: skip
        h = self._layout.conv(x, weight, dilation=dilation)
        out = self._layout.empty(*h.shape, h) if out is None else out
        return snake(h, act.alpha, act.inv_beta, bias=bias, residual=residual, out=out, sum_out=sum_out)

    # ------------------------------------------------------------------ eager decode over a state pool

    @torch.no_grad()
    def decode_incremental(
        self,
        pool: CodecStatePool,
        slots: Sequence[int],
        codes: Tensor,
        *,
        expected_positions: Sequence[int] | None = None,
        check_code_values: bool = True,
        frames: Sequence[int] | None = None,
    ) -> Tensor:
        """`engine.codec.stream.decode_incremental` on the fused step (eager; `CodecGraphs` replays graphs)."""
        return decode_incremental(self, pool, slots, codes, expected_positions=expected_positions,
                                  check_code_values=check_code_values, frames=frames)


def transposed_by_product(x: Tensor, rows: Tensor, stride: int) -> Tensor:
    """A k = 2r, stride-r transposed conv, bias-free, channels-last: x [B, C_in, L] in [B, L, C_in] memory, rows
    [C_in, 2r * C_out] -> [B, C_out, (L + 1) * r] in [B, (L + 1) * r, C_out] memory (the last r samples: the tail
    the next call overlaps). Input t's taps 0..r-1 land on samples t*r.., taps r..2r-1 on (t+1)*r.."""
    batch, _, length = x.shape
    taps = torch.matmul(x.transpose(1, 2), rows).view(batch, length, 2, stride, -1)  # [B, L, 2, r, C_out]
    out = torch.empty(batch, length + 1, stride, taps.shape[-1], device=x.device, dtype=x.dtype)
    out[:, 0].copy_(taps[:, 0, 0])
    torch.add(taps[:, 1:, 0], taps[:, :-1, 1], out=out[:, 1:length])
    out[:, length].copy_(taps[:, length - 1, 1])
    return out.view(batch, (length + 1) * stride, -1).transpose(1, 2)


def _stride_rows(transposed: CausalTransposedConv1d) -> Tensor:
    """A k = stride transposed conv's weight [C_in, C_out, k] as product rows [C_in, k * C_out], tap-major."""
    weight = transposed.conv.weight.detach()
    return weight.permute(0, 2, 1).reshape(weight.shape[0], -1).contiguous()


def stride_transposed_by_product(x: Tensor, rows: Tensor, bias: Tensor, stride: int) -> Tensor:
    """A k = stride transposed conv (no overlap, so no state) with its bias: x [B, C_in, L] (its [B, L, C_in] view
    row-major, as the pre-transformer and the ConvNeXt residual leave it), rows [C_in, stride * C_out] (tap-major)
    -> [B, C_out, L * stride] in [B, L * stride, C_out] memory. Input t's tap j is sample t * stride + j. The
    bias is added after the product is rounded, as PyTorch adds a conv's bias after cuDNN's conv."""
    batch, _, length = x.shape
    y = torch.matmul(x.transpose(1, 2), rows).view(batch, length * stride, -1)  # [B, L*s, C_out]
    return torch.add(y, bias).transpose(1, 2)


def _zero_padding_into(out: Tensor, x: Tensor, valid: Tensor) -> Tensor:
    """`zero_padding(x, valid)` written into `out` (a buffer of the layout the next conv reads)."""
    real = torch.arange(x.shape[-1], device=x.device)[None, :] < valid[:, None]  # [B, N]
    return torch.mul(x, real[:, None, :].to(x.dtype), out=out)


def _after_history(layout: _Layout, history: Tensor, x: Tensor) -> Tensor:
    """A conv's input buffer [B, C, H + L] in the layout's memory: the carried history [B, C, H], then x [B, C, L]."""
    size = history.shape[-1]
    buffer = layout.empty(x.shape[0], x.shape[1], size + x.shape[-1], x)
    buffer[..., :size].copy_(history)
    buffer[..., size:].copy_(x)
    return buffer


def _history(buffer: Tensor, history: int, valid: Tensor | None) -> Tensor:
    """A conv's next history: the last `history` samples of its input buffer [B, C, history + L], or (ragged)
    the `history` samples before each row's real samples end."""
    if valid is None:
        return buffer[..., buffer.shape[-1] - history :]
    return take_window(buffer, valid, history)
