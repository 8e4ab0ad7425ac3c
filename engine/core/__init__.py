"""The words every stage speaks: the run's config, the precision recipes, the events.
Imports nothing from engine's other packages (only the standard library, torch).
"""
