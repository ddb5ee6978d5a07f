"""Drop-in compatible protocols: ElevenLabs and Cartesia TTS APIs on the same gateway and engine path.

One module per protocol (its wire shapes in a `*_wire` module beside it), plus shared helpers:
output formats (`formats`), ISO 639-1 language codes (`languages`), approximate word timings
(`timings`), and the socket machinery both WebSocket protocols share (`socket`).
"""
