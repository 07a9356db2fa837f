"""Learned agents: PPO (the model-free X-RLflow baseline) and the `Policy` protocol that
evaluation and `rlflow optimize --agent` use for any trained agent.

- `rlflow.agents.ppo`: `PPOConfig`, `train`, checkpoints;
- `rlflow.agents.update`: `ppo_update`, the PPO loss and step (also the dream controller's);
- `rlflow.agents.policy`: `Policy`, `RuleTranslation`, `PPOPolicy`, `load_ppo_policy`;
- `rlflow.agents.evaluate`: `agent_rollouts`, `policy_rollouts`.

Import the modules themselves: this package stays light so that the CLI starts fast.
"""
