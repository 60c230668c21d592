"""The spec language front end: load (YAML with positions) -> validate (-> ModelIR)."""
