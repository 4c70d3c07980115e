"""The verifiers 0.4.0 target: `askspec compile FILE --target verifiers -o DIR`.

check.py (what cannot be mapped, as diagnostics), generate.py + templates/ (the
environment package), and the runtime the generated package imports: environment.py
(one episode = one session of askspec's engine, each role's calls through its agent).
Guide: docs/cluster.md."""
