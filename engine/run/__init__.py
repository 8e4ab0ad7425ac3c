"""What runs the trials: the trial, its child process, rounds, the runner, fit and plan.
May import every stage below it (core, measure, models, record, numerics, distributed: the
runner starts distributed trials).
"""
