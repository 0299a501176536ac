"""Job scripts that ``sparseps`` commands hand to the launcher (one script, every role)."""
