"""The language's public entry points, for programs that drive the compiler (the run
command, the OpenRLHF target's job, notebooks, scripts): a spec file or text compiled to
the checked IR with its diagnostics. The runtime calls these and reads the IR
(askspec/ir, the contract); it never imports the checker's own modules."""

from __future__ import annotations

from askspec.lang.compiler import CompileResult, compile_file, compile_source

__all__ = ["CompileResult", "compile_file", "compile_source"]
