import pytest
import torch

from nemo_azr.contracts import Batch, validate_batch
from nemo_azr.errors import BatchContractError


def make(rows: int, width: int, start: int = 0) -> Batch:
    ids = torch.arange(start, start + rows * width).reshape(rows, width)
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": torch.ones(rows, width, dtype=torch.long),
            "loss_mask": torch.ones(rows, width),
            "rewards": torch.arange(start, start + rows, dtype=torch.float32),
        },
        {"uid": [f"u{start + i}" for i in range(rows)], "group_id": [i % 2 for i in range(rows)]},
    )


def test_index_keeps_tensors_and_meta_aligned():
    b = make(4, 3)
    sub = b.index([2, 0])
    assert sub["uid"] == ["u2", "u0"]
    assert sub["rewards"].tolist() == [2.0, 0.0]
    assert sub["input_ids"][0].tolist() == [6, 7, 8]
    mask = torch.tensor([False, True, False, True])
    assert b.index(mask)["uid"] == ["u1", "u3"]
    assert b.index(slice(1, 3))["uid"] == ["u1", "u2"]


def test_select_and_to():
    b = make(2, 3)
    s = b.select(["input_ids", "uid"])
    assert set(s.keys()) == {"input_ids", "uid"}
    with pytest.raises(KeyError):
        b.select(["nope"])
    assert b.to("cpu")["input_ids"].device.type == "cpu"


def test_concat_right_pads_token_tensors():
    a, c = make(1, 2), make(2, 4, start=100)
    out = Batch.concat([a, c])
    assert len(out) == 3 and out.seq_len == 4
    assert out["input_ids"][0].tolist() == [0, 1, 0, 0]
    assert out["attention_mask"][0].tolist() == [1, 1, 0, 0]
    assert out["loss_mask"][0].tolist() == [1, 1, 0, 0]
    assert out["rewards"].tolist() == [0.0, 100.0, 101.0]
    assert out["uid"] == ["u0", "u100", "u101"]


def test_concat_rejects_different_keys():
    a, c = make(1, 2), make(1, 2)
    c["extra"] = ["x"]
    with pytest.raises(BatchContractError, match="different keys"):
        Batch.concat([a, c])


def test_repeat_and_chunk():
    b = make(2, 1)
    assert b.repeat(2)["uid"] == ["u0", "u0", "u1", "u1"]
    assert b.repeat(2, interleave=False)["uid"] == ["u0", "u1", "u0", "u1"]
    pieces = make(5, 1).chunk(2)
    assert [len(p) for p in pieces] == [3, 2]
    assert [p["uid"] for p in make(5, 1).split(2)] == [["u0", "u1"], ["u2", "u3"], ["u4"]]


def test_row_count_mismatch_is_an_error():
    with pytest.raises(BatchContractError, match="rows disagree"):
        Batch({"input_ids": torch.zeros(2, 3)}, {"uid": ["a"]})
    b = make(2, 2)
    with pytest.raises(BatchContractError, match="3 rows on a batch of 2"):
        b["rewards"] = torch.zeros(3)


def test_validate_names_stage_and_missing_key():
    b = make(2, 3)
    validate_batch(b, "reward")
    with pytest.raises(
        BatchContractError, match=r"stage 'advantage': missing key 'advantages' \[B,T\] float"
    ):
        validate_batch(b, "advantage")
    b["advantages"] = torch.zeros(2, 3)
    with pytest.raises(BatchContractError, match="stage 'update': missing key 'old_logprobs'"):
        validate_batch(b, "update")


def test_validate_reports_misshaped_key():
    b = make(2, 3)
    b["rewards"] = torch.zeros(2, 3)
    with pytest.raises(
        BatchContractError, match=r"stage 'reward': key 'rewards' must be \[2\] float, got \[2, 3\] float32"
    ):
        validate_batch(b, "reward")
    b = make(2, 3)
    b["advantages"] = torch.zeros(2, 5)
    with pytest.raises(BatchContractError, match=r"'advantages' must be \[2,3\] float"):
        validate_batch(b, "advantage")
    b = make(2, 3)
    b["input_ids"] = b["input_ids"].float()
    with pytest.raises(BatchContractError, match="'input_ids' must be"):
        validate_batch(b, "rollout")


def test_validate_requires_explicit_group_ids():
    b = make(2, 3)
    del b.meta["group_id"]
    with pytest.raises(BatchContractError, match="missing per-row meta 'group_id'"):
        validate_batch(b, "rollout")


def test_validate_extra_keys_for_an_estimator():
    b = make(2, 3)
    with pytest.raises(BatchContractError, match="'baseline_rewards' \\[B\\] float"):
        validate_batch(b, "reward", extra=["baseline_rewards"])
