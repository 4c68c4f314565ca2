"""Versioned weight publication: buckets plus a manifest written last (Mooncake store or local)."""
