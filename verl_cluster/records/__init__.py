"""What this machine remembers: jobs submitted from here, clusters brought up from here, the lengths verl logged."""
