"""Conversation affinity: header and header-less continuation, branches, edits, TTL/LRU,
spill and re-pin, unhealthy pins, and affinity turned off."""

from __future__ import annotations

import asyncio

import aiohttp

from mock import run_mock
from nomyo_router.routing.affinity import chat_keys, prompt_keys
from test.conftest import FAST
from test.helpers import endpoints, run_router


async def turn(s, url, messages, headers=None, model="llama3"):
    async with s.post(
        url + "/api/chat", json={"model": model, "messages": messages, "stream": False}, headers=headers or {}
    ) as r:
        assert r.status == 200, await r.text()
        body = await r.json()
        return body["message"], r.headers["X-Router-Endpoint"], r.headers.get("X-Router-Affinity")


async def converse(s, url, turns, opening, headers=None):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": opening}]
    seen = []
    for i in range(turns):
        answer, ep, aff = await turn(s, url, msgs, headers)
        seen.append((ep, aff))
        msgs = msgs + [answer, {"role": "user", "content": f"and then {i}?"}]
    return seen, msgs


async def test_header_less_and_header_continuation_over_ten_turns():
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        async with run_router({"endpoints": endpoints(a, b)}) as r, aiohttp.ClientSession() as s:
            for with_header in (False, True):
                for n in range(4):
                    headers = {"X-Session-ID": f"conv-{n}"} if with_header else None
                    seen, _ = await converse(s, r.url, 10, f"conversation {n} {with_header}", headers)
                    assert seen[0][1] == "miss"
                    assert [aff for _, aff in seen[1:]] == ["hit"] * 9
                    assert len({ep for ep, _ in seen}) == 1
            assert r.router.store.pin_count() > 0


async def test_shared_system_prompt_is_not_the_same_conversation_and_branches_continue():
    msgs = [{"role": "system", "content": "a long shared system prompt " * 50}]
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        async with run_router({"endpoints": endpoints(a, b)}) as r, aiohttp.ClientSession() as s:
            affs = [(await turn(s, r.url, msgs + [{"role": "user", "content": f"q{i}"}]))[2] for i in range(6)]
            assert affs == ["miss"] * 6
            base = msgs + [{"role": "user", "content": "shared question"}]
            answer, ep0, _ = await turn(s, r.url, base)
            for branch in ("left", "right"):
                _, ep, aff = await turn(s, r.url, base + [answer, {"role": "user", "content": branch}])
                assert (ep, aff) == (ep0, "hit")


async def test_an_edited_earlier_message_is_not_a_hit():
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        async with run_router({"endpoints": endpoints(a, b)}) as r, aiohttp.ClientSession() as s:
            _, msgs = await converse(s, r.url, 3, "original opening")
            edited = [dict(m) for m in msgs]
            edited[1]["content"] = "edited opening"
            assert (await turn(s, r.url, edited))[2] == "miss"
            edited = [dict(m) for m in msgs]
            edited[2]["content"] = "a rewritten first answer"
            assert (await turn(s, r.url, edited))[2] == "miss"
            assert (await turn(s, r.url, msgs))[2] == "hit"  # the unedited one still continues


async def test_pins_expire_after_ttl_and_are_lru_bounded():
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        cfg = {"endpoints": endpoints(a, b), "affinity_ttl": 0.3, "affinity_max_pins": 2}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            opening = [{"role": "user", "content": "ttl"}]
            answer, _, _ = await turn(s, r.url, opening)
            follow = opening + [answer, {"role": "user", "content": "more"}]
            await asyncio.sleep(0.5)
            assert (await turn(s, r.url, follow))[2] == "miss"  # expired while idle
            firsts = []
            for i in range(3):
                m = [{"role": "user", "content": f"lru {i}"}]
                firsts.append(m + [(await turn(s, r.url, m))[0], {"role": "user", "content": "next"}])
            assert r.router.store.pin_count() == 2
            assert (await turn(s, r.url, firsts[0]))[2] == "miss"  # evicted, least recently used
            assert (await turn(s, r.url, firsts[2]))[2] == "hit"


async def test_spill_when_the_pinned_endpoint_is_full_then_repin():
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        mocks = {"m0": a, "m1": b}
        cfg = {"endpoints": endpoints(a, b, slots=1), "affinity_wait_ms": 50}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            opening = [{"role": "user", "content": "spill"}]
            answer, home, _ = await turn(s, r.url, opening)
            follow = opening + [answer, {"role": "user", "content": "go on"}]
            mocks[home].update(ttft_ms=600.0)  # the pinned endpoint becomes slow and full
            first = asyncio.create_task(turn(s, r.url, follow))
            await asyncio.sleep(0.05)
            answer2, ep2, aff2 = await turn(s, r.url, follow)
            assert aff2 == "spill" and ep2 != home
            assert (await first)[1:] == (home, "hit")
            mocks[home].update(ttft_ms=0.0)
            _, ep3, aff3 = await turn(s, r.url, follow + [answer2, {"role": "user", "content": "again"}])
            assert (ep3, aff3) == (ep2, "hit")  # re-pinned where it spilled


async def test_a_pin_to_an_unhealthy_endpoint_is_dropped():
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        mocks = {"m0": a, "m1": b}
        async with (
            run_router({"endpoints": endpoints(a, b), "health_interval": 0.1}) as r,
            aiohttp.ClientSession() as s,
        ):
            opening = [{"role": "user", "content": "sick"}]
            answer, home, _ = await turn(s, r.url, opening)
            await mocks[home].close()
            await asyncio.sleep(0.3)
            _, ep, aff = await turn(s, r.url, opening + [answer, {"role": "user", "content": "still there?"}])
            assert aff == "repin" and ep != home


async def test_affinity_off_balances_turns_and_sends_no_header():
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        cfg = {"endpoints": endpoints(a, b), "conversation_affinity": False}
        async with run_router(cfg) as r, aiohttp.ClientSession() as s:
            seen, _ = await converse(s, r.url, 12, "no affinity")
    assert {aff for _, aff in seen} == {None}
    assert {ep for ep, _ in seen} == {"m0", "m1"}


def test_keys_are_exact_continuations():
    s = {"role": "system", "content": "sys"}
    u1, a1, u2 = (
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
    )
    t1, t2 = chat_keys("m", [s, u1]), chat_keys("m", [s, u1, a1, u2])
    assert t2.lookup == [t1.register] and t1.lookup == []
    assert chat_keys("other", [s, u1, a1, u2]).lookup[0] != t1.register  # models never mix
    assert chat_keys("m", [s]) is None
    assert chat_keys("m", [s, {"role": "user", "content": "u1 "}, a1, u2]).lookup[0] != t1.register
    p1 = prompt_keys("m", "x" * 3000)
    assert p1.register in prompt_keys("m", "x" * 3000 + "answer and more" * 100).lookup
    assert prompt_keys("m", "short") is None


async def test_generate_continues_by_prompt_prefix():
    async with run_mock(**FAST) as a, run_mock(**FAST) as b:
        async with run_router({"endpoints": endpoints(a, b)}) as r, aiohttp.ClientSession() as s:
            prompt = "A long document. " * 200
            outcomes = []
            for i in range(5):
                async with s.post(
                    r.url + "/api/generate", json={"model": "llama3", "prompt": prompt, "stream": False}
                ) as resp:
                    body = await resp.json()
                    outcomes.append((resp.headers["X-Router-Endpoint"], resp.headers["X-Router-Affinity"]))
                prompt = prompt + body["response"] + f"\nQuestion {i}: and then?\n"
    assert outcomes[0][1] == "miss" and [o for _, o in outcomes[1:]] == ["hit"] * 4
    assert len({ep for ep, _ in outcomes}) == 1
