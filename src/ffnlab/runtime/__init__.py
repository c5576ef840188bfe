"""Where the work runs: the execution layer (executor.py: units, results, merge, resume) and its
backends (in-process by default; ray_backend.py for a Ray cluster, an optional extra)."""
