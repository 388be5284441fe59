"""Exports of decoded changes: Arrow record batches (and, built on them, pandas / Python objects)."""
