"""Trainer SDK: staleness-bounded batches in, published weight versions out.

``connect.connect()`` finds the job's buffer, scheduler, placement and weight store in the pod's
environment (or takes their addresses, for a trainer outside the job); ``batches.Batches`` iterates
training batches from the buffer service; ``publisher.Publisher`` publishes weights
(``treadle.weights``) and commits versions, with the step and mean reward the job's status shows.
"""
