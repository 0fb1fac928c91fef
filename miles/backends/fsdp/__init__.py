"""The FSDP2 backend: the HF model sharded with `fully_shard`, one Ray actor per rank."""
