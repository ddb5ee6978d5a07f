"""Reference audio for voice cloning: decoded float PCM -> the exact inputs the official Base model sees.

One promise: `resample(pcm, rate, to_rate)` returns the samples the official `qwen-tts` wrapper obtains
from `librosa.resample(pcm, orig_sr=rate, target_sr=to_rate)` (its default `soxr_hq` filter, then
`fix_length` to `ceil(n * (to_rate / rate))` samples, that float order), and `speaker_mel(pcm_24k)` the log-mel spectrogram
its `extract_speaker_embedding` feeds the ECAPA-TDNN speaker encoder: 128 Slaney mel bands (Slaney
norm, 0..12 kHz) of a 1024-point periodic-Hann STFT, hop 256, reflect padding of 384 samples per side,
no centring, magnitude `sqrt(re^2 + im^2 + 1e-9)`, `log(clamp(mel, 1e-5))`.

The mel filterbank is built the way librosa builds it (float64 triangles rounded to float32 rows, then
scaled by the float64 Slaney norm and rounded again), so the basis is the official one bit for bit.
Both functions are torch/numpy only; neither librosa nor the official package is imported.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

SPEAKER_SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
WINDOW = 1024
N_MELS = 128
F_MIN = 0.0
F_MAX = 12000.0
_LOG_FLOOR = 1e-5
_MAGNITUDE_EPS = 1e-9


def resample(pcm: np.ndarray, rate: int, to_rate: int) -> np.ndarray:
    """float PCM [n] at `rate` -> float32 [ceil(n * to_rate / rate)] at `to_rate` (soxr HQ, as librosa)."""
    pcm = np.asarray(pcm, dtype=np.float32)
    if pcm.ndim != 1:
        raise ValueError(f"reference audio must be mono [samples], got shape {pcm.shape}")
    if rate == to_rate:
        return pcm
    ratio = float(to_rate) / rate
    target = int(math.ceil(pcm.shape[0] * ratio))  # this float order (1.1 s at 44.1 kHz -> 26401, not 26400)
    import soxr  # here: serving built-in voices never resamples reference audio

    out = np.asarray(soxr.resample(pcm, rate, to_rate, quality="soxr_hq"), dtype=np.float32)
    if out.shape[0] >= target:
        return out[:target]
    return np.pad(out, (0, target - out.shape[0]))


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz (200/3 Hz per mel), logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    f_sp = 200.0 / 3
    mels = hz / f_sp
    min_log_mel = 1000.0 / f_sp
    logstep = math.log(6.4) / 27.0
    log_part = hz >= 1000.0
    mels = np.where(log_part, min_log_mel + np.log(np.maximum(hz, 1e-300) / 1000.0) / logstep, mels)
    return mels


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    mels = np.asarray(mels, dtype=np.float64)
    f_sp = 200.0 / 3
    min_log_mel = 1000.0 / f_sp
    logstep = math.log(6.4) / 27.0
    return np.where(mels >= min_log_mel, 1000.0 * np.exp(logstep * (mels - min_log_mel)), f_sp * mels)


@lru_cache(maxsize=4)
def mel_filterbank(
    rate: int = SPEAKER_SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS,
    f_min: float = F_MIN, f_max: float = F_MAX,
) -> np.ndarray:  # fmt: skip
    """Slaney-normalised triangular filters [n_mels, n_fft // 2 + 1] float32 (librosa's construction)."""
    fft_hz = np.fft.rfftfreq(n_fft, 1.0 / rate)  # [F]
    band_hz = _mel_to_hz(np.linspace(_hz_to_mel(np.array(f_min)), _hz_to_mel(np.array(f_max)), n_mels + 2))
    widths = np.diff(band_hz)  # [n_mels + 1]
    ramps = band_hz[:, None] - fft_hz[None, :]  # [n_mels + 2, F]
    weights = np.zeros((n_mels, fft_hz.shape[0]), dtype=np.float32)
    for i in range(n_mels):
        rising = -ramps[i] / widths[i]
        falling = ramps[i + 2] / widths[i + 1]
        weights[i] = np.maximum(0.0, np.minimum(rising, falling))  # float64 -> float32 row
    slaney = 2.0 / (band_hz[2 : n_mels + 2] - band_hz[:n_mels])  # float64 [n_mels]
    weights *= slaney[:, None]  # computed in float64, stored float32
    weights.setflags(write=False)
    return weights


def speaker_mel(pcm: Tensor) -> Tensor:
    """float32 PCM [n] at 24 kHz -> log-mel frames [frames, 128] float32 (frames = (n + 768 - 1024) // 256 + 1)."""
    if pcm.ndim != 1:
        raise ValueError(f"speaker_mel expects mono PCM [samples], got shape {tuple(pcm.shape)}")
    device = pcm.device
    x = pcm.to(torch.float32)[None, None]  # [1,1,n]
    pad = (N_FFT - HOP) // 2
    if x.shape[-1] <= pad:
        raise ValueError(f"reference audio too short for the speaker encoder: {x.shape[-1]} samples")
    x = torch.nn.functional.pad(x, (pad, pad), mode="reflect")[:, 0]  # [1, n + 2*pad]
    spec = torch.stft(
        x, N_FFT, hop_length=HOP, win_length=WINDOW, window=torch.hann_window(WINDOW, device=device),
        center=False, normalized=False, onesided=True, return_complex=True,
    )  # fmt: skip  # [1, 513, frames]
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + _MAGNITUDE_EPS)  # [1, 513, frames]
    basis = torch.from_numpy(np.array(mel_filterbank())).to(device)  # [128, 513]
    mel = torch.matmul(basis, magnitude)  # [1, 128, frames]
    return torch.log(torch.clamp(mel, min=_LOG_FLOOR))[0].T  # [frames, 128]
