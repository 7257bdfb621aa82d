"""TCP between ranks: authenticated links, framed messages, the step, a reset link resumed."""
