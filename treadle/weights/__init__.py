"""Versioned weight publication: checksummed buckets plus a manifest written last.

The trainer side is ``publish.Publisher`` (used through ``treadle.client.publisher``); readers use
``pull.Reader``, and inference engines ``loader.Loader`` via ``receive`` (vLLM's weight-transfer
engine ``transfer_engine`` and the worker extension ``vllm_extension``). Both talk to an
``objects.ObjectStore``: ``mooncake_client.MooncakeStore`` (a pure client of dedicated
``store`` processes, replicas >= 2) in a cluster, ``objects.FileStore`` (/dev/shm) in local mode.
``layout`` holds the key scheme and the manifest, ``tensors`` the state-dict byte views.
"""
