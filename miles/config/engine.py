"""Settings of the inference engines: which kind, on what device, how they batch."""
from __future__ import annotations

from dataclasses import dataclass

from miles.config.fields import ConfigError, flag


@dataclass(frozen=True)
class EngineConfig:
    """Inference engines: the embedded transformers engine or SGLang."""

    engine: str = flag("embedded", "inference engine: the embedded CPU/GPU engine or a real SGLang server",
                       choices=("embedded", "sglang"))
    engine_device: str = flag("auto", "device of the embedded engine (auto: CUDA when present)",
                              choices=("auto", "cpu", "cuda"))
    engine_dtype: str = flag("auto", "the embedded engine's weights and arithmetic (SGLang's --dtype): "
                                     "auto is float32 on CPU (log-probs match the trainer's) and the "
                                     "checkpoint's dtype on GPU",
                             choices=("auto", "float32", "bfloat16", "float16"))
    engine_max_batch_size: int = flag(256, "most requests (samples) the embedded engine decodes together; the "
                                      "default takes a whole default rollout (32 x 8) in one batch", minimum=1)
    engine_cpu_threads: int = flag(1, "torch CPU threads of the embedded engine; 1 is fastest for a small model on "
                                      "shared cores (more threads spin against each other)", minimum=1)
    engine_max_queued_requests: int = flag(4096, "requests the engine queues before answering 503", minimum=1)
    tool_call_parser: str | None = flag(None, "format of tool calls in model text, for /v1/chat/completions "
                                              "requests with `tools` (SGLang's flag)", choices=("qwen25", "tiny"))
    engine_max_body_mb: float = flag(16.0, "largest request body the embedded engine reads, in MiB (413 past it; "
                                           "/update_weights_from_tensor has its own: the served model's parameters in "
                                           "float32 plus room for the header)", minimum=0.001)
    engine_max_header_kb: float = flag(64.0, "largest request line + headers, in KiB (431 past it)", minimum=1.0)
    engine_header_timeout: float = flag(10.0, "seconds a request's headers may take to arrive, and the "
                                                     "window over which its body must keep arriving at >= 16 KiB/s "
                                                     "(408 after)",
                                        minimum=0.1)
    context_length: int | None = flag(None, "longest prompt + response in tokens (default: the model's)", minimum=1)
    sglang_mem_fraction_static: float | None = flag(None, "SGLang --mem-fraction-static", minimum=0.0, maximum=1.0)
    sglang_tp_size: int = flag(1, "SGLang tensor-parallel size per engine", minimum=1)
    sglang_extra_args: list[str] = flag([], "extra arguments for python -m sglang.launch_server, as one quoted "
                                       "string split like a shell ('--disable-radix-cache --chunked-prefill-size 4096')")

    def validate(self) -> None:
        if self.engine == "sglang":
            return
        given = {"--sglang-tp-size": self.sglang_tp_size != 1,
                 "--sglang-mem-fraction-static": self.sglang_mem_fraction_static is not None,
                 "--sglang-extra-args": bool(self.sglang_extra_args)}
        for name, set_here in given.items():
            if set_here:
                raise ConfigError(name, "applies to SGLang engines only; add --engine sglang (the embedded engine "
                                        "has no such setting)")
