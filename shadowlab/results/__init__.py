"""The run directory on disk: its layout, the records in it, the one reader and the merge of shards."""
