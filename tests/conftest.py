import os

# CI has 2 cores shared by the test process, its trial children and Qt: OpenMP worker
# threads that spin-wait for a busy core make tiny CPU steps ~20x slower. One intra-op
# thread keeps the suite quick; set before torch loads, and inherited by children.
os.environ.setdefault("OMP_NUM_THREADS", "1")
