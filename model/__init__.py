"""Models of the sink's protocols, kept beside the code they check (see txn_model)."""
