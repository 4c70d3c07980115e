"""askspec's extension of OpenRLHF 0.11.2, shipped in the job folders that need it: the
CISPO policy loss (`cispo`) and `python3 -m askspec_ext.train_ppo_ray`, the entry point
that installs it before OpenRLHF's own trainer starts (docs/cluster.md)."""
