"""The only package that touches torch.utils.data and torch.distributed."""
