"""`python -m engine.codec`: print the per-stream streaming-state size of the codec (torch-free).

The numbers come from `codec_state_layout`, the same table `CodecStatePool` allocates from (a test checks
that the pool's real bytes equal them), so admission control can bound codec memory per request.
"""

from __future__ import annotations

import argparse

from engine.codec.config import codec_preset
from engine.codec.state_layout import POSITION_BYTES, kv_elements, state_bytes, state_elements

DTYPE_BYTES = {"fp32": 4, "bf16": 2}


def state_size_table(presets: tuple[str, ...] = ("full", "tiny")) -> str:
    """A markdown table: per-stream state elements and bytes for each preset and dtype."""
    lines = [
        "| config | KV elements | conv elements | fp32 bytes / stream | bf16 bytes / stream | fp32 per 100 streams |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in presets:
        config = codec_preset(name)
        total, kv = state_elements(config), kv_elements(config)
        fp32, bf16 = state_bytes(config, DTYPE_BYTES["fp32"]), state_bytes(config, DTYPE_BYTES["bf16"])
        lines.append(
            f"| {name} | {kv:,} | {total - kv:,} | {fp32:,} ({fp32 / 2**20:.2f} MiB) | "
            f"{bf16:,} ({bf16 / 2**20:.2f} MiB) | {100 * fp32 / 2**20:.0f} MiB |"
        )
    lines.append(
        f"\nEach stream also keeps one int64 frame position ({POSITION_BYTES} bytes, included above)."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.codec", description=__doc__.splitlines()[0])
    parser.add_argument("--preset", action="append", choices=["full", "tiny"], help="default: full and tiny")
    args = parser.parse_args()
    print(state_size_table(tuple(args.preset or ("full", "tiny"))))


if __name__ == "__main__":
    main()
