"""Split residual vector dequantizer: 16 code columns -> one [B, codebook_dim, T] latent (reference 7.1).

Stateless. Module and parameter names follow the official checkpoint
(`quantizer.rvq_first.vq.layers.0._codebook.embedding_sum`, ...). Each codebook row is
`embedding_sum[c] / clamp(cluster_usage[c], 1e-5)`, computed only for the rows looked up: element for element
the same arithmetic as dividing the whole table first (as the official code does, in the weights' dtype), at
B*T*16 rows instead of 16*2048 per call.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

_USAGE_EPSILON = 1e-5


class EuclideanCodebook(nn.Module):
    def __init__(self, dim: int, codebook_size: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(codebook_size))
        self.embedding_sum = nn.Parameter(torch.zeros(codebook_size, dim))

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, T] -> [B, T, dim]."""
        usage = self.cluster_usage.clamp(min=_USAGE_EPSILON)[codes]
        return self.embedding_sum[codes] / usage[..., None]


class VectorQuantization(nn.Module):
    """One codebook; the official `project_out` is the identity here (no parameters)."""

    def __init__(self, dim: int, codebook_size: int):
        super().__init__()
        self._codebook = EuclideanCodebook(dim, codebook_size)

    def decode(self, codes: Tensor) -> Tensor:
        return self._codebook.decode(codes).transpose(1, 2)  # [B, dim, T]


class ResidualVectorQuantization(nn.Module):
    def __init__(self, num_quantizers: int, dim: int, codebook_size: int):
        super().__init__()
        self.layers = nn.ModuleList([VectorQuantization(dim, codebook_size) for _ in range(num_quantizers)])

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, K, T] -> sum of the K looked-up vectors [B, dim, T], added one by one as the official."""
        total = self.layers[0].decode(codes[:, 0])
        for index in range(1, codes.shape[1]):
            total = total + self.layers[index].decode(codes[:, index])
        return total


class ResidualVectorQuantizer(nn.Module):
    """K codebooks summed, then a bias-free 1x1 conv to the output width. `input_proj` is used only to encode."""

    def __init__(self, num_quantizers: int, dim: int, io_dim: int, codebook_size: int):
        super().__init__()
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        self.vq = ResidualVectorQuantization(num_quantizers, dim, codebook_size)

    def decode(self, codes: Tensor) -> Tensor:
        return self.output_proj(self.vq.decode(codes))


class SplitResidualVectorQuantizer(nn.Module):
    """Code column 0 through `rvq_first` (semantic), columns 1.. through `rvq_rest` (acoustic); outputs summed."""

    SEMANTIC = 1  # the official decoder hard-codes one semantic quantizer

    def __init__(self, num_quantizers: int, codebook_dim: int, codebook_size: int):
        super().__init__()
        dim = codebook_dim // 2
        self.rvq_first = ResidualVectorQuantizer(self.SEMANTIC, dim, codebook_dim, codebook_size)
        self.rvq_rest = ResidualVectorQuantizer(
            num_quantizers - self.SEMANTIC, dim, codebook_dim, codebook_size
        )

    def decode(self, codes: Tensor) -> Tensor:
        """codes [B, K, T] (int64) -> [B, codebook_dim, T]."""
        return self.rvq_first.decode(codes[:, : self.SEMANTIC]) + self.rvq_rest.decode(
            codes[:, self.SEMANTIC :]
        )
