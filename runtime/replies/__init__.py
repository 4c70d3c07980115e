"""Reply handling: a model's reply text -> fields (``parsers``), answer equivalence (``verify``)."""
