"""resumed = fresh: a prompt resumed from the prompt cache gives the bytes of a fresh run."""

from engine_util import finish_prints, make_engine, sample_prompt

from tensorfold.engine.request import SamplingParams

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
MB = 1 << 20


def _cached_engine(path, budget=64 * MB, **kw):
    return make_engine(path, prompt_cache_bytes=budget, cache_every=256, context=4096, **kw)


def _run(engine, ids, params=GREEDY):
    prints = {}
    req = engine.add_request(ids, params, watch=finish_prints(engine, prints))
    engine.run_until_done()
    return req, prints[req.request_id]


def _fresh(path, ids, params=GREEDY):
    return _run(make_engine(path, context=4096), ids, params)


def test_same_long_prompt_twice_resumes_a_few_tokens_short(hf_tiny_b):
    ids = sample_prompt(20, 2100, 300)
    eng = _cached_engine(hf_tiny_b)
    first, fp1 = _run(eng, ids)
    second, fp2 = _run(eng, ids)
    assert first.cached_tokens == 0
    assert second.cached_tokens == 2096  # the last page boundary before the end
    fresh, fp_fresh = _fresh(hf_tiny_b, ids)
    assert first.output_ids == second.output_ids == fresh.output_ids
    assert fp1 == fp2 == fp_fresh  # states, KV rows and logits at the end


def test_resume_from_a_cut_in_the_middle_of_a_prompt(hf_tiny_b):
    shared = sample_prompt(21, 600, 300)
    eng = _cached_engine(hf_tiny_b, chunk=100)  # cuts at 256 and 512 fall inside 100-row passes
    _run(eng, shared + sample_prompt(22, 50, 300))
    other = shared + sample_prompt(23, 40, 300)
    req, fp = _run(eng, other)
    assert req.cached_tokens == 512
    fresh, fp_fresh = _fresh(hf_tiny_b, other)
    assert (req.output_ids, fp) == (fresh.output_ids, fp_fresh)


def test_three_turn_chat_resumes_after_each_reply(hf_tiny_b):
    eng = _cached_engine(hf_tiny_b)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    history = sample_prompt(24, 300, 300)
    previous_end = 0
    for turn in range(3):
        req, fp = _run(eng, history, params)
        fresh, fp_fresh = _fresh(hf_tiny_b, history, params)
        assert (req.output_ids, fp) == (fresh.output_ids, fp_fresh)
        if turn > 0:  # covers the previous prompt and its reply (all but the reply's last token)
            assert req.cached_tokens == previous_end
        previous_end = len(history) + len(req.output_ids) - 1
        history = history + req.output_ids + sample_prompt(25 + turn, 30, 300)


def test_shared_system_prompt_concurrent_and_staggered(hf_tiny_b):
    system = sample_prompt(30, 700, 300)
    prompts = [system + sample_prompt(31 + i, 20 + 7 * i, 300) for i in range(4)]
    fresh = [_fresh(hf_tiny_b, p)[0].output_ids for p in prompts]
    eng = _cached_engine(hf_tiny_b, parallel=4)
    _run(eng, system + [1, 2, 3])  # warms the shared prefix
    together = [eng.add_request(p, GREEDY) for p in prompts[:2]]
    eng.step()
    together += [eng.add_request(p, GREEDY) for p in prompts[2:]]
    eng.run_until_done()
    assert [r.output_ids for r in together] == fresh
    assert all(r.cached_tokens >= 512 for r in together)


def test_prefix_evicted_while_a_lane_reads_it(hf_tiny_b):
    ids = sample_prompt(40, 900, 300)
    eng = _cached_engine(hf_tiny_b)
    _run(eng, ids[:800])
    req = eng.add_request(ids, GREEDY)
    eng.step()  # admitted: resumed from the 800-token prefix
    assert req.cached_tokens > 0
    eng.prefix_cache.clear()  # every entry evicted mid-run
    eng.run_until_done()
    assert req.output_ids == _fresh(hf_tiny_b, ids)[0].output_ids
    eng.prefix_cache.clear()  # the reply's own entry; then no page is held
    assert eng.caches.kv.free_pages == eng.caches.kv.num_pages


def test_budget_is_never_exceeded_and_eviction_is_lru(hf_tiny_b):
    probe = make_engine(hf_tiny_b, prompt_cache_bytes=1)
    snapshot = probe.caches.states.snapshot(0).nbytes
    budget = 3 * (snapshot + 20 * probe.caches.kv.page_bytes)  # room for about three short entries
    eng = _cached_engine(hf_tiny_b, budget=budget)
    prompts = [sample_prompt(50 + i, 150, 300) for i in range(6)]
    for p in prompts:
        _run(eng, p, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        assert eng.prefix_cache.nbytes <= budget
    assert eng.prefix_cache.stats.evictions > 0
    kept = {e.tokens[:150] for es in eng.prefix_cache.entries.values() for e in es}
    assert tuple(prompts[-1]) in kept and tuple(prompts[0]) not in kept


def test_cache_off_reports_nothing(hf_tiny_b):
    eng = make_engine(hf_tiny_b)
    ids = sample_prompt(60, 100, 300)
    _run(eng, ids)
    req, _ = _run(eng, ids)
    assert req.cached_tokens == 0 and len(eng.prefix_cache) == 0


def test_chat_second_turn_over_http_covers_the_first_turn_and_its_reply():
    """With the demo model's template, a past turn re-renders exactly as it was generated."""
    from server_harness import start_server

    from tensorfold.demo import demo_checkpoint
    from tensorfold.engine.engine import Engine, EngineConfig
    from tensorfold.models.loader import load_model
    from tensorfold.tokenizer import Tokenizer

    path = demo_checkpoint()
    engine = Engine(
        load_model(path), Tokenizer(path), EngineConfig(context=1024, prompt_cache_bytes=64 * MB)
    )
    server = start_server(engine, name="demo")
    try:
        client = server.openai()
        for thinking in (False, True):
            extra = {"chat_template_kwargs": {"enable_thinking": thinking}}
            messages = [{"role": "user", "content": f"What is 17 × 2{int(thinking)}?"}]
            first = client.chat.completions.create(
                model="demo", messages=messages, temperature=0, max_tokens=96, extra_body=extra
            )
            said = first.choices[0].message  # the trace goes back as reasoning_content
            trace = (said.model_extra or {}).get("reasoning_content")
            messages += [
                {"role": "assistant", "content": said.content, "reasoning_content": trace},
                {"role": "user", "content": "Reverse the word planet."},
            ]
            second = client.chat.completions.create(
                model="demo", messages=messages, temperature=0, max_tokens=8, extra_body=extra
            )
            covered = first.usage.prompt_tokens + first.usage.completion_tokens - 1
            assert second.usage.prompt_tokens_details.cached_tokens == covered
    finally:
        server.stop()


def test_metrics_and_memory_report_the_cache_within_a_small_budget(hf_tiny):
    from server_harness import make_engine as server_engine
    from server_harness import metric, start_server

    budget = MB // 2
    server = start_server(server_engine(hf_tiny, prompt_cache_bytes=budget), name="tiny")
    try:
        client = server.client()
        for i in range(6):
            ids = sample_prompt(80 + i, 120, 500)
            for _ in range(2):
                body = {"model": "tiny", "prompt": ids, "max_tokens": 2, "temperature": 0}
                assert client.post("/v1/completions", json=body).status_code == 200
            memory = client.get("/memory").json()
            assert memory["prompt_cache_bytes"] <= memory["prompt_cache_budget_bytes"] == budget
        text = server.metrics()
        assert metric(text, "tensorfold_prompt_cache_hits_total") >= 6
        assert metric(text, "tensorfold_prompt_cache_misses") >= 6
        assert metric(text, "tensorfold_prompt_cache_evictions") > 0
        assert 0 < metric(text, "tensorfold_prompt_cache_bytes") <= budget
    finally:
        server.stop()
