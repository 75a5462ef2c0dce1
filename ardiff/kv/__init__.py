"""The KV cache: plan (pure integers), pool, tables, storage, attention, state."""
