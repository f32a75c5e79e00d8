"""The offline API drives the same engine: LLM.generate gives each prompt its solo tokens."""

from engine_util import generate, make_engine, sample_prompt

from tensorfold import LLM, SamplingParams


def test_generate_more_prompts_than_the_queue_holds(hf_tiny):
    llm = LLM(hf_tiny, parallel=2, max_queue=2, context=512)
    prompts = [sample_prompt(70 + i, 10 + i, 500) for i in range(7)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [
        generate(make_engine(hf_tiny), p, params) for p in prompts
    ]
    assert all(o.outputs[0].finish_reason == "length" for o in outs)


def test_n_choices_and_text_prompts(hf_tiny):
    llm = LLM(hf_tiny, context=512)
    params = SamplingParams(max_tokens=5, temperature=0.9, seed=3, ignore_eos=True)
    out = llm.generate("The capital of", params, n=2)[0]
    assert out.prompt == "The capital of" and len(out.outputs) == 2
    assert out.outputs[0].token_ids != out.outputs[1].token_ids  # each choice draws its own numbers
    again = llm.generate("The capital of", params, n=2)[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]
