"""The prompt's context (autokernel/agent/context.py): device facts that decide speed, the engine's call sites of
the op, and sibling kernels from the target checkout."""
from types import SimpleNamespace

import torch
from agent_helpers import INCUMBENT

from autokernel import device
from autokernel.agent import context
from autokernel.agent.prompt import build
from autokernel.policy import Agent


def test_rmsnorm_prompt_has_call_site_sibling_and_device_facts(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "is_cuda", lambda: False)
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "rmsnorm.py").write_text(INCUMBENT)
    (tmp_path / "kernels" / "add_rmsnorm.py").write_text("# the target checkout's own add_rmsnorm\n")
    task = build("rmsnorm", Agent(), kernel_file=tmp_path / "kernels" / "rmsnorm.py").task
    assert "`num_warps` and `num_stages` do nothing" in task and "programs launched" in task
    assert 'autokernel/engine/model.py:' in task and 'ops("rmsnorm", "blk.0.attn_norm"' in task
    assert "kernels/add_rmsnorm.py" in task and "# the target checkout's own add_rmsnorm" in task
    assert 'ops("add_rmsnorm"' not in task.split("## Where the engine calls it")[1].split("## A sibling")[0]


def test_cuda_facts_name_sms_shared_memory_and_capability(monkeypatch):
    props = SimpleNamespace(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132,
                            shared_memory_per_block_optin=227 * 1024, L2_cache_size=60 * 2 ** 20,
                            total_memory=141 * 2 ** 30)
    monkeypatch.setattr(device, "is_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    facts = context.device_facts()
    assert "compute capability 9.0" in facts and "132 SMs" in facts and "227 KiB shared memory" in facts
    assert "num_warps" not in facts


def test_call_sites_and_siblings(tmp_path):
    (tmp_path / "m.py").write_text('a = 1\ny = self.ops("softmax", "s", x)\nz = ops("softmax_other", "t", x)\n')
    assert context.call_sites("softmax", tmp_path) == ['autokernel/engine/m.py:2: y = self.ops("softmax", "s", x)']
    assert context.siblings("rmsnorm") == ["add_rmsnorm"] and "attention" in context.siblings("attention_decode")
    assert context.siblings("silu_mul") == []
