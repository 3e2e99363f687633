"""`nemo-azr eval`: one evaluator per workflow (accuracy, RLCR calibration, self-play held-out) over
shared loading and result writing (common.py); above the workflows and the trainer, which it reads."""
