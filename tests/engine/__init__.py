"""The decoding loop and the engine on fakes, the tiny random GGUF and rpc; never the bundled pair."""
