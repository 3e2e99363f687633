"""generation.decode=static: the pre-allocated-cache decode loop gives the dynamic loop's tokens and log-probs.

On CPU the static step runs eagerly (CUDA graphs need a GPU; tests/gpu replays them); the
bookkeeping it shares with the graph (cache columns, mask columns, position ids, bucket padding rows,
host syncs every few tokens, stop strings found after the fact) is what these tests pin down.
"""

import pytest
import torch

from nemo_azr.contracts.generation import GenerationRequest, SamplingParams
from nemo_azr.errors import ConfigError
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.rollout.hf_backend import HFGenerationBackend
from nemo_azr.rollout.single_turn import encode_prompt
from nemo_azr.rollout.static_decode import batch_bucket, cache_length


@pytest.fixture(scope="module")
def backends(tiny_model_path):
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa").float()
    dynamic = HFGenerationBackend(model, tok, decode="dynamic")
    static = HFGenerationBackend(model, tok, decode="static")
    static._uses_static_decode(torch.device("cpu"))
    static._static.sync_every = 3  # several host syncs inside a short reply
    grouped = HFGenerationBackend(model, tok, decode="static", grouped_attention=True)
    grouped._uses_static_decode(torch.device("cpu"))
    prompts = [
        encode_prompt(tok, [{"role": "user", "content": q}])
        for q in ("What is 1 + 2?", "Hi", "What is 17 + 28? Think.", "Name a colour")
    ]
    return tok, dynamic, static, prompts, grouped


def _run(backend, prompts, sp, seed=0):
    torch.manual_seed(seed)
    outs = backend.generate([GenerationRequest(p) for p in prompts], sp)
    return [s for o in outs for s in o.samples]


def test_bucket_and_cache_length_arithmetic():
    assert [batch_bucket(n) for n in (1, 8, 9, 16, 17, 512, 513)] == [8, 8, 16, 16, 32, 512, 1024]
    assert cache_length(10, 8) == 64 and cache_length(60, 5) == 128 and cache_length(64, 64) == 128


@pytest.mark.parametrize("n", [1, 3])
def test_greedy_tokens_and_logprobs_equal_the_dynamic_loop(backends, n):
    _tok, dynamic, static, prompts, _grouped = backends
    sp = SamplingParams(n=n, greedy=True, max_new_tokens=12)
    want, got = _run(dynamic, prompts, sp), _run(static, prompts, sp)
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    assert [s.finish_reason for s in got] == [s.finish_reason for s in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=1e-4, atol=1e-4)


def test_grouped_query_step_attention_gives_the_same_greedy_replies(backends):
    _tok, dynamic, _static, prompts, grouped = backends
    sp = SamplingParams(n=2, greedy=True, max_new_tokens=12)
    want, got = _run(dynamic, prompts, sp), _run(grouped, prompts, sp)
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=1e-4, atol=1e-4)


def test_sampled_rows_draw_the_same_tokens_under_one_seed(backends):
    """Same RNG stream per step (one uniform per row per token) -> the same samples on CPU."""
    _tok, dynamic, static, prompts, _grouped = backends
    sp = SamplingParams(n=4, temperature=0.7, top_p=0.9, max_new_tokens=10)
    want, got = _run(dynamic, prompts, sp, seed=3), _run(static, prompts, sp, seed=3)
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=1e-4, atol=1e-4)


def test_stop_strings_cut_at_the_same_token(backends):
    tok, dynamic, static, prompts, _grouped = backends
    free = _run(dynamic, prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=12), seed=5)
    # a stop string that some rows reach mid-reply: the text of a row's third token
    stop = tok.decode(free[0].token_ids[2:3]).strip() or tok.decode(free[0].token_ids[2:4])
    sp = SamplingParams(n=2, temperature=1.0, max_new_tokens=12, stop_strings=(stop,))
    want, got = _run(dynamic, prompts, sp, seed=5), _run(static, prompts, sp, seed=5)
    assert any(s.finish_reason == "stop" for s in want)
    assert [(s.token_ids, s.finish_reason) for s in got] == [(s.token_ids, s.finish_reason) for s in want]
    for s in got:
        if s.finish_reason == "stop":
            assert stop in s.text and stop not in tok.decode(s.token_ids[:-1], skip_special_tokens=True)


def test_a_shape_is_reused_across_calls_and_weight_syncs(backends):
    _tok, dynamic, static, prompts, _grouped = backends
    sp = SamplingParams(n=2, greedy=True, max_new_tokens=6)
    static.release()
    first = _run(static, prompts, sp)
    states = dict(static._static._states)
    assert len(states) == 1  # the static path ran: one (bucket, cache length, sampling) shape
    again = _run(static, prompts, sp)
    assert [s.token_ids for s in again] == [s.token_ids for s in first]
    assert all(static._static._states[k] is v for k, v in states.items())  # same buffers, no new shape
    static.release()
    assert not static._static._states


def test_decode_mode_is_checked(tiny_model_path):
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="sdpa")
    with pytest.raises(ConfigError, match="generation.decode='fast'"):
        HFGenerationBackend(model, tok, decode="fast")
    auto = HFGenerationBackend(model, tok, decode="auto")
    assert not auto._uses_static_decode(torch.device("cpu"))  # auto is static on CUDA only


@pytest.mark.parametrize("q", [1, 3])
@pytest.mark.parametrize("bool_mask", [True, False])
def test_grouped_query_decode_attention_equals_repeated_heads_sdpa(q, bool_mask):
    """The decode attention reads each KV head once for its query heads; the reference copies the KV
    heads per query head (transformers' repeat_kv) and runs torch's SDPA."""
    from nemo_azr.rollout.static_decode import gqa_decode_attention

    torch.manual_seed(0)
    b, h, kv, length, d = 2, 6, 2, 7, 4
    query, key, value = torch.randn(b, h, q, d), torch.randn(b, kv, length, d), torch.randn(b, kv, length, d)
    visible = torch.rand(b, 1, q, length) > 0.3
    visible[..., 0] = True
    mask = (
        visible
        if bool_mask
        else torch.zeros(b, 1, q, length).masked_fill(~visible, torch.finfo(torch.float32).min)
    )
    got, _ = gqa_decode_attention(None, query, key, value, mask, scaling=0.7)
    rep_k, rep_v = key.repeat_interleave(h // kv, dim=1), value.repeat_interleave(h // kv, dim=1)
    want = torch.nn.functional.scaled_dot_product_attention(query, rep_k, rep_v, attn_mask=visible, scale=0.7)
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_decode_reaches_hf_and_megatron_and_is_refused_for_a_backend_that_decodes_its_own_way():
    from nemo_azr.preflight import load_config
    from nemo_azr.rollout.hf_backend import backend_kwargs

    with pytest.raises(ConfigError, match="generation.decode=static is the hf and megatron backends'"):
        load_config(["generation.backend=trtllm", "generation.decode=static"])
    megatron = load_config(["model=megatron", "generation.backend=megatron", "generation.decode=static"])
    assert backend_kwargs(megatron.generation)["decode"] == "static"
    assert "grouped_attention" not in backend_kwargs(megatron.generation)  # the hf step's key only
    assert backend_kwargs(load_config(["generation.decode=dynamic"]).generation)["decode"] == "dynamic"


def test_decode_attention_key_reaches_the_hf_backend_and_is_checked():
    from nemo_azr.preflight import load_config
    from nemo_azr.rollout.hf_backend import backend_kwargs

    grouped = load_config(["generation.decode_attention=grouped"]).generation
    assert backend_kwargs(grouped)["grouped_attention"] is True
    assert (
        backend_kwargs(load_config(["generation.decode_attention=model"]).generation)["grouped_attention"]
        is False
    )
    assert backend_kwargs(load_config([]).generation)["grouped_attention"] is None  # auto: grouped on CUDA
    with pytest.raises(ConfigError, match="generation.decode_attention"):
        load_config(["generation.decode_attention=flash"])
    with pytest.raises(ConfigError, match="decode_attention=grouped is the hf backend's"):
        load_config(["model=megatron", "generation.backend=megatron", "generation.decode_attention=grouped"])
