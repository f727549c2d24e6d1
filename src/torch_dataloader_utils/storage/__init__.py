"""Storage: what the library knows of filesystems and credentials, below discovery and io."""
