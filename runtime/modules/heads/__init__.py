"""The heads' losses, combined with their weights."""
