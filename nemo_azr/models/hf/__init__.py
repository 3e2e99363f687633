"""The transformers (hf) backends: policy, critic, checkpoint files and the KV-cache keyword."""
