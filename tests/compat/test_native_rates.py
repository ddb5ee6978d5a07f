"""`vivace.speech.v1` at other output rates: every sample count is in samples of the context's rate."""

from __future__ import annotations

from tests.gateway.helpers import GatewayProcess, LiveClient, expected_samples

TEXT = "Counting in other units."


async def test_a_context_at_16_khz_counts_every_sample_at_16_khz(gateway: GatewayProcess) -> None:
    async with LiveClient.open(gateway.ws) as client:
        assert 16000 in client.created["sample_rates"] and client.created["audio"]["sample_rate"] == 24000
        await client.send(
            type="context.create", context_id="c", audio={"format": "pcm16", "sample_rate": 16000}
        )
        created = await client.until("context.created", "c")
        assert created["audio"]["sample_rate"] == 16000
        await client.send(type="input_text.append", context_id="c", text=TEXT)
        await client.send(type="input_text.end", context_id="c")
        done = await client.until("context.done", "c")
        frames = client.stream_frames(created["stream"])
    total = sum(len(f[4]) // 2 for f in frames)
    assert abs(total - expected_samples(len(TEXT)) * 16000 // 24000) <= 1
    assert done["samples"] == total
    starts = [f[3] for f in frames]
    assert starts == [sum(len(f[4]) // 2 for f in frames[:i]) for i in range(len(frames))]  # contiguous


async def test_session_update_sets_the_default_rate_and_bad_rates_are_refused(
    gateway: GatewayProcess,
) -> None:
    async with LiveClient.open(gateway.ws) as client:
        await client.send(type="session.update", audio={"format": "pcm16", "sample_rate": 8000})
        updated = await client.until("session.updated")
        assert updated["audio"]["sample_rate"] == 8000
        await client.send(type="input_text.append", context_id="d", text=TEXT)
        created = await client.until("context.created", "d")
        assert created["audio"]["sample_rate"] == 8000
        await client.send(type="input_text.end", context_id="d")
        done = await client.until("context.done", "d")
        assert abs(done["samples"] - expected_samples(len(TEXT)) // 3) <= 1
        await client.send(
            type="context.create", context_id="e", audio={"format": "pcm16", "sample_rate": 11025}
        )
        assert (await client.until("error"))["error"]["code"] == "unsupported_sample_rate"
        await client.send(
            type="context.create", context_id="f", audio={"format": "opus", "sample_rate": 48000}
        )
        assert (await client.until("error"))["error"]["code"] == "unsupported_sample_rate"
