"""Tests of verl-cluster (a regular package, so a site-packages `tests` package, e.g. verl's, cannot shadow it)."""
