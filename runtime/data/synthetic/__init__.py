"""Synthetic data made from a model's inputs: batches with a learnable signal, sequences, retrieval positives."""
