"""Compilation targets: job folders for distributed trainers (OpenRLHF) built from a compiled spec."""
