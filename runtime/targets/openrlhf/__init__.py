"""The OpenRLHF 0.11.2 target: `askspec compile FILE --target openrlhf -o DIR`.

mapping.py (algorithms and settings as flags), check.py (what cannot be mapped, as
diagnostics), generate.py + templates/ (the job folder), and the runtime the generated
agent imports: adapter.py (one rollout = one session of askspec's engine, group routing)
and tokens.py (the trained role's token sequence on OpenRLHF's vLLM engine).
Guide: docs/cluster.md."""
