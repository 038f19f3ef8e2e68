"""A verl shell script or command line read as a job: shell words, Hydra values, secrets kept out of records."""
