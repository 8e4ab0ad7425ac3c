"""Distributed trials: DDP and FSDP2 through torchrun (DESIGN.md convention 17).

AmpScope never starts ranks itself: ``launch`` hands a trial to
``torch.distributed.run`` (its argument parser and ``elastic_launch``), whose agent
starts ``rank_main`` once per rank. ``trial`` is the parent side that turns the ranks'
event files into one ``TrialResult`` with a ``ranks`` list.

Below engine.run, which starts these trials: a rank builds its optimiser, grad norm and
batches from engine.models and engine.measure, as a one-process trial does.
"""
