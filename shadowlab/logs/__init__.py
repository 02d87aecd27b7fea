"""Engine logs: the parser (events), the checkpoint lifecycle replay, and `shadowlab logs`."""
