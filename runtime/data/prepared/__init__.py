"""Prepared data: a spec's training rows parsed once into Parquet row groups, read by row ranges.

prepare.py   raw files (criteo, movielens, csv) -> DIR of Parquet parts + manifest.json
schema.py    the columns a spec's inputs need, their Arrow types, Columns <-> Arrow tables
manifest.py  the manifest: rows, row groups, per-column spec and statistics, file hashes
order.py     which physical rows an epoch's positions are (prepared order or a seeded shuffle)
reading.py   a rank's rows of a range of positions, decoded with column projection
batches.py   the rank's share of every global batch, in DataLoader workers, resumable by row
"""
