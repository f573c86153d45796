"""Model management: the registry (models.toml), the store, downloads, bundled
models, where files live, and resolving/loading a pair (``pairs``)."""
