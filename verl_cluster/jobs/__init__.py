"""Job launchers: the Ray Jobs API and torchrun, and the requests they take (one chosen per job)."""
