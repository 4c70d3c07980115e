"""The .ask language front end: grammar, parser, AST with spans, checker, formatter."""
