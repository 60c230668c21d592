"""What the readers check and report about their rows: bad rows, unseen ids, timestamps, history lengths."""
