"""The trtllm backend's refit against the fake TensorRT-LLM (tests/fakes/fake_tensorrt_llm.py): the
engine start arguments, bucketed update_weights calls, sleep/wake order, the refit guard naming a
corrupted or stale layer, the lazy import and its one-line error, and the trainer's refit metrics."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts.generation import GenerationRequest, SamplingParams
from nemo_azr.errors import ConfigError
from nemo_azr.models.hf.policy import HFPolicy
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.rollout.trtllm_weights import (
    RefitError,
    checksum_groups,
    combine_rank_checksums,
    compare_checksums,
    engine_weights,
    tensor_buckets,
)
from tests.fakes import fake_tensorrt_llm as fake


@pytest.fixture
def trt(monkeypatch):
    return fake.install(monkeypatch)


@pytest.fixture(scope="module")
def policy(tiny_model_path):
    cfg = NemoAzrConfig()
    cfg.generation.backend = "trtllm"
    return HFPolicy(tiny_model_path, cfg, trainable=True)


def _backend(policy, tiny_model_path, **trtllm):
    from nemo_azr.rollout.trtllm_backend import TRTLLMGenerationBackend

    cfg = NemoAzrConfig().generation
    cfg.backend = "trtllm"
    for key, value in trtllm.items():
        setattr(cfg.trtllm, key, value)
    return TRTLLMGenerationBackend(policy.model, load_tokenizer(tiny_model_path), cfg=cfg)


def _worker(backend):
    return backend.llm.workers[0]


def test_engine_starts_dummy_with_the_refit_extension_and_is_refitted_once(trt, policy, tiny_model_path):
    b = _backend(policy, tiny_model_path, tensor_parallel_size=2, kv_cache_free_gpu_memory_fraction=0.3)
    kw = b.llm.init_kwargs
    assert kw["load_format"] == "dummy" and kw["enable_sleep"] and kw["tensor_parallel_size"] == 2
    assert (
        kw["kv_cache_config"].free_gpu_memory_fraction == 0.3 and not kw["kv_cache_config"].enable_block_reuse
    )
    assert kw["sampler_type"] == "TRTLLMSampler"  # log-probs of the temperature-scaled distribution
    assert b.version == 0
    full = policy.model.state_dict()
    shards = [dict(w.engine.model_engine.model.named_parameters()) for w in b.llm.workers]
    for w in b.llm.workers:  # every TP rank loaded its shard of every weight and finalised once
        assert type(w).__mro__[1].__name__ == "RefitWorkerExtension" and w.finalized == 1
    sharded = 0
    for name, p in dict(policy.model.named_parameters()).items():
        dim = fake.shard_dim(name, p, 2)
        if dim is None:  # replicated: the whole tensor on each rank
            for s in shards:
                torch.testing.assert_close(s[name], full[name], rtol=0, atol=0)
        else:  # the ranks' halves make the whole
            sharded += 1
            assert shards[0][name].shape[dim] == p.shape[dim] // 2
            torch.testing.assert_close(torch.cat([s[name] for s in shards], dim), full[name], rtol=0, atol=0)
    assert sharded > 5
    assert b.refit_metrics["generation/probe_logprob_gap"] < 1e-4


def test_refit_is_sent_in_buckets_no_bigger_than_configured(trt, policy, tiny_model_path):
    mb = 0.05
    b = _backend(policy, tiny_model_path, refit_bucket_mb=mb)
    w = _worker(b)
    sizes = w.bucket_bytes
    items = engine_weights(policy.model.state_dict(), tie_word_embeddings=b.tie_word_embeddings)
    largest = max(t.numel() * t.element_size() for _, t in items)
    expected = list(tensor_buckets(items, bucket_bytes=int(mb * 2**20), dtype=torch.float32))
    assert len(sizes) == len(expected) > 3
    assert all(s <= max(mb * 2**20, largest) for s in sizes)
    assert sum(sizes) == sum(t.numel() * t.element_size() for _, t in items)
    assert b.refit_metrics["generation/refit_buckets"] == len(expected)


def test_engine_dtype_is_what_the_refit_casts_to(trt, policy, tiny_model_path):
    b = _backend(policy, tiny_model_path, dtype="bfloat16", probe_tolerance=1.0)
    engine = _worker(b).engine.model_engine.model.state_dict()
    for name, p in policy.model.state_dict().items():
        assert engine[name].dtype == torch.bfloat16
        torch.testing.assert_close(engine[name], p.to(torch.bfloat16), rtol=0, atol=0)
    full = _backend(policy, tiny_model_path).refit_metrics["generation/refit_mb"]
    assert b.refit_metrics["generation/refit_mb"] == pytest.approx(full / 2)
    assert 0 < b.refit_metrics["generation/probe_logprob_gap"] < 1.0


def test_sleep_false_keeps_the_engine_awake(trt, policy, tiny_model_path):
    b = _backend(policy, tiny_model_path, sleep=False)
    b.release()
    b.sync_weights(policy)
    assert not any(kind in ("sleep", "wakeup") for kind, _ in _worker(b).log)
    assert not b.llm.init_kwargs["enable_sleep"]


def test_several_trainer_ranks_are_refused_in_one_line(trt, policy, tiny_model_path, monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a: 2)
    with pytest.raises(ConfigError, match="drives one engine from one trainer process"):
        _backend(policy, tiny_model_path)


def test_tied_head_is_not_sent():
    state = {
        "model.embed_tokens.weight": torch.ones(4, 2),
        "lm_head.weight": torch.ones(4, 2),
        "x": torch.ones(1),
    }
    assert [n for n, _ in engine_weights(state, tie_word_embeddings=True)] == [
        "model.embed_tokens.weight",
        "x",
    ]
    assert len(engine_weights(state, tie_word_embeddings=False)) == 3


def test_sleep_during_update_and_wake_order_around_the_refit(trt, policy, tiny_model_path):
    b = _backend(policy, tiny_model_path)
    w = _worker(b)
    w.log.clear()
    b.release()
    assert w.asleep == set(fake.SLEEP_TAGS)
    b.sync_weights(policy)
    kinds = [k for k, _ in w.log]
    assert kinds[0] == "sleep" and kinds[1] == "wakeup" and "kv_cache" not in w.log[1][1]
    finalise = w.log.index(("update_weights", None))
    assert kinds[2:finalise] == ["update_weights"] * (finalise - 2) and finalise > 2
    assert w.log[finalise + 1 :] == [("wakeup", ("kv_cache",)), ("generate", 1)]
    assert not w.asleep and b.version == 1


def test_generate_while_released_wakes_the_engine_first(trt, policy, tiny_model_path):
    b = _backend(policy, tiny_model_path)
    b.release()
    out = b.generate([GenerationRequest([5, 6, 7])], SamplingParams(n=2, max_new_tokens=3))
    assert not _worker(b).asleep and len(out[0].samples) == 2


def _perturb_layer(monkeypatch, prefix: str) -> None:
    """The engine's loader corrupts every tensor of one layer (as a wrong name or layout mapping would)."""
    real = fake.ModelLoader.reload

    def reload(self, model, weights, allow_partial_loading):
        real(self, model, weights, allow_partial_loading)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.startswith(prefix) and name in weights:
                    p.add_(0.5)

    monkeypatch.setattr(fake.ModelLoader, "reload", reload)


@pytest.mark.parametrize("tp", [1, 2])
def test_a_corrupted_layer_is_named_by_the_refit_guard(trt, policy, tiny_model_path, monkeypatch, tp):
    """TP=2: each rank holds shards, so the guard adds the ranks' shard checksums up per layer."""
    b = _backend(policy, tiny_model_path, tensor_parallel_size=tp)
    _perturb_layer(monkeypatch, "model.layers.1.")
    with pytest.raises(RefitError, match=r"first bad layer: model\.layers\.1 \(its engine weights"):
        b.sync_weights(policy)


def test_stale_weights_after_a_dropped_bucket_are_named(trt, policy, tiny_model_path, monkeypatch):
    """The engine ignores layer 0's names (partial loading keeps the old values): the policy moved on,
    so the engine generates from stale weights unless the guard stops it."""
    b = _backend(policy, tiny_model_path)
    real = fake.ModelLoader.reload

    def reload(self, model, weights, allow_partial_loading):
        kept = {k: v for k, v in weights.items() if not k.startswith("model.layers.0.")}
        real(self, model, kept, allow_partial_loading)

    monkeypatch.setattr(fake.ModelLoader, "reload", reload)
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    try:
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if name.startswith("model.layers.0."):
                    p.mul_(-1.5)
        with pytest.raises(RefitError, match=r"first bad layer: model\.layers\.0\b"):
            b.sync_weights(policy)
    finally:
        policy.model.load_state_dict(saved)


def test_a_logprob_gap_with_matching_weights_is_a_numerics_error(trt, policy, tiny_model_path, monkeypatch):
    b = _backend(policy, tiny_model_path)
    real = fake.LLM._one

    def shifted(self, *args):  # e.g. a kernel or rope-config mismatch: weights right, log-probs off
        out = real(self, *args)
        for c in out.outputs:
            c.logprobs = [
                {k: fake.Logprob(v.logprob - 1.0, v.rank) for k, v in d.items()} for d in c.logprobs
            ]
        return out

    monkeypatch.setattr(fake.LLM, "_one", shifted)
    with pytest.raises(RefitError, match="every layer's weights match what was sent"):
        b.sync_weights(policy)


def test_logprobs_without_the_sampled_token_are_refused():
    from nemo_azr.rollout.trtllm_backend import _sampled_logprobs

    assert _sampled_logprobs([{3: fake.Logprob(-0.1, 1), 7: fake.Logprob(-2.0, 4)}], [7]) == [-2.0]
    with pytest.raises(RefitError, match="miss the sampled token 7"):
        _sampled_logprobs([{3: fake.Logprob(-0.1, 1)}], [7])


def test_checksums_are_layout_invariant_and_find_the_first_bad_layer():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, 3, generator=g) for _ in range(3))
    norm, emb = torch.randn(3, generator=g), torch.randn(6, 3, generator=g)
    trainer = checksum_groups(
        [
            ("model.embed_tokens.weight", emb),
            ("model.layers.0.self_attn.q_proj.weight", q),
            ("model.layers.0.self_attn.k_proj.weight", k),
            ("model.layers.0.self_attn.v_proj.weight", v),
            ("model.layers.0.input_layernorm.weight", norm),
        ],
        dtype=torch.float32,
    )
    qkv = torch.cat(
        [q, k, v]
    )  # the engine's fused layout, split over 2 TP ranks; norm replicated; vocab padded
    ranks = [
        {
            "model.embed_tokens.weight": tuple(
                _sums(torch.cat([emb, torch.zeros(2, 3)])[: 4 * (r + 1)][4 * r :])
            ),
            "model.layers.0.self_attn.qkv_proj.weight": tuple(_sums(qkv.chunk(2)[r])),
            "model.layers.0.input_layernorm.weight": tuple(_sums(norm)),
        }
        for r in range(2)
    ]
    engine = combine_rank_checksums(ranks)
    assert compare_checksums(trainer, engine, rtol=1e-6) == []
    ranks[1]["model.layers.0.self_attn.qkv_proj.weight"] = tuple(_sums(qkv.chunk(2)[1] * 1.01))
    assert compare_checksums(trainer, combine_rank_checksums(ranks), rtol=1e-6) == ["model.layers.0"]
    assert compare_checksums(trainer, {}, rtol=1e-6) == ["model.embed_tokens", "model.layers.0"]


def _sums(t: torch.Tensor) -> tuple[float, float, int]:
    t = t.double()
    return float(t.sum()), float((t * t).sum()), t.numel()


def test_missing_tensorrt_llm_is_one_config_error_naming_the_container(monkeypatch, policy, tiny_model_path):
    from nemo_azr.preflight import load_config

    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import tensorrt_llm raises ImportError
    with pytest.raises(ConfigError, match="containers/Dockerfile") as err:
        _backend(policy, tiny_model_path)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="generation.backend=trtllm needs TensorRT-LLM"):
        load_config(["generation=trtllm", "logger=quiet"])


def test_nothing_imports_tensorrt_llm_unless_asked():
    code = (
        "import sys, nemo_azr.rollout, nemo_azr.trainer.trainer, nemo_azr.cli\n"
        "from nemo_azr.preflight import load_config\n"
        "load_config(['logger=quiet'])\n"
        "assert not any(m.startswith('tensorrt_llm') for m in sys.modules), 'imported'\n"
        "assert 'nemo_azr.rollout.trtllm_worker' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize(
    "override, message",
    [
        ("generation.trtllm.kv_cache_free_gpu_memory_fraction=1.5", "must be in \\(0, 1\\)"),
        ("generation.trtllm.max_batch_size=2", "must be >= generation.n_samples=8"),
        ("generation.trtllm.refit_bucket_mb=0", "refit_bucket_mb must be > 0"),
        ("generation.trtllm.probe_length=0", "probe_length must be >= 1"),
        ("generation.trtllm.rpc_timeout_s=0", "rpc_timeout_s must be > 0"),
        ("generation.trtllm.dtype=int8", "generation.trtllm.dtype='int8' is not one of"),
        ("generation.dtype=bfloat16", "the trtllm engine's dtype is generation.trtllm.dtype"),
    ],
)
def test_bad_trtllm_keys_are_config_errors(trt, override, message):
    from nemo_azr.preflight import load_config

    cfg = load_config(["generation=trtllm", "logger=quiet"])
    assert cfg.generation.trtllm.refit_bucket_mb == 512 and cfg.generation.backend == "trtllm"
    with pytest.raises(ConfigError, match=message):
        load_config(["generation=trtllm", "logger=quiet", override])


def _tiny_trtllm_job(tiny_cache, tmp_path) -> list[str]:
    """Overrides of a short CPU training job on the tiny model with generation=trtllm (the fake)."""
    return [
        "generation=trtllm",
        "logger=quiet",
        f"model.tiny.cache_dir={tiny_cache}",
        f"trainer.output_dir={tmp_path}",
        "trainer.device=cpu",
        "sft_warmup.steps=0",
        "data.prompts_per_step=2",
        "generation.n_samples=2",
        "generation.max_new_tokens=4",
    ]


def test_trainer_logs_refit_time_and_probe_gap_and_sleeps_each_step(trt, tiny_cache, tmp_path):
    from nemo_azr.preflight import load_config
    from nemo_azr.trainer.trainer import Trainer

    cfg = load_config(
        [
            *_tiny_trtllm_job(tiny_cache, tmp_path),
            "algorithm.reuse_update_logprobs=false",  # old log-probs computed apart: the batch gap is logged
        ]
    )
    trainer = Trainer(cfg)
    trainer.setup_generation()
    worker = _worker(trainer.backend)
    for step in range(2):
        worker.log.clear()
        metrics = trainer.train_step(step)
        assert 0 <= metrics["generation/probe_logprob_gap"] < cfg.generation.trtllm.probe_tolerance
        assert metrics["timing/engine_refit_s"] > 0 and metrics["generation/refit_buckets"] == 1
        assert [k for k, _ in worker.log].count("sleep") == 1
        assert 0 <= metrics["generation/logprob_gap_mean"] <= metrics["generation/logprob_gap_max"] < 1e-4
    assert trainer.backend.version == 2 == metrics["trainer/policy_version"]


def test_rollout_logprob_gap_is_over_loss_masked_tokens():
    from nemo_azr.contracts import Batch
    from nemo_azr.contracts import fields as F
    from nemo_azr.contracts.assemble import pack_prompt_response, rollout_logprob_gap

    batch = Batch(pack_prompt_response([[1, 2]], [[3, 4, 5]], [[-1.0, -2.0, -3.0]], pad_id=0))
    assert rollout_logprob_gap(batch) == {}
    old = batch[F.ROLLOUT_LOGPROBS].clone()
    old[0, 2:] += torch.tensor([0.5, 0.0, -0.25])
    old[0, 0] = 9.0  # a prompt column: not a generated token
    batch[F.OLD_LOGPROBS] = old
    assert rollout_logprob_gap(batch) == {
        "generation/logprob_gap_mean": 0.25,
        "generation/logprob_gap_max": 0.5,
    }


def _tiny_request(tiny_model_path):
    ids = load_tokenizer(tiny_model_path)("a b c", add_special_tokens=False)["input_ids"]
    return [GenerationRequest(prompt_ids=ids, request_id="p")]


def test_a_refit_failing_at_a_bucket_is_named_and_the_engine_generates_nothing_after(
    trt, policy, tiny_model_path
):
    b = _backend(policy, tiny_model_path, refit_bucket_mb=0.05)
    w = _worker(b)
    real, calls = w.update_weights, []

    def failing_at_bucket_3(ipc_handles=None):
        calls.append(ipc_handles is None)
        if len(calls) == 3:
            raise RuntimeError("CUDA error: out of memory")
        return real(ipc_handles)

    w.update_weights = failing_at_bucket_3
    with pytest.raises(
        RefitError,
        match=r"refit to policy version 1, bucket 3 .*rank on GPU FAKE-GPU-0: .*out of memory.*part of a refit may have landed",
    ):
        b.sync_weights(policy)
    assert calls == [False, False, False]  # buckets 1-2 loaded, 3 failed, no finalise
    assert b.version == 0  # the failed version was never announced
    with pytest.raises(RefitError, match="generates nothing more"):
        b.generate(_tiny_request(tiny_model_path), SamplingParams(n=1, max_new_tokens=2))
    with pytest.raises(RefitError, match="bucket 3"):  # nor is a second refit tried on it
        b.sync_weights(policy)
    assert len(calls) == 3


def test_a_refit_rpc_that_never_answers_times_out(trt, policy, tiny_model_path):
    import threading

    b = _backend(policy, tiny_model_path, rpc_timeout_s=0.2)
    w = _worker(b)
    never = threading.Event()
    w.update_weights = lambda ipc_handles=None: never.wait()
    try:
        with pytest.raises(
            RefitError, match=r"bucket 1 .*did not answer update_weights_checked within .*rpc_timeout_s=0.2 s"
        ):
            b.sync_weights(policy)
        with pytest.raises(RefitError, match="did not answer"):
            b.generate(_tiny_request(tiny_model_path), SamplingParams(n=1, max_new_tokens=2))
    finally:
        never.set()  # lets the abandoned RPC thread end


def test_a_release_that_never_answers_times_out(trt, policy, tiny_model_path):
    import threading

    b = _backend(policy, tiny_model_path, rpc_timeout_s=0.2)
    never = threading.Event()
    _worker(b).sleep = lambda tags: never.wait()
    try:
        with pytest.raises(RefitError, match=r"releasing the engine's memory: .*did not answer sleep"):
            b.release()
    finally:
        never.set()


def test_a_failed_refit_stops_training_with_the_last_checkpoint_intact(
    trt, tiny_cache, tmp_path, capsys, monkeypatch
):
    """The CLI ends with one line naming the refit; step 1's checkpoint is still there to resume."""
    from nemo_azr.cli import main

    real = fake.WorkerExtension.update_weights
    refits = []

    def update_weights(self, ipc_handles=None):
        if ipc_handles is None:
            refits.append(1)
        elif len(refits) == 2:  # the first bucket of the third refit (after step 2's update)
            raise RuntimeError("NCCL error: remote process exited")
        return real(self, ipc_handles)

    monkeypatch.setattr(fake.WorkerExtension, "update_weights", update_weights)
    job = _tiny_trtllm_job(tiny_cache, tmp_path)
    rc = main(["train", *job, "trainer.save_interval=1", "trainer.max_steps=3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and "refit to policy version 2, bucket 1" in err[-1] and "NCCL error" in err[-1], err
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*")) == ["step_1"]


def test_rows_carry_the_version_every_rank_holds_and_a_lagging_rank_stops_the_rollout(
    trt, policy, tiny_model_path
):
    b = _backend(policy, tiny_model_path, tensor_parallel_size=2)
    sp = SamplingParams(n=1, max_new_tokens=2)
    (out,) = b.generate(_tiny_request(tiny_model_path), sp)
    assert out.policy_version == 0 == b.version
    b.sync_weights(policy)
    assert [w.weight_version for w in b.llm.workers] == [1, 1]
    assert b.generate(_tiny_request(tiny_model_path), sp)[0].policy_version == 1
    lagging = b.llm.workers[1]
    lagging.set_weight_version = lambda version: None  # e.g. a rank restarted out of band
    with pytest.raises(
        RefitError, match=r"ranks hold weights of policy version\(s\) \[1, 2\].*sent version 2"
    ):
        b.sync_weights(policy)
        b.generate(_tiny_request(tiny_model_path), sp)


def test_rows_at_a_version_the_trainer_did_not_push_are_refused():
    from nemo_azr.contracts import Batch
    from nemo_azr.contracts import fields as F
    from nemo_azr.trainer.row_versions import check_row_versions

    batch = Batch({"input_ids": torch.zeros(4, 3, dtype=torch.long)}, {F.POLICY_VERSION: [3, 3, 2, 3]})
    check_row_versions(batch.index([0, 1, 3]), 3)
    with pytest.raises(
        RefitError, match=r"1 row\(s\) at version 2, where every row should be at policy version 3"
    ):
        check_row_versions(batch, 3)
    check_row_versions(Batch({"input_ids": torch.zeros(1, 3, dtype=torch.long)}), 3)  # no versions recorded


def test_weights_go_to_the_gpus_the_ranks_report_not_rank_r_on_gpu_r(
    trt, policy, tiny_model_path, monkeypatch
):
    """Ray placed the two ranks on GPUs 3 and 2: the handles are keyed by the UUIDs the ranks report."""
    real_init = fake._WorkerBase.__init__

    def placed(self, model, device_id, enable_sleep, **shard):
        real_init(self, model, 3 - device_id, enable_sleep, **shard)

    monkeypatch.setattr(fake._WorkerBase, "__init__", placed)
    b = _backend(policy, tiny_model_path, tensor_parallel_size=2)
    assert b._rank_uuids == ["FAKE-GPU-3", "FAKE-GPU-2"]
    for w in b.llm.workers:  # each rank found its own handles and loaded them
        assert w.finalized == 1 and len(w.bucket_bytes) == b.refit_metrics["generation/refit_buckets"]
    assert b.refit_metrics["generation/probe_logprob_gap"] < 1e-4


def test_a_rank_gpu_the_trainer_cannot_see_is_one_config_error(trt, policy, tiny_model_path, monkeypatch):
    from types import SimpleNamespace

    from nemo_azr.rollout.trtllm_backend import _uuid_hex

    assert _uuid_hex("GPU-5B8E3A6C-0d1e-4f00-9abc-0123456789AB") == _uuid_hex(
        "5b8e3a6c-0d1e-4f00-9abc-0123456789ab"
    )
    b = _backend(policy, tiny_model_path)
    b.device = torch.device("cuda", 0)  # as on a GPU machine with two visible GPUs
    visible = ["GPU-aaaa0000-0000-0000-0000-000000000001", "GPU-aaaa0000-0000-0000-0000-000000000002"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(visible))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=visible[i][4:]))
    assert b._local_device(visible[1]) == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match=r"GPU-ffff.* which this trainer process does not see"):
        b._local_device("GPU-ffff0000-0000-0000-0000-000000000009")


# --- what the real release does that a loose fake hid (issue: TensorRT-LLM fidelity) ------------------


def _surface(**changes):
    import dataclasses

    from nemo_azr.rollout.trtllm_api import RELEASES

    return dataclasses.replace(RELEASES["1.2"], **changes)


def test_the_default_sampler_raw_logprobs_fail_the_probe_at_the_rollout_temperature(
    policy, tiny_model_path, monkeypatch
):
    """1.2's TorchSampler returns log-probs of the raw logits (and only the top-1 token's): a backend
    that kept the default sampler would stop at its first probe, not train on wrong log-probs."""
    from nemo_azr.rollout.trtllm_backend import TRTLLMGenerationBackend

    fake.install(monkeypatch, surface=_surface(sampler_type="TorchSampler"))
    cfg = NemoAzrConfig().generation
    cfg.backend, cfg.temperature = "trtllm", 0.7
    with pytest.raises(RefitError, match="miss the sampled token|probe log-probs differ"):
        TRTLLMGenerationBackend(policy.model, load_tokenizer(tiny_model_path), cfg=cfg)


def test_the_probe_runs_at_the_rollout_temperature(trt, policy, tiny_model_path, monkeypatch):
    from nemo_azr.rollout.trtllm_backend import TRTLLMGenerationBackend

    seen = []
    real = fake.LLM.generate

    def generate(self, inputs, sampling_params, use_tqdm=True):
        seen.append(sampling_params.temperature)
        return real(self, inputs, sampling_params, use_tqdm)

    monkeypatch.setattr(fake.LLM, "generate", generate)
    cfg = NemoAzrConfig().generation
    cfg.backend, cfg.temperature = "trtllm", 0.6
    b = TRTLLMGenerationBackend(policy.model, load_tokenizer(tiny_model_path), cfg=cfg)
    assert seen == [0.6] and b.refit_metrics["generation/probe_logprob_gap"] < 1e-4


def test_no_per_request_seed_where_the_release_ignores_it(policy, tiny_model_path, monkeypatch):
    fake.install(monkeypatch)
    b = _backend(policy, tiny_model_path)
    assert b._sampling(SamplingParams(n=2, temperature=0.7)).seed is None
    fake.install(monkeypatch, surface=_surface(per_request_seed=True))
    b = _backend(policy, tiny_model_path)
    assert b._sampling(SamplingParams(n=2, temperature=0.7)).seed is not None


def test_greedy_with_several_samples_is_sent_once_where_the_release_refuses_it(trt, policy, tiny_model_path):
    b = _backend(policy, tiny_model_path)
    prompt = _tiny_request(tiny_model_path)
    with pytest.raises(ValueError, match="does not allow multiple returns"):  # the engine itself refuses
        b.llm.generate([prompt[0].prompt_ids], fake.SamplingParams(n=3, top_k=1, max_tokens=3, logprobs=1))
    (out,) = b.generate(prompt, SamplingParams(n=3, max_new_tokens=3, greedy=True))
    assert len(out.samples) == 3 and len({tuple(s.token_ids) for s in out.samples}) == 1
    assert out.samples[0] is not out.samples[1]


def test_the_api_the_backend_uses_is_the_release_rows(trt, policy, tiny_model_path, monkeypatch):
    """Every LLM keyword, SamplingParams field and RPC the backend uses is in the release's row of
    trtllm_api.RELEASES (the fake refuses anything else), so a version bump shows what changed."""
    import dataclasses

    from nemo_azr.rollout.trtllm_api import RELEASES

    row = RELEASES["1.2"]
    rpcs = []
    real_rpc = fake.LLM._collective_rpc

    def rpc(self, method, args=(), kwargs=None, non_block=False):
        rpcs.append(method)
        return real_rpc(self, method, args, kwargs, non_block)

    monkeypatch.setattr(fake.LLM, "_collective_rpc", rpc)
    b = _backend(policy, tiny_model_path, max_seq_len=64)
    assert set(b.llm.init_kwargs) | {"model"} <= row.llm_keywords
    b.release()
    b.sync_weights(policy)
    assert set(rpcs) <= row.rpc_methods and {"update_weights_checked", "sleep", "wakeup"} <= set(rpcs)
    defaults = fake.SamplingParams()
    for sp in (
        SamplingParams(n=2, temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=4, stop_strings=("x",)),
        SamplingParams(n=1, max_new_tokens=4, greedy=True),
    ):
        made = b._sampling(sp)
        used = {
            f.name for f in dataclasses.fields(made) if getattr(made, f.name) != getattr(defaults, f.name)
        }
        assert used <= row.sampling_fields, used - row.sampling_fields


def test_an_unlisted_release_or_argument_is_one_config_error(policy, tiny_model_path, monkeypatch):
    from nemo_azr.rollout.trtllm_api import release_surface

    assert release_surface("1.2.1").pinned == "1.2.1" and release_surface("1.2.0rc3+abc").release == "1.2"
    with pytest.raises(
        ConfigError, match=r"TensorRT-LLM 1\.3\.0rc7 is not a release .*supported: 1\.2 \(pinned 1\.2\.1\)"
    ):
        release_surface("1.3.0rc7")
    trt = fake.install(monkeypatch)
    monkeypatch.setattr(trt, "__version__", "1.4.0")
    with pytest.raises(ConfigError, match="1.4.0 is not a release"):
        _backend(policy, tiny_model_path)
    fake.install(monkeypatch, surface=_surface(llm_keywords=_surface().llm_keywords - {"sampler_type"}))
    with pytest.raises(
        ConfigError, match=r"TensorRT-LLM 1\.2 does not take LLM argument\(s\) \['sampler_type'\]"
    ):
        _backend(policy, tiny_model_path)


def test_a_payload_naming_anything_but_torch_is_refused(trt, policy, tiny_model_path):
    import base64
    import os
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("true",))

    payload = {fake.get_device_uuid(0): base64.b64encode(pickle.dumps([("x", Evil())])).decode()}
    b = _backend(policy, tiny_model_path)
    w = _worker(b)
    with pytest.raises(pickle.UnpicklingError):  # the library's unpickler (the fake's) ...
        w.update_weights(payload)
    with pytest.raises(RuntimeError, match="rank on GPU FAKE-GPU-0: UnpicklingError: refusing to unpickle"):
        w.update_weights_checked(payload, {"x": (0.0, 0.0)})  # ... and the extension's


def test_a_bucket_that_arrives_corrupted_is_refused_by_the_rank_before_it_loads(
    trt, policy, tiny_model_path, monkeypatch
):
    """The memory a handle resolves to is not what the trainer sent (stale or overwritten): the rank
    compares checksums, loads nothing of that bucket, and the refit stops naming bucket and tensor."""
    import nemo_azr.rollout.trtllm_worker as worker_module

    b = _backend(policy, tiny_model_path, refit_bucket_mb=0.05)
    w = _worker(b)
    real = worker_module._received
    calls = []

    def corrupted_in_bucket_2(handles, device_id):
        tensors = real(handles, device_id)
        calls.append([n for n, _ in tensors])
        if len(calls) == 2:
            name, tensor = tensors[0]
            tensors[0] = (name, tensor + 1.0)  # the memory under the handle holds other values
        return tensors

    monkeypatch.setattr(worker_module, "_received", corrupted_in_bucket_2)
    before = {n: p.detach().clone() for n, p in w.engine.model_engine.model.named_parameters()}
    loaded_before = len(w.bucket_bytes)
    with pytest.raises(
        RefitError,
        match=r"bucket 2 .*update_weights_checked failed.*rank on GPU FAKE-GPU-0: ValueError: tensor .* arrived with checksum",
    ) as err:
        b.sync_weights(policy)
    assert calls[1][0] in str(err.value)
    assert len(w.bucket_bytes) == loaded_before + 1  # bucket 1 loaded, bucket 2 refused before loading
    for name in calls[1]:  # nothing of bucket 2 reached the engine's weights
        torch.testing.assert_close(
            w.engine.model_engine.model.state_dict()[name], before[name], rtol=0, atol=0
        )


def test_the_container_installs_a_release_of_the_table():
    """containers/Dockerfile and trtllm_api.RELEASES pin the same TensorRT-LLM: a version bump of one
    without the other fails here, not at a user's first refit."""
    import re
    from pathlib import Path

    from nemo_azr.rollout.trtllm_api import RELEASES

    dockerfile = (Path(__file__).resolve().parents[2] / "containers" / "Dockerfile").read_text()
    pinned = re.search(r"^ARG TRTLLM_VERSION=(\S+)$", dockerfile, re.M)
    assert pinned, "containers/Dockerfile no longer pins TRTLLM_VERSION"
    assert pinned.group(1) in {row.pinned for row in RELEASES.values()}
