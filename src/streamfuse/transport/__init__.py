"""Edge-cloud transport: the versioned wire format (`wire`), sparse patch tokens for key frames
(`patches`), speech-only audio (`speech`), the deadline-aware UDP link (`udp`) and the edge and
cloud ends that use them (`edge`, `cloud`). See docs/edge-cloud.md and docs/wire-format.md.
"""
