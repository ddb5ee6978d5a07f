"""The codec's fused kernels compute exactly what the plain modules compute, rounding included.

The twins are checked against the plain modules on the CPU (bitwise, fp32 and bf16); the Triton kernels against
their twins in Triton's CPU interpreter, in a subprocess because the interpreter is chosen at import time.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.codec.config import codec_preset
from engine.codec.layers import SnakeBeta
from engine.codec.weights import random_codec
from engine.fast.codec_fast import FastCodecDecoder
from engine.fast.kernels.codebook import codebook_sum_reference
from engine.fast.kernels.snake import snake, snake_params, snake_reference
from tests.codec.helpers import random_codes
from tests.fast.helpers import run_interpreted


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_snake_twin_equals_the_plain_snakebeta_module_bitwise(dtype):
    module = SnakeBeta(24).to(dtype)
    with torch.no_grad():
        module.alpha.normal_(0, 0.4)
        module.beta.normal_(0, 0.4)
    x = (torch.randn(3, 24, 50) * 2).to(dtype)
    twin = snake_reference(x, *snake_params(module.alpha.detach(), module.beta.detach()))
    assert torch.equal(twin, module(x).detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_bias_and_residual_follow_the_plain_op_order(dtype):
    """conv output + bias, + residual, then SnakeBeta: the plain ResidualUnit's order, each add rounded."""
    module = SnakeBeta(8).to(dtype)
    x, residual = torch.randn(2, 8, 30).to(dtype), torch.randn(2, 8, 30).to(dtype)
    bias = torch.randn(8).to(dtype)
    total = torch.empty_like(x)
    fused = snake_reference(x, *snake_params(module.alpha.detach(), module.beta.detach()), bias=bias,
                            residual=residual, sum_out=total)  # fmt: skip
    expected_total = (x + bias[:, None]) + residual
    assert torch.equal(total, expected_total)
    assert torch.equal(fused, module(expected_total).detach())


def test_codebook_tables_give_the_plain_dequantized_latent():
    decoder = random_codec(codec_preset("tiny"), seed=4)
    fast = FastCodecDecoder(decoder, "fp32")
    codes = random_codes(2, 9, seed=5)
    with torch.no_grad():
        latent = F.conv1d(
            codebook_sum_reference(fast._first_table, codes[:, :1]), fast._first_proj
        ) + F.conv1d(codebook_sum_reference(fast._rest_table, codes[:, 1:]), fast._rest_proj)
        expected = decoder.quantizer.decode(codes)
    assert torch.allclose(latent, expected, rtol=1e-6, atol=1e-6)


def test_snake_rejects_mismatched_inputs():
    x = torch.randn(2, 4, 10)
    alpha, inv_beta = snake_params(torch.zeros(4), torch.zeros(4))
    with pytest.raises(ValueError, match="alpha"):
        snake(x, alpha[:3], inv_beta)
    with pytest.raises(ValueError, match="residual"):
        snake(x, alpha, inv_beta, residual=torch.randn(2, 4, 9))
    with pytest.raises(ValueError, match="head"):
        snake(x, alpha, inv_beta, head=torch.randn(2, 4, 11))
    with pytest.raises(ValueError, match=r"\[B, C, L\]"):
        snake(x[0], alpha, inv_beta)


INTERPRETED = """
import json, torch
from engine.fast.kernels import use_triton
from engine.fast.kernels.codebook import codebook_sum, codebook_sum_reference
from engine.fast.kernels.snake import snake, snake_params, snake_reference
assert use_triton(torch.zeros(1)), "interpreter mode not active"
torch.manual_seed(0)
result = {}
for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    b, c, length, hist = 2, 3, 37, 6
    x, res, head = [torch.randn(*s).mul(2).to(dtype) for s in ((b, c, length), (b, c, length), (b, c, 5))]
    alpha, inv_beta = snake_params(torch.randn(c).mul(0.4).to(dtype), torch.randn(c).mul(0.4).to(dtype))
    bias = torch.randn(c).to(dtype)
    buffer = torch.full((b, c, hist + length), float("nan"), dtype=dtype)  # poisoned: every element written
    total = torch.full_like(x, float("nan"))
    snake(x, alpha, inv_beta, head=head, bias=bias, residual=res, out=buffer[..., hist:], sum_out=total)
    ref_total = torch.empty_like(x)
    ref = snake_reference(x, alpha, inv_beta, head=head, bias=bias, residual=res, sum_out=ref_total)
    plain = snake(x, alpha, inv_beta)
    # channels-last: [B, L, C] memory seen as [B, C, L] (the tile program), 70 channels: a partial channel tile
    cl = lambda *shape: torch.full((shape[0], shape[2], shape[1]), float("nan"), dtype=dtype).transpose(1, 2)
    bc, cc = 2, 70
    xc, resc = cl(bc, cc, length), cl(bc, cc, length)
    xc.copy_(torch.randn(bc, cc, length).mul(2))
    resc.copy_(torch.randn(bc, cc, length))
    headc = torch.randn(bc, cc, 5).to(dtype)  # the pool's NCL overlap beside channels-last activations
    alphac, inv_betac = snake_params(torch.randn(cc).mul(0.4).to(dtype), torch.randn(cc).mul(0.4).to(dtype))
    biasc = torch.randn(cc).to(dtype)
    bufferc, totalc = cl(bc, cc, hist + length), cl(bc, cc, length)
    snake(xc, alphac, inv_betac, head=headc, bias=biasc, residual=resc, out=bufferc[..., hist:], sum_out=totalc)
    ref_totalc = torch.empty(bc, cc, length, dtype=dtype)
    refc = snake_reference(xc, alphac, inv_betac, head=headc, bias=biasc, residual=resc, sum_out=ref_totalc)
    tables, codes = torch.randn(4, 50, 20).to(dtype), torch.randint(0, 50, (2, 4, 7))
    result[name] = {
        "snake_cl_max_diff": float((bufferc[..., hist:].double() - refc.double()).abs().max()),
        "snake_cl_sum_equal": bool(torch.equal(totalc, ref_totalc)),
        "snake_cl_history_untouched": bool(bufferc[..., :hist].isnan().all()),
        "snake_fused_max_diff": float((buffer[..., hist:].double() - ref.double()).abs().max()),
        "snake_sum_equal": bool(torch.equal(total, ref_total)),
        "snake_plain_max_diff": float((plain.double() - snake_reference(x, alpha, inv_beta).double()).abs().max()),
        "codebook_equal": bool(torch.equal(codebook_sum(tables, codes), codebook_sum_reference(tables, codes))),
    }
print(json.dumps(result))
"""


def test_codec_kernels_match_their_twins_in_the_triton_interpreter():
    pytest.importorskip("triton")
    result = run_interpreted(INTERPRETED)
    # bf16: bitwise (the kernel rounds where the plain ops round); fp32: up to the interpreter's sin
    assert result["bf16"]["snake_fused_max_diff"] == 0.0 and result["bf16"]["snake_plain_max_diff"] == 0.0
    assert result["fp32"]["snake_fused_max_diff"] < 1e-5 and result["fp32"]["snake_plain_max_diff"] < 1e-5
    assert result["bf16"]["snake_cl_max_diff"] == 0.0 and result["fp32"]["snake_cl_max_diff"] < 1e-5
    for name in ("fp32", "bf16"):
        assert result[name]["snake_sum_equal"] and result[name]["codebook_equal"], result[name]
        assert result[name]["snake_cl_sum_equal"] and result[name]["snake_cl_history_untouched"], result[name]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_hardware_bf16_rounding_equals_the_integer_rounding_bitwise_on_cuda():
    """SnakeBeta rounds by the GPU's own conversion; it must give what the interpreter-checked integer form gives,
    at every magnitude, at halfway ties, for subnormals and infinities."""
    import triton
    import triton.language as tl

    from engine.fast.kernels.snake import round_hw

    @triton.jit
    def both(x_ptr, hw_ptr, integer_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + i, mask=i < n)
        tl.store(hw_ptr + i, round_hw(v, tl.bfloat16, True), mask=i < n)
        tl.store(integer_ptr + i, round_hw(v, tl.bfloat16, False), mask=i < n)

    gen = torch.Generator(device="cuda").manual_seed(0)
    bits = torch.randint(-(2**31), 2**31 - 1, (1 << 22,), device="cuda", dtype=torch.int64, generator=gen)
    x = bits.to(torch.int32).view(torch.float32)
    ties = (torch.randn(1 << 16, device="cuda", generator=gen).view(torch.int32) & ~0xFFFF | 0x8000).view(torch.float32)
    x = torch.cat([x[torch.isfinite(x)], ties, torch.tensor([0.0, -0.0, float("inf"), -float("inf")], device="cuda")])
    hw, integer = torch.empty_like(x), torch.empty_like(x)
    both[(triton.cdiv(x.numel(), 1024),)](x, hw, integer, x.numel(), BLOCK=1024)
    assert torch.equal(hw.view(torch.int32), integer.view(torch.int32))
    assert torch.equal(hw, x.to(torch.bfloat16).float())
