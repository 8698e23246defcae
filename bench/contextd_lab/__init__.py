"""The Context Lab: measuring what a policy saves, what it costs and what it loses (issue 6)."""
