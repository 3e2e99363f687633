"""Megatron-core GPT model built from HF Llama / Qwen2 configs (one process, world size 1, CPU/gloo).

The HF model is the reference: logits, padded-batch token log-probs and their gradients must match
it, and HF -> megatron shards -> HF must give back every tensor bit for bit, for every TP/PP rank.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from transformers import AutoModelForCausalLM  # noqa: E402

from nemo_azr.config.schema import TinyModelConfig  # noqa: E402
from nemo_azr.contracts.assemble import pack_prompt_response  # noqa: E402
from nemo_azr.distributed.parallel import ParallelLayout, destroy_parallel, initialize_parallel  # noqa: E402
from nemo_azr.errors import ConfigError  # noqa: E402
from nemo_azr.models.megatron import (  # noqa: E402
    build_gpt_model,
    check_layout_fits,
    hf_to_megatron,
    megatron_to_hf,
    megatron_token_logprobs,
    padded_vocab_size,
)
from nemo_azr.models.tiny import ensure_tiny_model  # noqa: E402

ATOL = 1e-5
LAYOUT = ParallelLayout()


@pytest.fixture(scope="module")
def parallel():
    # Seeding megatron reseeds torch's global generator: keep that from leaking into other tests.
    with torch.random.fork_rng(devices=[]):
        initialize_parallel(LAYOUT, seed=0)
        yield
        destroy_parallel()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def pair(request, tiny_cache, parallel):
    """(HF model, megatron model with the HF weights); qwen2 untied with random QKV biases."""
    family = request.param
    cfg = TinyModelConfig(family=family, cache_dir=tiny_cache, tie_word_embeddings=family == "llama")
    hf = AutoModelForCausalLM.from_pretrained(str(ensure_tiny_model(cfg)), dtype=torch.float32).eval()
    if family == "qwen2":  # HF initialises biases to 0: make them count
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for name, p in hf.named_parameters():
                if name.endswith("bias"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model = build_gpt_model(hf.config, LAYOUT).eval()
    shard = hf_to_megatron(hf.state_dict(), hf.config, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
    missing, unexpected = model.load_state_dict(shard, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    return hf, model


def padded_batch(vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in (4, 1, 6)]
    responses = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in (3, 6, 0)]
    return pack_prompt_response(prompts, responses, None, pad_id=0)


def hf_token_logprobs(hf, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Reference: column t = log p(token t | real tokens < t); 0 where t or t-1 is padding."""
    ids, attn = batch["input_ids"], batch["attention_mask"]
    logits = hf(input_ids=ids, attention_mask=attn, position_ids=batch["position_ids"]).logits
    lp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    valid = (attn[:, 1:] > 0) & (attn[:, :-1] > 0)
    return torch.nn.functional.pad(lp * valid, (1, 0))


def test_logits_match_hf(pair):
    hf, model = pair
    vocab = hf.config.vocab_size
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(input_ids=ids).logits
        got = model(ids, torch.arange(12).expand(2, 12), None)
    assert got.shape[-1] == padded_vocab_size(vocab, LAYOUT) > vocab
    torch.testing.assert_close(got[..., :vocab], want, atol=ATOL, rtol=0)
    # Megatron's padded rows give logit 0: the log-prob path must leave them out of the softmax.
    assert torch.count_nonzero(got[..., vocab:]) == 0


def test_token_logprobs_match_hf_on_padded_batch(pair):
    hf, model = pair
    batch = padded_batch(hf.config.vocab_size)
    with torch.no_grad():
        want = hf_token_logprobs(hf, batch)
        got = megatron_token_logprobs(
            model, batch["input_ids"], batch["attention_mask"], batch["position_ids"]
        )
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    assert torch.count_nonzero(got[batch["attention_mask"] == 0]) == 0


def test_target_mask_runs_the_head_on_the_masked_columns_only(pair, monkeypatch):
    """``target_mask`` (the response tokens): the same values as the full pass there, 0 elsewhere,
    and only those positions reach the output head and the log-prob kernel."""
    import nemo_azr.models.megatron.logprobs as mlp

    hf, model = pair
    batch = padded_batch(hf.config.vocab_size)
    mask = batch["loss_mask"]
    seen = []
    kernel = mlp.linear_token_logprobs
    monkeypatch.setattr(
        mlp, "linear_token_logprobs", lambda h, *a, **k: seen.append(len(h)) or kernel(h, *a, **k)
    )
    with torch.no_grad():
        full = megatron_token_logprobs(
            model, batch["input_ids"], batch["attention_mask"], batch["position_ids"]
        )
        got = megatron_token_logprobs(
            model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], target_mask=mask
        )
    torch.testing.assert_close(got, full * mask, atol=ATOL, rtol=0)
    assert torch.count_nonzero(got[mask == 0]) == 0
    # rows (4+3, 1+6, 6+0 tokens): 6 + 6 + 5 targets in all; 3 + 6 + 0 response tokens
    assert seen == [17, 9] and int(mask.sum()) == 9


def test_trimmed_micro_batch_ends_at_its_last_target():
    """A token-budget micro-batch keeps the columns up to its last wanted target (a causal model's
    later columns change none of them); with every real token wanted that is its longest row."""
    from nemo_azr.models.megatron.logprobs import compact_rows, take_rows

    ids = torch.arange(1, 13).view(2, 6)
    attn = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0]])
    wanted = torch.tensor([[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 0, 0]])
    every = take_rows(compact_rows(ids, attn), torch.tensor([0, 1]), trim=True)
    assert every.input_ids.shape == (2, 6)
    some = take_rows(compact_rows(ids, attn, target_mask=wanted), torch.tensor([0, 1]), trim=True)
    assert some.input_ids.tolist() == [[1, 2, 3, 4], [9, 10, 11, 0]]
    assert some.targets.tolist() == [[False, True, True], [True, False, False]]
    none = take_rows(
        compact_rows(ids, attn, target_mask=torch.zeros_like(wanted)), torch.tensor([1]), trim=True
    )
    assert none.input_ids.shape == (1, 1) and none.targets.shape == (1, 0)


def test_token_logprobs_gradient_matches_hf(pair):
    """Without pipeline parallelism the log-probs are differentiable (the training path)."""
    hf, model = pair
    batch = padded_batch(hf.config.vocab_size)
    hf.zero_grad()
    model.zero_grad()
    hf_token_logprobs(hf, batch).sum().backward()
    megatron_token_logprobs(
        model, batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    ).sum().backward()
    vocab = hf.config.vocab_size
    assert torch.count_nonzero(model.embedding.word_embeddings.weight.grad[vocab:]) == 0  # padding rows
    torch.testing.assert_close(
        model.embedding.word_embeddings.weight.grad[:vocab],
        hf.model.embed_tokens.weight.grad,
        atol=ATOL,
        rtol=0,
    )
    torch.testing.assert_close(
        model.decoder.layers[0].mlp.linear_fc2.weight.grad,
        hf.model.layers[0].mlp.down_proj.weight.grad,
        atol=ATOL,
        rtol=0,
    )


def test_position_ids_must_count_real_tokens(pair):
    hf, model = pair
    batch = padded_batch(hf.config.vocab_size)
    with pytest.raises(ValueError, match="position_ids"):
        megatron_token_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"] + 1)


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (1, 2), (2, 2), (4, 1)])
def test_hf_megatron_hf_round_trip_is_bit_exact(pair, tp, pp):
    hf, model = pair
    sd = {
        k: v
        for k, v in hf.state_dict().items()
        if not (hf.config.tie_word_embeddings and k == "lm_head.weight")
    }
    shards = [
        [hf_to_megatron(sd, hf.config, tp_rank=t, tp_size=tp, pp_rank=p, pp_size=pp) for t in range(tp)]
        for p in range(pp)
    ]
    back = megatron_to_hf(shards, hf.config)
    assert back.keys() == sd.keys()
    assert all(torch.equal(back[k], sd[k]) for k in sd)
    if tp == pp == 1:  # the shard has exactly the built model's parameters and shapes
        params = {k: v.shape for k, v in model.state_dict().items() if not k.endswith("_extra_state")}
        assert {k: v.shape for k, v in shards[0][0].items()} == params


#: SmolLM2-135M's attention shape on the tiny model: 9 query heads in 3 kv groups, tied embeddings.
GQA_TINY = {"num_heads": 9, "num_kv_heads": 3, "hidden_size": 72, "intermediate_size": 144}


@pytest.fixture(scope="module")
def gqa_hf(tiny_cache):
    cfg = TinyModelConfig(**GQA_TINY, cache_dir=tiny_cache)
    hf = AutoModelForCausalLM.from_pretrained(str(ensure_tiny_model(cfg)), dtype=torch.float32).eval()
    assert (hf.config.num_attention_heads, hf.config.num_key_value_heads, hf.config.head_dim) == (9, 3, 8)
    assert hf.config.tie_word_embeddings
    return hf


@pytest.mark.parametrize("tp,pp", [(3, 1), (1, 2), (3, 2)])
def test_gqa_odd_heads_tied_round_trip_is_bit_exact(gqa_hf, tp, pp):
    """9 query heads / 3 kv heads at TP=3: each rank's fused QKV is one whole query group (its 3 query
    heads, then its k and v head), the vocabulary is padded to a multiple of 128 x 3 with zero rows,
    and HF -> megatron -> HF gives every tensor back bit for bit (the tied lm_head left out)."""
    hf = gqa_hf
    sd = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    shards = [
        [hf_to_megatron(sd, hf.config, tp_rank=t, tp_size=tp, pp_rank=p, pp_size=pp) for t in range(tp)]
        for p in range(pp)
    ]
    back = megatron_to_hf(shards, hf.config)
    assert back.keys() == sd.keys()
    assert all(torch.equal(back[k], sd[k]) for k in sd)
    vocab, d = hf.config.vocab_size, 8  # head dim
    padded = padded_vocab_size(vocab, ParallelLayout(tp=tp))
    assert padded % (128 * tp) == 0 and padded - 128 * tp < vocab <= padded
    for t, shard in enumerate(shards[0]):
        rows = shard["embedding.word_embeddings.weight"]
        assert rows.shape == (padded // tp, hf.config.hidden_size)
        want = torch.cat([sd["model.embed_tokens.weight"], torch.zeros(padded - vocab, rows.shape[1])])
        assert torch.equal(rows, want.chunk(tp)[t])
        if tp == 3:  # rank t holds kv group t: q heads 3t..3t+2, then k head t, then v head t
            attn = "model.layers.0.self_attn."
            q, k, v = (sd[f"{attn}{n}_proj.weight"] for n in "qkv")
            group = torch.cat(
                [q[3 * t * d : 3 * (t + 1) * d], k[t * d : (t + 1) * d], v[t * d : (t + 1) * d]]
            )
            assert torch.equal(shard["decoder.layers.0.self_attention.linear_qkv.weight"], group)
    if pp == 2:  # tied across stages: the last stage holds megatron's copy of the (padded) embedding
        for t in range(tp):
            assert torch.equal(
                shards[1][t]["output_layer.weight"], shards[0][t]["embedding.word_embeddings.weight"]
            )


def test_gqa_odd_heads_logits_match_hf(gqa_hf, parallel):
    hf = gqa_hf
    model = build_gpt_model(hf.config, LAYOUT).eval()
    shard = hf_to_megatron(hf.state_dict(), hf.config, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
    missing, unexpected = model.load_state_dict(shard, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    vocab = hf.config.vocab_size
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(input_ids=ids).logits
        got = model(ids, torch.arange(12).expand(2, 12), None)
    torch.testing.assert_close(got[..., :vocab], want, atol=ATOL, rtol=0)
    batch = padded_batch(vocab)
    with torch.no_grad():
        lp = megatron_token_logprobs(
            model, batch["input_ids"], batch["attention_mask"], batch["position_ids"]
        )
        torch.testing.assert_close(lp, hf_token_logprobs(hf, batch), atol=ATOL, rtol=0)


def test_pad_token_inside_a_row_gets_no_lookup_gradient_as_in_hf(gqa_hf, parallel):
    """transformers' Llama embedding is ``nn.Embedding(padding_idx=pad_token_id)``: where the pad id is
    also a real token (SmolLM2's pad is its ``<|im_end|>``) its row gets no gradient from the lookup,
    only from the tied output layer. The megatron model's embedding gradient equals HF's there too."""
    hf = gqa_hf
    pad = hf.config.pad_token_id
    model = build_gpt_model(hf.config, LAYOUT)
    model.load_state_dict(
        hf_to_megatron(hf.state_dict(), hf.config, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1), strict=False
    )
    batch = padded_batch(hf.config.vocab_size)
    ids = batch["input_ids"]
    ids[batch["attention_mask"] > 0] = torch.where(  # every third real token becomes the pad id
        torch.arange(int(batch["attention_mask"].sum())) % 3 == 1, pad, ids[batch["attention_mask"] > 0]
    )
    hf.zero_grad()
    hf_token_logprobs(hf, batch).sum().backward()
    megatron_token_logprobs(model, ids, batch["attention_mask"], batch["position_ids"]).sum().backward()
    want = hf.model.embed_tokens.weight.grad
    got = model.embedding.word_embeddings.weight.grad[: hf.config.vocab_size]
    assert want[pad].abs().max() > 1e-3  # the tied output layer's part
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    hf.zero_grad()


def _config(**overrides):
    from transformers import LlamaConfig

    base = dict(
        vocab_size=1000,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=64,
    )
    return LlamaConfig(**{**base, **overrides})


@pytest.mark.parametrize(
    "layout,overrides,message",
    [
        (ParallelLayout(tp=4), {}, "num_attention_heads 6 is not divisible by tensor parallel size 4"),
        (ParallelLayout(tp=3), {}, "num_key_value_heads 2 is neither a multiple nor a divisor"),
        (ParallelLayout(pp=3), {}, "num_hidden_layers 2 is not divisible by pipeline stages"),
        (ParallelLayout(tp=2), {"vocab_size": 100}, "vocab size 100 is too small for tp=2"),
        (
            ParallelLayout(tp=2),
            {"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 72},
            "num_attention_heads 9 is not divisible by tensor parallel size 2",
        ),
        (  # 9 heads at tp=9 (kv heads replicated) is fine, but 1000 rows padded to 1152 leave rank 8 none
            ParallelLayout(tp=9),
            {"num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 72},
            "vocab size 1000 is too small for tp=9",
        ),
        (
            ParallelLayout(),
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
            "rope_type 'linear'",
        ),
    ],
)
def test_bad_model_layouts_give_one_line_config_errors(layout, overrides, message):
    from nemo_azr.models.megatron.builder import transformer_config_from_hf

    with pytest.raises(ConfigError) as info:
        transformer_config_from_hf(_config(**overrides), layout)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_unsupported_model_type_is_a_config_error():
    from transformers import GPT2Config

    with pytest.raises(ConfigError, match="model_type 'gpt2' is not supported"):
        check_layout_fits(GPT2Config(), LAYOUT)


@pytest.mark.parametrize(
    "layout,message",
    [
        (ParallelLayout(tp=2), "world size 1 is not divisible by tp*pp = 2*1 = 2"),
        (ParallelLayout(dp=2), "world size 1 != tp*pp*dp = 1*1*2 = 2"),
    ],
)
def test_world_size_mismatch_is_a_config_error(layout, message):
    with pytest.raises(ConfigError) as info:
        layout.data_parallel_size(1)
    assert str(info.value) == message


def test_initialize_parallel_rejects_a_layout_bigger_than_the_world(parallel):
    with pytest.raises(ConfigError, match="world size 1 is not divisible by tp\\*pp = 1\\*2 = 2"):
        initialize_parallel(ParallelLayout(pp=2), seed=0)


def test_layout_from_config():
    from nemo_azr.config.schema import ParallelConfig

    cfg = ParallelConfig(
        tensor_model_parallel_size=2, pipeline_model_parallel_size=2, make_vocab_size_divisible_by=64
    )
    assert ParallelLayout.from_config(cfg) == ParallelLayout(tp=2, pp=2, make_vocab_size_divisible_by=64)


def test_invalid_layout_values_are_config_errors():
    for kwargs in ({"tp": 0}, {"vpp": 2}, {"sequence_parallel": True}, {"dp": -1}):
        with pytest.raises(ConfigError):
            ParallelLayout(**kwargs)


def test_cpu_rng_tracker_forks_the_cpu_generator(parallel):
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    from nemo_azr.distributed.cpu_shims import CpuRNGStatesTracker, apply_cpu_shims

    apply_cpu_shims()  # idempotent
    tracker = get_cuda_rng_tracker()
    assert isinstance(tracker, CpuRNGStatesTracker)
    before = torch.get_rng_state()
    with tracker.fork():
        first = torch.rand(3)
    with tracker.fork():
        second = torch.rand(3)  # the tracked stream advanced
    assert torch.equal(torch.get_rng_state(), before)  # the default stream is untouched
    assert not torch.equal(first, second)


@pytest.mark.parametrize("distributed_optimizer", [False, True])
def test_optimizer_step_on_cpu_matches_torch_adamw(pair, distributed_optimizer):
    """megatron's DDP + (distributed) optimizer with grad clipping runs on CPU (the optimizer shims)
    and one step equals torch AdamW + clip_grad_norm_ on the HF model."""
    import copy

    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    hf_src, _ = pair
    hf = copy.deepcopy(hf_src).train()
    model = build_gpt_model(hf.config, LAYOUT)
    model.load_state_dict(
        hf_to_megatron(hf.state_dict(), hf.config, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1), strict=False
    )
    ddp = DistributedDataParallel(
        model.config, DistributedDataParallelConfig(use_distributed_optimizer=distributed_optimizer), model
    )
    opt_cfg = OptimizerConfig(
        optimizer="adam",
        adam_eps=1.0,
        lr=1e-2,
        weight_decay=0.0,
        clip_grad=0.5,
        use_distributed_optimizer=distributed_optimizer,
    )
    optimizer = get_megatron_optimizer(opt_cfg, [ddp], use_gloo_process_groups=False)
    batch = padded_batch(hf.config.vocab_size)

    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    megatron_token_logprobs(
        ddp, batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    ).sum().backward()
    finalize_model_grads([ddp])
    ok, grad_norm, _ = optimizer.step()

    # eps=1: with the usual 1e-8, Adam's first step is ~lr*sign(grad) and amplifies 1e-9 gradient noise.
    reference = torch.optim.AdamW(hf.parameters(), lr=1e-2, eps=1.0, weight_decay=0.0)
    hf_token_logprobs(hf, batch).sum().backward()
    want_norm = torch.nn.utils.clip_grad_norm_(hf.parameters(), 0.5)
    reference.step()

    assert ok and grad_norm == pytest.approx(float(want_norm), rel=1e-5)
    tied = hf.config.tie_word_embeddings
    want = {k: v for k, v in hf.state_dict().items() if not (tied and k == "lm_head.weight")}
    got = megatron_to_hf([[{k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}]], hf.config)
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=1e-5, rtol=0, msg=lambda m, key=key: f"{key}: {m}")


@pytest.mark.parametrize(
    ("sq", "sk", "groups", "masked"),
    [(6, 6, 1, False), (6, 6, 3, False), (1, 7, 3, False), (5, 5, 3, True)],
    ids=["causal", "causal_gqa", "decode_step", "given_mask"],
)
def test_sdpa_core_attention_equals_megatrons_dot_product_attention(parallel, sq, sk, groups, masked):
    """The SDPA core attention of the local spec against megatron's own unfused DotProductAttention,
    same constructor, same inputs: causal, grouped-query heads, a one-token decode step against a
    longer cache, and a given boolean mask (True = masked out) with a fully masked row."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from nemo_azr.models.megatron.builder import transformer_config_from_hf
    from nemo_azr.models.megatron.sdpa_attention import SDPACoreAttention

    heads, dim, b = 6, 4, 2
    config = transformer_config_from_hf(
        _tiny_hf_config(heads=heads, kv_heads=heads // groups, head_dim=dim), LAYOUT
    )
    kwargs = dict(config=config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    ref, sdpa = DotProductAttention(**kwargs).eval(), SDPACoreAttention(**kwargs).eval()
    g = torch.Generator().manual_seed(5)
    q = torch.randn(sq, b, heads, dim, generator=g)
    k = torch.randn(sk, b, heads // groups, dim, generator=g)
    v = torch.randn(sk, b, heads // groups, dim, generator=g)
    mask = None
    if masked:
        mask = torch.rand(b, 1, sq, sk, generator=g) > 0.6
        mask[0, 0, 2] = True  # one query row sees nothing
    want, got = ref(q, k, v, mask), sdpa(q, k, v, mask)
    assert got.shape == want.shape == (sq, b, heads * dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _tiny_hf_config(*, heads: int, kv_heads: int, head_dim: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=64,
        hidden_size=heads * head_dim,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
    )
