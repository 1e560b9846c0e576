"""Offline code that produces what the runtime ships (training, labelling, export, quantization)
or that is research not wired into a stream. Never imported by `streamfuse`; run from a source
checkout through `scripts/` and tested under `tests/unit/`."""
