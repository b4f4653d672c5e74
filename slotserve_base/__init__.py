"""The shared words and helpers every part of SlotServe stands on: the lowest layer.

The vocabulary (phases, reasons, events, error codes, Redis keys), errors, targets, the
dispatch of tasks, the in-flight keys, this process's Redis client, and the helpers of the
REST API, the admin, settings and CSV. Nothing here imports the apps."""
