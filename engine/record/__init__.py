"""What a run leaves: the run record, the journal and its reader, the JSON report's reader,
the numerics lab's results as plain data, comparison, spread,
verdict, follow/watch. May import engine.core, engine.measure and engine.models.load.
"""
