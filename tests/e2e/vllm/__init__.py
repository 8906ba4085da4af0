"""The end-to-end tests on real vLLM engines: one package, so that its modules share one fleet (the
``vllm_fleet`` fixture is package-scoped; pytest scopes it to a directory only when it is a package)."""
