"""`cclctl launch`: start local ranks around a store, stream their output, stop them together."""
