"""What the CPU trials' forkserver imports once (engine.run.trial_process): every trial it
forks starts with torch, transformers' model base and the trial code in memory. Nothing here
touches a device or builds a model."""

from engine.core.quiet import quiet_libraries

quiet_libraries()  # before the imports: the server writes to the run's terminal

import transformers.modeling_utils  # noqa: E402,F401 (every model's base class)

import engine.run.trial  # noqa: E402,F401
