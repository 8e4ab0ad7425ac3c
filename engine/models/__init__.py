"""What gets trained: model sources and presets, the model checks, the memory model, the
optimisers a trial or a rank builds.
May import engine.core and engine.measure.
"""
