"""The generation-backend contract, run by every backend (hf, megatron, trtllm) on the tiny model.

Each backend is checked against references computed here with plain transformers (no KV cache):
greedy decoding gives the reference's token ids; the log-probs of sampled tokens are the trainer's
(``policy.compute_logprobs``); after optimizer steps ``sync_weights`` makes the backend decode what
the trainer's new weights decode (and ``version`` counts the syncs); ``n``, ``max_new_tokens`` and
stop strings are honoured.

``trtllm`` runs against tests/fakes/fake_tensorrt_llm.py (CPU), or against the real TensorRT-LLM on a
GPU with ``NEMO_AZR_TRTLLM=real`` (scripts/gpu_check.sh). ``megatron`` runs in this process at world
size 1 over gloo; ``trtllm_megatron`` refits the engine from megatron shards (their HF export).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.contracts.generation import GenerationRequest, SamplingParams
from nemo_azr.contracts.update import UpdateContext
from nemo_azr.models.hf.policy import HFPolicy
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.rollout.single_turn import encode_prompt

REAL_TRTLLM = os.environ.get("NEMO_AZR_TRTLLM") == "real"
DEVICE = "cuda" if REAL_TRTLLM else "cpu"
#: sampled-token log-probs vs the trainer's: float32 on CPU; a real engine's kernels differ more
LOGPROB_ATOL = 5e-2 if REAL_TRTLLM else 1e-4
TEMPERATURE = 0.7
QUESTIONS = ("What is 1 + 2?", "Hi", "What is 7 + 8?")
#: trtllm_tp2: an engine of two TP ranks, each holding its shard of every weight (the fake all-gathers)
BACKENDS = ["hf", "trtllm", "trtllm_tp2", "megatron", "megatron_static", "trtllm_megatron"]
#: the megatron backends: megatron_static is generation.decode=static (rollout/megatron_static_decode.py)
MEGATRON = ("megatron", "megatron_static", "trtllm_megatron")


def _megatron_available() -> bool:
    try:
        import megatron.core  # noqa: F401
    except ImportError:
        return False
    return True


class Harness:
    def __init__(self, name: str, policy, backend, tokenizer) -> None:
        self.name, self.policy, self.backend, self.tokenizer = name, policy, backend, tokenizer
        self.prompts = [encode_prompt(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]

    def hf_weights(self) -> dict[str, torch.Tensor]:
        """The trainer's current weights in HF layout (the reference decodes with them)."""
        if hasattr(self.policy, "export_hf_state_dict"):
            return self.policy.export_hf_state_dict()
        return self.policy.model.state_dict()


def _config(name: str) -> NemoAzrConfig:
    cfg = NemoAzrConfig()
    cfg.seed = 0
    cfg.generation.temperature = TEMPERATURE
    cfg.generation.backend = "trtllm" if name.startswith("trtllm") else name.split("_")[0]
    cfg.generation.trtllm.probe_tolerance = LOGPROB_ATOL * 10
    # a real engine without float32 kernels: NEMO_AZR_TRTLLM_DTYPE=bfloat16 (scripts/gpu_check.sh)
    cfg.generation.trtllm.dtype = os.environ.get("NEMO_AZR_TRTLLM_DTYPE", "auto")
    cfg.generation.trtllm.kv_cache_free_gpu_memory_fraction = 0.2
    if name == "trtllm_tp2":
        cfg.generation.trtllm.tensor_parallel_size = 2
    cfg.optim.lr = 0.05
    cfg.algorithm.micro_batch_size = 8
    if name in MEGATRON:
        cfg.model.backend = "megatron"
        cfg.parallel.use_te = "false"
    return cfg


@pytest.fixture(scope="module", params=BACKENDS)
def harness(request, tiny_model_path):
    name = request.param
    if name in MEGATRON and not _megatron_available():
        pytest.skip("megatron-core is not installed")
    if REAL_TRTLLM and not name.startswith("trtllm"):
        pytest.skip("NEMO_AZR_TRTLLM=real runs the trtllm backends only")
    if REAL_TRTLLM and name == "trtllm_tp2" and torch.cuda.device_count() < 2:
        pytest.skip("a TP=2 engine needs two GPUs")
    cfg = _config(name)
    tok = load_tokenizer(tiny_model_path)
    with pytest.MonkeyPatch.context() as mp, torch.random.fork_rng(devices=[]):
        if name.startswith("trtllm") and not REAL_TRTLLM:
            from tests.fakes import fake_tensorrt_llm

            fake_tensorrt_llm.install(mp)
        if name in MEGATRON:
            from nemo_azr.distributed.parallel import destroy_parallel
            from nemo_azr.models.megatron.policy import MegatronPolicy

            policy = MegatronPolicy(tiny_model_path, cfg, trainable=True)
        else:
            destroy_parallel = None
            policy = HFPolicy(tiny_model_path, cfg, trainable=True, device=DEVICE)
        policy.setup_optimizer(total_steps=10)
        if name == "hf":
            from nemo_azr.rollout.hf_backend import HFGenerationBackend

            backend = HFGenerationBackend(policy.model, tok)
        elif name in ("megatron", "megatron_static"):
            from nemo_azr.rollout.megatron_backend import MegatronGenerationBackend

            decode = "static" if name == "megatron_static" else "auto"
            backend = MegatronGenerationBackend(policy, tok, decode=decode)
        else:
            from nemo_azr.rollout.trtllm_backend import TRTLLMGenerationBackend

            source = policy.generation_model() if hasattr(policy, "generation_model") else policy.model
            backend = TRTLLMGenerationBackend(source, tok, cfg=cfg.generation)
        try:
            yield Harness(name, policy, backend, tok)
        finally:
            if hasattr(backend, "shutdown"):
                backend.shutdown()
            if destroy_parallel is not None:
                destroy_parallel()


@torch.no_grad()
def reference_greedy(
    weights: dict[str, torch.Tensor], model_path, prompts: list[list[int]], steps: int, eos: int
) -> list[list[int]]:
    """Greedy decoding with plain transformers, one prompt at a time, full forward per token (no KV
    cache, no padding)."""
    model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    model.load_state_dict({k: v.float().cpu() for k, v in weights.items()}, strict=False)
    outs = []
    for prompt in prompts:
        seq, out = list(prompt), []
        for _ in range(steps):
            tok = int(model(input_ids=torch.tensor([seq]), logits_to_keep=1).logits[0, -1].argmax())
            out.append(tok)
            seq.append(tok)
            if tok == eos:
                break
        outs.append(out)
    return outs


def _greedy(h: Harness, max_new_tokens: int = 6, stop: tuple[str, ...] = ()) -> list:
    sp = SamplingParams(n=1, max_new_tokens=max_new_tokens, greedy=True, stop_strings=stop)
    return [o.samples[0] for o in h.backend.generate([GenerationRequest(p) for p in h.prompts], sp)]


def test_greedy_token_ids_match_the_reference(harness, tiny_model_path):
    h = harness
    weights = h.hf_weights()
    got = [s.token_ids for s in _greedy(h)]
    want = reference_greedy(weights, tiny_model_path, h.prompts, 6, h.tokenizer.eos_token_id)
    assert got == want


def test_sampled_logprobs_match_the_trainer(harness):
    h = harness
    torch.manual_seed(0)
    sp = SamplingParams(n=2, temperature=TEMPERATURE, max_new_tokens=6)
    outs = h.backend.generate([GenerationRequest(p) for p in h.prompts], sp)
    samples = [s for o in outs for s in o.samples]
    rows = [p for p, o in zip(h.prompts, outs) for _ in o.samples]
    batch = Batch(
        pack_prompt_response(
            rows,
            [s.token_ids for s in samples],
            [s.logprobs for s in samples],
            pad_id=h.tokenizer.pad_token_id,
        )
    )
    trainer = h.policy.compute_logprobs(batch)
    assert batch[F.LOSS_MASK].sum() > 0
    torch.testing.assert_close(batch[F.ROLLOUT_LOGPROBS], trainer.cpu().float(), rtol=0, atol=LOGPROB_ATOL)


def test_n_samples_and_max_new_tokens_are_honoured(harness):
    h = harness
    torch.manual_seed(1)
    outs = h.backend.generate(
        [GenerationRequest(p) for p in h.prompts], SamplingParams(n=3, temperature=1.0, max_new_tokens=4)
    )
    assert len(outs) == len(h.prompts)
    for prompt, out in zip(h.prompts, outs):
        assert out.request.prompt_ids == prompt and out.policy_version == h.backend.version
        assert len(out.samples) == 3
        for s in out.samples:
            assert 1 <= len(s.token_ids) <= 4 and len(s.logprobs) == len(s.token_ids)
            ends_eos = s.token_ids[-1] == h.tokenizer.eos_token_id
            assert s.finish_reason == ("eos" if ends_eos else "length")
            assert ends_eos or len(s.token_ids) == 4
            assert h.tokenizer.eos_token_id not in s.token_ids[:-1]


def _pieces(tokenizer, tokens: list[int]) -> list[str]:
    """The text pieces that first appear as each token is decoded (a stop string candidate each)."""
    out = []
    for t in range(1, len(tokens)):
        before = tokenizer.decode(tokens[:t], skip_special_tokens=True)
        after = tokenizer.decode(tokens[: t + 1], skip_special_tokens=True)
        piece = after[len(before) :].strip() if after.startswith(before) else ""
        if piece:
            out.append(piece)
    return out


def test_stop_strings_end_the_sample_where_the_text_first_contains_them(harness):
    """Sampled, not seeded: TensorRT-LLM 1.2 ignores per-request seeds (one engine-wide generator,
    nemo_azr/rollout/trtllm_api.py), and greedy decoding of the tiny model repeats one token. So the
    stop string is a piece the free samples write often, and each stopped sample is checked to end
    at the token where its text first contains it."""
    from collections import Counter

    h = harness
    torch.manual_seed(5)
    free = SamplingParams(n=4, temperature=1.0, max_new_tokens=8)
    counts = Counter(
        piece
        for o in h.backend.generate([GenerationRequest(p) for p in h.prompts], free)
        for s in o.samples
        for piece in set(_pieces(h.tokenizer, s.token_ids))
    )
    assert counts, "no sample decodes a text piece to stop on"
    stop = counts.most_common(1)[0][0]
    sp = SamplingParams(n=4, temperature=1.0, max_new_tokens=8, stop_strings=(stop,))
    samples = [
        s for o in h.backend.generate([GenerationRequest(p) for p in h.prompts], sp) for s in o.samples
    ]
    stopped = [s for s in samples if s.finish_reason == "stop"]
    assert stopped, f"no sample wrote the stop string {stop!r}"
    for s in samples:
        text = h.tokenizer.decode(s.token_ids, skip_special_tokens=True)
        if s.finish_reason == "stop":
            assert stop in text and stop in s.text
            assert stop not in h.tokenizer.decode(s.token_ids[:-1], skip_special_tokens=True)
        else:
            assert stop not in text


def _push_batch(h: Harness, target: list[int]) -> Batch:
    """Every prompt followed by ``target``, with a positive advantage: the update raises its probability."""
    packed = pack_prompt_response(h.prompts, [target] * len(h.prompts), None, pad_id=h.tokenizer.pad_token_id)
    batch = Batch(packed)
    batch[F.ADVANTAGES] = batch[F.LOSS_MASK].clone()
    batch[F.OLD_LOGPROBS] = h.policy.compute_logprobs(batch).cpu()
    return batch


def test_sync_weights_after_optimizer_steps_decodes_the_new_weights(harness, tiny_model_path):
    """Runs last for each backend: it changes the policy's weights."""
    h = harness
    eos = h.tokenizer.eos_token_id
    before_weights = {k: v.detach().clone() for k, v in h.hf_weights().items()}
    before = [s.token_ids for s in _greedy(h)]
    version = h.backend.version
    target = h.tokenizer("7 7 7 7 7 7", add_special_tokens=False)["input_ids"][:6]
    for _ in range(4):
        h.policy.update(_push_batch(h, target), UpdateContext(norm_length=len(target)))
    after_weights = h.hf_weights()
    want = reference_greedy(after_weights, tiny_model_path, h.prompts, 6, eos)
    old = reference_greedy(before_weights, tiny_model_path, h.prompts, 6, eos)
    assert want != old, "the optimizer steps did not change the greedy output (the test would prove nothing)"
    if h.name not in (
        "megatron",
        "megatron_static",
    ):  # a copy-holding backend decodes the old weights until the sync
        assert [s.token_ids for s in _greedy(h)] == before
    if hasattr(h.backend, "release"):
        h.backend.release()  # the trainer's update phase (trtllm: the engine sleeps)
    h.backend.sync_weights(h.policy)
    assert h.backend.version == version + 1
    got = _greedy(h)
    assert [s.token_ids for s in got] == want
    outs = h.backend.generate([GenerationRequest(h.prompts[0])], SamplingParams(n=1, max_new_tokens=2))
    assert outs[0].policy_version == version + 1
    if h.name.startswith("trtllm"):
        m = h.backend.refit_metrics
        assert m["generation/probe_logprob_gap"] <= LOGPROB_ATOL * 10 and m["timing/engine_refit_s"] >= 0


def test_copy_holding_backends_start_from_the_given_weights(harness):
    """hf/trtllm hold their own copy: one made from other weights decodes differently until the sync
    (a guard against a backend that reads the policy behind the trainer's back)."""
    h = harness
    if h.name in MEGATRON or REAL_TRTLLM:
        pytest.skip("megatron decodes in place; a second real engine is not started")
    model = copy.deepcopy(h.policy.model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-1.0)
    requests = [GenerationRequest(p) for p in h.prompts]
    greedy = SamplingParams(max_new_tokens=6, greedy=True)
    with pytest.MonkeyPatch.context() as mp:
        kwargs = {}
        if h.name.startswith("trtllm"):
            from tests.fakes import fake_tensorrt_llm

            fake_tensorrt_llm.install(mp)
            kwargs = {"cfg": _config(h.name).generation}
        other = type(h.backend)(model, h.tokenizer, **kwargs)
        flipped = [o.samples[0].token_ids for o in other.generate(requests, greedy)]
        other.sync_weights(h.policy)
        synced = [o.samples[0].token_ids for o in other.generate(requests, greedy)]
    mine = [s.token_ids for s in _greedy(h)]
    assert flipped != mine and synced == mine
