"""leap-stream: tell a training-job scheduler which accelerator type to run a job on."""

__version__ = "0.1.0"
