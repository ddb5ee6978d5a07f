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


async def test_word_timing_events_when_asked_cover_the_text_in_samples(gateway: GatewayProcess) -> None:
    async with LiveClient.open(gateway.ws) as client:
        await client.send(
            type="context.create",
            context_id="w",
            word_timings=True,
            audio={"format": "pcm16", "sample_rate": 16000},
        )
        await client.until("context.created", "w")
        for piece in ("Counting in ", "other units."):
            await client.send(type="input_text.append", context_id="w", text=piece)
        await client.send(type="input_text.end", context_id="w")
        done = await client.until("context.done", "w")
        await client.send(type="input_text.append", context_id="plain", text="No timings here.")
        await client.send(type="input_text.end", context_id="plain")
        await client.until("context.done", "plain")
    timings = [e for e in client.events if e["type"] == "word.timing"]
    assert timings and all(e["context_id"] == "w" and e["approximate"] for e in timings)
    words = [w for e in timings for w in e["words"]]
    assert [w["word"] for w in words] == TEXT.split()
    assert all(w["start_sample"] <= w["end_sample"] <= done["samples"] for w in words)
    assert [w["start_sample"] for w in words] == sorted(w["start_sample"] for w in words)
    last_timing = max(i for i, e in enumerate(client.events) if e["type"] == "word.timing")
    assert last_timing < client.events.index(done)
