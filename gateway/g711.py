"""G.711 companding: 16-bit PCM to 8-bit μ-law and A-law (ITU-T G.711), vectorised with numpy.

Telephony formats (`ulaw_8000`, `alaw_8000`, Cartesia's `pcm_mulaw` / `pcm_alaw`) are these bytes
with no header. `audioop` left the standard library in Python 3.13, so the tables live here.
"""

from __future__ import annotations

import numpy as np

_MULAW_BIAS = 0x84
_MULAW_CLIP = 32635


def mulaw_encode(samples: np.ndarray) -> bytes:
    """int16 samples to μ-law bytes."""
    x = samples.astype(np.int32)
    sign = np.where(x < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(x), _MULAW_CLIP) + _MULAW_BIAS
    exponent = np.clip(np.floor(np.log2(magnitude)).astype(np.int32) - 7, 0, 7)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return (~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8).tobytes()


def alaw_encode(samples: np.ndarray) -> bytes:
    """int16 samples to A-law bytes."""
    x = samples.astype(np.int32) >> 3  # A-law works on 13-bit magnitudes
    sign = np.where(x >= 0, 0x80, 0)
    magnitude = np.where(x >= 0, x, -x - 1)
    magnitude = np.minimum(magnitude, 0x0FFF)
    exponent = np.where(magnitude < 32, 0, np.floor(np.log2(np.maximum(magnitude, 32))).astype(np.int32) - 4)
    mantissa = np.where(exponent < 2, magnitude >> 1, magnitude >> exponent) & 0x0F
    return (((sign | (exponent << 4) | mantissa) ^ 0x55) & 0xFF).astype(np.uint8).tobytes()
