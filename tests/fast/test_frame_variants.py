"""tools/frame_variants.py's variants as tools/frame_profile.py's GPU run builds them, checked on the CPU: every
named variant yields a code-predictor `FrameKernels` and talker options, parts joined by + apply in order without
undoing each other, and an unknown part is refused before any device work."""

from __future__ import annotations

import pytest
import torch

from tools import frame_profile, frame_variants


def test_every_named_variant_builds_its_kernels_and_talker_options() -> None:
    for name in frame_variants.VARIANTS:
        kernels = frame_variants.frame_kernels(name)
        rows, rope, chain, tiles = frame_variants.talker_options(name)
        assert kernels.fused and rows in (0, 2) and isinstance(rope, bool)
        # the engine's defaults chain the talker's 16-64 row steps; talker_chain_off, the other talker parts and
        # the sixteenth session's form do not
        chained = name.startswith(("talker_chain", "talker_wide")) or not name.startswith(("talker_", "sixteenth"))
        assert (tiles is not None) == bool(chain) == (chained and name != "talker_chain_off"), name


def test_joined_parts_apply_in_order_and_keep_each_others_changes() -> None:
    kernels = frame_variants.frame_kernels("radix8+attn_late+split4")
    assert kernels.radix_bits == 8 and not kernels.attention_early_cache
    assert {tile.split_k for tiles in kernels.dot_gemv.values() for tile in tiles.values()} == {4}
    assert all(tiles["gate_up"].block_n == 16 for tiles in kernels.dot_gemv.values())  # split gate|up: 16 columns
    narrow = frame_variants.frame_kernels("split4_narrow").dot_gemv[64]
    assert {name for name, tile in narrow.items() if tile.split_k == 4} == {"proj", "o", "down"}
    assert 128 in frame_variants.frame_kernels("split4_128").dot_gemv  # a B = 64 frame's first step too
    from engine.fast.decoder import ChainTiles
    from engine.fast.talker_graph import CHAIN_TILES

    _, _, chain, tiles = frame_variants.talker_options("attn_late+talker_chain_all")
    assert chain == (16, 32, 64) and dict(tiles) == {16: CHAIN_TILES[16], 32: ChainTiles(), 64: CHAIN_TILES[64]}
    assert frame_variants.talker_options("talker_chain")[2] == (16, 64)
    assert frame_variants.talker_options("split4") == frame_variants.talker_options("defaults")  # talker untouched
    assert dict(frame_variants.talker_options("defaults")[3]) == CHAIN_TILES
    downs = [tiles.down for tiles in dict(frame_variants.talker_options("talker_chain_down_split2")[3]).values()]
    assert all(down is not None and down.split_k == 2 and down.block_n == 16 for down in downs)
    assert dict(frame_variants.talker_options("talker_chain_plain")[3]) == {16: ChainTiles(), 64: ChainTiles()}
    assert frame_variants.talker_attention("defaults") is None
    assert frame_variants.talker_attention("split4_narrow+tattn_p2_32") == "tattn_p2_32"
    assert frame_variants.talker_key("tattn_p2") != frame_variants.talker_key("tattn_p2_32")
    unsplit = frame_variants.frame_kernels("split1_narrow").dot_gemv  # the defaults before 2026-12-05
    assert {tile.split_k for tiles in unsplit.values() for tile in tiles.values()} == {1}
    assert frame_variants.frame_kernels("defaults").attention_early_cache
    assert not frame_variants.frame_kernels("attn_late").attention_early_cache
    small = frame_variants.frame_kernels("defaults").dot_gemv  # B = 2..8 on the 16-row tensor-core tiles
    assert small[4] == small[8] and all(tile.use_dot for tile in small[4].values())
    assert {name for name, tile in small[4].items() if tile.split_k == 4} == {"proj", "o", "down"}
    assert set(frame_variants.frame_kernels("cublas_small").dot_gemv) == {16, 32, 64}  # those steps in cuBLAS


def test_wide_variants_give_the_64_row_products_64_or_128_columns_and_about_one_program_an_sm() -> None:
    """wide64: every code-predictor product but gate|up at 64 token rows (and with _128 at 128, 8 warps) 64 columns a
    program, K in whole-tile slices bringing it to 128 programs; talker_wide<n>[_down]: the talker's 64-row chained
    steps only, qkv / o / down (or down alone) n columns a program, the 16-row steps' tiles the engine's."""
    from engine.fast.decoder import ChainTiles
    from engine.fast.kernels.gemv import launch_tile

    defaults = frame_variants.frame_kernels("defaults").dot_gemv
    for variant, rows_changed in (("wide64", (64,)), ("wide64_128", (64, 128))):
        tiles = frame_variants.frame_kernels(variant).dot_gemv
        assert {rows: t for rows, t in tiles.items() if rows not in rows_changed} == {
            rows: t for rows, t in defaults.items() if rows not in rows_changed}
        for rows in rows_changed:
            assert tiles[rows]["gate_up"].block_n == defaults[64]["gate_up"].block_n
            for name, (n, k) in frame_variants.CP_SHAPES.items():
                tile = tiles[rows][name]
                block_k = launch_tile(rows, k, tile)[3]
                assert tile.block_n == 64 and (n // 64) * tile.split_k == 128 and k % (tile.split_k * block_k) == 0
                assert tile.num_warps == (8 if rows == 128 else 4) and 0 < tile.loop_stages <= 4
    for columns in (64, 128):
        rows, rope, chain, by_rows = frame_variants.talker_options(f"talker_wide{columns}")
        assert rope and chain == (16, 64) and dict(by_rows)[16] == ChainTiles() and dict(by_rows).keys() == {16, 64}
        wide = dict(by_rows)[64]
        assert wide.gate_up == ChainTiles().gate_up
        for name, (n, k) in frame_variants.TALKER_SHAPES.items():
            tile = getattr(wide, name)
            assert tile.block_n == columns and (n // columns) * tile.split_k == 128 and k % (tile.split_k * 128) == 0
        down_only = dict(frame_variants.talker_options(f"talker_wide{columns}_down")[3])[64]
        assert down_only == ChainTiles(down=wide.down)
    # _gu: gate|up too, its columns kept, K in 2 slices (96 programs -> 192)
    gate_up = frame_variants.frame_kernels("wide64_gu").dot_gemv[64]["gate_up"]
    assert gate_up.block_n == defaults[64]["gate_up"].block_n and gate_up.split_k == 2
    talker_gate_up = dict(frame_variants.talker_options("talker_wide64_gu")[3])[64].gate_up
    assert talker_gate_up.block_n == ChainTiles().gate_up.block_n and talker_gate_up.split_k == 2


def test_the_fused_draw_joins_any_talker_part() -> None:
    assert frame_variants.refusal("talker_wide64+draw_fused") is None
    assert frame_variants.fused_draw("talker_wide64+draw_fused") and not frame_variants.fused_draw("talker_wide64+draw_apart")
    assert frame_variants.talker_key("talker_wide64+draw_apart") != frame_variants.talker_key("talker_wide64")
    assert frame_variants.talker_options("talker_wide64+draw_fused") == frame_variants.talker_options("talker_wide64")


def test_bulk_copy_variants_turn_on_tma_in_every_pipelined_tile_and_nothing_else() -> None:
    from dataclasses import replace

    defaults = frame_variants.frame_kernels("wide64").dot_gemv
    bulk = frame_variants.frame_kernels("wide64+gemv_tma").dot_gemv
    assert bulk.keys() == defaults.keys()
    for rows, tiles in bulk.items():
        assert all(tile.tma and tile == replace(defaults[rows][name], tma=True) for name, tile in tiles.items())
    for variant in ("talker_chain_tma", "talker_wide64_tma"):
        tiles = frame_variants.talker_options(variant)[3]
        for chain in (dict(tiles).values() if isinstance(tiles, tuple) else [tiles]):
            products = [getattr(chain, name) for name in ("qkv", "o", "gate_up", "down")]
            assert all(tile is None or tile.tma for tile in products) and any(tile is not None for tile in products)
    chain_tma = dict(frame_variants.talker_options("talker_chain_tma")[3])
    assert chain_tma[16].down is None and chain_tma[64].down.tma  # cuBLAS stays cuBLAS


def test_off_parts_undo_the_defaults_of_2026_12_06() -> None:
    """gemv_no_tma, cp_frame_io_off, draw_apart and talker_chain_plain give back the twenty-ninth session's kernels
    (the engine's defaults turn each of them on)."""
    on, off = frame_variants.frame_kernels("defaults"), frame_variants.frame_kernels("gemv_no_tma+cp_frame_io_off")
    assert on.frame_io and not off.frame_io
    assert all(tile.tma for tiles in on.dot_gemv.values() for tile in tiles.values())
    assert not any(tile.tma for tiles in off.dot_gemv.values() for tile in tiles.values())
    assert frame_variants.fused_draw("defaults") and not frame_variants.fused_draw("draw_apart")
    assert frame_variants.fused_draw("talker_chain_plain+draw_fused")
    assert frame_variants.talker_key("draw_apart") != frame_variants.talker_key("defaults")


@pytest.mark.parametrize("variant", ["stream_norms", "persistent", "folded_norms", "talker_chain+talker_chain_all"])
def test_an_unknown_part_or_two_talker_parts_are_refused(variant: str) -> None:
    with pytest.raises(SystemExit) as refused:
        frame_profile.main(["--variants", "defaults", variant])
    assert refused.value.code == 2


def test_an_attention_variant_reaches_the_talkers_5_to_64_row_steps_only_while_capturing() -> None:
    from engine.fast.kernels import decode_attention

    part = frame_variants.talker_attention("split4_narrow+tattn_p2")
    assert part == "tattn_p2" and frame_variants.talker_attention("defaults") is None
    config = decode_attention.SplitConfig(programs=2, block_n=64)
    with frame_variants.attention_config(part):
        assert decode_attention.default_split_config(64) == config
        assert decode_attention.default_split_config(4) != config and decode_attention.default_split_config(128) != config
    assert decode_attention.default_split_config(64) != config
    with frame_variants.attention_config("tattn_merge_last"):  # every size, merged in the attention kernel
        assert all(decode_attention.default_split_config(rows).merge_last for rows in (1, 16, 64, 128))
    assert not any(decode_attention.default_split_config(rows).merge_last for rows in (1, 16, 64, 128))
    with frame_variants.attention_config("tattn_tma"):  # every size, the rest of its configuration kept
        assert all(decode_attention.default_split_config(rows).tma for rows in (1, 16, 64, 128))
        assert decode_attention.default_split_config(64).programs == 2
    with frame_variants.attention_config("tattn_p1_64_all"):  # one program a (row, kv head) at every size
        assert all(decode_attention.default_split_config(rows).programs == 1 for rows in (1, 16, 64, 128))


def test_a_knockout_leaves_its_kernels_out_only_while_capturing() -> None:
    from engine.fast import code_predictor_graph, decoder, talker_graph

    norm, attention = code_predictor_graph.rms_norm, talker_graph.decode_attention_rope
    with frame_variants.knocked_out("split4_narrow+ko_cp_norms", "ko_cp_"):
        assert code_predictor_graph.rms_norm is not norm and decoder.rms_norm is norm  # the talker's untouched
        x = torch.randn(3, 8)
        assert frame_variants._no_norm(x, torch.ones(8), 1e-6)[0] is x
    assert code_predictor_graph.rms_norm is norm
    with frame_variants.knocked_out("ko_talker_attention", "ko_talker_"):
        qkv = torch.randn(5, (4 + 2 * 2) * 16)  # 4 query heads, 2 kv heads, head_dim 16
        q = talker_graph.decode_attention_rope(qkv, torch.ones(5, 16), torch.ones(5, 16), None, None, 1e-6, None,
                                               None, None, None, 4, 2, pdl=True)  # fmt: skip
        assert q.shape == (5, 4, 16) and torch.equal(q.reshape(5, -1), qkv[:, :64])
    assert talker_graph.decode_attention_rope is attention
    assert frame_variants.talker_key("ko_talker_norms") != frame_variants.talker_key("defaults")
    assert frame_variants.talker_key("ko_cp_norms") == frame_variants.talker_key("defaults")


def test_a_dry_run_builds_and_runs_variants_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    """`frame_profile.py --dry-run`: the tiny model's talker and code-predictor graphs of each variant, built and run
    for three frame steps through the kernels' twins; the bitwise ones equal the defaults (exit status 0)."""
    variants = ["wide64_128", "talker_wide64_tma+draw_fused", "tattn_tma"]
    assert frame_profile.main(["--dry-run", "--batches", "64", "--context", "16", "--variants", *variants]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if " ran; " in line]
    assert [line.split()[0] for line in lines] == variants
