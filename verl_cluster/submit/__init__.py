"""The submit pipeline: preflight (data, model, paths, verl config), the plan, the request for a job launcher."""
