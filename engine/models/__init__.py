"""What gets trained: model sources and presets, the model checks, the memory model.
May import engine.core and engine.measure.
"""
