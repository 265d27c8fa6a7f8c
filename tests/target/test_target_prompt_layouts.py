"""The LLM prompt for a target op lists the workload's calls with their argument layouts as the trace writes them
(profile_target: `args` is one string, discover.describe): joined character by character it read
`norm(x, :,  , f, l, o, a, t ...)` (autokernel/target/run.py, prompt)."""
from test_target_gate import checkout

from autokernel.target import declaration as decl
from autokernel.target.run import prompt


def test_the_prompt_shows_each_layout_as_the_trace_writes_it(tmp_path):
    root = checkout(tmp_path / "t")
    args = "x float32 (7, 32) · eps=1e-05"
    entry = {"share": 0.5, "shapes": [{"launcher": "norm", "args": args, "calls": 3}]}
    task = prompt(root, decl.load(root).ops["norm"], {"ops": {"norm": entry}}).task
    assert f"- norm({args}): 3 call(s)" in task, task
    old = {"launcher": "norm", "args": ["x float32 (1, 32)", "eps=1e-05"], "calls": 1}  # a list, should one come
    task = prompt(root, decl.load(root).ops["norm"], {"ops": {"norm": {"shapes": [old]}}}).task
    assert "- norm(x float32 (1, 32), eps=1e-05): 1 call(s)" in task, task
