"""askspec's extension of OpenRLHF 0.11.2, shipped in the job folders that need it: the
CISPO policy loss (`cispo.py`), the population std of `std = population`
(`advantages.py`), the update gate of `update_when` (`gate.py`), the version pin they share
(`pinned.py`), and `python3 -m askspec_ext.train_ppo_ray`, the entry point that installs
them before OpenRLHF's own trainer starts (docs/cluster.md)."""
