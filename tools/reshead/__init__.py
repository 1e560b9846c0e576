"""Training side of the learned OCR resolution head (`streamfuse.vision.reshead`): slide
synthesis (`synth`), OCR labels (`labels`), cached datasets (`dataset`), the torch network
(`model`) and training / export / INT8 quantization (`train`); run by `scripts/train_reshead.py`."""
