"""The instruments: timers, allocator and memory tracker, NVML/amdsmi/GPM, kernels,
FLOPs, peaks, host monitor, device probe. May import engine.core only.
"""
