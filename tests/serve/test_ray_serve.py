"""The OpenAI routes on Ray Serve: a local Ray instance, 2 replicas (one engine each) behind
Ray Serve's HTTP proxy, driven with the official client. Skips where ray is absent."""

from __future__ import annotations

import json
import socket
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'speculant[ray]'")
serve = pytest.importorskip("ray.serve", reason="ray[serve] is not installed: "
                                                "pip install 'speculant[ray]'")
openai = pytest.importorskip("openai", reason="the openai client is not installed")

from speculant import GenerationOptions  # noqa: E402
from speculant.serve.ray_app import build  # noqa: E402

MODEL = "fixture"  # conftest.MODEL
NUM_REPLICAS = 2


@pytest.fixture(scope="module")
def ray_url(chat_package):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Ray's agents start slowly on a small loaded machine: give them minutes, not seconds.
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False,
             _system_config={"raylet_start_wait_time_s": 120,
                             "agent_register_timeout_ms": 180_000})
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build(str(chat_package), model_name=MODEL, num_replicas=NUM_REPLICAS,
                        num_cpus=0.5), route_prefix="/")
        status = serve.status().applications["default"]
        print(f"\nray {ray.__version__}: application {status.status}, deployments "
              + ", ".join(f"{name}: {d.replica_states}" for name, d in status.deployments.items()))
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_answer_the_openai_routes(ray_url, engine):
    client = openai.OpenAI(base_url=f"{ray_url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]

    expected = engine.generate("hello world", GenerationOptions(max_new_tokens=16,
                                                                proposer="chained"))
    answer = client.completions.create(model=MODEL, prompt="hello world", max_tokens=16,
                                       extra_body={"proposer": "chained"})
    assert answer.choices[0].text == expected.text
    print(f"completion: {answer.choices[0].text!r} ({answer.usage.completion_tokens} tokens)")

    messages = [{"role": "user", "content": "hi there"}]
    expected_chat = engine.chat(messages, GenerationOptions(max_new_tokens=12))
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                                 stream=True,
                                                 stream_options={"include_usage": True}))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == expected_chat.text
    print(f"streamed chat: {len(chunks)} chunks, {content!r}, usage {chunks[-1].usage}")

    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hello", max_tokens=4,
                                  extra_body={"proposer": "chained", "k": 99})

    def health(_: int) -> int:
        with urllib.request.urlopen(f"{ray_url}/health", timeout=30) as response:
            return json.loads(response.read())["pid"]

    with ThreadPoolExecutor(8) as pool:
        pids = list(pool.map(health, range(64)))
    print(f"/health answered by replica processes {sorted(set(pids))} "
          f"({[pids.count(p) for p in sorted(set(pids))]} of {len(pids)} requests)")
    assert len(set(pids)) == NUM_REPLICAS

    prompts = [f"{c}{c} " for c in "abcdefgh"]
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(lambda p: client.completions.create(
            model=MODEL, prompt=p, max_tokens=10).choices[0].text, prompts))
    assert texts == [engine.generate(p, GenerationOptions(max_new_tokens=10)).text
                     for p in prompts]
    print("8 concurrent completions through the proxy: all equal to engine.generate")


def _replica(application):
    """The replica ``application`` deploys, built here as Ray builds it on a replica (its
    bound arguments, then ``__serve_build_asgi_app__``), without a Ray cluster."""
    wrapper = application._bound_deployment.func_or_class  # serve.ingress's subclass
    replica_class = next(c for c in wrapper.__mro__ if "__serve_build_asgi_app__" in vars(c))
    replica = replica_class(*application._bound_deployment.init_args,
                            **application._bound_deployment.init_kwargs)
    return replica, replica.__serve_build_asgi_app__()


def test_the_limits_reach_each_replicas_app_and_engine(chat_package):
    from speculant.serve.limits import ServerLimits
    from speculant.serve.ray_app import app_builder
    from speculant.text.chat import TemplateLimits

    limits = ServerLimits(request_timeout_s=7.0, max_waiting=3, max_tokens=5,
                          max_body_bytes=4096)
    template_limits = TemplateLimits(deadline_s=0.5, max_output_chars=999)
    replica, app = _replica(build(str(chat_package), model_name=MODEL, limits=limits,
                                  template_limits=template_limits))
    assert app.state.service.limits == limits
    assert replica.engine.chat_template.limits == template_limits

    replica, app = _replica(app_builder({"package": str(chat_package), "max_waiting": "3",
                                         "request_timeout_s": "7", "max_tokens": "5",
                                         "chat_template_deadline": "0.5",
                                         "chat_template_max_chars": "999"}))
    assert app.state.service.limits == ServerLimits(request_timeout_s=7.0, max_waiting=3,
                                                    max_tokens=5)
    assert replica.engine.chat_template.limits == template_limits
