"""`submit --watch` / `watch`: keep a long run up — detect, heal (as `up` does), resume, report."""
