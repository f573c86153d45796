"""`edgespec serve`: HTTP, the OpenAI protocol and clients, hostile and fuzzed requests."""
