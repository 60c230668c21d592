"""MovieLens: the ratings reader, its users' histories, vocabularies and the split by time."""
