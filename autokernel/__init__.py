"""autokernel: profile an LLM engine, rewrite its Triton kernels with an agent, prove and measure every rewrite."""
__version__ = "0.1.0"
