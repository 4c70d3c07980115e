"""The local trainer: advantages, policy losses, rollout batches and the training loop.

- ``advantages``  group-relative advantage estimators (grpo, rloo, ...)
- ``losses``      per-token policy losses (PPO clip, CISPO, GSPO, SFT), KL, aggregation
- ``config``      a `train` block's settings with the checker's defaults filled in
- ``batch``       trajectories from a step's sessions: rewards, groups, masks, tokens
- ``policy``      one trained role: weights, optimizer, schedule, checkpoints, updates
- ``trainer``     the training loop behind `askspec run` on a spec with `train` blocks
"""
