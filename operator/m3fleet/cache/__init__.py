"""MiniMaxM3ModelCache: the pure plan of per-node work (`plan`), and the staging program the Jobs run (`stage`)."""
