"""The variants `tools/frame_profile.py` times, by name: each changes the code predictor's `FrameKernels` or
(`sixteenth`, `talker_*`, `tattn_*`) the talker's decode options, from the engine's defaults (tool-only: the engine
has no such names). A variant is one name or several parts joined by +.

    defaults   the engine's (`KernelOptions`' defaults: talker and code-predictor options alike)
    sixteenth  the defaults of the sixteenth session: cuBLAS talker products, a q/k norm + RoPE kernel, no PDL
    cublas_wide  products of 3+ token rows in cuBLAS (no `FrameKernels.dot_gemv`: the defaults before 2026-12-04)
    pdl, no_pdl  programmatic dependent launches in the Triton-product steps (`FrameKernels.pdl`) on / off;
               bitwise the same codes, hidden states and caches as `defaults` or something is wrong
    norms_apart  every RMSNorm in an `rms_norm` kernel of its own instead of the next product's prologue
    wide_prologues  the products with a norm prologue (qkv, gate_up, head) 16 columns a program: 4x fewer
               programs re-read the row, its residual and the norm weight
    radix4, radix3, radix1  the sampler's top-k search over 16, 8 or 2 candidates a pass (defaults: 2 bits, 4)
    radix8     the sampler's top-k search as a radix select by bytes: at most 4 passes of one 256-bin histogram
               each; bitwise the same codes as `defaults` or something is wrong
    warps4     every 1-2 row product with 4 warps a program (defaults: 8)
    narrow     every 1-2 row product with half the output columns a program (twice the programs)
    attn_warps4, attn_warps2, attn_warps1  `cp_attention` programs of 4, 2 or 1 warps, either form (defaults: 4
               broadcast, 1 per head)
    attn_per_head, attn_broadcast  every step's `cp_attention` one query head at a time (`attend_heads`), or
               every step's with the query heads broadcast together (the defaults before 2026-12-05; the engine's:
               per head from 16 token rows, `FrameKernels.attention_per_head_rows`)
    attn_qsplit1, attn_qsplit2  the per-head attention's query heads of a kv head in one program, or two
               (`FrameKernels.attention_query_split`; the engine's: 2); bitwise the same codes
    sampler_warps2, sampler_warps4, sampler_warps16  sampler programs of 2, 4 or 16 warps (defaults: 8 for the
               2048-wide vocabulary; fewer warps, fewer cross-warp steps in each of the search's reductions; 2 warps
               fit without spilling with `radix1`: `radix1+sampler_warps2`)
    attn_early, attn_late  `cp_attention` loading the earlier steps' keys and values before (the default since
               2026-12-05) or after its PDL wait (`FrameKernels.attention_early_cache`); bitwise the same codes
    split<S>[_narrow | _128 | _<product>]  the tensor-core steps' (4-64 token rows) products with K cut into S
               slices, one program each, summed by the last slice in (`GemvConfig.split_k`): `split4` every product,
               `split4_narrow` only the products of 64 column tiles (projection, o, down: the engine's default),
               `split4_128` also the 128 token-row steps (a B = 64 frame's first step), `split2_head` that one
               product (join with split4_narrow: `split4_narrow+split2_head`), `split1_narrow` none
    cublas_small  the code predictor's 4- and 8-token-row steps (B = 2..8) in cuBLAS with `rms_norm` kernels,
               instead of the 16-row tensor-core tiles with the rows masked (the engine's default since 2026-12-05)
    talker_gemv  the talker's 1-2 row decode steps with their products in `gemv` (`TalkerGraphs.gemv_max_rows`);
               talker_rope its q/k norm and RoPE inside its decode attention (`TalkerGraphs.fused_rope`);
               talker_gemv_rope both, without the chain (the defaults before 2026-12-05)
    talker_chain  the talker's 16 and 64 row decode steps as `run_layers_chained` (the engine's default);
               talker_chain_off unchained; talker_chain_all also 32 rows; talker_chain_down with down in a 16-column
               tile at every row count, talker_chain_down_split2 that tile in 2 K slices; talker_chain_plain with
               `ChainTiles()` at every row count (down in cuBLAS: the defaults before 2026-12-06)
    wide64[_128][_gu]  the code predictor's 64 token-row steps (and with _128 a B = 64 frame's first step, 128
               rows, at 8 warps) with every product but gate|up 64 columns a program, K cut into as many slices as
               bring it to ~128 programs (`wide_tile`): each program re-reads the step's rows from L2 for its own
               columns, so at 64 rows the 16-32 column tiles read 2-4x their weight's bytes again in activations;
               gate|up keeps its 32 columns (it reads twice the weight a column), or with _gu also its K in 2 slices
               (96 programs, one an SM, leave 36 of the 132 SMs idle; 192 in 2 slices)
    talker_wide64, talker_wide128[_down | _gu][_tma]  the talker's 64-row chained steps with qkv, o and down (or only
               down, instead of cuBLAS) in 64- or 128-column `wide_tile`s, or (_gu) those and gate|up's 64 columns in
               2 K slices; the 16-row steps' tiles as the engine's; _tma: every `gemv` tile of the chain (16 rows too)
               loading by bulk tensor copies
    gemv_tma   the code predictor's pipelined tensor-core tiles (4-128 token rows) loading their weight tiles, and
               their activations' where not gathered, as bulk tensor copies (`GemvConfig.tma`: TMA, one copy a
               tile; the engine's default since 2026-12-06); gemv_no_tma: none of them; with wide64: wide64+gemv_tma;
               talker_chain_tma the same for the talker's chain tiles; all load the same values into the same tiles:
               bitwise the same codes as `defaults` or something is wrong
    tattn_p2, tattn_p2_32, tattn_p4_32  the talker's 5-64 row decode attention in 2 (or 4) interleaved programs
               per (row, kv head), 64- or 32-key blocks, 4 warps (`SplitConfig.programs`; the engine's default at
               33-64 rows is tattn_p2_32's)
    tattn_p1_32, tattn_p1_64, tattn_p1_64_all  one program per (row, kv head) walking 32- or 64-key blocks, which
               writes the output itself (no merge kernel); at 5-64 rows, or (_all) every size
    tattn_tma  the talker's decode attention reading its whole key blocks as bulk tensor copies (`SplitConfig.tma`),
               every size; bitwise the same codes as `defaults` or something is wrong
    tattn_merge_last  the talker's decode attention with its splits merged by the last program of each (row, kv
               head) to finish (`SplitConfig.merge_last`) instead of a kernel of their own
    tattn_tile_q  the talker's fused-rope split attention norming and rotating its whole 16-row query tile, the
               padding included (the defaults before 2026-12-05: `SplitConfig.q_heads` off)
    cp_frame_io  the code predictor's frame inputs and outputs in one kernel each and its sampler reading the
               settings by slot (`FrameKernels.frame_io`, the default since 2026-12-06) instead of ~13 small
               launches, or (cp_frame_io_off) those launches; bitwise the same codes as `defaults` or something is
               wrong
    draw_fused  the talker's scores, draw and slot-state writes in one kernel (`TalkerGraphs.fused_draw`, the
               engine's `--talker-fused-draw`, the default since 2026-12-06), or (draw_apart) in ~20 small ones;
               joins any talker part; bitwise the same codes as `defaults` or something is wrong

Knockouts (timing only: the codes they draw are meaningless) capture a graph without one kind of kernel, so the
span they save is what that kind costs in the chain, overlap included, where the kernel table's microseconds count
each kernel from its launch (a programmatic dependent's wait included):

    ko_cp_norms, ko_cp_attention  the code predictor's `rms_norm` / `cp_attention` launches left out (the next
               product reads the un-normed rows / the q part of qkv)
    ko_talker_norms, ko_talker_attention  the talker's `rms_norm` / decode attention launches left out

Parts join with +: `attn_late+split4+talker_chain_all` applies each code-predictor part in order and the one
talker part. Forms measured slower and removed from the engine (a persistent code-predictor step, norms streamed
as partial sums of squares, `cp_attention` on tensor cores, L2 prefetch, the talker's split chain, norms folded
into the products) are in docs/benchmarks.md with the commits that held them.

`BITWISE` names the variants that must draw bitwise the same codes as `defaults` (frame_profile exits 1 if one
does not): the sampler's search finds the exact k-th value whatever its radix, `pdl` / `no_pdl` change only when
kernels start, and the bulk-copy forms load the same values into the same tiles.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from engine.settings import KernelOptions

ENGINE_DEFAULTS = KernelOptions()
VARIANTS = ("defaults", "sixteenth", "cublas_wide", "pdl", "no_pdl", "norms_apart", "wide_prologues", "radix4",
            "radix3", "radix1", "radix8", "warps4", "narrow", "attn_warps2", "attn_warps1", "sampler_warps2",
            "sampler_warps4", "sampler_warps16", "attn_early", "attn_late", "attn_per_head", "attn_broadcast",
            "attn_qsplit1", "attn_qsplit2", "attn_warps4", "split2", "split4", "split4_narrow",
            "split4_128", "split2_narrow", "split8_narrow", "split2_gate_up", "split2_qkv", "split2_head",
            "split1_narrow", "cublas_small", "talker_gemv", "talker_rope", "talker_gemv_rope", "talker_chain",
            "talker_chain_off", "talker_chain_all", "talker_chain_down", "talker_chain_down_split2", "tattn_p2",
            "tattn_p2_32", "tattn_p4_32", "tattn_merge_last", "tattn_tile_q", "tattn_tma",
            "tattn_p1_32", "tattn_p1_64", "tattn_p1_64_all", "wide64", "wide64_128", "wide64_gu", "gemv_tma",
            "talker_wide64", "talker_wide128", "talker_wide64_down", "talker_wide128_down", "talker_wide64_gu",
            "talker_wide64_tma", "talker_wide64_down_tma", "talker_chain_tma", "talker_chain_plain", "draw_fused",
            "draw_apart", "cp_frame_io", "cp_frame_io_off", "gemv_no_tma", "ko_cp_norms", "ko_cp_attention",
            "ko_talker_norms", "ko_talker_attention")
# must draw bitwise the same codes, hidden states and caches as the defaults (the module docstring says why)
BITWISE = ("radix4", "radix3", "radix1", "radix8", "pdl", "no_pdl", "attn_early", "attn_late", "attn_qsplit1",
           "attn_qsplit2", "talker_chain_off", "tattn_tma", "gemv_tma", "gemv_no_tma", "talker_chain_tma",
           "draw_fused", "draw_apart", "cp_frame_io", "cp_frame_io_off")


def refusal(variant: str) -> str | None:
    """Why a variant cannot be built (a part not named here, or more than one talker part), or None."""
    parts = variant.split("+")
    unknown = [part for part in parts if part not in VARIANTS]
    if unknown or sum(part.startswith("talker_") for part in parts) > 1:
        return f"variant {variant!r}: unknown parts {unknown} or more than one talker_* part"
    return None


def frame_kernels(variant: str) -> Any:
    """The code predictor's `FrameKernels` in a variant: the engine's, then each of its parts' changes in order."""
    from engine.fast.code_predictor_graph import FrameKernels

    kernels = FrameKernels.from_options(ENGINE_DEFAULTS)
    for part in variant.split("+"):
        kernels = _cp_change(kernels, part)
    return kernels


# The full-size products' (output columns, K): `wide_tile` cuts K by them (the variants are for the 1.7B model).
CP_SHAPES = {"proj": (1024, 2048), "qkv": (4096, 1024), "o": (1024, 2048), "down": (1024, 3072), "head": (2048, 1024)}
TALKER_SHAPES = {"qkv": (4096, 2048), "o": (2048, 2048), "down": (2048, 6144)}
GATE_UP_SHAPES = {"code_predictor": (3072, 1024), "talker": (6144, 2048)}  # (SwiGLU outputs, K)
WIDE_PROGRAMS = 128  # about one program an SM (H100 132, H200 132)


def wide_tile(columns: int, k: int, block_n: int, *, num_warps: int = 4, block_k: int = 128) -> Any:
    """A tensor-core tile of `block_n` output columns a program for a `columns` x `k` product, K cut into the
    fewest slices (a power of two, whole `block_k` tiles each) that give it `WIDE_PROGRAMS` programs or more,
    pipelined over up to 4 tiles (3 at 128 columns, where a stage is 48 KB of shared memory)."""
    from engine.fast.kernels.gemv import GemvConfig

    tiles = -(-columns // block_n)
    split = 1
    while tiles * split < WIDE_PROGRAMS and k % (2 * split * block_k) == 0:
        split *= 2
    stages = min(3 if block_n > 64 else 4, k // (split * block_k))
    return GemvConfig(block_n=block_n, block_k=block_k, num_warps=num_warps, use_dot=True, loop_stages=stages,
                      split_k=split)  # fmt: skip


def bulk_copies(tiles: Any) -> Any:
    """`ChainTiles` with every `gemv` tile's loads as bulk tensor copies (`GemvConfig.tma`; cuBLAS stays cuBLAS)."""
    return replace(tiles, **{name: replace(tile, tma=True) for name in ("qkv", "o", "gate_up", "down")
                             if (tile := getattr(tiles, name)) is not None})  # fmt: skip


def _cp_change(kernels: Any, variant: str) -> Any:
    """One variant part's change to the code predictor's `FrameKernels` (parts that change only the talker: none)."""
    from engine.fast.code_predictor_graph import DEFAULT_DOT_GEMV, PRODUCTS, SPLIT_PRODUCTS, split_products
    from engine.fast.kernels.gemv import GemvConfig

    if variant.startswith("split"):  # split<S>[_narrow | _128 | _<product>]: S slices, over which products
        slices, _, which = variant.removeprefix("split").partition("_")
        names = {"narrow": SPLIT_PRODUCTS, "": PRODUCTS, "128": PRODUCTS}.get(which, (which,))
        tiles = dict(kernels.dot_gemv)
        if which == "128":  # a B = 64 frame's first step too (2 token rows a frame row)
            tiles[128] = DEFAULT_DOT_GEMV[64]
        return replace(kernels, dot_gemv=split_products(tiles, int(slices), names))
    if variant.startswith("wide64"):  # wide64[_128][_gu]
        options = variant.split("_")[1:]
        tiles = dict(kernels.dot_gemv)
        for rows in (64, 128) if "128" in options else (64,):
            warps = 8 if rows > 64 else 4  # 8 warps keep 128-wide K loads at 128 rows (`launch_tile`)
            wide = {name: wide_tile(n, k, 64, num_warps=warps) for name, (n, k) in CP_SHAPES.items()}
            columns = DEFAULT_DOT_GEMV[64]["gate_up"].block_n
            wide["gate_up"] = (wide_tile(*GATE_UP_SHAPES["code_predictor"], columns, num_warps=warps) if "gu" in options
                               else replace(DEFAULT_DOT_GEMV[64]["gate_up"], num_warps=warps))  # fmt: skip
            tiles[rows] = {**DEFAULT_DOT_GEMV[64], **wide}
        return replace(kernels, dot_gemv=tiles)
    if variant in ("cp_frame_io", "cp_frame_io_off"):
        return replace(kernels, frame_io=variant == "cp_frame_io")
    if variant in ("gemv_tma", "gemv_no_tma"):  # every pipelined tensor-core tile's loads as bulk copies, or none's
        tma = variant == "gemv_tma"
        return replace(kernels, dot_gemv={rows: {name: replace(tile, tma=tma) if tile.loop_stages else tile
                                                 for name, tile in tiles.items()}
                                          for rows, tiles in kernels.dot_gemv.items()})  # fmt: skip
    if variant == "sixteenth":
        return replace(kernels, pdl=False, dot_gemv={})
    if variant in ("pdl", "no_pdl"):
        return replace(kernels, pdl=variant == "pdl")
    if variant == "cublas_wide":
        return replace(kernels, dot_gemv={})
    if variant.startswith("radix"):
        return replace(kernels, radix_bits=int(variant[-1]))
    if variant == "norms_apart":
        return replace(kernels, prologue_max_rows=0)
    if variant == "wide_prologues":
        wide = GemvConfig(block_n=16, block_k=1024, num_warps=8)
        return replace(kernels, gemv={**kernels.gemv, "qkv": wide, "gate_up": wide, "head": wide})
    if variant == "warps4":
        return replace(kernels, gemv={name: replace(tile, num_warps=4) for name, tile in kernels.gemv.items()})
    if variant == "narrow":
        return replace(kernels, gemv={name: replace(tile, block_n=max(1, tile.block_n // 2))
                                      for name, tile in kernels.gemv.items()})  # fmt: skip
    if variant in ("attn_per_head", "attn_broadcast"):  # every step's attention per head, or none's
        return replace(kernels, attention_per_head_rows=1 if variant == "attn_per_head" else 1 << 30)
    if variant in ("attn_qsplit1", "attn_qsplit2"):
        return replace(kernels, attention_query_split=int(variant[-1]))
    if variant in ("attn_warps4", "attn_warps2", "attn_warps1"):
        return replace(kernels, attention_warps=int(variant[-1]), attention_per_head_warps=int(variant[-1]))
    if variant.startswith("sampler_warps"):
        return replace(kernels, sampler_warps=int(variant.removeprefix("sampler_warps")))
    if variant in ("attn_early", "attn_late"):
        return replace(kernels, attention_early_cache=variant == "attn_early")
    if variant == "cublas_small":  # 4 and 8 token rows in cuBLAS (the defaults before 2026-12-05's dot_small)
        return replace(kernels, dot_gemv={rows: tiles for rows, tiles in kernels.dot_gemv.items() if rows > 8})
    return kernels


def talker_options(variant: str) -> tuple[int, bool, tuple[int, ...], Any]:
    """The talker decode's (`gemv_max_rows`, `fused_rope`, `chain_rows`, `chain_tiles`) in a variant: the engine's
    defaults, the sixteenth session's (cuBLAS products, a q/k norm + RoPE kernel), or what its `talker_*` part names
    (talker_chain_down: down in a 16-column tile, K 128 a load, 4 stages; _split2: in 2 K slices). Per-row chain
    tiles come as (rows, tiles) pairs, so `talker_key` can hash them."""
    from engine.fast.decoder import ChainTiles
    from engine.fast.kernels.gemv import GemvConfig
    from engine.fast.talker_graph import CHAIN_ROWS, CHAIN_TILES, chain_options

    part = next((part for part in variant.split("+") if part.startswith("talker_") or part == "sixteenth"), "")
    if part.startswith("talker_wide"):  # talker_wide<columns>[_down | _gu][_tma]: the 64-row steps' own tiles
        columns, *options = part.removeprefix("talker_wide").split("_")
        tiles = ChainTiles()  # the 16-row steps'
        names = ("down",) if "down" in options else tuple(TALKER_SHAPES)
        wide = replace(tiles, **{name: wide_tile(*TALKER_SHAPES[name], int(columns)) for name in names})
        if "gu" in options:
            assert tiles.gate_up is not None
            wide = replace(wide, gate_up=wide_tile(*GATE_UP_SHAPES["talker"], tiles.gate_up.block_n))
        if "tma" in options:
            wide, tiles = bulk_copies(wide), bulk_copies(tiles)
        return (ENGINE_DEFAULTS.talker_gemv_rows, True, CHAIN_ROWS, ((16, tiles), (64, wide)))
    if part == "talker_chain_off":
        return (ENGINE_DEFAULTS.talker_gemv_rows, ENGINE_DEFAULTS.talker_fused_rope, (), None)
    if part.startswith("talker_chain"):
        options = part.removeprefix("talker_chain").split("_")[1:]  # e.g. ["all"], ["down", "split2"]
        rows = (16, 32, 64) if "all" in options else CHAIN_ROWS
        by_rows = {n: ChainTiles() if "plain" in options else CHAIN_TILES.get(n, ChainTiles()) for n in rows}
        if "down" in options:
            slices = 2 if "split2" in options else 1
            down = GemvConfig(block_n=16, block_k=128, num_warps=4, loop_stages=4, split_k=slices)
            by_rows = {n: replace(tiles, down=down) for n, tiles in by_rows.items()}
        if "tma" in options:
            by_rows = {n: bulk_copies(tiles) for n, tiles in by_rows.items()}
        return (ENGINE_DEFAULTS.talker_gemv_rows, True, rows, tuple(by_rows.items()))
    if part.startswith("talker_"):
        return (2 if part.startswith("talker_gemv") else 0, part.endswith("rope"), (), None)
    if part == "sixteenth":
        return (0, False, (), None)
    rows, chain_tiles = chain_options(ENGINE_DEFAULTS.talker_chain)
    pairs = tuple(chain_tiles.items()) if chain_tiles is not None else None
    return (ENGINE_DEFAULTS.talker_gemv_rows, ENGINE_DEFAULTS.talker_fused_rope, rows, pairs)


TALKER_ATTENTION = {  # variant part -> 5-64 row attention in (programs, keys a block) interleaved splits, or None
    "tattn_p2": (2, 64), "tattn_p2_32": (2, 32), "tattn_p4_32": (4, 32), "tattn_merge_last": None,
    "tattn_tile_q": None, "tattn_p1_32": (1, 32), "tattn_p1_64": (1, 64),
    "tattn_p1_64_all": (1, 64), "tattn_tma": None,
}


def talker_attention(variant: str) -> str | None:
    """The variant's `tattn_*` part, which changes the talker decode attention's `SplitConfig` (None: none does)."""
    return next((part for part in variant.split("+") if part in TALKER_ATTENTION), None)


def attention_split(part: str | None, rows: int, default: Any) -> Any:
    """The talker decode attention's `SplitConfig` at `rows` under a `tattn_*` part (`default`: the engine's
    `default_split_config`): interleaved splits at 5-64 rows, or every size merged in its last program."""
    from engine.fast.kernels.decode_attention import SplitConfig

    if part == "tattn_tile_q":
        return replace(default(rows), q_heads=False)
    if part == "tattn_tma":
        return replace(default(rows), tma=True)
    if part == "tattn_merge_last":
        return replace(default(rows), merge_last=True)
    if part is None or not (4 < rows <= 64 or part.endswith("_all")):
        return default(rows)
    programs, block = TALKER_ATTENTION[part]
    return SplitConfig(programs=programs, block_n=block, num_warps=4)


def graph_tiles(tiles: Any) -> Any:
    """`talker_options`' chain tiles as `TalkerGraphs` takes them: its per-row pairs (a tuple, so `talker_key`
    can hash them) as a dict; one `ChainTiles` or None as they are."""
    return dict(tiles) if isinstance(tiles, tuple) else tiles


def fused_draw(variant: str) -> bool:
    """Whether the variant's talker draws in one kernel (`draw_fused`; `draw_apart`: in separate steps; the engine's
    `talker_fused_draw` else)."""
    parts = variant.split("+")
    return "draw_fused" in parts or ("draw_apart" not in parts and ENGINE_DEFAULTS.talker_fused_draw)


def talker_key(variant: str) -> tuple[Any, ...]:
    """Which talker graph set a variant times: its options, attention configuration, draw and knockout."""
    knockout = next((part for part in variant.split("+") if part.startswith("ko_talker_")), None)
    return (*talker_options(variant), talker_attention(variant), fused_draw(variant), knockout)


def _no_norm(x: Any, weight: Any, eps: float, residual: Any = None, *, pdl: bool = False) -> tuple[Any, Any]:
    """`rms_norm` knocked out: the rows as they are, no launch."""
    return x, (x if residual is None else residual)


def _no_cp_attention(qkv: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any) -> Any:
    """`cp_attention` knocked out: the q part of qkv [rows, H*D] (a strided view), no launch."""
    num_heads = args[7]  # (q_weight, k_weight, eps, k_cache, v_cache, start, tokens, num_heads, num_kv_heads)
    return qkv[:, : num_heads * cos.shape[-1]]


def _no_decode_attention(qkv: Any, cos: Any, sin: Any, *args: Any, **kwargs: Any) -> Any:
    """`decode_attention_rope` knocked out: the q part of qkv as [rows, H, D] (a strided view), no launch."""
    num_heads, d = args[7], cos.shape[-1]  # (q_weight, k_weight, eps, k_cache, v_cache, slots, lengths, H, K)
    return qkv[:, : num_heads * d].view(qkv.shape[0], num_heads, d)


KNOCKOUTS = {  # variant part -> (module, name, stand-in) swapped while capturing
    "ko_cp_norms": ("engine.fast.code_predictor_graph", "rms_norm", _no_norm),
    "ko_cp_attention": ("engine.fast.code_predictor_graph", "cp_attention", _no_cp_attention),
    "ko_talker_norms": ("engine.fast.decoder", "rms_norm", _no_norm),
    "ko_talker_attention": ("engine.fast.talker_graph", "decode_attention_rope", _no_decode_attention),
}


@contextlib.contextmanager
def knocked_out(variant_or_part: str | None, prefix: str) -> Iterator[None]:
    """While capturing: the kernels a `ko_<prefix>*` part of the variant names left out (tool-only)."""
    import importlib

    parts = (variant_or_part or "").split("+")
    swaps = [KNOCKOUTS[part] for part in parts if part.startswith(prefix) and part in KNOCKOUTS]
    saved = [(importlib.import_module(module), name) for module, name, _ in swaps]
    originals = [getattr(module, name) for module, name in saved]
    for (module, name), (_, _, stand_in) in zip(saved, swaps, strict=True):
        setattr(module, name, stand_in)
    try:
        yield
    finally:
        for (module, name), original in zip(saved, originals, strict=True):
            setattr(module, name, original)


@contextlib.contextmanager
def attention_config(part: str | None) -> Iterator[None]:
    """While capturing: the talker's decode attention as a `tattn_*` part says (None: the defaults), by swapping
    the module's `default_split_config` that `decode_attention_rope` asks (tool-only; the engine has no such
    option)."""
    from engine.fast.kernels import decode_attention

    default = decode_attention.default_split_config
    if part is not None:
        decode_attention.default_split_config = lambda rows: attention_split(part, rows, default)
    try:
        yield
    finally:
        decode_attention.default_split_config = default

