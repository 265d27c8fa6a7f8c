"""The traffic a profile replays: a YAML or JSON file of prompts, how they batch, and how many decode steps follow.

A workload is what a user writes to make the ranking reflect their own traffic:

```yaml
name: my-traffic        # a label carried into the trace
chat: true              # wrap each prompt in the model's chat template
batch: 4                # rows per batched (left-padded) prefill; prompts are split into consecutive batches
decode_steps: 8         # decode forwards after each prefill (alias: max_new_tokens); stop tokens are ignored so
                        # every run does the same work
temperature: 0.0        # 0 picks tokens greedily; above 0 samples through the softmax op (seeded)
seed: 0
prompts:
  - "What is the capital of France?"
  - "Write a haiku about the sea."
```

The same keys in a JSON object work too. A malformed file raises UserError naming the file, line and field.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from autokernel.errors import UserError

DEFAULT = Path(__file__).resolve().parent.parent / "workloads" / "default.yaml"


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    prompts: list[str] = Field(min_length=1)
    """The prompts, in order; each becomes one row of a batched prefill."""
    name: str = "custom"
    """A label carried into the trace."""
    chat: bool = True
    """Wrap each prompt in the model's chat template (as `autokernel generate` does by default)."""
    batch: int = Field(4, ge=1)
    """Rows per batched prefill: prompts are split into consecutive batches of this many, left-padded."""
    decode_steps: int = Field(validation_alias=AliasChoices("decode_steps", "max_new_tokens"), ge=0)
    """Decode forwards after each prefill. Stop tokens are ignored, so every run of a workload does the same work."""
    temperature: float = Field(0.0, ge=0.0)
    """0 picks greedily (argmax); above 0 samples through the softmax op, seeded by `seed`."""
    seed: int = Field(0, ge=0, lt=1 << 64)
    """Seed for sampling (torch's generator takes 0 to 2**64 - 1)."""

    @field_validator("prompts")
    @classmethod
    def _non_empty(cls, prompts: list[str]) -> list[str]:
        for i, p in enumerate(prompts):
            if not p.strip():
                raise ValueError(f"prompt {i} is empty")
        return prompts

    def batches(self) -> list[list[str]]:
        return [self.prompts[i:i + self.batch] for i in range(0, len(self.prompts), self.batch)]


def _line_of(text: str, loc: tuple) -> int | None:
    """The line (1-based) of a field path in YAML (or JSON, which YAML reads), for error messages."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if k.value == str(key)]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            match = [(node.value[key], node.value[key])]
        else:
            break
        if not match:
            break
        line, node = match[0][0].start_mark.line + 1, match[0][1]
    return line


def load(path: str | Path | None = None) -> tuple[Workload, str, str]:
    """(workload, its file's text, the text's sha256). None means the packaged default."""
    path = Path(path) if path is not None else DEFAULT
    if not path.is_file():
        raise UserError(f"{path}: no such workload file")
    text = path.read_text()
    from autokernel.policy import parse_untrusted  # one rule for config files someone else may have written
    data = parse_untrusted(path, text, json.loads if path.suffix == ".json" else yaml.safe_load,
                           "JSON" if path.suffix == ".json" else "YAML")
    if not isinstance(data, dict):
        raise UserError(f"{path}: the top level must be a mapping with fields {', '.join(Workload.model_fields)}")
    try:
        w = Workload.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = err["loc"]
        field = ".".join(str(p) for p in loc) or "?"
        line = _line_of(text, loc)
        where = f"{path}:{line}" if line else str(path)
        msg = err["msg"].removeprefix("Value error, ")
        raise UserError(f"{where}: field '{field}': {msg}") from None
    return w, text, hashlib.sha256(text.encode()).hexdigest()
