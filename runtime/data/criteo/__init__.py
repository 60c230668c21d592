"""Criteo click logs (the Kaggle and Terabyte day-file layout)."""
