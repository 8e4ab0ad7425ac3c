"""What the CPU trials' forkserver imports once (engine.run.trial_process): every trial it
forks starts with torch, transformers' model base and the trial code in memory. Nothing here
touches a device or builds a model."""

from engine.core.collector import imports_paused
from engine.core.quiet import quiet_libraries

quiet_libraries()  # before the imports: the server writes to the run's terminal

# frozen after the imports, the server's objects are every fork's and kept out of the
# children's collections, which would otherwise walk (and copy, page by page) the whole
# inherited heap
with imports_paused():
    import transformers.modeling_utils  # noqa: F401 (every model's base class)

    import engine.run.trial  # noqa: F401

    try:  # transformers' table of checkpoint renamings, built on the first from_pretrained
        # from about a thousand regexes (half a second a trial): built here, every fork
        # inherits it
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        get_checkpoint_conversion_mapping("gpt2")
    except (ImportError, AttributeError):  # a transformers without the table builds nothing
        pass
