"""The hf policy and generation backends agree with plain transformers computations."""

import logging

import pytest
import torch

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.contracts.generation import (
    GenerationBackend,
    GenerationRequest,
    SamplingParams,
    ScoresContinuations,
)
from nemo_azr.contracts.policy import Policy
from nemo_azr.contracts.update import UpdateContext
from nemo_azr.models.hf.policy import HFPolicy
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.models.training.shared_prefix import MIN_COMMON_START
from nemo_azr.rollout.hf_backend import HFGenerationBackend
from nemo_azr.rollout.single_turn import encode_prompt


@pytest.fixture(scope="module")
def setup(tiny_model_path):
    cfg = NemoAzrConfig()
    cfg.generation.temperature = 0.7
    cfg.model.logprob_chunk_size = 5  # several chunks even on tiny batches
    tok = load_tokenizer(tiny_model_path)
    policy = HFPolicy(tiny_model_path, cfg, trainable=True)
    backend = HFGenerationBackend(policy.model, tok)
    prompts = [
        encode_prompt(tok, [{"role": "user", "content": q}])
        for q in ("What is 1 + 2?", "Hi", "What is 7 + 8?")
    ]
    return cfg, tok, policy, backend, prompts


def _naive_logprobs(model, batch, temperature):
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
    lp = torch.log_softmax(logits[:, :-1].float() / temperature, -1).gather(
        -1, batch["input_ids"][:, 1:, None]
    )[..., 0]
    return torch.nn.functional.pad(lp, (1, 0)) * batch["loss_mask"]


def test_rollout_logprobs_match_policy_and_naive_reference(setup):
    cfg, tok, policy, backend, prompts = setup
    torch.manual_seed(0)
    outs = backend.generate(
        [GenerationRequest(p) for p in prompts], SamplingParams(n=2, temperature=0.7, max_new_tokens=6)
    )
    rows_p = [p for p, o in zip(prompts, outs) for _ in o.samples]
    samples = [s for o in outs for s in o.samples]
    batch = Batch(
        pack_prompt_response(
            rows_p, [s.token_ids for s in samples], [s.logprobs for s in samples], pad_id=tok.pad_token_id
        )
    )
    mine = policy.compute_logprobs(batch)
    naive = _naive_logprobs(policy.model, batch, 0.7)
    torch.testing.assert_close(mine, naive, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batch["rollout_logprobs"], naive, rtol=1e-4, atol=1e-4)
    assert (mine[batch["loss_mask"] == 0] == 0).all()


def test_continuation_logprobs_match_a_full_forward_of_each_sequence(setup):
    """contracts.ScoresContinuations: prompts of different lengths, continuations of 1-3 tokens (two
    prompts alike, so the shared-prompt path runs), against the model on each whole sequence."""
    _, tok, policy, backend, prompts = setup
    assert isinstance(backend, ScoresContinuations)
    prompts = [prompts[0], prompts[1], prompts[0]]
    conts = [[[11], [12, 13]], [[14, 15, 16]], [[17, 18], [19]]]
    got = backend.continuation_logprobs(prompts, conts, temperature=0.7)
    assert [[len(c) for c in row] for row in got] == [[1, 2], [3], [2, 1]]
    for prompt, row_conts, row_got in zip(prompts, conts, got):
        for cont, values in zip(row_conts, row_got):
            ids = torch.tensor([prompt + cont])
            with torch.no_grad():
                logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            reference = (logits / 0.7).log_softmax(-1).gather(-1, torch.tensor(cont)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(values), reference, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="at least one token"):
        backend.continuation_logprobs(prompts[:1], [[[]]])


def test_continuation_scoring_is_chunked_by_memory_and_chunks_change_nothing(setup, monkeypatch):
    """With generation.max_batch_size 0 a scoring forward takes only the rows whose copied KV cache
    and logits fit the budget (hand-computed for the tiny model), and scoring in such chunks gives
    what one forward gives."""
    import nemo_azr.rollout.hf_backend as hf_backend

    _, tok, policy, backend, prompts = setup
    cfg = backend.model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    per_row = 2 * cfg.num_hidden_layers * kv_heads * head_dim * 4 * (40 + 2) + 2 * cfg.vocab_size * 8
    monkeypatch.setattr(hf_backend, "SCORING_BUDGET_BYTES", 3 * per_row + 1)
    assert backend.scoring_rows_per_chunk(40, 2) == 3
    monkeypatch.setattr(hf_backend, "SCORING_BUDGET_BYTES", 1)
    assert backend.scoring_rows_per_chunk(40, 2) == 1  # never 0

    prompts = [prompts[0], prompts[1], prompts[0]]
    conts = [[[11], [12, 13]], [[14, 15, 16]], [[17, 18], [19]]]
    one_row_at_a_time = backend.continuation_logprobs(prompts, conts, temperature=0.7)
    monkeypatch.setattr(hf_backend, "SCORING_BUDGET_BYTES", 1 << 40)
    one_forward = backend.continuation_logprobs(prompts, conts, temperature=0.7)
    for a, b in zip(one_row_at_a_time, one_forward):
        for x, y in zip(a, b):
            torch.testing.assert_close(torch.tensor(x), torch.tensor(y), rtol=1e-5, atol=1e-5)


def test_generation_is_chunked_by_memory_and_greedy_tokens_do_not_change(setup, monkeypatch):
    """With generation.max_batch_size 0 one generate call decodes only the rows whose KV cache
    (prompt + max_new_tokens) and a step's logits fit the budget (hand-computed for the tiny model);
    greedy tokens are the same in chunks as in one call."""
    import nemo_azr.rollout.hf_backend as hf_backend

    _, tok, policy, backend, prompts = setup
    cfg = backend.model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    per_row = 2 * cfg.num_hidden_layers * kv_heads * head_dim * 4 * (30 + 6) + cfg.vocab_size * 12
    monkeypatch.setattr(hf_backend, "GENERATION_BUDGET_BYTES", 2 * per_row + 1)
    assert backend.generation_rows_per_chunk(30, 6) == 2
    monkeypatch.setattr(hf_backend, "GENERATION_BUDGET_BYTES", 1)
    assert backend.generation_rows_per_chunk(30, 6) == 1  # never 0

    chunk_sizes: list[int] = []
    decode = backend._generate_chunk
    monkeypatch.setattr(backend, "_generate_chunk", lambda p, sp: chunk_sizes.append(len(p)) or decode(p, sp))
    requests = [GenerationRequest(p) for p in prompts]
    greedy = SamplingParams(n=2, greedy=True, max_new_tokens=6)
    one_row_at_a_time = backend.generate(requests, greedy)
    assert chunk_sizes == [1] * 6
    chunk_sizes.clear()
    monkeypatch.setattr(hf_backend, "GENERATION_BUDGET_BYTES", 1 << 40)
    one_call = backend.generate(requests, greedy)
    assert chunk_sizes == [6]
    assert [[s.token_ids for s in o.samples] for o in one_row_at_a_time] == [
        [s.token_ids for s in o.samples] for o in one_call
    ]


def test_greedy_matches_transformers_generate(setup):
    _cfg, tok, policy, backend, prompts = setup
    out = backend.generate(
        [GenerationRequest(prompts[0])], SamplingParams(n=1, greedy=True, max_new_tokens=6)
    )
    ids = torch.tensor([prompts[0]])
    ref = backend.model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=6,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    expected = ref[0, ids.shape[1] :].tolist()
    if tok.eos_token_id in expected:
        expected = expected[: expected.index(tok.eos_token_id) + 1]
    assert out[0].samples[0].token_ids == expected


def test_eos_ends_the_sample_and_the_loss_mask(setup):
    _cfg, tok, policy, backend, prompts = setup
    # Make eos likely from the 3rd token on by biasing the output layer's logits.
    gen = HFGenerationBackend(policy.model, tok)
    bias = torch.zeros(gen.model.config.vocab_size)
    bias[tok.eos_token_id] = 100.0
    calls = []

    def hook(_module, _inputs, logits):
        calls.append(1)
        return logits + bias if len(calls) >= 3 else logits

    gen.model.get_output_embeddings().register_forward_hook(hook)
    out = gen.generate(
        [GenerationRequest(p) for p in prompts], SamplingParams(n=1, greedy=True, max_new_tokens=5)
    )
    for o in out:
        s = o.samples[0]
        assert s.token_ids[-1] == tok.eos_token_id and s.finish_reason == "eos"
        assert s.token_ids.count(tok.eos_token_id) == 1 and len(s.token_ids) <= 3


def test_stop_strings_and_length_limit(setup):
    _cfg, tok, _policy, backend, prompts = setup
    torch.manual_seed(1)
    free = backend.generate([GenerationRequest(prompts[1])], SamplingParams(n=4, max_new_tokens=7))
    for s in free[0].samples:
        assert len(s.token_ids) <= 7
        assert (s.finish_reason == "length") == (tok.eos_token_id not in s.token_ids)
    # Use the first character the model wrote as a stop string: generation must end right there.
    first = next(s for s in free[0].samples if s.text.strip())
    stop = first.text.strip()[0]
    torch.manual_seed(1)
    stopped = backend.generate(
        [GenerationRequest(prompts[1])], SamplingParams(n=4, max_new_tokens=7, stop_strings=(stop,))
    )
    for s in stopped[0].samples:
        if s.finish_reason == "stop":
            assert stop in s.text
            assert stop not in tok.decode(s.token_ids[:-1], skip_special_tokens=True)


def test_sync_weights_copies_and_bumps_version(setup):
    _cfg, tok, policy, _backend, prompts = setup
    gen = HFGenerationBackend(policy.model, tok)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.01)
    assert not torch.equal(next(gen.model.parameters()), next(policy.model.parameters()))
    assert gen.version == 0 and isinstance(gen, GenerationBackend)  # the whole engine Protocol
    assert isinstance(policy, Policy) and policy.hf_config is policy.model.config
    assert policy.generation_model() is policy.model
    gen.sync_weights(policy)
    assert gen.version == 1
    for a, b in zip(gen.model.parameters(), policy.model.parameters()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    with torch.no_grad():
        for p in policy.model.parameters():
            p.sub_(0.01)


def _rl_batch(tok, prompts, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows_p = [p for p in prompts for _ in range(n)]
    resp = [
        torch.randint(5, 60, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        for _ in rows_p
    ]
    b = Batch(
        pack_prompt_response(rows_p, resp, None, pad_id=tok.pad_token_id),
        {"uid": list(range(len(rows_p))), "group_id": [i // n for i in range(len(rows_p))]},
    )
    b["advantages"] = torch.randn(len(rows_p), 1, generator=g) * b["loss_mask"]
    return b


@pytest.mark.parametrize(
    "agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
)
def test_gradient_accumulation_equals_one_big_micro_batch(tiny_model_path, setup, agg):
    """micro_batch_size must not change the update: normalisers are the mini-batch's, not the micro's."""
    _cfg, tok, _policy, _backend, prompts = setup
    grads = []
    for micro in (12, 5):
        cfg = NemoAzrConfig()
        cfg.algorithm.micro_batch_size = micro
        cfg.algorithm.loss_agg_mode = agg
        cfg.algorithm.shuffle_mini_batches = False
        cfg.optim.lr = 1e-2
        pol = HFPolicy(tiny_model_path, cfg, trainable=True)
        pol.setup_optimizer(total_steps=1)
        batch = _rl_batch(tok, prompts)
        batch["old_logprobs"] = pol.compute_logprobs(batch) - 0.1  # ratio != 1 exercises the clip branches
        captured = []
        pol._clip_and_step = lambda pol=pol, captured=captured: (
            captured.append([p.grad.clone() for p in pol.model.parameters()]) or 1.0
        )
        metrics = pol.update(batch, UpdateContext(norm_length=8))
        assert metrics["actor/optimizer_steps"] == 1.0
        grads.append(captured[0])
    assert any(g.abs().sum() > 0 for g in grads[0])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def test_logprob_micro_batch_size_sets_the_no_grad_forwards_only(tiny_model_path, setup, monkeypatch):
    """algorithm.logprob_micro_batch_size: the old/ref log-prob pass runs that many rows per forward
    (12 rows: 2 forwards of 8, not 6 of 2) with the same log-probs; training micro-batches unchanged."""
    _cfg, tok, _policy, _backend, prompts = setup
    batch = _rl_batch(tok, prompts, seed=5)
    out = {}
    for logprob_rows in (0, 8):
        cfg = NemoAzrConfig()
        cfg.algorithm.micro_batch_size = 2
        cfg.algorithm.logprob_micro_batch_size = logprob_rows
        pol = HFPolicy(tiny_model_path, cfg, trainable=True)
        forwards = []
        forward = pol.token_logprobs
        monkeypatch.setattr(
            pol, "token_logprobs", lambda b, f=forwards, fw=forward, **k: f.append(len(b)) or fw(b, **k)
        )
        out[logprob_rows] = (pol.compute_logprobs(batch), forwards)
        assert [len(m.batch) for m in pol.micro_batches(batch)] == [2] * 6
    assert out[0][1] == [2] * 6 and out[8][1] == [8, 4]
    torch.testing.assert_close(out[8][0], out[0][0], rtol=0, atol=1e-6)
    assert torch.count_nonzero(out[8][0]) == int((batch["loss_mask"][:, 1:] > 0).sum())


def test_no_grad_pass_on_cuda_groups_rows_by_the_memory_budget(tiny_model_path, setup, monkeypatch):
    """logprob_micro_batch_size=0 on a CUDA device: the no-grad micro-batches fill the token budget
    of no_grad_budget (bytes per token from the config, hand-counted) instead of the training
    micro-batches, never below one training micro-batch's tokens; on a CPU the training micro-batches.
    The device is only named here (the grouping reads nothing else of it); free memory is stubbed."""
    from nemo_azr.models.training import no_grad_budget

    _cfg, tok, _policy, _backend, prompts = setup
    batch = _rl_batch(tok, prompts, seed=5)
    cfg = NemoAzrConfig()
    cfg.algorithm.micro_batch_size = 2
    pol = HFPolicy(tiny_model_path, cfg, trainable=True)
    c = pol.model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    per_token = (4 * c.hidden_size + 2 * c.num_key_value_heads * head_dim + 3 * c.intermediate_size) * 4
    assert no_grad_budget.activation_bytes_per_token(c, 4) == per_token
    assert [len(m.batch) for m in pol.micro_batches(batch, no_grad=True)] == [2] * 6  # CPU: unchanged

    pol.device = torch.device("cuda")
    width = batch.seq_len
    for free_bytes, want in ((4 * per_token * 5 * width, [5, 5, 2]), (4 * per_token * 1, [2] * 6)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, f=free_bytes: (f, 2 * f))
        groups = pol.micro_batches(batch, no_grad=True)
        # 5 widths fit (or less than one row: the training micro-batch's 2 rows are the floor)
        assert sorted((len(m.batch) for m in groups), reverse=True) == want
        assert sorted(int(i) for m in groups for i in m.rows) == list(range(len(batch)))
    assert [len(m.batch) for m in pol.micro_batches(batch)] == [2] * 6  # training: unchanged


def test_on_policy_update_without_old_logprobs_matches_explicit_pass(tiny_model_path, setup):
    """A single on-policy step may take old log-probs from its own forward: same gradients."""
    _cfg, tok, _policy, _backend, prompts = setup
    grads = []
    for explicit in (True, False):
        cfg = NemoAzrConfig()
        cfg.algorithm.micro_batch_size = 5
        cfg.algorithm.shuffle_mini_batches = False
        pol = HFPolicy(tiny_model_path, cfg, trainable=True)
        pol.setup_optimizer(total_steps=1)
        batch = _rl_batch(tok, prompts, seed=3)
        if explicit:
            batch["old_logprobs"] = pol.compute_logprobs(batch)
        captured = []
        pol._clip_and_step = lambda pol=pol, captured=captured: (
            captured.append([p.grad.clone() for p in pol.model.parameters()]) or 1.0
        )
        metrics = pol.update(batch, UpdateContext(norm_length=8))
        assert metrics["actor/clip_frac"] == 0.0
        grads.append(captured[0])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)


def test_top_k_top_p_filtering_by_hand():
    from nemo_azr.rollout.hf_backend import _filter_logits

    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    out = _filter_logits(logits, top_k=2, top_p=1.0)
    assert torch.isinf(out[0, [0, 3]]).all() and out[0, 1] == 4.0 and out[0, 2] == 3.0
    # probs 0.5, 0.3, 0.2 (order shuffled): top_p=0.6 keeps 0.5 and 0.3 (the token crossing 0.6)
    logp = torch.log(torch.tensor([[0.3, 0.2, 0.5]]))
    kept = ~torch.isinf(_filter_logits(logp, top_k=0, top_p=0.6))
    assert kept.tolist() == [[True, False, True]]
    # top_p=0.5: the first token alone already holds 0.5
    kept = ~torch.isinf(_filter_logits(logp, top_k=0, top_p=0.5))
    assert kept.tolist() == [[False, False, True]]


def test_inverse_cdf_sampling_matches_the_distribution():
    from nemo_azr.rollout.hf_backend import _inverse_cdf_sample

    torch.manual_seed(0)
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3]).repeat(20000, 1)
    counts = torch.bincount(_inverse_cdf_sample(probs), minlength=4).float() / 20000
    assert counts[1] == 0  # zero-probability entries are never drawn
    # each frequency within 4 standard errors of its probability
    for p, c in zip([0.1, 0.6, 0.3], counts[[0, 2, 3]]):
        assert abs(c - p) < 4 * (p * (1 - p) / 20000) ** 0.5


def test_autocast_keeps_fp32_master_weights_and_close_gradients(tiny_model_path, setup):
    """model.autocast_dtype=bfloat16: the decoder runs in bf16, weights/grads/optimizer stay fp32, the
    log-probs and the gradient follow the fp32 ones, and a small-lr step still moves the weights (a
    bf16 copy of the weights would round most of a 1e-6 step away)."""
    _cfg, tok, _policy, _backend, prompts = setup
    results = {}
    for autocast in ("", "bfloat16"):
        cfg = NemoAzrConfig()
        cfg.model.autocast_dtype = autocast
        cfg.algorithm.shuffle_mini_batches = False
        cfg.optim.lr = 1e-6
        pol = HFPolicy(tiny_model_path, cfg, trainable=True)
        pol.setup_optimizer(total_steps=1)
        batch = _rl_batch(tok, prompts, seed=5)
        logprobs = pol.compute_logprobs(batch)
        captured = []
        step = pol._clip_and_step
        pol._clip_and_step = lambda pol=pol, captured=captured, step=step: (
            captured.append(torch.cat([p.grad.flatten() for p in pol.model.parameters()])) or step()
        )
        before = [p.detach().clone() for p in pol.model.parameters()]
        pol.update(batch, UpdateContext(norm_length=8))
        moved = sum(int((p.detach() != b).sum()) for p, b in zip(pol.model.parameters(), before))
        total = sum(b.numel() for b in before)
        assert all(p.dtype == torch.float32 for p in pol.model.parameters())
        results[autocast] = logprobs, captured[0], moved / total
    (lp32, g32, moved32), (lp16, g16, moved16) = results[""], results["bfloat16"]
    mask = _rl_batch(tok, prompts, seed=5)["loss_mask"] > 0
    assert not torch.equal(lp32, lp16)  # really computed in bf16
    assert (lp32 - lp16)[mask].abs().max() < 0.1  # bf16 has ~3 significant digits
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.99
    assert moved32 > 0.9 and moved16 > 0.9


def test_generation_dtype_casts_the_copy_and_sync(setup):
    _cfg, tok, policy, _backend, prompts = setup
    backend = HFGenerationBackend(policy.model, tok, dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in backend.model.parameters())
    assert all(p.dtype == torch.float32 for p in policy.model.parameters())  # the policy is untouched
    with torch.no_grad():
        policy.model.get_input_embeddings().weight.add_(0.01)
    backend.sync_weights(policy)
    torch.testing.assert_close(
        backend.model.get_input_embeddings().weight,
        policy.model.get_input_embeddings().weight.to(torch.bfloat16),
    )
    with torch.no_grad():
        policy.model.get_input_embeddings().weight.sub_(0.01)  # the module-scoped policy as it was
    out = backend.generate([GenerationRequest(prompts[0], 0)], SamplingParams(n=2, max_new_tokens=4))
    assert len(out[0].samples) == 2 and all(len(s.token_ids) >= 1 for s in out[0].samples)


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_activation_checkpointing_update_is_quiet_and_exact(tiny_model_path, setup):
    """model.gradient_checkpointing=true: no transformers deprecation or use_cache notice, and the
    same gradients as without checkpointing (it only recomputes activations)."""
    import warnings

    from transformers.utils import logging as hf_logging

    _cfg, tok, _policy, _backend, prompts = setup
    grads = []
    for checkpointing in (False, True):
        cfg = NemoAzrConfig()
        cfg.model.gradient_checkpointing = checkpointing
        cfg.algorithm.shuffle_mini_batches = False
        handler = _Recorder()
        notices = handler.records
        hf_logging.get_logger().addHandler(handler)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                pol = HFPolicy(tiny_model_path, cfg, trainable=True)
                pol.setup_optimizer(total_steps=1)
                batch = _rl_batch(tok, prompts, seed=5)
                batch["old_logprobs"] = pol.compute_logprobs(batch)
                captured = []
                pol._clip_and_step = lambda pol=pol, captured=captured: (
                    captured.append([p.grad.clone() for p in pol.model.parameters()]) or 1.0
                )
                pol.update(batch, UpdateContext(norm_length=8))
        finally:
            hf_logging.get_logger().removeHandler(handler)
        assert pol.model.is_activation_checkpointing is checkpointing
        noisy = [str(w.message) for w in caught if issubclass(w.category, FutureWarning | DeprecationWarning)]
        assert not noisy, noisy
        assert not [r.getMessage() for r in notices if "use_cache" in r.getMessage()]
        grads.append(captured[0])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def _record_next_logits(monkeypatch):
    """``(calls, spy)``: every ``_next_logits`` call's ``((rows, columns), without a cache)``, recorded
    by ``spy``, which stands in for the method from now on."""
    calls = []
    next_logits = HFGenerationBackend._next_logits

    def spy(self, ids, attn, pos, past):
        calls.append((tuple(ids.shape), past is None))
        return next_logits(self, ids, attn, pos, past)

    monkeypatch.setattr(HFGenerationBackend, "_next_logits", spy)
    return calls, spy


def test_shared_prompts_are_encoded_once_and_sample_as_if_encoded_per_row(setup, monkeypatch):
    """The n samples of a request share one prompt encoding (its KV cache copied to each row), and
    the opening all distinct prompts share (here a system message) is encoded once for all: same
    tokens and log-probs, under the same seed, as encoding every row's prompt on its own."""
    import os

    _cfg, tok, _policy, backend, _prompts = setup
    system = {
        "role": "system",
        "content": "You are a careful assistant. Read the question, then answer it with one number and stop.",
    }
    prompts = [
        encode_prompt(tok, [system, {"role": "user", "content": q}]) for q in ("1 + 2?", "Hi", "7 + 8?")
    ]
    requests = [GenerationRequest(p) for p in (*prompts, prompts[0])]  # a repeated request too
    sampling = SamplingParams(n=4, temperature=1.0, max_new_tokens=8)

    calls, spy = _record_next_logits(monkeypatch)
    torch.manual_seed(3)
    shared = backend.generate(requests, sampling)
    opening = min(len(os.path.commonprefix(prompts)), min(map(len, prompts)) - 1)
    width = max(map(len, prompts))
    assert opening >= MIN_COMMON_START
    # the opening once, then the 3 distinct prompts' own columns on its cache; 16 rows decode
    assert calls[:3] == [((1, opening), True), ((len(prompts), width - opening), False), ((16, 1), False)]

    monkeypatch.setattr(
        HFGenerationBackend,
        "_encode_prompts",
        lambda self, ids, attn, pos: (*spy(self, ids, attn, pos, None), attn),
    )
    calls.clear()
    torch.manual_seed(3)
    per_row = backend.generate(requests, sampling)
    assert calls[0] == ((4 * len(requests), width), True)
    a = [s for o in shared for s in o.samples]
    b = [s for o in per_row for s in o.samples]
    assert [s.token_ids for s in a] == [s.token_ids for s in b]
    assert len({tuple(s.token_ids) for s in a}) > len(prompts)  # the rows did sample differently
    for x, y in zip(a, b):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), rtol=1e-5, atol=1e-5)


def test_ended_rows_leave_the_batch_and_the_rest_sample_as_in_the_full_batch(setup, monkeypatch):
    """The dynamic loop drops rows that have ended (a stop string here) and decodes the rest on a
    smaller batch: same tokens under the same seed as keeping every row to the end, log-probs equal
    to fp32 tolerance."""
    _cfg, _tok, _policy, backend, prompts = setup
    requests = [GenerationRequest(p) for p in prompts]
    sampling = SamplingParams(n=8, temperature=1.0, max_new_tokens=12, stop_strings=["e"])
    widths = []
    next_logits = HFGenerationBackend._next_logits

    def spy(self, ids, attn, pos, past):
        widths.append(tuple(ids.shape))
        return next_logits(self, ids, attn, pos, past)

    monkeypatch.setattr(HFGenerationBackend, "_next_logits", spy)
    outputs = {}
    for share in (0.25, 2.0):  # 2.0: never drop a row (the full batch to the end)
        monkeypatch.setattr(backend, "prune_ended_share", share)
        widths.clear()
        torch.manual_seed(5)
        outputs[share] = [s for o in backend.generate(requests, sampling) for s in o.samples]
        if share < 1:
            decode_widths = [rows for rows, cols in widths if cols == 1]  # one token a row: decoding
            assert decode_widths[0] == 24 and min(decode_widths) < 24  # rows did leave the batch
            assert decode_widths == sorted(decode_widths, reverse=True)
    pruned, full = outputs[0.25], outputs[2.0]
    lengths = {len(s.token_ids) for s in full}
    assert len(lengths) > 2  # the rows ended at different steps
    assert [s.token_ids for s in pruned] == [s.token_ids for s in full]
    assert [s.finish_reason for s in pruned] == [s.finish_reason for s in full]
    for x, y in zip(pruned, full):
        torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shared", ["none", "short"])
def test_prompts_that_open_differently_or_alike_for_a_few_tokens_are_encoded_whole(
    setup, monkeypatch, shared
):
    """A short common opening (the chat template's few tokens) is not worth its own call."""
    _cfg, tok, _policy, backend, chat_prompts = setup
    if shared == "none":
        prompts = [tok("alpha beta gamma")["input_ids"], tok("delta beta")["input_ids"]]
        assert prompts[0][0] != prompts[1][0]
    else:
        import os

        prompts = chat_prompts
        assert 0 < len(os.path.commonprefix(prompts)) < MIN_COMMON_START
    calls, _ = _record_next_logits(monkeypatch)
    backend.generate(
        [GenerationRequest(p) for p in prompts], SamplingParams(n=1, temperature=0.0, max_new_tokens=2)
    )
    assert calls[0] == ((len(prompts), max(map(len, prompts))), True)


def test_every_registered_backend_implements_the_whole_engine_protocol():
    """The trainer calls release / refit_metrics / shutdown on any backend without probing for them."""
    import inspect

    import nemo_azr.plugins  # noqa: F401
    from nemo_azr.contracts.generation import GenerationBackend
    from nemo_azr.registry import GENERATION_BACKENDS
    from nemo_azr.rollout.process_backend import ProcessGenerationBackend

    members = [name for name, _ in inspect.getmembers(GenerationBackend) if not name.startswith("_")] + list(
        GenerationBackend.__annotations__
    )
    assert {"generate", "sync_weights", "release", "flush_cache", "shutdown", "version"} <= set(members)
    for cls in [*(GENERATION_BACKENDS.get(n) for n in GENERATION_BACKENDS.names()), ProcessGenerationBackend]:
        for name in members:
            assert hasattr(cls, name) or name in ("version", "refit_metrics"), (cls.__name__, name)
        assert isinstance(cls.reads_policy_in_place, bool)


def test_the_engine_defaults_answer_every_lifecycle_call():
    from nemo_azr.contracts.generation import GenerationBackend
    from nemo_azr.rollout.engine import GenerationEngineBase

    engine = GenerationEngineBase()
    assert engine.version == 0 and engine.refit_metrics == {} and not engine.reads_policy_in_place
    engine.release(), engine.flush_cache(), engine.shutdown()  # no-ops answer
    with pytest.raises(NotImplementedError):
        engine.sync_weights(None)
    assert not isinstance(engine, GenerationBackend)  # no generate(): not a backend by itself


def test_the_megatron_policy_has_every_policy_method():
    pytest.importorskip("megatron.core")
    import inspect

    from nemo_azr.contracts.policy import Policy
    from nemo_azr.models.megatron.policy import MegatronPolicy

    methods = [n for n, _ in inspect.getmembers(Policy, inspect.isfunction) if not n.startswith("_")]
    assert {"generation_model", "export_hf_state_dict", "compute_logprobs", "update", "save", "load"} <= set(
        methods
    )
    assert all(callable(getattr(MegatronPolicy, n, None)) for n in methods)
