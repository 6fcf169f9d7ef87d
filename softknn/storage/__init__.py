"""The storage layer: the on-disk bundle (layout, manifest), plain and sharded bundles, object storage,
the memory stores, the live-writes store and the Ray shard actors."""
