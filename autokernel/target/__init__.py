"""Targets: a checkout autokernel works on plus its declaration (autokernel.toml, docs/targets.md). Discovery
(`autokernel init`) runs the checkout's engine workload in the sandbox and records its Triton launches."""
