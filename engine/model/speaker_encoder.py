"""The Base model's speaker encoder: reference audio -> the x-vector that replaces a speaker's codec row.

One promise: `SpeakerEncoder(config)` loaded with the checkpoint's `speaker_encoder.*` tensors (names
unchanged) maps log-mel frames to the embedding the official `Qwen3TTSSpeakerEncoder` computes, and
`speaker_embedding(encoder, pcm, rate)` does the whole official path (resample to 24 kHz as librosa
does, log-mel, encoder) for decoded float PCM.

Architecture (ECAPA-TDNN; C = channels, M = 128 mel bands, T frames):

    mel [B,T,M] -> [B,M,T] -> TDNN(k5) -> 3 x SE-Res2Net(k3, dilation 2/3/4) -> concat of the 3 block
    outputs -> TDNN(k1) "mfa" -> attentive statistics pooling -> [B,2C,1] -> Conv1x1 "fc" -> [B,enc_dim]

- TDNN = Conv1d with "same" reflect padding, then ReLU. Every conv here pads by reflection.
- SE-Res2Net = residual of: TDNN k1 -> Res2Net (channel chunks 1..s-1 each a TDNN fed by the chunk plus
  the previous chunk's output; chunk 0 passes through) -> TDNN k1 -> squeeze-excitation (time mean ->
  conv -> ReLU -> conv -> sigmoid -> channel gate).
- Pooling: global mean/std over time (weights 1/T) joined to the features, TDNN -> tanh -> conv ->
  softmax over time = attention; attention-weighted mean and std (std clamped at 1e-12 before sqrt).
Layers, composition and loading are separate: `layers` below, `SpeakerEncoder`, `load_speaker_encoder`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.model.config import SpeakerEncoderConfig
from engine.model.reference_audio import SPEAKER_SAMPLE_RATE, resample, speaker_mel

_STD_FLOOR = 1e-12

# ---------------------------------------------------------------- layers


def reflect_pad(x: Tensor, kernel_size: int, dilation: int) -> Tensor:
    """x [B,C,T] -> [B,C,T+(k-1)*dilation]: "same" padding by reflection (left gets the smaller half)."""
    span = (kernel_size - 1) * dilation
    return F.pad(x, (span // 2, span - span // 2), mode="reflect") if span else x


class TDNN(nn.Module):
    """Reflect-padded "same" Conv1d + ReLU (checkpoint names `<name>.conv.weight`, `<name>.conv.bias`)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation)

    def forward(self, x: Tensor) -> Tensor:
        """x [B,C_in,T] -> [B,C_out,T]."""
        kernel, dilation = self.conv.kernel_size[0], self.conv.dilation[0]
        return F.relu(self.conv(reflect_pad(x, kernel, dilation)))


class Res2Net(nn.Module):
    """x [B,C,T] split in `scale` channel chunks; chunk i>=1 -> TDNN(chunk_i + out_{i-1}) (no add for i=1)."""

    def __init__(self, channels: int, scale: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(TDNN(width, width, kernel_size, dilation) for _ in range(scale - 1))

    def forward(self, x: Tensor) -> Tensor:
        chunks = torch.chunk(x, self.scale, dim=1)
        outputs = [chunks[0]]
        for i in range(1, self.scale):
            feed = chunks[i] if i == 1 else chunks[i] + outputs[-1]
            outputs.append(self.blocks[i - 1](feed))
        return torch.cat(outputs, dim=1)


class SqueezeExcitation(nn.Module):
    """Channel gate from the time mean: x * sigmoid(conv2(relu(conv1(mean_t x))))."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(channels, squeeze, 1)
        self.conv2 = nn.Conv1d(squeeze, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        gate = x.mean(dim=2, keepdim=True)  # [B,C,1]
        gate = torch.sigmoid(self.conv2(F.relu(self.conv1(gate))))
        return x * gate


class SERes2NetBlock(nn.Module):
    def __init__(
        self, in_channels: int, channels: int, scale: int, squeeze: int, kernel_size: int, dilation: int
    ) -> None:
        super().__init__()
        self.tdnn1 = TDNN(in_channels, channels, 1, 1)
        self.res2net_block = Res2Net(channels, scale, kernel_size, dilation)
        self.tdnn2 = TDNN(channels, channels, 1, 1)
        self.se_block = SqueezeExcitation(channels, squeeze)

    def forward(self, x: Tensor) -> Tensor:
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _weighted_stats(x: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """x [B,C,T], weights [B,C|1,T] summing to 1 over T -> mean, std [B,C] (official arithmetic)."""
    mean = (weights * x).sum(2)
    var = (weights * (x - mean.unsqueeze(2)).pow(2)).sum(2)
    return mean, torch.sqrt(var.clamp(_STD_FLOOR))


class AttentiveStatisticsPooling(nn.Module):
    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = nn.Conv1d(attention_channels, channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        """x [B,C,T] -> [B,2C,1] (attention-weighted mean and std)."""
        frames = x.shape[-1]
        uniform = torch.ones(x.shape[0], 1, frames, dtype=x.dtype, device=x.device)
        uniform = uniform / uniform.sum(dim=2, keepdim=True)  # 1/T, computed as the official mask / total
        mean, std = _weighted_stats(x, uniform)
        context = torch.cat(
            (x, mean[..., None].expand(-1, -1, frames), std[..., None].expand(-1, -1, frames)), 1
        )
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)  # [B,C,T]
        mean, std = _weighted_stats(x, attention)
        return torch.cat((mean, std), dim=1)[..., None]


# ---------------------------------------------------------------- composition


class SpeakerEncoder(nn.Module):
    """Module names equal the checkpoint's `speaker_encoder.*` names minus the prefix."""

    def __init__(self, config: SpeakerEncoderConfig) -> None:
        super().__init__()
        c = config
        self.config = config
        ch, ks, dil = c.channels, c.kernel_sizes, c.dilations
        blocks: list[nn.Module] = [TDNN(c.mel_dim, ch[0], ks[0], dil[0])]
        for i in range(1, len(ch) - 1):
            blocks.append(SERes2NetBlock(ch[i - 1], ch[i], c.res2net_scale, c.se_channels, ks[i], dil[i]))
        self.blocks = nn.ModuleList(blocks)
        self.mfa = TDNN(sum(ch[1:-1]), ch[-1], ks[-1], dil[-1])
        self.asp = AttentiveStatisticsPooling(ch[-1], c.attention_channels)
        self.fc = nn.Conv1d(ch[-1] * 2, c.embedding_dim, 1)

    def forward(self, mel: Tensor) -> Tensor:
        """mel [B,T,mel_dim] -> embedding [B,enc_dim] (in the module's dtype)."""
        x = mel.transpose(1, 2)  # [B,M,T]
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.mfa(torch.cat(outputs[1:], dim=1))  # [B,C_last,T]
        return self.fc(self.asp(x))[..., 0]

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype


@torch.inference_mode()
def speaker_embedding(encoder: SpeakerEncoder, pcm: np.ndarray, rate: int) -> Tensor:
    """Decoded float PCM [n] at `rate` -> x-vector [enc_dim] in the encoder's dtype (the official path:
    resample to 24 kHz, log-mel in fp32, cast to the model dtype, encoder)."""
    if encoder.config.sample_rate != SPEAKER_SAMPLE_RATE:
        raise ValueError(f"the speaker encoder runs at {SPEAKER_SAMPLE_RATE} Hz only")
    pcm24 = resample(pcm, rate, SPEAKER_SAMPLE_RATE)
    mel = speaker_mel(torch.from_numpy(pcm24))  # [T,128] fp32 on the CPU, as official
    return encoder(mel[None].to(device=encoder.device, dtype=encoder.dtype))[0]
