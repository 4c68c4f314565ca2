"""Trainer SDK: staleness-bounded batches in, published weight versions out."""
