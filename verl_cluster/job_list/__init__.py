"""`jobs`: every known cluster's jobs asked in parallel, each planned job's predicted vs measured from its log."""
