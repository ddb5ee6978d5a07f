"""The gateway <-> engine link: shared-memory rings, eventfd wake-ups, a Unix control socket.

Stdlib only (never torch), so the gateway imports it freely. Nothing is imported here; use the modules:

    messages     the records that cross the boundary (what they mean)
    wire         their byte encoding (encode / decode)
    ring         one single-producer/single-consumer byte ring over shared memory
    segment      one link's shared-memory segment: header + request ring + reply ring
    control      the control socket: addresses, handshake, goodbye byte
    server       EngineEndpoint: the engine's blocking end of every link
    client       EngineLink: a gateway worker's asyncio end of its link
    process      spawn_engine / wait_for_socket / die_with_parent
    fake_engine  `python -m engine.ipc.fake_engine`: a model-free engine speaking the real protocol

See docs/ipc.md for the design, the byte layouts and the limits.
"""
