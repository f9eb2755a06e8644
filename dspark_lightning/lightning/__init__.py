"""The only package that imports Lightning: module, datamodule, metrics, CLI."""
