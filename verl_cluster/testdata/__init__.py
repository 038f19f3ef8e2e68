"""Test data makers (a tiny model, GSM8K and its synthetic stand-in) that scripts and tests use; the product does not."""
