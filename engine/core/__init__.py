"""The words every stage speaks: the run's config, the precision recipes, the events; and
the child-process guard every process AmpScope starts uses.
Imports nothing from engine's other packages (only the standard library, torch, psutil).
"""
