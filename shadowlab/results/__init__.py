"""The run directory on disk, one job per module (DESIGN §4).

    layout.py          RunLayout: every file name of a run directory, spelled once
    files.py           atomic write, bounded read, the bounded JSON parser, file and JSON hashes
    versions.py        the one version chain of meta.json, verdicts.json, plan.json, shard.json, merge.json
    codec.py           the JSON dataclass codec of the records
    records.py         meta.json's schema (CellMeta), EngineBuild (what makes two engines the same build)
    verdict_schema.py  verdicts.json's schema (RunVerdict and its parts) and its upgrades
    rundir.py          the one reader: a run directory loaded once (RunDir)
    merge.py           the parts of a sharded run merged into one run directory
"""
