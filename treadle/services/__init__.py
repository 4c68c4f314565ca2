"""Treadle's runtime services (``treadle.services.<name>``): one folder per service."""
