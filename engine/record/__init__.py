"""What a run leaves: the run record, the journal and its reader, comparison, spread,
verdict, follow/watch. May import engine.core, engine.measure and engine.models.load.
"""
