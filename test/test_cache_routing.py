"""Cache-aware routing: the prefix index, the cost-based policy, the SGLang reference, the
shared index across processes, and the whole path through the router to mocks."""

from __future__ import annotations

import asyncio
import random

import aiohttp
import pytest

from mock import run_mock
from nomyo_router.config import ConfigError, parse_config
from nomyo_router.domain import Endpoint
from nomyo_router.routing.policies import CacheAware, RouteContext, SGLangCacheAware, make_policy, picker
from nomyo_router.routing.prefix_index import BLOCK_CHARS, BLOCK_TOKENS, PrefixIndex, prompt_keys, request_prompt
from nomyo_router.state import Ask, MemoryStore, WorkerStore
from test.conftest import FAST
from test.helpers import endpoints, run_router

SYSTEM = "You are the support assistant of a large shop. " * 200  # ~9.6k characters


def eps(n: int, slots: int = 2) -> list[Endpoint]:
    out = []
    for i in range(n):
        e = Endpoint(name=f"e{i}", url=f"http://127.0.0.1:{1000 + i}", slots=slots)
        e.set_models(["llama3"])
        e.loaded = frozenset(["llama3:latest"])
        out.append(e)
    return out


def chat_ctx(system: str, question: str) -> RouteContext:
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    return RouteContext(
        model="llama3:latest", api="ollama", kind="chat", prompt=request_prompt("chat", "llama3:latest", body)
    )


def test_keys_name_whole_prefixes():
    a = prompt_keys("m", "x" * (3 * BLOCK_CHARS) + "tail a")
    b = prompt_keys("m", "x" * (3 * BLOCK_CHARS) + "tail b")
    c = prompt_keys("m", "y" + "x" * (3 * BLOCK_CHARS))
    assert a.keys[:3] == b.keys[:3] and a.keys[3] != b.keys[3]  # own tails differ
    assert not set(a.keys) & set(c.keys)  # a different first block changes every key
    assert prompt_keys("other", "x" * BLOCK_CHARS).keys != prompt_keys("m", "x" * BLOCK_CHARS).keys
    assert a.tokens == (3 * BLOCK_CHARS + 6 + 3) // 4


def test_index_matches_per_endpoint_and_forgets_in_lru_order():
    idx = PrefixIndex({"a": 4 * BLOCK_TOKENS, "b": 100 * BLOCK_TOKENS})
    p = prompt_keys("m", "p" * (3 * BLOCK_CHARS))
    q = prompt_keys("m", "q" * (3 * BLOCK_CHARS))
    idx.insert("a", p.keys)
    idx.insert("b", p.keys[:2])
    assert idx.match(p.keys, ["a", "b", "c"]) == {"a": 3, "b": 2, "c": 0}
    idx.insert("a", q.keys)  # a holds 4 blocks: p's oldest two go
    assert idx.blocks("a") == 4
    assert idx.match(p.keys, ["a"]) == {"a": 0}
    assert idx.match(q.keys, ["a", "b"]) == {"a": 3, "b": 0}
    idx.clear("a")
    assert idx.match(q.keys, ["a"]) == {"a": 0} and idx.match(p.keys, ["b"]) == {"b": 2}
    idx.remove("b", p.keys[1:2])
    assert idx.match(p.keys, ["b"]) == {"b": 1}


def test_cost_policy_follows_the_cache_until_waiting_costs_more_than_prefill():
    a, b, c = eps(3)
    pol = CacheAware(PrefixIndex(), random.Random(1), prior_s_per_token=5e-4)  # 2.4k tokens: 1.2 s
    first = chat_ctx(SYSTEM, "first question")
    load = {"e0": 0, "e1": 0, "e2": 0}
    assert pol.pick(first, [a, b, c], lambda e: load[e.name]) is None  # nothing cached: least busy
    pol.routed(first, b)
    ctx = chat_ctx(SYSTEM, "another user's question")
    load = {"e0": 0, "e1": 1, "e2": 0}
    targets, wait = pol.pick(ctx, [a, b, c], lambda e: load[e.name])
    # b has a free slot: the store takes it at once; had another worker just taken it,
    # the request would wait for b rather than prefill elsewhere
    assert targets == [b] and 1.0 < wait < 1.25 and ctx.cached_tokens > 2000
    # b is full and one request waits for it (~0.5 s each at the 1 s prior hold): still worth it
    load["e1"] = 2
    targets, wait = pol.pick(ctx, [a, b, c], lambda e: load[e.name])
    assert targets == [b] and 1.0 < wait < 1.25  # worth waiting while wait + its prefill < 1.2 s
    load["e1"] = 6  # a long queue: prefilling elsewhere is faster, the prefix replicates
    (target,), wait = pol.pick(ctx, [a, b, c], lambda e: load[e.name])
    assert target in (a, c) and wait == 0.0
    # unique prompts: nothing to gain, the store's least-busy choice decides
    assert pol.pick(chat_ctx("x" * 5000, "u"), [a, b, c], lambda e: load[e.name]) is None
    assert (
        pol.choose(RouteContext("llama3:latest", "ollama", "chat"), [a, c], lambda e: {"e0": 1, "e2": 0}[e.name]) is c
    )


def test_cost_policy_learns_the_prefill_rate_from_observed_first_bytes():
    (a,) = eps(1)
    pol = CacheAware(PrefixIndex(), prior_s_per_token=1e-3)
    for i in range(40):
        ctx = chat_ctx(str(i) * 4000, "q")
        ctx.cached_tokens = 0 if i % 2 else ctx.prompt.tokens - 10
        uncached = ctx.prompt.tokens - ctx.cached_tokens
        pol.observe(ctx, a, 0.02 + 25e-6 * uncached, 0.2)
    assert pol.rate("e0") == pytest.approx(25e-6, rel=0.05)
    assert pol.rate("unseen") == pytest.approx(25e-6, rel=0.05)  # pooled over endpoints


def test_sglang_reference_thresholds():
    a, b = eps(2)
    pol = SGLangCacheAware(cache_threshold=0.5, balance_abs_threshold=4, balance_rel_threshold=1.5)
    ctx = chat_ctx(SYSTEM, "q1")
    load = {"e0": 0, "e1": 0}
    (first,), _ = pol.pick(ctx, [a, b], lambda e: load[e.name])
    assert first is a  # a miss goes to the smallest tree (both empty: the first)
    pol.routed(ctx, a)
    ctx2 = chat_ctx(SYSTEM, "q2")
    assert pol.pick(ctx2, [a, b], lambda e: load[e.name])[0] == [a]  # match rate > threshold
    load = {"e0": 3, "e1": 0}
    assert pol.pick(ctx2, [a, b], lambda e: load[e.name])[0] == [a]  # below abs threshold: still a
    load = {"e0": 9, "e1": 2}
    assert pol.pick(ctx2, [a, b], lambda e: load[e.name])[0] == [b]  # imbalanced: least loaded
    other = chat_ctx("z" * 9000, "q")
    assert pol.pick(other, [a, b], lambda e: {"e0": 0, "e1": 0}[e.name])[0] == [b]  # smaller tree


def test_config_routing_and_endpoint_cache_keys():
    cfg = parse_config(
        {"endpoints": [{"url": "http://127.0.0.1:1", "kv_cache_tokens": 65536, "kv_events": "tcp://127.0.0.1:5557"}]}
    )
    assert cfg.routing == "cache_aware" and cfg.endpoints[0].kv_cache_tokens == 65536
    assert isinstance(make_policy(cfg.routing, {"x": 1}), CacheAware)
    for bad, key in (
        ({"routing": "fastest"}, "routing"),
        ({"endpoints": [{"url": "http://127.0.0.1:1", "kv_cache_tokens": -1}]}, "kv_cache_tokens"),
        ({"endpoints": [{"url": "http://127.0.0.1:1", "kv_events": "5557"}]}, "kv_events"),
    ):
        with pytest.raises(ConfigError, match=key):
            parse_config({"endpoints": ["http://127.0.0.1:1"], **bad})


async def test_shared_prefix_goes_where_it_is_cached_through_the_router():
    async with run_mock(**FAST) as m0, run_mock(**FAST) as m1, run_mock(**FAST) as m2:
        cfg = {"endpoints": endpoints(m0, m1, m2, slots=4)}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            seen = []
            for i in range(9):
                body = {
                    "model": "llama3",
                    "stream": False,
                    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"user {i} asks"}],
                }
                async with s.post(r.url + "/api/chat", json=body) as resp:
                    assert resp.status == 200
                    await resp.read()
                    seen.append((resp.headers["X-Router-Endpoint"], resp.headers["X-Router-Cache"]))
            home = seen[0][0]
            assert all(ep == home for ep, _ in seen)
            assert seen[0][1].startswith("0/")
            cached, total = map(int, seen[1][1].split("/"))
            assert cached >= total - BLOCK_TOKENS and total > 2000
            mocks = {"m0": m0, "m1": m1, "m2": m2}
            assert mocks[home].stats()["kv_cache"]["hits"] == 8  # the backend really had it


async def test_workers_share_the_index_through_the_shared_store(tmp_path):
    """Two processes' worth of stores on one coordinator: an insert in one is applied in the other."""
    endpoints_ = eps(2)
    base = str(tmp_path / "state")
    pol_a, pol_b = CacheAware(PrefixIndex()), CacheAware(PrefixIndex())
    a = WorkerStore(base, endpoints_, 100, 600, 1000, picker(pol_a))
    b = WorkerStore(base, endpoints_, 100, 600, 1000, picker(pol_b))
    from nomyo_router.runtime.router import share_index

    share_index(pol_a, a)
    share_index(pol_b, b)
    await a.start()
    await b.start()
    try:
        ctx = chat_ctx(SYSTEM, "hello")
        pol_a.routed(ctx, endpoints_[1])
        for _ in range(100):
            if pol_b.index.match(ctx.prompt.keys, ["e0", "e1"])["e1"]:
                break
            await asyncio.sleep(0.01)
        assert pol_b.index.match(ctx.prompt.keys, ["e0", "e1"]) == {"e0": 0, "e1": len(ctx.prompt.keys)}
        # the host tells each grant's load over all workers
        lease = await a.acquire(
            Ask(model="llama3:latest", candidates=endpoints_, choose=lambda free: free[0], timeout=1.0)
        )
        lease2 = await b.acquire(
            Ask(model="llama3:latest", candidates=endpoints_[:1], choose=lambda free: free[0], timeout=1.0)
        )
        assert b.in_flight(endpoints_[0]) == (2 if lease.endpoint is endpoints_[0] else 1)
        lease.release()
        lease2.release()
    finally:
        await b.close()
        await a.close()


def test_memory_store_publish_is_a_no_op():
    store, heard = MemoryStore(10), []
    store.subscribe("prefix", heard.append)
    assert store.publish("prefix", ["e0", [1, 2]]) is None  # one process: nobody to tell
    assert heard == []  # (and no echo to its own subscribers: the index already has it)


def test_loadtest_prefix_groups_share_system_prompts_and_skew():
    from loadtest.prefix import Prefixes
    from loadtest.workload import Conversation, WorkloadSpec

    spec = WorkloadSpec(prefixes=Prefixes(4, 500, skew=2.0, seed=1))
    assert spec.conversational
    systems = [Conversation(spec, 0, i).messages[0]["content"] for i in range(200)]
    assert len(set(systems)) == 4 and len(systems[0]) == 2000
    assert systems.count(spec.prefixes.texts[0]) > 100  # weight 1 of 1 + 1/4 + 1/9 + 1/16
    assert len({Conversation(spec, 0, i).messages[1]["content"] for i in range(5)}) == 5  # own question


async def test_precise_mode_follows_the_backends_kv_events():
    """The mock publishes vLLM-format KV events over ZMQ; the router's index for that
    endpoint shrinks to what the backend still holds when it evicts, and empties on a clear."""
    from mock import free_port

    addr = f"tcp://127.0.0.1:{free_port()}"
    async with run_mock(**FAST, kv_cache_tokens=4096, kv_events=addr) as m:
        eps_ = endpoints(m, slots=4, kv_cache_tokens=1_000_000, kv_events=addr)
        async with run_router({"endpoints": eps_}) as r, aiohttp.ClientSession() as s:
            state = r.router.kv_states["m0"]
            index = r.router.scheduler.policy.index

            async def ask(text):
                body = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": text}]}
                async with s.post(r.url + "/api/chat", json=body) as resp:
                    assert resp.status == 200
                    await resp.read()

            await ask("warm " * 2000)  # ZMQ subscriptions join asynchronously: wait for the first batch
            for _ in range(200):
                if state.batches:
                    break
                await asyncio.sleep(0.02)
                await ask(f"warm {_} " * 2000)
            assert state.batches and state.block_size == 64
            for i in range(6):  # 6 x ~2.5k tokens of unique prompts into a 4k-token cache
                await ask(f"document {i} " * 800)
            await asyncio.sleep(0.2)
            assert 0 < state.backend_tokens <= 4096
            assert index.blocks("m0") * BLOCK_TOKENS <= state.backend_tokens + BLOCK_TOKENS
            async with s.post(m.url + "/mock/reset") as resp:
                assert resp.status == 200
            for _ in range(100):
                if not index.blocks("m0"):
                    break
                await asyncio.sleep(0.02)
            assert index.blocks("m0") == 0 and state.backend_tokens == 0


async def test_instances_share_the_index_through_redis(redis_url):
    """A shared prefix routed by instance 1 is found by instance 2 (Redis pub/sub)."""
    async with run_mock(**FAST) as a, run_mock(**FAST) as b, run_mock(**FAST) as c:
        cfg = {"endpoints": endpoints(a, b, c, slots=4), "state": redis_url}
        async with run_router(cfg) as r1, run_router(cfg) as r2, aiohttp.ClientSession() as s:

            async def ask(r, i):
                body = {
                    "model": "llama3",
                    "stream": False,
                    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"q{i}"}],
                }
                async with s.post(r.url + "/api/chat", json=body) as resp:
                    assert resp.status == 200
                    await resp.read()
                    return resp.headers["X-Router-Endpoint"], resp.headers["X-Router-Cache"]

            home, _ = await ask(r1, 0)
            index2 = r2.router.scheduler.policy.index
            for _ in range(100):
                if index2.blocks(home):
                    break
                await asyncio.sleep(0.02)
            seen = [await ask(r2, i) for i in range(1, 6)]
            assert all(ep == home for ep, _ in seen)
            assert all(not cache.startswith("0/") for _, cache in seen)


def test_whole_answers_teach_the_rate_when_no_stream_is_seen():
    (a,) = eps(1)
    pol = CacheAware(PrefixIndex(), prior_s_per_token=1e-3)
    rng = random.Random(2)
    for i in range(200):
        ctx = chat_ctx(str(i) * 4000, "q")
        ctx.cached_tokens = 0 if i % 2 else ctx.prompt.tokens - 10
        uncached = ctx.prompt.tokens - ctx.cached_tokens
        pol.observe(ctx, a, None, 0.3 + rng.uniform(0, 0.05) + 25e-6 * uncached)  # + decode noise
    assert pol.rate("e0") == pytest.approx(25e-6, rel=0.25)


def test_index_counts_shared_blocks_apart_from_tails():
    idx = PrefixIndex({"a": 100 * BLOCK_TOKENS, "b": 100 * BLOCK_TOKENS})
    first = prompt_keys("m", "p" * (3 * BLOCK_CHARS) + "tail 1")
    second = prompt_keys("m", "p" * (3 * BLOCK_CHARS) + "tail 2")
    idx.insert("a", first.keys)
    assert idx.shared_blocks("a") == 0  # sent once: could be one request's own
    idx.insert("a", second.keys)
    assert idx.shared_blocks("a") == 3  # the common prefix, not the two tails
    idx.insert("b", first.keys[:3])
    assert idx.shared_blocks("b") == 3  # held by another endpoint too: a shared prefix
    idx.remove("a", first.keys[:1])
    idx.evict("b", 2)
    assert idx.shared_blocks("a") == 2 and idx.shared_blocks("b") == 1
    idx.clear("a")
    assert idx.shared_blocks("a") == 0


def test_full_homes_are_waited_for_together_until_the_waits_pay_for_a_replica():
    a, b, c = eps(3, slots=2)
    pol = CacheAware(
        PrefixIndex({e.name: 200 * BLOCK_TOKENS for e in (a, b, c)}), random.Random(1), prior_s_per_token=1e-4
    )  # SYSTEM: ~2.4k tokens, 0.24 s to prefill
    for home in (a, b):
        pol.routed(chat_ctx(SYSTEM, f"warm {home.name}"), home)
    for e in (a, b, c):
        pol.observe(chat_ctx("short", "q"), e, None, 0.2)  # a request holds a slot ~0.2 s
    load = {"e0": 2, "e1": 2, "e2": 0}  # both homes full, one request each... none waiting yet
    replicated = 0
    for i in range(12):
        ctx = chat_ctx(SYSTEM, f"question {i}")
        targets, wait = pol.pick(ctx, [a, b, c], lambda e: load[e.name])
        if targets == [c]:
            replicated = i + 1
            assert wait == 0.0 and ctx.cached_tokens == 0
            break
        # wait for whichever home frees first, as long as that beats prefilling on c
        assert set(targets) == {a, b} and 0.2 < wait < 0.25
    # each waiter expects 0.1 s (1 over 2 slots x 0.2 s): ~3 of them pay for the 0.24 s prefill
    assert 2 <= replicated <= 4


def test_no_replica_where_it_would_evict_a_prefix_in_use():
    a, c = eps(2, slots=1)
    other = "Another application's long instructions. " * 250
    pol = CacheAware(
        PrefixIndex({"e0": 200 * BLOCK_TOKENS, "e1": 12 * BLOCK_TOKENS}), random.Random(1), prior_s_per_token=1e-4
    )
    pol.routed(chat_ctx(SYSTEM, "warm"), a)
    pol.routed(chat_ctx(other[: 2 * BLOCK_CHARS], "x"), c)
    pol.routed(chat_ctx(other[: 2 * BLOCK_CHARS], "y"), c)  # c's cache: a small prefix in use
    for e in (a, c):
        pol.observe(chat_ctx("short", "q"), e, None, 0.2)  # waiting (0.2 s) beats prefill (0.24 s)
    load = {"e0": 1, "e1": 0}
    for i in range(20):
        targets, _ = pol.pick(chat_ctx(SYSTEM, f"q{i}"), [a, c], lambda e: load[e.name])
        assert targets == [a]  # SYSTEM (9 blocks) + c's shared 2 leave c under 1/8 free
