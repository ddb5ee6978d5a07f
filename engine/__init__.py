"""Vivace engine: the model, the scheduler and the GPU loop.

Empty on purpose: the gateway imports `engine.ipc` and `engine.text`, and neither may pull in torch.
"""
