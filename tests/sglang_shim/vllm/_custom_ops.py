"""Test environment only. SGLang 0.5.23 imports `vllm._custom_ops` on non-CUDA platforms;
vllm cannot be installed on this CPU-only test machine, and SGLang's CPU path never calls
this op. This stand-in lets the import succeed and fails loudly if it is ever called."""


def rotary_embedding(*args: object, **kwargs: object) -> None:
    raise RuntimeError("vllm custom ops are not available in the CPU test environment")
