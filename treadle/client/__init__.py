"""Trainer SDK: staleness-bounded batches in, published weight versions out.

``batches.Batches`` iterates training batches from the buffer service; ``publisher.Publisher``
publishes weights (``treadle.weights``) and commits versions to the control plane.
"""
