"""LangChain's ``ChatOpenAI`` against the server: ``bind_tools`` and
``with_structured_output`` (the `agents` dependency group: uv sync --group agents)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

pytest.importorskip("langchain_openai", reason="langchain-openai is not installed "
                                               "(uv sync --extra cpu --group agents)")
pytest.importorskip("llguidance", reason="the structured extra is not installed")

from langchain_openai import ChatOpenAI  # noqa: E402
from test_agent_features import MODEL, agent_client, demo_chat  # noqa: E402,F401


class Pet(BaseModel):
    """A pet."""

    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=30)
    is_cat: bool


def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name
    """
    return "sunny"


@pytest.fixture(scope="module")
def chat_model(agent_client) -> ChatOpenAI:  # noqa: F811
    return ChatOpenAI(model=MODEL, base_url=str(agent_client.base_url), api_key="unused",
                      max_tokens=60, temperature=0, max_retries=0)


def test_with_structured_output_returns_the_model(chat_model):
    pet = chat_model.with_structured_output(Pet).invoke("Describe a pet.")
    assert isinstance(pet, Pet) and len(pet.name) <= 12 and 0 <= pet.age <= 30


def test_with_structured_output_under_speculation(chat_model):
    speculative = chat_model.bind(extra_body={"proposer": "chained", "k": 4})
    plain = chat_model.with_structured_output(Pet).invoke("Describe a pet.")
    assert speculative.with_structured_output(Pet).invoke("Describe a pet.") == plain


def test_bind_tools_gives_tool_calls(chat_model):
    answer = chat_model.bind_tools([get_weather], tool_choice="get_weather").invoke(
        "What is the weather in Paris?")
    call, = answer.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    required = chat_model.bind_tools([get_weather], tool_choice="any").invoke("Weather?")
    assert required.tool_calls and required.tool_calls[0]["name"] == "get_weather"
