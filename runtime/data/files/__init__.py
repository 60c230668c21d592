"""How data files are opened: text lines (plain or gzip, day-file directories) and pyarrow."""
