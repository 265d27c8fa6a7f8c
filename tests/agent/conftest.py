"""Fixtures of the agent tests; the helpers they share are in agent_helpers.py and fake_llm_api.py (same folder)."""
import pytest
from agent_helpers import KERNEL_FILE

from autokernel.agent import prompt as prompt_mod
from autokernel.policy import Agent as AgentPolicy


@pytest.fixture(scope="session")
def rmsnorm_prompt():
    return prompt_mod.build("rmsnorm", AgentPolicy(), kernel_file=KERNEL_FILE)


@pytest.fixture
def keys(monkeypatch):
    """API keys set, and no ambient base URL or profile that could send the SDKs elsewhere."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    for var in ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE",
                "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(var, raising=False)
