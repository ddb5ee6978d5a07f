"""GPU fast paths with plain-PyTorch twins: fused Triton kernels (`kernels/`) and CUDA graphs (`graphs.py`).

Talker and code predictor (`talker_graph.TalkerGraphs`, `code_predictor_graph.CodePredictorGraphs`) are
drop-in objects with the same calls and results as `engine.executors.talker.TalkerExecutor` and
`engine.executors.code_predictor.CodePredictorExecutor`; off the GPU they run the same static-shape steps
eagerly through the kernels' PyTorch twins, which is what CPU tests exercise.
"""
