"""Vivace engine: the model, the scheduler and the GPU loop.

Empty on purpose: the gateway imports `engine.ipc`, `engine.text` and `engine.gc_watch`, and none may pull in torch.
"""
