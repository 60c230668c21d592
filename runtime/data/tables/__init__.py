"""Generic tables: CSV and Parquet files whose columns the spec's `data.columns` maps to features.

mapping.py        data.columns -> what each column feeds, and one row's values parsed
csv_files.py      `csv:PATH`: a header line, then comma- (or tab-) separated rows
parquet_files.py  `parquet:PATH`: Parquet files, list columns for bags and sequences
"""
