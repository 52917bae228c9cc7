"""The real engines the tests, the benchmarks and the engine demo run (llama-cpp-python,
llama.cpp's llama-server, vLLM's CPU build, llama-swap, the coding CLIs), built once per machine.
Not part of the served package: `make engine` builds them (docs/architecture.md)."""
