"""The Treadle operator (``treadle.operator``): kopf handlers, pure child renderers and status."""
