"""The Megatron-core backend: GPTModel (local torch layer spec), data parallel over Ray actors, HF in and out."""
